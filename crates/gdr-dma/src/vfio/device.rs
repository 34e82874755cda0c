//! One VFIO device: its regions (BARs, config space), BAR mappings and interrupts.

use super::{ioctl, uapi};
use crate::error::{DmaError, Result};
use crate::irq::{EventFd, Interrupt};
use crate::memory::{Caching, MappedMemory};
use crate::pci::PciInfo;
use crate::regs::{Mmio, RegisterIo};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// A region of the device as VFIO describes it.
#[derive(Clone, Copy, Debug)]
pub struct VfioRegion {
    /// VFIO's region index: BAR0-5 are 0-5, the ROM 6, config space 7.
    pub index: u32,
    /// Bytes in the region (0 for an unimplemented BAR).
    pub size: u64,
    /// Offset of the region in the device file (for pread/pwrite/mmap).
    pub offset: u64,
    /// `VFIO_REGION_INFO_FLAG_*`: readable (1), writable (2), mmap-able (4).
    pub flags: u32,
}

impl VfioRegion {
    /// Whether the region can be mapped into the process (memory BARs can, I/O BARs cannot).
    pub fn mappable(&self) -> bool {
        self.flags & uapi::REGION_INFO_FLAG_MMAP != 0
    }
}

/// An open VFIO device.
pub struct VfioDevice {
    fd: Arc<OwnedFd>,
    info: PciInfo,
    num_regions: u32,
    num_irqs: u32,
    can_reset: bool,
    // Keeps the group open for as long as the device is.
    _group: Arc<OwnedFd>,
}

/// PCI config space offsets and bits we touch.
const PCI_COMMAND: u64 = 0x04;
const PCI_COMMAND_MEMORY: u16 = 0x2;
const PCI_COMMAND_MASTER: u16 = 0x4;

impl VfioDevice {
    pub(super) fn new(fd: OwnedFd, info: PciInfo, group: Arc<OwnedFd>) -> Result<Self> {
        let mut di = uapi::DeviceInfo {
            argsz: std::mem::size_of::<uapi::DeviceInfo>() as u32,
            ..Default::default()
        };
        // SAFETY: a live vfio_device_info with argsz set.
        unsafe {
            ioctl(
                fd.as_raw_fd(),
                uapi::DEVICE_GET_INFO,
                &mut di as *mut _ as u64,
                "VFIO_DEVICE_GET_INFO",
            )
        }?;
        if di.flags & uapi::DEVICE_FLAGS_PCI == 0 {
            return Err(DmaError::Unsupported(format!(
                "{} is not a PCI device",
                info.bdf
            )));
        }
        Ok(VfioDevice {
            fd: Arc::new(fd),
            info,
            num_regions: di.num_regions,
            num_irqs: di.num_irqs,
            can_reset: di.flags & uapi::DEVICE_FLAGS_RESET != 0,
            _group: group,
        })
    }

    /// IDs, driver and group from sysfs.
    pub fn info(&self) -> &PciInfo {
        &self.info
    }

    /// How many regions VFIO describes for the device (9 or more for PCI: BARs, ROM, config).
    pub fn num_regions(&self) -> u32 {
        self.num_regions
    }

    /// How many interrupt indices VFIO offers (INTx, MSI, MSI-X, ...).
    pub fn num_irqs(&self) -> u32 {
        self.num_irqs
    }

    fn region_err(&self, index: u32, why: impl Into<String>) -> DmaError {
        DmaError::Region {
            addr: self.info.bdf.to_string(),
            index,
            why: why.into(),
        }
    }

