//! Unreadable, missing and odd sysfs entries: each gives a warning and a partial answer, never a
//! panic or a hang.

use gdr_pci::{AcsState, DeviceClass, PathClass, PortType, TopoError, Topology};
use rand::{Rng, RngCore};
use std::path::Path;

mod topo_common;
use topo_common::{assert_warned, has_reason, path_between, small_machine};

fn replace_with_dir(p: &Path) {
    std::fs::remove_file(p).unwrap();
    std::fs::create_dir(p).unwrap();
}

#[test]
fn the_small_machine_reads_cleanly() {
    let (root, _) = small_machine("clean");
    let topo = Topology::read(&root).unwrap();
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    let g = topo.find("gpu0").unwrap().bdf;
    let n = topo.find("mlx5_0").unwrap().bdf;
    assert_eq!(topo.path(g, n).unwrap().class, PathClass::Pix);
}

#[test]
fn missing_bus_is_an_error_not_a_panic() {
    let root = topo_common::scratch("odd-empty");
    assert!(matches!(
        Topology::read(&root),
        Err(TopoError::NotSysfs { .. })
    ));
    assert!(matches!(
        Topology::read(root.join("nope")),
        Err(TopoError::NotSysfs { .. })
    ));
}

#[test]
fn unreadable_attributes_warn_and_keep_the_device() {
    let (root, [gpu, nic, nvme, _]) = small_machine("unreadable");
    // A directory where a file should be (EISDIR), and a link loop (ELOOP): both unreadable for
    // root too, as permission denied is for other users.
    replace_with_dir(&root.join(&gpu).join("vendor"));
    let class = root.join(&nic).join("class");
    std::fs::remove_file(&class).unwrap();
    std::os::unix::fs::symlink("class", &class).unwrap();
    std::fs::remove_file(root.join(&nvme).join("config")).unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "03:00.0/vendor", "unreadable");
    assert_warned(&topo, "04:00.0/class", "unreadable");
    assert_warned(&topo, "05:00.0/config", "unreadable");
    let g = topo.device("0000:03:00.0".parse().unwrap()).unwrap();
    assert_eq!(
        (g.vendor, g.class),
        (None, DeviceClass::Other),
        "no vendor, no GPU claim"
    );
    // The NIC keeps its RDMA identity from /sys/class/infiniband even without a class code.
    assert_eq!(topo.find("mlx5_0").unwrap().class, DeviceClass::RdmaNic);
    assert_eq!(topo.find("nvme0").unwrap().acs, AcsState::Unknown);
}

#[test]
fn garbage_contents_warn() {
    let (root, [gpu, nic, _, _]) = small_machine("garbage");
    std::fs::write(root.join(&gpu).join("class"), "zzz\n").unwrap();
    std::fs::write(root.join(&gpu).join("numa_node"), "many\n").unwrap();
    std::fs::write(root.join(&nic).join("resource"), "0x1000 oops\n").unwrap();
    std::fs::write(root.join(&nic).join("current_link_speed"), "Unknown\n").unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "03:00.0/class", "zzz");
    assert_warned(&topo, "03:00.0/numa_node", "many");
    assert_warned(&topo, "04:00.0/resource", "malformed");
    let nicd = topo.find("mlx5_0").unwrap();
    assert!(nicd.bars.is_empty() && nicd.link.current_speed_gts.is_none());
}

#[test]
fn dangling_and_escaping_links_warn() {
    let (root, _) = small_machine("links");
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/gone/infiniband/mlx5_9",
        root.join("class/infiniband/mlx5_9"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:00/0000:00:07.0",
        root.join("bus/pci/devices/0000:00:07.0"),
    )
    .unwrap();
    std::os::unix::fs::symlink("../../../../../../../etc", root.join("class/nvme/nvme9")).unwrap();
    std::fs::create_dir_all(root.join("bus/pci/devices/not-a-device")).unwrap();
    // Points at a PCI device that bus/pci/devices does not list.
    std::fs::create_dir_all(root.join("devices/pci0000:00/0000:00:09.0/net/eth7")).unwrap();
    std::fs::create_dir_all(root.join("class/net")).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:09.0/net/eth7",
        root.join("class/net/eth7"),
    )
    .unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "class/infiniband/mlx5_9", "dangling");
    assert_warned(&topo, "bus/pci/devices/0000:00:07.0", "dangling");
    assert_warned(&topo, "class/nvme/nvme9", "leaves the sysfs root");
    assert_warned(&topo, "bus/pci/devices/not-a-device", "not a PCI address");
    assert_warned(&topo, "class/net/eth7", "does not list");
    assert_eq!(
        topo.devices().len(),
        8,
        "the dangling and misnamed entries are left out"
    );
    assert!(topo.find("gpu0").is_ok());
}

