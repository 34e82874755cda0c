//! A thin safe layer over the CUDA driver API, loaded at run time.
//!
//! Shape (as cudarc): [`sys`] holds the raw entry points, this module checks every result and
//! ties each resource to the [`Context`] it lives in: every handle keeps its context alive, so
//! no buffer, stream or module can outlive it.

pub mod nvrtc;
pub mod sys;
pub mod vmm;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Errors from the CUDA layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error(
        "the CUDA driver library (libcuda.so.1) could not be loaded: {0}; install the NVIDIA \
         driver (e.g. the nvidia-driver or libnvidia-compute package)"
    )]
    NotInstalled(String),
    #[error("the CUDA driver lacks an entry point gdr needs ({0}); update the NVIDIA driver")]
    MissingSymbol(String),
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
    #[error("kernel name {0:?} contains a NUL byte")]
    BadName(String),
    #[error(transparent)]
    Nvrtc(#[from] nvrtc::NvrtcError),
}

impl CudaError {
    /// The raw `CUresult` if this is a driver error.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The loaded and initialised driver.
pub struct Driver {
    pub api: sys::DriverApi,
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

fn load_driver() -> Result<Driver> {
    let names = ["libcuda.so.1", "libcuda.so"];
    let mut last = String::new();
    for name in names {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
        // preconditions on our side.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                // SAFETY: the library is libcuda; its symbols follow cuda.h.
                let api =
                    unsafe { sys::DriverApi::resolve(lib) }.map_err(CudaError::MissingSymbol)?;
                let drv = Driver { api, version: 0 };
                // SAFETY: cuInit takes flags 0 and may be called any number of times.
                drv.check("cuInit", unsafe { (drv.api.init)(0) })?;
                let mut version = 0;
                // SAFETY: out-pointer to a live local.
                drv.check("cuDriverGetVersion", unsafe {
                    (drv.api.driver_get_version)(&mut version)
                })?;
                return Ok(Driver { version, ..drv });
            }
            Err(e) if last.is_empty() => last = e.to_string(),
            Err(_) => {}
        }
    }
    Err(CudaError::NotInstalled(last))
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

/// A CUDA device (by ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    ordinal: usize,
    raw: sys::CUdevice,
}

impl Device {
    pub fn count() -> Result<usize> {
        let d = driver()?;
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a live local.
        match unsafe { (d.api.device_get_count)(&mut n) } {
            sys::CUDA_ERROR_NO_DEVICE => Ok(0),
            rc => d.check("cuDeviceGetCount", rc).map(|_| n as usize),
        }
    }

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

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

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

    /// A `CU_DEVICE_ATTRIBUTE_*` value (see [`sys`] for the ones gdr names).
    pub fn attribute(&self, attr: c_int) -> Result<i32> {
        let d = driver()?;
        let mut v = 0;
        // SAFETY: out-pointer to a live local.
        d.check("cuDeviceGetAttribute", unsafe {
            (d.api.device_get_attribute)(&mut v, attr, self.raw)
        })?;
        Ok(v)
    }

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
            self.attribute(sys::ATTR_PCI_DOMAIN_ID)?,
            self.attribute(sys::ATTR_PCI_BUS_ID)?,
            self.attribute(sys::ATTR_PCI_DEVICE_ID)?
        ))
    }

    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(sys::ATTR_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(sys::ATTR_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }
}

struct ContextInner {
    device: Device,
    raw: sys::CUcontext,
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
#[derive(Clone)]
pub struct Context(Arc<ContextInner>);

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

    pub fn device(&self) -> Device {
        self.0.device
    }

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

/// Device memory the driver can copy to and from: a base address and a length, alive as long
/// as the value is.
pub trait DeviceMemory {
    fn device_ptr(&self) -> sys::CUdeviceptr;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Boxed memory of any kind (a buffer chosen at run time) is device memory too.
impl<M: DeviceMemory + ?Sized> DeviceMemory for Box<M> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        (**self).device_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

fn check_range(what: &'static str, offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(CudaError::OutOfBounds {
            what,
            offset,
            len,
            size,
        }),
    }
}

