//! What `topo` knows about one PCI function: identity, class, link, NUMA, IOMMU, BARs, ACS.

use crate::bdf::Bdf;
use crate::config::AcsState;
use crate::cpulist::format_ids;
use serde::{Serialize, Serializer};
use std::fmt;

pub const VENDOR_NVIDIA: u16 = 0x10de;
pub const VENDOR_XILINX: u16 = 0x10ee;
pub const VENDOR_ALTERA: u16 = 0x1172;

/// The kind of device, as far as peer-to-peer DMA cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceClass {
    /// An NVIDIA GPU (display class, vendor 0x10de).
    Gpu,
    /// A network controller without an RDMA (`/sys/class/infiniband`) device.
    Nic,
    /// A network controller with an RDMA device (mlx5_0, ...): a GPUDirect RDMA peer.
    RdmaNic,
    /// An NVMe drive (mass-storage class 0x0108, or a function with a `/sys/class/nvme` device).
    Nvme,
    /// FPGAs (Xilinx, Altera vendor ids) and processing accelerators / co-processors.
    Accelerator,
    /// Host bridges and PCI-to-PCI bridges (root ports, switch ports).
    Bridge,
    /// Anything else (audio, USB, management controllers, display devices of other vendors).
    Other,
}

impl DeviceClass {
    /// The prefix of matrix labels (GPU0, NIC0, ...), following `nvidia-smi topo -m` for GPUs and
    /// RDMA NICs.
    pub fn label_prefix(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "GPU",
            DeviceClass::RdmaNic => "NIC",
            DeviceClass::Nic => "NET",
            DeviceClass::Nvme => "NVME",
            DeviceClass::Accelerator => "ACC",
            DeviceClass::Bridge => "BR",
            DeviceClass::Other => "DEV",
        }
    }

    /// Whether a default `gdr topo` shows it: GPUs and the devices that talk to them.
    pub fn is_gpu_peer(self) -> bool {
        !matches!(self, DeviceClass::Bridge | DeviceClass::Other)
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceClass::Gpu => "GPU",
            DeviceClass::Nic => "NIC",
            DeviceClass::RdmaNic => "RDMA NIC",
            DeviceClass::Nvme => "NVMe",
            DeviceClass::Accelerator => "FPGA/accelerator",
            DeviceClass::Bridge => "bridge",
            DeviceClass::Other => "other",
        })
    }
}

/// The PCI Express role of a function (from config space, or inferred from the tree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortType {
    /// A PCI Express endpoint (type 0): GPUs, NICs, drives.
    Endpoint,
    /// A legacy PCI Express endpoint (type 1), which may use I/O space and locked requests.
    LegacyEndpoint,
    /// A root port of the root complex (type 4): the link below it leads to a slot or switch.
    RootPort,
    /// The upstream port of a switch (type 5), facing the root complex.
    SwitchUpstream,
    /// A downstream port of a switch (type 6), facing a device or a further switch.
    SwitchDownstream,
    /// A PCI Express to PCI/PCI-X bridge (type 7).
    PcieToPciBridge,
    /// A PCI/PCI-X to PCI Express bridge (type 8).
    PciToPcieBridge,
    /// An endpoint integrated into the root complex (type 9), with no link of its own.
    RcIntegratedEndpoint,
    /// A root complex event collector (type 10).
    RcEventCollector,
    /// A host bridge function (class 0x0600), which is no port at all.
    HostBridge,
    /// A field value the specification reserves, or a bridge whose type could not be inferred.
    Unknown,
}

impl PortType {
    /// From the 4-bit "Device/Port Type" field.
    pub fn from_field(v: u8) -> Self {
        match v {
            0 => PortType::Endpoint,
            1 => PortType::LegacyEndpoint,
            4 => PortType::RootPort,
            5 => PortType::SwitchUpstream,
            6 => PortType::SwitchDownstream,
            7 => PortType::PcieToPciBridge,
            8 => PortType::PciToPcieBridge,
            9 => PortType::RcIntegratedEndpoint,
            10 => PortType::RcEventCollector,
            _ => PortType::Unknown,
        }
    }