#[test]
fn a_missing_bridge_leaves_a_partial_tree() {
    let (root, _) = small_machine("partial");
    // The GPU's downstream port disappears from the bus listing (hidden, or removed).
    std::fs::remove_file(root.join("bus/pci/devices/0000:02:00.0")).unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "0000:03:00.0", "not listed");
    let gpu = topo.find("gpu0").unwrap();
    assert_eq!(gpu.parent, Some("0000:01:00.0".parse().unwrap()));
    let p = topo
        .path(gpu.bdf, topo.find("mlx5_0").unwrap().bdf)
        .unwrap();
    assert_eq!(p.class, PathClass::Pix);
}

#[test]
fn broken_capability_lists_are_reported() {
    let (root, [_, _, _, dsp]) = small_machine("caps");
    let cfg_path = root.join(&dsp).join("config");
    let mut cfg = std::fs::read(&cfg_path).unwrap();
    // AER at 0x100 now points to itself.
    cfg[0x102..0x104].copy_from_slice(&((1u16 << 0) | (0x100 << 4)).to_le_bytes());
    std::fs::write(&cfg_path, &cfg).unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "02:00.0/config", "loops");
    let p = path_between(&topo, "gpu0", "mlx5_0");
    assert!(has_reason(&p, "ACS state of 0000:02:00.0 unreadable"));
}

#[test]
fn short_config_means_acs_unknown_and_one_warning() {
    let (root, [_, _, _, dsp]) = small_machine("short");
    let cfg_path = root.join(&dsp).join("config");
    let cfg = std::fs::read(&cfg_path).unwrap();
    std::fs::write(&cfg_path, &cfg[..64]).unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_eq!(topo.warnings().len(), 1, "{:?}", topo.warnings());
    assert!(topo.warnings()[0].message.contains("needs root"));
    let d = topo.device("0000:02:00.0".parse().unwrap()).unwrap();
    assert_eq!(d.acs, AcsState::Unknown);
    // The tree shape still says what the port is.
    assert!(d.port_type_inferred);
    assert_eq!(d.port_type, PortType::SwitchDownstream);
    let p = path_between(&topo, "gpu0", "mlx5_0");
    assert!(has_reason(&p, "ACS state unknown on 1 port"));
}

#[test]
fn unknown_classes_and_iommu_types_are_tolerated() {
    let (root, [gpu, nic, _, _]) = small_machine("unknown");
    std::fs::write(root.join(&nic).join("class"), "0xff0000\n").unwrap();
    std::fs::create_dir_all(root.join("kernel/iommu_groups/7")).unwrap();
    std::fs::create_dir_all(root.join("kernel/iommu_groups/8/type")).unwrap();
    std::os::unix::fs::symlink(
        "../../../../../kernel/iommu_groups/7",
        root.join(&gpu).join("iommu_group"),
    )
    .unwrap();
    let topo = Topology::read(&root).unwrap();
    assert_warned(&topo, "iommu_groups/8/type", "unreadable");
    assert_eq!(topo.warnings().len(), 1, "{:?}", topo.warnings());
    // Still an RDMA NIC: sysfs lists an RDMA device on it.
    assert_eq!(topo.find("mlx5_0").unwrap().class, DeviceClass::RdmaNic);
    let g = topo.find("gpu0").unwrap();
    assert_eq!(
        g.iommu_group.as_ref().map(|i| (i.id, i.kind.clone())),
        Some((7, None))
    );
    let p = topo.path(g.bdf, topo.find("nvme0").unwrap().bdf).unwrap();
    assert!(has_reason(&p, "IOMMU group 7 of unknown type"));
}

#[test]
fn random_bytes_in_every_attribute_never_panic() {
    let mut rng = rand::thread_rng();
    for round in 0..20 {
        let (root, dirs) = small_machine(&format!("random{round}"));
        let mut clobbered = 0;
        for dir in &dirs {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = entry.unwrap().path();
                if p.is_file() && !p.is_symlink() && rng.gen_bool(0.5) {
                    let mut junk = vec![0u8; rng.gen_range(0..300)];
                    rng.fill_bytes(&mut junk);
                    std::fs::write(&p, junk).unwrap();
                    clobbered += 1;
                }
            }
        }
        let topo = Topology::read(&root).unwrap();
        if clobbered > 0 {
            let _ = topo.pairs(&topo.endpoints());
            let _ = gdr_pci::render::matrix(&topo, &topo.endpoints());
        }
        assert_eq!(topo.devices().len(), 8);
    }
}
