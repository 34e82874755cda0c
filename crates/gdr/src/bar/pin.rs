//! Pinning EXISTING CUDA allocations for a CPU mapping, through whichever backend works here.
//!
//! [`VulkanBackend`] makes new memory that is mapped from birth; this
//! module serves memory that already exists (what gdrcopy's `gdr_pin_buffer` does). Three
//! backends, tried in this order when none is named:
//! - [`PinBackend::GdrDrv`]: gdrcopy's kernel module (`/dev/gdrdrv`), any `cuMemAlloc` range.
//! - [`PinBackend::DmaBuf`]: export the range as a dma-buf and `mmap` the fd. Needs a CUDA driver
//!   that allows mmap of its dma-bufs (13.3+ on discrete GPUs; older ones answer errno 524).
//! - [`PinBackend::Vulkan`]: for `cuMemCreate` allocations made with a POSIX-fd handle type:
//!   export the fd, import it into Vulkan's host-visible device-local memory type and
//!   `vkMapMemory` it. Whether NVIDIA allows the import is what the GPU test
//!   `vulkan_imports_cumemcreate_memory` finds out.
//!
//! Memory from gdr's allocator (`libgdr_alloc.so`, see [`super::pool`]) is pinned through the
//! allocator first, whatever the backend: it maps each of its chunks once, so such a pin costs
//! a lookup instead of an import. It reports the Vulkan backend, whose mapping it is.
//!
//! The override: [`PinBackend::from_env`] (`GDR_BACKEND=gdrdrv|dmabuf|vulkan`) or a choice
//! passed to [`Pinner::new`].
//!
//! A [`Pinned`] range is mapped with [`Pinned::map`]; the [`PinnedMapping`] holds the pin (a
//! shared reference on it), so the range stays pinned while any mapping of it lives and no
//! mapping can outlive its memory, and reads and writes go through [`crate::copy`].
//!
//! The backends themselves are in `super::backend`, below this module; this one only chooses
//! among them.

use super::backend::dmabuf::{allocation_range, DmaBuf, PeerError};
use super::backend::gdrdrv::{self, GdrDrv, GdrDrvError, PinFlags};
use super::backend::vulkan::{BarError, Imported, VulkanBackend};
use super::pool::{self, PoolPin, PoolPinError};
use crate::cuda::{self, buffer_id, vmm, Context, CudaError};
use crate::page::keep_from_fork;
use gdr_mem::{AccessError, Caching, MappedMemory};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The errno Linux returns (ENOTSUPP, kernel-internal 524) when a dma-buf exporter refuses mmap.
pub const ENOTSUPP: i32 = 524;

/// The environment variable that names a backend.
pub const BACKEND_ENV: &str = "GDR_BACKEND";

/// A way to pin existing GPU memory for a CPU mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PinBackend {
    /// gdrcopy's kernel module (`/dev/gdrdrv`): `nvidia_p2p_get_pages` and an `mmap` of the
    /// device file; pins any `cuMemAlloc` range.
    GdrDrv,
    /// `cuMemGetHandleForAddressRange` exports the range as a dma-buf, and the process `mmap`s
    /// its descriptor; needs a CUDA driver that allows that mmap.
    DmaBuf,
    /// The POSIX-fd export of a `cuMemCreate` allocation, imported into Vulkan's host-visible
    /// device-local memory type and mapped with `vkMapMemory`; pins only such allocations.
    Vulkan,
}

impl PinBackend {
    /// Every backend, in the order [`Pinner::new`] tries them when none is named.
    pub const ALL: [PinBackend; 3] = [PinBackend::GdrDrv, PinBackend::DmaBuf, PinBackend::Vulkan];

    /// The backend's name as `GDR_BACKEND` and `gdr info` spell it: `gdrdrv`, `dmabuf` or
    /// `vulkan`.
    pub fn name(self) -> &'static str {
        match self {
            PinBackend::GdrDrv => "gdrdrv",
            PinBackend::DmaBuf => "dmabuf",
            PinBackend::Vulkan => "vulkan",
        }
    }

    /// Parses a backend name (as [`name`](Self::name) spells it).
    pub fn parse(s: &str) -> Result<PinBackend, PinError> {
        Self::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| PinError::UnknownBackend(s.to_owned()))
    }

    /// The backend named by `GDR_BACKEND`, if set (`auto` or empty: none).
    pub fn from_env() -> Result<Option<PinBackend>, PinError> {
        match std::env::var(BACKEND_ENV) {
            Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("auto") => Ok(None),
            Ok(v) => Self::parse(&v).map(Some),
            Err(_) => Ok(None),
        }
    }
}

