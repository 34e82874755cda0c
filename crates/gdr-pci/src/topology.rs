//! The PCI tree of one machine as [`Topology`]: host bridges, switches, every function, names and
//! NVLink counts. Reading it (`scan`), the paths and verdicts between functions (`path`) and the
//! JSON report (`report`) are added by the modules above, each in its own `impl Topology`.

use crate::bdf::Bdf;
use crate::device::{natural_key, DeviceClass, PciDevice, PortType};
use crate::sysfs_error::SysfsError;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A host bridge (PCI root bus, `/sys/devices/pciDDDD:BB`): one root complex as far as
/// peer-to-peer routing is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostBridge {
    /// Its sysfs name, `pciDDDD:BB`.
    pub name: String,
    /// The PCI domain (segment) of its root bus.
    pub domain: u32,
    /// The root bus number.
    pub bus: u8,
    /// From the devices below it; `None` on machines without NUMA information.
    pub numa: Option<u32>,
}

/// A PCIe switch as the tree shows it: an upstream port and the downstream ports below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Switch {
    /// The upstream port, which links the switch towards the root complex.
    pub upstream: Bdf,
    /// The downstream ports directly below it, in address order.
    pub downstream: Vec<Bdf>,
    /// The host bridge above it, as sysfs names it (`pci0000:17`).
    pub host_bridge: String,
}

/// Something in the tree that could not be read or made no sense; the answer is partial there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The sysfs path, relative to the root; empty for notes about the whole tree.
    pub path: String,
    /// What was wrong and what was done about it ("unreadable: ...; device skipped").
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a topology could not be read, queried or captured.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// The root has no readable `bus/pci/devices`: it is no sysfs tree (or no capture).
    #[error("{}: not a sysfs tree (cannot list bus/pci/devices: {source})", root.display())]
    NotSysfs {
        /// The root given.
        root: PathBuf,
        /// Why `bus/pci/devices` could not be listed.
        source: SysfsError,
    },
    /// [`Topology::find`] matched no address, name or label.
    #[error("no device matches `{query}`; known: {known}")]
    UnknownDevice {
        /// The query, trimmed.
        query: String,
        /// Names of the endpoints that exist (at most 12, then `...`), or `none`.
        known: String,
    },
    /// An address that is not in this topology.
    #[error("device {0} is not in this topology")]
    NoSuchBdf(Bdf),
    /// [`Topology::set_gpu_numa_id`] was given a device that is no NVIDIA GPU.
    #[error("GPU NUMA ID for {0}: not an NVIDIA GPU")]
    NotAGpu(Bdf),
    /// [`Topology::set_nvlinks`] was given a pair it cannot take.
    #[error("NVLink entry {a} <-> {b}: {why}")]
    BadNvlink {
        /// One end of the link.
        a: Bdf,
        /// The other end.
        b: Bdf,
        /// What is wrong: a device linked to itself, or not in this topology.
        why: &'static str,
    },
    /// [`capture`](crate::capture::capture) was pointed at a directory that holds something.
    #[error("capture into {}: the directory exists and is not empty", .0.display())]
    CaptureDestinationNotEmpty(PathBuf),
    /// Writing the capture failed.
    #[error("capture: {}: {source}", path.display())]
    CaptureIo {
        /// The file or directory being written.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// The PCI tree of one machine (or capture), with names, and optional NVLink counts.
///
/// # Examples
///
/// ```
/// use gdr_pci::{PathClass, Topology, Verdict};
///
/// // A capture of a workstation: one GPU, a dual-port NIC, an NVMe drive.
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topo/workstation");
/// let topo = Topology::read(dir)?;
/// let gpu = topo.find("gpu0")?.bdf;
/// let (nic0, nic1) = (topo.find("mlx5_0")?.bdf, topo.find("mlx5_1")?.bdf);
/// assert_eq!(gpu.to_string(), "0000:01:00.0");
/// // As nvidia-smi topo -m says: through the host bridge, and the NIC's ports under one bridge.
/// let gpu_nic = topo.path(gpu, nic0)?;
/// assert_eq!(gpu_nic.class, PathClass::Phb);
/// assert_ne!(gpu_nic.verdict, Verdict::Good);
/// assert_eq!(topo.path(nic0, nic1)?.class, PathClass::Pix);
/// # Ok::<(), gdr_pci::TopoError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Topology {
    root: PathBuf,
    devices: Vec<PciDevice>,
    host_bridges: Vec<HostBridge>,
    index: HashMap<Bdf, usize>,
    host_index: HashMap<String, usize>,
    nvlinks: HashMap<(Bdf, Bdf), u32>,
    iommu_groups_present: bool,
    warnings: Vec<Warning>,
}