    /// The role in words for hop lists and reasons: "root port", "switch downstream port".
    pub fn describe(self) -> &'static str {
        match self {
            PortType::Endpoint | PortType::LegacyEndpoint => "endpoint",
            PortType::RootPort => "root port",
            PortType::SwitchUpstream => "switch upstream port",
            PortType::SwitchDownstream => "switch downstream port",
            PortType::PcieToPciBridge => "PCIe-to-PCI bridge",
            PortType::PciToPcieBridge => "PCI-to-PCIe bridge",
            PortType::RcIntegratedEndpoint => "root-complex integrated endpoint",
            PortType::RcEventCollector => "root-complex event collector",
            PortType::HostBridge => "host bridge function",
            PortType::Unknown => "bridge",
        }
    }
}

/// Link speed (GT/s) and width, current and maximum, as the function itself reports them.
///
/// # Examples
///
/// ```
/// use gdr_pci::{pcie_generation, LinkState};
///
/// // A Gen4 x16 link running at Gen1 speed, as an idle GPU's link often does.
/// let link = LinkState {
///     current_speed_gts: Some(2.5),
///     current_width: Some(16),
///     max_speed_gts: Some(16.0),
///     max_width: Some(16),
/// };
/// assert!(link.is_known());
/// assert_eq!(link.summary(), "2.5 GT/s x16 (max 16 GT/s x16)");
/// assert_eq!((pcie_generation(2.5), pcie_generation(16.0)), (Some(1), Some(4)));
/// assert_eq!(LinkState::default().summary(), "-", "no link attributes in sysfs");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LinkState {
    /// `current_link_speed` in GT/s per lane (2.5 for Gen1 ... 64 for Gen6).
    pub current_speed_gts: Option<f64>,
    /// `current_link_width`: lanes in use (x1 ... x16).
    pub current_width: Option<u32>,
    /// `max_link_speed` in GT/s per lane: what the function supports.
    pub max_speed_gts: Option<f64>,
    /// `max_link_width`: lanes the function supports.
    pub max_width: Option<u32>,
}

impl LinkState {
    /// Whether sysfs gave the current speed or width (functions without a link give neither).
    pub fn is_known(&self) -> bool {
        self.current_speed_gts.is_some() || self.current_width.is_some()
    }

    /// `32 GT/s x16 (max 32 GT/s x16)`, or `-` when sysfs had nothing.
    pub fn summary(&self) -> String {
        if !self.is_known() && self.max_speed_gts.is_none() {
            return "-".into();
        }
        format!(
            "{} (max {})",
            speed_width(self.current_speed_gts, self.current_width),
            speed_width(self.max_speed_gts, self.max_width)
        )
    }
}

fn speed_width(speed: Option<f64>, width: Option<u32>) -> String {
    let s = speed.map_or("?".to_string(), |v| format!("{v} GT/s"));
    let w = width.map_or("x?".to_string(), |v| format!("x{v}"));
    format!("{s} {w}")
}

/// The PCIe generation that runs at `gts` GT/s.
pub fn pcie_generation(gts: f64) -> Option<u32> {
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
        (128.0, 7),
    ]
    .iter()
    .find(|(s, _)| (gts - s).abs() < 0.01)
    .map(|&(_, g)| g)
}

/// One BAR from the `resource` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bar {
    /// The line of `resource` (0-5): the BAR slot, a 64-bit BAR taking two.
    pub index: u8,
    /// Bus address of the first byte.
    pub start: u64,
    /// Bytes the BAR decodes.
    pub size: u64,
    /// An I/O port BAR (`IORESOURCE_IO`), not memory.
    pub io: bool,
    /// A 64-bit memory BAR (`IORESOURCE_MEM_64`), occupying slots `index` and `index + 1`.
    pub mem64: bool,
    /// Prefetchable memory (`IORESOURCE_PREFETCH`): reads have no side effects.
    pub prefetchable: bool,
}