/// `cuMemcpyHtoD` into `dst[offset..offset+src.len()]`.
///
/// Returns once `src` may be reused. From pageable memory the driver stages the data and the
/// DMA may still be landing: later GPU work sees it (stream order), but a CPU read through a
/// BAR mapping must [`Context::synchronize`] first.
pub fn memcpy_htod(dst: &impl DeviceMemory, offset: usize, src: &[u8]) -> Result<()> {
    check_range("memcpy_htod", offset, src.len(), dst.len())?;
    let d = driver()?;
    // SAFETY: the destination range lies inside a live allocation (checked above) and `src`
    // is a valid slice of the given length.
    d.check("cuMemcpyHtoD", unsafe {
        (d.api.memcpy_htod)(
            dst.device_ptr() + offset as u64,
            src.as_ptr().cast(),
            src.len(),
        )
    })
}

/// `cuMemcpyDtoH` from `src[offset..offset+dst.len()]`.
pub fn memcpy_dtoh(dst: &mut [u8], src: &impl DeviceMemory, offset: usize) -> Result<()> {
    check_range("memcpy_dtoh", offset, dst.len(), src.len())?;
    let d = driver()?;
    // SAFETY: the source range lies inside a live allocation and `dst` is a valid mutable
    // slice of the given length.
    d.check("cuMemcpyDtoH", unsafe {
        (d.api.memcpy_dtoh)(
            dst.as_mut_ptr().cast(),
            src.device_ptr() + offset as u64,
            dst.len(),
        )
    })
}

/// `cuMemsetD8` over the whole of `dst`. Asynchronous with respect to the host: synchronize
/// before looking at the bytes through a CPU mapping.
pub fn memset(dst: &impl DeviceMemory, value: u8) -> Result<()> {
    let d = driver()?;
    // SAFETY: the range is the whole live allocation.
    d.check("cuMemsetD8", unsafe {
        (d.api.memset_d8)(dst.device_ptr(), value, dst.len())
    })
}

/// Plain device memory from `cuMemAlloc`.
pub struct DeviceBuffer {
    ctx: Context,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceBuffer> {
        let d = driver()?;
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a live local; a zero size is rounded up to keep a unique
        // address.
        d.check("cuMemAlloc", unsafe {
            (d.api.mem_alloc)(&mut ptr, len.max(1))
        })?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl DeviceMemory for DeviceBuffer {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the allocation; the context is alive (held in self.ctx).
            unsafe {
                (d.api.ctx_push_current)(self.ctx.0.raw);
                (d.api.mem_free)(self.ptr);
                (d.api.ctx_pop_current)(&mut std::ptr::null_mut());
            }
        }
    }
}

/// The ordinal of the GPU that owns device memory at `addr`
/// (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
pub fn pointer_device(addr: u64) -> Result<usize> {
    let d = driver()?;
    let mut ordinal: c_int = -1;
    // SAFETY: the DEVICE_ORDINAL attribute is an int written to the out-pointer.
    d.check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
        (d.api.pointer_get_attribute)(
            (&mut ordinal as *mut c_int).cast(),
            sys::POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    })?;
    Ok(ordinal.max(0) as usize)
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

/// Page-locked host memory mapped into the GPU's address space (`cuMemHostAlloc` with
/// DEVICEMAP): the CPU reads and writes it as ordinary memory, GPU threads reach it over PCIe.
pub struct HostBuffer {
    ctx: Context,
    host: *mut u8,
    dev: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the buffer is plain memory; access goes through &self/&mut self or volatile
// accessors whose callers document their synchronisation.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    pub fn new(ctx: &Context, len: usize) -> Result<HostBuffer> {
        Self::with_flags(
            ctx,
            len,
            sys::MEMHOSTALLOC_DEVICEMAP | sys::MEMHOSTALLOC_PORTABLE,
        )
    }

    /// Write-combined variant: fast for the CPU to write and the GPU to read, slow for the CPU
    /// to read.
    pub fn new_write_combined(ctx: &Context, len: usize) -> Result<HostBuffer> {
        Self::with_flags(
            ctx,
            len,
            sys::MEMHOSTALLOC_DEVICEMAP
                | sys::MEMHOSTALLOC_PORTABLE
                | sys::MEMHOSTALLOC_WRITECOMBINED,
        )
    }

    fn with_flags(ctx: &Context, len: usize, flags: u32) -> Result<HostBuffer> {
        let d = driver()?;
        ctx.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuMemHostAlloc", unsafe {
            (d.api.mem_alloc_host)(&mut p, len.max(1), flags)
        })?;
        let mut dev = 0;
        // SAFETY: p is the allocation just made with DEVICEMAP.
        let rc = unsafe { (d.api.mem_host_get_device_pointer)(&mut dev, p, 0) };
        if let Err(e) = d.check("cuMemHostGetDevicePointer", rc) {
            // SAFETY: p came from cuMemHostAlloc and is not used after this.
            unsafe { (d.api.mem_free_host)(p) };
            return Err(e);
        }
        // SAFETY: fresh allocation of at least len bytes; zeroed so it never reads as garbage.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len.max(1)) };
        Ok(HostBuffer {
            ctx: ctx.clone(),
            host: p.cast(),
            dev,
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: host points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive CPU access.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// Raw host pointer, for shared-memory protocols with GPU threads (flags, rings). Valid
    /// while `self` lives.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
}

impl DeviceMemory for HostBuffer {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.dev
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the allocation; the context is alive.
            unsafe {
                (d.api.ctx_push_current)(self.ctx.0.raw);
                (d.api.mem_free_host)(self.host.cast());
                (d.api.ctx_pop_current)(&mut std::ptr::null_mut());
            }
        }
    }
}

