//! PCI devices as sysfs shows them, through gdr-pci: the address type ([`Bdf`]), the sysfs
//! reader ([`Sysfs`], a fake tree in tests) and what it says about a function ([`PciInfo`]).
//! What this module adds is VFIO's side: "why can't I open the device" gets its answer here,
//! before any VFIO call is made, as a [`DmaError`] that says what to do.

use crate::error::{DmaError, Result};
pub use gdr_pci::{Bdf, PciInfo, Sysfs};

/// Checks everything sysfs can tell before opening `addr` through VFIO: it exists, the IOMMU
/// gave it a group, it is bound to vfio-pci, and so is every other member of its group.
/// Returns what sysfs says about it and its group.
pub fn check_vfio_ready(sysfs: &Sysfs, addr: &Bdf) -> Result<(PciInfo, u32)> {
    let info = sysfs.device(*addr)?;
    let group = info.iommu_group.ok_or_else(|| DmaError::NoIommu {
        addr: addr.to_string(),
    })?;
    if info.driver.as_deref() != Some("vfio-pci") {
        return Err(DmaError::NotBound {
            addr: addr.to_string(),
            current: match &info.driver {
                Some(d) => format!("bound to {d}"),
                None => "bound to no driver".to_string(),
            },
            hint: bind_hint(addr, info.driver.as_deref()),
        });
    }
    // An unreadable group is left to VFIO, which says whether the group is viable.
    let members = sysfs.iommu_group_members(group).unwrap_or_default();
    let stray: Vec<String> = members
        .iter()
        .filter(|(_, d)| {
            d.as_deref()
                .is_some_and(|d| d != "vfio-pci" && d != "pcieport")
        })
        .map(|(a, d)| format!("{a} is bound to {}", d.as_deref().unwrap_or("")))
        .collect();
    if !stray.is_empty() {
        return Err(DmaError::GroupNotViable {
            group,
            members: stray.join(", "),
        });
    }
    Ok((info, group))
}

/// The shell commands that bind `addr` to vfio-pci, given its current driver.
pub fn bind_hint(addr: &Bdf, driver: Option<&str>) -> String {
    let mut steps = vec!["modprobe vfio-pci".to_string()];
    if driver.is_some() {
        steps.push(format!(
            "echo {addr} > /sys/bus/pci/devices/{addr}/driver/unbind"
        ));
    }
    steps.push(format!(
        "echo vfio-pci > /sys/bus/pci/devices/{addr}/driver_override"
    ));
    steps.push(format!("echo {addr} > /sys/bus/pci/drivers_probe"));
    steps.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdr_pci::fixture::{FixtureFunction, TreeBuilder};

    fn bdf(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_parse_into_dma_errors() {
        let e: DmaError = "0000:00:20.0".parse::<Bdf>().unwrap_err().into();
        assert!(matches!(e, DmaError::BadAddress(_)));
        assert_eq!(
            e.to_string(),
            "bad PCI address: `0000:00:20.0` is not a PCI address: the device is not a hex \
             number up to 1f (expected DDDD:BB:DD.F or BB:DD.F, hexadecimal)"
        );
    }

    #[test]
    fn readiness_checks_name_the_missing_piece() {
        let tmp = tempfile::tempdir().unwrap();
        let mut t = TreeBuilder::create(tmp.path()).unwrap();
        let hb = t.host_bridge("pci0000:00").unwrap();
        let f =
            |a: &str| FixtureFunction::new(a, 0x10de, 0x0001, 0x058000).subsystem(0x10de, 0x0002);
        for func in [
            f("0000:01:00.0").driver("vfio-pci").iommu(5),
            f("0000:02:00.0").driver("xdma").iommu(6),
            f("0000:03:00.0"),
            f("0000:04:00.0").driver("vfio-pci").iommu(7),
            f("0000:04:00.1").driver("snd_hda_intel").iommu(7),
        ] {
            t.add(&hb, func).unwrap();
        }
        let s = Sysfs::new(tmp.path());

        let (info, g) = check_vfio_ready(&s, &bdf("01:00.0")).unwrap();
        assert_eq!(g, 5);
        assert_eq!(
            (info.vendor, info.device, info.subsystem_device),
            (0x10de, 1, 2)
        );
        assert_eq!(info.class, 0x058000);

        match check_vfio_ready(&s, &bdf("02:00.0")) {
            Err(DmaError::NotBound { current, hint, .. }) => {
                assert_eq!(current, "bound to xdma");
                assert!(hint.contains(
                    "echo 0000:02:00.0 > /sys/bus/pci/devices/0000:02:00.0/driver/unbind"
                ));
                assert!(hint
                    .contains("echo vfio-pci > /sys/bus/pci/devices/0000:02:00.0/driver_override"));
                assert!(hint.contains("echo 0000:02:00.0 > /sys/bus/pci/drivers_probe"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_vfio_ready(&s, &bdf("03:00.0")),
            Err(DmaError::NoIommu { .. })
        ));
        match check_vfio_ready(&s, &bdf("04:00.0")) {
            Err(DmaError::GroupNotViable { group, members }) => {
                assert_eq!(group, 7);
                assert!(members.contains("0000:04:00.1 is bound to snd_hda_intel"));
            }
            other => panic!("{other:?}"),
        }
        let missing = check_vfio_ready(&s, &bdf("09:00.0")).unwrap_err();
        assert!(matches!(missing, DmaError::DeviceNotFound(_)));
        assert_eq!(
            missing.to_string(),
            "no PCI device 0000:09:00.0 (see `lspci -D`)"
        );
        assert_eq!(s.devices().unwrap().len(), 5);
    }
}
