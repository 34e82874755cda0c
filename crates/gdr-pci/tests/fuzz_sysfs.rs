//! Fuzz target of the sysfs reader, as a property test: trees of a few devices whose every
//! attribute is random text or bytes (config space included), with random links (loops, links
//! out of the tree, dangling ones, links to each other), are read without a panic, in bounded
//! time, and what comes back is consistent: every device listed once, parents among the
//! devices, pairs and JSON for every view. Config space parsers get random bytes directly.
//! Bounded (a fixed number of cases, a few seconds) so that they run in every `cargo test`.

use gdr_pci::config::{find_acs, pcie_port_type, scrub_serial_number};
use gdr_pci::{render, Topology};
use proptest::prelude::*;
use std::collections::HashSet;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Attribute text: mostly near what sysfs writes, sometimes anything.
fn text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "0x[0-9a-f]{0,8}\n?".prop_map(String::into_bytes),
        "-?[0-9]{0,4}\n?".prop_map(String::into_bytes),
        "[0-9,\\-]{0,12}\n?".prop_map(String::into_bytes),
        "(0x[0-9a-f]{1,16} ){0,3}\n?".prop_map(String::into_bytes),
        "[0-9.]{0,5} GT/s( PCIe)?\n?".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..80),
    ]
}

/// One entry of a device directory: an attribute with content, a link somewhere, or nothing.
#[derive(Debug, Clone)]
enum Entry {
    File(Vec<u8>),
    Link(String),
    Dir,
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => text().prop_map(Entry::File),
        1 => prop_oneof![
            Just("../../../kernel/iommu_groups/3".to_string()),
            Just("/etc/passwd".to_string()),
            Just("../../../../../../..".to_string()),
            Just(".".to_string()),
            Just("loop".to_string()),
            Just("../0000:00:01.0".to_string()),
            "[a-z./]{1,12}",
        ]
        .prop_map(Entry::Link),
        1 => Just(Entry::Dir),
    ]
}

const ATTRS: [&str; 14] = [
    "vendor",
    "device",
    "class",
    "numa_node",
    "local_cpulist",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "resource",
    "config",
    "iommu_group",
    "driver",
    "loop",
];

/// A device: its attributes (each maybe absent), whether it sits below the previous device,
/// and more config space bytes.
type Dev = (Vec<Option<Entry>>, bool, Vec<u8>);

fn device() -> impl Strategy<Value = Dev> {
    (
        proptest::collection::vec(proptest::option::of(entry()), ATTRS.len()),
        any::<bool>(),
        proptest::collection::vec(any::<u8>(), 0..600),
    )
}

fn build(root: &Path, devices: &[Dev], extra_links: &[String]) {
    let bus = root.join("bus/pci/devices");
    std::fs::create_dir_all(&bus).unwrap();
    std::fs::create_dir_all(root.join("kernel/iommu_groups/3")).unwrap();
    let mut parent = root.join("devices/pci0000:00");
    let mut rel_parent = "devices/pci0000:00".to_string();
    for (i, (attrs, nested, cfg)) in devices.iter().enumerate() {
        let name = format!("0000:00:{:02x}.0", i + 1);
        let (dir, rel) = if *nested && i > 0 {
            (parent.join(&name), format!("{rel_parent}/{name}"))
        } else {
            (
                root.join("devices/pci0000:00").join(&name),
                format!("devices/pci0000:00/{name}"),
            )
        };
        std::fs::create_dir_all(&dir).unwrap();
        for (a, e) in ATTRS.iter().zip(attrs) {
            let at = dir.join(a);
            match e {
                Some(Entry::File(b)) if *a == "config" => {
                    let mut c = b.clone();
                    c.extend_from_slice(cfg);
                    std::fs::write(at, c).unwrap()
                }
                Some(Entry::File(b)) => std::fs::write(at, b).unwrap(),
                Some(Entry::Link(t)) => symlink(t, at).unwrap(),
                Some(Entry::Dir) => std::fs::create_dir(at).unwrap(),
                None => {}
            }
        }
        symlink(format!("../../../{rel}"), bus.join(&name)).unwrap();
        parent = dir;
        rel_parent = rel;
    }
    for (i, t) in extra_links.iter().enumerate() {
        let _ = symlink(t, bus.join(format!("0000:01:00.{}", i % 8)));
        let _ = std::fs::create_dir_all(root.join("class/net"));
        let _ = symlink(t, root.join(format!("class/net/eth{i}")));
    }
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn random_trees_read_consistently_and_quickly(
        devices in proptest::collection::vec(device(), 1..6),
        links in proptest::collection::vec("[a-z0-9./:]{0,24}", 0..3),
    ) {
        let tmp = tempfile::Builder::new().prefix("fuzz-sysfs-").tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir()).unwrap();
        build(tmp.path(), &devices, &links);
        let start = Instant::now();
        let topo = Topology::read(tmp.path()).unwrap();
        let bdfs: HashSet<_> = topo.devices().iter().map(|d| d.bdf).collect();
        prop_assert_eq!(bdfs.len(), topo.devices().len());
        for d in topo.devices() {
            if let Some(p) = d.parent {
                prop_assert!(bdfs.contains(&p), "{} has parent {} outside the tree", d.bdf, p);
            }
        }
        for view in [topo.gpu_view(), topo.endpoints()] {
            let n = view.len();
            let report = topo.report(&view);
            prop_assert_eq!(report.pairs.len() + report.pairs_left_out, n * n.saturating_sub(1) / 2);
            serde_json::to_string(&report).unwrap();
            let _ = render::matrix(&topo, &view);
            let _ = render::verdicts(&topo, &view);
        }
        prop_assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn config_space_parsers_take_any_bytes(mut cfg in proptest::collection::vec(any::<u8>(), 0..4200)) {
        let _ = pcie_port_type(&cfg);
        let _ = find_acs(&cfg);
        let len = cfg.len();
        scrub_serial_number(&mut cfg);
        prop_assert_eq!(cfg.len(), len);
    }
}