impl fmt::Display for PinBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why pinning or mapping failed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// A CUDA call failed (making the context current, the probe's allocation, the
    /// allocation's range or granularity, its BUFFER_ID).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The Vulkan backend failed to open or to map an import.
    #[error(transparent)]
    Bar(#[from] BarError),
    /// The dma-buf export failed, or the range leaves its allocation.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// gdrdrv failed to open, pin or map.
    #[error(transparent)]
    GdrDrv(#[from] GdrDrvError),
    /// A backend name that is not `gdrdrv`, `dmabuf`, `vulkan` (or `auto`, in `GDR_BACKEND`);
    /// the text is the name given.
    #[error("unknown backend {0:?} (known: gdrdrv, dmabuf, vulkan, auto)")]
    UnknownBackend(String),
    /// No backend was named and none works; the text has each backend's reason, `; `-separated.
    #[error("no pinning backend works here: {0}")]
    NoBackend(String),
    /// `mmap` of the dma-buf descriptor failed: CUDA drivers before 13.3 refuse it on discrete
    /// GPUs with [`ENOTSUPP`].
    #[error(
        "the CUDA driver refuses mmap of its dma-buf (errno {errno}{}): CPU mappings of \
         dma-bufs need CUDA driver 13.3+ on discrete GPUs; this one is {driver}",
        if *errno == ENOTSUPP { ", ENOTSUPP" } else { "" }
    )]
    MmapRefused {
        /// The errno `mmap` returned.
        errno: i32,
        /// The CUDA driver's version (`cuDriverGetVersion`), empty if unknown.
        driver: String,
    },
    /// The Vulkan backend cannot pin the range: it is not `cuMemCreate` memory made with
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, so it cannot be exported as a POSIX fd.
    #[error(
        "{addr:#x} is not a cuMemCreate allocation exportable as a POSIX fd ({why}); the Vulkan \
         backend pins only memory allocated with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR \
         (gdr::cuda::vmm::VmmBuffer)"
    )]
    NotExportable {
        /// The start of the range asked for.
        addr: u64,
        /// Whether the range is `cuMemCreate` memory (made without a POSIX-fd handle type, or
        /// whose export failed) rather than `cuMemAlloc`/`cudaMalloc` memory.
        cumemcreate: bool,
        /// The export's error, as text.
        why: String,
    },
    /// `vkAllocateMemory` with `VkImportMemoryFdInfoKHR` refused the exported allocation in
    /// the host-visible memory type.
    #[error("Vulkan refused to import the CUDA allocation into the host-visible memory type: {0}")]
    ImportRefused(BarError),
    /// [`Pinned::map`] was called while a mapping of the pin is alive.
    #[error("the pinned range is already mapped (one mapping per pin, as gdrcopy)")]
    AlreadyMapped,
    /// gdr's allocator failed to pin or map memory of its own.
    #[error(transparent)]
    Pool(#[from] PoolPinError),
    /// A range of 0 bytes was asked for; refused before any backend is called.
    #[error("nothing to pin at {addr:#x}: size 0")]
    Empty {
        /// The range's start.
        addr: u64,
    },
    /// A read or write of a [`PinnedMapping`] outside its bounds.
    #[error("pinned range: {0}")]
    Access(#[from] AccessError),
}

/// What one backend can do here, for `gdr info`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackendStatus {
    /// The backend probed.
    pub backend: PinBackend,
    /// Whether it opened and pinned, mapped and unmapped a small allocation.
    pub usable: bool,
    /// Why not, or what it found.
    pub reason: String,
}

/// Pins existing CUDA memory through one backend. Cheap to clone.
#[derive(Clone)]
pub struct Pinner {
    ctx: Context,
    imp: Imp,
    reason: String,
}

#[derive(Clone)]
enum Imp {
    GdrDrv(Arc<GdrDrv>),
    DmaBuf,
    Vulkan(VulkanBackend),
}

