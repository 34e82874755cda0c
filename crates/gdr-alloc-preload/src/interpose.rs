//! The driver entry points this library puts in front of libcuda's.
//!
//! A program reaches the driver three ways, and each is covered:
//! - by symbol (`cuMemAlloc_v2` called directly, as gdrcopy's tests do): the preloaded library
//!   comes first in the global scope, so its exports below win;
//! - through `cuGetProcAddress` (how the CUDA runtime 12+ reaches the driver, also when linked
//!   statically into a program): the wrappers of `cuGetProcAddress(_v2)` hand out this
//!   library's entry points for the functions it serves;
//! - through `dlsym` on libcuda's handle, which is how the runtime finds `cuGetProcAddress`:
//!   this library's `dlsym` answers a lookup that finds libcuda's `cuGetProcAddress(_v2)` with
//!   its own. Other handle lookups get what the C library's `dlsym` finds, libcuda's own
//!   functions included: tools that patch libcuda's code (UCX's memory hooks, in their default
//!   bistro mode) look the functions up so, and must find the real ones. Code that loads the
//!   driver's allocation calls by `dlsym` on libcuda's handle (Python's ctypes on
//!   libcuda.so.1) therefore is not served. Lookups in the global scope (`RTLD_DEFAULT`,
//!   `RTLD_NEXT`) go on to the C library's `dlsym` as a tail call, so the caller it sees is the
//!   real one (this library's exports are found there anyway).
//!
//! Served: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`, `cuMemFree_v2` (and `cuMemFreeAsync` of pool
//! memory) from the pool; `cuMemCreate` gets a POSIX-fd handle type added when it asks for none;
//! `cuMemGetAddressRange_v2` reports the chunk an address lies in (what
//! `cuMemRetainAllocationHandle` hands out); `cuIpcGetMemHandle` refuses pool memory with a
//! message; `cuPointerGetAttribute(s)` report the context pool memory was allocated in.
//! Everything else, and every call the pool does not serve (see `Config`), goes to libcuda
//! unchanged.

use crate::real::{self, call_real, CUdeviceptr, CUresult, CUDA_SUCCESS};
use crate::state::{self, say, say_once};
use gdr_alloc::AllocError;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// `CUDA_ERROR_UNKNOWN`: what an entry point answers if this library fails inside (a bug).
const CUDA_ERROR_UNKNOWN: CUresult = 999;
/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
const POINTER_ATTRIBUTE_CONTEXT: c_int = 1;
/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
const POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;
/// `CU_CTX_SYNC_MEMOPS`.
const CTX_SYNC_MEMOPS: u32 = 0x80;
/// The pitch of `cuMemAllocPitch` rows: a multiple of this.
const PITCH_ALIGN: usize = 512;

/// Runs an entry point's body; a panic (a bug here) is said and answered with
/// `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
fn guard(name: &str, f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        say_once(1, name, &format!("{name}: internal error (panic)"));
        CUDA_ERROR_UNKNOWN
    })
}

