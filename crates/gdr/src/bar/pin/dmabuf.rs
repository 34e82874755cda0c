//! The dma-buf pin backend: the range is exported as a dma-buf and its descriptor `mmap`ed.
//! Needs a CUDA driver that allows mmap of its dma-bufs.

use super::{
    pinned_buffer_freed, prove, Backend, BackendPin, PinBackend, PinError, Pinning, RawMapping,
};
use crate::bar::backend::dmabuf::DmaBuf;
use crate::cuda::{self, buffer_id, Context};
use crate::page::keep_from_fork;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// Pins by dma-buf export on one context's GPU.
pub(super) struct DmaBufBackend {
    ctx: Context,
}

/// Proves the dma-buf mmap path on a small allocation (export, mmap, unmap) before the
/// backend is taken.
pub(super) fn open(ctx: &Context) -> Result<(Arc<dyn Backend>, String), PinError> {
    let be = DmaBufBackend { ctx: ctx.clone() };
    let buf = cuda::DeviceBuffer::new(ctx, 1 << 16)?;
    prove(&be, cuda::DeviceMemory::device_ptr(&buf), 1 << 16)?;
    Ok((Arc::new(be), "mmap of a CUDA dma-buf works".into()))
}

impl Backend for DmaBufBackend {
    fn kind(&self) -> PinBackend {
        PinBackend::DmaBuf
    }

    fn pin(&self, addr: u64, size: u64) -> Result<Pinning, PinError> {
        // Unknown (None) when CUDA will not say: the callback flag then stays 0.
        let buffer_id = buffer_id(addr).ok().flatten();
        let buf = DmaBuf::export(&self.ctx, addr, size)?;
        Ok(Pinning {
            start: buf.start(),
            len: buf.len(),
            pin: Box::new(DmaBufPinned { buf, buffer_id }),
        })
    }
}

/// An exported dma-buf; its descriptor closes on drop, which releases the pin.
struct DmaBufPinned {
    buf: DmaBuf,
    /// CUDA's BUFFER_ID of the allocation when pinned (a different one later means the
    /// application freed it while pinned).
    buffer_id: Option<u64>,
}

impl BackendPin for DmaBufPinned {
    fn backend(&self) -> PinBackend {
        PinBackend::DmaBuf
    }

    fn callback_fired(&self, addr: u64) -> Result<bool, PinError> {
        pinned_buffer_freed(addr, self.buffer_id)
    }

    fn map(&self, len: usize) -> Result<RawMapping, PinError> {
        // SAFETY: a fresh shared mapping at an address the kernel picks cannot overlap memory
        // Rust already uses.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.buf.fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let driver = cuda::driver()
                .map(|d| d.version_string())
                .unwrap_or_default();
            return Err(PinError::MmapRefused { errno, driver });
        }
        keep_from_fork(p.cast(), len);
        let p = NonNull::new(p.cast::<u8>()).ok_or(PinError::MmapRefused {
            errno: libc::EFAULT,
            driver: String::new(),
        })?;
        Ok(RawMapping {
            base: p.as_ptr(),
            len,
        })
    }

    unsafe fn unmap(&self, mapping: RawMapping) {
        // SAFETY: per the caller's contract, our own live mapping from `map`, unused from now on.
        unsafe { libc::munmap(mapping.base.cast(), mapping.len) };
    }
}
