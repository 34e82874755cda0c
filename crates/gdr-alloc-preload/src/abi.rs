//! The functions of `gdr_alloc.h`: for frameworks' allocator hooks and for libraries that map
//! the allocator's memory (libgdrapi and gdr's Python package, through `gdr::bar::pool`).

use crate::real::{CUdeviceptr, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::state::{self, say};
use gdr::bar::pool::{PoolPinInfo, ABI_VERSION};
use gdr_alloc::{AllocError, Stats};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `CUDA_ERROR_NOT_SUPPORTED`: the pool does not serve that GPU.
const NOT_SUPPORTED: CUresult = crate::real::CUDA_ERROR_NOT_SUPPORTED;

fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Allocates `size` bytes on `device` from the pool.
fn alloc_on(size: u64, device: c_int) -> Result<u64, CUresult> {
    let a = state::get().ok_or(NOT_SUPPORTED)?;
    a.drain_deferred(false);
    a.serves(device).map_err(|_| NOT_SUPPORTED)?;
    a.pool.alloc(device, size).map_err(|e| match e {
        AllocError::OutOfMemory(_) => crate::real::CUDA_ERROR_OUT_OF_MEMORY,
        AllocError::BadSize(_) => CUDA_ERROR_INVALID_VALUE,
        AllocError::Source(e) => {
            say(
                1,
                format_args!("allocation of {size} bytes on GPU {device}: {e}"),
            );
            NOT_SUPPORTED
        }
    })
}

/// `gdr_alloc_abi_version`: the version of gdr_alloc.h's functions and structures
/// (`GDR_ALLOC_ABI_VERSION`), for a client to check before it calls the others.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_abi_version() -> c_int {
    ABI_VERSION
}

/// `gdr_alloc_active`: 1 when allocations on CUDA device `device` come from the pool, else 0
/// with the reason copied into `why` (NUL-terminated, cut to `len` bytes). Probes the device
/// the first time (a chunk made, imported into Vulkan and mapped).
///
/// # Safety
/// `why`, when not null, must be writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_alloc_active(device: c_int, why: *mut c_char, len: usize) -> c_int {
    guarded(0, || {
        let r = match state::get() {
            None => Err("the allocator is switched off (GDR_ALLOC) or misconfigured".to_owned()),
            Some(a) => a.serves(device),
        };
        if let (Err(reason), false, true) = (&r, why.is_null(), len > 0) {
            let n = reason.len().min(len - 1);
            // SAFETY: the caller gives `len` writable bytes; n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(reason.as_ptr(), why.cast::<u8>(), n);
                why.add(n).write(0);
            }
        }
        c_int::from(r.is_ok())
    })
}

/// `gdr_alloc_malloc`: `size` bytes on `device` from the pool, written to `*dptr`. A
/// `CUresult`: `CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_NOT_SUPPORTED` where the pool is not
/// active, or `CUDA_ERROR_INVALID_VALUE` for a null `dptr` or a size of 0.
///
/// # Safety
/// `dptr` must be writable (or null: CUDA_ERROR_INVALID_VALUE).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_alloc_malloc(
    dptr: *mut CUdeviceptr,
    size: usize,
    device: c_int,
) -> CUresult {
    guarded(crate::real::CUDA_ERROR_NOT_FOUND, || {
        if dptr.is_null() || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match alloc_on(size as u64, device) {
            Ok(a) => {
                // SAFETY: non-null, the caller's out-pointer.
                unsafe { dptr.write(a) };
                CUDA_SUCCESS
            }
            Err(rc) => rc,
        }
    })
}

/// `gdr_alloc_free`: as `cuMemFree` (waits for the context's work first).
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_free(dptr: CUdeviceptr) -> CUresult {
    guarded(crate::real::CUDA_ERROR_NOT_FOUND, || {
        let Some(a) = state::existing() else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if a.pool.block_at(dptr).is_none_or(|b| b.addr != dptr) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: a pool block, freed as cuMemFree frees it.
        unsafe { crate::interpose::cuMemFree_v2(dptr) }
    })
}

/// `gdr_alloc_torch_malloc`: PyTorch's `CUDAPluggableAllocator` allocation hook.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_torch_malloc(
    size: isize,
    device: c_int,
    _stream: *mut c_void,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let Ok(size) = u64::try_from(size) else {
            return std::ptr::null_mut();
        };
        if size == 0 {
            // PyTorch asks for 0 bytes for empty tensors and accepts null.
            return std::ptr::null_mut();
        }
        alloc_on(size, device).map_or(std::ptr::null_mut(), |a| a as *mut c_void)
    })
}

