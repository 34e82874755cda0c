//! gdr-mem: how the CPU touches memory that a GPU or another device also reaches.
//!
//! The ground floor of gdr, below both the GPU library (`gdr`) and the DMA engine (`gdr-dma`):
//! - [`MappedMemory`]: one trait for every CPU mapping of such memory (a GPU's BAR1 mapping,
//!   pinned host memory, a ring region, a DMA buffer, another device's BAR), with bounded byte
//!   copies, aligned volatile word access, and the copy routine that suits the mapping's
//!   [`Caching`]. Whatever implements it can be handed to a ring or an IOMMU without `unsafe`
//!   at the call site: the `unsafe` is in the one `impl` that vouches for the pointer.
//! - [`copy`]: the copy routines for write-combined mappings (non-temporal stores of whole
//!   lines, streaming loads) and their parallel form.
//! - [`store_fence`]: the one fence that drains write-combined stores.
//!
//! # Example
//!
//! A page of ordinary memory standing in for a device mapping (the write-combined routines are
//! only slower, not wrong, on cached memory, so this runs anywhere):
//!
//! ```
//! use gdr_mem::{AccessError, Caching, MappedMemory};
//! use std::cell::UnsafeCell;
//!
//! #[repr(C, align(4096))]
//! struct Page(UnsafeCell<[u8; 4096]>);
//!
//! /// Owns one page; a real implementor wraps a BAR1 or VFIO mapping instead.
//! struct Mapping {
//!     page: Box<Page>,
//! }
//!
//! // SAFETY: the boxed page is owned and never moves, it is one aligned page (so whole 64-byte
//! // lines), its bytes sit in an UnsafeCell (writable through `&self`), and no reference to
//! // them is handed out.
//! unsafe impl MappedMemory for Mapping {
//!     fn cpu_ptr(&self) -> *mut u8 {
//!         self.page.0.get().cast()
//!     }
//!     fn size(&self) -> usize {
//!         4096
//!     }
//!     fn caching(&self) -> Caching {
//!         Caching::WriteCombined
//!     }
//! }
//!
//! let m = Mapping { page: Box::new(Page(UnsafeCell::new([0; 4096]))) };
//! // Bounded byte copies with the streaming routines; `write_at` ends with a store fence.
//! m.write_at(100, b"hello, device")?;
//! let mut back = [0u8; 13];
//! m.read_at(100, &mut back)?;
//! assert_eq!(&back, b"hello, device");
//!
//! // Several pieces staged without fences, then published with one (a ring's slots, then its
//! // doorbell word).
//! m.write_at_unfenced(0, &[7; 64])?;
//! m.write_at_unfenced(64, &[8; 64])?;
//! m.publish();
//! m.store_u64(4088, 1)?;
//! m.publish();
//! assert_eq!(m.load_u64(4088)?, 1);
//!
//! // Out-of-range and misaligned accesses are refused before touching memory.
//! assert!(matches!(m.write_at(4090, &[0; 8]), Err(AccessError::OutOfBounds { .. })));
//! assert!(matches!(m.load_u32(2), Err(AccessError::Misaligned { width: 4, .. })));
//! # Ok::<(), AccessError>(())
//! ```

pub mod copy;
mod mapped;

pub use copy::store_fence;
pub use mapped::{check_range, AccessError, Caching, MappedMemory, SMALL_STAGE};
