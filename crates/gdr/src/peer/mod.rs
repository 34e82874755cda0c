//! GPU memory for other devices: what a third-party PCIe device (a NIC, an FPGA, a storage
//! adapter) needs to reach GPU memory directly.
//!
//! - [`dmabuf`]: any CUDA range exported as a dma-buf file descriptor.
//! - [`regcache`]: the registration cache with lazy unpinning that GPUDirect RDMA users keep,
//!   generic over what a registration is (a dma-buf export, a CPU mapping, an RDMA region).
//! - [`cuda_cache`]: that cache over dma-buf exports, its default budget from free BAR1, and
//!   [`Tracked`] memory that invalidates its entries when freed.

pub mod cuda_cache;
pub mod dmabuf;
pub mod regcache;

pub use cuda_cache::{dmabuf_cache, DmaBufRegistrar, Invalidate, Tracked};
pub use dmabuf::{DmaBuf, DmaBufMapping, PeerError};
pub use regcache::{
    CacheConfig, CacheError, CacheStats, ConfigError, RegCache, RegHandle, Registrar, Tag,
    GPU_PAGE_SIZE,
};