/// A CUDA stream.
pub struct Stream {
    ctx: Context,
    raw: sys::CUstream,
}

// SAFETY: streams may be used from any thread with the context current.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream (does not synchronise with the legacy default stream).
    pub fn new(ctx: &Context) -> Result<Stream> {
        let d = driver()?;
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuStreamCreate", unsafe {
            (d.api.stream_create)(&mut raw, sys::STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.stream_synchronize)(self.raw)
        })
    }

    /// Ok(true) when all work is done, Ok(false) while some is pending, Err if it failed.
    pub fn query(&self) -> Result<bool> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        match unsafe { (d.api.stream_query)(self.raw) } {
            sys::CUDA_ERROR_NOT_READY => Ok(false),
            rc => d.check("cuStreamQuery", rc).map(|_| true),
        }
    }

    /// Asynchronous host-to-device copy.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until the stream has executed the copy; for a
    /// truly asynchronous copy it must be page-locked.
    pub unsafe fn memcpy_htod_async(
        &self,
        dst: &impl DeviceMemory,
        offset: usize,
        src: &[u8],
    ) -> Result<()> {
        check_range("memcpy_htod_async", offset, src.len(), dst.len())?;
        let d = driver()?;
        // SAFETY: range checked; the caller keeps src alive.
        d.check("cuMemcpyHtoDAsync", unsafe {
            (d.api.memcpy_htod_async)(
                dst.device_ptr() + offset as u64,
                src.as_ptr().cast(),
                src.len(),
                self.raw,
            )
        })
    }

    /// Asynchronous device-to-host copy.
    ///
    /// # Safety
    /// `dst` must stay valid and not be read until the stream has executed the copy.
    pub unsafe fn memcpy_dtoh_async(
        &self,
        dst: &mut [u8],
        src: &impl DeviceMemory,
        offset: usize,
    ) -> Result<()> {
        check_range("memcpy_dtoh_async", offset, dst.len(), src.len())?;
        let d = driver()?;
        // SAFETY: range checked; the caller keeps dst alive.
        d.check("cuMemcpyDtoHAsync", unsafe {
            (d.api.memcpy_dtoh_async)(
                dst.as_mut_ptr().cast(),
                src.device_ptr() + offset as u64,
                dst.len(),
                self.raw,
            )
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the stream; the context is alive.
            unsafe { (d.api.stream_destroy)(self.raw) };
        }
    }
}

/// A timing event.
pub struct Event {
    _ctx: Context,
    raw: sys::CUevent,
}

