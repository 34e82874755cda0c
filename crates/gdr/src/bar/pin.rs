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
//! The backends themselves are in `super::backend`, below this module. Each one pins through
//! one file under `pin/`, which implements [`Backend`] (open, pin) and [`BackendPin`] (map,
//! unmap, unpin on drop) for it: `gdrdrv`, `dmabuf`, `vulkan`, and `pooled` for the
//! allocator's memory. This file keeps the public types, the choice among the backends (their
//! registration: a [`PinBackend`] variant, its name, its place in [`PinBackend::ALL`] and its
//! arm in `Pinner::open`) and the checks every pin shares.

mod dmabuf;
mod gdrdrv;
mod pooled;
#[cfg(test)]
mod tests;
mod vulkan;

pub use vulkan::{vulkan_import_outcome, VulkanImportOutcome};

use super::backend::dmabuf::PeerError;
use super::backend::gdrdrv::{GdrDrv, GdrDrvError};
use super::backend::vulkan::BarError;
use super::pool::PoolPinError;
use crate::cuda::{buffer_id, Context, CudaError};
use gdr_mem::{AccessError, Caching, MappedMemory};
use std::fmt;
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
    backend: Arc<dyn Backend>,
    reason: String,
}

/// One opened pin backend: pins ranges of its GPU's memory. Implemented once per backend, in
/// that backend's file; [`Pinner::open`] is where each is registered.
trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> PinBackend;

    /// Pins `[addr, addr + size)` (never empty: the shared checks come first). The pinner's
    /// context is already current.
    fn pin(&self, addr: u64, size: u64) -> Result<Pinning, PinError>;

    /// The open gdrdrv, for the gdrdrv backend (its version and attributes).
    fn gdrdrv(&self) -> Option<&GdrDrv> {
        None
    }
}

/// What a backend's pin gives the shared [`Pinned`]: the pinned (rounded) range and the pin.
struct Pinning {
    /// GPU virtual address where the pinned range starts.
    start: u64,
    /// Bytes pinned.
    len: u64,
    pin: Box<dyn BackendPin>,
}

/// One range a backend pinned. Dropping it unpins; [`PinnedMapping`] holds it (through
/// [`PinState`]), so that comes only after every mapping of it is unmapped.
trait BackendPin: Send + Sync {
    /// The backend that pinned the range, as [`Pinned::backend`] reports it.
    fn backend(&self) -> PinBackend;

    /// Whether the pin went through gdr's allocator.
    fn is_pooled(&self) -> bool {
        false
    }

    /// Whether the application freed the memory while pinned; `addr` is the caller's address.
    fn callback_fired(&self, addr: u64) -> Result<bool, PinError>;

    /// Maps the whole pinned range, `len` bytes, for the CPU. [`Pinned::map`] calls it at most
    /// once at a time per pin and keeps the result in a [`PinnedMapping`], which hands it back
    /// to [`unmap`](Self::unmap) on drop.
    fn map(&self, len: usize) -> Result<RawMapping, PinError>;

    /// Unmaps what [`map`](Self::map) returned.
    ///
    /// # Safety
    /// `mapping` must be exactly what this pin's `map` returned, not yet unmapped, and nothing
    /// may use that memory afterwards.
    unsafe fn unmap(&self, mapping: RawMapping);
}

/// A CPU mapping a backend made of its whole pinned range.
#[derive(Clone, Copy)]
struct RawMapping {
    /// CPU address of the first pinned byte.
    base: *mut u8,
    /// Bytes mapped from `base`, as the backend's unmap needs them.
    len: usize,
}

/// Pins through `backend` and maps the result once, then drops both: how a backend is proven
/// on a small allocation before it is taken.
fn prove(backend: &dyn Backend, addr: u64, size: u64) -> Result<(), PinError> {
    let pinned = Pinned::new(addr, size, backend.pin(addr, size)?);
    pinned.map().map(drop)
}

/// Whether the allocation at `addr` is no longer the one pinned: CUDA's BUFFER_ID there
/// differs from `pinned_id`, the one it had at the pin (never, when that was unknown). How the
/// backends that keep the memory alive until unpin tell that the application freed it.
fn pinned_buffer_freed(addr: u64, pinned_id: Option<u64>) -> Result<bool, PinError> {
    Ok(pinned_id.is_some() && buffer_id(addr)? != pinned_id)
}

