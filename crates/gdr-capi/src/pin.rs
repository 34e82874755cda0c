//! Pinning and unpinning: `gdr_pin_buffer` (and `_v2`) through the backend of the GPU that owns
//! the address, staged pins, `gdr_unpin_buffer` and `gdr_get_callback_flag`.

use crate::entry::{guard, put};
use crate::log::{log, Level};
use crate::table::{self, insert, take_handle, with_handle, with_state, Handle, Kind};
use crate::{errno, GdrMh, PIN_FLAG_FORCE_PCIE};
use gdr::bar::{PinBackend, PinError, Pinned, Pinner};
use gdr::cuda::Context;
use std::ffi::{c_int, c_ulong, c_void};

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

/// Pins `[addr, addr + size)` for `g` and writes the new handle to `*handle`: what
/// `gdr_pin_buffer` does once its flags are checked.
///
/// # Safety
/// `handle` is NULL (refused with EINVAL) or valid for a write of a [`GdrMh`].
unsafe fn pin(g: *mut c_void, addr: c_ulong, size: usize, handle: *mut GdrMh) -> c_int {
    if handle.is_null() || size == 0 {
        return libc::EINVAL;
    }
    match pin_range(g, addr as u64, size) {
        // SAFETY: `handle` is not NULL, and writable by this function's contract.
        Ok(mh) => unsafe { put(handle, mh) },
        Err(e) => e,
    }
}

/// Pins `[addr, addr + size)` (`size` above 0) for `g`, or stages the pin where `g` stages and
/// the memory cannot be mapped; the new handle, or the errno.
fn pin_range(g: *mut c_void, addr: u64, size: usize) -> Result<GdrMh, c_int> {
    // An unknown g is refused before any CUDA call.
    if !table::read()
        .as_ref()
        .is_some_and(|s| s.gdrs.contains_key(&(g as usize)))
    {
        return Err(libc::EINVAL);
    }
    let _current = gdr::cuda::CurrentContextGuard::save().ok();
    let ordinal = match gdr::cuda::pointer_device(addr) {
        Ok(o) => o,
        Err(e) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: {addr:#x} is not CUDA device memory: {e}"
            );
            return Err(libc::EINVAL);
        }
    };
    let stage = stages(g);
    let pinner = match pinner_for(g, ordinal) {
        Err(e) => return Err(e),
        Ok(None) if stage => return stage_pin(g, ordinal, addr, size, "no backend pins here"),
        Ok(None) => {
            log!(
                Level::Error,
                "gdr_pin_buffer: no pinning backend works on GPU {ordinal} (only \
                 gdr_alloc_mapped may); `gdr info` says why"
            );
            return Err(libc::ENOTSUP);
        }
        Ok(Some(p)) => p,
    };
    let pinned: Pinned = match pinner.pin(addr, size as u64) {
        Ok(p) => p,
        Err(e) if stage && errno::stageable(&e) => {
            return stage_pin(g, ordinal, addr, size, &e.to_string());
        }
        Err(e) => {
            failure(addr, size, pinner.backend(), &e);
            return Err(errno::of_pin(&e));
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
        return Err(libc::EINVAL);
    };
    log!(
        Level::Info,
        "gdr_pin_buffer: {addr:#x}+{size} pinned ({backend}{}): handle {h}, va {:#x}, {} bytes",
        if pooled { ", gdr allocator chunk" } else { "" },
        window.va,
        window.len
    );
    Ok(GdrMh { h: h as c_ulong })
}

/// Logs why the pin of `[addr, addr + size)` on `backend` failed with `e` (its errno is
/// [`errno::of_pin`]'s).
fn failure(addr: u64, size: usize, backend: PinBackend, e: &PinError) {
    match e {
        PinError::NotExportable { .. } | PinError::MmapRefused { .. } => {
            refusal(addr, size, backend, e)
        }
        PinError::Peer(gdr::peer::PeerError::OutsideAllocation { .. }) => log!(
            Level::Error,
            "gdr_pin_buffer: {addr:#x}+{size} spans more than one CUDA allocation ({e}); a \
             pin lies inside one (PyTorch's expandable segments are 2 MiB / 20 MiB chunks)"
        ),
        PinError::Pool(_) => log!(Level::Error, "gdr_pin_buffer: {e}"),
        PinError::Cuda(_) | PinError::Peer(_) => log!(
            Level::Error,
            "gdr_pin_buffer: {addr:#x}+{size} is not CUDA memory of this GPU: {e}"
        ),
        e => log!(Level::Error, "gdr_pin_buffer: {addr:#x}+{size}: {e}"),
    }
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
    why: &str,
) -> Result<GdrMh, c_int> {
    let ctx = match Context::on(ordinal) {
        Ok(c) => c,
        Err(e) => {
            log!(Level::Error, "gdr_pin_buffer: GPU {ordinal}: {e}");
            return Err(libc::EIO);
        }
    };
    let page = gdr::GPU_PAGE_SIZE;
    let Some(end) = addr
        .checked_add(size as u64)
        .and_then(|e| e.checked_next_multiple_of(page))
    else {
        return Err(libc::EINVAL);
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
        return Err(libc::EINVAL);
    };
    log!(
        Level::Info,
        "gdr_pin_buffer: {addr:#x}+{size} staged (copies through the copy engine; {why}): \
         handle {h}, va {va:#x}, {} bytes",
        window.len
    );
    Ok(GdrMh { h: h as c_ulong })
}