    /// Describes region `index` (BAR0..5 = 0..5, ROM 6, config 7).
    pub fn region(&self, index: u32) -> Result<VfioRegion> {
        if index >= self.num_regions {
            return Err(self.region_err(index, "no such region"));
        }
        let mut ri = uapi::RegionInfo {
            argsz: std::mem::size_of::<uapi::RegionInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: a live vfio_region_info with argsz and index set.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::DEVICE_GET_REGION_INFO,
                &mut ri as *mut _ as u64,
                "VFIO_DEVICE_GET_REGION_INFO",
            )
        }?;
        Ok(VfioRegion {
            index,
            size: ri.size,
            offset: ri.offset,
            flags: ri.flags,
        })
    }

    /// The sizes of BAR0..BAR5 (0 where a BAR is unused).
    pub fn bar_sizes(&self) -> Vec<u64> {
        (0..6)
            .map(|i| self.region(i).map(|r| r.size).unwrap_or(0))
            .collect()
    }

    /// Maps BAR `index` into this process.
    pub fn map_bar(&self, index: u32) -> Result<MappedBar> {
        if index > 5 {
            return Err(self.region_err(index, "not a BAR"));
        }
        let r = self.region(index)?;
        if r.size == 0 {
            return Err(self.region_err(index, "BAR not implemented"));
        }
        if !r.mappable() {
            return Err(self.region_err(index, "BAR cannot be mmapped (I/O port BAR?)"));
        }
        // SAFETY: maps `size` bytes of the device file at the region's offset; shared so the
        // CPU's accesses reach the device. The result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                r.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                r.offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DmaError::last_os(format!(
                "mmap BAR{index} of {} ({} bytes)",
                self.info.bdf, r.size
            )));
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| self.region_err(index, "mmap gave NULL"))?;
        // SAFETY: the mapping lives until `MappedBar` is dropped, which munmaps it.
        let mmio = unsafe { Mmio::new(ptr, r.size) };
        Ok(MappedBar {
            ptr,
            len: r.size as usize,
            index,
            mmio,
        })
    }

    /// Reads `out.len()` bytes of config space at `offset`.
    pub fn config_read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let r = self.region(uapi::PCI_CONFIG_REGION_INDEX)?;
        if offset + out.len() as u64 > r.size {
            return Err(
                self.region_err(r.index, format!("config read at {offset:#x} past the end"))
            );
        }
        // SAFETY: reads into a live buffer of exactly out.len() bytes.
        let n = unsafe {
            libc::pread(
                self.fd.as_raw_fd(),
                out.as_mut_ptr().cast(),
                out.len(),
                (r.offset + offset) as libc::off_t,
            )
        };
        if n != out.len() as isize {
            return Err(DmaError::last_os(format!("config read at {offset:#x}")));
        }
        Ok(())
    }

    /// Writes `data` to config space at `offset`.
    pub fn config_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let r = self.region(uapi::PCI_CONFIG_REGION_INDEX)?;
        if offset + data.len() as u64 > r.size {
            return Err(
                self.region_err(r.index, format!("config write at {offset:#x} past the end"))
            );
        }
        // SAFETY: writes from a live buffer of exactly data.len() bytes.
        let n = unsafe {
            libc::pwrite(
                self.fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                (r.offset + offset) as libc::off_t,
            )
        };
        if n != data.len() as isize {
            return Err(DmaError::last_os(format!("config write at {offset:#x}")));
        }
        Ok(())
    }

    /// Reads the little-endian 16-bit config register at `offset`.
    pub fn config_read16(&self, offset: u64) -> Result<u16> {
        let mut b = [0u8; 2];
        self.config_read(offset, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Writes `v` to the 16-bit config register at `offset`, little-endian.
    pub fn config_write16(&self, offset: u64, v: u16) -> Result<()> {
        self.config_write(offset, &v.to_le_bytes())
    }

    /// Reads the little-endian 32-bit config register at `offset`.
    pub fn config_read32(&self, offset: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.config_read(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Turns on memory decoding and bus mastering: without the latter the device's DMA is
    /// dropped by the root complex.
    pub fn enable_bus_master(&self) -> Result<()> {
        let cmd = self.config_read16(PCI_COMMAND)?;
        let want = cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        if want != cmd {
            self.config_write16(PCI_COMMAND, want)?;
        }
        let back = self.config_read16(PCI_COMMAND)?;
        if back & PCI_COMMAND_MASTER == 0 {
            return Err(
                self.region_err(uapi::PCI_CONFIG_REGION_INDEX, "bus mastering did not stick")
            );
        }
        Ok(())
    }

    /// Resets the device if VFIO offers a reset method.
    pub fn reset(&self) -> Result<bool> {
        if !self.can_reset {
            return Ok(false);
        }
        // SAFETY: DEVICE_RESET takes no argument.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::DEVICE_RESET,
                0,
                "VFIO_DEVICE_RESET",
            )
        }?;
        Ok(true)
    }

    /// Number of vectors of an interrupt index (0 INTx, 1 MSI, 2 MSI-X).
    pub fn irq_count(&self, index: u32) -> Result<u32> {
        if index >= self.num_irqs {
            return Ok(0);
        }
        let mut ii = uapi::IrqInfo {
            argsz: std::mem::size_of::<uapi::IrqInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: a live vfio_irq_info with argsz and index set.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::DEVICE_GET_IRQ_INFO,
                &mut ii as *mut _ as u64,
                "VFIO_DEVICE_GET_IRQ_INFO",
            )
        }?;
        Ok(if ii.flags & uapi::IRQ_INFO_EVENTFD != 0 {
            ii.count
        } else {
            0
        })
    }

    /// Routes vector 0 of MSI (preferred) or INTx to a fresh eventfd.
    pub fn enable_irq(&self) -> Result<VfioIrq> {
        let index = if self.irq_count(uapi::PCI_MSI_IRQ_INDEX)? > 0 {
            uapi::PCI_MSI_IRQ_INDEX
        } else if self.irq_count(uapi::PCI_INTX_IRQ_INDEX)? > 0 {
            uapi::PCI_INTX_IRQ_INDEX
        } else {
            return Err(DmaError::Unsupported(format!(
                "interrupts on {} (no MSI or INTx)",
                self.info.bdf
            )));
        };
        let ev = EventFd::new()?;
        let set = uapi::IrqSetOne {
            argsz: std::mem::size_of::<uapi::IrqSetOne>() as u32,
            flags: uapi::IRQ_SET_DATA_EVENTFD | uapi::IRQ_SET_ACTION_TRIGGER,
            index,
            start: 0,
            count: 1,
            fd: ev.raw_fd(),
        };
        // SAFETY: a live vfio_irq_set with one eventfd of data.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::DEVICE_SET_IRQS,
                &set as *const _ as u64,
                "VFIO_DEVICE_SET_IRQS (enable)",
            )
        }?;
        Ok(VfioIrq {
            dev: self.fd.clone(),
            index,
            ev,
        })
    }
}

