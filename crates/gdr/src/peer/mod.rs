//! GPU memory for other devices: what a third-party PCIe device (a NIC, an FPGA, a storage
//! adapter) needs to reach GPU memory directly.
//!
//! - [`DmaBuf`]: any CUDA range exported as a dma-buf file descriptor. The export itself is the
//!   dma-buf mapping backend's (in [`crate::bar`]); peer memory lends it to other drivers.
//! - [`RegCache`]: the registration cache with lazy unpinning that GPUDirect RDMA users keep,
//!   generic over what a registration is (a dma-buf export, a CPU mapping, an RDMA region).
//! - [`dmabuf_cache`]: that cache over dma-buf exports, its default budget from free BAR1, and
//!   [`Tracked`] memory that invalidates its entries when freed.
//!
//! Inside, from the bottom: `regcache` (needs only [`GPU_PAGE_SIZE`]), then `cuda_cache` (the
//! cache over the backend's dma-buf export).

mod cuda_cache;
mod regcache;

pub use crate::bar::dmabuf::{DmaBuf, DmaBufMapping, PeerError};
pub use cuda_cache::{
    default_budget, dmabuf_cache, DmaBufRegistrar, Invalidate, Tracked, DEFAULT_MAX_ENTRIES,
    FALLBACK_BUDGET,
};
pub use regcache::{
    CacheConfig, CacheConfigError, CacheError, CacheStats, RegCache, RegHandle, Registrar, Tag,
    GPU_PAGE_SIZE,
};