/// `gdr_alloc_torch_free`: PyTorch's free hook. The block is reused only after the work queued
/// on `stream` before the free is done.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_torch_free(
    ptr: *mut c_void,
    _size: isize,
    _device: c_int,
    stream: *mut c_void,
) {
    guarded((), || {
        if let Some(a) = state::existing() {
            if a.pool
                .block_at(ptr as u64)
                .is_some_and(|b| b.addr == ptr as u64)
            {
                a.free_after(ptr as u64, stream);
            }
        }
    })
}

/// `gdr_alloc_pin`: pins `[addr, addr + size)` of pool memory and describes its chunk in
/// `*out`. 0 or an errno: ENOENT not pool memory, EINVAL the range leaves its chunk (or size 0,
/// or a null `out`), ENOTSUP or ENOMEM the chunk cannot be mapped, EIO an internal error.
///
/// # Safety
/// `out` must be writable (or null: EINVAL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_alloc_pin(addr: u64, size: usize, out: *mut PoolPinInfo) -> c_int {
    guarded(libc::EIO, || {
        if out.is_null() {
            return libc::EINVAL;
        }
        let Some(a) = state::existing() else {
            return libc::ENOENT;
        };
        match a.pool.pin(addr, size as u64) {
            Ok(p) => {
                // SAFETY: non-null, the caller's out-pointer.
                unsafe {
                    out.write(PoolPinInfo {
                        id: p.id,
                        base: p.base,
                        size: p.size,
                        cpu: p.cpu.cast(),
                        device: p.device,
                        reserved: 0,
                    })
                };
                0
            }
            Err(e) => {
                if e.errno() != libc::ENOENT {
                    say(1, format_args!("gdr_alloc_pin({addr:#x}+{size}): {e}"));
                }
                e.errno()
            }
        }
    })
}

/// `gdr_alloc_unpin`: ends pin `id`, closing its mappings still open; memory freed under it
/// (and under no other pin) can be handed out again. 0, or EINVAL for an unknown id.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_unpin(id: u64) -> c_int {
    guarded(libc::EIO, || match state::existing() {
        Some(a) if a.pool.unpin(id).is_ok() => 0,
        _ => libc::EINVAL,
    })
}

/// `gdr_alloc_map`: opens the 64 KiB pages around pin `id`'s range, so the CPU may use
/// `cpu + (addr - base)` until `gdr_alloc_unmap`. 0, or EINVAL for an unknown id.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_map(id: u64) -> c_int {
    guarded(libc::EIO, || match state::existing() {
        Some(a) if a.pool.map(id).is_ok() => 0,
        _ => libc::EINVAL,
    })
}

/// `gdr_alloc_unmap`: undoes one `gdr_alloc_map` of pin `id` (its pages close when no other
/// mapped pin covers them). 0, or EINVAL for an unknown or unmapped id.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_unmap(id: u64) -> c_int {
    guarded(libc::EIO, || match state::existing() {
        Some(a) if a.pool.unmap(id).is_ok() => 0,
        _ => libc::EINVAL,
    })
}

/// `gdr_alloc_pin_freed`: `*freed` = 1 once an allocation the pin overlapped when it was made
/// has been freed (gdrcopy's callback flag), else 0. 0, or EINVAL for an unknown id or a null
/// `freed`.
///
/// # Safety
/// `freed` must be writable (or null: EINVAL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_alloc_pin_freed(id: u64, freed: *mut c_int) -> c_int {
    guarded(libc::EIO, || {
        let f = state::existing().and_then(|a| a.pool.pin_freed(id));
        match (f, freed.is_null()) {
            (Some(f), false) => {
                // SAFETY: non-null, the caller's out-pointer.
                unsafe { freed.write(c_int::from(f)) };
                0
            }
            _ => libc::EINVAL,
        }
    })
}

/// `gdr_alloc_get_stats`: the pool's counters into `*out` (all 0 before the first
/// allocation). 0, or EINVAL for a null `out`.
///
/// # Safety
/// `out` must be writable (or null: EINVAL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gdr_alloc_get_stats(out: *mut Stats) -> c_int {
    guarded(libc::EIO, || {
        if out.is_null() {
            return libc::EINVAL;
        }
        let s = state::existing()
            .map(|a| a.pool.stats())
            .unwrap_or_default();
        // SAFETY: non-null, the caller's out-pointer (gdr_alloc_stats_t has Stats's layout).
        unsafe { out.write(s) };
        0
    })
}

/// `gdr_alloc_trim`: waits for the deferred (stream-ordered) frees, then gives every empty,
/// unpinned chunk back to the driver; the number of bytes released.
#[unsafe(no_mangle)]
pub extern "C" fn gdr_alloc_trim() -> u64 {
    guarded(0, || {
        state::existing().map_or(0, |a| {
            a.drain_deferred(true);
            a.pool.trim(None)
        })
    })
}
