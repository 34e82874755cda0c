//! The path between two devices as a [`PeerPath`]: its class, the hops from one to the other,
//! and the verdict with its reasons. The class comes from [`geometry`](crate::geometry), the
//! verdict from [`verdict`](crate::verdict); this module puts them together and gives
//! [`Topology`] its path queries ([`Topology::path`], [`Topology::pairs`], ...).

use crate::bdf::Bdf;
use crate::config::AcsState;
use crate::device::{link_is_below, DeviceClass, LinkState, PciDevice};
use crate::geometry::{geometry, Geometry, PathClass};
use crate::limits::MAX_PAIRS;
use crate::topology::{TopoError, Topology};
use crate::verdict::{self, Reason, Verdict};
use serde::Serialize;

/// What a [`Hop`] of a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HopKind {
    /// A PCI function: one of the two devices, or a bridge between them.
    Device,
    /// A host bridge (root complex) the path climbs to.
    HostBridge,
    /// The CPU fabric between two host bridges: within a socket or across sockets.
    CpuInterconnect,
}

/// One step of a path, from device A to device B.
#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    /// A PCI function, a host bridge, or the CPU fabric between host bridges.
    pub kind: HopKind,
    /// The function's address; `None` for host bridges and the fabric.
    pub bdf: Option<Bdf>,
    /// Device name, host bridge name, or a description of the interconnect.
    pub name: String,
    /// What it is: "GPU", "switch downstream port", "host bridge", ...
    pub role: String,
    /// The function's link registers, for PCI functions: the link above an endpoint or an
    /// upstream port, the link below a root port or a downstream port (see `link_below`).
    pub link: Option<LinkState>,
    /// Whether `link` is the link below the function (root and downstream ports) rather than
    /// the one above it.
    pub link_below: bool,
    /// The function's ACS state; `None` for host bridges and the fabric.
    pub acs: Option<AcsState>,
    /// NUMA node of the function or host bridge, where sysfs gives one.
    pub numa: Option<u32>,
}

/// Everything known about the way between two devices.
#[derive(Debug, Clone, Serialize)]
pub struct PeerPath {
    /// The device the path starts at.
    pub a: Bdf,
    /// The device the path ends at.
    pub b: Bdf,
    /// The class shown in the matrix (NV# when NVLink was declared).
    pub class: PathClass,
    /// The PCIe class, even where NVLink is used.
    pub pcie_class: PathClass,
    /// The functions, host bridges and fabric crossed, from `a` to `b`, both included.
    pub hops: Vec<Hop>,
    /// How well the two can DMA to each other: the worst severity among `reasons`.
    pub verdict: Verdict,
    /// The findings behind the verdict, each with advice.
    pub reasons: Vec<Reason>,
}

fn device_hop(topo: &Topology, i: usize, endpoint: bool) -> Hop {
    let d = &topo.devices()[i];
    let role = if endpoint {
        d.class.to_string()
    } else {
        d.port_type.describe().to_string()
    };
    Hop {
        kind: HopKind::Device,
        bdf: Some(d.bdf),
        name: if endpoint || !d.names.is_empty() {
            d.name()
        } else {
            String::new()
        },
        role,
        link: d.link.is_known().then_some(d.link),
        link_below: link_is_below(d.port_type),
        acs: Some(d.acs.clone()),
        numa: d.numa,
    }
}

fn hops(topo: &Topology, g: &Geometry, a: usize, b: usize) -> Vec<Hop> {
    let mut out = Vec::new();
    for (pos, &n) in g.nodes.iter().enumerate() {
        out.push(device_hop(topo, n, n == a || n == b));
        if Some(pos) == g.turn {
            let hb = |name: &str| {
                let numa = topo.host_bridge(name).and_then(|h| h.numa);
                Hop {
                    kind: HopKind::HostBridge,
                    bdf: None,
                    name: name.to_string(),
                    role: "host bridge (root complex)".into(),
                    link: None,
                    link_below: false,
                    acs: None,
                    numa,
                }
            };
            out.push(hb(&g.host_bridges[0]));
            if let Some(other) = g.host_bridges.get(1) {
                let (role, name) = if g.class == PathClass::Sys {
                    (
                        "inter-socket link",
                        "SMP interconnect (e.g. UPI, Infinity Fabric)",
                    )
                } else {
                    ("CPU fabric", "fabric between host bridges of one NUMA node")
                };
                out.push(Hop {
                    kind: HopKind::CpuInterconnect,
                    bdf: None,
                    name: name.into(),
                    role: role.into(),
                    link: None,
                    link_below: false,
                    acs: None,
                    numa: None,
                });
                out.push(hb(other));
            }
        }
    }
    out
}

