//! The committed sysfs fixtures under `tests/fixtures/topo/`: how they are built, that the
//! committed trees still match their builders, and what `topo` must say about each.
//!
//! Adding a machine: capture it (`gdr topo --capture tests/fixtures/topo/<name>`), save
//! `nvidia-smi topo -m > tests/fixtures/topo/<name>/nvidia-smi-topo-m.txt` on the same machine,
//! and `every_fixture_matches_its_nvidia_smi_matrix` compares the two. Verdicts that matter get
//! a test of their own below, like the hand-built servers.
//!
//! Regenerate the hand-built trees after changing a builder:
//! `GDR_REGEN_TOPO_FIXTURES=1 cargo test -p gdr-pci --test topo_fixtures`.

use gdr_pci::fixture::{FixtureFunction, TreeBuilder};
use gdr_pci::{Bdf, DeviceClass, PathClass, PortType, Topology, Verdict};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

mod topo_common;
use topo_common::{fixtures_dir, has_reason, path_between, scratch};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> Topology {
    Topology::read(fixtures_dir().join(name)).expect("fixture reads")
}

// ---------------------------------------------------------------------------------------------
// Builders

const H100: (u16, u16, u32) = (0x10de, 0x2330, 0x030200);
const H100_PCIE: (u16, u16, u32) = (0x10de, 0x2331, 0x030200);
const RTX4090: (u16, u16, u32) = (0x10de, 0x2684, 0x030000);
const CX7: (u16, u16, u32) = (0x15b3, 0x1021, 0x020700);
const CX6DX: (u16, u16, u32) = (0x15b3, 0x101d, 0x020000);
const PEX_USP: (u16, u16, u32) = (0x1000, 0xc030, 0x060400);
const PEX_DSP: (u16, u16, u32) = (0x1000, 0xc030, 0x060400);
const ROOT_PORT: (u16, u16, u32) = (0x8086, 0x352a, 0x060400);
const HOST_FN: (u16, u16, u32) = (0x8086, 0x09a2, 0x060000);
const NVME: (u16, u16, u32) = (0x144d, 0xa824, 0x010802);
const X710: (u16, u16, u32) = (0x8086, 0x1572, 0x020000);
const ASPEED: (u16, u16, u32) = (0x1a03, 0x2000, 0x030000);
const XDMA: (u16, u16, u32) = (0x10ee, 0x903f, 0x058000);

fn f(bdf: &str, id: (u16, u16, u32)) -> FixtureFunction {
    FixtureFunction::new(bdf, id.0, id.1, id.2)
}

fn gpu(bdf: &str, id: (u16, u16, u32), bar1: u64) -> FixtureFunction {
    f(bdf, id)
        .bar(0, 16 * MIB)
        .bar(1, bar1)
        .bar(3, 32 * MIB)
        .driver("nvidia")
}

fn nic(bdf: &str, id: (u16, u16, u32)) -> FixtureFunction {
    f(bdf, id).bar(0, 32 * MIB).driver("mlx5_core")
}

/// A PCIe switch below `parent`: upstream port `usp`, one downstream port per device, each
/// device added below its port; returns the device directories.
fn switch_with(
    t: &mut TreeBuilder,
    parent: &Path,
    usp: &str,
    dsps: &[&str],
    devices: Vec<FixtureFunction>,
    numa: Option<u32>,
    acs: u16,
) -> io::Result<Vec<PathBuf>> {
    let numa_of = |x: FixtureFunction| match numa {
        Some(n) => FixtureFunction { numa: Some(n), ..x },
        None => x,
    };
    let up = t.add(
        parent,
        numa_of(
            f(usp, PEX_USP)
                .port(PortType::SwitchUpstream)
                .link(32.0, 16, 32.0, 16),
        ),
    )?;
    let mut out = Vec::new();
    for (dsp, dev) in dsps.iter().zip(devices) {
        // Both ends of a link report the same trained speed and width.
        let (cs, cw) = dev.link.map_or((32.0, 16), |l| (l.0, l.1));
        let down = t.add(
            &up,
            numa_of(
                f(dsp, PEX_DSP)
                    .port(PortType::SwitchDownstream)
                    .link(cs, cw, 32.0, 16)
                    .acs(acs),
            ),
        )?;
        out.push(t.add(&down, dev)?);
    }
    Ok(out)
}