impl Event {
    pub fn new(ctx: &Context) -> Result<Event> {
        let d = driver()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuEventCreate", unsafe {
            (d.api.event_create)(&mut raw, sys::EVENT_DEFAULT)
        })?;
        Ok(Event {
            _ctx: ctx.clone(),
            raw,
        })
    }

    pub fn record(&self, stream: &Stream) -> Result<()> {
        let d = driver()?;
        // SAFETY: event and stream are alive.
        d.check("cuEventRecord", unsafe {
            (d.api.event_record)(self.raw, stream.raw)
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: the event is alive.
        d.check("cuEventSynchronize", unsafe {
            (d.api.event_synchronize)(self.raw)
        })
    }

    /// Milliseconds between `start` and `self` (both recorded and complete).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        let d = driver()?;
        let mut ms = 0f32;
        // SAFETY: both events are alive.
        d.check("cuEventElapsedTime", unsafe {
            (d.api.event_elapsed_time)(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the event.
            unsafe { (d.api.event_destroy)(self.raw) };
        }
    }
}

/// A loaded module (cubin from NVRTC).
pub struct Module {
    ctx: Context,
    raw: sys::CUmodule,
    /// Kernels already resolved, by name (`CUfunction` as usize so the map is Send): a lookup
    /// per launch would put a CString and a driver call on every launch's path.
    functions: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

// SAFETY: module handles are context-wide and usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a cubin or PTX image.
    pub fn load(ctx: &Context, image: &[u8]) -> Result<Module> {
        let d = driver()?;
        ctx.bind()?;
        // PTX must be NUL-terminated; a cubin is self-describing. Append a NUL either way.
        let mut owned = image.to_vec();
        owned.push(0);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the image buffer is alive for the call; the driver copies it.
        d.check("cuModuleLoadData", unsafe {
            (d.api.module_load_data)(&mut raw, owned.as_ptr().cast())
        })?;
        Ok(Module {
            ctx: ctx.clone(),
            raw,
            functions: Default::default(),
        })
    }

    /// Compiles CUDA C with NVRTC for this context's device (cached per process) and loads it.
    pub fn from_source(ctx: &Context, name: &str, source: &str) -> Result<Module> {
        let cubin = nvrtc::compile_for(ctx.device(), name, source)?;
        Self::load(ctx, &cubin)
    }

    /// The kernel `name`, resolved once per module and cached.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let mut cache = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&raw) = cache.get(name) {
            return Ok(Function {
                raw: raw as sys::CUfunction,
                _module: self,
            });
        }
        let d = driver()?;
        let cname = std::ffi::CString::new(name).map_err(|_| CudaError::BadName(name.into()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: module alive, name NUL-terminated.
        d.check("cuModuleGetFunction", unsafe {
            (d.api.module_get_function)(&mut raw, self.raw, cname.as_ptr())
        })?;
        cache.insert(name.to_string(), raw as usize);
        Ok(Function { raw, _module: self })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the module; functions borrow it, so none is left.
            unsafe { (d.api.module_unload)(self.raw) };
        }
    }
}

/// A kernel in a loaded module.
pub struct Function<'m> {
    raw: sys::CUfunction,
    _module: &'m Module,
}

/// Launch geometry.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem: u32,
}

impl LaunchConfig {
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem: 0,
        }
    }
}

