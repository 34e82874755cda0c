//! Device memory from the virtual memory management API (`cuMemCreate` + `cuMemMap`), made
//! exportable as a POSIX file descriptor.
//!
//! Such an allocation has a shareable handle that other APIs can import (Vulkan, another
//! process), which plain `cuMemAlloc` memory lacks; gdr uses it to give existing CUDA memory a
//! CPU mapping through Vulkan (see `gdr::bar::Pinner`).

use super::{driver, sys, Context, Device, DeviceMemory, Result};
use std::os::fd::{FromRawFd, OwnedFd};

/// The `CUmemAllocationProp` of a device allocation on `dev` with a POSIX-fd handle, marked
/// GPUDirect RDMA capable where the device allows it (so it can be exported as a dma-buf too).
fn props(dev: Device) -> sys::CUmemAllocationProp {
    let rdma = dev
        .attribute_raw(sys::ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
        .unwrap_or(0)
        != 0;
    sys::CUmemAllocationProp {
        type_: sys::MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: sys::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::MEM_LOCATION_TYPE_DEVICE,
            id: dev.ordinal() as i32,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        compression_type: 0,
        gpu_direct_rdma_capable: u8::from(rdma),
        usage: 0,
        reserved: [0; 4],
    }
}

/// The allocation granularity of [`VmmBuffer`]s on `ctx`'s GPU (2 MiB on current GPUs).
pub fn granularity(ctx: &Context) -> Result<usize> {
    device_granularity(ctx.device())
}

/// The allocation granularity of [`VmmBuffer`]s on `dev` (2 MiB on current GPUs).
pub fn device_granularity(dev: Device) -> Result<usize> {
    let d = driver()?;
    let p = props(dev);
    let mut g = 0usize;
    // SAFETY: out-pointer to a live local; the properties are fully initialised.
    d.check("cuMemGetAllocationGranularity", unsafe {
        (d.api.mem_get_allocation_granularity)(&mut g, &p, sys::MEM_ALLOC_GRANULARITY_MINIMUM)
    })?;
    Ok(g.max(1))
}

/// One `cuMemCreate` allocation mapped at its own reserved address range, readable and
/// writable by its GPU (and by the peers it was made for). Unmapped, released and its address
/// range freed on drop.
///
/// # Examples
///
/// ```
/// use gdr_cuda::vmm::{self, VmmBuffer};
/// use gdr_cuda::{memcpy_dtoh, memcpy_htod, Context, CudaError, DeviceMemory};
/// # /// The skip rule of gdr-testing, inline as in the crate's example.
/// # fn skipped(why: &dyn std::fmt::Display) {
/// #     use std::io::Write;
/// #     let required = std::env::var("GDR_REQUIRE_GPU").is_ok_and(|v| v == "1");
/// #     assert!(!required, "GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
/// #     if let Some(log) = std::env::var_os("GDR_SKIP_LOG") {
/// #         let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
/// #         writeln!(f, "skipped: no GPU: gdr_cuda::vmm::VmmBuffer example (doctest)").unwrap();
/// #     }
/// # }
///
/// let ctx = match Context::on(0) {
///     Ok(ctx) => ctx,
///     Err(e) => {
/// #       skipped(&e);
///         return Ok(());
///     }
/// };
/// let buf = VmmBuffer::new(&ctx, 1000)?;
/// let gran = vmm::granularity(&ctx)?;
/// assert_eq!(buf.len(), 1000);
/// assert_eq!(buf.alloc_size(), gran, "rounded up to one granule");
/// memcpy_htod(&buf, 10, b"vmm")?;
/// let mut back = [0u8; 3];
/// memcpy_dtoh(&mut back, &buf, 10)?;
/// assert_eq!(&back, b"vmm");
/// // The fd names the allocation, for Vulkan or another process to import.
/// let fd = buf.export_fd()?;
/// assert!(std::os::fd::AsRawFd::as_raw_fd(&fd) >= 0);
/// # Ok::<(), CudaError>(())
/// ```
pub struct VmmBuffer {
    /// The context made current around the drop's calls, for buffers made with one.
    ctx: Option<Context>,
    device: Device,
    handle: sys::CUmemGenericAllocationHandle,
    ptr: sys::CUdeviceptr,
    /// Bytes asked for.
    len: usize,
    /// Bytes allocated and mapped (`len` rounded up to the granularity).
    size: usize,
}

// SAFETY: the handle and address are plain values usable from any thread with the context
// current.
unsafe impl Send for VmmBuffer {}
// SAFETY: as above.
unsafe impl Sync for VmmBuffer {}

impl VmmBuffer {
    /// Allocates `len` (>= 1) bytes on `ctx`'s GPU, rounded up to the allocation granularity.
    pub fn new(ctx: &Context, len: usize) -> Result<VmmBuffer> {
        ctx.bind()?;
        let gran = granularity(ctx)?;
        Self::create(ctx.device(), len, gran, &[], Some(ctx.clone()))
    }

    /// Allocates `len` (>= 1) bytes on `device`, rounded up to the allocation granularity and
    /// aligned to `align` (a multiple of it), readable and writable by `device` and by each of
    /// `peers`. Holds no context: for callers (an allocator inside someone else's program) that
    /// must not retain or switch one. The calls need an initialised driver, not a current
    /// context.
    pub fn on_device(
        device: Device,
        len: usize,
        align: usize,
        peers: &[Device],
    ) -> Result<VmmBuffer> {
        Self::create(device, len, align, peers, None)
    }

    fn create(
        device: Device,
        len: usize,
        align: usize,
        peers: &[Device],
        ctx: Option<Context>,
    ) -> Result<VmmBuffer> {
        let d = driver()?;
        let gran = device_granularity(device)?;
        let size = len.max(1).next_multiple_of(gran);
        let align = align.max(gran).next_multiple_of(gran);
        let p = props(device);
        let mut handle = 0;
        // SAFETY: out-pointer to a live local; the properties are fully initialised.
        d.check("cuMemCreate", unsafe {
            (d.api.mem_create)(&mut handle, size, &p, 0)
        })?;
        let mut ptr = 0;
        // SAFETY: out-pointer to a live local; no fixed address asked.
        let reserved = d.check("cuMemAddressReserve", unsafe {
            (d.api.mem_address_reserve)(&mut ptr, size, align, 0, 0)
        });
        if let Err(e) = reserved {
            // SAFETY: the handle is ours and mapped nowhere.
            unsafe { (d.api.mem_release)(handle) };
            return Err(e);
        }
        let access: Vec<sys::CUmemAccessDesc> = std::iter::once(device)
            .chain(peers.iter().copied().filter(|&p| p != device))
            .map(|dev| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::MEM_LOCATION_TYPE_DEVICE,
                    id: dev.ordinal() as i32,
                },
                flags: sys::MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the reserved range is ours and exactly `size` bytes, the allocation too.
        let mapped = d.check("cuMemMap", unsafe {
            (d.api.mem_map)(ptr, size, 0, handle, 0)
        });
        let accessible = mapped.and_then(|()| {
            // SAFETY: the range is mapped (above); `access` holds access.len() descriptors.
            d.check("cuMemSetAccess", unsafe {
                (d.api.mem_set_access)(ptr, size, access.as_ptr(), access.len())
            })
            .inspect_err(|_| {
                // SAFETY: mapped above and not used since.
                unsafe { (d.api.mem_unmap)(ptr, size) };
            })
        });
        if let Err(e) = accessible {
            // SAFETY: the range and the handle are ours and no longer mapped.
            unsafe {
                (d.api.mem_address_free)(ptr, size);
                (d.api.mem_release)(handle);
            }
            return Err(e);
        }
        Ok(VmmBuffer {
            ctx,
            device,
            handle,
            ptr,
            len,
            size,
        })
    }

    /// Bytes actually allocated (the length rounded up to the granularity).
    pub fn alloc_size(&self) -> usize {
        self.size
    }

    /// The context the buffer was made in ([`VmmBuffer::new`]); `None` for
    /// [`VmmBuffer::on_device`].
    pub fn context(&self) -> Option<&Context> {
        self.ctx.as_ref()
    }

    /// The GPU the memory lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A new POSIX file descriptor for the allocation (`cuMemExportToShareableHandle`); it
    /// names the whole allocation ([`alloc_size`](Self::alloc_size) bytes).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_handle(self.handle)
    }
}

