//! gdr-cuda: the CUDA driver API, NVRTC and NVML, loaded at run time, as a thin safe layer.
//!
//! Nothing links against NVIDIA's libraries: [`dylib`] loads them when first used, so
//! everything above builds and tests on machines without them and gets a typed error that says
//! what to install. The crate is the `cuda` (and `nvml`) of the `gdr` crate, which re-exports
//! it (`gdr::cuda`, `gdr::nvml`).
//!
//! Shape (as cudarc): a private `sys` module holds the raw entry points, `result` turns every
//! `CUresult` into a typed [`CudaError`], and the safe types above it tie each resource to the [`Context`] it lives
//! in: every handle keeps its context alive, so no buffer, stream or module can outlive it. The
//! safe types sit in one file per concern (`device`: devices and contexts; `memory`: buffers and
//! copies; `stream`: streams and events; `module`: modules and launches; `graph`; `external`:
//! imported memory; `pointer`: questions about an address) and are re-exported here, so their
//! paths are `gdr_cuda::X` (and `gdr::cuda::X`).

mod device;
pub mod dylib;
mod external;
mod graph;
mod memory;
mod module;
pub mod nvml;
pub mod nvrtc;
mod pointer;
mod result;
mod stream;
mod sys;
pub mod vmm;

pub use device::{Attribute, Context, CurrentContextGuard, Device, MAX_DEVICES};
pub use external::ExternalMemory;
pub use graph::Graph;
pub use memory::{
    memcpy_dtoh, memcpy_htod, memset, pointer_device, DeviceBuffer, DeviceMemory, HostBuffer,
};
pub use module::{Function, LaunchConfig, Module};
pub use pointer::{allocation_range, buffer_id, dma_buf_fd, set_sync_memops};
pub use result::{driver, CudaError, Driver, Result};
pub use stream::{synchronize_legacy_stream, Event, Stream};

use memory::check_range;
