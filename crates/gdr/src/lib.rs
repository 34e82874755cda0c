//! gdr: direct data paths between NVIDIA GPUs, the CPU and other PCIe devices.
//!
//! Layers, from the bottom:
//! - [`mem`] (the gdr-mem crate): the [`mem::MappedMemory`] trait through which the CPU
//!   touches every mapping of device memory, and the copy routines for write-combined BARs.
//! - [`cuda`], [`nvml`] (the gdr-cuda crate): the CUDA driver API, NVRTC and NVML, loaded at
//!   run time by [`dylib`] (no link-time dependency), a thin safe layer over a private sys layer.
//! - [`copy`]: copy routines for CPU mappings of GPU memory (gdr-mem's, re-exported).
//! - [`GPU_PAGE_SIZE`], [`host_page_size`]: the page sizes every mapping is rounded to (a
//!   private `page` module, the bottom of this crate).
//! - [`bar`]: GPU memory that the CPU maps directly through the GPU's BAR1: the three mapping
//!   backends (gdrdrv, dma-buf, Vulkan) side by side, the pin layer over them, and the auto
//!   copier.
//! - [`topo`]: the crate `gdr-pci` (PCI addresses, sysfs, the PCIe topology and peer-to-peer
//!   verdicts); it sits below all of gdr and needs nothing of it.
//! - [`peer`]: GPU memory for other devices (the dma-buf backend's export lent to other
//!   drivers, registration cache).
//!
//! [`info`] gathers what `gdr info` reports (libraries, GPUs, which backends work and why not).
//! [`timing`] is the interleaved timer the auto copier calibrates with, and the statistics of
//! the benchmarks and the server (order statistics, latency histograms). The message queues
//! are the `gdr-mq` crate; the benchmarks and the host-centric baselines are in the
//! `gdr-bench` crate; the GPU-test skip gate is the dev-only `gdr-testing` crate.

pub mod bar;
mod page;
pub use gdr_cuda as cuda;
pub use gdr_cuda::{dylib, nvml};
pub use gdr_mem as mem;
pub use gdr_mem::copy;
pub use page::{host_page_size, GPU_PAGE_SHIFT, GPU_PAGE_SIZE};
pub mod info;
pub mod peer;
pub mod timing;
pub use gdr_pci as topo;
