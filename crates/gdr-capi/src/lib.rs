//! gdr's `libgdrapi.so.2`: gdrcopy 2.6's C API and ABI (see `include/gdrapi.h`) on top of gdr,
//! pinning through [`gdr::bar::Pinner`] (gdrdrv, dma-buf mmap or Vulkan import), with one
//! extension, [`gdr_alloc_mapped`], for machines where only new memory can be mapped.
//!
//! Every entry point catches panics (none may unwind into C) and returns 0 or a positive errno.
//! Handles and `gdr_t` values live in one process-wide table (the private `table` module), so a
//! stale or made-up one is answered with EINVAL. Messages follow gdrcopy's
//! `GDRCOPY_ENABLE_LOGGING` / `GDRCOPY_LOG_LEVEL` (the private `log` module).
//!
//! # Errors every entry point shares
//!
//! Besides the errnos each function lists: EIO when gdr panics inside the call (the panic is
//! caught and logged), and in a child forked after `gdr_open`, EINVAL for every call but
//! `gdr_open`, `gdr_runtime_get_version` and `gdr_close` of the child's own `gdr_t` (neither
//! CUDA nor the parent's mappings carry across fork). `gdr_open` signals failure with NULL, and
//! `gdr_runtime_get_version` cannot fail.
//!
//! The entry points are safe Rust functions that take C pointers: as in C, an out-pointer must
//! be NULL (refused with EINVAL) or writable, and a copy's host buffer must hold `size` bytes;
//! only the GPU side of a copy is checked against the handle's mapping.
//!
//! # Example
//!
//! gdrcopy's sequence from Rust, through this crate's rlib (the library's crate name is
//! `gdrapi`): open, allocate GPU memory with a CPU mapping (gdr's extension; pinning existing
//! memory with `gdr_pin_buffer` goes on the same way), map, copy in and out, release. Without a
//! usable GPU `gdr_open` answers NULL, as gdrcopy's does, and the example stops there.
//!
//! ```
//! use gdrapi::*;
//! use std::ffi::{c_ulong, c_void};
//!
//! let (mut major, mut minor) = (0, 0);
//! gdr_runtime_get_version(&mut major, &mut minor);
//! assert_eq!((major, minor), (API_MAJOR, API_MINOR));
//! // A `gdr_t` that was never opened is refused, not followed.
//! assert_eq!(gdr_close(std::ptr::null_mut()), libc::EINVAL);
//!
//! let g = gdr_open();
//! if g.is_null() {
//!     // No usable GPU or no backend here (GDRCOPY_ENABLE_LOGGING=1 says which).
//! #   // The skip rule of every GPU test: a failure under GDR_REQUIRE_GPU=1, else logged.
//! #   gdr_testing::skip_or_fail::<()>("gdr_capi crate example (doctest)", "gdr_open() gave NULL");
//!     return;
//! }
//! let mut backend = 0;
//! assert_eq!(gdr_get_attribute(g, ATTR_GDR_BACKEND, &mut backend), 0);
//! // A handle that was never handed out is refused too.
//! assert_eq!(gdr_unpin_buffer(g, GdrMh { h: 0 }), libc::EINVAL);
//!
//! let size = 1 << 16;
//! let (mut dptr, mut mh): (c_ulong, GdrMh) = (0, GdrMh { h: 0 });
//! match gdr_alloc_mapped(g, size, &mut dptr, &mut mh) {
//!     0 => {
//!         let mut va: *mut c_void = std::ptr::null_mut();
//!         assert_eq!(gdr_map(g, mh, &mut va, size), 0);
//!         let mut info = GdrInfoV2::default();
//!         assert_eq!(gdr_get_info_v2(g, mh, &mut info), 0);
//!         assert_eq!(info.mapping_type, MAPPING_TYPE_WC);
//!         // `va` maps `info.va`: GPU address d is at va + (d - info.va).
//!         let at = |d: u64| -> *mut c_void {
//!             va.cast::<u8>().wrapping_add((d - info.va) as usize).cast()
//!         };
//!
//!         let msg = *b"hello, BAR1";
//!         let mut back = [0u8; 11];
//!         let p = at(dptr as u64);
//!         assert_eq!(gdr_copy_to_mapping(mh, p, msg.as_ptr().cast(), msg.len()), 0);
//!         assert_eq!(gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), p, back.len()), 0);
//!         assert_eq!(back, msg);
//!         // Past the mapping: refused before any byte is copied.
//!         let past = at(info.va + size as u64);
//!         assert_eq!(gdr_copy_to_mapping(mh, past, msg.as_ptr().cast(), 1), libc::EINVAL);
//!
//!         assert_eq!(gdr_unmap(g, mh, va, size), 0);
//!         assert_eq!(gdr_free_mapped(g, mh), 0);
//!     }
//!     // ENOTSUP: this GPU has no Vulkan mapping (pinning may still work).
//!     e => println!("gdr_alloc_mapped: errno {e} on backend {backend}"),
//! }
//! assert_eq!(gdr_close(g), 0);
//! ```

// The entry points are C functions whose pointer contracts are the header's; Rust callers are
// this crate's tests and doctest, `gdr apiperf` and the C API columns of `gdr copylat` and
// `gdr copybw`. `c_ulong` is u64 here but not on every target.
#![allow(clippy::not_unsafe_ptr_arg_deref, clippy::unnecessary_cast)]

mod info;
pub use info::*;
mod copy;
mod log;
mod read_mostly;
mod table;
mod ucx;

use gdr::bar::auto::Direction;
use gdr::bar::{PinBackend, PinError, Pinned, Pinner, VulkanBackend};
use gdr::cuda::{Context, CudaError, DeviceMemory};
use log::{log, Level};
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use table::{forked, with_state, Gdr, Handle, Kind};

/// `gdr_mh_t`: a pin or allocation handle, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrMh {
    /// The handle's number in the process-wide table: a counter value from 1 up, never
    /// handed out twice (0 is never a handle).
    pub h: c_ulong,
}

