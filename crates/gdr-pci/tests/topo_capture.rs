//! `capture`: a captured tree reads back to the same answer as its source, holds only what was
//! read, and refuses to overwrite.

use gdr_pci::capture::{capture, CAPTURE_NOTE, KEEP_FILE};
use gdr_pci::{TopoError, Topology};
use std::path::{Path, PathBuf};

mod topo_common;
use topo_common::{fixtures_dir, scratch};

/// The report of every endpoint as JSON, minus the root it was read from.
fn answer(topo: &Topology) -> serde_json::Value {
    let mut v = serde_json::to_value(topo.report(&topo.endpoints())).unwrap();
    v.as_object_mut().unwrap().remove("sysfs_root");
    v
}

fn files_under(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let at = root.join(rel);
        let meta = std::fs::symlink_metadata(&at).unwrap();
        if meta.is_dir() {
            for e in std::fs::read_dir(&at).unwrap() {
                walk(root, &rel.join(e.unwrap().file_name()), out);
            }
        } else {
            out.push(rel.to_path_buf());
        }
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out);
    out.sort();
    out
}

#[test]
fn captures_of_every_fixture_read_back_identically() {
    for entry in std::fs::read_dir(fixtures_dir()).unwrap() {
        let src = entry.unwrap().path();
        let name = src.file_name().unwrap().to_string_lossy().into_owned();
        let dest = scratch(&name);
        let summary = capture(&src, &dest).unwrap();
        assert!(summary.files > 0 && summary.links > 0, "{name}");
        let original = Topology::read(&src).unwrap();
        let copy = Topology::read(&dest).unwrap();
        assert_eq!(answer(&original), answer(&copy), "{name}");
        assert_eq!(answer(&summary.topology), answer(&original), "{name}");
        // Every file in the capture came from the source, byte for byte, and links point the
        // same way.
        for rel in files_under(&dest) {
            if rel == Path::new(CAPTURE_NOTE) || rel.ends_with(KEEP_FILE) {
                continue;
            }
            let (a, b) = (src.join(&rel), dest.join(&rel));
            if std::fs::symlink_metadata(&b)
                .unwrap()
                .file_type()
                .is_symlink()
            {
                assert_eq!(
                    std::fs::read_link(&a).unwrap(),
                    std::fs::read_link(&b).unwrap(),
                    "{name}: {rel:?}"
                );
            } else {
                assert_eq!(
                    std::fs::read(&a).unwrap(),
                    std::fs::read(&b).unwrap(),
                    "{name}: {rel:?}"
                );
            }
        }
    }
}

#[test]
fn capture_leaves_out_what_it_does_not_read() {
    let src = scratch("extra-src");
    std::fs::create_dir_all(&src).unwrap();
    let two = fixtures_dir().join("two-socket");
    let dest = scratch("extra-dst");
    // Put a file the reader never opens next to a device's attributes.
    let copy_of = scratch("extra-copy");
    capture(&two, &copy_of).unwrap();
    let dev =
        copy_of.join("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0");
    std::fs::write(dev.join("subsystem_vendor"), "0x10de\n").unwrap();
    capture(&copy_of, &dest).unwrap();
    assert!(dest
        .join("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/vendor")
        .exists());
    assert!(!dest.join("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/subsystem_vendor").exists());
}

#[test]
fn capture_refuses_a_non_empty_destination_and_a_non_sysfs_source() {
    let dest = scratch("busy");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("keep.txt"), "mine").unwrap();
    let err = capture(&fixtures_dir().join("workstation"), &dest).unwrap_err();
    assert!(
        matches!(err, TopoError::CaptureDestinationNotEmpty(_)),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("keep.txt")).unwrap(),
        "mine"
    );
    let empty = scratch("not-sysfs");
    std::fs::create_dir_all(&empty).unwrap();
    let err = capture(&empty, &scratch("never")).unwrap_err();
    assert!(matches!(err, TopoError::NotSysfs { .. }), "{err}");
}

#[test]
fn dangling_links_stay_dangling_in_a_capture() {
    let src = scratch("dangle-src");
    capture(&fixtures_dir().join("workstation"), &src).unwrap();
    std::os::unix::fs::symlink(
        "../../devices/pci0000:00/0000:00:09.0/infiniband/mlx5_9",
        src.join("class/infiniband/mlx5_9"),
    )
    .unwrap();
    let dest = scratch("dangle-dst");
    let s = capture(&src, &dest).unwrap();
    assert!(s
        .warnings
        .iter()
        .any(|w| w.path.contains("mlx5_9") && w.message.contains("dangling")));
    let back = Topology::read(&dest).unwrap();
    assert_eq!(back.warnings(), s.warnings.as_slice());
}