/// The checks every pin shares, then gdr's allocator when the range is its memory, else
/// `backend` after `bind` (which makes the pinner's context current).
fn pin_through(
    backend: &dyn Backend,
    bind: impl FnOnce() -> Result<(), CudaError>,
    addr: u64,
    size: u64,
) -> Result<Pinned, PinError> {
    if size == 0 {
        return Err(PinError::Empty { addr });
    }
    if let Some(p) = pooled::pin(addr, size)? {
        return Ok(Pinned::new(addr, size, p));
    }
    bind()?;
    Ok(Pinned::new(addr, size, backend.pin(addr, size)?))
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
            let (backend, reason) = Self::open(ctx, c)?;
            return Ok(Pinner {
                ctx: ctx.clone(),
                backend,
                reason: format!("{c} asked for: {reason}"),
            });
        }
        let mut why = Vec::new();
        for b in PinBackend::ALL {
            match Self::open(ctx, b) {
                Ok((backend, reason)) => {
                    return Ok(Pinner {
                        ctx: ctx.clone(),
                        backend,
                        reason: format!("first that works: {reason}"),
                    })
                }
                Err(e) => why.push(format!("{b}: {e}")),
            }
        }
        Err(PinError::NoBackend(why.join("; ")))
    }

    /// Opens backend `b` on `ctx`'s GPU, with what it found: the registration of every
    /// backend (its file's `open`).
    fn open(ctx: &Context, b: PinBackend) -> Result<(Arc<dyn Backend>, String), PinError> {
        match b {
            PinBackend::GdrDrv => gdrdrv::open(ctx),
            PinBackend::DmaBuf => dmabuf::open(ctx),
            PinBackend::Vulkan => vulkan::open(ctx),
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
        self.backend.kind()
    }

    /// The open gdrdrv, when that is the backend (for its version and attributes).
    pub fn gdrdrv(&self) -> Option<&GdrDrv> {
        self.backend.gdrdrv()
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
        pin_through(&*self.backend, || self.ctx.bind(), addr, size)
    }
}

/// A pinned range of existing GPU memory. Unpinned when it and its mapping (which holds it)
/// are both dropped.
pub struct Pinned {
    state: Arc<PinState>,
}

/// What a [`Pinned`] and its [`PinnedMapping`] share; unpins on drop (its backend's pin does),
/// so after the last of them goes.
struct PinState {
    addr: u64,
    size: u64,
    start: u64,
    len: u64,
    pin: Box<dyn BackendPin>,
    mapped: AtomicBool,
}

impl Pinned {
    fn new(addr: u64, size: u64, pinning: Pinning) -> Pinned {
        Pinned {
            state: Arc::new(PinState {
                addr,
                size,
                start: pinning.start,
                len: pinning.len,
                pin: pinning.pin,
                mapped: AtomicBool::new(false),
            }),
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
        self.state.pin.backend()
    }

    /// Whether the pin went through gdr's allocator (its memory, its chunk's mapping).
    pub fn is_pooled(&self) -> bool {
        self.state.pin.is_pooled()
    }

    /// Whether the application freed the pinned memory while pinned (what gdrcopy's callback
    /// flag reports). gdrdrv says so itself and then revokes the memory; the other backends
    /// keep the memory alive until unpin and tell by the allocation's BUFFER_ID (no allocation
    /// at the address any more, or another one), or, for allocator memory, by asking the
    /// allocator.
    pub fn callback_fired(&self) -> Result<bool, PinError> {
        self.state.pin.callback_fired(self.state.addr)
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
        let mapping = state.pin.map(state.len as usize)?;
        // SAFETY: the caller's address lies in the pinned range, which the mapping covers whole.
        let host = unsafe { mapping.base.add((state.addr - state.start) as usize) };
        Ok(PinnedMapping {
            pinned: Pinned {
                state: state.clone(),
            },
            host,
            mapping,
        })
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

/// A CPU mapping of a [`Pinned`] range; offsets are relative to the caller's address. Unmapped
/// on drop. It holds the pin, so the memory stays pinned while the mapping lives.
pub struct PinnedMapping {
    pinned: Pinned,
    /// CPU address of the caller's first byte.
    host: *mut u8,
    /// What the backend's unmap takes back, in drop.
    mapping: RawMapping,
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
        // SAFETY: `mapping` is what this pin's map returned for this value (in map_once), and
        // this drop is its only unmap; nothing uses it from now on. The pin is still held here,
        // so it unpins only after this.
        unsafe { state.pin.unmap(self.mapping) };
        state.mapped.store(false, Ordering::Release);
        // The pin itself goes with the last of this mapping and its Pinned.
    }
}