impl Topology {
    pub(crate) fn from_parts(
        root: PathBuf,
        devices: Vec<PciDevice>,
        host_bridges: Vec<HostBridge>,
        iommu_groups_present: bool,
        warnings: Vec<Warning>,
    ) -> Self {
        let index = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.bdf, i))
            .collect();
        let host_index = host_bridges
            .iter()
            .enumerate()
            .map(|(i, h)| (h.name.clone(), i))
            .collect();
        Self {
            root,
            devices,
            host_bridges,
            index,
            host_index,
            nvlinks: HashMap::new(),
            iommu_groups_present,
            warnings,
        }
    }

    /// The sysfs root the tree was read from (`/sys`, or a capture's directory).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every PCI function, bridges included, in address order of `bus/pci/devices`.
    pub fn devices(&self) -> &[PciDevice] {
        &self.devices
    }

    /// The function at `bdf`, if the tree has it.
    pub fn device(&self, bdf: Bdf) -> Option<&PciDevice> {
        self.index.get(&bdf).map(|&i| &self.devices[i])
    }

    /// Every host bridge (root complex), in sysfs order.
    pub fn host_bridges(&self) -> &[HostBridge] {
        &self.host_bridges
    }

    /// The host bridge named `name` (`pci0000:17`), if there is one.
    pub fn host_bridge(&self, name: &str) -> Option<&HostBridge> {
        self.host_index.get(name).map(|&i| &self.host_bridges[i])
    }

    /// What could not be read or made no sense while reading the tree: the answer is partial
    /// there.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The PCIe switches: every upstream port with its downstream ports.
    pub fn switches(&self) -> Vec<Switch> {
        // Downstream ports by parent, in one pass: a tree of thousands of ports stays linear.
        let mut below: HashMap<Bdf, Vec<Bdf>> = HashMap::new();
        for d in &self.devices {
            if let (Some(p), PortType::SwitchDownstream) = (d.parent, d.port_type) {
                below.entry(p).or_default().push(d.bdf);
            }
        }
        self.devices
            .iter()
            .filter(|d| d.port_type == PortType::SwitchUpstream)
            .map(|u| Switch {
                upstream: u.bdf,
                downstream: below.remove(&u.bdf).unwrap_or_default(),
                host_bridge: u.host_bridge.clone(),
            })
            .collect()
    }

    /// Whether the kernel has IOMMU groups at all (an IOMMU is enabled, in some mode).
    pub fn iommu_groups_present(&self) -> bool {
        self.iommu_groups_present
    }

    /// NVIDIA GPUs in index order (GPU0, GPU1, ...).
    pub fn gpus(&self) -> Vec<&PciDevice> {
        self.endpoints_where(|c| c == DeviceClass::Gpu)
    }

    /// Every endpoint (everything but bridges), GPUs first, then RDMA NICs, NICs, NVMe,
    /// accelerators, others.
    pub fn endpoints(&self) -> Vec<&PciDevice> {
        self.endpoints_where(|c| c != DeviceClass::Bridge)
    }

    /// What `gdr topo` shows by default: GPUs and the devices that exchange data with them
    /// (NICs, RDMA NICs, NVMe, FPGAs/accelerators).
    pub fn gpu_view(&self) -> Vec<&PciDevice> {
        self.endpoints_where(DeviceClass::is_gpu_peer)
    }

    fn endpoints_where(&self, keep: impl Fn(DeviceClass) -> bool) -> Vec<&PciDevice> {
        let rank = |c: DeviceClass| match c {
            DeviceClass::Gpu => 0,
            DeviceClass::RdmaNic => 1,
            DeviceClass::Nic => 2,
            DeviceClass::Nvme => 3,
            DeviceClass::Accelerator => 4,
            DeviceClass::Other => 5,
            DeviceClass::Bridge => 6,
        };
        let mut v: Vec<&PciDevice> = self.devices.iter().filter(|d| keep(d.class)).collect();
        v.sort_by_key(|d| (rank(d.class), natural_key(&d.label), d.bdf));
        v
    }

    /// Finds a device by address (`0000:17:00.0`, `17:00.0`), name (`gpu0`, `mlx5_0`, `nvme0`,
    /// `eth0`) or matrix label (`GPU0`, `NIC1`).
    pub fn find(&self, query: &str) -> Result<&PciDevice, TopoError> {
        let q = query.trim();
        if let Ok(bdf) = q.parse::<Bdf>() {
            if let Some(d) = self.device(bdf) {
                return Ok(d);
            }
        }
        let by_name = self.devices.iter().find(|d| d.names.iter().any(|n| n == q));
        let by_label = || {
            self.devices
                .iter()
                .find(|d| !d.label.is_empty() && d.label.eq_ignore_ascii_case(q))
        };
        if let Some(d) = by_name.or_else(by_label) {
            return Ok(d);
        }
        let mut known: Vec<String> = self.endpoints().iter().map(|d| d.name()).collect();
        if known.len() > 12 {
            known.truncate(12);
            known.push("...".into());
        }
        Err(TopoError::UnknownDevice {
            query: q.to_string(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        })
    }

    /// Declares NVLink connections (from NVML): `(a, b, number of links)`. A count of 0 removes
    /// the pair. Pairs given here get path class `NV#` instead of their PCIe class.
    pub fn set_nvlinks(&mut self, links: &[(Bdf, Bdf, u32)]) -> Result<(), TopoError> {
        for &(a, b, _) in links {
            let why = if a == b {
                Some("a device cannot link to itself")
            } else if self.device(a).is_none() || self.device(b).is_none() {
                Some("device not in this topology")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(TopoError::BadNvlink { a, b, why });
            }
        }
        for &(a, b, n) in links {
            let key = (a.min(b), a.max(b));
            if n == 0 {
                self.nvlinks.remove(&key);
            } else {
                self.nvlinks.insert(key, n);
            }
        }
        Ok(())
    }

    /// Sets (or clears) the NUMA node of a GPU's own memory, which NVML reports
    /// (`nvmlDeviceGetNumaNodeId`) on machines that map GPU memory as a NUMA node and sysfs does
    /// not show. The matrix prints it under "GPU NUMA ID".
    pub fn set_gpu_numa_id(&mut self, gpu: Bdf, node: Option<u32>) -> Result<(), TopoError> {
        let i = *self.index.get(&gpu).ok_or(TopoError::NoSuchBdf(gpu))?;
        let d = &mut self.devices[i];
        if !d.is_nvidia_gpu() {
            return Err(TopoError::NotAGpu(gpu));
        }
        d.gpu_numa_id = node;
        Ok(())
    }

    /// The NVLink count declared for a pair.
    pub fn nvlinks(&self, a: Bdf, b: Bdf) -> Option<u32> {
        self.nvlinks.get(&(a.min(b), a.max(b))).copied()
    }

    pub(crate) fn index_of(&self, bdf: Bdf) -> Option<usize> {
        self.index.get(&bdf).copied()
    }
}