fn open_gdrdrv() -> Result<Arc<GdrDrv>, PinError> {
    Ok(Arc::new(GdrDrv::open()?))
}

/// Proves the dma-buf mmap path on a small allocation: export, mmap, unmap.
fn probe_dmabuf(ctx: &Context) -> Result<(), PinError> {
    let buf = cuda::DeviceBuffer::new(ctx, 1 << 16)?;
    let pinned = pin_dmabuf(ctx, cuda::DeviceMemory::device_ptr(&buf), 1 << 16)?;
    pinned.map().map(drop)
}

/// Proves the Vulkan import path on a small VMM allocation: allocate, export, import, map.
fn probe_vulkan(ctx: &Context, be: &VulkanBackend) -> Result<(), PinError> {
    let buf = vmm::VmmBuffer::new(ctx, 1)?;
    let pinned = pin_vulkan(be, cuda::DeviceMemory::device_ptr(&buf), 1)?;
    pinned.map().map(drop)
}

impl Pinner {
    /// The backend `choice`, else the one `GDR_BACKEND` names, else the first that works
    /// (gdrdrv, dmabuf, vulkan), each proven on a small allocation.
    pub fn new(ctx: &Context, choice: Option<PinBackend>) -> Result<Pinner, PinError> {
        let choice = match choice {
            Some(c) => Some(c),
            None => PinBackend::from_env()?,
        };
        if let Some(c) = choice {
            let (imp, reason) = Self::open(ctx, c)?;
            return Ok(Pinner {
                ctx: ctx.clone(),
                imp,
                reason: format!("{c} asked for: {reason}"),
            });
        }
        let mut why = Vec::new();
        for b in PinBackend::ALL {
            match Self::open(ctx, b) {
                Ok((imp, reason)) => {
                    return Ok(Pinner {
                        ctx: ctx.clone(),
                        imp,
                        reason: format!("first that works: {reason}"),
                    })
                }
                Err(e) => why.push(format!("{b}: {e}")),
            }
        }
        Err(PinError::NoBackend(why.join("; ")))
    }

    fn open(ctx: &Context, b: PinBackend) -> Result<(Imp, String), PinError> {
        match b {
            PinBackend::GdrDrv => {
                let drv = open_gdrdrv()?;
                let v = drv.version();
                Ok((
                    Imp::GdrDrv(drv),
                    format!("{} driver {}", gdrdrv::DEVICE_PATH, v.driver),
                ))
            }
            PinBackend::DmaBuf => {
                probe_dmabuf(ctx)?;
                Ok((Imp::DmaBuf, "mmap of a CUDA dma-buf works".into()))
            }
            PinBackend::Vulkan => {
                let be = VulkanBackend::new(ctx)?;
                probe_vulkan(ctx, &be)?;
                Ok((
                    Imp::Vulkan(be),
                    "Vulkan imports POSIX-fd cuMemCreate memory into a host-visible type \
                     (only such allocations can be pinned)"
                        .into(),
                ))
            }
        }
    }

    /// Every backend's status on `ctx`'s GPU (each proven or refused on a small allocation).
    pub fn probe_all(ctx: &Context) -> Vec<BackendStatus> {
        PinBackend::ALL
            .into_iter()
            .map(|b| match Self::open(ctx, b) {
                Ok((_, reason)) => BackendStatus {
                    backend: b,
                    usable: true,
                    reason,
                },
                Err(e) => BackendStatus {
                    backend: b,
                    usable: false,
                    reason: e.to_string(),
                },
            })
            .collect()
    }

    /// The backend this pinner pins through (memory of gdr's allocator is pinned through the
    /// allocator whatever it is).
    pub fn backend(&self) -> PinBackend {
        match self.imp {
            Imp::GdrDrv(_) => PinBackend::GdrDrv,
            Imp::DmaBuf => PinBackend::DmaBuf,
            Imp::Vulkan(_) => PinBackend::Vulkan,
        }
    }

    /// The open gdrdrv, when that is the backend (for its version and attributes).
    pub fn gdrdrv(&self) -> Option<&GdrDrv> {
        match &self.imp {
            Imp::GdrDrv(d) => Some(d),
            _ => None,
        }
    }

