//! Path classes between two devices, with the hops in between, as `nvidia-smi topo -m` names
//! them.
//!
//! The rules, from the lowest common ancestor of the two devices in the PCI tree:
//! - same device: X;
//! - different host bridges: NODE when they share a NUMA node, SYS when they do not;
//! - same host bridge, no common bridge below it: PHB;
//! - a common bridge: count the bridges on the path, a switch (upstream port plus its downstream
//!   ports) counting once: one → PIX, more → PXB.
//!
//! NVLink counts given to [`super::Topology::set_nvlinks`] turn the class into NV#.

use super::config::AcsState;
use super::device::{LinkState, PortType};
use super::verdict::{self, Verdict};
use super::{Bdf, Reason, Topology};
use serde::{Serialize, Serializer};
use std::collections::BTreeSet;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathClass {
    /// The same device.
    Local,
    /// Through at most one PCIe bridge or switch.
    Pix,
    /// Through several bridges/switches, not the host bridge.
    Pxb,
    /// Through a host bridge (the CPU's root complex).
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across the inter-socket link.
    Sys,
    /// A bonded set of this many NVLinks.
    NvLink(u32),
}

impl PathClass {
    /// Closeness, smaller is better (NVLink first).
    pub fn rank(self) -> u32 {
        match self {
            PathClass::Local => 0,
            PathClass::NvLink(n) => 100 - n.min(99),
            PathClass::Pix => 200,
            PathClass::Pxb => 300,
            PathClass::Phb => 400,
            PathClass::Node => 500,
            PathClass::Sys => 600,
        }
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathClass::Local => f.write_str("X"),
            PathClass::Pix => f.write_str("PIX"),
            PathClass::Pxb => f.write_str("PXB"),
            PathClass::Phb => f.write_str("PHB"),
            PathClass::Node => f.write_str("NODE"),
            PathClass::Sys => f.write_str("SYS"),
            PathClass::NvLink(n) => write!(f, "NV{n}"),
        }
    }
}

impl Serialize for PathClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

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
    pub kind: HopKind,
    pub bdf: Option<Bdf>,
    /// Device name, host bridge name, or a description of the interconnect.
    pub name: String,
    /// What it is: "GPU", "switch downstream port", "host bridge", ...
    pub role: String,
    /// The function's link registers, for PCI functions: the link above an endpoint or an
    /// upstream port, the link below a root port or a downstream port (see `link_below`).
    pub link: Option<LinkState>,
    pub link_below: bool,
    pub acs: Option<AcsState>,
    pub numa: Option<u32>,
}

/// Everything known about the way between two devices.
#[derive(Debug, Clone, Serialize)]
pub struct PeerPath {
    pub a: Bdf,
    pub b: Bdf,
    /// The class shown in the matrix (NV# when NVLink was declared).
    pub class: PathClass,
    /// The PCIe class, even where NVLink is used.
    pub pcie_class: PathClass,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
}

/// The shape of a path, for the verdict: device indices on it and where it turns.
pub(crate) struct Geometry {
    pub class: PathClass,
    /// Device indices in path order, both ends included.
    pub nodes: Vec<usize>,
    /// Host bridges the path climbs to (0, 1 or 2).
    pub host_bridges: Vec<String>,
    /// Number of distinct switches/bridges between the devices (below the host bridge).
    pub bridges: usize,
    /// NUMA nodes of the two sides when the path leaves a host bridge.
    pub numa: (Option<u32>, Option<u32>),
    /// Position in `nodes` after which the path climbs into the host bridge(s).
    pub turn: Option<usize>,
}

/// The device and its ancestors, topmost first.
fn chain(topo: &Topology, i: usize) -> Vec<usize> {
    let mut v = vec![i];
    let mut cur = i;
    // The bound stops a malformed tree (a parent loop) from spinning.
    for _ in 0..topo.devices().len() {
        let Some(p) = topo.devices()[cur].parent.and_then(|b| topo.index_of(b)) else {
            break;
        };
        if v.contains(&p) {
            break;
        }
        v.push(p);
        cur = p;
    }
    v.reverse();
    v
}

/// A switch's downstream ports count as the switch itself (their upstream port).
fn switch_of(topo: &Topology, i: usize) -> usize {
    let d = &topo.devices()[i];
    if d.port_type == PortType::SwitchDownstream {
        if let Some(p) = d.parent.and_then(|b| topo.index_of(b)) {
            if topo.devices()[p].port_type == PortType::SwitchUpstream {
                return p;
            }
        }
    }
    i
}

fn host_numa(topo: &Topology, i: usize) -> Option<u32> {
    let d = &topo.devices()[i];
    topo.host_bridge(&d.host_bridge)
        .and_then(|h| h.numa)
        .or(d.numa)
}

pub(crate) fn geometry(topo: &Topology, a: usize, b: usize) -> Geometry {
    let devs = topo.devices();
    if a == b {
        return Geometry {
            class: PathClass::Local,
            nodes: vec![a],
            host_bridges: Vec::new(),
            bridges: 0,
            numa: (devs[a].numa, devs[a].numa),
            turn: None,
        };
    }
    let ca = chain(topo, a);
    let cb = chain(topo, b);
    let (ha, hb) = (&devs[a].host_bridge, &devs[b].host_bridge);
    let numa = (host_numa(topo, a), host_numa(topo, b));
    let up: Vec<usize> = ca.iter().rev().copied().collect();
    if ha != hb {
        let mut nodes = up;
        nodes.extend(&cb);
        // Unknown NUMA on either side: nvidia-smi has nothing to tell them apart either.
        let class = match numa {
            (Some(x), Some(y)) if x != y => PathClass::Sys,
            _ => PathClass::Node,
        };
        return Geometry {
            class,
            nodes,
            host_bridges: vec![ha.clone(), hb.clone()],
            bridges: 0,
            numa,
            turn: Some(ca.len() - 1),
        };
    }
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        let mut nodes = up;
        nodes.extend(&cb);
        return Geometry {
            class: PathClass::Phb,
            nodes,
            host_bridges: vec![ha.clone()],
            bridges: 0,
            numa,
            turn: Some(ca.len() - 1),
        };
    }
    // From A up to the common ancestor, then down to B.
    let mut nodes: Vec<usize> = ca[common - 1..].iter().rev().copied().collect();
    nodes.extend(&cb[common..]);
    let between: BTreeSet<usize> = nodes
        .iter()
        .filter(|&&n| n != a && n != b)
        .map(|&n| switch_of(topo, n))
        .collect();
    let class = if between.len() <= 1 {
        PathClass::Pix
    } else {
        PathClass::Pxb
    };
    Geometry {
        class,
        nodes,
        host_bridges: Vec::new(),
        bridges: between.len(),
        numa,
        turn: None,
    }
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
        link_below: verdict::link_is_below(d.port_type),
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
