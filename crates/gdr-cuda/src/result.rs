//! The checked layer over [`sys`]: the error type, the loaded driver, and the turning of every
//! `CUresult` into a typed [`Result`] that names the failing call.

use super::{nvrtc, sys};
use crate::dylib::{self, LibrarySpec, LoadError};
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// Errors from the CUDA layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// libcuda is not installed ([`LoadError::NotInstalled`]) or too old
    /// ([`LoadError::MissingSymbol`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("no CUDA device: the driver is installed but sees no GPU")]
    NoDevice,
    #[error("CUDA device {ordinal} does not exist ({count} present)")]
    BadOrdinal { ordinal: usize, count: usize },
    #[error("{call} failed: {name} ({code}): {text}")]
    Driver {
        call: &'static str,
        code: i32,
        name: String,
        text: String,
    },
    #[error("{what}: range {offset}+{len} is outside a {size}-byte buffer")]
    OutOfBounds {
        what: &'static str,
        offset: usize,
        len: usize,
        size: usize,
    },
    /// The driver reported a number no driver reports (a device count below 0 or past
    /// [`MAX_DEVICES`](super::MAX_DEVICES), a negative ordinal): a broken or fake libcuda.
    #[error("{call} reported {value}, which no working driver reports (a broken or fake libcuda)")]
    Implausible { call: &'static str, value: i64 },
    #[error("kernel name {0:?} contains a NUL byte")]
    BadName(String),
    #[error(transparent)]
    Nvrtc(#[from] nvrtc::NvrtcError),
}

impl CudaError {
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: i32 = sys::CUDA_ERROR_INVALID_VALUE;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = sys::CUDA_ERROR_OUT_OF_MEMORY;
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = sys::CUDA_ERROR_NOT_SUPPORTED;

    /// The raw `CUresult` if this is a driver error.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the driver ran out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.code() == Some(Self::OUT_OF_MEMORY)
    }

    /// Whether the driver refused the call as not supported here.
    pub fn is_not_supported(&self) -> bool {
        self.code() == Some(Self::NOT_SUPPORTED)
    }

    /// Whether the driver refused an argument.
    pub fn is_invalid_value(&self) -> bool {
        self.code() == Some(Self::INVALID_VALUE)
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The loaded and initialised driver.
pub struct Driver {
    pub(crate) api: sys::DriverApi,
    version: i32,
}

static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();

/// Loads `libcuda.so.1` and calls `cuInit` once per process.
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(load_driver)
        .as_ref()
        .map_err(Clone::clone)
}

/// libcuda as [`dylib`] names it in errors.
pub static LIBCUDA: LibrarySpec = LibrarySpec {
    what: "the CUDA driver library (libcuda.so.1)",
    install: "install the NVIDIA driver (e.g. the nvidia-driver or libnvidia-compute package)",
    update: "update the NVIDIA driver",
};

fn load_driver() -> Result<Driver> {
    let lib = dylib::open(&LIBCUDA, &["libcuda.so.1", "libcuda.so"])?;
    // SAFETY: the library is libcuda; its symbols follow cuda.h.
    let api = unsafe { sys::DriverApi::resolve(lib) }?;
    let drv = Driver { api, version: 0 };
    // SAFETY: cuInit takes flags 0 and may be called any number of times.
    drv.check("cuInit", unsafe { (drv.api.init)(0) })?;
    let mut version = 0;
    // SAFETY: out-pointer to a live local.
    drv.check("cuDriverGetVersion", unsafe {
        (drv.api.driver_get_version)(&mut version)
    })?;
    Ok(Driver { version, ..drv })
}

impl Driver {
    /// Turns a `CUresult` into a typed error naming the call.
    pub fn check(&self, call: &'static str, rc: sys::CUresult) -> Result<()> {
        if rc == sys::CUDA_SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the driver returns a pointer to a static string or leaves it null.
            unsafe {
                if f(rc, &mut p) == sys::CUDA_SUCCESS && !p.is_null() {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                } else {
                    "unknown error".into()
                }
            }
        };
        Err(CudaError::Driver {
            call,
            code: rc,
            name: text(self.api.get_error_name),
            text: text(self.api.get_error_string),
        })
    }

    /// Driver version as CUDA encodes it (e.g. 13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// "13.0" style.
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version / 1000, (self.version % 1000) / 10)
    }
}
