//! The machine-readable form of a topology, for `gdr topo --json` and for other tools.
//!
//! Shape: `{"devices":[{"bdf","class","numa","numa_affinity":[..],"link":{..},..}],
//! "pairs":[{"a","b","path","verdict","reasons":[..]}],..}`; `reasons` are sentences, `findings`
//! the same with severity.

use crate::bdf::Bdf;
use crate::device::PciDevice;
use crate::geometry::PathClass;
use crate::path::Pairs;
use crate::topology::{HostBridge, Switch, Topology};
use crate::verdict::{Reason, Verdict};
use serde::Serialize;

/// A topology as `gdr topo --json` writes it: the devices asked for, every bridge, the host
/// bridges and switches, and the verdicts of the pairs. Borrowed from the [`Topology`] it was
/// built from ([`Topology::report`], [`Topology::gpu_report`]).
#[derive(Debug, Clone, Serialize)]
pub struct TopoReport<'a> {
    /// The sysfs root read (`/sys`, or the capture's directory), as text.
    pub sysfs_root: String,
    /// Whether the kernel has IOMMU groups at all (an IOMMU is on, in some mode).
    pub iommu_groups_present: bool,
    /// Every host bridge (root complex), with its NUMA node.
    pub host_bridges: &'a [HostBridge],
    /// Every PCIe switch: its upstream port and downstream ports.
    pub switches: Vec<Switch>,
    /// The endpoints asked for (GPUs and their peers, or all).
    pub devices: Vec<&'a PciDevice>,
    /// Every bridge, so that a reader can rebuild the tree from `parent`.
    pub bridges: Vec<&'a PciDevice>,
    /// The pairs of `devices` asked for: every unordered pair, or (the GPU view) those with a
    /// GPU on one side; at most [`MAX_PAIRS`](crate::limits::MAX_PAIRS).
    pub pairs: Vec<PairReport>,
    /// Pairs asked for but not judged, past the limit (a warning says so too).
    pub pairs_left_out: usize,
    /// What could not be read or made no sense (the answer is partial there), and a note when
    /// pairs were left out.
    pub warnings: Vec<String>,
}

/// One pair of a [`TopoReport`]: the path class and the verdict with its reasons.
#[derive(Debug, Clone, Serialize)]
pub struct PairReport {
    /// The first device's address.
    pub a: Bdf,
    /// The second device's address.
    pub b: Bdf,
    /// The first device's name (`gpu0`, `mlx5_0`) or address.
    pub a_name: String,
    /// The second device's name or address.
    pub b_name: String,
    /// The class shown in the matrix (NV# where NVLink was declared).
    pub path: PathClass,
    /// The PCIe class, even where NVLink is used.
    pub pcie_path: PathClass,
    /// How well the two can DMA to each other.
    pub verdict: Verdict,
    /// The findings as sentences, with their advice.
    pub reasons: Vec<String>,
    /// The same findings with their severity, for tools.
    pub findings: Vec<Reason>,
}

pub(crate) fn build<'a>(
    topo: &'a Topology,
    devices: &[&'a PciDevice],
    pairs: Pairs,
) -> TopoReport<'a> {
    let name = |b: Bdf| topo.device(b).map(|d| d.name()).unwrap_or_default();
    let left_out = pairs.left_out;
    let note = pairs.left_out_note();
    let pairs = pairs
        .into_iter()
        .map(|p| PairReport {
            a: p.a,
            b: p.b,
            a_name: name(p.a),
            b_name: name(p.b),
            path: p.class,
            pcie_path: p.pcie_class,
            verdict: p.verdict,
            reasons: p.reasons.iter().map(|r| r.to_string()).collect(),
            findings: p.reasons,
        })
        .collect();
    TopoReport {
        sysfs_root: topo.root().display().to_string(),
        iommu_groups_present: topo.iommu_groups_present(),
        host_bridges: topo.host_bridges(),
        switches: topo.switches(),
        devices: devices.to_vec(),
        bridges: topo.devices().iter().filter(|d| d.is_bridge()).collect(),
        pairs,
        pairs_left_out: left_out,
        warnings: topo
            .warnings()
            .iter()
            .map(|w| w.to_string())
            .chain(note)
            .collect(),
    }
}

impl Topology {
    /// The JSON-ready report over `devices` (their pairs as [`Topology::pairs`] gives them)
    /// plus every bridge.
    pub fn report<'a>(&'a self, devices: &[&'a PciDevice]) -> TopoReport<'a> {
        build(self, devices, self.pairs(devices))
    }

    /// [`Topology::report`] with the pairs of [`Topology::gpu_pairs`]: what `gdr topo --json`
    /// writes for its default view.
    pub fn gpu_report<'a>(&'a self, devices: &[&'a PciDevice]) -> TopoReport<'a> {
        build(self, devices, self.gpu_pairs(devices))
    }
}