/// Why the allocation at an address cannot be shared as a POSIX file descriptor.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NotExportable {
    /// It is not `cuMemCreate` memory (`cuMemAlloc`/`cudaMalloc` memory has no handle).
    #[error("not cuMemCreate memory: {0}")]
    NotVmm(super::CudaError),
    /// `cuMemCreate` memory made without a POSIX-fd handle type.
    #[error("it was created without a POSIX-fd handle type")]
    NoPosixFd,
    /// The driver refused the export.
    #[error("{0}")]
    Export(super::CudaError),
}

/// A new POSIX file descriptor naming the whole `cuMemCreate` allocation mapped at `addr`
/// (its first byte: `cuMemGetAddressRange` gives it), for importing it elsewhere (Vulkan,
/// another process).
pub fn export_allocation(addr: u64) -> std::result::Result<OwnedFd, NotExportable> {
    let (handle, posix) = retain_handle(addr).map_err(NotExportable::NotVmm)?;
    let fd = if posix {
        export_handle(handle).map_err(NotExportable::Export)
    } else {
        Err(NotExportable::NoPosixFd)
    };
    release_handle(handle);
    fd
}

/// Exports an allocation handle made with a POSIX-fd handle type.
fn export_handle(handle: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let d = driver()?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: for the POSIX-fd type the out-parameter is an int.
    d.check("cuMemExportToShareableHandle", unsafe {
        (d.api.mem_export_to_shareable_handle)(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            sys::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    // SAFETY: the driver returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What the VMM API says about the allocation mapped at `addr`: its handle (retained: release
/// with [`release_handle`]) and whether it was created exportable as a POSIX fd.
fn retain_handle(addr: u64) -> Result<(sys::CUmemGenericAllocationHandle, bool)> {
    let d = driver()?;
    let mut handle = 0;
    // SAFETY: out-pointer to a live local; the address is only looked up.
    d.check("cuMemRetainAllocationHandle", unsafe {
        (d.api.mem_retain_allocation_handle)(&mut handle, addr as *mut std::ffi::c_void)
    })?;
    let mut p = sys::CUmemAllocationProp {
        type_: 0,
        requested_handle_types: 0,
        location: sys::CUmemLocation::default(),
        win32_handle_meta_data: std::ptr::null_mut(),
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        usage: 0,
        reserved: [0; 4],
    };
    // SAFETY: out-pointer to a live local; the handle was just retained.
    let got = d.check("cuMemGetAllocationPropertiesFromHandle", unsafe {
        (d.api.mem_get_allocation_properties_from_handle)(&mut p, handle)
    });
    match got {
        Ok(()) => Ok((
            handle,
            p.requested_handle_types & sys::MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0,
        )),
        Err(e) => {
            release_handle(handle);
            Err(e)
        }
    }
}

/// Drops the reference [`retain_handle`] took.
fn release_handle(handle: sys::CUmemGenericAllocationHandle) {
    if let Ok(d) = driver() {
        // SAFETY: the caller retained this handle once and gives that reference back.
        unsafe { (d.api.mem_release)(handle) };
    }
}

impl DeviceMemory for VmmBuffer {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for VmmBuffer {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: the mapping, the reserved range and the handle are ours; memory released
            // while exported or imported elsewhere stays alive for those importers.
            unsafe {
                if let Some(ctx) = &self.ctx {
                    (d.api.ctx_push_current)(ctx.0.raw);
                }
                (d.api.mem_unmap)(self.ptr, self.size);
                (d.api.mem_address_free)(self.ptr, self.size);
                (d.api.mem_release)(self.handle);
                if self.ctx.is_some() {
                    (d.api.ctx_pop_current)(&mut std::ptr::null_mut());
                }
            }
        }
    }
}

impl std::fmt::Debug for VmmBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmBuffer")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("alloc_size", &self.size)
            .finish()
    }
}