/// The IOMMU group of a device and its default-domain type (`identity`, `DMA`, `DMA-FQ`,
/// `unmanaged`, `blocked`; absent before Linux 5.11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IommuGroup {
    /// The group number, as in `/sys/kernel/iommu_groups/N` and `/dev/vfio/N`.
    pub id: u32,
    /// The default domain's type from `iommu_groups/N/type`; `None` when the file is absent.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

impl IommuGroup {
    /// `Some(true)` when DMA from this device is translated (or blocked), `Some(false)` in
    /// pass-through (`identity`), `None` when the type is unknown.
    pub fn translating(&self) -> Option<bool> {
        match self.kind.as_deref()? {
            "identity" => Some(false),
            "DMA" | "DMA-FQ" | "unmanaged" | "blocked" => Some(true),
            _ => None,
        }
    }
}

fn hex16<S: Serializer>(v: &Option<u16>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(&format_args!("{v:#06x}")),
        None => s.serialize_none(),
    }
}

fn hex24<S: Serializer>(v: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(&format_args!("{v:#08x}")),
        None => s.serialize_none(),
    }
}

/// One PCI function as read from sysfs. Fields are `None`/empty where sysfs had nothing readable;
/// the reasons are in [`Topology::warnings`](crate::Topology::warnings).
#[derive(Debug, Clone, Serialize)]
pub struct PciDevice {
    /// The function's address.
    pub bdf: Bdf,
    /// Matrix label: GPU0, NIC0 (RDMA NICs, as nvidia-smi numbers them), NET0, NVME0, ACC0, DEV0;
    /// empty for bridges.
    pub label: String,
    /// Names that `--explain` accepts: gpu0, mlx5_0, nvme0, network interfaces.
    pub names: Vec<String>,
    /// What kind of device it is for peer-to-peer purposes.
    pub class: DeviceClass,
    /// PCI vendor ID (`vendor`, 0x10de for NVIDIA).
    #[serde(serialize_with = "hex16")]
    pub vendor: Option<u16>,
    /// PCI device ID (`device`).
    #[serde(serialize_with = "hex16")]
    pub device: Option<u16>,
    /// The 24-bit class code (`class`: base class, subclass, programming interface).
    #[serde(serialize_with = "hex24")]
    pub class_code: Option<u32>,
    /// The PCI Express role, from config space or inferred (see `port_type_inferred`).
    pub port_type: PortType,
    /// True when the port type was guessed from the tree: config space was unreadable, or it
    /// has no PCI Express capability (conventional PCI, such as virtio devices in a VM).
    pub port_type_inferred: bool,
    /// `numa_node` as sysfs gives it; `None` for -1 (no NUMA information, as in most VMs).
    pub numa: Option<u32>,
    /// The NUMA nodes close to the device, as `nvidia-smi topo -m` prints them under "NUMA
    /// Affinity": `numa` when set, otherwise the nodes whose CPUs (`node*/cpulist`) intersect
    /// `cpulist`, or node 0 when the machine has no node directories. Empty when unknown.
    pub numa_affinity: Vec<u32>,
    /// `local_cpulist`: the CPUs close to the device.
    pub cpulist: Option<String>,
    /// The NUMA node that holds the GPU's own memory on machines where the CPU maps it as a
    /// NUMA node (Grace Hopper and later; nvidia-smi's "GPU NUMA ID"). sysfs does not show it,
    /// so it is `None` unless set from NVML with
    /// [`Topology::set_gpu_numa_id`](crate::Topology::set_gpu_numa_id).
    pub gpu_numa_id: Option<u32>,
    /// The function's own link attributes (for a root or downstream port: the link below it).
    pub link: LinkState,
    /// The IOMMU group; `None` when the IOMMU is off or the link is unreadable.
    pub iommu_group: Option<IommuGroup>,
    /// The assigned BARs from `resource`, unassigned ones left out.
    pub bars: Vec<Bar>,
    /// Access Control Services as config space shows them (needs root past 64 bytes).
    pub acs: AcsState,
    /// The bound driver's name (`nvidia`, `mlx5_core`, `vfio-pci`), `None` when unbound.
    pub driver: Option<String>,
    /// The bridge directly above, `None` for functions on a host bridge's root bus.
    pub parent: Option<Bdf>,
    /// The host bridge (root bus) above, as sysfs names it: `pci0000:17`.
    pub host_bridge: String,
    /// Where the device lives, relative to the sysfs root.
    pub sysfs_path: String,
}

