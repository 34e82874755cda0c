//! gdr-dma: PCIe DMA engines driven from user space through VFIO (the picoevb job, without a
//! kernel module).
//!
//! Layers, from the bottom:
//! - [`pci`], [`vfio`]: find a device in sysfs (through gdr-pci, the workspace's one PCI
//!   address type and sysfs reader), open it through its IOMMU group into a type1 container,
//!   map its BARs, reach config space, route interrupts to eventfds ([`irq`]).
//! - [`iommu`], [`iova`], [`memory`]: the device's address space: host buffers, other devices'
//!   BARs (peer memory, e.g. GPU BAR1) mapped at IOVAs, with a table that refuses transfers to
//!   anything unmapped. [`sim`] is a simulated IOMMU for models and tests.
//! - [`regs`]: register access behind a trait, so behavioural models stand in for MMIO.
//! - [`engine`], [`planner`]: the [`engine::DmaEngine`] trait and the planner that copies any
//!   source to any destination through device memory in descriptor lists.
//! - [`xdma`], [`edu`]: the Xilinx XDMA engine (PicoEVB, HTG-K800) and QEMU's edu device.
//! - [`session`]: open a device by address and get its engine.
//! - [`gtlb`]: the GPU page translation table an FPGA NIC uses to DMA by GPU virtual address.
//! - [`pattern`]: picoevb's test surface.

pub mod edu;
pub mod engine;
pub mod error;
pub mod gtlb;
pub mod iommu;
pub mod iova;
pub mod irq;
pub mod memory;
pub mod pattern;
pub mod pci;
pub mod planner;
pub mod regs;
pub mod session;
pub mod sim;
pub mod vfio;
pub mod xdma;

pub use engine::{Direction, DmaEngine, EngineLimits, Segment, TransferStats};
pub use error::{DmaError, Result};
pub use iommu::{DmaBuffer, IommuBackend, IommuSpace, Mapping, OwnedMapping};
pub use iova::IovaRange;
pub use memory::{AccessError, Caching, HostBuffer, MappedMemory, RawRegion};
pub use pci::Bdf;
pub use planner::{Copier, Endpoint, Staging};
pub use session::{EngineKind, OpenOptions, Session};
