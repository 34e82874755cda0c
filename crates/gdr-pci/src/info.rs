//! What sysfs says about one PCI function, asked by address: its IDs, class, bound driver, IOMMU
//! group (and the other members of the group), NUMA node. This is what a caller needs before it
//! opens a device (VFIO wants the group and the driver; an engine is chosen by the IDs), without
//! reading the whole tree as [`Topology`](crate::Topology) does.

use crate::bdf::Bdf;
use crate::limits::MAX_ATTR_BYTES;
use crate::sysfs::Sysfs;
use crate::sysfs_error::SysfsError;
use std::path::{Path, PathBuf};

/// One PCI function as `/sys/bus/pci/devices/<bdf>` shows it.
///
/// # Examples
///
/// ```
/// use gdr_pci::{Bdf, PciError, Sysfs};
///
/// let sys = Sysfs::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topo/workstation"));
/// let gpu = sys.device("01:00.0".parse()?)?;
/// assert_eq!((gpu.vendor, gpu.device, gpu.class), (0x10de, 0x2684, 0x030000));
/// assert_eq!(gpu.driver.as_deref(), Some("nvidia"));
/// assert_eq!(gpu.numa_node, None); // sysfs says -1
/// let absent = Bdf::new(0, 0x42, 0, 0);
/// assert!(matches!(sys.device(absent), Err(PciError::NotFound(b)) if b == absent));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciInfo {
    /// The function's address.
    pub bdf: Bdf,
    /// PCI vendor ID (`vendor`), e.g. 0x10de for NVIDIA.
    pub vendor: u16,
    /// PCI device ID (`device`), chosen by the vendor.
    pub device: u16,
    /// Subsystem vendor ID (`subsystem_vendor`): the board maker. 0 where sysfs does not say
    /// (the kernel always does; hand-made trees may not).
    pub subsystem_vendor: u16,
    /// Subsystem device ID (`subsystem_device`): the board, e.g. which XDMA card. 0 where sysfs
    /// does not say.
    pub subsystem_device: u16,
    /// The 24-bit class code (`0x030200` for a 3D controller), 0 where sysfs does not say.
    pub class: u32,
    /// The bound driver's name, if any.
    pub driver: Option<String>,
    /// The IOMMU group, absent when the IOMMU is off.
    pub iommu_group: Option<u32>,
    /// The NUMA node, absent where the kernel does not know it (`-1`).
    pub numa_node: Option<u32>,
}

/// Why a function's attributes could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PciError {
    /// `bus/pci/devices` lists no such function.
    #[error("no PCI device {0}")]
    NotFound(Bdf),
    /// An attribute (or the device directory) exists but could not be read.
    #[error("{bdf}: {attr}: {source}")]
    Unreadable {
        /// The function asked about.
        bdf: Bdf,
        /// The attribute, e.g. `vendor`, `driver`, `iommu_group`.
        attr: &'static str,
        /// Why the read failed.
        source: SysfsError,
    },
    /// An attribute every function has is absent.
    #[error("{bdf}: no {attr} attribute")]
    Missing {
        /// The function asked about.
        bdf: Bdf,
        /// The attribute that is missing (`vendor` or `device`).
        attr: &'static str,
    },
    /// An attribute holds something other than its format (a hex ID out of range, a NUMA node
    /// that is no number).
    #[error("{bdf}: {attr}: unexpected content `{content}`")]
    Malformed {
        /// The function asked about.
        bdf: Bdf,
        /// The attribute whose content is wrong.
        attr: &'static str,
        /// What it held, trimmed.
        content: String,
    },
}

/// A hex attribute (`0x10de`, or without the prefix).
pub(crate) fn parse_hex(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(t, 16).ok()
}

/// `numa_node`: a node number, or `-1` (any negative) for none; `Err` on anything else.
pub(crate) fn parse_numa_node(s: &str) -> Result<Option<u32>, ()> {
    s.trim()
        .parse::<i64>()
        .map(|n| u32::try_from(n).ok())
        .map_err(|_| ())
}

/// The last component of a link target: the driver of `driver`, the number of `iommu_group`.
pub(crate) fn link_name(target: &Path) -> Option<&str> {
    target.file_name()?.to_str()
}