/// (a) Two sockets, four H100s and four ConnectX-7s, each GPU paired with a NIC under a PCIe
/// switch. Socket 0: the two switches hang off different host bridges (GPU0-GPU1 = NODE).
/// Socket 1: both switches hang off root ports of one host bridge (GPU2-GPU3 = PHB). IOMMU in
/// pass-through, ACS off. GPU3 idles at Gen1; NIC3 trained at x8 of x16.
fn build_two_socket(root: &Path) -> io::Result<()> {
    let mut t = TreeBuilder::create(root)?;
    let cpus = ["0-31,64-95", "32-63,96-127"];
    for (node, list) in cpus.iter().enumerate() {
        t.numa_node(node as u32, list)?;
    }
    let group = std::cell::Cell::new(10);
    let next_group = || {
        group.set(group.get() + 1);
        group.get()
    };

    let hb = t.host_bridge("pci0000:00")?;
    t.add(
        &hb,
        f("0000:00:00.0", HOST_FN)
            .numa(0, cpus[0])
            .port(PortType::Unknown),
    )?;
    let rp = t.add(
        &hb,
        f("0000:00:1c.0", ROOT_PORT)
            .numa(0, cpus[0])
            .link(2.5, 1, 8.0, 1),
    )?;
    t.add(
        &rp,
        f("0000:03:00.0", ASPEED)
            .numa(0, cpus[0])
            .link(2.5, 1, 2.5, 1)
            .bar(0, 16 * MIB),
    )?;
    let rp = t.add(
        &hb,
        f("0000:00:1c.4", ROOT_PORT)
            .numa(0, cpus[0])
            .link(8.0, 8, 8.0, 8),
    )?;
    let eth = t.add(
        &rp,
        f("0000:04:00.0", X710)
            .numa(0, cpus[0])
            .link(8.0, 8, 8.0, 8)
            .bar(0, 8 * MIB)
            .driver("i40e"),
    )?;
    t.class_device("net", "eno1", &eth)?;

    // Socket 0, host bridge 0x15: switch with GPU0 + NIC0, plus an NVMe drive on its own root port.
    let pair = |t: &mut TreeBuilder,
                hb: &Path,
                rp: &str,
                usp: &str,
                dsps: [&str; 2],
                gpu_bdf: &str,
                nic_bdf: &str,
                node: u32,
                ib: &str,
                gpu_link: (f64, u32),
                nic_link: (f64, u32)|
     -> io::Result<()> {
        let cpu = cpus[node as usize];
        let port = t.add(
            hb,
            f(rp, ROOT_PORT)
                .numa(node, cpu)
                .link(32.0, 16, 32.0, 16)
                .acs(0)
                .iommu(next_group()),
        )?;
        let g = gpu(gpu_bdf, H100, 128 * GIB)
            .numa(node, cpu)
            .link(gpu_link.0, gpu_link.1, 32.0, 16)
            .iommu(next_group());
        let n = nic(nic_bdf, CX7)
            .numa(node, cpu)
            .link(nic_link.0, nic_link.1, 32.0, 16)
            .iommu(next_group());
        let dirs = switch_with(t, &port, usp, &dsps, vec![g, n], Some(node), 0)?;
        t.class_device("infiniband", ib, &dirs[1])?;
        let bdf: Bdf = nic_bdf.parse().unwrap();
        t.class_device("net", &format!("ibp{}s0", bdf.bus), &dirs[1])?;
        Ok(())
    };

    let hb15 = t.host_bridge("pci0000:15")?;
    pair(
        &mut t,
        &hb15,
        "0000:15:01.0",
        "0000:16:00.0",
        ["0000:17:00.0", "0000:17:01.0"],
        "0000:18:00.0",
        "0000:19:00.0",
        0,
        "mlx5_0",
        (32.0, 16),
        (32.0, 16),
    )?;
    let rp = t.add(
        &hb15,
        f("0000:15:03.0", ROOT_PORT)
            .numa(0, cpus[0])
            .link(16.0, 4, 32.0, 4)
            .acs(0),
    )?;
    let nvme = t.add(
        &rp,
        f("0000:1a:00.0", NVME)
            .numa(0, cpus[0])
            .link(16.0, 4, 16.0, 4)
            .bar(0, 32 * 1024)
            .driver("nvme")
            .iommu(next_group()),
    )?;
    t.class_device("nvme", "nvme0", &nvme)?;

    let hb36 = t.host_bridge("pci0000:36")?;
    pair(
        &mut t,
        &hb36,
        "0000:36:01.0",
        "0000:37:00.0",
        ["0000:38:00.0", "0000:38:01.0"],
        "0000:39:00.0",
        "0000:3a:00.0",
        0,
        "mlx5_1",
        (32.0, 16),
        (32.0, 16),
    )?;

    let hb97 = t.host_bridge("pci0000:97")?;
    pair(
        &mut t,
        &hb97,
        "0000:97:01.0",
        "0000:98:00.0",
        ["0000:99:00.0", "0000:99:01.0"],
        "0000:9a:00.0",
        "0000:9b:00.0",
        1,
        "mlx5_2",
        (32.0, 16),
        (32.0, 16),
    )?;
    pair(
        &mut t,
        &hb97,
        "0000:97:02.0",
        "0000:9c:00.0",
        ["0000:9d:00.0", "0000:9d:01.0"],
        "0000:9e:00.0",
        "0000:9f:00.0",
        1,
        "mlx5_3",
        (2.5, 16),
        (32.0, 8),
    )?;

    for g in 11..=group.get() {
        t.iommu_group_type(g, "identity")?;
    }
    t.finish().map(drop)
}

