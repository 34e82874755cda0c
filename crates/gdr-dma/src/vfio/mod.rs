//! VFIO: user-space access to a PCI device behind the IOMMU. A [`Vfio`] is one type1 container
//! (one IOMMU address space); devices are opened into it by PCI address through their IOMMU
//! group, and [`Vfio::iommu_space`] hands out the address space that all of them share, so a
//! DMA engine can reach another device's BAR (peer memory) mapped into it.

mod device;
mod uapi;

pub use device::{MappedBar, VfioDevice, VfioIrq, VfioRegion};

use crate::error::{DmaError, Result};
use crate::iommu::{IommuBackend, IommuSpace};
use crate::pci::{self, Bdf, Sysfs};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Runs an ioctl whose argument is a pointer (or an integer) and turns -1 into an error.
///
/// # Safety
/// `arg` must be what the ioctl `req` expects on `fd`: a pointer to a live, correctly sized
/// structure (with `argsz` filled in) or a plain integer.
pub(crate) unsafe fn ioctl(fd: RawFd, req: u64, arg: u64, op: &str) -> Result<i32> {
    // SAFETY: the caller guarantees (this function's contract) that `arg` is what `req` expects
    // on `fd`, a live, correctly sized structure or a plain integer; ioctl needs nothing else.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(DmaError::last_os(op))
    } else {
        Ok(r)
    }
}

fn open_path(path: &str) -> Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| DmaError::Invalid(path.into()))?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(DmaError::last_os(format!("open {path}")));
    }
    // SAFETY: `fd` was just returned by open (checked non-negative above) and nothing else owns
    // or closes it, so the OwnedFd becomes its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The container: the IOMMU backend shared by every device opened through this [`Vfio`].
pub(crate) struct Container {
    fd: OwnedFd,
    page: u64,
}

impl IommuBackend for Container {
    fn page_size(&self) -> u64 {
        self.page
    }

    fn map(&self, vaddr: usize, iova: u64, len: u64) -> Result<()> {
        let m = uapi::DmaMap {
            argsz: std::mem::size_of::<uapi::DmaMap>() as u32,
            flags: uapi::DMA_MAP_FLAG_READ | uapi::DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size: len,
        };
        // SAFETY: a live, fully initialised vfio_iommu_type1_dma_map.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::IOMMU_MAP_DMA,
                &m as *const _ as u64,
                &format!("VFIO_IOMMU_MAP_DMA iova {iova:#x} len {len:#x}"),
            )
        }?;
        Ok(())
    }

    fn unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut u = uapi::DmaUnmap {
            argsz: std::mem::size_of::<uapi::DmaUnmap>() as u32,
            flags: 0,
            iova,
            size: len,
        };
        // SAFETY: a live vfio_iommu_type1_dma_unmap; the kernel writes back `size`.
        unsafe {
            ioctl(
                self.fd.as_raw_fd(),
                uapi::IOMMU_UNMAP_DMA,
                &mut u as *mut _ as u64,
                "VFIO_IOMMU_UNMAP_DMA",
            )
        }?;
        Ok(())
    }
}

/// One VFIO container and the groups attached to it.
pub struct Vfio {
    sysfs: Sysfs,
    container: Option<(OwnedFd, bool)>,
    groups: HashMap<u32, Arc<OwnedFd>>,
    backend: Option<Arc<Container>>,
    iova_ranges: Vec<(u64, u64)>,
}

impl Default for Vfio {
    fn default() -> Self {
        Vfio::new()
    }
}

impl Vfio {
    /// A VFIO context on the real sysfs; nothing is opened until the first device.
    pub fn new() -> Self {
        Vfio::with_sysfs(Sysfs::default())
    }

    /// A VFIO context that looks devices up in `sysfs` (a fake tree in tests).
    pub fn with_sysfs(sysfs: Sysfs) -> Self {
        Vfio {
            sysfs,
            container: None,
            groups: HashMap::new(),
            backend: None,
            iova_ranges: Vec::new(),
        }
    }

    /// The sysfs tree devices are looked up in.
    pub fn sysfs(&self) -> &Sysfs {
        &self.sysfs
    }

