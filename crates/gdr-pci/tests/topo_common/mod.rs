//! Shared by the topology tests: where the committed fixtures are, scratch directories, the
//! small machine that many tests start from, and the questions they ask of an answer.

#![allow(dead_code)] // each test file uses part of this

use gdr_pci::fixture::{FixtureFunction, TreeBuilder};
use gdr_pci::{PeerPath, PortType, Topology};
use std::ops::Deref;
use std::path::{Path, PathBuf};

/// The committed fixtures: `$GDR_TOPO_FIXTURES` (set by the bundle runner, which carries
/// them), else the source tree's `crates/gdr-pci/tests/fixtures/topo`.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("GDR_TOPO_FIXTURES")
        .map(Into::into)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topo"))
}

/// A fresh empty directory under the system's temporary directory, removed when dropped; it
/// stands for its path.
pub struct Scratch(tempfile::TempDir);

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A [`Scratch`] directory whose name starts with `topo-{name}-`.
pub fn scratch(name: &str) -> Scratch {
    Scratch(
        tempfile::Builder::new()
            .prefix(&format!("topo-{name}-"))
            .tempdir()
            .unwrap(),
    )
}

/// Whether some warning's path contains `path_part` and its message `msg_part`.
pub fn has_warning(topo: &Topology, path_part: &str, msg_part: &str) -> bool {
    topo.warnings()
        .iter()
        .any(|w| w.path.contains(path_part) && w.message.contains(msg_part))
}

/// Fails the test, listing every warning, unless one is as [`has_warning`] asks.
#[track_caller]
pub fn assert_warned(topo: &Topology, path_part: &str, msg_part: &str) {
    assert!(
        has_warning(topo, path_part, msg_part),
        "no warning on `{path_part}` saying `{msg_part}`: {:?}",
        topo.warnings()
    );
}

/// The path between two devices named as `Topology::find` takes them.
pub fn path_between(topo: &Topology, a: &str, b: &str) -> PeerPath {
    topo.path(topo.find(a).unwrap().bdf, topo.find(b).unwrap().bdf)
        .unwrap()
}

/// Whether one of the reasons of `p` contains `text`.
pub fn has_reason(p: &PeerPath, text: &str) -> bool {
    p.reasons.iter().any(|r| r.what.contains(text))
}

/// A small machine: GPU and RDMA NIC under a switch, an NVMe drive on a root port.
/// Returns the root and the directories of (gpu, nic, nvme, downstream port of the gpu).
pub fn small_machine(name: &str) -> (Scratch, [PathBuf; 4]) {
    let root = scratch(name);
    let mut t = TreeBuilder::create(&root).unwrap();
    let hb = t.host_bridge("pci0000:00").unwrap();
    let rp = t
        .add(
            &hb,
            FixtureFunction::new("0000:00:01.0", 0x8086, 0x352a, 0x060400)
                .link(16.0, 16, 16.0, 16)
                .acs(0),
        )
        .unwrap();
    let usp = t
        .add(
            &rp,
            FixtureFunction::new("0000:01:00.0", 0x1000, 0xc030, 0x060400)
                .port(PortType::SwitchUpstream),
        )
        .unwrap();
    let dsp0 = t
        .add(
            &usp,
            FixtureFunction::new("0000:02:00.0", 0x1000, 0xc030, 0x060400)
                .port(PortType::SwitchDownstream)
                .acs(0),
        )
        .unwrap();
    let dsp1 = t
        .add(
            &usp,
            FixtureFunction::new("0000:02:01.0", 0x1000, 0xc030, 0x060400)
                .port(PortType::SwitchDownstream)
                .acs(0),
        )
        .unwrap();
    let gpu = t
        .add(
            &dsp0,
            FixtureFunction::new("0000:03:00.0", 0x10de, 0x2330, 0x030200)
                .bar(0, 1 << 24)
                .bar(1, 1 << 34)
                .link(16.0, 16, 16.0, 16),
        )
        .unwrap();
    let nic = t
        .add(
            &dsp1,
            FixtureFunction::new("0000:04:00.0", 0x15b3, 0x1021, 0x020000).bar(0, 1 << 25),
        )
        .unwrap();
    t.class_device("infiniband", "mlx5_0", &nic).unwrap();
    let rp2 = t
        .add(
            &hb,
            FixtureFunction::new("0000:00:02.0", 0x8086, 0x352b, 0x060400).acs(0),
        )
        .unwrap();
    let nvme = t
        .add(
            &rp2,
            FixtureFunction::new("0000:05:00.0", 0x144d, 0xa824, 0x010802).bar(0, 1 << 14),
        )
        .unwrap();
    t.class_device("nvme", "nvme0", &nvme).unwrap();
    (root, [gpu, nic, nvme, dsp0])
}