/// (b) A workstation: one GPU with a 256 MiB BAR1 and a dual-port ConnectX-6 Dx, each on a CPU
/// root port of the single host bridge; an NVMe drive; no NUMA information; IOMMU off.
fn build_workstation(root: &Path) -> io::Result<()> {
    let mut t = TreeBuilder::create(root)?;
    let cpus = "0-23";
    // numa_node is -1 on every device (no SRAT), yet the kernel has node 0 with all CPUs.
    t.numa_node(0, cpus)?;
    let hb = t.host_bridge("pci0000:00")?;
    t.add(
        &hb,
        f("0000:00:00.0", HOST_FN)
            .cpus(cpus)
            .port(PortType::Unknown),
    )?;
    let rp = t.add(
        &hb,
        f("0000:00:01.0", ROOT_PORT)
            .cpus(cpus)
            .link(2.5, 16, 32.0, 16)
            .acs(0),
    )?;
    t.add(
        &rp,
        gpu("0000:01:00.0", RTX4090, 256 * MIB)
            .cpus(cpus)
            .link(2.5, 16, 16.0, 16),
    )?;
    let rp = t.add(
        &hb,
        f("0000:00:01.1", ROOT_PORT)
            .cpus(cpus)
            .link(16.0, 16, 32.0, 16)
            .acs(0),
    )?;
    for (func, ib, eth) in [
        ("0", "mlx5_0", "enp2s0f0np0"),
        ("1", "mlx5_1", "enp2s0f1np1"),
    ] {
        let d = t.add(
            &rp,
            nic(&format!("0000:02:00.{func}"), CX6DX)
                .cpus(cpus)
                .link(16.0, 16, 16.0, 16),
        )?;
        t.class_device("infiniband", ib, &d)?;
        t.class_device("net", eth, &d)?;
    }
    let rp = t.add(
        &hb,
        f("0000:00:1d.0", ROOT_PORT)
            .cpus(cpus)
            .link(16.0, 4, 16.0, 4)
            .acs(0),
    )?;
    let d = t.add(
        &rp,
        f("0000:03:00.0", NVME)
            .cpus(cpus)
            .link(16.0, 4, 16.0, 4)
            .bar(0, 16 * 1024)
            .driver("nvme"),
    )?;
    t.class_device("nvme", "nvme0", &d)?;
    t.finish().map(drop)
}

/// (c) One socket, IOMMU translating (DMA-FQ) and ACS redirect on every switch downstream port:
/// GPU, NIC and a Xilinx FPGA (bound to vfio-pci) under one switch, NVMe on a root port.
fn build_iommu_acs(root: &Path) -> io::Result<()> {
    let mut t = TreeBuilder::create(root)?;
    let cpus = "0-15";
    let redirect = 0x001d; // source validation, request + completion redirect, upstream forwarding
    let hb = t.host_bridge("pci0000:00")?;
    t.add(
        &hb,
        f("0000:00:00.0", HOST_FN)
            .numa(0, cpus)
            .port(PortType::Unknown)
            .iommu(1),
    )?;
    let rp = t.add(
        &hb,
        f("0000:00:01.0", ROOT_PORT)
            .numa(0, cpus)
            .link(32.0, 16, 32.0, 16)
            .acs(redirect)
            .iommu(2),
    )?;
    let g = gpu("0000:03:00.0", H100_PCIE, 128 * GIB)
        .numa(0, cpus)
        .link(32.0, 16, 32.0, 16)
        .iommu(30);
    let n = nic("0000:04:00.0", CX7)
        .numa(0, cpus)
        .link(32.0, 16, 32.0, 16)
        .iommu(31);
    let x = f("0000:05:00.0", XDMA)
        .numa(0, cpus)
        .link(8.0, 4, 8.0, 4)
        .bar(0, MIB)
        .bar(1, 64 * 1024)
        .driver("vfio-pci")
        .iommu(32);
    let dirs = switch_with(
        &mut t,
        &rp,
        "0000:01:00.0",
        &["0000:02:00.0", "0000:02:01.0", "0000:02:02.0"],
        vec![g, n, x],
        Some(0),
        redirect,
    )?;
    t.class_device("infiniband", "mlx5_0", &dirs[1])?;
    t.class_device("net", "ibp4s0", &dirs[1])?;
    let rp = t.add(
        &hb,
        f("0000:00:1d.0", ROOT_PORT)
            .numa(0, cpus)
            .link(16.0, 4, 16.0, 4)
            .acs(redirect)
            .iommu(3),
    )?;
    let d = t.add(
        &rp,
        f("0000:06:00.0", NVME)
            .numa(0, cpus)
            .link(16.0, 4, 16.0, 4)
            .bar(0, 16 * 1024)
            .driver("nvme")
            .iommu(33),
    )?;
    t.class_device("nvme", "nvme0", &d)?;
    for g in [1, 2, 3, 30, 31, 33] {
        t.iommu_group_type(g, "DMA-FQ")?;
    }
    t.iommu_group_type(32, "unmanaged")?;
    t.finish().map(drop)
}

