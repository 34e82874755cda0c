//! PCI devices as sysfs shows them: IDs, the bound driver and the IOMMU group. This is where
//! "why can't I open the device" gets its answer, before any VFIO call is made.

use crate::error::{DmaError, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// A PCI address `domain:bus:device.function`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddress {
    /// Parses `DDDD:BB:DD.F` or `BB:DD.F` (hex fields, domain 0 when omitted).
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || DmaError::BadAddress(s.to_string());
        let parts: Vec<&str> = s.trim().split(':').collect();
        let (dom, bus, devfn) = match parts.as_slice() {
            [d, b, df] => (*d, *b, *df),
            [b, df] => ("0", *b, *df),
            _ => return Err(bad()),
        };
        let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
        let hex = |t: &str, max: u32| -> Result<u32> {
            let v = u32::from_str_radix(t, 16).map_err(|_| bad())?;
            if t.is_empty() || v > max {
                Err(bad())
            } else {
                Ok(v)
            }
        };
        Ok(PciAddress {
            domain: hex(dom, 0xffff)? as u16,
            bus: hex(bus, 0xff)? as u8,
            device: hex(dev, 0x1f)? as u8,
            function: hex(func, 7)? as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// What sysfs says about one PCI function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciInfo {
    pub addr: PciAddress,
    pub vendor: u16,
    pub device: u16,
    pub subsystem_vendor: u16,
    pub subsystem_device: u16,
    pub class: u32,
    /// The bound driver's name, if any.
    pub driver: Option<String>,
    /// The IOMMU group, absent when the IOMMU is off.
    pub iommu_group: Option<u32>,
}

/// Where sysfs lives (a fake tree in tests).
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::at("/sys")
    }
}

fn read_hex(p: &Path) -> Option<u32> {
    let s = std::fs::read_to_string(p).ok()?;
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

fn link_name(p: &Path) -> Option<String> {
    let target = std::fs::read_link(p).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

impl Sysfs {
    /// A sysfs tree rooted at `root` (normally `/sys`).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    fn dev_dir(&self, addr: &PciAddress) -> PathBuf {
        self.root.join("bus/pci/devices").join(addr.to_string())
    }

    /// The device's IDs, driver and IOMMU group.
    pub fn device(&self, addr: &PciAddress) -> Result<PciInfo> {
        let dir = self.dev_dir(addr);
        let vendor = read_hex(&dir.join("vendor"))
            .ok_or_else(|| DmaError::DeviceNotFound(addr.to_string()))?;
        let id = |name: &str| read_hex(&dir.join(name)).unwrap_or(0);
        Ok(PciInfo {
            addr: *addr,
            vendor: vendor as u16,
            device: id("device") as u16,
            subsystem_vendor: id("subsystem_vendor") as u16,
            subsystem_device: id("subsystem_device") as u16,
            class: id("class"),
            driver: link_name(&dir.join("driver")),
            iommu_group: link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok()),
        })
    }

    /// Every PCI function, sorted by address.
    pub fn devices(&self) -> Vec<PciInfo> {
        let Ok(rd) = std::fs::read_dir(self.root.join("bus/pci/devices")) else {
            return Vec::new();
        };
        let mut v: Vec<PciInfo> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| PciAddress::parse(&e.file_name().to_string_lossy()).ok())
            .filter_map(|a| self.device(&a).ok())
            .collect();
        v.sort_by_key(|d| d.addr);
        v
    }

    /// The members of an IOMMU group with their drivers.
    pub fn group_members(&self, group: u32) -> Vec<(PciAddress, Option<String>)> {
        let dir = self
            .root
            .join("kernel/iommu_groups")
            .join(group.to_string())
            .join("devices");
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut v: Vec<_> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| PciAddress::parse(&e.file_name().to_string_lossy()).ok())
            .map(|a| {
                let drv = link_name(&self.dev_dir(&a).join("driver"));
                (a, drv)
            })
            .collect();
        v.sort();
        v
    }

    /// Checks everything sysfs can tell before opening `addr` through VFIO: it exists, the
    /// IOMMU gave it a group, it is bound to vfio-pci, and so is every other member of its group.
    pub fn check_vfio_ready(&self, addr: &PciAddress) -> Result<(PciInfo, u32)> {
        let info = self.device(addr)?;
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
        let members = self.group_members(group);
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
}

