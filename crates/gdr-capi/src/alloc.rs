//! gdr's extension for hosts where existing memory cannot be pinned: `gdr_alloc_mapped` and
//! `gdr_free_mapped`.

use crate::entry::{guard, put};
use crate::log::{log, Level};
use crate::table::{self, insert, take_handle, Handle, Kind};
use crate::{errno, GdrMh};
use gdr::cuda::DeviceMemory;
use std::ffi::{c_int, c_ulong, c_void};

/// gdr extension, `gdr_alloc_mapped`: `size` bytes of new GPU memory on `g`'s GPU with a CPU
/// mapping, through Vulkan (64 KiB aligned): for hosts where existing memory cannot be
/// pinned. Writes the CUDA device address to `*dptr` and a handle to `*handle`, which works
/// with [`gdr_map`](crate::gdr_map), [`gdr_unmap`](crate::gdr_unmap), `gdr_get_info(_v2)`
/// and the copies, and is released with [`gdr_free_mapped`].
///
/// 0, or:
/// - EINVAL: `g` not open, `dptr` or `handle` NULL, `size` 0 or a size Vulkan cannot lay out;
/// - ENOTSUP: `gdr_open` found no usable Vulkan mapping on this GPU;
/// - ENOMEM: the GPU memory (or its mappable part) is exhausted;
/// - EIO: the allocation failed otherwise.
///
/// # Safety
/// `dptr` and `handle` are each NULL or valid for a write of their type.
#[no_mangle]
pub unsafe extern "C" fn gdr_alloc_mapped(
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
                return errno::of_alloc(&e);
            }
        };
        let addr = buf.device_ptr();
        let ctx = buf.context().clone();
        let entry = Handle::new(g as usize, Kind::Alloc { buf, mapped: false }, ctx);
        let Some(h) = insert(g, entry) else {
            return libc::EINVAL;
        };
        // SAFETY: both are non-NULL (checked above) and writable by this function's contract.
        unsafe {
            put(dptr, addr as c_ulong);
            put(handle, GdrMh { h: h as c_ulong })
        }
    })
}

/// gdr extension, `gdr_free_mapped`: frees the memory of a [`gdr_alloc_mapped`] handle (a live
/// mapping is torn down first) and forgets the handle.
///
/// 0, or EINVAL when `g` is not open, `mh` is not a handle of `g`, or it is a pin (released
/// with [`gdr_unpin_buffer`](crate::gdr_unpin_buffer)).
#[no_mangle]
pub extern "C" fn gdr_free_mapped(g: *mut c_void, mh: GdrMh) -> c_int {
    guard("gdr_free_mapped", || {
        take_handle(g, mh, |k| matches!(k, Kind::Alloc { .. }))
    })
}
