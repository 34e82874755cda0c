//! gdr's allocator: every CUDA allocation of a program made mappable for the CPU.
//!
//! On hosts without gdrdrv and before CUDA driver 13.3, the CPU can map only GPU memory that
//! Vulkan can import: `cuMemCreate` memory made with a POSIX-fd handle type. Programs allocate
//! with `cudaMalloc` / `cuMemAlloc`, which such hosts cannot map, so the fix is at allocation.
//! This crate is the allocator's Rust side:
//! - [`Pool`]: a caching sub-allocator over chunks from a [`ChunkSource`] (size classes, reuse,
//!   release on pressure and on [`Pool::trim`]), with pins that map a whole chunk once and keep
//!   memory freed while pinned out of reuse until the unpin;
//! - [`VmmSource`]: the chunks as CUDA sees them (POSIX-fd `cuMemCreate`, reserved and mapped
//!   for the GPU and its peers) and their CPU mappings (Vulkan import, [`gdr::bar::MappedImport`]);
//! - [`ProbeCache`]: a GPU's successful probe kept between processes, so that only the first
//!   process on a machine opens Vulkan at its first allocation;
//! - [`Config`]: the environment switches (`GDR_ALLOC*`).
//!
//! The preloadable library `libgdr_alloc.so` (crate `gdr-alloc-preload`) puts this pool behind
//! `cudaMalloc`, `cuMemAlloc` and friends, and exports the C ABI of `crates/gdr-alloc-preload/include/gdr_alloc.h`, which
//! libgdrapi and gdr's Python package use to pin its memory (`gdr::bar::pool` is that ABI's
//! client). docs/alloc.md says what is covered and what is passed through.
//!
//! # Example
//!
//! The pool's bookkeeping over a stand-in source of host memory (the real one, [`VmmSource`],
//! needs a GPU): allocate, pin, write through the CPU mapping, free while pinned.
//!
//! ```
//! use gdr_alloc::{ChunkSource, Pool, SourceError, ALIGN};
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Mutex;
//!
//! /// Chunks of host memory at made-up device addresses, a GiB apart.
//! struct Host {
//!     next: AtomicU64,
//! }
//!
//! impl ChunkSource for Host {
//!     type Chunk = Mutex<Vec<u8>>;
//!     type Mapping = ();
//!     fn granularity(&self, _device: i32) -> Result<usize, SourceError> {
//!         Ok(2 << 20) // what current GPUs report
//!     }
//!     fn create(&self, _device: i32, size: usize) -> Result<(u64, Self::Chunk), SourceError> {
//!         Ok((self.next.fetch_add(1, Ordering::Relaxed) << 30, Mutex::new(vec![0; size])))
//!     }
//!     fn map(&self, _device: i32, chunk: &Self::Chunk) -> Result<(*mut u8, ()), SourceError> {
//!         Ok((chunk.lock().unwrap().as_mut_ptr(), ()))
//!     }
//!     fn protect(&self, _cpu: *mut u8, _len: usize, _accessible: bool) -> bool {
//!         false // heap memory: leave its protection alone
//!     }
//! }
//!
//! let pool = Pool::new(Host { next: AtomicU64::new(1) }, 64 << 20);
//! let addr = pool.alloc(0, 1000)?; // as cudaMalloc(1000) on GPU 0
//! assert_eq!(addr % ALIGN as u64, 0);
//!
//! // A pin maps the whole chunk once; later pins in it cost a lookup.
//! let pin = pool.pin(addr, 1000)?;
//! pool.map(pin.id)?;
//! let offset = usize::try_from(addr - pin.base)?;
//! // SAFETY: [addr, addr + 1000) lies in the pinned chunk, whose mapping starts at `pin.cpu`,
//! // and nothing else touches those bytes now.
//! unsafe { pin.cpu.add(offset).write_bytes(7, 1000) };
//! pool.unmap(pin.id)?;
//!
//! // Freed while pinned: held back from reuse until the unpin, and the pin can tell.
//! pool.free(addr);
//! assert_eq!(pool.pin_freed(pin.id), Some(true));
//! assert_eq!(pool.stats().quarantined_bytes, 1024); // 1000 rounded up to ALIGN
//! pool.unpin(pin.id)?;
//! assert_eq!(pool.stats().quarantined_bytes, 0);
//!
//! // The empty chunk stays cached until trimmed.
//! assert_eq!(pool.trim(None), 2 << 20);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod pool;
mod probe_cache;
mod source;

pub use config::{parse_size, Config, ConfigError, DEFAULT_CACHE};
pub use pool::{
    AllocError, Block, ChunkSource, PinFailure, Pool, PoolPinned, PoolUnpinError, SourceError,
    Stats, ALIGN, LARGE_ALIGN, LARGE_CHUNK, LARGE_CLASS_MIN, SMALL_CLASS_MAX, VIEW_PAGE,
};
pub use probe_cache::{ProbeCache, ProbeKey};
pub use source::{Probed, VmmSource};