/// `gdr_info_v2_t`: 48 bytes; `flags` holds the two bit-fields (bit 0 `mapped`, bit 1
/// `wc_mapping`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV2 {
    /// GPU virtual address of the first byte the handle covers: the pinned address rounded
    /// down to `page_size`, within the pinned allocation (what `gdr_map`'s CPU address maps).
    pub va: u64,
    /// Bytes covered from `va`: the pinned range rounded out to `page_size`, clamped to what
    /// the backend pinned; the most `gdr_map` may map.
    pub mapped_size: u64,
    /// The granule of `va` and `mapped_size` in bytes: 64 KiB (gdrcopy's `GPU_PAGE_SIZE`),
    /// the host page size on the dma-buf backend.
    pub page_size: u32,
    /// Deprecated by gdrcopy; always 0.
    pub tm_cycles: u64,
    /// Deprecated by gdrcopy; always 0.
    pub cycles_per_ms: u32,
    /// Bit 0 `mapped`, bit 1 `wc_mapping`: both set while a `gdr_map` mapping is live (every
    /// mapping is write-combined), both clear otherwise. A mapped staged pin (see `gdr_open`)
    /// sets `mapped` only: it has addresses but no CPU access.
    pub flags: c_uint,
    /// A `GDR_MAPPING_TYPE_*` value: [`MAPPING_TYPE_WC`] while mapped, [`MAPPING_TYPE_NONE`]
    /// otherwise and for a staged pin.
    pub mapping_type: c_uint,
}

/// gdrcopy's v1 `gdr_info_t` (what the exported symbol `gdr_get_info` fills): the v2 struct
/// without `mapping_type`, 40 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV1 {
    /// As [`GdrInfoV2::va`].
    pub va: u64,
    /// As [`GdrInfoV2::mapped_size`].
    pub mapped_size: u64,
    /// As [`GdrInfoV2::page_size`].
    pub page_size: u32,
    /// Deprecated by gdrcopy; always 0.
    pub tm_cycles: u64,
    /// Deprecated by gdrcopy; always 0.
    pub cycles_per_ms: u32,
    /// As [`GdrInfoV2::flags`].
    pub flags: c_uint,
}

/// `GDR_MAPPING_TYPE_NONE`: the handle is not mapped.
pub const MAPPING_TYPE_NONE: c_uint = 0;
/// `GDR_MAPPING_TYPE_WC`: write-combined, the type of every mapping gdr makes.
pub const MAPPING_TYPE_WC: c_uint = 1;
/// `GDR_MAPPING_TYPE_CACHING`: gdrcopy's cached mapping; gdr never makes one (only
/// `gdr_get_mapping_type_string` knows it).
pub const MAPPING_TYPE_CACHING: c_uint = 2;
/// `GDR_MAPPING_TYPE_DEVICE`: gdrcopy's device (uncached) mapping; gdr never makes one (only
/// `gdr_get_mapping_type_string` knows it).
pub const MAPPING_TYPE_DEVICE: c_uint = 3;
/// `GDR_MAP_FLAG_DEFAULT`: the library's own choice of mapping, write-combined here.
pub const MAP_FLAG_DEFAULT: c_int = 0;
/// `GDR_MAP_FLAG_REQ_WC_MAPPING`: a write-combined mapping, granted; `gdr_map_v2` refuses the
/// caching and device requests (2, 3) with EINVAL, as gdrcopy's dma-buf backend does.
pub const MAP_FLAG_REQ_WC_MAPPING: c_int = 1;
/// `GDR_ATTR_USE_PERSISTENT_MAPPING`: whether pins hold the memory until unpinned; gdrdrv's
/// answer on that backend, 1 on dma-buf and Vulkan.
pub const ATTR_USE_PERSISTENT_MAPPING: c_int = 1;
/// `GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE`: whether [`PIN_FLAG_FORCE_PCIE`] is honoured;
/// gdrdrv's answer on that backend, 1 on dma-buf and Vulkan (every mapping of a discrete GPU
/// on an x86 host is BAR1 over PCIe).
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int = 2;
/// `GDR_ATTR_USING_DMA_BUF_MMAP`: 1 on the dma-buf backend, 0 on gdrdrv and Vulkan.
pub const ATTR_USING_DMA_BUF_MMAP: c_int = 3;
/// gdr extension, `GDR_ATTR_GDR_BACKEND`: which backend a `gdr_t` pins with, as
/// [`backend_code`] numbers them (`GDR_GDR_BACKEND_GDRDRV`, `_DMABUF`, `_VULKAN`).
pub const ATTR_GDR_BACKEND: c_int = 0x1000;
/// `GDR_PIN_FLAG_FORCE_PCIE`, the one flag `gdr_pin_buffer_v2` accepts (what every mapping is
/// anyway); any other bit is EINVAL.
pub const PIN_FLAG_FORCE_PCIE: u32 = 1;
/// `GDR_API_MAJOR_VERSION`: the gdrcopy API major version implemented, 2.
pub const API_MAJOR: c_int = 2;
/// `GDR_API_MINOR_VERSION`: the gdrcopy API minor version implemented, 6.
pub const API_MINOR: c_int = 6;
/// What `gdr_driver_get_version` answers on the backends without a kernel module: the gdrdrv
/// interface level they implement (see the header).
pub const USER_SPACE_DRIVER_VERSION: (c_int, c_int) = (2, 6);

/// The `GDR_GDR_BACKEND_*` number of a backend, what `gdr_get_attribute` answers for
/// [`ATTR_GDR_BACKEND`]: 1 gdrdrv, 2 dma-buf, 3 Vulkan.
pub fn backend_code(b: PinBackend) -> c_int {
    match b {
        PinBackend::GdrDrv => 1,
        PinBackend::DmaBuf => 2,
        PinBackend::Vulkan => 3,
    }
}

/// Runs an entry point: EINVAL in a forked child (see [`table`]), EIO for a panic.
fn guard(name: &str, f: impl FnOnce() -> c_int) -> c_int {
    if forked() {
        log!(
            Level::Error,
            "{name}: called in a child process after fork(); the parent's gdr_t and handles \
             are not usable here"
        );
        return libc::EINVAL;
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log!(Level::Error, "{name}: internal error (panic)");
        libc::EIO
    })
}

