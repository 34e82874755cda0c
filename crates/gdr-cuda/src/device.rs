//! Devices and their primary contexts: a [`Context`] is what every other resource holds to stay
//! alive, and [`CurrentContextGuard`] restores a caller's current context.

use super::{driver, sys, CudaError, Result};
use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::sync::Arc;

/// The device attributes gdr and its users read (`CU_DEVICE_ATTRIBUTE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attribute {
    /// Streaming multiprocessors.
    MultiprocessorCount,
    /// The SM clock's peak rate, kHz (what `clock64` counts at full speed).
    ClockRateKhz,
    /// Shared memory a block may opt in to, bytes.
    MaxSharedMemoryPerBlockOptin,
    /// GPUDirect RDMA supported.
    GpuDirectRdmaSupported,
    /// GPUDirect RDMA with CUDA VMM (`cuMemCreate`) memory supported.
    GpuDirectRdmaWithVmmSupported,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS` (a bit mask).
    GpuDirectRdmaFlushWritesOptions,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`.
    GpuDirectRdmaWritesOrdering,
    /// dma-buf export (`cuMemGetHandleForAddressRange`) supported.
    DmaBufSupported,
    /// `cuMemHostRegister` supported.
    HostRegisterSupported,
    /// Virtual memory management (`cuMemCreate`, `cuMemMap`) supported.
    VirtualMemoryManagementSupported,
    /// `cuMemCreate` memory can be made exportable as a POSIX file descriptor.
    HandleTypePosixFdSupported,
    /// The device can read pageable host memory directly.
    PageableMemoryAccess,
    /// Stream memory operations (`cuStreamWaitValue32`...) supported.
    StreamMemOps,
    /// An integrated GPU (sharing memory with the CPU).
    Integrated,
    /// The device can map host memory (`cuMemHostGetDevicePointer`).
    CanMapHostMemory,
    /// Unified addressing with the host.
    UnifiedAddressing,
}

impl Attribute {
    fn raw(self) -> c_int {
        match self {
            Attribute::MultiprocessorCount => sys::ATTR_MULTIPROCESSOR_COUNT,
            Attribute::ClockRateKhz => sys::ATTR_CLOCK_RATE,
            Attribute::MaxSharedMemoryPerBlockOptin => sys::ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            Attribute::GpuDirectRdmaSupported => sys::ATTR_GPU_DIRECT_RDMA_SUPPORTED,
            Attribute::GpuDirectRdmaWithVmmSupported => {
                sys::ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
            }
            Attribute::GpuDirectRdmaFlushWritesOptions => {
                sys::ATTR_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
            }
            Attribute::GpuDirectRdmaWritesOrdering => sys::ATTR_GPU_DIRECT_RDMA_WRITES_ORDERING,
            Attribute::DmaBufSupported => sys::ATTR_DMA_BUF_SUPPORTED,
            Attribute::HostRegisterSupported => sys::ATTR_HOST_REGISTER_SUPPORTED,
            Attribute::VirtualMemoryManagementSupported => {
                sys::ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
            }
            Attribute::HandleTypePosixFdSupported => {
                sys::ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
            }
            Attribute::PageableMemoryAccess => sys::ATTR_PAGEABLE_MEMORY_ACCESS,
            Attribute::StreamMemOps => sys::ATTR_CAN_USE_STREAM_MEM_OPS_V1,
            Attribute::Integrated => sys::ATTR_INTEGRATED,
            Attribute::CanMapHostMemory => sys::ATTR_CAN_MAP_HOST_MEMORY,
            Attribute::UnifiedAddressing => sys::ATTR_UNIFIED_ADDRESSING,
        }
    }
}

/// A CUDA device (`CUdevice`), named by its ordinal. Plain data: it holds no context
/// ([`Context::new`] retains the device's primary one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    ordinal: usize,
    pub(super) raw: sys::CUdevice,
}

/// Devices one process sees at most: the largest nodes have a few dozen GPUs. A driver that
/// reports more (or fewer than none) is refused instead of sizing loops and tables.
pub const MAX_DEVICES: usize = 1024;

/// A device count from a driver, checked: 0..=[`MAX_DEVICES`].
pub(crate) fn plausible_count(call: &'static str, n: i64) -> Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_DEVICES)
        .ok_or(CudaError::Implausible { call, value: n })
}

impl Device {
    /// Devices the driver sees: 0 without any, an error for a count no driver reports.
    pub fn count() -> Result<usize> {
        let d = driver()?;
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a live local.
        match unsafe { (d.api.device_get_count)(&mut n) } {
            sys::CUDA_ERROR_NO_DEVICE => Ok(0),
            rc => {
                d.check("cuDeviceGetCount", rc)?;
                plausible_count("cuDeviceGetCount", n.into())
            }
        }
    }

