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
//! - [`Config`]: the environment switches (`GDR_ALLOC*`).
//!
//! The preloadable library `libgdr_alloc.so` (crate `gdr-alloc-preload`) puts this pool behind
//! `cudaMalloc`, `cuMemAlloc` and friends, and exports the C ABI of `crates/gdr-alloc-preload/include/gdr_alloc.h`, which
//! libgdrapi and gdr's Python package use to pin its memory (`gdr::bar::pool` is that ABI's
//! client). docs/alloc.md says what is covered and what is passed through.

#![deny(missing_docs)]

mod config;
mod pool;
mod source;

pub use config::{parse_size, Config, ConfigError, DEFAULT_CACHE};
pub use pool::{
    AllocError, Block, ChunkSource, PinFailure, Pool, PoolPinned, PoolUnpinError, SourceError,
    Stats, ALIGN, LARGE_ALIGN, LARGE_CHUNK, LARGE_CLASS_MIN, SMALL_CLASS_MAX, VIEW_PAGE,
};
pub use source::VmmSource;
