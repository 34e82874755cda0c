//! What a pin hands out: the [`GdrDrvPin`] guard that unpins on drop, and the [`GdrDrvMapping`]
//! of it that the CPU reads and writes.

use super::{DevFile, DeviceFile, GdrDrv, GdrDrvError, Handle, PinInfo};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A pinned range that unpins itself when dropped.
pub struct GdrDrvPin<'d, F: DeviceFile = DevFile> {
    pub(super) drv: &'d GdrDrv<F>,
    pub(super) handle: Handle,
    pub(super) size: u64,
}

impl<'d, F: DeviceFile> GdrDrvPin<'d, F> {
    /// The driver's handle of the pin (also the page offset its mapping is made at).
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The size asked for when pinning.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What the driver knows of the pin: [`GdrDrv::get_info`] (`GET_INFO_V2`/`GET_INFO`).
    pub fn info(&self) -> Result<PinInfo, GdrDrvError> {
        self.drv.get_info(self.handle)
    }

    /// Whether the NVIDIA free callback fired: the memory was freed, or its context destroyed,
    /// while pinned, and the pin no longer refers to it ([`GdrDrv::get_callback_flag`],
    /// `GET_CB_FLAG`).
    pub fn callback_fired(&self) -> Result<bool, GdrDrvError> {
        self.drv.get_callback_flag(self.handle)
    }

    /// Maps the pin for the CPU; the mapping borrows the pin, so it cannot outlive it.
    pub fn map(&self, size: usize) -> Result<GdrDrvMapping<'_, F>, GdrDrvError> {
        // SAFETY: the mapping borrows this pin, which unpins only when dropped or consumed.
        unsafe { self.drv.map(self.handle, size) }
    }

    /// Unpins now, reporting failure (dropping unpins and ignores it).
    pub fn unpin(self) -> Result<(), GdrDrvError> {
        let this = std::mem::ManuallyDrop::new(self);
        this.drv.unpin(this.handle)
    }
}

impl<F: DeviceFile> Drop for GdrDrvPin<'_, F> {
    fn drop(&mut self) {
        // Nothing to do about a failure here; `unpin` reports it to those who ask.
        let _ = self.drv.unpin(self.handle);
    }
}

impl<F: DeviceFile> fmt::Debug for GdrDrvPin<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GdrDrvPin")
            .field("handle", &self.handle)
            .field("size", &self.size)
            .finish()
    }
}

/// A CPU mapping of pinned GPU memory through BAR1. Unmapped on drop.
///
/// The memory is device memory (typically write-combined): access it with volatile or
/// streaming accesses through [`as_ptr`](Self::as_ptr), never as an ordinary Rust slice.
///
/// A mapping made from a [`GdrDrvPin`] cannot outlive the pin (nor any mapping the driver):
/// ```compile_fail
/// use gdr::bar::gdrdrv::{GdrDrv, GdrDrvMapping, PinFlags};
/// fn leak(drv: &GdrDrv) -> GdrDrvMapping<'_> {
///     let pinned = drv.pin(0x7f00_0000_0000, 1, PinFlags::NONE).unwrap();
///     pinned.map(1).unwrap() // error: `pinned` is unpinned at the end of this function
/// }
/// ```
/// while the same use inside the pin's scope compiles (the function is only compiled here,
/// not called: it needs gdrdrv):
/// ```
/// use gdr::bar::gdrdrv::{GdrDrv, PinFlags};
/// fn fine(drv: &GdrDrv) -> usize {
///     let pinned = drv.pin(0x7f00_0000_0000, 1, PinFlags::NONE).unwrap();
///     let mapping = pinned.map(1).unwrap();
///     mapping.mapped_len()
/// }
/// ```
pub struct GdrDrvMapping<'a, F: DeviceFile = DevFile> {
    pub(super) drv: &'a GdrDrv<F>,
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    pub(super) size: usize,
    pub(super) handle: Handle,
    /// Copies through the pointer from several threads need the caller's own synchronisation.
    pub(super) _not_sync: PhantomData<*mut u8>,
}

// SAFETY: the mapping is an address range of this process; nothing in it is tied to the thread
// that made it (gdrdrv checks the process, not the thread), and unmapping from another thread is
// fine. It is not Sync: concurrent access through the raw pointer is the caller's business.
unsafe impl<F: DeviceFile + Sync> Send for GdrDrvMapping<'_, F> {}

impl<F: DeviceFile> GdrDrvMapping<'_, F> {
    /// Start of the mapping: the first byte of the pinned (GPU-page-rounded) range.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes mapped (rounded up to the host page).
    pub fn mapped_len(&self) -> usize {
        self.len
    }

    /// The handle of the pin this maps.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// Gives up the guard without unmapping: the start and the mapped length. For an owner
    /// that keeps the driver alive by other means (an `Arc`) and so cannot hold the borrow; it
    /// must unmap them with the driver file's `munmap` before the handle is unpinned.
    pub(crate) fn into_raw(self) -> (NonNull<u8>, usize) {
        let this = std::mem::ManuallyDrop::new(self);
        (this.ptr, this.len)
    }
}

impl<F: DeviceFile> Drop for GdrDrvMapping<'_, F> {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping `map` made, and this guard is its only owner.
        let _ = unsafe { self.drv.file.munmap(self.ptr, self.len) };
    }
}

impl<F: DeviceFile> fmt::Debug for GdrDrvMapping<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GdrDrvMapping")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("mapped_len", &self.len)
            .field("handle", &self.handle)
            .finish()
    }
}