impl PciDevice {
    /// The first name (`gpu0`, `mlx5_0`, ...) or the address.
    pub fn name(&self) -> String {
        self.names
            .first()
            .cloned()
            .unwrap_or_else(|| self.bdf.to_string())
    }

    /// Whether it is a host bridge or a PCI-to-PCI bridge (root or switch port).
    pub fn is_bridge(&self) -> bool {
        self.class == DeviceClass::Bridge
    }

    /// Whether it is a GPU with NVIDIA's vendor ID: the devices BAR1 and NVML apply to.
    pub fn is_nvidia_gpu(&self) -> bool {
        self.class == DeviceClass::Gpu && self.vendor == Some(VENDOR_NVIDIA)
    }

    /// BAR1 size in bytes: the window through which peers reach an NVIDIA GPU's memory.
    ///
    /// NVIDIA numbers its BARs by region (BAR0 registers, BAR1 memory window, BAR3), while
    /// sysfs numbers PCI slots. On bare metal BAR0 is usually 32-bit, so BAR1 sits in slot 1;
    /// a hypervisor may give BAR0 a 64-bit slot pair (0-1), which moves BAR1 to slot 2.
    pub fn bar1_size(&self) -> Option<u64> {
        let bar0 = self.bars.iter().find(|b| b.index == 0 && !b.io)?;
        let slot = if bar0.mem64 { 2 } else { 1 };
        self.bars
            .iter()
            .find(|b| b.index == slot && !b.io)
            .map(|b| b.size)
    }

    /// [`PciDevice::numa_affinity`] the way nvidia-smi prints it: `0`, `0-1`, or `N/A`.
    pub fn numa_affinity_text(&self) -> String {
        if self.numa_affinity.is_empty() {
            "N/A".into()
        } else {
            format_ids(&self.numa_affinity)
        }
    }
}

/// Classifies from the class code and vendor, plus whether sysfs lists an RDMA or NVMe device.
pub(crate) fn classify(
    class_code: Option<u32>,
    vendor: Option<u16>,
    has_rdma: bool,
    has_nvme: bool,
) -> DeviceClass {
    let (base, sub) = class_code.map_or((0xff, 0xff), |c| ((c >> 16) as u8, (c >> 8) as u8));
    match (base, sub) {
        (0x06, 0x00 | 0x04 | 0x09) => DeviceClass::Bridge,
        (0x03, _) if vendor == Some(VENDOR_NVIDIA) => DeviceClass::Gpu,
        (0x02, _) | (0x0c, 0x06) if has_rdma => DeviceClass::RdmaNic,
        (0x02, _) => DeviceClass::Nic,
        (0x01, 0x08) => DeviceClass::Nvme,
        _ if has_nvme => DeviceClass::Nvme,
        _ if has_rdma => DeviceClass::RdmaNic,
        (0x12, _) | (0x0b, 0x40) => DeviceClass::Accelerator,
        _ if matches!(vendor, Some(VENDOR_XILINX | VENDOR_ALTERA)) => DeviceClass::Accelerator,
        _ => DeviceClass::Other,
    }
}

/// Human size: 256 MiB, 128 GiB.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Whether a function's link registers describe the link below it (towards its children).
pub(crate) fn link_is_below(p: PortType) -> bool {
    matches!(p, PortType::RootPort | PortType::SwitchDownstream)
}

