//! The shape of the path between two devices in the PCI tree, and its class as
//! `nvidia-smi topo -m` names it ([`PathClass`]).
//!
//! The rules, from the lowest common ancestor of the two devices in the PCI tree:
//! - same device: X;
//! - different host bridges: NODE when they share a NUMA node, SYS when they do not;
//! - same host bridge, no common bridge below it: PHB;
//! - a common bridge: count the bridges on the path, a switch (upstream port plus its downstream
//!   ports) counting once: one → PIX, more → PXB.
//!
//! NVLink counts given to [`Topology::set_nvlinks`] turn the class into NV#.

use crate::device::PortType;
use crate::topology::Topology;
use serde::{Serialize, Serializer};
use std::collections::BTreeSet;
use std::fmt;

/// How the path between two devices runs, in `nvidia-smi topo -m`'s classes; printed as X, PIX,
/// PXB, PHB, NODE, SYS or NV#. Closer classes are faster for peer-to-peer DMA ([`rank`]).
///
/// [`rank`]: PathClass::rank
///
/// # Examples
///
/// ```
/// use gdr_pci::PathClass;
///
/// assert_eq!(PathClass::Pix.to_string(), "PIX");
/// assert_eq!(PathClass::NvLink(4).to_string(), "NV4");
/// let mut classes = [PathClass::Sys, PathClass::Phb, PathClass::NvLink(2), PathClass::Pix];
/// classes.sort_by_key(|c| c.rank());
/// assert_eq!(
///     classes,
///     [PathClass::NvLink(2), PathClass::Pix, PathClass::Phb, PathClass::Sys]
/// );
/// ```
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
