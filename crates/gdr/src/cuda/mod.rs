//! A thin safe layer over the CUDA driver API, loaded at run time.
//!
//! Shape (as cudarc): [`sys`] holds the raw entry points, `result` turns every `CUresult` into a
//! typed [`CudaError`], and the safe types above it tie each resource to the [`Context`] it lives
//! in: every handle keeps its context alive, so no buffer, stream or module can outlive it. The
//! safe types sit in one file per concern (`device`: devices and contexts; `memory`: buffers and
//! copies; `stream`: streams and events; `module`: modules and launches; `graph`; `external`:
//! imported memory) and are re-exported here, so their paths are `gdr::cuda::X`.

mod device;
mod external;
mod graph;
mod memory;
mod module;
pub mod nvrtc;
mod result;
mod stream;
pub mod sys;
pub mod vmm;

pub use device::{Context, CurrentContextGuard, Device, MAX_DEVICES};
pub use external::ExternalMemory;
pub use graph::Graph;
pub use memory::{
    memcpy_dtoh, memcpy_htod, memset, pointer_device, DeviceBuffer, DeviceMemory, HostBuffer,
};
pub use module::{Function, LaunchConfig, Module};
pub use result::{driver, CudaError, Driver, Result};
pub use stream::{synchronize_legacy_stream, Event, Stream};

use memory::check_range;