/// (d) Two levels of switches, read as a non-root user would (64 bytes of config, so the port
/// types come from the tree's shape and ACS is unknown): two GPUs under an inner switch, the
/// NIC and an NVMe drive on the outer one, as on DGX A100-style trays. GPU-GPU = PIX,
/// GPU-NIC = PXB.
fn build_nested_switch(root: &Path) -> io::Result<()> {
    let mut t = TreeBuilder::create(root)?;
    let cpus = "0-63";
    let short = |x: FixtureFunction| x.numa(0, cpus).config_len(64);
    // Gen4 links of the width given, as a non-root user reads them.
    let gen4 = |x: FixtureFunction, width: u32| short(x.link(16.0, width, 16.0, width));
    let hb = t.host_bridge("pci0000:00")?;
    let rp = t.add(&hb, gen4(f("0000:00:01.0", ROOT_PORT), 16))?;
    let outer = t.add(&rp, gen4(f("0000:01:00.0", PEX_USP), 16))?;
    let d0 = t.add(&outer, gen4(f("0000:02:00.0", PEX_DSP), 16))?;
    let d1 = t.add(&outer, gen4(f("0000:02:01.0", PEX_DSP), 16))?;
    let d2 = t.add(&outer, gen4(f("0000:02:02.0", PEX_DSP), 4))?;
    let inner = t.add(&d0, gen4(f("0000:03:00.0", PEX_USP), 16))?;
    for (i, bdf) in ["0000:05:00.0", "0000:06:00.0"].iter().enumerate() {
        let dsp = format!("0000:04:0{i}.0");
        let port = t.add(&inner, gen4(f(&dsp, PEX_DSP), 16))?;
        t.add(&port, gen4(gpu(bdf, H100_PCIE, 64 * GIB), 16))?;
    }
    let n = t.add(&d1, gen4(nic("0000:07:00.0", CX6DX), 16))?;
    t.class_device("infiniband", "mlx5_0", &n)?;
    let d = t.add(&d2, gen4(f("0000:08:00.0", NVME).bar(0, 16 * 1024), 4))?;
    t.class_device("nvme", "nvme0", &d)?;
    t.finish().map(drop)
}

type Build = fn(&Path) -> io::Result<()>;
const BUILT: &[(&str, Build)] = &[
    ("two-socket", build_two_socket),
    ("workstation", build_workstation),
    ("iommu-acs", build_iommu_acs),
    ("nested-switch", build_nested_switch),
];

// ---------------------------------------------------------------------------------------------
// Tree comparison

#[derive(Debug, PartialEq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        let at = root.join(rel);
        let meta = std::fs::symlink_metadata(&at).unwrap();
        if meta.file_type().is_symlink() {
            out.insert(
                rel.to_path_buf(),
                Entry::Link(std::fs::read_link(&at).unwrap()),
            );
        } else if meta.is_dir() {
            out.insert(rel.to_path_buf(), Entry::Dir);
            for e in std::fs::read_dir(&at).unwrap() {
                walk(root, &rel.join(e.unwrap().file_name()), out);
            }
        } else {
            out.insert(rel.to_path_buf(), Entry::File(std::fs::read(&at).unwrap()));
        }
    }
    let mut out = BTreeMap::new();
    for top in ["bus", "class", "devices", "kernel"] {
        if root.join(top).exists() {
            walk(root, Path::new(top), &mut out);
        }
    }
    out
}

