//! Building sysfs-shaped trees by hand: the test fixtures of hypothetical servers, and odd trees
//! for the error tests. The builder writes the same entries that the reader reads (and that a
//! capture holds), in the layout the kernel uses.

use crate::bdf::Bdf;
use crate::device::PortType;
use crate::keep::keep_empty_dirs;
use crate::resolve::relative_target;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

/// One PCI function to add to a tree.
#[derive(Debug, Clone)]
pub struct FixtureFunction {
    pub bdf: Bdf,
    pub vendor: u16,
    pub device: u16,
    /// (subsystem vendor, subsystem device); `None` writes neither attribute.
    pub subsystem: Option<(u16, u16)>,
    pub class_code: u32,
    /// `None` writes `-1`, as the kernel does without NUMA information.
    pub numa: Option<u32>,
    pub cpulist: Option<String>,
    /// (current GT/s, current width, max GT/s, max width)
    pub link: Option<(f64, u32, f64, u32)>,
    /// (BAR index, size in bytes); 64-bit prefetchable when ≥ 64 MiB.
    pub bars: Vec<(u8, u64)>,
    /// Written into the PCI Express capability; `None` writes no PCIe capability.
    pub port: Option<PortType>,
    /// ACS control register; `None` writes no ACS capability.
    pub acs_control: Option<u16>,
    /// Bytes of `config` to write: 4096 as root sees it, 64 as other users do.
    pub config_len: usize,
    pub iommu_group: Option<u32>,
    pub driver: Option<String>,
}

impl FixtureFunction {
    /// A function with the given identity; `bdf` must be a valid address (panics otherwise:
    /// this is for hand-written fixtures).
    pub fn new(bdf: &str, vendor: u16, device: u16, class_code: u32) -> Self {
        let bdf = bdf.parse().expect("fixture BDF");
        let is_bridge = class_code >> 8 == 0x0604;
        Self {
            bdf,
            vendor,
            device,
            subsystem: None,
            class_code,
            numa: None,
            cpulist: None,
            link: None,
            bars: Vec::new(),
            port: Some(if is_bridge {
                PortType::RootPort
            } else {
                PortType::Endpoint
            }),
            acs_control: None,
            config_len: 4096,
            iommu_group: None,
            driver: None,
        }
    }
    pub fn subsystem(mut self, vendor: u16, device: u16) -> Self {
        self.subsystem = Some((vendor, device));
        self
    }
    pub fn numa(mut self, node: u32, cpus: &str) -> Self {
        self.numa = Some(node);
        self.cpulist = Some(cpus.into());
        self
    }
    pub fn cpus(mut self, cpus: &str) -> Self {
        self.cpulist = Some(cpus.into());
        self
    }
    pub fn link(mut self, cur_gts: f64, cur_w: u32, max_gts: f64, max_w: u32) -> Self {
        self.link = Some((cur_gts, cur_w, max_gts, max_w));
        self
    }
    pub fn bar(mut self, index: u8, size: u64) -> Self {
        self.bars.push((index, size));
        self
    }
    pub fn port(mut self, p: PortType) -> Self {
        self.port = Some(p);
        self
    }
    pub fn acs(mut self, control: u16) -> Self {
        self.acs_control = Some(control);
        self
    }
    pub fn config_len(mut self, len: usize) -> Self {
        self.config_len = len;
        self
    }
    pub fn iommu(mut self, group: u32) -> Self {
        self.iommu_group = Some(group);
        self
    }
    pub fn driver(mut self, name: &str) -> Self {
        self.driver = Some(name.into());
        self
    }
}

/// Writes a sysfs tree under a root directory.
///
/// # Examples
///
/// ```
/// use gdr_pci::fixture::{FixtureFunction, TreeBuilder};
/// use gdr_pci::Sysfs;
///
/// let dir = tempfile::tempdir()?;
/// let mut tree = TreeBuilder::create(dir.path())?;
/// let hb = tree.host_bridge("pci0000:00")?;
/// // An FPGA handed to VFIO, in IOMMU group 7.
/// let fpga = FixtureFunction::new("0000:00:05.0", 0x10ee, 0x9038, 0x058000)
///     .driver("vfio-pci")
///     .iommu(7);
/// tree.add(&hb, fpga)?;
/// let root = tree.finish()?;
/// let info = Sysfs::new(root).device("00:05.0".parse()?)?;
/// assert_eq!((info.vendor, info.device), (0x10ee, 0x9038));
/// assert_eq!(info.driver.as_deref(), Some("vfio-pci"));
/// assert_eq!(info.iommu_group, Some(7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TreeBuilder {
    root: PathBuf,
    next_bar: u64,
    groups: BTreeSet<u32>,
}

