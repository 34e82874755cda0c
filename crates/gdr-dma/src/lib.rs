//! gdr-dma: PCIe DMA engines driven from user space through VFIO (the picoevb job, without a
//! kernel module). Everything is at the crate root. The parts, in the order a program meets
//! them (the modules' own dependency order is in the comment above their declarations):
//!
//! - PCI and VFIO: find a device in sysfs ([`Sysfs`], [`PciInfo`]: gdr-pci's reader, the
//!   workspace's one PCI address type and sysfs reader), check it is ready for VFIO
//!   ([`check_vfio_ready`], [`bind_hint`]), open it through its IOMMU group into a type1
//!   container ([`Vfio`], [`VfioDevice`]), map its BARs ([`MappedBar`]), reach config space, and
//!   route interrupts to eventfds ([`VfioIrq`], [`EventFd`], [`Interrupt`]).
//! - The device's address space: [`IommuSpace`] maps host memory ([`HostPages`], [`DmaBuffer`])
//!   and other devices' BARs (peer memory, e.g. GPU BAR1) at IOVAs ([`IovaRange`]), with a table
//!   that refuses transfers to anything unmapped. [`SimIommu`] is a simulated IOMMU for models
//!   and tests.
//! - Registers behind a trait ([`RegisterIo`], [`Mmio`] for BARs), so behavioural models stand
//!   in for MMIO.
//! - Engines: the [`DmaEngine`] trait, and the [`Copier`] that copies any source to any
//!   destination ([`Endpoint`]) through device memory in descriptor lists.
//! - [`XdmaEngine`] (Xilinx XDMA: PicoEVB, HTG-K800, with their [`Leds`]) and [`EduEngine`]
//!   (QEMU's edu device).
//! - [`Session`]: open a device by PCI address and get its engine.
//! - [`Gtlb`]: the GPU page translation table an FPGA NIC uses to DMA by GPU virtual address.
//! - [`pattern`]: picoevb's test surface.
//!
//! A copy through the first DMA device of the machine (XDMA 10de:0001 or edu 1234:11e8, bound
//! to vfio-pci), as `gdr dma copy` does it. Without one there is nothing to do:
//!
//! ```
//! use gdr_dma::{Copier, Endpoint, EngineKind, MappedMemory, OpenOptions, Session, Sysfs};
//!
//! let sysfs = Sysfs::default();
//! let known = |vendor, device| EngineKind::for_ids(vendor, device).is_some();
//! let devices = sysfs.devices().unwrap_or_default();
//! let Some(dev) = devices.iter().find(|d| known(d.vendor, d.device)) else {
//!     return Ok(()); // no DMA device on this machine
//! };
//! let mut s = match Session::open(&dev.bdf, &OpenOptions::default()) {
//!     Ok(s) => s,
//!     Err(e) => {
//!         eprintln!("{}: {e}", dev.bdf); // not bound to vfio-pci, no IOMMU, ...
//!         return Ok(());
//!     }
//! };
//! let src = s.space.alloc_buffer(4096, "src")?;
//! let dst = s.space.alloc_buffer(4096, "dst")?;
//! src.write_at(0, b"through the device")?;
//! let stats = Copier::new(s.engine.as_mut(), &s.space).copy(
//!     &Endpoint::iova(src.range()),
//!     &Endpoint::iova(dst.range()),
//!     4096,
//! )?;
//! let mut back = [0u8; 18];
//! dst.read_at(0, &mut back)?;
//! assert_eq!(&back, b"through the device");
//! println!("{} bytes in {:?}", stats.bytes, stats.elapsed);
//! # Ok::<(), gdr_dma::DmaError>(())
//! ```
//!
//! The address space without hardware: a simulated IOMMU plays the device, and an IOVA nothing
//! is mapped at is refused before any transfer names it:
//!
//! ```
//! use gdr_dma::{IommuSpace, IovaRange, MappedMemory, SimIommu};
//! use std::sync::Arc;
//!
//! let iommu = Arc::new(SimIommu::new(4096));
//! let space = IommuSpace::new(iommu.clone(), 1 << 20, 1 << 30)?;
//! let buf = space.alloc_buffer(8192, "host")?;
//! // What a device does: write through the IOMMU at the buffer's IOVA.
//! iommu.write(buf.iova() + 16, b"from the device").expect("mapped");
//! let mut got = [0u8; 15];
//! buf.read_at(16, &mut got)?;
//! assert_eq!(&got, b"from the device");
//! // Past the buffer nothing is mapped: a transfer there would be refused.
//! assert!(space.check(IovaRange::new(buf.iova() + 8192, 4096)).is_err());
//! # Ok::<(), gdr_dma::DmaError>(())
//! ```

// Modules use only modules of a lower layer, never each other:
//   0 error, gtlb, pattern, regs       1 engine, irq, memory, pci      2 edu, iova
//   3 iommu                            4 planner, sim, vfio, xdma      5 session
mod edu;
mod engine;
mod error;
mod gtlb;
mod iommu;
mod iova;
mod irq;
mod memory;
pub mod pattern;
mod pci;
mod planner;
mod regs;
mod session;
mod sim;
mod vfio;
mod xdma;

pub use edu::EduEngine;
pub use engine::{check_submission, DmaDirection, DmaEngine, EngineLimits, Segment, TransferStats};
pub use error::DmaError;
pub use gtlb::{GpuPage, Gtlb, GtlbCapacity, GtlbEntry, GtlbError};
pub use iommu::{DmaBuffer, IommuBackend, IommuSpace, Mapping, OwnedMapping};
pub use iova::{IovaAllocator, IovaRange};
pub use irq::{EventFd, Interrupt};
pub use memory::{AccessError, Caching, HostPages, MappedMemory, RawRegion};
pub use pci::{bind_hint, check_vfio_ready, Bdf, PciInfo, Sysfs};
pub use planner::{Copier, Endpoint, Staging};
pub use regs::{Mmio, RegisterIo};
pub use session::{EngineKind, OpenOptions, Session};
pub use sim::{IovaFault, SimIommu};
pub use vfio::{MappedBar, Vfio, VfioDevice, VfioIrq, VfioRegion};
pub use xdma::{Leds, XdmaConfig, XdmaEngine};
