//! The driver's own entry points behind the ones this library puts in front of them, and the C
//! library's own `dlsym`.
//!
//! Every pointer here comes from the real `dlsym` on libcuda's handle, never through this
//! library's `dlsym`, so none of them can lead back here.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

// The driver API's own names, as gdr-cuda's (private) sys layer spells them too: kept to this
// library, so the workspace's public types stay one name, one definition.
/// `CUresult`: a driver call's status.
pub(crate) type CUresult = c_int;
/// `CUdeviceptr`: a device address.
pub(crate) type CUdeviceptr = u64;
/// The signature of `dlsym(handle, name)`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`: an argument the call refuses.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_READY`: `cuEventQuery` of an event whose work is still pending.
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
/// What an entry point answers when libcuda lacks the function it stands in front of.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// The C library's `dlsym` (glibc 2.34+ exports it from libc as GLIBC_2.34; older ones from
/// libdl as GLIBC_2.2.5).
pub fn dlsym() -> DlsymFn {
    static REAL: OnceLock<usize> = OnceLock::new();
    let p = *REAL.get_or_init(|| {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym is not interposed by this library; both strings are NUL-terminated.
            let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                return p as usize;
            }
        }
        0
    });
    assert!(p != 0, "gdr_alloc: the C library's dlsym cannot be found");
    // SAFETY: the C library's dlsym has this signature.
    unsafe { std::mem::transmute::<usize, DlsymFn>(p) }
}

/// libcuda's handle (the loaded one; loaded now if no one has yet), or null.
pub fn libcuda() -> *mut c_void {
    static HANDLE: OnceLock<usize> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        for flags in [libc::RTLD_NOW | libc::RTLD_NOLOAD, libc::RTLD_NOW] {
            // SAFETY: a NUL-terminated name; libcuda's initialisers need nothing from us.
            let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) };
            if !h.is_null() {
                return h as usize;
            }
        }
        0
    }) as *mut c_void
}

/// The real `name` in libcuda, or null.
pub fn lookup(name: &CStr) -> *mut c_void {
    let h = libcuda();
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    unsafe { dlsym()(h, name.as_ptr()) }
}

macro_rules! real_functions {
    ($( $field:ident = $sym:literal : $ty:ty; )*) => {
        /// libcuda's own entry points (`None` where libcuda lacks one).
        pub struct Real {
            $( pub $field: Option<$ty>, )*
        }

        impl Real {
            fn load() -> Real {
                Real {
                    $( $field: {
                        let p = lookup($sym);
                        // SAFETY: libcuda's symbol of this name has this signature (cuda.h).
                        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
                    }, )*
                }
            }

            /// Whether `p` is one of the entry points above.
            pub fn is(&self, p: usize) -> Option<&'static str> {
                $( if self.$field.is_some_and(|f| f as usize == p) {
                    return Some(stringify!($field));
                } )*
                None
            }
        }
    };
}

/// Calls the real entry point `$field` of [`Real`] with the arguments, or answers
/// `CUDA_ERROR_NOT_FOUND` when libcuda lacks it.
macro_rules! call_real {
    ($field:ident($($arg:expr),* $(,)?)) => {
        match $crate::real::real().$field {
            // SAFETY: the caller's arguments are passed on to the function they were meant for.
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::real::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use call_real;

type R = CUresult;
type Ptr = CUdeviceptr;

real_functions! {
    mem_alloc_v2 = c"cuMemAlloc_v2": unsafe extern "C" fn(*mut Ptr, usize) -> R;
    mem_alloc_pitch_v2 = c"cuMemAllocPitch_v2": unsafe extern "C" fn(*mut Ptr, *mut usize, usize, usize, u32) -> R;
    mem_free_v2 = c"cuMemFree_v2": unsafe extern "C" fn(Ptr) -> R;
    mem_free_async = c"cuMemFreeAsync": unsafe extern "C" fn(Ptr, *mut c_void) -> R;
    mem_create = c"cuMemCreate": unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> R;
    mem_get_address_range_v2 = c"cuMemGetAddressRange_v2": unsafe extern "C" fn(*mut Ptr, *mut usize, Ptr) -> R;
    ipc_get_mem_handle = c"cuIpcGetMemHandle": unsafe extern "C" fn(*mut c_void, Ptr) -> R;
    pointer_set_attribute = c"cuPointerSetAttribute": unsafe extern "C" fn(*const c_void, c_int, Ptr) -> R;
    pointer_get_attribute = c"cuPointerGetAttribute": unsafe extern "C" fn(*mut c_void, c_int, Ptr) -> R;
    pointer_get_attributes = c"cuPointerGetAttributes": unsafe extern "C" fn(u32, *mut c_int, *mut *mut c_void, Ptr) -> R;
    get_proc_address = c"cuGetProcAddress": unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> R;
    get_proc_address_v2 = c"cuGetProcAddress_v2": unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> R;
    // The legacy entry points (32-bit device pointers): recognised, passed through.
    mem_alloc_v1 = c"cuMemAlloc": unsafe extern "C" fn(*mut u32, u32) -> R;
    mem_alloc_pitch_v1 = c"cuMemAllocPitch": unsafe extern "C" fn(*mut u32, *mut u32, u32, u32, u32) -> R;
    mem_free_v1 = c"cuMemFree": unsafe extern "C" fn(u32) -> R;
    mem_get_address_range_v1 = c"cuMemGetAddressRange": unsafe extern "C" fn(*mut u32, *mut u32, u32) -> R;
    stream_synchronize = c"cuStreamSynchronize": unsafe extern "C" fn(*mut c_void) -> R;
    ctx_synchronize = c"cuCtxSynchronize": unsafe extern "C" fn() -> R;
    ctx_get_current = c"cuCtxGetCurrent": unsafe extern "C" fn(*mut *mut c_void) -> R;
    ctx_get_device = c"cuCtxGetDevice": unsafe extern "C" fn(*mut c_int) -> R;
    ctx_get_flags = c"cuCtxGetFlags": unsafe extern "C" fn(*mut u32) -> R;
    ctx_set_flags = c"cuCtxSetFlags": unsafe extern "C" fn(u32) -> R;
    event_create = c"cuEventCreate": unsafe extern "C" fn(*mut *mut c_void, u32) -> R;
    event_record = c"cuEventRecord": unsafe extern "C" fn(*mut c_void, *mut c_void) -> R;
    event_query = c"cuEventQuery": unsafe extern "C" fn(*mut c_void) -> R;
    event_synchronize = c"cuEventSynchronize": unsafe extern "C" fn(*mut c_void) -> R;
    event_destroy = c"cuEventDestroy_v2": unsafe extern "C" fn(*mut c_void) -> R;
}

/// The real entry points, looked up once.
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(Real::load)
}