fn speed_text(gts: f64) -> String {
    format!("{gts:.1} GT/s PCIe")
}

fn speed_code(gts: f64) -> u32 {
    [2.5, 5.0, 8.0, 16.0, 32.0, 64.0]
        .iter()
        .position(|&s| (s - gts).abs() < 0.01)
        .map_or(0, |p| p as u32 + 1)
}

fn port_field(p: PortType) -> u16 {
    match p {
        PortType::Endpoint | PortType::HostBridge | PortType::Unknown => 0,
        PortType::LegacyEndpoint => 1,
        PortType::RootPort => 4,
        PortType::SwitchUpstream => 5,
        PortType::SwitchDownstream => 6,
        PortType::PcieToPciBridge => 7,
        PortType::PciToPcieBridge => 8,
        PortType::RcIntegratedEndpoint => 9,
        PortType::RcEventCollector => 10,
    }
}

/// Config space as a device of this kind would present it: header, power management and PCI
/// Express capabilities, then AER and (optionally) ACS in extended space.
pub fn config_bytes(f: &FixtureFunction) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let put16 =
        |c: &mut Vec<u8>, off: usize, v: u16| c[off..off + 2].copy_from_slice(&v.to_le_bytes());
    let put32 =
        |c: &mut Vec<u8>, off: usize, v: u32| c[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put16(&mut c, 0x00, f.vendor);
    put16(&mut c, 0x02, f.device);
    put16(&mut c, 0x04, 0x0406); // memory space, bus master, interrupt disable
    put16(&mut c, 0x06, 0x0010); // capability list
    c[0x08] = 0xa1;
    c[0x09] = f.class_code as u8;
    c[0x0a] = (f.class_code >> 8) as u8;
    c[0x0b] = (f.class_code >> 16) as u8;
    c[0x0e] = u8::from(f.class_code >> 8 == 0x0604);
    c[0x34] = 0x40;
    c[0x40] = 0x01; // power management, next 0x60 (or end)
    if let Some(p) = f.port {
        c[0x41] = 0x60;
        c[0x60] = 0x10;
        put16(&mut c, 0x62, 0x0002 | (port_field(p) << 4));
        if let Some((cur_s, cur_w, max_s, max_w)) = f.link {
            put32(&mut c, 0x6c, speed_code(max_s) | (max_w << 4));
            put16(&mut c, 0x72, (speed_code(cur_s) | (cur_w << 4)) as u16);
        }
    }
    // AER at 0x100, then ACS at 0x148 when asked for.
    let next = if f.acs_control.is_some() { 0x148 } else { 0 };
    put32(&mut c, 0x100, 0x0001 | (2 << 16) | (next << 20));
    if let Some(ctl) = f.acs_control {
        put32(&mut c, 0x148, 0x000d | (1 << 16));
        put16(&mut c, 0x14c, 0x005f);
        put16(&mut c, 0x14e, ctl);
    }
    c.truncate(f.config_len);
    c
}