/// Sort key that puts `mlx5_2` before `mlx5_10`.
pub(crate) fn natural_key(s: &str) -> (String, u64, String) {
    let digits_at = s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, num) = s.split_at(digits_at);
    (head.to_string(), num.parse().unwrap_or(0), s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(
            classify(Some(0x030200), Some(0x10de), false, false),
            DeviceClass::Gpu
        );
        assert_eq!(
            classify(Some(0x030000), Some(0x1a03), false, false),
            DeviceClass::Other
        );
        assert_eq!(
            classify(Some(0x020000), Some(0x15b3), true, false),
            DeviceClass::RdmaNic
        );
        assert_eq!(
            classify(Some(0x020000), Some(0x8086), false, false),
            DeviceClass::Nic
        );
        assert_eq!(
            classify(Some(0x010802), Some(0x144d), false, false),
            DeviceClass::Nvme
        );
        assert_eq!(
            classify(Some(0x058000), Some(0x10ee), false, false),
            DeviceClass::Accelerator
        );
        assert_eq!(
            classify(Some(0x120000), Some(0x1234), false, false),
            DeviceClass::Accelerator
        );
        assert_eq!(
            classify(Some(0x060400), Some(0x1000), false, false),
            DeviceClass::Bridge
        );
        assert_eq!(
            classify(Some(0x068000), Some(0x10de), false, false),
            DeviceClass::Other
        );
        assert_eq!(classify(None, None, false, false), DeviceClass::Other);
    }

    fn bar(index: u8, size: u64, mem64: bool) -> Bar {
        Bar {
            index,
            start: 0x1000_0000_0000 + (u64::from(index) << 40),
            size,
            io: false,
            mem64,
            prefetchable: mem64,
        }
    }

    #[test]
    fn bar1_follows_a_32_or_64_bit_bar0() {
        let mut d = PciDevice {
            bdf: "0000:00:06.0".parse().unwrap(),
            label: "GPU0".into(),
            names: vec!["gpu0".into()],
            class: DeviceClass::Gpu,
            vendor: Some(VENDOR_NVIDIA),
            device: Some(0x2330),
            class_code: Some(0x030200),
            port_type: PortType::Endpoint,
            port_type_inferred: false,
            numa: None,
            numa_affinity: Vec::new(),
            cpulist: None,
            gpu_numa_id: None,
            link: LinkState::default(),
            iommu_group: None,
            bars: Vec::new(),
            acs: crate::AcsState::Absent,
            driver: None,
            parent: None,
            host_bridge: "pci0000:00".into(),
            sysfs_path: String::new(),
        };
        assert_eq!(d.bar1_size(), None);
        let window = (1u64 << 30) << (rand::random::<u8>() % 8);
        // Bare metal: 32-bit BAR0 in slot 0, BAR1 in slots 1-2, BAR3 in slots 3-4.
        d.bars = vec![
            bar(0, 16 << 20, false),
            bar(1, window, true),
            bar(3, 32 << 20, true),
        ];
        assert_eq!(d.bar1_size(), Some(window));
        // Firecracker: 64-bit BAR0 in slots 0-1, BAR1 in 2-3, BAR3 in 4-5.
        d.bars = vec![
            bar(0, 16 << 20, true),
            bar(2, window, true),
            bar(4, 32 << 20, true),
        ];
        assert_eq!(d.bar1_size(), Some(window));
        // No BAR0 (unassigned): which slot is BAR1 cannot be told.
        d.bars.remove(0);
        assert_eq!(d.bar1_size(), None);
    }

    #[test]
    fn sizes_and_generations() {
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(128 << 30), "128 GiB");
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
        assert_eq!(pcie_generation(32.0), Some(5));
        assert_eq!(pcie_generation(2.5), Some(1));
        assert_eq!(pcie_generation(3.0), None);
    }
}