    fn container_fd(&mut self) -> Result<RawFd> {
        if let Some((fd, _)) = &self.container {
            return Ok(fd.as_raw_fd());
        }
        if !std::path::Path::new("/dev/vfio/vfio").exists() {
            return Err(DmaError::NoVfio);
        }
        let fd = open_path("/dev/vfio/vfio")?;
        // SAFETY: GET_API_VERSION takes no argument.
        let v = unsafe {
            ioctl(
                fd.as_raw_fd(),
                uapi::GET_API_VERSION,
                0,
                "VFIO_GET_API_VERSION",
            )
        }?;
        if v != uapi::API_VERSION {
            return Err(DmaError::Unsupported(format!(
                "API version 0 (kernel has {v})"
            )));
        }
        let raw = fd.as_raw_fd();
        self.container = Some((fd, false));
        Ok(raw)
    }

    /// Opens `addr` after checking sysfs (exists, IOMMU group, bound to vfio-pci), attaching
    /// its group to this container and, for the first group, choosing the type1 IOMMU.
    pub fn open_device(&mut self, addr: &Bdf) -> Result<VfioDevice> {
        let (info, group) = pci::check_vfio_ready(&self.sysfs, addr)?;
        let cfd = self.container_fd()?;
        let gfd = match self.groups.get(&group) {
            Some(g) => g.clone(),
            None => {
                let path = format!("/dev/vfio/{group}");
                if !std::path::Path::new(&path).exists() {
                    return Err(DmaError::NoVfio);
                }
                let g = open_path(&path)?;
                let mut st = uapi::GroupStatus {
                    argsz: std::mem::size_of::<uapi::GroupStatus>() as u32,
                    flags: 0,
                };
                // SAFETY: a live vfio_group_status with argsz set.
                unsafe {
                    ioctl(
                        g.as_raw_fd(),
                        uapi::GROUP_GET_STATUS,
                        &mut st as *mut _ as u64,
                        "VFIO_GROUP_GET_STATUS",
                    )
                }?;
                if st.flags & uapi::GROUP_FLAGS_VIABLE == 0 {
                    let members = self
                        .sysfs
                        .iommu_group_members(group)
                        .unwrap_or_default()
                        .iter()
                        .map(|(a, d)| format!("{a}: {}", d.as_deref().unwrap_or("no driver")))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(DmaError::GroupNotViable { group, members });
                }
                let cfd_int: i32 = cfd;
                // SAFETY: the argument is a pointer to an int holding the container fd.
                unsafe {
                    ioctl(
                        g.as_raw_fd(),
                        uapi::GROUP_SET_CONTAINER,
                        &cfd_int as *const i32 as u64,
                        "VFIO_GROUP_SET_CONTAINER",
                    )
                }?;
                let g = Arc::new(g);
                self.groups.insert(group, g.clone());
                self.ensure_iommu()?;
                g
            }
        };
        let name = CString::new(addr.to_string()).expect("a printed PCI address holds no NUL");
        // SAFETY: the argument is a NUL-terminated device name.
        let dfd = unsafe {
            ioctl(
                gfd.as_raw_fd(),
                uapi::GROUP_GET_DEVICE_FD,
                name.as_ptr() as u64,
                "VFIO_GROUP_GET_DEVICE_FD",
            )
        }?;
        // SAFETY: GROUP_GET_DEVICE_FD returned a new descriptor (`ioctl` turned a negative
        // return into an error) that nothing else owns, so the OwnedFd becomes its only owner.
        let dfd = unsafe { OwnedFd::from_raw_fd(dfd) };
        VfioDevice::new(dfd, info, gfd)
    }

