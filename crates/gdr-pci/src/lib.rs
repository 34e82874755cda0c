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
//! ```
//! use gdr_pci::{render, Topology};
//!
//! // `/sys` on a live system (a capture's directory reads the same way). A container whose
//! // sysfs shows no PCI bus has nothing to report.
//! let Ok(topo) = Topology::read("/sys") else {
//!     return Ok(());
//! };
//! for w in topo.warnings() {
//!     eprintln!("warning: {w}");
//! }
//! // The GPU view: every pair of a GPU with a NIC, NVMe drive or FPGA (every pair when the
//! // machine has no GPU), with its class and verdict.
//! let devices = topo.gpu_view();
//! for p in topo.gpu_pairs(&devices) {
//!     println!("{} <-> {}: {} {}", p.a, p.b, p.class, p.verdict);
//! }
//! // Devices by name, as `gdr topo --explain gpu0 mlx5_0` finds them: hops, reasons, advice.
//! if let (Ok(gpu), Ok(nic)) = (topo.find("gpu0"), topo.find("mlx5_0")) {
//!     let path = topo.path(gpu.bdf, nic.bdf)?;
//!     println!("{}", render::explain(&topo, &path));
//! }
//! # Ok::<(), gdr_pci::TopoError>(())
//! ```

// Modules use only modules of a lower layer, never each other:
//   0 bdf, config, cpulist, keep, limits, regular_file
//   1 device, sysfs_error      2 resolve, topology      3 fixture, geometry, sysfs
//   4 info, verdict            5 path, scan             6 capture, render, report
// `Topology` (layer 2) holds the tree; the modules above add its queries in their own
// `impl Topology` blocks (`read` in scan, `path`/`pairs` in path, `report` in report).
mod bdf;
pub mod capture;
pub mod config;
mod cpulist;
mod device;
#[doc(hidden)] // builders of sysfs trees for tests and fixture generation, not the API
pub mod fixture;
mod geometry;
mod info;
mod keep;
pub mod limits;
mod path;
pub mod regular_file;
pub mod render;
mod report;
mod resolve;
mod scan;
mod sysfs;
mod sysfs_error;
mod topology;
mod verdict;

pub use bdf::{Bdf, BdfParseError, BdfParseErrorKind};
pub use config::{Acs, AcsState};
pub use device::{
    format_size, pcie_generation, Bar, DeviceClass, IommuGroup, LinkState, PciDevice, PortType,
};
pub use geometry::PathClass;
pub use info::{PciError, PciInfo};
pub use path::{Hop, HopKind, Pairs, PeerPath};
pub use report::{PairReport, TopoReport};
pub use sysfs::Sysfs;
pub use sysfs_error::SysfsError;
pub use topology::{HostBridge, Switch, TopoError, Topology, Warning};
pub use verdict::{Reason, Severity, Verdict};
