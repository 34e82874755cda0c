//! gdr: direct data paths between NVIDIA GPUs, the CPU and other PCIe devices.
//!
//! Layers, from the bottom:
//! - [`mem`] and [`copy`] (the gdr-mem crate): the [`mem::MappedMemory`] trait through which
//!   the CPU touches every mapping of device memory, and the copy routines for write-combined
//!   BARs.
//! - [`topo`] (the gdr-pci crate): PCI addresses, sysfs, the PCIe topology and peer-to-peer
//!   verdicts; it needs nothing of gdr.
//! - [`cuda`], [`nvml`] (the gdr-cuda crate): the CUDA driver API, NVRTC and NVML, loaded at
//!   run time by [`dylib`] (no link-time dependency), a thin safe layer over a private sys layer.
//! - [`GPU_PAGE_SIZE`], [`host_page_size`]: the page sizes every mapping is rounded to (a
//!   private `page` module, the bottom of this crate).
//! - [`bar`]: GPU memory that the CPU maps directly through the GPU's BAR1: the three mapping
//!   backends (gdrdrv, dma-buf, Vulkan) side by side, the pin layer over them, and the auto
//!   copier.
//! - [`peer`]: GPU memory for other devices (the dma-buf backend's export lent to other
//!   drivers, registration cache).
//!
//! [`info`] gathers what `gdr info` reports (libraries, GPUs, which backends work and why not).
//! [`timing`] is the interleaved timer the auto copier calibrates with, and the statistics of
//! the benchmarks and the server (order statistics, latency histograms). The message queues
//! are the `gdr-mq` crate; the benchmarks and the host-centric baselines are in the
//! `gdr-bench` crate; the GPU-test skip gate is the dev-only `gdr-testing` crate.
//!
//! # Example
//!
//! GPU memory that the CPU writes and reads through a BAR1 mapping, with no kernel module: the
//! Vulkan backend allocates it, maps it for the CPU and imports it into CUDA, so the same bytes
//! have a CPU mapping and a device pointer. Without libcuda, a GPU, the Vulkan loader or a
//! GPU whose BAR1 Vulkan can map (a build machine), the example stops at the first step, whose
//! error says what is missing.
//!
//! ```
//! use gdr::bar::{BarError, VulkanBackend};
//! use gdr::cuda::{self, Context, Device, DeviceMemory};
//!
//! // GPU 0, its primary context, and the Vulkan device of the same GPU (matched by UUID).
//! let opened = Device::get(0)
//!     .and_then(Context::new)
//!     .map_err(BarError::from)
//!     .and_then(|ctx| VulkanBackend::new(&ctx));
//! let be = match opened {
//!     Ok(be) => be,
//!     Err(e) => {
//!         println!("no usable GPU: {e}");
//! #       // gdr-testing's skip rule: a failure under GDR_REQUIRE_GPU=1 (GPU hosts), else a
//! #       // skip logged to GDR_SKIP_LOG for scripts/test.sh to count.
//! #       gdr_testing::skip_or_fail::<()>("gdr crate example (doctest)", &e.to_string());
//!         return Ok(());
//!     }
//! };
//! println!("{}: {} bytes of BAR-mappable VRAM", be.info().device_name, be.info().heap_size);
//!
//! // 4 KiB of GPU memory, 64-byte aligned on both sides of the mapping.
//! let buf = be.alloc(4096, 64)?;
//! println!("device pointer {:#x}", buf.device_ptr());
//!
//! // The CPU writes through the mapping (streaming stores and a fence: visible to GPU work
//! // started afterwards); the copy engine reads the same bytes through the device pointer.
//! buf.write(16, b"hello, GPU")?;
//! let mut back = [0u8; 10];
//! cuda::memcpy_dtoh(&mut back, &buf, 16)?;
//! assert_eq!(&back, b"hello, GPU");
//!
//! // The other way: the GPU writes, the CPU reads through the mapping (streaming loads).
//! cuda::memcpy_htod(&buf, 0, b"hello, CPU")?;
//! buf.context().synchronize()?; // a pageable copy returns once staged, not landed
//! buf.read(0, &mut back)?;
//! assert_eq!(&back, b"hello, CPU");
//!
//! // Accesses are checked against the buffer before memory is touched.
//! assert!(matches!(buf.write(4090, &[0; 8]), Err(BarError::Access(_))));
//! # Ok::<(), BarError>(())
//! ```

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
pub use gdr_pci::regular_file;

/// The README's library example, run as a doctest so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExample;
