//! Sysfs trees shared by the topology tests that build theirs at run time.

#![allow(dead_code)] // each test file uses part of this

use gdr_pci::fixture::{Function, TreeBuilder};
use gdr_pci::PortType;
use std::path::{Path, PathBuf};

/// The committed fixtures: `$GDR_TOPO_FIXTURES` (set by the bundle runner, which carries
/// them), else the source tree's `crates/gdr-pci/tests/fixtures/topo`.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("GDR_TOPO_FIXTURES")
        .map(Into::into)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topo"))
}

/// A fresh directory name under cargo's scratch space for tests.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "topo-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A small machine: GPU and RDMA NIC under a switch, an NVMe drive on a root port.
/// Returns the root and the directories of (gpu, nic, nvme, downstream port of the gpu).
pub fn small_machine(name: &str) -> (PathBuf, [PathBuf; 4]) {
    let root = scratch(name);
    let mut t = TreeBuilder::create(&root).unwrap();
    let hb = t.host_bridge("pci0000:00").unwrap();
    let rp = t
        .add(
            &hb,
            Function::new("0000:00:01.0", 0x8086, 0x352a, 0x060400)
                .link(16.0, 16, 16.0, 16)
                .acs(0),
        )
        .unwrap();
    let usp = t
        .add(
            &rp,
            Function::new("0000:01:00.0", 0x1000, 0xc030, 0x060400).port(PortType::SwitchUpstream),
        )
        .unwrap();
    let dsp0 = t
        .add(
            &usp,
            Function::new("0000:02:00.0", 0x1000, 0xc030, 0x060400)
                .port(PortType::SwitchDownstream)
                .acs(0),
        )
        .unwrap();
    let dsp1 = t
        .add(
            &usp,
            Function::new("0000:02:01.0", 0x1000, 0xc030, 0x060400)
                .port(PortType::SwitchDownstream)
                .acs(0),
        )
        .unwrap();
    let gpu = t
        .add(
            &dsp0,
            Function::new("0000:03:00.0", 0x10de, 0x2330, 0x030200)
                .bar(0, 1 << 24)
                .bar(1, 1 << 34)
                .link(16.0, 16, 16.0, 16),
        )
        .unwrap();
    let nic = t
        .add(
            &dsp1,
            Function::new("0000:04:00.0", 0x15b3, 0x1021, 0x020000).bar(0, 1 << 25),
        )
        .unwrap();
    t.class_device("infiniband", "mlx5_0", &nic).unwrap();
    let rp2 = t
        .add(
            &hb,
            Function::new("0000:00:02.0", 0x8086, 0x352b, 0x060400).acs(0),
        )
        .unwrap();
    let nvme = t
        .add(
            &rp2,
            Function::new("0000:05:00.0", 0x144d, 0xa824, 0x010802).bar(0, 1 << 14),
        )
        .unwrap();
    t.class_device("nvme", "nvme0", &nvme).unwrap();
    (root, [gpu, nic, nvme, dsp0])
}