    /// Why this backend was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The CUDA context the pinner was made for; it is made current before each pin.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Pins `[addr, addr + size)` of existing CUDA memory: through gdr's allocator when the
    /// range is its memory, else through this pinner's backend.
    pub fn pin(&self, addr: u64, size: u64) -> Result<Pinned, PinError> {
        if size == 0 {
            return Err(PinError::Empty { addr });
        }
        if let Some(p) = pool::pin(addr, size)? {
            return Ok(Pinned::new(PinState {
                addr,
                size,
                start: p.base(),
                len: p.size(),
                imp: PinnedImp::Pool(p),
                mapped: AtomicBool::new(false),
            }));
        }
        self.ctx.bind()?;
        match &self.imp {
            Imp::GdrDrv(drv) => {
                let handle = drv.pin_buffer(addr, size, PinFlags::NONE)?;
                let info = match drv.get_info(handle) {
                    Ok(i) => i,
                    Err(e) => {
                        let _ = drv.unpin(handle);
                        return Err(e.into());
                    }
                };
                Ok(Pinned::new(PinState {
                    addr,
                    size,
                    start: info.va,
                    len: info.mapped_size,
                    imp: PinnedImp::GdrDrv {
                        drv: drv.clone(),
                        handle,
                    },
                    mapped: AtomicBool::new(false),
                }))
            }
            Imp::DmaBuf => pin_dmabuf(&self.ctx, addr, size),
            Imp::Vulkan(be) => pin_vulkan(be, addr, size),
        }
    }
}

fn pin_dmabuf(ctx: &Context, addr: u64, size: u64) -> Result<Pinned, PinError> {
    // Unknown (None) when CUDA will not say: the callback flag then stays 0.
    let buffer_id = buffer_id(addr).ok().flatten();
    let buf = DmaBuf::export(ctx, addr, size)?;
    Ok(Pinned::new(PinState {
        addr,
        size,
        start: buf.start(),
        len: buf.len(),
        imp: PinnedImp::DmaBuf { buf, buffer_id },
        mapped: AtomicBool::new(false),
    }))
}

fn pin_vulkan(be: &VulkanBackend, addr: u64, size: u64) -> Result<Pinned, PinError> {
    be.context().bind()?;
    let (base, alloc_size) = allocation_range(addr)?;
    // Whether the memory can be exported at all comes first: for plain cudaMalloc memory that
    // is the real cause, whatever the range (UCX pins the 64 KiB pages around a small buffer,
    // which run past a cudaMalloc allocation but not past a cuMemCreate chunk).
    let fd = vmm::export_allocation(base).map_err(|e| PinError::NotExportable {
        addr,
        cumemcreate: !matches!(e, vmm::NotExportable::NotVmm(_)),
        why: e.to_string(),
    })?;
    if addr + size > base + alloc_size {
        return Err(PeerError::OutsideAllocation {
            addr,
            size,
            base,
            alloc_size,
        }
        .into());
    }
    let buffer_id = buffer_id(addr).ok().flatten();
    let gran = vmm::granularity(be.context())? as u64;
    let import_size = alloc_size.next_multiple_of(gran);
    let imported = be
        .import_fd(fd, import_size as usize, true)
        .map_err(PinError::ImportRefused)?;
    Ok(Pinned::new(PinState {
        addr,
        size,
        start: base,
        len: imported.size() as u64,
        imp: PinnedImp::Vulkan {
            imported,
            buffer_id,
        },
        mapped: AtomicBool::new(false),
    }))
}

/// What Vulkan does with a POSIX-fd `cuMemCreate` allocation of `ctx`'s GPU: the result of
/// importing it into the host-visible device-local type and mapping it, and of importing it
/// into a device-only type (which tells "no import at all" from "no host-visible import").
#[derive(Debug, Clone, serde::Serialize)]
pub struct VulkanImportOutcome {
    /// Importing the allocation's fd into the host-visible device-local memory type; the error
    /// as text.
    pub host_visible_import: Result<(), String>,
    /// `vkMapMemory` of that import (an error saying "not imported" when the import failed).
    pub host_visible_map: Result<(), String>,
    /// Importing the same allocation into a device-local type without HOST_VISIBLE.
    pub device_only_import: Result<(), String>,
}

