//! Memory the GPU reaches: the [`DeviceMemory`] trait, plain device buffers, mapped pinned host
//! buffers, and the synchronous copies between host slices and device memory.

use super::{driver, sys, Context, CudaError, Result};
use std::ffi::{c_int, c_void};

/// Device memory the driver can copy to and from: a base address and a length, alive as long
/// as the value is.
pub trait DeviceMemory {
    /// The device address (`CUdeviceptr`) of the first byte. With unified addressing it is the
    /// same in every context of the process.
    fn device_ptr(&self) -> sys::CUdeviceptr;
    /// Bytes from [`device_ptr`](Self::device_ptr) that copies may reach (for an allocation
    /// rounded up by the driver, the length asked for).
    fn len(&self) -> usize;
    /// Whether [`len`](Self::len) is 0.
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

/// Device memory named by address and length alone, for memory reached by its address (a
/// window of a pin, a mapping's GPU side) rather than through an owning value. It owns
/// nothing: whoever makes one keeps the memory alive while copies use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRange {
    /// The device address of the first byte.
    pub addr: u64,
    /// Bytes from `addr`.
    pub len: usize,
}

impl DeviceMemory for DeviceRange {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

pub(super) fn check_range(
    what: &'static str,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<()> {
    gdr_mem::check_range(offset, len, size).map_err(|_| CudaError::OutOfBounds {
        what,
        offset,
        len,
        size,
    })
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
    /// Allocates `len` bytes of device memory on `ctx`'s GPU (`cuMemAlloc`, with `ctx` made
    /// current on this thread). The bytes are not initialised; a `len` of 0 allocates one byte
    /// so that the buffer still has an address of its own. Freed (`cuMemFree`) on drop.
    ///
    /// # Errors
    /// The driver's: [`CudaError::is_out_of_memory`] when the GPU is full.
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

    /// The context the buffer was allocated in; the buffer keeps it alive.
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
    usize::try_from(ordinal).map_err(|_| CudaError::Implausible {
        call: "cuPointerGetAttribute(DEVICE_ORDINAL)",
        value: ordinal.into(),
    })
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
    /// Allocates `len` bytes of page-locked host memory, mapped for every context's GPU
    /// (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`, `ctx` made current) and zeroed. Cached for
    /// the CPU. A `len` of 0 allocates one byte. Freed (`cuMemFreeHost`) on drop.
    ///
    /// # Errors
    /// The driver's: out of memory, or a device that cannot map host memory.
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

    /// The bytes as the CPU sees them. Only for a buffer no GPU thread writes at the same time:
    /// once shared with a kernel, reach it through [`gdr_mem::MappedMemory`] (copies and
    /// volatile words) instead.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: host points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// The bytes, writable, for filling a buffer before any GPU work uses it (same caveat as
    /// [`as_slice`](Self::as_slice)).
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

// SAFETY: cuMemHostAlloc memory is page aligned, len bytes, valid at that address while the
// buffer lives. Its slice accessors are for buffers not shared this way: once handed to a ring
// (or a device) the CPU reaches it only through copies and atomics.
unsafe impl gdr_mem::MappedMemory for HostBuffer {
    fn cpu_ptr(&self) -> *mut u8 {
        self.host_ptr()
    }
    fn size(&self) -> usize {
        DeviceMemory::len(self)
    }
    fn caching(&self) -> gdr_mem::Caching {
        gdr_mem::Caching::WriteBack
    }
}