pub(crate) fn compute(topo: &Topology, a: usize, b: usize) -> PeerPath {
    let g = geometry(topo, a, b);
    let (da, db) = (&topo.devices()[a], &topo.devices()[b]);
    let nvlinks = (a != b).then(|| topo.nvlinks(da.bdf, db.bdf)).flatten();
    let reasons = verdict::assess(topo, &g, a, b, nvlinks);
    PeerPath {
        a: da.bdf,
        b: db.bdf,
        class: nvlinks.map_or(g.class, PathClass::NvLink),
        pcie_class: g.class,
        hops: hops(topo, &g, a, b),
        verdict: Verdict::from_reasons(&reasons),
        reasons,
    }
}

/// Device pairs with their paths, at most [`MAX_PAIRS`]; `left_out` more were asked for.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// The judged pairs, in the order they were asked for.
    pub paths: Vec<PeerPath>,
    /// Pairs asked for past [`MAX_PAIRS`], counted but not judged.
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

impl Topology {
    /// Path class, hops, verdict and reasons between two devices.
    pub fn path(&self, a: Bdf, b: Bdf) -> Result<PeerPath, TopoError> {
        let ia = self.index_of(a).ok_or(TopoError::NoSuchBdf(a))?;
        let ib = self.index_of(b).ok_or(TopoError::NoSuchBdf(b))?;
        Ok(compute(self, ia, ib))
    }

    /// [`Topology::path`] for every unordered pair of `devices`, the first
    /// [`MAX_PAIRS`] of them in order; [`Pairs::left_out`] counts the rest.
    pub fn pairs(&self, devices: &[&PciDevice]) -> Pairs {
        self.pairs_where(devices, false)
    }

    /// The pairs a verdict is asked for in the GPU view: every pair of `devices` with a GPU on
    /// at least one side (every pair when none of them is a GPU), at most [`MAX_PAIRS`].
    pub fn gpu_pairs(&self, devices: &[&PciDevice]) -> Pairs {
        let any_gpu = devices.iter().any(|d| d.class == DeviceClass::Gpu);
        self.pairs_where(devices, any_gpu)
    }

    /// Pairs (i < j) of `devices`, with a GPU on one side when `gpu_side`, computed until
    /// [`MAX_PAIRS`] and past it only counted, by arithmetic: a hostile tree can list 16384
    /// GPUs.
    fn pairs_where(&self, devices: &[&PciDevice], gpu_side: bool) -> Pairs {
        let is_gpu = |d: &PciDevice| d.class == DeviceClass::Gpu;
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
                let (Some(ia), Some(ib)) = (self.index_of(a.bdf), self.index_of(devices[j].bdf))
                else {
                    continue;
                };
                out.paths.push(compute(self, ia, ib));
            }
        }
        out
    }

    /// The devices of `class` closest to `of`, best first (NVLink, then PIX, PXB, ...; ties by
    /// verdict), for suggesting a better pairing.
    pub fn closest(&self, of: Bdf, class: DeviceClass) -> Vec<PeerPath> {
        let Some(io) = self.index_of(of) else {
            return Vec::new();
        };
        let mut v: Vec<PeerPath> = self
            .devices()
            .iter()
            .enumerate()
            .filter(|(i, d)| *i != io && d.class == class)
            .map(|(i, _)| compute(self, io, i))
            .collect();
        v.sort_by_key(|p| (p.class.rank(), p.verdict, p.b));
        v
    }
}