/// Tries the Vulkan import of CUDA VMM memory both ways (see [`VulkanImportOutcome`]).
pub fn vulkan_import_outcome(ctx: &Context) -> Result<VulkanImportOutcome, PinError> {
    let be = VulkanBackend::new(ctx)?;
    let buf = vmm::VmmBuffer::new(ctx, 1)?;
    let size = buf.alloc_size();
    let host = be.import_fd(buf.export_fd()?, size, true);
    let host_visible_map = match &host {
        Ok(imp) => imp.map().map(|_| {
            // SAFETY: mapped just now, not used.
            unsafe { imp.unmap() }
        }),
        Err(_) => Err(BarError::BadLayout("not imported".into())),
    }
    .map_err(|e| e.to_string());
    let device_only_import = be
        .import_fd(buf.export_fd()?, size, false)
        .map(drop)
        .map_err(|e| e.to_string());
    Ok(VulkanImportOutcome {
        host_visible_import: host.map(drop).map_err(|e| e.to_string()),
        host_visible_map,
        device_only_import,
    })
}

/// A pinned range of existing GPU memory. Unpinned when it and its mapping (which holds it)
/// are both dropped.
pub struct Pinned {
    state: Arc<PinState>,
}

/// What a [`Pinned`] and its [`PinnedMapping`] share; unpins on drop, so after the last of
/// them goes.
struct PinState {
    addr: u64,
    size: u64,
    start: u64,
    len: u64,
    imp: PinnedImp,
    mapped: AtomicBool,
}

enum PinnedImp {
    GdrDrv {
        drv: Arc<GdrDrv>,
        handle: gdrdrv::Handle,
    },
    /// `buffer_id`: CUDA's BUFFER_ID of the allocation when pinned (a different one later
    /// means the application freed it while pinned).
    DmaBuf { buf: DmaBuf, buffer_id: Option<u64> },
    Vulkan {
        imported: Imported,
        buffer_id: Option<u64>,
    },
    /// Memory of gdr's allocator, mapped by it.
    Pool(PoolPin),
}

impl Pinned {
    fn new(state: PinState) -> Pinned {
        Pinned {
            state: Arc::new(state),
        }
    }

    /// The caller's address: the start of the range asked for.
    pub fn addr(&self) -> u64 {
        self.state.addr
    }
    /// The caller's size in bytes, as asked for.
    pub fn size(&self) -> u64 {
        self.state.size
    }
    /// GPU virtual address where the pinned (rounded) range starts.
    pub fn start(&self) -> u64 {
        self.state.start
    }
    /// Bytes pinned.
    pub fn pinned_len(&self) -> u64 {
        self.state.len
    }

    /// The backend that pinned the range ([`PinBackend::Vulkan`] for memory of gdr's
    /// allocator, whose chunk mapping is Vulkan's).
    pub fn backend(&self) -> PinBackend {
        match self.state.imp {
            PinnedImp::GdrDrv { .. } => PinBackend::GdrDrv,
            PinnedImp::DmaBuf { .. } => PinBackend::DmaBuf,
            PinnedImp::Vulkan { .. } | PinnedImp::Pool(_) => PinBackend::Vulkan,
        }
    }

    /// Whether the pin went through gdr's allocator (its memory, its chunk's mapping).
    pub fn is_pooled(&self) -> bool {
        matches!(self.state.imp, PinnedImp::Pool(_))
    }

    /// Whether the application freed the pinned memory while pinned (what gdrcopy's callback
    /// flag reports). gdrdrv says so itself and then revokes the memory; the other backends
    /// keep the memory alive until unpin and tell by the allocation's BUFFER_ID (no allocation
    /// at the address any more, or another one), or, for allocator memory, by asking the
    /// allocator.
    pub fn callback_fired(&self) -> Result<bool, PinError> {
        let pinned_id = match &self.state.imp {
            PinnedImp::GdrDrv { drv, handle } => return Ok(drv.get_callback_flag(*handle)?),
            PinnedImp::Pool(p) => return Ok(p.freed()?),
            PinnedImp::DmaBuf { buffer_id, .. } | PinnedImp::Vulkan { buffer_id, .. } => *buffer_id,
        };
        Ok(pinned_id.is_some() && buffer_id(self.state.addr)? != pinned_id)
    }