/// gdrcopy's `gdr_pin_buffer`: pins `size` bytes of CUDA device memory at `addr` for a CPU
/// mapping, through the backend of the GPU that owns `addr`, and writes the new handle to
/// `*handle`. The P2P token and VA space (for legacy UVA-less code) are ignored, as gdrcopy's
/// own dma-buf backend does. The range the handle covers is `addr` rounded out to pages
/// ([`GdrInfoV2`](crate::GdrInfoV2)).
///
/// 0, or:
/// - EINVAL: `g` not open, `handle` NULL, `size` 0, `addr` not CUDA device memory, or the
///   range not inside one allocation;
/// - ENOTSUP: no backend can pin on that GPU, or this one cannot pin this kind of memory (a
///   plain `cuMemAlloc` range on Vulkan without gdr's allocator; the log says what works),
///   unless `g` stages such pins (see [`gdr_open`](crate::gdr_open)): then 0, and the copies
///   of the handle run on the copy engine;
/// - ENOMEM: memory ran out while gdr's allocator mapped the chunk that holds the range;
/// - EIO: the backend failed otherwise.
///
/// # Safety
/// `handle` is NULL or valid for a write of a [`GdrMh`]. `addr` is only looked up, never
/// dereferenced: any value is safe.
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    handle: *mut GdrMh,
) -> c_int {
    // SAFETY: `handle` is NULL or writable, as this function's caller guarantees.
    guard("gdr_pin_buffer", || unsafe { pin(g, addr, size, handle) })
}

/// gdrcopy's `gdr_pin_buffer_v2`: [`gdr_pin_buffer`] with `flags`, a set of
/// `gdr_pin_flags_t` bits: only [`PIN_FLAG_FORCE_PCIE`], which is what every mapping is on an
/// x86 host with a discrete GPU, so it changes nothing. Errors as `gdr_pin_buffer`, and EINVAL
/// for any other flag bit.
///
/// # Safety
/// As [`gdr_pin_buffer`]: `handle` is NULL or valid for a write of a [`GdrMh`].
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer_v2(
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
        // SAFETY: `handle` is NULL or writable, as this function's caller guarantees.
        unsafe { pin(g, addr, size, handle) }
    })
}

/// gdrcopy's `gdr_unpin_buffer`: unpins handle `mh` of `g` (a live mapping is torn down
/// first) and forgets it.
///
/// 0, or EINVAL when `g` is not open, `mh` is not a handle of `g`, or it came from
/// [`gdr_alloc_mapped`](crate::gdr_alloc_mapped) (released with
/// [`gdr_free_mapped`](crate::gdr_free_mapped)).
#[no_mangle]
pub extern "C" fn gdr_unpin_buffer(g: *mut c_void, mh: GdrMh) -> c_int {
    guard("gdr_unpin_buffer", || {
        take_handle(g, mh, |k| {
            matches!(k, Kind::Pin { .. } | Kind::Staged { .. })
        })
    })
}

/// gdrcopy's `gdr_get_callback_flag`: writes 1 to `*flag` when the application freed the
/// pinned memory before unpinning it, else 0 (always 0 for a
/// [`gdr_alloc_mapped`](crate::gdr_alloc_mapped) handle). gdrdrv says so itself; the
/// persistent backends hold the memory until unpin and tell by the allocation's BUFFER_ID or,
/// for allocator memory, by asking the allocator (see `Pinned::callback_fired`).
///
/// 0, or EINVAL (`flag` NULL, `g` not open, `mh` not a handle of `g`), or EIO when the check
/// itself fails.
///
/// # Safety
/// `flag` is NULL or valid for a write of a `c_int`.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_callback_flag(
    g: *mut c_void,
    mh: GdrMh,
    flag: *mut c_int,
) -> c_int {
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
            // SAFETY: `flag` is not NULL, and writable by this function's contract.
            Ok(f) => unsafe { put(flag, c_int::from(f)) },
            Err(e) => {
                log!(Level::Error, "gdr_get_callback_flag: {e}");
                libc::EIO
            }
        }
    })
}