    /// The device with CUDA ordinal `ordinal` (`cuDeviceGet`): 0-based, in the order the driver
    /// enumerates them (`CUDA_DEVICE_ORDER`, `CUDA_VISIBLE_DEVICES`). Loads and initialises the
    /// driver on first use.
    ///
    /// # Errors
    /// [`CudaError::Load`] without libcuda, [`CudaError::NoDevice`] when the driver sees no
    /// GPU, [`CudaError::BadOrdinal`] for `ordinal >= count`, or the driver's error.
    pub fn get(ordinal: usize) -> Result<Device> {
        let count = Self::count()?;
        if count == 0 {
            return Err(CudaError::NoDevice);
        }
        if ordinal >= count {
            return Err(CudaError::BadOrdinal { ordinal, count });
        }
        let d = driver()?;
        let mut raw = 0;
        // SAFETY: out-pointer to a live local; ordinal checked above.
        d.check("cuDeviceGet", unsafe {
            (d.api.device_get)(&mut raw, ordinal as c_int)
        })?;
        Ok(Device { ordinal, raw })
    }

    /// The CUDA ordinal the device was opened with ([`Device::get`]).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The product name the driver reports (`cuDeviceGetName`), e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Result<String> {
        let d = driver()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer is 256 bytes and its length is passed.
        d.check("cuDeviceGetName", unsafe {
            (d.api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        })?;
        // SAFETY: the driver NUL-terminates within the given length.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// A device attribute's value.
    pub fn attribute(&self, attr: Attribute) -> Result<i32> {
        self.attribute_raw(attr.raw())
    }

    /// A `CU_DEVICE_ATTRIBUTE_*` value by number.
    pub(crate) fn attribute_raw(&self, attr: c_int) -> Result<i32> {
        let d = driver()?;
        let mut v = 0;
        // SAFETY: out-pointer to a live local.
        d.check("cuDeviceGetAttribute", unsafe {
            (d.api.device_get_attribute)(&mut v, attr, self.raw)
        })?;
        Ok(v)
    }

    /// Total memory on the device in bytes (`cuDeviceTotalMem`); [`Context::mem_info`] says
    /// how much of it is free.
    pub fn total_mem(&self) -> Result<usize> {
        let d = driver()?;
        let mut v = 0usize;
        // SAFETY: out-pointer to a live local.
        d.check("cuDeviceTotalMem", unsafe {
            (d.api.device_total_mem)(&mut v, self.raw)
        })?;
        Ok(v)
    }

    /// The 16-byte UUID, the same one Vulkan reports as `deviceUUID`.
    pub fn uuid(&self) -> Result<[u8; 16]> {
        let d = driver()?;
        let mut u = [0u8; 16];
        // SAFETY: out-pointer to a live 16-byte array.
        d.check("cuDeviceGetUuid", unsafe {
            (d.api.device_get_uuid)(&mut u, self.raw)
        })?;
        Ok(u)
    }

    /// PCI address as `dddd:bb:dd.0` (lower case, as sysfs names it).
    pub fn pci_bus_id(&self) -> Result<String> {
        Ok(format!(
            "{:04x}:{:02x}:{:02x}.0",
            self.attribute_raw(sys::ATTR_PCI_DOMAIN_ID)?,
            self.attribute_raw(sys::ATTR_PCI_BUS_ID)?,
            self.attribute_raw(sys::ATTR_PCI_DEVICE_ID)?
        ))
    }

    /// Whether kernels on this device can reach `peer`'s memory (`cuDeviceCanAccessPeer`).
    pub fn can_access_peer(&self, peer: Device) -> Result<bool> {
        let d = driver()?;
        let mut yes: c_int = 0;
        // SAFETY: out-pointer to a live local; both handles come from cuDeviceGet.
        d.check("cuDeviceCanAccessPeer", unsafe {
            (d.api.device_can_access_peer)(&mut yes, self.raw, peer.raw)
        })?;
        Ok(yes != 0)
    }

    /// The compute capability as (major, minor), e.g. (9, 0) for Hopper; NVRTC compiles for
    /// `sm_{major}{minor}` ([`crate::nvrtc::compile_for`]).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute_raw(sys::ATTR_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute_raw(sys::ATTR_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }
}

pub(super) struct ContextInner {
    device: Device,
    pub(super) raw: sys::CUcontext,
}

// SAFETY: a CUDA context handle may be used from any thread once made current there.
unsafe impl Send for ContextInner {}
// SAFETY: as above; the driver serialises access internally.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: every resource holds an Arc to this context, so none is left.
            unsafe { (d.api.device_primary_ctx_release)(self.device.raw) };
        }
    }
}