#[test]
fn committed_fixtures_match_their_builders() {
    let regen = std::env::var_os("GDR_REGEN_TOPO_FIXTURES").is_some();
    for (name, build) in BUILT {
        let committed = fixtures_dir().join(name);
        if regen {
            for top in ["bus", "class", "devices", "kernel"] {
                let _ = std::fs::remove_dir_all(committed.join(top));
            }
            std::fs::create_dir_all(&committed).unwrap();
            let tmp = scratch(name);
            build(&tmp).unwrap();
            for top in ["bus", "class", "devices", "kernel"] {
                if tmp.join(top).exists() {
                    std::fs::rename(tmp.join(top), committed.join(top)).unwrap();
                }
            }
            continue;
        }
        let fresh = scratch(name);
        build(&fresh).unwrap();
        let (want, got) = (snapshot(&fresh), snapshot(&committed));
        let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let differ: Vec<_> = want
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && differ.is_empty(),
            "{name}: committed tree is stale (missing {missing:?}, extra {extra:?}, differing \
             {differ:?}); regenerate with GDR_REGEN_TOPO_FIXTURES=1"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// nvidia-smi comparison

/// `nvidia-smi topo -m` output: the matrix cells by (row label, column label), the CPU and NUMA
/// affinity, NUMA affinity and GPU NUMA ID per GPU row, and the NIC legend (NIC0 → mlx5_0).
struct SmiMatrix {
    cells: Vec<(String, String, String)>,
    affinity: HashMap<String, (String, String, String)>,
    nic_names: HashMap<String, String>,
}

fn parse_nvidia_smi(text: &str) -> SmiMatrix {
    // Terminal output carries bold escapes; files usually do not.
    let clean: String = {
        let mut s = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                s.push(c);
            }
        }
        s
    };
    let mut lines = clean.lines();
    let header: Vec<String> = lines
        .next()
        .expect("header line")
        .split('\t')
        .map(|s| s.trim().to_string())
        .collect();
    let labels: Vec<String> = header
        .iter()
        .skip(1)
        .take_while(|h| h.starts_with("GPU") || h.starts_with("NIC"))
        .filter(|h| !h.contains(' '))
        .cloned()
        .collect();
    let mut m = SmiMatrix {
        cells: Vec::new(),
        affinity: HashMap::new(),
        nic_names: HashMap::new(),
    };
    for line in lines {
        let fields: Vec<&str> = line.split('\t').map(str::trim).collect();
        if let Some((label, name)) = line.trim().split_once(": ") {
            if label.starts_with("NIC") && !label.contains(' ') {
                m.nic_names.insert(label.into(), name.trim().into());
                continue;
            }
        }
        let Some(row) = fields.first().filter(|r| labels.iter().any(|l| l == *r)) else {
            continue;
        };
        for (col, cell) in labels.iter().zip(&fields[1..]) {
            m.cells
                .push((row.to_string(), col.clone(), cell.to_string()));
        }
        if row.starts_with("GPU") {
            let rest = &fields[1 + labels.len()..];
            let cpu = rest.first().copied().unwrap_or("").to_string();
            let numa = rest.get(1).copied().unwrap_or("").to_string();
            // nvidia-smi puts two tabs before GPU NUMA ID.
            let gpu_numa = rest
                .iter()
                .skip(2)
                .find(|f| !f.is_empty())
                .copied()
                .unwrap_or("")
                .to_string();
            m.affinity.insert(row.to_string(), (cpu, numa, gpu_numa));
        }
    }
    m
}

fn smi_label_to_bdf(topo: &Topology, smi: &SmiMatrix, label: &str) -> Bdf {
    let query = smi.nic_names.get(label).map_or(label, String::as_str);
    topo.find(query)
        .unwrap_or_else(|e| panic!("{label}: {e}"))
        .bdf
}

#[test]
fn every_fixture_matches_its_nvidia_smi_matrix() {
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(dir.join("nvidia-smi-topo-m.txt")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut topo = Topology::read(&dir).unwrap();
        let smi = parse_nvidia_smi(&text);
        assert!(!smi.cells.is_empty(), "{name}: no matrix parsed");
        // NVLink counts come from NVML, not sysfs: take them from the expected matrix.
        let nv: Vec<(Bdf, Bdf, u32)> = smi
            .cells
            .iter()
            .filter_map(|(r, c, v)| {
                let n = v.strip_prefix("NV")?.parse().ok()?;
                Some((
                    smi_label_to_bdf(&topo, &smi, r),
                    smi_label_to_bdf(&topo, &smi, c),
                    n,
                ))
            })
            .collect();
        topo.set_nvlinks(&nv).unwrap();
        let mut wrong = Vec::new();
        for (r, c, want) in &smi.cells {
            let (a, b) = (
                smi_label_to_bdf(&topo, &smi, r),
                smi_label_to_bdf(&topo, &smi, c),
            );
            let got = topo.path(a, b).unwrap().class.to_string();
            if &got != want {
                wrong.push(format!("{r}-{c}: nvidia-smi {want}, gdr {got}"));
            }
        }
        for (label, (cpu, numa, gpu_numa)) in &smi.affinity {
            let d = topo.device(smi_label_to_bdf(&topo, &smi, label)).unwrap();
            let got_cpu = d.cpulist.clone().unwrap_or_else(|| "N/A".into());
            let got_numa = d.numa_affinity_text();
            let got_gpu_numa = d.gpu_numa_id.map_or("N/A".into(), |n| n.to_string());
            if (&got_cpu, &got_numa, &got_gpu_numa) != (cpu, numa, gpu_numa) {
                wrong.push(format!(
                    "{label} affinity: nvidia-smi {cpu}/{numa}/{gpu_numa}, \
                     gdr {got_cpu}/{got_numa}/{got_gpu_numa}"
                ));
            }
            // The printed matrix carries the same three columns at the end of the GPU's row.
            let text = gdr_pci::render::matrix(&topo, &topo.gpu_view());
            let row: Vec<&str> = text
                .lines()
                .find(|l| l.split(' ').next() == Some(label.as_str()))
                .map(|l| l.split_whitespace().collect())
                .unwrap_or_default();
            if row.len() < 3 || row[row.len() - 3..] != [cpu.as_str(), numa, gpu_numa] {
                wrong.push(format!("{label} row printed as {row:?}"));
            }
        }
        assert!(wrong.is_empty(), "{name}:\n{}", wrong.join("\n"));
        checked += 1;
    }
    assert!(
        checked >= BUILT.len(),
        "only {checked} fixtures carry nvidia-smi output"
    );
}

