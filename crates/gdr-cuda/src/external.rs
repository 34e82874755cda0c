//! Memory imported from another API (Vulkan) into CUDA.

use super::{driver, sys, Context, DeviceMemory, Result};

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

    /// The context the memory was imported into; the import keeps it alive.
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