impl TreeBuilder {
    /// Starts a tree at `root`, which must be absent or empty.
    pub fn create(root: &Path) -> io::Result<Self> {
        if root.exists() && std::fs::read_dir(root)?.next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is not empty", root.display()),
            ));
        }
        for d in ["bus/pci/devices", "devices", "kernel/iommu_groups"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        Ok(Self {
            root: root.to_path_buf(),
            next_bar: 0x3800_0000_0000,
            groups: BTreeSet::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Ends the tree: marks empty directories (see [`KEEP_FILE`](crate::capture::KEEP_FILE)) so that it can
    /// be committed to git without links going dangling.
    pub fn finish(self) -> io::Result<PathBuf> {
        keep_empty_dirs(&self.root)?;
        Ok(self.root)
    }

    fn write(&self, rel: &Path, data: impl AsRef<[u8]>) -> io::Result<()> {
        let at = self.root.join(rel);
        if let Some(p) = at.parent() {
            std::fs::create_dir_all(p)?;
        }
        std::fs::write(at, data)
    }

    /// A relative symlink at `rel` to `target` (both relative to the root), creating the target
    /// directory when `make_target` is set.
    pub fn symlink(&self, rel: &Path, target: &Path, make_target: bool) -> io::Result<()> {
        let at = self.root.join(rel);
        if let Some(p) = at.parent() {
            std::fs::create_dir_all(p)?;
        }
        if make_target {
            std::fs::create_dir_all(self.root.join(target))?;
        }
        let text = relative_target(rel.parent().unwrap_or(Path::new("")), target);
        std::os::unix::fs::symlink(text, at)
    }

    /// A host bridge directory, `devices/pciDDDD:BB`; returns its path relative to the root.
    pub fn host_bridge(&mut self, name: &str) -> io::Result<PathBuf> {
        let rel = Path::new("devices").join(name);
        std::fs::create_dir_all(self.root.join(&rel))?;
        Ok(rel)
    }

    /// Adds a function below `parent` (a host bridge or a bridge returned earlier); returns its
    /// directory relative to the root.
    pub fn add(&mut self, parent: &Path, f: FixtureFunction) -> io::Result<PathBuf> {
        let dir = parent.join(f.bdf.to_string());
        self.write(&dir.join("vendor"), format!("{:#06x}\n", f.vendor))?;
        self.write(&dir.join("device"), format!("{:#06x}\n", f.device))?;
        self.write(&dir.join("class"), format!("{:#08x}\n", f.class_code))?;
        if let Some((v, d)) = f.subsystem {
            self.write(&dir.join("subsystem_vendor"), format!("{v:#06x}\n"))?;
            self.write(&dir.join("subsystem_device"), format!("{d:#06x}\n"))?;
        }
        let numa = f.numa.map_or("-1".to_string(), |n| n.to_string());
        self.write(&dir.join("numa_node"), format!("{numa}\n"))?;
        if let Some(c) = &f.cpulist {
            self.write(&dir.join("local_cpulist"), format!("{c}\n"))?;
        }
        if let Some((cs, cw, ms, mw)) = f.link {
            self.write(&dir.join("current_link_speed"), speed_text(cs) + "\n")?;
            self.write(&dir.join("current_link_width"), format!("{cw}\n"))?;
            self.write(&dir.join("max_link_speed"), speed_text(ms) + "\n")?;
            self.write(&dir.join("max_link_width"), format!("{mw}\n"))?;
        }
        let is_bridge = f.class_code >> 8 == 0x0604;
        let lines = if is_bridge { 17 } else { 13 };
        let mut res = String::new();
        for i in 0..lines {
            let bar = f.bars.iter().find(|(idx, _)| *idx as usize == i);
            match bar {
                Some(&(_, size)) => {
                    let big = size >= 64 << 20;
                    let align = size.next_power_of_two();
                    let start = self.next_bar.div_ceil(align) * align;
                    self.next_bar = start + size;
                    let flags: u64 = if big { 0x0014_220c } else { 0x0004_0200 };
                    res += &format!("{start:#018x} {:#018x} {flags:#018x}\n", start + size - 1);
                }
                None => res += &format!("{0:#018x} {0:#018x} {0:#018x}\n", 0),
            }
        }
        self.write(&dir.join("resource"), res)?;
        self.write(&dir.join("config"), config_bytes(&f))?;
        if let Some(g) = f.iommu_group {
            let target = PathBuf::from(format!("kernel/iommu_groups/{g}"));
            self.symlink(&dir.join("iommu_group"), &target, true)?;
            self.symlink(&target.join("devices").join(f.bdf.to_string()), &dir, false)?;
            self.groups.insert(g);
        }
        if let Some(drv) = &f.driver {
            let target = Path::new("bus/pci/drivers").join(drv);
            self.symlink(&dir.join("driver"), &target, true)?;
        }
        let link = Path::new("bus/pci/devices").join(f.bdf.to_string());
        self.symlink(&link, &dir, false)?;
        Ok(dir)
    }

    /// A NUMA node with its CPUs, `devices/system/node/node<id>/cpulist` (a kernel with NUMA
    /// support has at least node 0; a tree without any is read as one node 0).
    pub fn numa_node(&mut self, id: u32, cpus: &str) -> io::Result<()> {
        self.write(
            &PathBuf::from(format!("devices/system/node/node{id}/cpulist")),
            format!("{cpus}\n"),
        )
    }

    /// Sets the type of an IOMMU group (`identity`, `DMA-FQ`, `unmanaged`, ...).
    pub fn iommu_group_type(&mut self, group: u32, kind: &str) -> io::Result<()> {
        self.groups.insert(group);
        self.write(
            &PathBuf::from(format!("kernel/iommu_groups/{group}/type")),
            format!("{kind}\n"),
        )
    }

    /// A class device under a function, linked from `/sys/class/<class>/<name>`, the way the
    /// kernel does for `infiniband` (mlx5_0), `nvme` (nvme0) and `net` (eth0).
    pub fn class_device(&mut self, class: &str, name: &str, device_dir: &Path) -> io::Result<()> {
        let target = device_dir.join(class).join(name);
        self.symlink(&Path::new("class").join(class).join(name), &target, true)
    }
}