/// The device's primary context, shared by every gdr resource on that device.
///
/// # Examples
///
/// Without libcuda or a GPU the example stops at the first call, whose error says what is
/// missing.
///
/// ```
/// use gdr_cuda::{Context, CudaError, Device};
/// # /// The skip rule of gdr-testing, inline as in the crate's example.
/// # fn skipped(why: &dyn std::fmt::Display) {
/// #     use std::io::Write;
/// #     let required = std::env::var("GDR_REQUIRE_GPU").is_ok_and(|v| v == "1");
/// #     assert!(!required, "GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
/// #     if let Some(log) = std::env::var_os("GDR_SKIP_LOG") {
/// #         let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
/// #         writeln!(f, "skipped: no GPU: gdr_cuda::Context example (doctest)").unwrap();
/// #     }
/// # }
///
/// let ctx = match Context::on(0) {
///     Ok(ctx) => ctx,
///     Err(e) => {
///         println!("no usable GPU: {e}");
/// #       skipped(&e);
///         return Ok(());
///     }
/// };
/// assert_eq!(ctx.device().ordinal(), 0);
/// let (free, total) = ctx.mem_info()?;
/// assert!(0 < free && free <= total);
/// // An ordinal past the last GPU is refused before the driver is asked.
/// let count = Device::count()?;
/// assert!(matches!(
///     Device::get(count),
///     Err(CudaError::BadOrdinal { ordinal, count: c }) if ordinal == count && c == count
/// ));
/// # Ok::<(), CudaError>(())
/// ```
#[derive(Clone)]
pub struct Context(pub(super) Arc<ContextInner>);

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context(device {})", self.0.device.ordinal)
    }
}

impl Context {
    /// Retains the primary context of `device` and makes it current on this thread.
    pub fn new(device: Device) -> Result<Context> {
        let d = driver()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuDevicePrimaryCtxRetain", unsafe {
            (d.api.device_primary_ctx_retain)(&mut raw, device.raw)
        })?;
        let ctx = Context(Arc::new(ContextInner { device, raw }));
        ctx.bind()?;
        Ok(ctx)
    }

    /// Context of GPU `ordinal`.
    pub fn on(ordinal: usize) -> Result<Context> {
        Self::new(Device::get(ordinal)?)
    }

    /// Makes this context current on the calling thread (needed once per thread).
    pub fn bind(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: the context is alive (we hold it).
        d.check("cuCtxSetCurrent", unsafe {
            (d.api.ctx_set_current)(self.0.raw)
        })
    }

    /// Whether `other` is this same context (both retain one primary context).
    pub(crate) fn same_as(&self, other: &Context) -> bool {
        self.0.raw == other.0.raw
    }

    /// The device whose primary context this is.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// Blocks until all work queued in the calling thread's current context is done
    /// (`cuCtxSynchronize`), on every stream, and returns the first error that work hit. The
    /// driver call acts on the *current* context: [`bind`](Self::bind) this one first on a
    /// thread where another may be current.
    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: no arguments.
        d.check("cuCtxSynchronize", unsafe { (d.api.ctx_synchronize)() })
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let d = driver()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-pointers to live locals.
        d.check("cuMemGetInfo", unsafe {
            (d.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }
}

/// Puts back, on drop, whatever CUDA context was current on this thread when it was made. For
/// entry points called from other people's threads (gdr's C library): gdr binds its own
/// contexts to do its work and must not leave them current for the caller.
pub struct CurrentContextGuard {
    prev: sys::CUcontext,
    /// The current context is per thread: the guard stays on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl CurrentContextGuard {
    /// Records the calling thread's current context (`cuCtxGetCurrent`; none is fine) so that
    /// dropping the guard makes it current again (`cuCtxSetCurrent`).
    ///
    /// # Errors
    /// [`CudaError::Load`] without libcuda, or the driver's error.
    pub fn save() -> Result<CurrentContextGuard> {
        let d = driver()?;
        let mut prev = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuCtxGetCurrent", unsafe {
            (d.api.ctx_get_current)(&mut prev)
        })?;
        Ok(CurrentContextGuard {
            prev,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for CurrentContextGuard {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: restores the caller's own context (or none); CUDA validates the handle.
            unsafe { (d.api.ctx_set_current)(self.prev) };
        }
    }
}