/// The machine the tests run on: whatever its /sys holds, a capture must read back the same.
#[test]
fn capture_of_this_machine_reads_back_identically() {
    let Ok(live) = Topology::read("/sys") else {
        // No sysfs at all (a container without /sys): nothing to compare.
        assert!(!Path::new("/sys/bus/pci/devices").exists());
        return;
    };
    let dest = scratch("live");
    let s = capture(Path::new("/sys"), &dest).unwrap();
    let back = Topology::read(&dest).unwrap();
    assert_eq!(answer(&back), answer(&s.topology));
    assert_eq!(back.devices().len(), live.devices().len());
}

/// A live sysfs can have empty directories (class/infiniband with the RDMA core loaded but no
/// HCA, as on the H100 VM; an empty kernel/iommu_groups). Their capture holds a `.keep` each,
/// which must read back as nothing: no device, no warning.
#[test]
fn empty_directories_capture_and_read_back_without_warnings() {
    let src = scratch("empty-src");
    capture(&fixtures_dir().join("workstation"), &src).unwrap();
    // Make it look live: no marker files, and empty class directories.
    for rel in files_under(&src) {
        if rel.ends_with(KEEP_FILE) || rel == Path::new(CAPTURE_NOTE) {
            std::fs::remove_file(src.join(rel)).unwrap();
        }
    }
    for class in ["infiniband", "nvme"] {
        std::fs::remove_dir_all(src.join("class").join(class)).unwrap();
        std::fs::create_dir(src.join("class").join(class)).unwrap();
    }
    let live = Topology::read(&src).unwrap();
    assert!(live.warnings().is_empty(), "{:?}", live.warnings());
    assert!(live.find("mlx5_0").is_err());
    assert!(
        live.devices().iter().all(|d| d.names.len() <= 1),
        "names from empty classes"
    );

    let dest = scratch("empty-dst");
    let s = capture(&src, &dest).unwrap();
    for class in ["infiniband", "nvme"] {
        assert!(dest.join("class").join(class).join(KEEP_FILE).is_file());
    }
    let back = Topology::read(&dest).unwrap();
    assert!(back.warnings().is_empty(), "{:?}", back.warnings());
    assert_eq!(answer(&back), answer(&s.topology));
    assert_eq!(answer(&back), answer(&live));
}

#[test]
fn the_captured_dev_vm_still_reads() {
    // Captured on the development VM (no GPU, virtio devices on one host bridge, IOMMU off).
    let topo = Topology::read(fixtures_dir().join("dev-vm-no-gpu")).unwrap();
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    assert!(topo.gpus().is_empty());
    assert_eq!(topo.devices().len(), 6);
    let eth = topo.find("eth0").unwrap();
    assert_eq!(eth.bdf.to_string(), "0000:00:03.0");
    assert_eq!(eth.driver.as_deref(), Some("virtio-pci"));
    assert!(!topo.iommu_groups_present());
    let others = topo.endpoints();
    let p = topo.path(others[0].bdf, others[1].bdf).unwrap();
    assert_eq!(p.class.to_string(), "PHB");
}

#[test]
fn captures_zero_device_serial_numbers() {
    let src = scratch("dsn-src");
    capture(&fixtures_dir().join("iommu-acs"), &src).unwrap();
    // Give the NIC a Device Serial Number capability in front of its AER capability.
    let cfg_path =
        src.join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/config");
    let mut cfg = std::fs::read(&cfg_path).unwrap();
    let aer = u32::from_le_bytes(cfg[0x100..0x104].try_into().unwrap());
    cfg[0x1c0..0x1c4].copy_from_slice(&aer.to_le_bytes());
    cfg[0x100..0x104].copy_from_slice(&(0x0003u32 | (1 << 16) | (0x1c0 << 20)).to_le_bytes());
    let serial: [u8; 8] = rand::random::<u64>().max(1).to_le_bytes();
    cfg[0x104..0x10c].copy_from_slice(&serial);
    std::fs::write(&cfg_path, &cfg).unwrap();
    let dest = scratch("dsn-dst");
    let s = capture(&src, &dest).unwrap();
    assert_eq!(s.serials_scrubbed, 1);
    let got = std::fs::read(dest.join(cfg_path.strip_prefix(&src).unwrap())).unwrap();
    assert_eq!(&got[0x104..0x10c], &[0u8; 8]);
    assert_eq!(&got[..0x104], &cfg[..0x104]);
    assert_eq!(&got[0x10c..], &cfg[0x10c..]);
    assert_eq!(
        answer(&Topology::read(&src).unwrap()),
        answer(&Topology::read(&dest).unwrap())
    );
}
