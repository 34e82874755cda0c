//! The checked layer over [`sys`]: the error type, the loaded driver, and the turning of every
//! `CUresult` into a typed [`Result`] that names the failing call.

use super::{host, nvrtc, sys};
use crate::dylib::{self, LibrarySpec, LoadError};
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// Errors from the CUDA layer.
///
/// # Examples
///
/// ```
/// use gdr_cuda::CudaError;
///
/// let e = CudaError::Driver {
///     call: "cuMemAlloc",
///     code: CudaError::OUT_OF_MEMORY,
///     name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
///     text: "out of memory".into(),
/// };
/// assert!(e.is_out_of_memory() && !e.is_invalid_value());
/// assert_eq!(e.code(), Some(2));
/// assert_eq!(e.to_string(), "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory");
/// // Errors raised before any driver call carry no CUresult.
/// assert_eq!(CudaError::NoDevice.code(), None);
/// ```
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// libcuda is not installed ([`LoadError::NotInstalled`]) or too old
    /// ([`LoadError::MissingSymbol`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The driver loaded but reports no GPU ([`Device::get`](super::Device::get) with a
    /// device count of 0): none installed, or all hidden by `CUDA_VISIBLE_DEVICES`.
    #[error("no CUDA device: the driver is installed but sees no GPU")]
    NoDevice,
    /// [`Device::get`](super::Device::get) was asked for an ordinal at or past the device count.
    #[error("CUDA device {ordinal} does not exist ({count} present)")]
    BadOrdinal {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver sees (`cuDeviceGetCount`); valid ordinals are `0..count`.
        count: usize,
    },
    /// `cuInit` failed where device nodes the driver needs are missing (a container started
    /// without them, or a kernel module not loaded): the nodes, and what to do about them here
    /// ([`host::Host::node_fix`]).
    #[error("{init}; {fix}")]
    MissingNodes {
        /// `cuInit`'s error (a [`CudaError::Driver`]).
        init: Box<CudaError>,
        /// The missing nodes, e.g. `/dev/nvidia-uvm` ([`host::Host::missing_nodes`]).
        nodes: Vec<String>,
        /// What is missing and how to get it, for this host or container.
        fix: String,
    },
    /// A driver call returned something other than `CUDA_SUCCESS`.
    #[error("{call} failed: {name} ({code}): {text}")]
    Driver {
        /// The driver entry point that failed, e.g. `cuMemAlloc`; for the attribute calls
        /// with the attribute in parentheses, e.g. `cuPointerGetAttribute(BUFFER_ID)`.
        call: &'static str,
        /// The raw `CUresult` (compare with [`CudaError::OUT_OF_MEMORY`] and its neighbours,
        /// or use [`CudaError::code`]).
        code: i32,
        /// The code's enum name from `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`;
        /// "unknown error" when the driver has none.
        name: String,
        /// The driver's description of the code from `cuGetErrorString`.
        text: String,
    },
    /// A copy whose range does not lie inside the device memory it names; refused before any
    /// driver call.
    #[error("{what}: range {offset}+{len} is outside a {size}-byte buffer")]
    OutOfBounds {
        /// The operation refused, e.g. `memcpy_htod`.
        what: &'static str,
        /// Byte offset of the range from the start of the memory.
        offset: usize,
        /// Length of the range in bytes.
        len: usize,
        /// Length of the memory in bytes ([`DeviceMemory::len`](super::DeviceMemory::len)).
        size: usize,
    },
    /// The driver reported a number no driver reports (a device count below 0 or past
    /// [`MAX_DEVICES`](super::MAX_DEVICES), a negative ordinal): a broken or fake libcuda.
    #[error("{call} reported {value}, which no working driver reports (a broken or fake libcuda)")]
    Implausible {
        /// The call that reported it, e.g. `cuDeviceGetCount`.
        call: &'static str,
        /// The value it reported.
        value: i64,
    },
    /// A kernel name given to [`Module::function`](super::Module::function) contains a NUL
    /// byte, so it cannot be passed to the driver as a C string; the name is carried.
    #[error("kernel name {0:?} contains a NUL byte")]
    BadName(String),
    /// Compiling CUDA C for [`Module::from_source`](super::Module::from_source) failed: NVRTC is
    /// missing, or the compiler rejected the source (its log is in the error).
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

/// The result of this crate's calls: a [`CudaError`] unless a call says otherwise.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// libcuda's entry points, loaded and initialised (`cuInit`) once per process; [`driver`]
/// returns it.
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
    if let Err(init) = drv.check("cuInit", unsafe { (drv.api.init)(0) }) {
        return Err(explain_init(init, &host::Host::this()));
    }
    let mut version = 0;
    // SAFETY: out-pointer to a live local.
    drv.check("cuDriverGetVersion", unsafe {
        (drv.api.driver_get_version)(&mut version)
    })?;
    Ok(Driver { version, ..drv })
}

/// `cuInit`'s error `init`, naming the device nodes `host` lacks when it lacks any: the
/// driver's own code for that (`CUDA_ERROR_UNKNOWN` for a missing /dev/nvidia-uvm) says nothing
/// of them.
pub fn explain_init(init: CudaError, host: &host::Host) -> CudaError {
    let nodes = host.missing_nodes();
    if nodes.is_empty() {
        return init;
    }
    CudaError::MissingNodes {
        fix: host.node_fix(&nodes),
        init: Box::new(init),
        nodes,
    }
}

impl Driver {
    /// Turns a `CUresult` into a typed error naming the call: `Ok` for `CUDA_SUCCESS`,
    /// otherwise [`CudaError::Driver`] with the code's name and text from the driver.
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

    /// The driver version as "major.minor", e.g. "13.0" for 13000.
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version / 1000, (self.version % 1000) / 10)
    }
}