fn device_dir(bdf: Bdf) -> PathBuf {
    Path::new("bus/pci/devices").join(bdf.to_string())
}

impl Sysfs {
    /// IDs, class, driver, IOMMU group and NUMA node of `bdf`. Fails when the function is not
    /// listed, or its vendor and device IDs do not read; the other attributes are left at 0 or
    /// `None` when they are absent.
    pub fn device(&self, bdf: Bdf) -> Result<PciInfo, PciError> {
        let dir = device_dir(bdf);
        match self.resolve_dir(&dir) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Err(PciError::NotFound(bdf)),
            Err(source) => {
                return Err(PciError::Unreadable {
                    bdf,
                    attr: "the device directory",
                    source,
                })
            }
        }
        let text = |attr: &'static str| -> Result<Option<String>, PciError> {
            match self.read_text(&dir.join(attr), MAX_ATTR_BYTES) {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.is_not_found() => Ok(None),
                Err(source) => Err(PciError::Unreadable { bdf, attr, source }),
            }
        };
        let hex = |attr: &'static str, max: u64| -> Result<Option<u64>, PciError> {
            let Some(s) = text(attr)? else {
                return Ok(None);
            };
            match parse_hex(&s) {
                Some(v) if v <= max => Ok(Some(v)),
                _ => Err(PciError::Malformed {
                    bdf,
                    attr,
                    content: s,
                }),
            }
        };
        let required = |attr: &'static str| -> Result<u16, PciError> {
            hex(attr, 0xffff)?
                .map(|v| v as u16)
                .ok_or(PciError::Missing { bdf, attr })
        };
        let numa_node = match text("numa_node")? {
            None => None,
            Some(s) => parse_numa_node(&s).map_err(|()| PciError::Malformed {
                bdf,
                attr: "numa_node",
                content: s,
            })?,
        };
        Ok(PciInfo {
            bdf,
            vendor: required("vendor")?,
            device: required("device")?,
            subsystem_vendor: hex("subsystem_vendor", 0xffff)?.unwrap_or(0) as u16,
            subsystem_device: hex("subsystem_device", 0xffff)?.unwrap_or(0) as u16,
            class: hex("class", 0xff_ffff)?.unwrap_or(0) as u32,
            driver: self.driver(bdf).map_err(|source| PciError::Unreadable {
                bdf,
                attr: "driver",
                source,
            })?,
            iommu_group: self
                .iommu_group(bdf)
                .map_err(|source| PciError::Unreadable {
                    bdf,
                    attr: "iommu_group",
                    source,
                })?,
            numa_node,
        })
    }

    /// Every PCI function that reads (see [`Sysfs::device`]), in address order. Fails only when
    /// `bus/pci/devices` cannot be listed.
    pub fn devices(&self) -> Result<Vec<PciInfo>, SysfsError> {
        let mut v: Vec<PciInfo> = self
            .list(Path::new("bus/pci/devices"))?
            .iter()
            .filter_map(|name| name.parse::<Bdf>().ok())
            .filter_map(|bdf| self.device(bdf).ok())
            .collect();
        v.sort_by_key(|d| d.bdf);
        Ok(v)
    }

    /// The name of the driver bound to `bdf`; `None` when none is.
    pub fn driver(&self, bdf: Bdf) -> Result<Option<String>, SysfsError> {
        self.optional_link_name(&device_dir(bdf).join("driver"))
    }

    /// The IOMMU group of `bdf`; `None` when it has none (the IOMMU is off).
    pub fn iommu_group(&self, bdf: Bdf) -> Result<Option<u32>, SysfsError> {
        Ok(self
            .optional_link_name(&device_dir(bdf).join("iommu_group"))?
            .and_then(|g| g.parse().ok()))
    }

    /// Every IOMMU group the kernel has, in order; empty when the IOMMU is off (no
    /// `kernel/iommu_groups`).
    pub fn iommu_groups(&self) -> Result<Vec<u32>, SysfsError> {
        let mut ids: Vec<u32> = match self.list(Path::new("kernel/iommu_groups")) {
            Ok(names) => names.iter().filter_map(|n| n.parse().ok()).collect(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        ids.sort_unstable();
        Ok(ids)
    }

    /// The functions of IOMMU `group`, with the driver each is bound to, in address order.
    pub fn iommu_group_members(
        &self,
        group: u32,
    ) -> Result<Vec<(Bdf, Option<String>)>, SysfsError> {
        let dir = Path::new("kernel/iommu_groups")
            .join(group.to_string())
            .join("devices");
        let mut members: Vec<Bdf> = self
            .list(&dir)?
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        members.sort_unstable();
        members
            .into_iter()
            .map(|bdf| Ok((bdf, self.driver(bdf)?)))
            .collect()
    }

    fn optional_link_name(&self, rel: &Path) -> Result<Option<String>, SysfsError> {
        match self.link(rel) {
            Ok(target) => Ok(link_name(&target).map(str::to_string)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{FixtureFunction, TreeBuilder};

    /// Two functions in one IOMMU group with different drivers, one without a group or driver.
    fn tree(root: &Path) {
        let mut t = TreeBuilder::create(root).unwrap();
        let hb = t.host_bridge("pci0000:00").unwrap();
        t.add(
            &hb,
            FixtureFunction::new("0000:00:04.0", 0x10ee, 0x7024, 0x058000)
                .subsystem(0x10ee, 0x0007)
                .numa(1, "0-3")
                .iommu(7)
                .driver("vfio-pci"),
        )
        .unwrap();
        t.add(
            &hb,
            FixtureFunction::new("0000:00:04.1", 0x8086, 0x1234, 0x040300)
                .iommu(7)
                .driver("snd_hda_intel"),
        )
        .unwrap();
        t.add(
            &hb,
            FixtureFunction::new("0000:00:05.0", 0x1234, 0x11e8, 0x00ff00),
        )
        .unwrap();
    }

    #[test]
    fn reads_ids_driver_group_and_node() {
        let tmp = tempfile::tempdir().unwrap();
        tree(tmp.path());
        let fs = Sysfs::new(tmp.path());
        let a = fs.device("00:04.0".parse().unwrap()).unwrap();
        assert_eq!(
            a,
            PciInfo {
                bdf: Bdf::new(0, 0, 4, 0),
                vendor: 0x10ee,
                device: 0x7024,
                subsystem_vendor: 0x10ee,
                subsystem_device: 0x0007,
                class: 0x058000,
                driver: Some("vfio-pci".into()),
                iommu_group: Some(7),
                numa_node: Some(1),
            }
        );
        let c = fs.device(Bdf::new(0, 0, 5, 0)).unwrap();
        assert_eq!((c.driver, c.iommu_group, c.numa_node), (None, None, None));
        assert_eq!(c.subsystem_vendor, 0);
        assert_eq!(fs.devices().unwrap().len(), 3);
        assert_eq!(fs.iommu_groups().unwrap(), [7]);
        assert_eq!(
            fs.iommu_group_members(7).unwrap(),
            [
                (Bdf::new(0, 0, 4, 0), Some("vfio-pci".to_string())),
                (Bdf::new(0, 0, 4, 1), Some("snd_hda_intel".to_string())),
            ]
        );
    }

    #[test]
    fn absent_and_malformed_devices_say_so() {
        let tmp = tempfile::tempdir().unwrap();
        tree(tmp.path());
        let fs = Sysfs::new(tmp.path());
        let missing = Bdf::new(0, 9, 0, 0);
        assert!(matches!(fs.device(missing), Err(PciError::NotFound(b)) if b == missing));
        std::fs::write(
            tmp.path().join("devices/pci0000:00/0000:00:05.0/vendor"),
            "hi\n",
        )
        .unwrap();
        let err = fs.device(Bdf::new(0, 0, 5, 0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0000:00:05.0: vendor: unexpected content `hi`"
        );
        assert!(Sysfs::new(tmp.path().join("nowhere")).devices().is_err());
        assert!(Sysfs::new(tmp.path().join("nowhere"))
            .iommu_groups()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn numa_nodes_and_hex() {
        assert_eq!(parse_numa_node("-1\n"), Ok(None));
        assert_eq!(parse_numa_node("3"), Ok(Some(3)));
        assert_eq!(parse_numa_node("x"), Err(()));
        assert_eq!(parse_hex("0x10DE\n"), Some(0x10de));
        assert_eq!(parse_hex("10de"), Some(0x10de));
        assert_eq!(parse_hex("0xg"), None);
    }
}
