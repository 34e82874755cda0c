//! Opening a DMA device by PCI address: VFIO, bus mastering, the IOMMU space, the engine that
//! matches the device's IDs, and its interrupt. What the CLI and the VM test start from.

use crate::edu::{self, EduEngine};
use crate::engine::DmaEngine;
use crate::error::{DmaError, Result};
use crate::iommu::IommuSpace;
use crate::irq::Interrupt;
use crate::pci::{Bdf, PciInfo, Sysfs};
use crate::vfio::{MappedBar, Vfio, VfioDevice};
use crate::xdma::{self, Leds, XdmaConfig, XdmaEngine};

/// Which engine drives the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Chosen from the PCI vendor:device ID.
    Auto,
    /// The Xilinx XDMA engine ([`XdmaEngine`](crate::XdmaEngine)): PicoEVB, HTG-K800.
    Xdma,
    /// QEMU's edu device ([`EduEngine`](crate::EduEngine)).
    Edu,
}

impl EngineKind {
    /// The engine for a device's IDs, if known.
    pub fn for_ids(vendor: u16, device: u16) -> Option<EngineKind> {
        match (vendor, device) {
            (xdma::VENDOR, xdma::DEVICE) => Some(EngineKind::Xdma),
            (edu::VENDOR, edu::DEVICE) => Some(EngineKind::Edu),
            _ => None,
        }
    }
}

/// How to open.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Which engine drives the device; [`EngineKind::Auto`] picks by vendor:device ID.
    pub engine: EngineKind,
    /// Wait for completions by interrupt (else poll the device).
    pub interrupts: bool,
    /// Override the device-memory size (XDMA boards with other RAM sizes).
    pub device_memory: Option<u64>,
    /// Lowest IOVA handed out (page 0 stays unmapped so a zero address faults).
    pub iova_base: u64,
    /// The sysfs tree the device is looked up in (`/sys` by default).
    pub sysfs: Sysfs,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            engine: EngineKind::Auto,
            interrupts: true,
            device_memory: None,
            iova_base: 1 << 20,
            sysfs: Sysfs::default(),
        }
    }
}

/// An opened DMA device. Field order is drop order: the engine (and its descriptor mapping)
/// goes before the device and the container.
///
/// # Examples
///
/// [`Session::open`] checks what sysfs says before it touches a device node; here a
/// hand-made tree stands in for `/sys` (the crate's example opens a real device):
///
/// ```
/// use gdr_dma::{DmaError, OpenOptions, Session, Sysfs};
/// use gdr_pci::fixture::{FixtureFunction, TreeBuilder};
///
/// let dir = tempfile::tempdir()?;
/// let mut tree = TreeBuilder::create(dir.path())?;
/// let hb = tree.host_bridge("pci0000:00")?;
/// // QEMU's edu device, still bound to another driver; and a GPU, which has no DMA engine here.
/// tree.add(&hb, FixtureFunction::new("0000:00:04.0", 0x1234, 0x11e8, 0x00ff00).driver("edu").iommu(4))?;
/// tree.add(&hb, FixtureFunction::new("0000:00:05.0", 0x10de, 0x2330, 0x030200).iommu(5))?;
/// let opts = OpenOptions { sysfs: Sysfs::new(tree.finish()?), ..Default::default() };
///
/// let Err(e) = Session::open(&"00:04.0".parse()?, &opts) else { panic!("not vfio-pci's") };
/// assert!(matches!(&e, DmaError::NotBound { current, .. } if current == "bound to edu"), "{e}");
/// assert!(e.to_string().contains("modprobe vfio-pci"), "the fix: {e}");
/// let Err(e) = Session::open(&"00:05.0".parse()?, &opts) else { panic!("no engine") };
/// assert!(matches!(e, DmaError::UnknownDevice { vendor: 0x10de, .. }), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Session {
    /// The device's DMA engine.
    pub engine: Box<dyn DmaEngine>,
    /// The board's LEDs (XDMA bitstreams with the GPIO on BAR0); `None` for edu.
    pub leds: Option<Leds<MappedBar>>,
    /// The IOMMU address space of the device's container: map buffers here for the engine.
    pub space: IommuSpace,
    /// The engine that was chosen (never [`EngineKind::Auto`]).
    pub kind: EngineKind,
    /// The VFIO device itself: regions, config space, reset.
    pub device: VfioDevice,
    vfio: Vfio,
}

impl Session {
    /// Opens `addr` and builds its engine.
    pub fn open(addr: &Bdf, opts: &OpenOptions) -> Result<Session> {
        let mut vfio = Vfio::with_sysfs(opts.sysfs.clone());
        let info = opts.sysfs.device(*addr)?;
        let kind = match opts.engine {
            EngineKind::Auto => EngineKind::for_ids(info.vendor, info.device).ok_or_else(|| {
                DmaError::UnknownDevice {
                    addr: addr.to_string(),
                    vendor: info.vendor,
                    device: info.device,
                }
            })?,
            k => k,
        };
        let device = vfio.open_device(addr)?;
        device.enable_bus_master()?;
        let irq: Option<Box<dyn Interrupt>> = if opts.interrupts {
            Some(Box::new(device.enable_irq()?))
        } else {
            None
        };
        let (engine, leds, space): (Box<dyn DmaEngine>, _, _) = match kind {
            EngineKind::Edu => {
                let space = vfio.iommu_space(opts.iova_base, edu::DEFAULT_IOVA_LIMIT)?;
                let e = EduEngine::new(device.map_bar(0)?, irq)?;
                (Box::new(e), None, space)
            }
            EngineKind::Xdma | EngineKind::Auto => {
                let mut cfg = XdmaConfig::for_subsystem(info.subsystem_device)
                    .unwrap_or_else(XdmaConfig::picoevb);
                if let Some(m) = opts.device_memory {
                    cfg.device_memory = m;
                }
                let space = vfio.iommu_space(opts.iova_base, cfg.iova_limit.min(1 << 48))?;
                let e = XdmaEngine::new(device.map_bar(1)?, &space, cfg, irq)?;
                let leds = Leds::new(device.map_bar(0)?)?;
                (Box::new(e), Some(leds), space)
            }
        };
        Ok(Session {
            engine,
            leds,
            space,
            kind,
            device,
            vfio,
        })
    }

    /// Opens another device into the same IOMMU container, e.g. to map one of its BARs as peer
    /// memory the engine can reach.
    pub fn open_peer(&mut self, addr: &Bdf) -> Result<VfioDevice> {
        let d = self.vfio.open_device(addr)?;
        // The peer must decode memory for the engine's accesses to land.
        d.enable_bus_master()?;
        Ok(d)
    }

    /// What sysfs said about the device when it was opened: IDs, driver, IOMMU group.
    pub fn info(&self) -> &PciInfo {
        self.device.info()
    }

    /// The IOVA ranges the IOMMU reported as usable.
    pub fn iova_ranges(&self) -> &[(u64, u64)] {
        self.vfio.iova_ranges()
    }
}