/// Writes `v` through a caller's out-pointer, or EINVAL when it is null.
fn put<T>(out: *mut T, v: T) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-null; the header's contract is that out-pointers are writable.
    unsafe { out.write(v) };
    0
}

fn open_inner() -> Option<Gdr> {
    // Before any GPU work: a UCX process without gdr's allocator is better off without us.
    let stage = match ucx::decide(
        ucx::mode(),
        ucx::gdrcopy_module_loaded(),
        gdr::bar::pool::is_present(),
    ) {
        ucx::Decision::Open { stage } => stage,
        ucx::Decision::Refuse(why) => {
            log!(
                Level::Warn,
                "gdr_open: {why} (GDR_CAPI_UCX=off opens anyway)"
            );
            return None;
        }
    };
    let ordinal = std::env::var("GDR_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let ctx = match Context::on(ordinal) {
        Ok(c) => c,
        Err(e) => {
            log!(Level::Error, "{}", no_gpu_line(ordinal, &e));
            return None;
        }
    };
    // gdrcopy's switch for its dma-buf backend; GDR_BACKEND (read by Pinner) names any.
    let choice = match std::env::var("GDRCOPY_USE_DMABUF_MMAP").as_deref() {
        Ok("1") => Some(PinBackend::DmaBuf),
        _ => None,
    };
    let pinner = match Pinner::new(&ctx, choice) {
        Ok(p) => {
            log!(
                Level::Info,
                "gdr_open: {} backend ({})",
                p.backend(),
                p.reason()
            );
            Some(p)
        }
        Err(e) if choice.is_some() => {
            log!(Level::Error, "gdr_open: GDRCOPY_USE_DMABUF_MMAP=1 but {e}");
            return None;
        }
        Err(e) => {
            log!(Level::Warn, "gdr_open: nothing can be pinned here: {e}");
            None
        }
    };
    let vulkan = match VulkanBackend::new(&ctx) {
        Ok(v) => Ok(v),
        Err(e) => {
            log!(Level::Info, "gdr_open: gdr_alloc_mapped unavailable: {e}");
            Err(e)
        }
    };
    let vulkan = match (vulkan, &pinner) {
        (Ok(v), _) => Some(v),
        (Err(_), Some(_)) => None,
        (Err(e), None) => {
            log!(Level::Error, "{}", no_backend_line(&e));
            return None;
        }
    };
    Some(Gdr {
        backend: pinner.as_ref().map(Pinner::backend),
        pinners: [(ctx.device().ordinal(), pinner)].into_iter().collect(),
        ctx,
        vulkan,
        stage,
    })
}

/// `gdr_open`'s error line when GPU `ordinal` cannot be opened: the CUDA error, which names a
/// missing device node and its fix where that is why ([`CudaError::MissingNodes`]).
fn no_gpu_line(ordinal: usize, e: &CudaError) -> String {
    format!("gdr_open: no usable GPU {ordinal}: {e}")
}

/// `gdr_open`'s error line when nothing can be pinned and Vulkan failed with `vulkan`: Vulkan's
/// reason comes first, since it names the fix for a missing ICD (in a container, the
/// `graphics` driver capability).
fn no_backend_line(vulkan: &gdr::bar::BarError) -> String {
    format!(
        "gdr_open: no backend works here: {vulkan} (gdrdrv, CUDA 13.3+ dma-buf mmap or Vulkan \
         with a mappable BAR1 are needed; `gdr info` explains)"
    )
}

/// The `gdr_t` of a `gdr_open` in a forked child: a token with bit 0 set (the parent's have
/// it clear), good for `gdr_close` only.
fn child_token() -> *mut c_void {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((n << 4) | 1) as *mut c_void
}

fn is_child_token(g: *mut c_void) -> bool {
    g as usize & 1 == 1
}

/// gdrcopy's `gdr_open`: opens CUDA device 0 (or `GDR_CUDA_DEVICE`), picks the first pinning
/// backend that works there (gdrdrv, dma-buf mmap, Vulkan; `GDRCOPY_USE_DMABUF_MMAP=1` or
/// `GDR_BACKEND` choose one) and opens Vulkan for [`gdr_alloc_mapped`].
///
/// Returns a `gdr_t`: an opaque token, not a pointer, valid until [`gdr_close`]. NULL when
/// no GPU is usable, when no backend works (nor `gdr_alloc_mapped`), or when the backend
/// `GDRCOPY_USE_DMABUF_MMAP=1` asks for does not; the log says why, and there is no errno.
/// In a child forked after a `gdr_open`, a token that only `gdr_close` accepts.
///
/// UCX (its `gdr_copy` module loaded in the process) fails every registration when one pin
/// fails, so there, by default (`GDR_CAPI_UCX` unset or `auto`): without gdr's allocator in
/// the process, NULL (UCX then runs as without gdrcopy); with it, a pin of memory that cannot
/// be mapped is a *staged pin*, whose `gdr_map` gives inaccessible addresses and whose copies
/// run on the copy engine. `GDR_CAPI_UCX=staged` stages in every process, `off` never.
/// docs/ucx.md has the reasons.
#[no_mangle]
pub extern "C" fn gdr_open() -> *mut c_void {
    if forked() {
        // gdrcopy's gdr_open in a child only opens the driver; what the child then asks of the
        // parent's memory fails. Here CUDA (initialised in the parent) does not carry across
        // fork either: the child gets a gdr_t that can be closed, and every other call with it
        // fails with EINVAL.
        log!(
            Level::Info,
            "gdr_open: in a child forked after gdr_open: this gdr_t can only be closed (CUDA \
             and the parent's pins do not carry across fork)"
        );
        return child_token();
    }
    catch_unwind(|| {
        table::watch_fork();
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        let Some(g) = open_inner() else {
            return std::ptr::null_mut();
        };
        copy::init(g.vulkan.as_ref());
        // A token that is never handed out twice (not a freed allocation that malloc could
        // return again), so a stale gdr_t can never alias a newer one.
        with_state(|s| {
            let token = (s.fresh() as usize) << 4;
            s.gdrs.insert(token, g);
            token as *mut c_void
        })
    })
    .unwrap_or(std::ptr::null_mut())
}

