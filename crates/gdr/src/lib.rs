//! gdr: direct data paths between NVIDIA GPUs, the CPU and other PCIe devices.
//!
//! Layers, from the bottom:
//! - [`cuda`], [`nvml`]: the CUDA driver API, NVRTC and NVML, loaded at run time by [`dylib`]
//!   (no link-time dependency), wrapped in a thin safe layer.
//! - [`bar`]: GPU memory that the CPU maps directly through the GPU's BAR1.
//! - [`copy`]: copy routines tuned for such mappings, and the auto copier.
//! - [`topo`]: the PCIe topology and peer-to-peer verdicts.
//! - [`peer`]: GPU memory for other devices (dma-buf export, registration cache).
//! - [`mq`]: message queues in GPU memory and persistent GPU workers.

pub mod bar;
pub mod copy;
pub mod cuda;
pub mod dylib;
pub mod mq;
pub mod nvml;
pub mod peer;
pub mod pingpong;
pub mod stats;
pub mod testing;
pub mod topo;
