//! Mapping and unmapping: `gdr_map`, `gdr_map_v2` and `gdr_unmap`.

use crate::entry::{guard, put};
use crate::log::{log, Level};
use crate::table::{self, with_handle, Kind};
use crate::{GdrMh, MAP_FLAG_DEFAULT, MAP_FLAG_REQ_WC_MAPPING};
use std::ffi::{c_int, c_void};

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
///
/// # Safety
/// `va` is NULL (refused with EINVAL) or valid for a write of a pointer.
unsafe fn map_out(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    if va.is_null() {
        return libc::EINVAL;
    }
    match map(g, mh, size, flags) {
        // SAFETY: `va` is not NULL, and writable by this function's contract.
        Ok(cpu) => unsafe { put(va, cpu.cast()) },
        Err(e) => e,
    }
}

/// gdrcopy's `gdr_map`: maps the first `size` bytes of handle `mh` for the CPU (write-combined)
/// and writes to `*va` the CPU address of the handle's `va`
/// ([`GdrInfoV2::va`](crate::GdrInfoV2::va)): GPU address `d` is at `*va + (d - info.va)`. One
/// mapping per handle.
///
/// 0, or:
/// - EINVAL: `g` not open, `mh` not a handle of `g`, `va` NULL, `size` 0 or larger than
///   [`GdrInfoV2::mapped_size`](crate::GdrInfoV2::mapped_size), or a pin whose address does
///   not start a page (as gdrcopy: pin the page-aligned range around the buffer);
/// - EAGAIN: the handle is mapped already;
/// - EIO: the backend could not map it.
///
/// # Safety
/// `va` is NULL or valid for a write of a pointer. The address written there is the caller's
/// to read and write `size` bytes at until [`gdr_unmap`]; the handle's memory is not freed
/// before then.
#[no_mangle]
pub unsafe extern "C" fn gdr_map(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: `va` is NULL or writable, as this function's caller guarantees.
    guard("gdr_map", || unsafe {
        map_out(g, mh, va, size, MAP_FLAG_DEFAULT)
    })
}

/// gdrcopy's `gdr_map_v2`: [`gdr_map`] with `flags`, a `gdr_map_flags_t` value:
/// [`MAP_FLAG_DEFAULT`] and [`MAP_FLAG_REQ_WC_MAPPING`] are granted (mappings are
/// write-combined); the caching and device requests, and any other value, are EINVAL.
///
/// # Safety
/// As [`gdr_map`]: `va` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn gdr_map_v2(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    // SAFETY: `va` is NULL or writable, as this function's caller guarantees.
    guard("gdr_map_v2", || unsafe { map_out(g, mh, va, size, flags) })
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