/// gdrcopy's `gdr_close`: unmaps and unpins every handle still held through `g`, frees its
/// [`gdr_alloc_mapped`] memory, and forgets `g`.
///
/// 0, or EINVAL when `g` is not an open `gdr_t` (closed before, made up, NULL).
#[no_mangle]
pub extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    if forked() && is_child_token(g) {
        return 0;
    }
    guard("gdr_close", || {
        let (gone, doomed) = with_state(|s| {
            let gone = s.gdrs.remove(&(g as usize));
            let keys: Vec<u64> = s
                .handles
                .iter()
                .filter(|(_, h)| h.owner == g as usize)
                .map(|(&k, _)| k)
                .collect();
            let doomed: Vec<Handle> = keys
                .into_iter()
                .filter_map(|k| s.handles.remove(&k))
                .collect();
            (gone, doomed)
        });
        let Some(gdr) = gone else {
            return libc::EINVAL;
        };
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        if !doomed.is_empty() {
            log!(
                Level::Info,
                "gdr_close: releasing {} handle(s) still pinned or allocated",
                doomed.len()
            );
        }
        drop(doomed); // unmaps, then unpins or frees, outside the lock
        drop(gdr);
        0
    })
}

/// The one line that says why a range cannot be pinned here and what works instead.
fn refusal(addr: u64, size: usize, backend: PinBackend, e: &PinError) {
    let (what, why, fix) = match e {
        PinError::NotExportable {
            cumemcreate: true,
            why,
            ..
        } => (
            "cuMemCreate memory made without a POSIX-fd handle type",
            why.clone(),
            "allocate it with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or run the program under \
             `gdr run` (gdr's allocator adds that handle type to such cuMemCreate calls)",
        ),
        PinError::NotExportable { why, .. } => (
            "plain cudaMalloc/cuMemAlloc memory",
            why.clone(),
            "run the program under `gdr run -- PROGRAM` (or LD_PRELOAD=libgdr_alloc.so), which \
             makes every cudaMalloc/cuMemAlloc allocation pinnable; PyTorch alone: \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ),
        e => (
            "this memory",
            e.to_string(),
            "use gdr_alloc_mapped() or `gdr run`",
        ),
    };
    log!(
        Level::Error,
        "gdr_pin_buffer: cannot pin {addr:#x}+{size}: {what} cannot be mapped by the {backend} \
         backend ({why}); without gdrdrv and before CUDA driver 13.3 (no dma-buf mmap) only \
         POSIX-fd cuMemCreate memory can be: {fix}"
    );
}

/// The pinner of GPU `ordinal` for `g`, opened (unlocked) at the first pin on that GPU;
/// `Err(EINVAL)` for an unknown `g`, `Ok(None)` when that GPU cannot pin.
fn pinner_for(g: *mut c_void, ordinal: usize) -> Result<Option<Pinner>, c_int> {
    let (known, backend) = {
        let s = table::read();
        let gdr = s
            .as_ref()
            .and_then(|s| s.gdrs.get(&(g as usize)))
            .ok_or(libc::EINVAL)?;
        (gdr.pinners.get(&ordinal).cloned(), gdr.backend)
    };
    if let Some(p) = known {
        return Ok(p);
    }
    let opened = Context::on(ordinal)
        .map_err(PinError::from)
        .and_then(|ctx| Pinner::new(&ctx, backend));
    let opened = match opened {
        Ok(p) => {
            log!(
                Level::Info,
                "gdr_pin_buffer: GPU {ordinal}: {} backend",
                p.backend()
            );
            Some(p)
        }
        Err(e) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: GPU {ordinal} cannot pin: {e}"
            );
            None
        }
    };
    with_state(|s| {
        let gdr = s.gdrs.get_mut(&(g as usize)).ok_or(libc::EINVAL)?;
        Ok(gdr.pinners.entry(ordinal).or_insert(opened).clone())
    })
}

fn pin(g: *mut c_void, addr: c_ulong, size: usize, handle: *mut GdrMh) -> c_int {
    if handle.is_null() || size == 0 {
        return libc::EINVAL;
    }
    // An unknown g is refused before any CUDA call.
    if !table::read()
        .as_ref()
        .is_some_and(|s| s.gdrs.contains_key(&(g as usize)))
    {
        return libc::EINVAL;
    }
    let _current = gdr::cuda::CurrentContextGuard::save().ok();
    let ordinal = match gdr::cuda::pointer_device(addr as u64) {
        Ok(o) => o,
        Err(e) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: {addr:#x} is not CUDA device memory: {e}"
            );
            return libc::EINVAL;
        }
    };
    let stage = stages(g);
    let pinner = match pinner_for(g, ordinal) {
        Err(e) => return e,
        Ok(None) if stage => {
            return stage_pin(
                g,
                ordinal,
                addr as u64,
                size,
                handle,
                "no backend pins here",
            )
        }
        Ok(None) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: no pinning backend works on GPU {ordinal} (only \
                 gdr_alloc_mapped may); `gdr info` says why"
            );
            return libc::ENOTSUP;
        }
        Ok(Some(p)) => p,
    };
    let addr = addr as u64;
    let pinned: Pinned = match pinner.pin(addr, size as u64) {
        Ok(p) => p,
        Err(e @ (PinError::NotExportable { .. } | PinError::MmapRefused { .. })) if stage => {
            return stage_pin(g, ordinal, addr, size, handle, &e.to_string());
        }
        Err(PinError::Pool(p)) if stage && p.errno == libc::ENOTSUP => {
            return stage_pin(g, ordinal, addr, size, handle, &p.to_string());
        }
        Err(e @ (PinError::NotExportable { .. } | PinError::MmapRefused { .. })) => {
            refusal(addr, size, pinner.backend(), &e);
            return libc::ENOTSUP;
        }
        Err(e @ PinError::Peer(gdr::peer::PeerError::OutsideAllocation { .. })) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: {addr:#x}+{size} spans more than one CUDA allocation ({e}); a \
                 pin lies inside one (PyTorch's expandable segments are 2 MiB / 20 MiB chunks)"
            );
            return libc::EINVAL;
        }
        Err(e @ PinError::Pool(_)) => {
            log!(Level::Error, "gdr_pin_buffer: {e}");
            return match e {
                PinError::Pool(p) if p.errno == libc::ENOMEM => libc::ENOMEM,
                PinError::Pool(p) if p.errno == libc::ENOTSUP => libc::ENOTSUP,
                _ => libc::EINVAL,
            };
        }
        Err(e @ (PinError::Cuda(_) | PinError::Peer(_))) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: {addr:#x}+{size} is not CUDA memory of this GPU: {e}"
            );
            return libc::EINVAL;
        }
        Err(e) => {
            log!(Level::Error, "gdr_pin_buffer: {addr:#x}+{size}: {e}");
            return libc::EIO;
        }
    };
    let entry = Handle::new(
        g as usize,
        Kind::Pin {
            map: None,
            pin: pinned,
        },
        pinner.context().clone(),
    );
    let window = entry.window;
    let backend = pinner.backend();
    let pooled = matches!(&entry.kind, Kind::Pin { pin, .. } if pin.is_pooled());
    let Some(h) = insert(g, entry) else {
        return libc::EINVAL;
    };
    log!(
        Level::Info,
        "gdr_pin_buffer: {addr:#x}+{size} pinned ({backend}{}): handle {h}, va {:#x}, {} bytes",
        if pooled { ", gdr allocator chunk" } else { "" },
        window.va,
        window.len
    );
    put(handle, GdrMh { h: h as c_ulong })
}