/// Whether a call from code at `caller` is excluded by `GDR_ALLOC_EXCLUDE`.
fn excluded(config: &gdr_alloc::Config, caller: usize) -> bool {
    if config.exclude.is_empty() || caller == 0 {
        return false;
    }
    // SAFETY: `Dl_info` is plain C data (pointers and integers): all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables (any address may be asked about); `info` is
    // a live out-parameter.
    if unsafe { libc::dladdr(caller as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return false;
    }
    // SAFETY: dladdr gave a NUL-terminated file name.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    config.excludes_caller(&file)
}

/// An allocation of `size` bytes on the caller's current GPU from the pool: `None` to pass it
/// through, `Some(Err)` for out of memory.
fn serve(size: u64, caller: usize, what: &str) -> Option<Result<u64, CUresult>> {
    let a = state::get()?;
    let passed = |why: &str| {
        a.pool.count_passed_through();
        say(2, format_args!("{what}({size}) passed through: {why}"));
        None
    };
    if !a.config.serves_size(size) {
        return passed("size outside GDR_ALLOC_MIN_SIZE..GDR_ALLOC_MAX_SIZE");
    }
    if excluded(&a.config, caller) {
        return passed("caller in GDR_ALLOC_EXCLUDE");
    }
    let Some(dev) = state::current_device() else {
        return passed("no current CUDA context");
    };
    if let Err(why) = a.serves(dev) {
        return passed(&why);
    }
    match a.pool.alloc(dev, size) {
        Ok(addr) => {
            say(2, format_args!("{what}({size}) on GPU {dev}: {addr:#x}"));
            Some(Ok(addr))
        }
        Err(AllocError::OutOfMemory(_)) => {
            say(
                2,
                format_args!("{what}({size}) on GPU {dev}: out of memory"),
            );
            Some(Err(real::CUDA_ERROR_OUT_OF_MEMORY))
        }
        Err(e) => {
            say_once(
                1,
                "alloc-failed",
                &format!("{what}({size}) on GPU {dev}: the pool failed ({e}); passed through"),
            );
            passed("the pool failed")
        }
    }
}

/// Frees pool memory at `p` the way `cuMemFree` does (after the context's work is done);
/// `None` when `p` is not a pool block.
fn release(p: CUdeviceptr) -> Option<CUresult> {
    let a = state::existing()?;
    if a.pool.block_at(p)?.addr != p {
        return None;
    }
    // cuMemFree waits for the device: work still queued may use the memory, and the pool hands
    // it out again at once.
    let rc = match state::current_device() {
        Some(_) => call_real!(ctx_synchronize()),
        None => CUDA_SUCCESS,
    };
    a.pool.free(p);
    say(2, format_args!("free({p:#x})"));
    Some(rc)
}

// ---- the entry points ----
//
// The allocation entry points learn their caller (for GDR_ALLOC_EXCLUDE) from a trampoline
// that passes the return address on as one more argument: on x86-64 the return address is at
// [rsp] on entry, and the next argument register is free. Elsewhere the caller is unknown (0).

macro_rules! with_caller {
    ($(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) => $imp:ident, $reg:literal) => {
        $(#[$m])*
        #[cfg(target_arch = "x86_64")]
        #[unsafe(no_mangle)]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            std::arch::naked_asm!(concat!("mov ", $reg, ", qword ptr [rsp]"), "jmp {imp}", imp = sym $imp)
        }

        $(#[$m])*
        #[cfg(not(target_arch = "x86_64"))]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            // SAFETY: the caller's arguments, passed on.
            unsafe { $imp($($arg),*, 0) }
        }
    };
}

with_caller!(
    /// `cuMemAlloc_v2`: `size` bytes on the current context's GPU from the pool where it
    /// serves the call (see `Config`), otherwise libcuda's.
    cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) => mem_alloc, "rdx"
);

unsafe extern "C" fn mem_alloc(dptr: *mut CUdeviceptr, size: usize, caller: usize) -> CUresult {
    guard("cuMemAlloc_v2", || {
        if dptr.is_null() || size == 0 {
            return call_real!(mem_alloc_v2(dptr, size));
        }
        match serve(size as u64, caller, "cuMemAlloc") {
            Some(Ok(addr)) => {
                // SAFETY: non-null out-pointer from the caller (cuMemAlloc's contract).
                unsafe { dptr.write(addr) };
                CUDA_SUCCESS
            }
            Some(Err(rc)) => rc,
            None => call_real!(mem_alloc_v2(dptr, size)),
        }
    })
}

with_caller!(
    /// `cuMemAllocPitch_v2`: rows of `width` bytes padded to a multiple of 512.
    cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element: u32
    ) => mem_alloc_pitch, "r9"
);

