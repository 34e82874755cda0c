//! The gdrdrv pin backend: gdrcopy's kernel module pins any `cuMemAlloc` range and maps it
//! through its device file.

use super::{Backend, BackendPin, PinBackend, PinError, Pinning, RawMapping};
use crate::bar::backend::gdrdrv::{self, DeviceFile, GdrDrv, PinFlags};
use crate::cuda::Context;
use crate::page::keep_from_fork;
use std::ptr::NonNull;
use std::sync::Arc;

/// gdrdrv opened for pinning; its pins share the open device file.
pub(super) struct GdrDrvBackend {
    drv: Arc<GdrDrv>,
}

/// Opens `/dev/gdrdrv`; the text says which driver answered.
pub(super) fn open(_ctx: &Context) -> Result<(Arc<dyn Backend>, String), PinError> {
    let drv = Arc::new(GdrDrv::open()?);
    let reason = format!("{} driver {}", gdrdrv::DEVICE_PATH, drv.version().driver);
    Ok((Arc::new(GdrDrvBackend { drv }), reason))
}

impl Backend for GdrDrvBackend {
    fn kind(&self) -> PinBackend {
        PinBackend::GdrDrv
    }

    fn pin(&self, addr: u64, size: u64) -> Result<Pinning, PinError> {
        let handle = self.drv.pin_buffer(addr, size, PinFlags::NONE)?;
        // Owned from here, so a failed get_info unpins on the way out.
        let pin = GdrDrvPinned {
            drv: self.drv.clone(),
            handle,
        };
        let info = self.drv.get_info(handle)?;
        Ok(Pinning {
            start: info.va,
            len: info.mapped_size,
            pin: Box::new(pin),
        })
    }

    fn gdrdrv(&self) -> Option<&GdrDrv> {
        Some(&self.drv)
    }
}

/// One gdrdrv handle; unpinned on drop.
struct GdrDrvPinned {
    drv: Arc<GdrDrv>,
    handle: gdrdrv::Handle,
}

impl BackendPin for GdrDrvPinned {
    fn backend(&self) -> PinBackend {
        PinBackend::GdrDrv
    }

    fn callback_fired(&self, _addr: u64) -> Result<bool, PinError> {
        // gdrdrv says so itself (and then revokes the memory).
        Ok(self.drv.get_callback_flag(self.handle)?)
    }

    fn map(&self, len: usize) -> Result<RawMapping, PinError> {
        // SAFETY: the caller (`Pinned::map`) keeps the mapping in a PinnedMapping that holds
        // this pin, and unmaps it through `unmap` before the pin can drop and unpin.
        let m = unsafe { self.drv.map(self.handle, len)? };
        // The guard borrows the driver, so it cannot live next to the pin it borrows from:
        // give it up and unmap through the driver's file in `unmap`.
        let (ptr, mapped) = m.into_raw();
        keep_from_fork(ptr.as_ptr(), len);
        Ok(RawMapping {
            base: ptr.as_ptr(),
            len: mapped,
        })
    }

    unsafe fn unmap(&self, mapping: RawMapping) {
        // `map` made the pointer from a NonNull, so it is never null here.
        if let Some(ptr) = NonNull::new(mapping.base) {
            // SAFETY: per the caller's contract, ptr/len are the mapping gdrdrv made in `map`,
            // unused from now on; the handle is still pinned, since `self` unpins only on drop.
            let _ = unsafe { DeviceFile::munmap(self.drv.file(), ptr, mapping.len) };
        }
    }
}

impl Drop for GdrDrvPinned {
    fn drop(&mut self) {
        let _ = self.drv.unpin(self.handle);
    }
}
