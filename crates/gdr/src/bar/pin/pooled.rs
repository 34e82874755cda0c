//! Memory of gdr's allocator, pinned through the allocator ([`crate::bar::pool`]) whatever the
//! pinner's backend: the allocator keeps each chunk mapped, so its pins cost a lookup.

use super::{BackendPin, PinBackend, PinError, Pinning, RawMapping};
use crate::bar::pool::{self, PoolPin};

/// Pins `[addr, addr + size)` through the allocator: `Ok(None)` when there is no allocator in
/// the process or the range is not its memory.
pub(super) fn pin(addr: u64, size: u64) -> Result<Option<Pinning>, PinError> {
    Ok(pool::pin(addr, size)?.map(|p| Pinning {
        start: p.base(),
        len: p.size(),
        pin: Box::new(p),
    }))
}

impl BackendPin for PoolPin {
    fn backend(&self) -> PinBackend {
        // The allocator's chunk mapping is Vulkan's.
        PinBackend::Vulkan
    }

    fn is_pooled(&self) -> bool {
        true
    }

    fn callback_fired(&self, _addr: u64) -> Result<bool, PinError> {
        // The allocator knows whether the application freed it.
        Ok(self.freed()?)
    }

    fn map(&self, len: usize) -> Result<RawMapping, PinError> {
        // The allocator keeps the chunk mapped while the pin lives; the pin's pages are opened
        // for as long as this mapping lives.
        PoolPin::map(self)?;
        Ok(RawMapping {
            base: self.cpu(),
            len,
        })
    }

    unsafe fn unmap(&self, _mapping: RawMapping) {
        let _ = PoolPin::unmap(self);
    }
}