unsafe extern "C" fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: u32,
    caller: usize,
) -> CUresult {
    guard("cuMemAllocPitch_v2", || {
        let row = width.checked_next_multiple_of(PITCH_ALIGN);
        let bytes = row.and_then(|r| r.checked_mul(height));
        let valid = !dptr.is_null()
            && !pitch.is_null()
            && width > 0
            && height > 0
            && matches!(element, 4 | 8 | 16);
        // Anything the driver would refuse, it refuses itself.
        let (Some(row), Some(bytes), true) = (row, bytes, valid) else {
            return call_real!(mem_alloc_pitch_v2(dptr, pitch, width, height, element));
        };
        match serve(bytes as u64, caller, "cuMemAllocPitch") {
            Some(Ok(addr)) => {
                // SAFETY: non-null out-pointers from the caller (checked above).
                unsafe {
                    dptr.write(addr);
                    pitch.write(row);
                }
                CUDA_SUCCESS
            }
            Some(Err(rc)) => rc,
            None => call_real!(mem_alloc_pitch_v2(dptr, pitch, width, height, element)),
        }
    })
}

/// `cuMemFree_v2`: a pool block goes back to the pool after the context's work is done (as
/// the driver's call waits); any other address goes to libcuda.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard("cuMemFree_v2", || match release(dptr) {
        Some(rc) => rc,
        None => call_real!(mem_free_v2(dptr)),
    })
}

/// `cuMemFreeAsync`: pool memory is freed once the stream's work before this call is done.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: *mut c_void) -> CUresult {
    guard("cuMemFreeAsync", || {
        match state::existing().filter(|a| a.pool.block_at(dptr).is_some_and(|b| b.addr == dptr)) {
            Some(a) => a.free_after(dptr, stream),
            None => call_real!(mem_free_async(dptr, stream)),
        }
    })
}

/// `CUmemAllocationProp`'s head: the fields read here (the rest is copied as it is).
#[repr(C)]
#[derive(Clone, Copy)]
struct AllocationPropHead {
    type_: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
}

/// `cuMemCreate`: a device allocation that asks for no shareable handle gets the POSIX-fd
/// type, so it can be pinned and mapped (gdrcopy's own `cuMemCreate` path asks for none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    guard("cuMemCreate", || {
        let original = || call_real!(mem_create(handle, size, prop, flags));
        let Some(a) = state::get() else {
            return original();
        };
        if prop.is_null() {
            return original();
        }
        // CUmemAllocationProp is 32 bytes (cuda.h); the head is its first 16.
        let mut copy = [0u8; 32];
        // SAFETY: the caller passes a CUmemAllocationProp (cuMemCreate's contract).
        unsafe { std::ptr::copy_nonoverlapping(prop.cast::<u8>(), copy.as_mut_ptr(), 32) };
        // SAFETY: the head's fields are plain integers at the start of the copy.
        let mut head: AllocationPropHead =
            unsafe { std::ptr::read_unaligned(copy.as_ptr().cast()) };
        // PINNED (1) device (1) memory with no handle type (0), on a GPU the allocator serves.
        if !(head.type_ == 1
            && head.location_type == 1
            && head.requested_handle_types == 0
            && a.config.serves_gpu(head.location_id))
        {
            return original();
        }
        // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        head.requested_handle_types = 1;
        // SAFETY: writing the head back into our own 32-byte copy, whose first 16 bytes it is.
        unsafe { std::ptr::write_unaligned(copy.as_mut_ptr().cast(), head) };
        let rc = call_real!(mem_create(handle, size, copy.as_ptr().cast(), flags));
        if rc == CUDA_SUCCESS {
            say(
                2,
                format_args!("cuMemCreate({size}): POSIX-fd handle type added"),
            );
            return rc;
        }
        say_once(
            1,
            "cumemcreate",
            &format!("cuMemCreate with a POSIX-fd handle type failed ({rc}); made as asked"),
        );
        original()
    })
}

/// `cuMemGetAddressRange_v2`: for pool memory, the chunk that holds the address, as the
/// driver reports any `cuMemCreate` mapping and as a block of a caching allocator is reported
/// by its segment. The range must be the one `cuMemRetainAllocationHandle` hands out (the
/// chunk's): UCX's cuda_ipc and NCCL export that handle and have the peer map it at offset 0
/// for the length this call gave, so a block's own range would map the chunk's first bytes in
/// the peer, not the block's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuMemGetAddressRange_v2", || {
        match state::existing().and_then(|a| a.pool.chunk_range(dptr)) {
            Some((chunk, bytes)) => {
                // SAFETY: the out-pointers are the caller's; either may be null (cuda.h).
                unsafe {
                    if !base.is_null() {
                        base.write(chunk);
                    }
                    if !size.is_null() {
                        size.write(bytes as usize);
                    }
                }
                CUDA_SUCCESS
            }
            None => call_real!(mem_get_address_range_v2(base, size, dptr)),
        }
    })
}

