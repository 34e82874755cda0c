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
//! copies; `stream`: streams and events; `module`: modules and launches; `args`: the typed
//! arguments of a launch; `graph`; `external`:
//! imported memory; `pointer`: questions about an address) and are re-exported here, so their
//! paths are `gdr_cuda::X` (and `gdr::cuda::X`).
//!
//! # Example
//!
//! A round trip through device memory. Without libcuda or without a GPU (a build machine) the
//! example stops at the first call, whose error says what is missing.
//!
//! ```
//! use gdr_cuda::{memcpy_dtoh, memcpy_htod, memset, Context, CudaError, Device, DeviceBuffer};
//! use gdr_cuda::{DeviceMemory, Stream};
//! # /// The skip rule of gdr-testing (which this crate cannot depend on): under
//! # /// GDR_REQUIRE_GPU=1 (GPU hosts) no GPU is a failure; otherwise the skip is logged to
//! # /// GDR_SKIP_LOG for scripts/test.sh to count.
//! # fn skipped(why: &dyn std::fmt::Display) {
//! #     use std::io::Write;
//! #     let required = std::env::var("GDR_REQUIRE_GPU").is_ok_and(|v| v == "1");
//! #     assert!(!required, "GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
//! #     if let Some(log) = std::env::var_os("GDR_SKIP_LOG") {
//! #         let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
//! #         f.write_all(b"skipped: no GPU: gdr_cuda crate example (doctest)\n").unwrap();
//! #     }
//! # }
//!
//! let dev = match Device::get(0) {
//!     Ok(dev) => dev,
//!     Err(e) => {
//!         println!("no usable GPU: {e}");
//! #       skipped(&e);
//!         return Ok(());
//!     }
//! };
//! let ctx = Context::new(dev)?; // the primary context, current on this thread
//! println!("{} ({}), compute {:?}", dev.name()?, dev.pci_bus_id()?, dev.compute_capability()?);
//!
//! let buf = DeviceBuffer::new(&ctx, 4096)?;
//! memset(&buf, 0xab)?;
//! memcpy_htod(&buf, 16, b"hello, GPU")?;
//! let mut back = [0u8; 12];
//! memcpy_dtoh(&mut back, &buf, 15)?;
//! assert_eq!(&back, b"\xabhello, GPU\xab");
//!
//! // Ranges are checked against the buffer before the driver is called.
//! assert!(matches!(
//!     memcpy_htod(&buf, buf.len() - 4, &[0; 8]),
//!     Err(CudaError::OutOfBounds { .. })
//! ));
//!
//! // Every handle holds its context: the buffer and the stream keep `ctx` alive.
//! let stream = Stream::new(&ctx)?;
//! stream.synchronize()?;
//! # Ok::<(), CudaError>(())
//! ```

mod args;
mod device;
pub mod dylib;
mod external;
mod graph;
pub mod host;
mod memory;
mod module;
pub mod nvml;
pub mod nvrtc;
mod pointer;
mod result;
mod staged;
mod stream;
mod sys;
pub mod vmm;

pub use args::{KernelArg, KernelArgs, MAX_KERNEL_ARGS};
pub use device::{Attribute, Context, CurrentContextGuard, Device, MAX_DEVICES};
pub use external::ExternalMemory;
pub use graph::Graph;
pub use memory::{
    memcpy_dtoh, memcpy_htod, memset, pointer_device, DeviceBuffer, DeviceMemory, DeviceRange,
    HostBuffer,
};
pub use module::{Function, LaunchConfig, Module};
pub use pointer::{allocation_range, buffer_id, dma_buf_fd, set_sync_memops};
pub use result::{driver, explain_init, CudaError, Driver, Result};
pub use staged::{is_page_locked, read_into_host, Stager, STAGED_READ_MAX};
pub use stream::{synchronize_legacy_stream, Event, Stream};

use memory::check_range;