    /// Maps the whole pinned range for the CPU. The mapping holds the pin: the range stays
    /// pinned until both are dropped, in either order.
    pub fn map(&self) -> Result<PinnedMapping, PinError> {
        if self.state.mapped.swap(true, Ordering::AcqRel) {
            return Err(PinError::AlreadyMapped);
        }
        self.map_once()
            .inspect_err(|_| self.state.mapped.store(false, Ordering::Release))
    }

    /// Whether a mapping of this pin is alive.
    pub fn is_mapped(&self) -> bool {
        self.state.mapped.load(Ordering::Acquire)
    }

    fn map_once(&self) -> Result<PinnedMapping, PinError> {
        let state = &self.state;
        let map_len = state.len as usize;
        let (base, imp) = match &state.imp {
            PinnedImp::GdrDrv { drv, handle } => {
                // SAFETY: the mapping is kept in a PinnedMapping that holds this pin's state,
                // which unpins only in its own drop, after the mapping is unmapped.
                let m = unsafe { drv.map(*handle, map_len)? };
                let (ptr, len) = m.into_raw();
                keep_from_fork(ptr.as_ptr(), map_len);
                (
                    ptr.as_ptr(),
                    MapImp::GdrDrv {
                        drv: drv.clone(),
                        ptr,
                        len,
                    },
                )
            }
            PinnedImp::DmaBuf { buf, .. } => {
                // SAFETY: a fresh shared mapping at an address the kernel picks cannot overlap
                // memory Rust already uses.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        map_len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        std::os::fd::AsRawFd::as_raw_fd(&buf.fd()),
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    let driver = cuda::driver()
                        .map(|d| d.version_string())
                        .unwrap_or_default();
                    return Err(PinError::MmapRefused { errno, driver });
                }
                keep_from_fork(p.cast(), map_len);
                let p = NonNull::new(p.cast::<u8>()).ok_or(PinError::MmapRefused {
                    errno: libc::EFAULT,
                    driver: String::new(),
                })?;
                (
                    p.as_ptr(),
                    MapImp::Mmap {
                        ptr: p,
                        len: map_len,
                    },
                )
            }
            PinnedImp::Vulkan { imported, .. } => (imported.map()?, MapImp::OfPin),
            // The allocator keeps the chunk mapped while the pin lives; the pin's pages are
            // opened for as long as this mapping lives.
            PinnedImp::Pool(p) => {
                p.map()?;
                (p.cpu(), MapImp::OfPin)
            }
        };
        // SAFETY: the caller's address lies in the pinned range, which the mapping covers whole.
        let host = unsafe { base.add((state.addr - state.start) as usize) };
        Ok(PinnedMapping {
            pinned: Pinned {
                state: state.clone(),
            },
            host,
            imp,
        })
    }
}

impl Drop for PinState {
    fn drop(&mut self) {
        if let PinnedImp::GdrDrv { drv, handle } = &self.imp {
            let _ = drv.unpin(*handle);
        }
        // A DmaBuf closes its fd, an Imported frees its Vulkan memory, a PoolPin unpins, on
        // their own drops.
    }
}

impl fmt::Debug for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned")
            .field("backend", &self.backend())
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("size", &self.size())
            .field("start", &format_args!("{:#x}", self.start()))
            .field("pinned_len", &self.pinned_len())
            .finish()
    }
}

/// What unmapping a [`PinnedMapping`] takes beyond its pin.
enum MapImp {
    /// gdrdrv's mapping of the handle (given up by its borrowing guard, which cannot live next
    /// to the pin it borrows from), unmapped through the driver's file.
    GdrDrv {
        drv: Arc<GdrDrv>,
        ptr: NonNull<u8>,
        len: usize,
    },
    /// An `mmap` of the dma-buf's descriptor.
    Mmap { ptr: NonNull<u8>, len: usize },
    /// The pin's own mapping, opened for this mapping and closed through the pin: Vulkan's
    /// `vkMapMemory` of the import, or the allocator's mapping of its chunk.
    OfPin,
}

/// A CPU mapping of a [`Pinned`] range; offsets are relative to the caller's address. Unmapped
/// on drop. It holds the pin, so the memory stays pinned while the mapping lives.
pub struct PinnedMapping {
    pinned: Pinned,
    /// CPU address of the caller's first byte.
    host: *mut u8,
    imp: MapImp,
}

