//! gdr: direct data paths between NVIDIA GPUs, the CPU and other PCIe devices.
//!
//! Layers, from the bottom:
//! - [`cuda`], [`nvml`]: the CUDA driver API, NVRTC and NVML, loaded at run time (no link-time
//!   dependency), wrapped in a thin safe layer.
//! - [`bar`]: GPU memory that the CPU maps directly through the GPU's BAR1.
//! - [`copy`]: copy routines tuned for such mappings, and the auto copier.
//! - [`topo`]: the crate `gdr-pci` (PCI addresses, sysfs, the PCIe topology and peer-to-peer
//!   verdicts); it sits below all of gdr and needs nothing of it.
//! - [`peer`]: GPU memory for other devices (dma-buf export, registration cache).
//! - [`mq`]: message queues in GPU memory and persistent GPU workers.

pub mod bar;
pub mod copy;
pub mod cuda;
pub mod mq;
pub mod nvml;
pub mod peer;
pub mod pingpong;
pub mod stats;
pub mod testing;
pub use gdr_pci as topo;
