//! The PCI tree of one machine as [`Topology`]: host bridges, switches, every function, and the
//! path class and verdict between any two of them.

use crate::bdf::Bdf;
use crate::device::{Device, DeviceClass, PortType};
use crate::limits::MAX_PAIRS;
use crate::path::{self, PeerPath};
use crate::report::{self, Report};
use crate::scan;
use crate::sysfs::{Sysfs, SysfsError};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A host bridge (PCI root bus, `/sys/devices/pciDDDD:BB`): one root complex as far as
/// peer-to-peer routing is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostBridge {
    pub name: String,
    pub domain: u32,
    pub bus: u8,
    /// From the devices below it; `None` on machines without NUMA information.
    pub numa: Option<u32>,
}

/// A PCIe switch as the tree shows it: an upstream port and the downstream ports below it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Switch {
    pub upstream: Bdf,
    pub downstream: Vec<Bdf>,
    pub host_bridge: String,
}

/// Something in the tree that could not be read or made no sense; the answer is partial there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The sysfs path, relative to the root; empty for notes about the whole tree.
    pub path: String,
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

#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("{}: not a sysfs tree (cannot list bus/pci/devices: {source})", root.display())]
    NotSysfs { root: PathBuf, source: SysfsError },
    #[error("no device matches `{query}`; known: {known}")]
    UnknownDevice { query: String, known: String },
    #[error("device {0} is not in this topology")]
    NoSuchBdf(Bdf),
    #[error("GPU NUMA ID for {0}: not an NVIDIA GPU")]
    NotAGpu(Bdf),
    #[error("NVLink entry {a} <-> {b}: {why}")]
    BadNvlink { a: Bdf, b: Bdf, why: &'static str },
    #[error("capture into {}: the directory exists and is not empty", .0.display())]
    CaptureDestinationNotEmpty(PathBuf),
    #[error("capture: {}: {source}", path.display())]
    CaptureIo {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Device pairs with their paths, at most [`MAX_PAIRS`]; `left_out` more were asked for.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    pub paths: Vec<PeerPath>,
    pub left_out: usize,
}

impl Pairs {
    /// The sentence for a warning when pairs were left out.
    pub fn left_out_note(&self) -> Option<String> {
        (self.left_out > 0).then(|| {
            format!(
                "{} pairs left out: at most {MAX_PAIRS} are judged at once (ask for one with \
                 --explain A B)",
                self.left_out
            )
        })
    }
}

impl IntoIterator for Pairs {
    type Item = PeerPath;
    type IntoIter = std::vec::IntoIter<PeerPath>;
    fn into_iter(self) -> Self::IntoIter {
        self.paths.into_iter()
    }
}

/// The PCI tree of one machine (or capture), with names, and optional NVLink counts.
#[derive(Debug, Clone)]
pub struct Topology {
    root: PathBuf,
    devices: Vec<Device>,
    host_bridges: Vec<HostBridge>,
    index: HashMap<Bdf, usize>,
    host_index: HashMap<String, usize>,
    nvlinks: HashMap<(Bdf, Bdf), u32>,
    iommu_groups_present: bool,
    warnings: Vec<Warning>,
}

impl Topology {
    /// Reads the tree under `root` (`/sys` on a live system). Fails only when `root` has no
    /// `bus/pci/devices`; every other problem is a [`Warning`] and a partial answer.
    pub fn read(root: impl AsRef<Path>) -> Result<Self, TopoError> {
        scan::scan(&Sysfs::new(root.as_ref()))
    }

    /// [`Topology::read`] on `/sys`.
    pub fn read_system() -> Result<Self, TopoError> {
        Self::read("/sys")
    }

    pub(crate) fn from_parts(
        root: PathBuf,
        devices: Vec<Device>,
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

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every PCI function, bridges included, in address order of `bus/pci/devices`.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    pub fn device(&self, bdf: Bdf) -> Option<&Device> {
        self.index.get(&bdf).map(|&i| &self.devices[i])
    }

    pub fn host_bridges(&self) -> &[HostBridge] {
        &self.host_bridges
    }

    pub fn host_bridge(&self, name: &str) -> Option<&HostBridge> {
        self.host_index.get(name).map(|&i| &self.host_bridges[i])
    }

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
    pub fn gpus(&self) -> Vec<&Device> {
        self.endpoints_where(|c| c == DeviceClass::Gpu)
    }

    /// Every endpoint (everything but bridges), GPUs first, then RDMA NICs, NICs, NVMe,
    /// accelerators, others.
    pub fn endpoints(&self) -> Vec<&Device> {
        self.endpoints_where(|c| c != DeviceClass::Bridge)
    }

    /// What `gdr topo` shows by default: GPUs and the devices that exchange data with them
    /// (NICs, RDMA NICs, NVMe, FPGAs/accelerators).
    pub fn gpu_view(&self) -> Vec<&Device> {
        self.endpoints_where(DeviceClass::is_gpu_peer)
    }

    fn endpoints_where(&self, keep: impl Fn(DeviceClass) -> bool) -> Vec<&Device> {
        let rank = |c: DeviceClass| match c {
            DeviceClass::Gpu => 0,
            DeviceClass::RdmaNic => 1,
            DeviceClass::Nic => 2,
            DeviceClass::Nvme => 3,
            DeviceClass::Accelerator => 4,
            DeviceClass::Other => 5,
            DeviceClass::Bridge => 6,
        };
        let mut v: Vec<&Device> = self.devices.iter().filter(|d| keep(d.class)).collect();
        v.sort_by_key(|d| (rank(d.class), scan::natural_key(&d.label), d.bdf));
        v
    }

    /// Finds a device by address (`0000:17:00.0`, `17:00.0`), name (`gpu0`, `mlx5_0`, `nvme0`,
    /// `eth0`) or matrix label (`GPU0`, `NIC1`).
    pub fn find(&self, query: &str) -> Result<&Device, TopoError> {
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

    /// Path class, hops, verdict and reasons between two devices.
    pub fn path(&self, a: Bdf, b: Bdf) -> Result<PeerPath, TopoError> {
        let ia = *self.index.get(&a).ok_or(TopoError::NoSuchBdf(a))?;
        let ib = *self.index.get(&b).ok_or(TopoError::NoSuchBdf(b))?;
        Ok(path::compute(self, ia, ib))
    }

    /// [`Topology::path`] for every unordered pair of `devices`, the first
    /// [`MAX_PAIRS`] of them in order; [`Pairs::left_out`] counts the rest.
    pub fn pairs(&self, devices: &[&Device]) -> Pairs {
        self.pairs_where(devices, false)
    }

    /// The pairs a verdict is asked for in the GPU view: every pair of `devices` with a GPU on
    /// at least one side (every pair when none of them is a GPU), at most [`MAX_PAIRS`].
    pub fn gpu_pairs(&self, devices: &[&Device]) -> Pairs {
        let any_gpu = devices.iter().any(|d| d.class == DeviceClass::Gpu);
        self.pairs_where(devices, any_gpu)
    }

    /// Pairs (i < j) of `devices`, with a GPU on one side when `gpu_side`, computed until
    /// [`MAX_PAIRS`] and past it only counted, by arithmetic: a hostile tree can list 16384
    /// GPUs.
    fn pairs_where(&self, devices: &[&Device], gpu_side: bool) -> Pairs {
        let is_gpu = |d: &Device| d.class == DeviceClass::Gpu;
        // Positions of the GPUs: a device that is not one pairs only with them.
        let gpus: Vec<usize> = (0..devices.len()).filter(|&i| is_gpu(devices[i])).collect();
        let mut out = Pairs::default();
        for (i, a) in devices.iter().enumerate() {
            let partners: Box<dyn Iterator<Item = usize>> = if !gpu_side || is_gpu(a) {
                Box::new(i + 1..devices.len())
            } else {
                let first = gpus.partition_point(|&g| g <= i);
                Box::new(gpus[first..].iter().copied())
            };
            let asked = partners.size_hint().0;
            let room = MAX_PAIRS - out.paths.len();
            out.left_out += asked.saturating_sub(room);
            for j in partners.take(room) {
                let (Some(&ia), Some(&ib)) =
                    (self.index.get(&a.bdf), self.index.get(&devices[j].bdf))
                else {
                    continue;
                };
                out.paths.push(path::compute(self, ia, ib));
            }
        }
        out
    }

    /// The devices of `class` closest to `of`, best first (NVLink, then PIX, PXB, ...; ties by
    /// verdict), for suggesting a better pairing.
    pub fn closest(&self, of: Bdf, class: DeviceClass) -> Vec<PeerPath> {
        let Some(&io) = self.index.get(&of) else {
            return Vec::new();
        };
        let mut v: Vec<PeerPath> = self
            .devices
            .iter()
            .enumerate()
            .filter(|(i, d)| *i != io && d.class == class)
            .map(|(i, _)| path::compute(self, io, i))
            .collect();
        v.sort_by_key(|p| (p.class.rank(), p.verdict, p.b));
        v
    }

    /// The JSON-ready report over `devices` (their pairs as [`Topology::pairs`] gives them)
    /// plus every bridge.
    pub fn report<'a>(&'a self, devices: &[&'a Device]) -> Report<'a> {
        report::build(self, devices, self.pairs(devices))
    }

    /// [`Topology::report`] with the pairs of [`Topology::gpu_pairs`]: what `gdr topo --json`
    /// writes for its default view.
    pub fn gpu_report<'a>(&'a self, devices: &[&'a Device]) -> Report<'a> {
        report::build(self, devices, self.gpu_pairs(devices))
    }

    pub(crate) fn index_of(&self, bdf: Bdf) -> Option<usize> {
        self.index.get(&bdf).copied()
    }
}