/// `cuIpcGetMemHandle`: legacy CUDA IPC cannot share `cuMemCreate` memory; refused for pool
/// memory with a message instead of the driver's bare error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CUdeviceptr) -> CUresult {
    guard("cuIpcGetMemHandle", || {
        if state::existing().is_some_and(|a| a.pool.owns(dptr)) {
            say(
                1,
                format_args!(
                    "cuIpcGetMemHandle({dptr:#x}): legacy CUDA IPC cannot share memory of gdr's \
                     allocator (cuMemCreate chunks); share it as a POSIX fd \
                     (cuMemExportToShareableHandle), or keep this allocation from the allocator \
                     (GDR_ALLOC_EXCLUDE, GDR_ALLOC_MAX_SIZE, GDR_ALLOC=off)"
                ),
            );
            return real::CUDA_ERROR_NOT_SUPPORTED;
        }
        call_real!(ipc_get_mem_handle(handle, dptr))
    })
}

/// `cuPointerSetAttribute`: passed on. SYNC_MEMOPS on pool memory, where the driver refuses it
/// for `cuMemCreate` memory, is given its effect for the whole context instead
/// (`cuCtxSetFlags(CU_CTX_SYNC_MEMOPS)`, CUDA 12.1+: every synchronous memory operation of the
/// context then synchronises, which includes those on this memory), as UCX does for such
/// memory. gdrcopy's programs set it on every buffer they allocate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerSetAttribute(
    value: *const c_void,
    attribute: c_int,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuPointerSetAttribute", || {
        let rc = call_real!(pointer_set_attribute(value, attribute, dptr));
        if rc == CUDA_SUCCESS
            || attribute != POINTER_ATTRIBUTE_SYNC_MEMOPS
            || value.is_null()
            || !state::existing().is_some_and(|a| a.pool.owns(dptr))
        {
            return rc;
        }
        // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int (cuda.h); checked non-null.
        if unsafe { value.cast::<u32>().read() } == 0 {
            return rc;
        }
        let mut flags = 0u32;
        let set = if call_real!(ctx_get_flags(&mut flags)) == CUDA_SUCCESS {
            call_real!(ctx_set_flags(flags | CTX_SYNC_MEMOPS))
        } else {
            rc
        };
        say_once(
            1,
            "syncmemops",
            &if set == CUDA_SUCCESS {
                format!(
                    "cuPointerSetAttribute(SYNC_MEMOPS) on allocator memory: the driver refuses it \
                     for cuMemCreate memory ({rc}); set for the context instead (CU_CTX_SYNC_MEMOPS)"
                )
            } else {
                format!(
                    "cuPointerSetAttribute(SYNC_MEMOPS) on allocator memory: refused by the driver \
                     ({rc}), and cuCtxSetFlags(CU_CTX_SYNC_MEMOPS) too ({set})"
                )
            },
        );
        if set == CUDA_SUCCESS {
            CUDA_SUCCESS
        } else {
            rc
        }
    })
}

/// Fills the `CU_POINTER_ATTRIBUTE_CONTEXT` answer at `slot` for pool memory at `dptr`, where
/// the driver answered NULL (it has no context for `cuMemCreate` memory): the context
/// cudaMalloc would have reported, the one the allocation was served in. UCX's cuda_ipc, for
/// one, otherwise retains and releases the primary context on every copy of such memory.
fn fill_context(slot: *mut c_void, dptr: CUdeviceptr) {
    if slot.is_null() {
        return;
    }
    let slot = slot.cast::<*mut c_void>();
    // SAFETY: the caller's out-slot for CONTEXT (a CUcontext), just written by the driver.
    if !unsafe { slot.read() }.is_null() {
        return;
    }
    if let Some(ctx) = state::existing().and_then(|a| a.context_of(dptr)) {
        // SAFETY: as above.
        unsafe { slot.write(ctx) };
    }
}

