//! The machine-readable form of a topology, for `gdr topo --json` and for other tools.
//!
//! Shape: `{"devices":[{"bdf","class","numa","numa_affinity":[..],"link":{..},..}],
//! "pairs":[{"a","b","path","verdict","reasons":[..]}],..}`; `reasons` are sentences, `findings`
//! the same with severity.

use super::device::Device;
use super::path::PathClass;
use super::topology::Pairs;
use super::verdict::{Reason, Verdict};
use super::{Bdf, HostBridge, Switch, Topology};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Report<'a> {
    pub sysfs_root: String,
    pub iommu_groups_present: bool,
    pub host_bridges: &'a [HostBridge],
    pub switches: Vec<Switch>,
    /// The endpoints asked for (GPUs and their peers, or all).
    pub devices: Vec<&'a Device>,
    /// Every bridge, so that a reader can rebuild the tree from `parent`.
    pub bridges: Vec<&'a Device>,
    /// The pairs of `devices` asked for: every unordered pair, or (the GPU view) those with a
    /// GPU on one side; at most [`MAX_PAIRS`](crate::limits::MAX_PAIRS).
    pub pairs: Vec<PairReport>,
    /// Pairs asked for but not judged, past the limit (a warning says so too).
    pub pairs_left_out: usize,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PairReport {
    pub a: Bdf,
    pub b: Bdf,
    pub a_name: String,
    pub b_name: String,
    pub path: PathClass,
    pub pcie_path: PathClass,
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    pub findings: Vec<Reason>,
}

pub(crate) fn build<'a>(topo: &'a Topology, devices: &[&'a Device], pairs: Pairs) -> Report<'a> {
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
    Report {
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