/// A device interrupt delivered to an eventfd; disabled again on drop.
pub struct VfioIrq {
    dev: Arc<OwnedFd>,
    index: u32,
    ev: EventFd,
}

impl VfioIrq {
    /// True for MSI, false for INTx.
    pub fn is_msi(&self) -> bool {
        self.index == uapi::PCI_MSI_IRQ_INDEX
    }

    fn set_irqs(&self, flags: u32, count: u32, op: &str) -> Result<()> {
        let set = uapi::IrqSetOne {
            argsz: 20,
            flags,
            index: self.index,
            start: 0,
            count,
            fd: -1,
        };
        // SAFETY: a live vfio_irq_set header (argsz 20: no data follows).
        unsafe {
            ioctl(
                self.dev.as_raw_fd(),
                uapi::DEVICE_SET_IRQS,
                &set as *const _ as u64,
                op,
            )
        }?;
        Ok(())
    }
}

impl Interrupt for VfioIrq {
    fn wait(&mut self, timeout: Duration) -> Result<bool> {
        self.ev.wait(timeout)
    }

    fn rearm(&mut self) -> Result<()> {
        if self.index == uapi::PCI_INTX_IRQ_INDEX {
            // VFIO masks INTx when it fires; unmask once the device has been acknowledged.
            self.set_irqs(
                uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_UNMASK,
                1,
                "VFIO_DEVICE_SET_IRQS (unmask)",
            )?;
        }
        Ok(())
    }
}

impl Drop for VfioIrq {
    fn drop(&mut self) {
        let _ = self.set_irqs(
            uapi::IRQ_SET_DATA_NONE | uapi::IRQ_SET_ACTION_TRIGGER,
            0,
            "VFIO_DEVICE_SET_IRQS (disable)",
        );
    }
}

/// A BAR mapped into this process: registers (via [`RegisterIo`]) or memory (via
/// [`MappedMemory`], e.g. to map it into an IOMMU as peer memory). Unmapped on drop.
pub struct MappedBar {
    ptr: NonNull<u8>,
    len: usize,
    index: u32,
    mmio: Mmio,
}

// SAFETY: the mapping is owned by this value and only reached through volatile accesses or
// explicit copies; it does not depend on the creating thread.
unsafe impl Send for MappedBar {}
// SAFETY: as above; shared references only allow copies and single register accesses.
unsafe impl Sync for MappedBar {}

impl MappedBar {
    /// Which BAR (0-5) this is.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl Drop for MappedBar {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map_bar`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl RegisterIo for MappedBar {
    fn len(&self) -> u64 {
        self.mmio.len()
    }
    fn read32(&self, offset: u64) -> u32 {
        self.mmio.read32(offset)
    }
    fn write32(&self, offset: u64, value: u32) {
        self.mmio.write32(offset, value)
    }
    fn read64(&self, offset: u64) -> u64 {
        self.mmio.read64(offset)
    }
    fn write64(&self, offset: u64, value: u64) {
        self.mmio.write64(offset, value)
    }
}

// SAFETY: the mapping lives, at a fixed address, until drop, and is only reached through copies
// and volatile register accesses. VFIO maps BARs uncached.
unsafe impl MappedMemory for MappedBar {
    fn cpu_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        self.len
    }
    fn caching(&self) -> Caching {
        Caching::Uncached
    }
}
