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

pub mod copy;
mod mapped;

pub use copy::store_fence;
pub use mapped::{check_range, AccessError, Caching, MappedMemory, SMALL_STAGE};