// ---------------------------------------------------------------------------------------------
// Per-fixture expectations

fn verdict(topo: &Topology, a: &str, b: &str) -> (String, Verdict, Vec<String>) {
    let p = topo
        .path(topo.find(a).unwrap().bdf, topo.find(b).unwrap().bdf)
        .unwrap();
    let reasons = p
        .reasons
        .iter()
        .filter(|r| r.severity > gdr_pci::Severity::Info)
        .map(|r| r.what.clone())
        .collect();
    (p.class.to_string(), p.verdict, reasons)
}

#[test]
fn two_socket_server() {
    let topo = fixture("two-socket");
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    let gpus: Vec<String> = topo.gpus().iter().map(|d| d.bdf.to_string()).collect();
    assert_eq!(
        gpus,
        [
            "0000:18:00.0",
            "0000:39:00.0",
            "0000:9a:00.0",
            "0000:9e:00.0"
        ]
    );
    let view: Vec<&str> = topo.gpu_view().iter().map(|d| d.label.as_str()).collect();
    assert_eq!(
        view,
        ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1", "NIC2", "NIC3", "NET0", "NVME0"]
    );
    assert_eq!(topo.find("eno1").unwrap().class, DeviceClass::Nic);
    let switches = topo.switches();
    assert_eq!(switches.len(), 4);
    assert!(
        switches.iter().all(|s| s.downstream.len() == 2),
        "{switches:?}"
    );
    assert_eq!(switches[2].host_bridge, "pci0000:97");
    assert_eq!(
        topo.find("0000:03:00.0").unwrap().class,
        DeviceClass::Other,
        "BMC VGA is no GPU"
    );

    let (c, v, r) = verdict(&topo, "gpu0", "mlx5_0");
    assert_eq!((c.as_str(), v), ("PIX", Verdict::Good), "{r:?}");
    let (c, v, r) = verdict(&topo, "gpu0", "gpu1");
    assert_eq!((c.as_str(), v), ("NODE", Verdict::WorksSlower), "{r:?}");
    let (c, v, _) = verdict(&topo, "gpu0", "gpu2");
    assert_eq!((c.as_str(), v), ("SYS", Verdict::PoorOrUnsupported));
    let (c, v, r) = verdict(&topo, "gpu2", "gpu3");
    assert_eq!((c.as_str(), v), ("PHB", Verdict::WorksSlower));
    assert!(r[0].contains("pci0000:97"), "{r:?}");
    let (c, v, r) = verdict(&topo, "gpu0", "nvme0");
    assert_eq!((c.as_str(), v), ("PHB", Verdict::WorksSlower), "{r:?}");
    // NIC3 trained at x8: the one pair under a switch that is not good.
    let (c, v, r) = verdict(&topo, "gpu3", "mlx5_3");
    assert_eq!((c.as_str(), v), ("PIX", Verdict::WorksSlower));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].contains("x8 of x16"), "{r:?}");
    // GPU3 idles at Gen1: a note, not a downgrade.
    let p = path_between(&topo, "gpu3", "gpu3");
    assert_eq!(p.class, PathClass::Local);
    let p = path_between(&topo, "gpu2", "gpu3");
    assert!(has_reason(&p, "2.5 GT/s (Gen1) of 32 GT/s (Gen5)"));

    // PIX hops: GPU, downstream port, upstream port, downstream port, NIC.
    let p = topo
        .path(
            "0000:18:00.0".parse().unwrap(),
            "0000:19:00.0".parse().unwrap(),
        )
        .unwrap();
    let roles: Vec<&str> = p.hops.iter().map(|h| h.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "GPU",
            "switch downstream port",
            "switch upstream port",
            "switch downstream port",
            "RDMA NIC"
        ]
    );
    // SYS hops climb to both host bridges and cross the socket link.
    let p = path_between(&topo, "gpu0", "gpu2");
    let names: Vec<&str> = p.hops.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names[0], "gpu0");
    assert!(
        names.contains(&"pci0000:15") && names.contains(&"pci0000:97"),
        "{names:?}"
    );
    assert_eq!(p.hops.len(), 4 + 3 + 4, "{names:?}");
}