/// `cuPointerGetAttribute`: passed on; `CU_POINTER_ATTRIBUTE_CONTEXT` of pool memory is the
/// context it was allocated in, as for cudaMalloc memory (see `fill_context`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuPointerGetAttribute", || {
        let rc = call_real!(pointer_get_attribute(data, attribute, dptr));
        if rc == CUDA_SUCCESS && attribute == POINTER_ATTRIBUTE_CONTEXT {
            fill_context(data, dptr);
        }
        rc
    })
}

/// `cuPointerGetAttributes`: as [`cuPointerGetAttribute`], for each CONTEXT asked for.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: u32,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    dptr: CUdeviceptr,
) -> CUresult {
    guard("cuPointerGetAttributes", || {
        let rc = call_real!(pointer_get_attributes(count, attributes, data, dptr));
        if rc != CUDA_SUCCESS || attributes.is_null() || data.is_null() {
            return rc;
        }
        for i in 0..count as usize {
            // SAFETY: the driver accepted `count` attributes and as many data pointers.
            let (attribute, slot) = unsafe { (attributes.add(i).read(), data.add(i).read()) };
            if attribute == POINTER_ATTRIBUTE_CONTEXT {
                fill_context(slot, dptr);
            }
        }
        rc
    })
}

// ---- cuGetProcAddress ----

/// The entry point of this library that stands for the driver's `name` when the driver
/// answered with `p` (`None`: hand out `p`).
fn stand_in(name: &[u8], p: usize) -> Option<usize> {
    let r = real::real();
    let v1 = |f: Option<usize>| f == Some(p);
    let ours: usize = match name {
        b"cuMemAlloc" if !v1(r.mem_alloc_v1.map(|f| f as usize)) => {
            cuMemAlloc_v2 as *const () as usize
        }
        b"cuMemAllocPitch" if !v1(r.mem_alloc_pitch_v1.map(|f| f as usize)) => {
            cuMemAllocPitch_v2 as *const () as usize
        }
        b"cuMemFree" if !v1(r.mem_free_v1.map(|f| f as usize)) => {
            cuMemFree_v2 as *const () as usize
        }
        b"cuMemGetAddressRange" if !v1(r.mem_get_address_range_v1.map(|f| f as usize)) => {
            cuMemGetAddressRange_v2 as *const () as usize
        }
        // Only the plain entry point (not a per-thread-default-stream variant).
        b"cuMemFreeAsync" if v1(r.mem_free_async.map(|f| f as usize)) => {
            cuMemFreeAsync as *const () as usize
        }
        b"cuMemCreate" => cuMemCreate as *const () as usize,
        b"cuIpcGetMemHandle" => cuIpcGetMemHandle as *const () as usize,
        b"cuPointerSetAttribute" => cuPointerSetAttribute as *const () as usize,
        b"cuPointerGetAttribute" => cuPointerGetAttribute as *const () as usize,
        b"cuPointerGetAttributes" => cuPointerGetAttributes as *const () as usize,
        b"cuGetProcAddress" if v1(r.get_proc_address.map(|f| f as usize)) => {
            cuGetProcAddress as *const () as usize
        }
        b"cuGetProcAddress" => cuGetProcAddress_v2 as *const () as usize,
        _ => return None,
    };
    Some(ours)
}

/// Replaces `*pfn` by this library's stand-in for `symbol`, if it has one.
fn substitute(symbol: *const c_char, pfn: *mut *mut c_void) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the driver accepted `symbol` as a NUL-terminated name and wrote `*pfn`.
    let (name, p) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn) };
    if p.is_null() {
        return;
    }
    if let Some(ours) = stand_in(name, p as usize) {
        say(
            2,
            format_args!(
                "cuGetProcAddress({}): gdr_alloc's entry point",
                String::from_utf8_lossy(name)
            ),
        );
        // SAFETY: the caller's out-pointer, written by the driver just now.
        unsafe { *pfn = ours as *mut c_void };
    }
}

