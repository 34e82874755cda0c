//! GPU memory for other devices: what a third-party PCIe device (a NIC, an FPGA, a storage
//! adapter) needs to reach GPU memory directly.
//!
//! - [`regcache`]: the registration cache with lazy unpinning that GPUDirect RDMA users keep,
//!   generic over what a registration is (a dma-buf export, a CPU mapping, an RDMA region).

pub mod regcache;

pub use regcache::{
    CacheConfig, CacheError, CacheStats, ConfigError, RegCache, RegHandle, Registrar, Tag,
    GPU_PAGE_SIZE,
};
