//! gdr-pci: the PCI vocabulary of the workspace. One address type ([`Bdf`]), one bounded sysfs
//! reader ([`Sysfs`]) with what it says about a function ([`PciInfo`]: IDs, class, driver, IOMMU
//! group, NUMA node), and on top of them the PCIe topology with peer-to-peer verdicts
//! ([`Topology`]). It depends on nothing else in the workspace, so the GPU side (`gdr`) and the
//! VFIO side (`gdr-dma`) speak of the same devices in the same terms.
//!
//! Whether a NIC, an NVMe drive or an FPGA can DMA straight into a GPU's memory, and how fast,
//! depends on where the two sit in the PCIe tree: under one switch the traffic turns around in
//! the switch; through the CPU's root complex it works but slower; across sockets it may crawl or
//! fail. The IOMMU, ACS redirection, degraded links and a small GPU BAR1 make it worse. The
//! topology reads all of that from sysfs and names the path the way `nvidia-smi topo -m` does
//! (X, PIX, PXB, PHB, NODE, SYS, NV#), with a verdict and the reasons behind it.
//!
//! The sysfs root is a parameter everywhere: tests read fixture trees, bug reports carry a
//! [`capture`](capture::capture) of the reporter's machine, and `/sys` is just the default.
//! `gdr` re-exports this crate as `gdr::topo`.
//!
//! ```no_run
//! let topo = gdr_pci::Topology::read("/sys")?;
//! let gpu = topo.find("gpu0")?.bdf;
//! let nic = topo.find("mlx5_0")?.bdf;
//! let path = topo.path(gpu, nic)?;
//! println!("{} {}", path.class, path.verdict);
//! # Ok::<(), gdr_pci::TopoError>(())
//! ```

mod bdf;
pub mod capture;
pub mod config;
mod cpulist;
mod device;
#[doc(hidden)] // builders of sysfs trees for tests and fixture generation, not the API
pub mod fixture;
mod info;
pub mod limits;
mod path;
pub mod render;
mod report;
mod resolve;
mod scan;
mod sysfs;
mod topology;
mod verdict;

pub use bdf::{Bdf, BdfParseError, BdfParseErrorKind};
pub use config::{Acs, AcsState};
pub use device::{
    format_size, pcie_generation, Bar, Device, DeviceClass, IommuGroup, LinkState, PortType,
};
pub use info::{PciError, PciInfo};
pub use path::{Hop, HopKind, PathClass, PeerPath};
pub use report::{PairReport, Report};
pub use sysfs::{Sysfs, SysfsError};
pub use topology::{HostBridge, Pairs, Switch, TopoError, Topology, Warning};
pub use verdict::{Reason, Severity, Verdict};