/// `cuGetProcAddress` (CUDA 11.3-11.8's signature).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard("cuGetProcAddress", || {
        let rc = call_real!(get_proc_address(symbol, pfn, version, flags));
        if rc == CUDA_SUCCESS {
            substitute(symbol, pfn);
        }
        rc
    })
}

/// `cuGetProcAddress_v2` (CUDA 12+).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard("cuGetProcAddress_v2", || {
        let rc = call_real!(get_proc_address_v2(symbol, pfn, version, flags, status));
        if rc == CUDA_SUCCESS {
            substitute(symbol, pfn);
        }
        rc
    })
}

// ---- dlsym ----

/// What [`dlsym`] does next: `tail` non-zero: jump to it (the C library's dlsym) with the
/// caller's arguments and return address; else return `value`. Two integer registers (rax,
/// rdx) in the SysV ABI.
#[repr(C)]
struct DlsymNext {
    value: usize,
    tail: usize,
}

/// The load address of this library (to tell its own lookups apart).
fn own_base() -> usize {
    static BASE: OnceLock<usize> = OnceLock::new();
    *BASE.get_or_init(|| base_of(own_base as *const () as usize))
}

/// The load address of the object holding code address `p` (0 when unknown).
fn base_of(p: usize) -> usize {
    // SAFETY: `Dl_info` is plain C data (pointers and integers): all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables (any address may be asked about); `info` is
    // a live out-parameter.
    if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// libcuda's handle if it is loaded (never loads it: most lookups have nothing to do with
/// CUDA).
fn libcuda_loaded() -> bool {
    static LOADED: OnceLock<()> = OnceLock::new();
    if LOADED.get().is_some() {
        return true;
    }
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return false;
    }
    // SAFETY: balances the reference RTLD_NOLOAD took; libcuda stays (someone loaded it).
    unsafe { libc::dlclose(h) };
    LOADED.set(()).ok();
    true
}

/// The stand-in for what the real lookup found, for handle lookups of libcuda's
/// `cuGetProcAddress`.
fn dlsym_next(handle: *mut c_void, name: *const c_char, caller: usize) -> DlsymNext {
    let real_dlsym = real::dlsym();
    // Global-scope lookups depend on who asks: the C library does them, with the caller's
    // return address intact (the tail call). This library's exports are found there anyway.
    if handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT || name.is_null() {
        return DlsymNext {
            value: 0,
            tail: real_dlsym as usize,
        };
    }
    // SAFETY: a handle lookup (independent of the caller) with the caller's arguments.
    let found = unsafe { real_dlsym(handle, name) } as usize;
    let value = (|| {
        if found == 0 || !libcuda_loaded() || base_of(caller) == own_base() {
            return None;
        }
        let field = real::real().is(found)?;
        // SAFETY: NUL-terminated (the real dlsym found it).
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let base_name = match field {
            "get_proc_address" | "get_proc_address_v2" => b"cuGetProcAddress",
            _ => return None,
        };
        let ours = stand_in(base_name, found)?;
        say(
            2,
            format_args!(
                "dlsym({}): gdr_alloc's entry point",
                String::from_utf8_lossy(name)
            ),
        );
        Some(ours)
    })()
    .unwrap_or(found);
    DlsymNext { value, tail: 0 }
}

unsafe extern "C" fn dlsym_filter(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
) -> DlsymNext {
    catch_unwind(|| dlsym_next(handle, name, caller)).unwrap_or(DlsymNext {
        value: 0,
        tail: real::dlsym() as usize,
    })
}

/// `dlsym`: see the module's documentation.
///
/// # Safety
/// As the C library's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        // The caller's return address becomes the filter's third argument; the arguments are
        // kept for the tail call. Entry: rsp = 8 mod 16; after two pushes and 8 bytes, 0.
        "mov rdx, qword ptr [rsp]",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {filter}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rdx, rdx",
        "jz 2f",
        "jmp rdx",
        "2:",
        "ret",
        filter = sym dlsym_filter,
    )
}