/// Whether `g` stages pins of memory it cannot map (see the `ucx` module).
fn stages(g: *mut c_void) -> bool {
    table::read()
        .as_ref()
        .and_then(|s| s.gdrs.get(&(g as usize)))
        .is_some_and(|gd| gd.stage)
}

/// A staged pin of `[addr, addr + size)` on GPU `ordinal`: the range rounded out to GPU pages,
/// copied through the copy engine; `why` says why it is not mapped.
fn stage_pin(
    g: *mut c_void,
    ordinal: usize,
    addr: u64,
    size: usize,
    handle: *mut GdrMh,
    why: &str,
) -> c_int {
    let ctx = match Context::on(ordinal) {
        Ok(c) => c,
        Err(e) => {
            log!(Level::Error, "gdr_pin_buffer: GPU {ordinal}: {e}");
            return libc::EIO;
        }
    };
    let page = gdr::GPU_PAGE_SIZE;
    let Some(end) = addr
        .checked_add(size as u64)
        .and_then(|e| e.checked_next_multiple_of(page))
    else {
        return libc::EINVAL;
    };
    let va = addr & !(page - 1);
    let window = table::Window {
        va,
        len: end - va,
        page: page as u32,
    };
    // The range may run past its allocation (UCX pins the GPU pages around a buffer): the
    // copies are held to the allocations found here, as long as each is the same one.
    let covered = table::Covered::scan(window.va, window.len);
    let Some(h) = insert(g, Handle::staged(g as usize, ctx, window, covered)) else {
        return libc::EINVAL;
    };
    log!(
        Level::Info,
        "gdr_pin_buffer: {addr:#x}+{size} staged (copies through the copy engine; {why}): \
         handle {h}, va {va:#x}, {} bytes",
        window.len
    );
    put(handle, GdrMh { h: h as c_ulong })
}

/// Adds `entry` to the table as a new handle of `g`. Pinning and allocating run unlocked, so `g`
/// may have been closed meanwhile: then `entry` is released here (unlocked) and `None` returned.
fn insert(g: *mut c_void, entry: Handle) -> Option<u64> {
    let mut entry = Some(entry);
    let h = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return None;
        }
        let h = s.fresh();
        s.handles.insert(h, entry.take()?);
        Some(h)
    });
    drop(entry);
    h
}

/// gdrcopy's `gdr_pin_buffer`: pins `size` bytes of CUDA device memory at `addr` for a CPU
/// mapping, through the backend of the GPU that owns `addr`, and writes the new handle to
/// `*handle`. The P2P token and VA space (for legacy UVA-less code) are ignored, as gdrcopy's
/// own dma-buf backend does. The range the handle covers is `addr` rounded out to pages
/// ([`GdrInfoV2`]).
///
/// 0, or:
/// - EINVAL: `g` not open, `handle` NULL, `size` 0, `addr` not CUDA device memory, or the
///   range not inside one allocation;
/// - ENOTSUP: no backend can pin on that GPU, or this one cannot pin this kind of memory (a
///   plain `cuMemAlloc` range on Vulkan without gdr's allocator; the log says what works),
///   unless `g` stages such pins (see [`gdr_open`]): then 0, and the copies of the handle run
///   on the copy engine;
/// - ENOMEM: memory ran out while gdr's allocator mapped the chunk that holds the range;
/// - EIO: the backend failed otherwise.
#[no_mangle]
pub extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    handle: *mut GdrMh,
) -> c_int {
    guard("gdr_pin_buffer", || pin(g, addr, size, handle))
}

/// gdrcopy's `gdr_pin_buffer_v2`: [`gdr_pin_buffer`] with `flags`, a set of
/// `gdr_pin_flags_t` bits: only [`PIN_FLAG_FORCE_PCIE`], which is what every mapping is on an
/// x86 host with a discrete GPU, so it changes nothing. Errors as `gdr_pin_buffer`, and EINVAL
/// for any other flag bit.
#[no_mangle]
pub extern "C" fn gdr_pin_buffer_v2(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    flags: u32,
    handle: *mut GdrMh,
) -> c_int {
    guard("gdr_pin_buffer_v2", || {
        if flags & !PIN_FLAG_FORCE_PCIE != 0 {
            log!(Level::Error, "gdr_pin_buffer_v2: unknown flags {flags:#x}");
            return libc::EINVAL;
        }
        pin(g, addr, size, handle)
    })
}