#[test]
fn nvlink_counts_override_the_pcie_class() {
    let mut topo = fixture("two-socket");
    let (g0, g2) = (
        topo.find("gpu0").unwrap().bdf,
        topo.find("gpu2").unwrap().bdf,
    );
    topo.set_nvlinks(&[(g2, g0, 18)]).unwrap();
    let p = topo.path(g0, g2).unwrap();
    assert_eq!(
        (p.class, p.pcie_class, p.verdict),
        (PathClass::NvLink(18), PathClass::Sys, Verdict::Good)
    );
    assert_eq!(p.class.to_string(), "NV18");
    topo.set_nvlinks(&[(g0, g2, 0)]).unwrap();
    assert_eq!(topo.path(g0, g2).unwrap().class, PathClass::Sys);
    assert!(topo.set_nvlinks(&[(g0, g0, 2)]).is_err());
    assert!(topo
        .set_nvlinks(&[(g0, "0000:ee:00.0".parse().unwrap(), 2)])
        .is_err());
}

/// Captured on the first GPU machine: one H100 80GB HBM3 in a Firecracker VM (driver
/// 580.159.04), all functions on one host bridge, virtio devices, no IOMMU groups, numa_node -1
/// everywhere, BAR0 given a 64-bit slot pair by the hypervisor.
#[test]
fn h100_firecracker_vm() {
    let mut topo = fixture("h100");
    // The capture holds `.keep` files in its empty directories (class/infiniband among them):
    // they must not show up as warnings.
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    assert!(!topo.iommu_groups_present());
    let gpus: Vec<String> = topo.gpus().iter().map(|d| d.bdf.to_string()).collect();
    assert_eq!(gpus, ["0000:00:06.0"]);
    let gpu = topo.find("gpu0").unwrap().clone();
    assert_eq!((gpu.vendor, gpu.device), (Some(0x10de), Some(0x2330)));
    assert_eq!(gpu.driver.as_deref(), Some("nvidia"));
    assert_eq!(
        (gpu.link.current_speed_gts, gpu.link.current_width),
        (Some(32.0), Some(16))
    );
    // numa_node is -1; nvidia-smi still prints NUMA affinity 0 (derived from the CPUs).
    assert_eq!(gpu.numa, None);
    assert_eq!(gpu.cpulist.as_deref(), Some("0-15"));
    assert_eq!(gpu.numa_affinity, [0]);
    assert_eq!(gpu.gpu_numa_id, None);
    // BAR1 sits in slot 2 here; the 128 GiB window, not "unknown".
    assert_eq!(gpu.bar1_size(), Some(128 * GIB));
    let eth = topo.find("eth0").unwrap().clone();
    assert_eq!(
        (eth.class, eth.bdf.to_string().as_str()),
        (DeviceClass::Nic, "0000:00:03.0")
    );
    assert_eq!(topo.find("NET0").unwrap().bdf, eth.bdf);

    let (c, v, r) = verdict(&topo, "gpu0", "eth0");
    assert_eq!((c.as_str(), v), ("PHB", Verdict::WorksSlower));
    assert_eq!(
        r,
        ["the path goes up through host bridge pci0000:00 (the CPU root complex)"]
    );
    let p = topo.path(gpu.bdf, eth.bdf).unwrap();
    let notes: Vec<String> = p.reasons.iter().map(|r| r.what.clone()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n == "gpu0 [0000:00:06.0] BAR1 is 128 GiB"),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.contains("unknown")), "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains("no IOMMU groups")),
        "{notes:?}"
    );
    // Every pair is PHB: one root complex, no bridges.
    for p in topo.pairs(&topo.endpoints()).paths {
        assert_eq!((p.class, p.verdict), (PathClass::Phb, Verdict::WorksSlower));
    }

    let text = gdr_pci::render::matrix(&topo, &topo.gpu_view());
    let gpu_row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("GPU0 "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(gpu_row, ["GPU0", "X", "PHB", "0-15", "0", "N/A"]);
    assert!(text.contains("BAR1 128 GiB"), "{text}");
    // A GPU NUMA ID from NVML (Grace machines) lands in the last column.
    topo.set_gpu_numa_id(gpu.bdf, Some(4)).unwrap();
    let text = gdr_pci::render::matrix(&topo, &topo.gpu_view());
    let gpu_row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("GPU0 "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(gpu_row[3..], ["0-15", "0", "4"], "{text}");
    assert!(matches!(
        topo.set_gpu_numa_id(eth.bdf, Some(1)),
        Err(gdr_pci::TopoError::NotAGpu(_))
    ));
    assert!(matches!(
        topo.set_gpu_numa_id("0000:ee:00.0".parse().unwrap(), Some(1)),
        Err(gdr_pci::TopoError::NoSuchBdf(_))
    ));
}

#[test]
fn workstation() {
    let topo = fixture("workstation");
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    assert!(!topo.iommu_groups_present());
    let (c, v, r) = verdict(&topo, "gpu0", "mlx5_0");
    assert_eq!((c.as_str(), v), ("PHB", Verdict::WorksSlower));
    assert!(
        r.iter().any(|r| r.contains("BAR1 is only 256 MiB")),
        "{r:?}"
    );
    let (c, v, _) = verdict(&topo, "mlx5_0", "mlx5_1");
    assert_eq!((c.as_str(), v), ("PIX", Verdict::Good));
    // Short forms and interface names reach the same device.
    assert_eq!(
        topo.find("02:00.1").unwrap().bdf,
        topo.find("enp2s0f1np1").unwrap().bdf
    );
    assert_eq!(topo.find("NIC1").unwrap().name(), "mlx5_1");
    assert!(topo.find("gpu7").is_err());
}

#[test]
fn iommu_and_acs_redirect() {
    let topo = fixture("iommu-acs");
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    let (c, v, r) = verdict(&topo, "gpu0", "mlx5_0");
    assert_eq!((c.as_str(), v), ("PIX", Verdict::PoorOrUnsupported));
    assert!(
        r.iter()
            .any(|r| r.contains("IOMMU translation is on") && r.contains("DMA-FQ")),
        "{r:?}"
    );
    assert!(
        r.iter()
            .any(|r| r.contains("ACS redirect is on at 0000:02:00.0")),
        "{r:?}"
    );
    assert!(
        r.iter()
            .any(|r| r.contains("ACS redirect is on at 0000:02:01.0")),
        "{r:?}"
    );
    let fpga = topo.find("ACC0").unwrap();
    assert_eq!(
        (fpga.class, fpga.driver.as_deref()),
        (DeviceClass::Accelerator, Some("vfio-pci"))
    );
    let (_, _, r) = verdict(&topo, "gpu0", "ACC0");
    assert!(r.iter().any(|r| r.contains("user-space driver")), "{r:?}");
    // Through the root complex anyway: ACS at the root port is only a note there.
    let (c, _, r) = verdict(&topo, "gpu0", "nvme0");
    assert_eq!(c, "PHB");
    assert!(!r.iter().any(|r| r.contains("ACS")), "{r:?}");
    let acs = topo
        .find("0000:02:00.0")
        .unwrap()
        .acs
        .acs()
        .copied()
        .unwrap();
    assert!(acs.request_redirect && acs.completion_redirect && acs.upstream_forwarding);
}

#[test]
fn nested_switches_read_without_root() {
    let topo = fixture("nested-switch");
    let w = topo.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].message.contains("8 bridge(s)"), "{w:?}");
    let (c, v, _) = verdict(&topo, "gpu0", "gpu1");
    assert_eq!((c.as_str(), v), ("PIX", Verdict::Good));
    let (c, v, _) = verdict(&topo, "gpu0", "mlx5_0");
    assert_eq!((c.as_str(), v), ("PXB", Verdict::Good));
    let (c, _, _) = verdict(&topo, "mlx5_0", "nvme0");
    assert_eq!(c, "PIX");
    let inner = topo.find("0000:03:00.0").unwrap();
    assert_eq!(
        (inner.port_type, inner.port_type_inferred),
        (PortType::SwitchUpstream, true)
    );
    assert_eq!(topo.switches().len(), 2);
    let p = path_between(&topo, "gpu0", "mlx5_0");
    assert!(has_reason(&p, "ACS state unknown on 5 port(s)"));
}