    fn ensure_iommu(&mut self) -> Result<()> {
        let Some((fd, set)) = &mut self.container else {
            return Err(DmaError::NoVfio);
        };
        if *set {
            return Ok(());
        }
        let raw = fd.as_raw_fd();
        let kind = [uapi::TYPE1V2_IOMMU, uapi::TYPE1_IOMMU]
            .into_iter()
            .find(|&t| {
                // SAFETY: `raw` is the open container fd, and CHECK_EXTENSION takes the
                // extension number as a plain integer, no pointer.
                unsafe { ioctl(raw, uapi::CHECK_EXTENSION, t, "VFIO_CHECK_EXTENSION") }
                    .is_ok_and(|r| r > 0)
            })
            .ok_or_else(|| DmaError::Unsupported("the type1 IOMMU backend".into()))?;
        // SAFETY: SET_IOMMU takes an integer (the IOMMU type).
        unsafe { ioctl(raw, uapi::SET_IOMMU, kind, "VFIO_SET_IOMMU") }?;
        *set = true;
        let (page, ranges) = iommu_info(raw)?;
        self.iova_ranges = ranges;
        self.backend = Some(Arc::new(Container {
            fd: fd
                .try_clone()
                .map_err(|e| DmaError::io("dup container fd", e))?,
            page,
        }));
        Ok(())
    }

    /// The IOVA ranges the IOMMU accepts (empty when the kernel does not say).
    pub fn iova_ranges(&self) -> &[(u64, u64)] {
        &self.iova_ranges
    }

    /// The address space of this container, allocating IOVAs in `[base, limit)` narrowed to the
    /// first usable range the IOMMU reports there. Needs at least one opened device.
    pub fn iommu_space(&self, base: u64, limit: u64) -> Result<IommuSpace> {
        let backend = self.backend.clone().ok_or_else(|| {
            DmaError::Invalid("open a device before asking for its IOMMU space".into())
        })?;
        let (mut b, mut l) = (base, limit);
        if !self.iova_ranges.is_empty() {
            let hit = self
                .iova_ranges
                .iter()
                .map(|&(s, e)| (s.max(base), e.saturating_add(1).min(limit)))
                .find(|(s, e)| s < e)
                .ok_or_else(|| {
                    DmaError::Unsupported(format!("usable IOVAs in {base:#x}..{limit:#x}"))
                })?;
            b = crate::memory::align_up(hit.0, backend.page).unwrap_or(hit.0);
            l = hit.1;
        }
        IommuSpace::new(backend, b, l)
    }
}

/// Page size and usable IOVA ranges from VFIO_IOMMU_GET_INFO.
fn iommu_info(fd: RawFd) -> Result<(u64, Vec<(u64, u64)>)> {
    // Ask with a buffer large enough for the capability chain.
    let mut buf = vec![0u64; 512];
    let hdr = std::mem::size_of::<uapi::IommuInfo>();
    // SAFETY: buf is 4 KiB and 8-byte aligned, large enough for the header.
    unsafe {
        let info = buf.as_mut_ptr().cast::<uapi::IommuInfo>();
        (*info).argsz = (buf.len() * 8) as u32;
        ioctl(fd, uapi::IOMMU_GET_INFO, info as u64, "VFIO_IOMMU_GET_INFO")?;
    }
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let flags = u32_at(4).unwrap_or(0);
    let pgsizes = u64_at(8).unwrap_or(0);
    let page = if flags & uapi::IOMMU_INFO_PGSIZES != 0 && pgsizes != 0 {
        1u64 << pgsizes.trailing_zeros()
    } else {
        crate::memory::page_size()
    };
    let mut ranges = Vec::new();
    if flags & uapi::IOMMU_INFO_CAPS != 0 {
        let mut off = u32_at(16).unwrap_or(0) as usize;
        let mut hops = 0;
        while off >= hdr && off < bytes.len() && hops < 16 {
            hops += 1;
            let id = u32_at(off).unwrap_or(0) as u16;
            let next = u32_at(off + 4).unwrap_or(0) as usize;
            if id == uapi::IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
                let n = u32_at(off + 8).unwrap_or(0) as usize;
                for i in 0..n.min(64) {
                    let at = off + 16 + i * 16;
                    if let (Some(s), Some(e)) = (u64_at(at), u64_at(at + 8)) {
                        ranges.push((s, e));
                    }
                }
            }
            if next == 0 {
                break;
            }
            off = next;
        }
    }
    Ok((page, ranges))
}