/// Removes `mh` of `g` if `accept` says it is the right kind, and drops it unlocked.
fn take_handle(g: *mut c_void, mh: GdrMh, accept: fn(&Kind) -> bool) -> c_int {
    let _current = gdr::cuda::CurrentContextGuard::save().ok();
    let taken = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return None;
        }
        match s.handles.get(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize && accept(&h.kind) => s.handles.remove(&(mh.h as u64)),
            _ => None,
        }
    });
    match taken {
        Some(h) => {
            drop(h); // unmaps, then unpins or frees, outside the lock
            0
        }
        None => libc::EINVAL,
    }
}

/// gdrcopy's `gdr_unpin_buffer`: unpins handle `mh` of `g` (a live mapping is torn down
/// first) and forgets it.
///
/// 0, or EINVAL when `g` is not open, `mh` is not a handle of `g`, or it came from
/// [`gdr_alloc_mapped`] (released with [`gdr_free_mapped`]).
#[no_mangle]
pub extern "C" fn gdr_unpin_buffer(g: *mut c_void, mh: GdrMh) -> c_int {
    guard("gdr_unpin_buffer", || {
        take_handle(g, mh, |k| {
            matches!(k, Kind::Pin { .. } | Kind::Staged { .. })
        })
    })
}

/// gdr extension, `gdr_free_mapped`: frees the memory of a [`gdr_alloc_mapped`] handle (a live
/// mapping is torn down first) and forgets the handle.
///
/// 0, or EINVAL when `g` is not open, `mh` is not a handle of `g`, or it is a pin (released
/// with [`gdr_unpin_buffer`]).
#[no_mangle]
pub extern "C" fn gdr_free_mapped(g: *mut c_void, mh: GdrMh) -> c_int {
    guard("gdr_free_mapped", || {
        take_handle(g, mh, |k| matches!(k, Kind::Alloc { .. }))
    })
}

/// Runs `f` on handle `mh` of `g`, the table locked exclusively.
fn with_handle(g: *mut c_void, mh: GdrMh, f: impl FnOnce(&mut Handle) -> c_int) -> c_int {
    with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return libc::EINVAL;
        }
        match s.handles.get_mut(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize => f(h),
            _ => libc::EINVAL,
        }
    })
}

/// gdrcopy's `gdr_get_callback_flag`: writes 1 to `*flag` when the application freed the
/// pinned memory before unpinning it, else 0 (always 0 for a [`gdr_alloc_mapped`] handle).
/// gdrdrv says so itself; the persistent backends hold the memory until unpin and tell by the
/// allocation's BUFFER_ID or, for allocator memory, by asking the allocator (see
/// `Pinned::callback_fired`).
///
/// 0, or EINVAL (`flag` NULL, `g` not open, `mh` not a handle of `g`), or EIO when the check
/// itself fails.
#[no_mangle]
pub extern "C" fn gdr_get_callback_flag(g: *mut c_void, mh: GdrMh, flag: *mut c_int) -> c_int {
    guard("gdr_get_callback_flag", || {
        if flag.is_null() {
            return libc::EINVAL;
        }
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        let mut fired = Ok(false);
        let rc = with_handle(g, mh, |h| {
            match &h.kind {
                Kind::Pin { pin, .. } => fired = pin.callback_fired(),
                Kind::Staged { covered, .. } => fired = Ok(table::Covered::any_freed(covered)),
                Kind::Alloc { .. } => {}
            }
            0
        });
        if rc != 0 {
            return rc;
        }
        match fired {
            Ok(f) => put(flag, c_int::from(f)),
            Err(e) => {
                log!(Level::Error, "gdr_get_callback_flag: {e}");
                libc::EIO
            }
        }
    })
}

/// Maps handle `mh` of `g` (`size` bytes from its `va`); the CPU address of `va`.
fn map(g: *mut c_void, mh: GdrMh, size: usize, flags: c_int) -> Result<*mut u8, c_int> {
    if size == 0 {
        return Err(libc::EINVAL);
    }
    if !matches!(flags, MAP_FLAG_DEFAULT | MAP_FLAG_REQ_WC_MAPPING) {
        log!(
            Level::Error,
            "gdr_map_v2: mapping flag {flags} refused: gdr's mappings are write-combined \
             (GDR_MAP_FLAG_DEFAULT or GDR_MAP_FLAG_REQ_WC_MAPPING)"
        );
        return Err(libc::EINVAL);
    }
    let host_page = gdr::host_page_size() as usize;
    let _current = gdr::cuda::CurrentContextGuard::save().ok();
    let mut out = Err(libc::EINVAL);
    let rc = with_handle(g, mh, |h| {
        if size as u64 > h.window.len {
            log!(
                Level::Error,
                "gdr_map: size {size} is larger than the pinned {} bytes",
                h.window.len
            );
            return libc::EINVAL;
        }
        if h.is_mapped() {
            return libc::EAGAIN;
        }
        // gdrcopy maps only pins that start on a page (gdrdrv: "offset != 0 is not supported";
        // its dma-buf backend: mmap at a byte offset fails): a pin of an unaligned address can
        // be queried but not mapped. Pin the page-aligned range around the buffer instead, as
        // UCX and NCCL do.
        if let Kind::Pin { pin, .. } = &h.kind {
            if pin.addr() % u64::from(h.window.page) != 0 {
                log!(
                    Level::Error,
                    "gdr_map: the pinned address {:#x} does not start a {}-byte page; gdrcopy maps \
                     only page-aligned pins (pin from {:#x} instead)",
                    pin.addr(),
                    h.window.page,
                    h.window.va
                );
                return libc::EINVAL;
            }
        }
        let va = h.window.va;
        let cpu = match &mut h.kind {
            Kind::Pin { map, pin } => match pin.map() {
                Ok(m) => {
                    let cpu = m.base_ptr().wrapping_add((va - pin.start()) as usize);
                    *map = Some(m);
                    cpu
                }
                Err(e) => {
                    log!(Level::Error, "gdr_map: {e}");
                    return libc::EIO;
                }
            },
            Kind::Alloc { buf, mapped } => {
                *mapped = true;
                buf.host_ptr()
            }
            Kind::Staged { reserve, .. } => match table::Reservation::new(h.window.len as usize) {
                Ok(r) => reserve.insert(r).ptr(),
                Err(e) => {
                    log!(
                        Level::Error,
                        "gdr_map: reserving {} bytes: {e}",
                        h.window.len
                    );
                    return libc::ENOMEM;
                }
            },
        };
        h.cpu = cpu;
        h.cpu_len = size.next_multiple_of(host_page).min(h.window.len as usize);
        out = Ok(cpu);
        0
    });
    if rc != 0 {
        return Err(rc);
    }
    log!(Level::Info, "gdr_map: handle {} mapped, {size} bytes", mh.h);
    out
}