/// The shell commands that bind `addr` to vfio-pci, given its current driver.
pub fn bind_hint(addr: &PciAddress, driver: Option<&str>) -> String {
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
    use std::os::unix::fs::symlink;

    #[test]
    fn parses_and_prints_addresses() {
        let a = PciAddress::parse("0000:3b:00.1").unwrap();
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0x3b, 0, 1));
        assert_eq!(a.to_string(), "0000:3b:00.1");
        assert_eq!(
            PciAddress::parse("00:04.0").unwrap().to_string(),
            "0000:00:04.0"
        );
        for bad in [
            "",
            "0000:00:20.0",
            "00:04",
            "0000:00:04.8",
            "x:00:04.0",
            "1:2:3:4.0",
            "00:.0",
        ] {
            assert!(
                matches!(PciAddress::parse(bad), Err(DmaError::BadAddress(_))),
                "{bad}"
            );
        }
    }

    fn fake_device(
        root: &Path,
        addr: &str,
        ids: [&str; 4],
        driver: Option<&str>,
        group: Option<u32>,
    ) {
        let dir = root.join("bus/pci/devices").join(addr);
        std::fs::create_dir_all(&dir).unwrap();
        for (n, v) in ["vendor", "device", "subsystem_vendor", "subsystem_device"]
            .iter()
            .zip(ids)
        {
            std::fs::write(dir.join(n), format!("{v}\n")).unwrap();
        }
        std::fs::write(dir.join("class"), "0x058000\n").unwrap();
        if let Some(d) = driver {
            let ddir = root.join("bus/pci/drivers").join(d);
            std::fs::create_dir_all(&ddir).unwrap();
            symlink(&ddir, dir.join("driver")).unwrap();
        }
        if let Some(g) = group {
            let gdir = root.join("kernel/iommu_groups").join(g.to_string());
            std::fs::create_dir_all(gdir.join("devices")).unwrap();
            symlink(&gdir, dir.join("iommu_group")).unwrap();
            symlink(&dir, gdir.join("devices").join(addr)).unwrap();
        }
    }

    #[test]
    fn readiness_checks_name_the_missing_piece() {
        let tmp = std::env::temp_dir().join(format!("gdr-dma-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let ids = ["0x10de", "0x0001", "0x10de", "0x0002"];
        fake_device(&tmp, "0000:01:00.0", ids, Some("vfio-pci"), Some(5));
        fake_device(&tmp, "0000:02:00.0", ids, Some("xdma"), Some(6));
        fake_device(&tmp, "0000:03:00.0", ids, None, None);
        fake_device(&tmp, "0000:04:00.0", ids, Some("vfio-pci"), Some(7));
        fake_device(&tmp, "0000:04:00.1", ids, Some("snd_hda_intel"), Some(7));
        let s = Sysfs::at(&tmp);

        let (info, g) = s
            .check_vfio_ready(&PciAddress::parse("01:00.0").unwrap())
            .unwrap();
        assert_eq!(g, 5);
        assert_eq!(
            (info.vendor, info.device, info.subsystem_device),
            (0x10de, 1, 2)
        );
        assert_eq!(info.class, 0x058000);

        match s.check_vfio_ready(&PciAddress::parse("02:00.0").unwrap()) {
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
            s.check_vfio_ready(&PciAddress::parse("03:00.0").unwrap()),
            Err(DmaError::NoIommu { .. })
        ));
        match s.check_vfio_ready(&PciAddress::parse("04:00.0").unwrap()) {
            Err(DmaError::GroupNotViable { group, members }) => {
                assert_eq!(group, 7);
                assert!(members.contains("0000:04:00.1 is bound to snd_hda_intel"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            s.check_vfio_ready(&PciAddress::parse("09:00.0").unwrap()),
            Err(DmaError::DeviceNotFound(_))
        ));
        assert_eq!(s.devices().len(), 5);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