// SAFETY: the mapping is of device memory reached only through the copy routines; the pin it
// holds is Send + Sync.
unsafe impl Send for PinnedMapping {}
// SAFETY: as above; through `&PinnedMapping` its fields are only read (unmapping needs the
// value itself, in drop), and the bytes behind the pointer are device memory that the copy
// routines reach, never a Rust reference.
unsafe impl Sync for PinnedMapping {}

impl PinnedMapping {
    /// The pin this mapping holds (its addresses, backend, callback flag).
    pub fn pinned(&self) -> &Pinned {
        &self.pinned
    }

    /// The caller's size.
    pub fn len(&self) -> usize {
        self.pinned.size() as usize
    }

    /// Whether the caller's size is 0; never true, since pins of 0 bytes are refused.
    pub fn is_empty(&self) -> bool {
        self.pinned.size() == 0
    }

    /// CPU address of the caller's first byte; valid while the mapping lives.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// CPU address of the first pinned byte (`host_ptr() - (addr - start)`).
    pub fn base_ptr(&self) -> *mut u8 {
        self.host
            .wrapping_sub((self.pinned.addr() - self.pinned.start()) as usize)
    }

    /// Bytes mapped (the whole pinned range).
    pub fn mapped_len(&self) -> usize {
        self.pinned.pinned_len() as usize
    }

    /// Writes `src` at `offset` through the mapping (stream stores and a store fence).
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), PinError> {
        Ok(self.write_at(offset, src)?)
    }

    /// Reads `dst.len()` bytes at `offset` through the mapping (stream loads).
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), PinError> {
        Ok(self.read_at(offset, dst)?)
    }
}

// SAFETY: host..host+len lies inside the live page-granular mapping of the pinned range (so the
// lines around it are readable) until drop; offsets are the caller's, as gdrcopy's.
unsafe impl MappedMemory for PinnedMapping {
    #[inline]
    fn cpu_ptr(&self) -> *mut u8 {
        self.host
    }
    #[inline]
    fn size(&self) -> usize {
        self.len()
    }
    #[inline]
    fn caching(&self) -> Caching {
        Caching::WriteCombined
    }
}

impl Drop for PinnedMapping {
    fn drop(&mut self) {
        let state = &self.pinned.state;
        match &self.imp {
            MapImp::GdrDrv { drv, ptr, len } => {
                // SAFETY: ptr/len are the mapping gdrdrv made for this value (given up by its
                // guard in map_once), unused from now on; the handle is still pinned, since the
                // pin's state, held here, unpins only after this.
                let _ = unsafe { gdrdrv::DeviceFile::munmap(drv.file(), *ptr, *len) };
            }
            MapImp::Mmap { ptr, len } => {
                // SAFETY: our own live mapping, unused from now on.
                unsafe { libc::munmap(ptr.as_ptr().cast(), *len) };
            }
            MapImp::OfPin => match &state.imp {
                PinnedImp::Vulkan { imported, .. } => {
                    // SAFETY: mapped by Pinned::map for this value; unused from now on.
                    unsafe { imported.unmap() };
                }
                PinnedImp::Pool(p) => {
                    let _ = p.unmap();
                }
                PinnedImp::GdrDrv { .. } | PinnedImp::DmaBuf { .. } => {}
            },
        }
        state.mapped.store(false, Ordering::Release);
        // The pin itself goes with the last of this mapping and its Pinned.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_mappings_cross_threads() {
        // libgdrapi's table and the Python package share both between threads.
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Pinned>();
        send_sync::<PinnedMapping>();
    }

    #[test]
    fn backend_names_round_trip() {
        for b in PinBackend::ALL {
            assert_eq!(PinBackend::parse(b.name()).unwrap(), b);
        }
        assert_eq!(PinBackend::parse(" DMABUF ").unwrap(), PinBackend::DmaBuf);
        assert!(matches!(
            PinBackend::parse("nvidia-peermem"),
            Err(PinError::UnknownBackend(_))
        ));
    }

    #[test]
    fn mmap_refusal_names_the_driver_requirement() {
        let e = PinError::MmapRefused {
            errno: ENOTSUPP,
            driver: "13.0".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("524") && s.contains("ENOTSUPP") && s.contains("13.3"),
            "{s}"
        );
    }
}