/// Maps and hands the caller the CPU address of the handle's `va`.
fn map_out(g: *mut c_void, mh: GdrMh, va: *mut *mut c_void, size: usize, flags: c_int) -> c_int {
    if va.is_null() {
        return libc::EINVAL;
    }
    match map(g, mh, size, flags) {
        Ok(cpu) => put(va, cpu.cast()),
        Err(e) => e,
    }
}

/// gdrcopy's `gdr_map`: maps the first `size` bytes of handle `mh` for the CPU (write-combined)
/// and writes to `*va` the CPU address of the handle's `va` ([`GdrInfoV2::va`]): GPU address
/// `d` is at `*va + (d - info.va)`. One mapping per handle.
///
/// 0, or:
/// - EINVAL: `g` not open, `mh` not a handle of `g`, `va` NULL, `size` 0 or larger than
///   [`GdrInfoV2::mapped_size`], or a pin whose address does not start a page (as gdrcopy:
///   pin the page-aligned range around the buffer);
/// - EAGAIN: the handle is mapped already;
/// - EIO: the backend could not map it.
#[no_mangle]
pub extern "C" fn gdr_map(g: *mut c_void, mh: GdrMh, va: *mut *mut c_void, size: usize) -> c_int {
    guard("gdr_map", || map_out(g, mh, va, size, MAP_FLAG_DEFAULT))
}

/// gdrcopy's `gdr_map_v2`: [`gdr_map`] with `flags`, a `gdr_map_flags_t` value:
/// [`MAP_FLAG_DEFAULT`] and [`MAP_FLAG_REQ_WC_MAPPING`] are granted (mappings are
/// write-combined); the caching and device requests, and any other value, are EINVAL.
#[no_mangle]
pub extern "C" fn gdr_map_v2(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    guard("gdr_map_v2", || map_out(g, mh, va, size, flags))
}

/// gdrcopy's `gdr_unmap`: removes handle `mh`'s CPU mapping; `va` must be what [`gdr_map`]
/// gave. The handle stays pinned and may be mapped again.
///
/// 0, or EINVAL when `g` is not open, `mh` is not a handle of `g`, it is not mapped, `va` is
/// another address, or `size` is 0.
#[no_mangle]
pub extern "C" fn gdr_unmap(g: *mut c_void, mh: GdrMh, va: *mut c_void, size: usize) -> c_int {
    guard("gdr_unmap", || {
        let mut gone = None;
        let mut reserved = None;
        let rc = with_handle(g, mh, |h| {
            if !h.is_mapped() || va.cast::<u8>() != h.cpu || size == 0 {
                return libc::EINVAL;
            }
            match &mut h.kind {
                Kind::Pin { map, .. } => gone = map.take(),
                Kind::Alloc { mapped, .. } => *mapped = false,
                Kind::Staged { reserve, .. } => reserved = reserve.take(),
            }
            h.cpu = std::ptr::null_mut();
            h.cpu_len = 0;
            0
        });
        // The exclusive lock is released: nothing can copy through the handle any more, and the
        // unmap itself runs unlocked.
        drop(gone);
        drop(reserved);
        rc
    })
}

/// Checks that `[ptr, ptr + size)` lies in `mh`'s live mapping and runs `f` with the table
/// read-locked (so no unmap can race the copy, while copies on other handles go on).
fn with_mapped_range(
    mh: GdrMh,
    ptr: *const u8,
    size: usize,
    f: impl FnOnce(&Handle, u64) -> c_int,
) -> c_int {
    let s = table::read();
    let Some(h) = s.as_ref().and_then(|s| s.handles.get(&(mh.h as u64))) else {
        return libc::EINVAL;
    };
    if !h.is_mapped() {
        return libc::EINVAL;
    }
    let (start, end) = (h.cpu as usize, h.cpu as usize + h.cpu_len);
    match (ptr as usize).checked_add(size) {
        Some(e) if ptr as usize >= start && e <= end => {
            // The GPU address of `ptr`: the mapping starts at the window's first byte.
            f(h, h.window.va + (ptr as usize - start) as u64)
        }
        _ => libc::EINVAL,
    }
}

/// gdrcopy's `gdr_copy_to_mapping`: copies `size` bytes from host memory at `h_ptr` to
/// `map_d_ptr`, an address inside handle `mh`'s live mapping, with whole-line write-combining
/// stores; the bytes are visible to the GPU when the call returns (a store fence ends it).
/// `h_ptr` must hold `size` readable bytes. No ordering against GPU work already running is
/// promised (see the GPUDirect RDMA guide).
///
/// 0, or EINVAL when `mh` is unknown or not mapped, `[map_d_ptr, map_d_ptr + size)` is not
/// inside its mapping, or (for a `size` above 0) a pointer is NULL. `size` 0 copies nothing
/// but still checks the handle.
#[no_mangle]
pub extern "C" fn gdr_copy_to_mapping(
    mh: GdrMh,
    map_d_ptr: *mut c_void,
    h_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard("gdr_copy_to_mapping", || {
        if size == 0 {
            // Nothing to copy, but a made-up or unmapped handle is still EINVAL (gdrapi.h).
            return with_mapped_range(mh, map_d_ptr.cast(), 0, |_, _| 0);
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, addr| {
            // SAFETY: the caller passes `size` readable bytes at h_ptr.
            let src = unsafe { std::slice::from_raw_parts(h_ptr.cast::<u8>(), size) };
            if h.is_staged() {
                return copy::staged(
                    &h.engine,
                    h.covered(),
                    Direction::ToGpu,
                    src.as_ptr().cast_mut(),
                    addr,
                    size,
                );
            }
            // SAFETY: the destination lies in the handle's live mapping of the GPU memory at
            // `addr` (checked, table locked).
            unsafe { copy::to_mapping(&h.engine, map_d_ptr.cast(), addr, src) };
            0
        })
    })
}