impl Function<'_> {
    /// Lets launches of this kernel ask for up to `bytes` of dynamic shared memory; needed
    /// above 48 KiB, where the driver otherwise refuses the launch.
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        let d = driver()?;
        // Beyond c_int any value is far past every GPU's limit: the driver refuses it.
        let v = c_int::try_from(bytes).unwrap_or(c_int::MAX);
        // SAFETY: the function handle is alive (it borrows its module); plain value arguments.
        d.check("cuFuncSetAttribute", unsafe {
            (d.api.func_set_attribute)(
                self.raw,
                sys::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                v,
            )
        })
    }

    /// The most threads a block of this kernel can have (its registers per thread decide).
    pub fn max_threads_per_block(&self) -> Result<u32> {
        let d = driver()?;
        let mut v: c_int = 0;
        // SAFETY: the function handle is alive (it borrows its module); `v` is a valid out
        // pointer for the call.
        d.check("cuFuncGetAttribute", unsafe {
            (d.api.func_get_attribute)(&mut v, sys::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.raw)
        })?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// Launches the kernel on `stream`.
    ///
    /// # Safety
    /// `params` must point to values whose types and order match the kernel's signature, and
    /// any memory the kernel touches must stay alive until it completes.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let d = driver()?;
        // SAFETY: the caller guarantees the parameter contract; handles are alive.
        d.check("cuLaunchKernel", unsafe {
            (d.api.launch_kernel)(
                self.raw,
                cfg.grid.0,
                cfg.grid.1,
                cfg.grid.2,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                cfg.shared_mem,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// Memory from another API (a Vulkan allocation) imported into CUDA, with one device pointer
/// mapped over it. Destroyed (pointer freed, import released) on drop.
pub struct ExternalMemory {
    ctx: Context,
    raw: sys::CUexternalMemory,
    ptr: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: handles usable from any thread with the context current.
unsafe impl Send for ExternalMemory {}
// SAFETY: as above.
unsafe impl Sync for ExternalMemory {}

impl ExternalMemory {
    /// Imports an OPAQUE_FD allocation of `size` bytes and maps all of it. On success CUDA owns
    /// `fd` (it must not be closed by the caller); on failure the fd is closed here.
    pub fn import_opaque_fd(ctx: &Context, fd: std::os::fd::OwnedFd, size: usize) -> Result<Self> {
        use std::os::fd::IntoRawFd;
        let d = driver()?;
        ctx.bind()?;
        let raw_fd = fd.into_raw_fd();
        let desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
            type_: sys::EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            _pad: 0,
            handle: [raw_fd as u32 as u64, 0],
            size: size as u64,
            flags: 0,
            reserved: [0; 16],
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: the descriptor is fully initialised; on success CUDA takes the fd.
        let rc = unsafe { (d.api.import_external_memory)(&mut raw, &desc) };
        if let Err(e) = d.check("cuImportExternalMemory", rc) {
            // SAFETY: the import failed, so the fd is still ours to close.
            unsafe { libc::close(raw_fd) };
            return Err(e);
        }
        let bdesc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset: 0,
            size: size as u64,
            flags: 0,
            reserved: [0; 16],
        };
        let mut ptr = 0;
        // SAFETY: raw is a live import; the descriptor covers it exactly.
        let rc = unsafe { (d.api.external_memory_get_mapped_buffer)(&mut ptr, raw, &bdesc) };
        if let Err(e) = d.check("cuExternalMemoryGetMappedBuffer", rc) {
            // SAFETY: raw is a live import with no mapped buffer.
            unsafe { (d.api.destroy_external_memory)(raw) };
            return Err(e);
        }
        Ok(ExternalMemory {
            ctx: ctx.clone(),
            raw,
            ptr,
            len: size,
        })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl DeviceMemory for ExternalMemory {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ExternalMemory {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: the mapped buffer must be freed with cuMemFree before the import is
            // destroyed; both are ours.
            unsafe {
                (d.api.ctx_push_current)(self.ctx.0.raw);
                (d.api.mem_free)(self.ptr);
                (d.api.destroy_external_memory)(self.raw);
                (d.api.ctx_pop_current)(&mut std::ptr::null_mut());
            }
        }
    }
}

/// A captured CUDA graph, instantiated and ready to launch.
pub struct Graph {
    _ctx: Context,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    /// Captures the work `record` enqueues on `stream` into a graph.
    pub fn capture(stream: &Stream, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        d.check("cuStreamBeginCapture", unsafe {
            (d.api.stream_begin_capture)(stream.raw, sys::STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })?;
        let recorded = record(stream);
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above, whatever `record` did.
        let end = d.check("cuStreamEndCapture", unsafe {
            (d.api.stream_end_capture)(stream.raw, &mut graph)
        });
        if let Err(e) = recorded.and(end) {
            if !graph.is_null() {
                // SAFETY: a graph the capture handed us, never instantiated.
                unsafe { (d.api.graph_destroy)(graph) };
            }
            return Err(e);
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: graph is the live graph just captured.
        if let Err(e) = d.check("cuGraphInstantiate", unsafe {
            (d.api.graph_instantiate)(&mut exec, graph, 0)
        }) {
            // SAFETY: graph is ours and not instantiated.
            unsafe { (d.api.graph_destroy)(graph) };
            return Err(e);
        }
        Ok(Graph {
            _ctx: stream.ctx.clone(),
            graph,
            exec,
        })
    }

    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let d = driver()?;
        // SAFETY: exec and stream are alive.
        d.check("cuGraphLaunch", unsafe {
            (d.api.graph_launch)(self.exec, stream.raw)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: both handles are ours.
            unsafe {
                (d.api.graph_exec_destroy)(self.exec);
                (d.api.graph_destroy)(self.graph);
            }
        }
    }
}

/// Waits for the work queued on the legacy default stream, where the plain (non-`Async`)
/// `cuMemcpy*` calls run; unlike [`Context::synchronize`] it does not wait for kernels on
/// non-blocking streams (a persistent worker, for instance).
pub fn synchronize_legacy_stream() -> Result<()> {
    let d = driver()?;
    // SAFETY: the null stream handle names the legacy default stream.
    d.check("cuStreamSynchronize", unsafe {
        (d.api.stream_synchronize)(std::ptr::null_mut())
    })
}