#[test]
fn explain_text_lists_hops_and_actions_on_every_fixture() {
    for (name, a, b, must) in [
        (
            "two-socket",
            "gpu0",
            "mlx5_0",
            vec!["path: PIX", "switch upstream port", "verdict: good"],
        ),
        (
            "two-socket",
            "gpu0",
            "mlx5_2",
            vec![
                "path: SYS",
                "inter-socket link",
                "better pairings",
                "gpu0 <-> mlx5_0: PIX, good",
            ],
        ),
        (
            "workstation",
            "gpu0",
            "mlx5_0",
            vec!["path: PHB", "root port", "Resizable BAR"],
        ),
        (
            "iommu-acs",
            "03:00.0",
            "mlx5_0",
            vec![
                "path: PIX",
                "ACS RR+ CR+ UF+",
                "iommu=pt",
                "setpci -s 0000:02:00.0",
            ],
        ),
        (
            "nested-switch",
            "gpu1",
            "nvme0",
            vec![
                "path: PXB",
                "crosses 2 PCIe switches",
                "ACS unknown",
                "run as root",
            ],
        ),
        (
            "dev-vm-no-gpu",
            "eth0",
            "0000:00:02.0",
            vec![
                "path: PHB",
                "pci0000:00",
                "verdict: works-slower",
                "IOMMU is off",
            ],
        ),
    ] {
        let topo = fixture(name);
        let p = topo
            .path(topo.find(a).unwrap().bdf, topo.find(b).unwrap().bdf)
            .unwrap();
        let text = gdr_pci::render::explain(&topo, &p);
        for m in must {
            assert!(text.contains(m), "{name} {a} {b}: `{m}` missing in\n{text}");
        }
    }
}