/// gdrcopy's `gdr_copy_from_mapping`: copies `size` bytes from `map_d_ptr`, an address inside
/// handle `mh`'s live mapping, to host memory at `h_ptr`, with streaming loads of whole
/// aligned chunks (plain loads from write-combined memory are uncached round trips each).
/// `h_ptr` must hold `size` writable bytes.
///
/// 0, or EINVAL as [`gdr_copy_to_mapping`].
#[no_mangle]
pub extern "C" fn gdr_copy_from_mapping(
    mh: GdrMh,
    h_ptr: *mut c_void,
    map_d_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard("gdr_copy_from_mapping", || {
        if size == 0 {
            // Nothing to copy, but a made-up or unmapped handle is still EINVAL (gdrapi.h).
            return with_mapped_range(mh, map_d_ptr.cast(), 0, |_, _| 0);
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, addr| {
            if h.is_staged() {
                let covered = h.covered();
                return copy::staged(
                    &h.engine,
                    covered,
                    Direction::FromGpu,
                    h_ptr.cast(),
                    addr,
                    size,
                );
            }
            // SAFETY: the caller passes `size` writable bytes at h_ptr; the source lies in the
            // handle's live, page-granular mapping of the GPU memory at `addr` (checked, table
            // locked).
            unsafe {
                let dst = std::slice::from_raw_parts_mut(h_ptr.cast::<u8>(), size);
                copy::from_mapping(&h.engine, dst, map_d_ptr.cast(), addr);
            }
            0
        })
    })
}

/// gdr extension, `gdr_alloc_mapped`: `size` bytes of new GPU memory on `g`'s GPU with a CPU
/// mapping, through Vulkan (64 KiB aligned): for hosts where existing memory cannot be
/// pinned. Writes the CUDA device address to `*dptr` and a handle to `*handle`, which works
/// with [`gdr_map`], [`gdr_unmap`], `gdr_get_info(_v2)` and the copies, and is released with
/// [`gdr_free_mapped`].
///
/// 0, or:
/// - EINVAL: `g` not open, `dptr` or `handle` NULL, `size` 0 or a size Vulkan cannot lay out;
/// - ENOTSUP: `gdr_open` found no usable Vulkan mapping on this GPU;
/// - ENOMEM: the GPU memory (or its mappable part) is exhausted;
/// - EIO: the allocation failed otherwise.
#[no_mangle]
pub extern "C" fn gdr_alloc_mapped(
    g: *mut c_void,
    size: usize,
    dptr: *mut c_ulong,
    handle: *mut GdrMh,
) -> c_int {
    guard("gdr_alloc_mapped", || {
        if dptr.is_null() || handle.is_null() || size == 0 {
            return libc::EINVAL;
        }
        let be = table::read()
            .as_ref()
            .and_then(|s| s.gdrs.get(&(g as usize)).map(|gd| gd.vulkan.clone()));
        let be = match be {
            None => return libc::EINVAL,
            Some(None) => {
                log!(
                    Level::Error,
                    "gdr_alloc_mapped: the Vulkan backend is not usable here"
                );
                return libc::ENOTSUP;
            }
            Some(Some(be)) => be,
        };
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        let buf = match be.alloc(size, 1 << 16) {
            Ok(b) => b,
            Err(e) => {
                log!(Level::Error, "gdr_alloc_mapped({size}): {e}");
                return match e {
                    gdr::bar::BarError::OutOfMemory { .. } => libc::ENOMEM,
                    gdr::bar::BarError::BadLayout(_) => libc::EINVAL,
                    _ => libc::EIO,
                };
            }
        };
        let addr = buf.device_ptr();
        let ctx = buf.context().clone();
        let entry = Handle::new(g as usize, Kind::Alloc { buf, mapped: false }, ctx);
        let Some(h) = insert(g, entry) else {
            return libc::EINVAL;
        };
        put(dptr, addr as c_ulong);
        put(handle, GdrMh { h: h as c_ulong })
    })
}

/// The CUDA context a `gdr_t` uses (for tests and for callers mixing this API with gdr's Rust
/// one); `None` for a closed or unknown `g`.
pub fn context_of(g: *mut c_void) -> Option<Context> {
    table::read()
        .as_ref()
        .and_then(|s| s.gdrs.get(&(g as usize)).map(|gd| gd.ctx.clone()))
}

/// Runs `f` on the buffer behind a `gdr_alloc_mapped` handle, whose CPU mapping is the one
/// the copies of `mh` go through (for gdr's benchmarks, which time Rust copies into the very
/// allocation the C calls copy to: two allocations can differ by tens of nanoseconds per
/// small write); `None` for a handle that is not a live allocation.
///
/// The table is read-locked while `f` runs, so `f` may copy (`gdr_copy_*`, a nested read)
/// but must not call the functions that change the table (`gdr_open`, pin, map, unmap, free,
/// `gdr_close`): they would wait for `f` to return. Where membarrier(2) is missing the lock is
/// std's `RwLock`, and a copy in `f` may then also wait for another thread's table change,
/// which waits for `f`: call it where no other thread changes the table.
pub fn with_allocation<R>(mh: GdrMh, f: impl FnOnce(&gdr::bar::MappedBuffer) -> R) -> Option<R> {
    let s = table::read();
    match &s.as_ref()?.handles.get(&(mh.h as u64))?.kind {
        Kind::Alloc { buf, .. } => Some(f(buf)),
        Kind::Pin { .. } | Kind::Staged { .. } => None,
    }
}

#[cfg(test)]
mod tests;
