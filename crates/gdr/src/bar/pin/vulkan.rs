//! The Vulkan pin backend: a `cuMemCreate` allocation made with a POSIX-fd handle type is
//! exported, imported into Vulkan's host-visible device-local memory type and mapped with
//! `vkMapMemory`. Also the diagnostic of that import, [`vulkan_import_outcome`].

use super::{
    pinned_buffer_freed, prove, Backend, BackendPin, PinBackend, PinError, Pinning, RawMapping,
};
use crate::bar::backend::dmabuf::{allocation_range, PeerError};
use crate::bar::backend::vulkan::{BarError, Imported, VulkanBackend};
use crate::cuda::{self, buffer_id, vmm, Context};
use std::sync::Arc;

/// Pins by Vulkan import, with the Vulkan device of one GPU.
pub(super) struct VulkanPinBackend {
    be: VulkanBackend,
}

/// Opens Vulkan on `ctx`'s GPU and proves the import path on a small VMM allocation
/// (allocate, export, import, map) before the backend is taken.
pub(super) fn open(ctx: &Context) -> Result<(Arc<dyn Backend>, String), PinError> {
    let pinner = VulkanPinBackend {
        be: VulkanBackend::new(ctx)?,
    };
    let buf = vmm::VmmBuffer::new(ctx, 1)?;
    prove(&pinner, cuda::DeviceMemory::device_ptr(&buf), 1)?;
    Ok((
        Arc::new(pinner),
        "Vulkan imports POSIX-fd cuMemCreate memory into a host-visible type \
         (only such allocations can be pinned)"
            .into(),
    ))
}

impl Backend for VulkanPinBackend {
    fn kind(&self) -> PinBackend {
        PinBackend::Vulkan
    }

    fn pin(&self, addr: u64, size: u64) -> Result<Pinning, PinError> {
        let be = &self.be;
        be.context().bind()?;
        let (base, alloc_size) = allocation_range(addr)?;
        // Whether the memory can be exported at all comes first: for plain cudaMalloc memory
        // that is the real cause, whatever the range (UCX pins the 64 KiB pages around a small
        // buffer, which run past a cudaMalloc allocation but not past a cuMemCreate chunk).
        let fd = vmm::export_allocation(base).map_err(|e| PinError::NotExportable {
            addr,
            cumemcreate: !matches!(e, vmm::NotExportable::NotVmm(_)),
            why: e.to_string(),
        })?;
        if addr + size > base + alloc_size {
            return Err(PeerError::OutsideAllocation {
                addr,
                size,
                base,
                alloc_size,
            }
            .into());
        }
        let buffer_id = buffer_id(addr).ok().flatten();
        let gran = vmm::granularity(be.context())? as u64;
        let import_size = alloc_size.next_multiple_of(gran);
        let imported = be
            .import_fd(fd, import_size as usize, true)
            .map_err(PinError::ImportRefused)?;
        Ok(Pinning {
            start: base,
            len: imported.size() as u64,
            pin: Box::new(VulkanPinned {
                imported,
                buffer_id,
            }),
        })
    }
}

/// A Vulkan import of the allocation; its memory is freed on drop, which releases the pin.
struct VulkanPinned {
    imported: Imported,
    /// CUDA's BUFFER_ID of the allocation when pinned (a different one later means the
    /// application freed it while pinned).
    buffer_id: Option<u64>,
}

impl BackendPin for VulkanPinned {
    fn backend(&self) -> PinBackend {
        PinBackend::Vulkan
    }

    fn callback_fired(&self, addr: u64) -> Result<bool, PinError> {
        pinned_buffer_freed(addr, self.buffer_id)
    }

    fn map(&self, len: usize) -> Result<RawMapping, PinError> {
        // The import's own mapping (`vkMapMemory`), opened for this mapping and closed in
        // `unmap`.
        Ok(RawMapping {
            base: self.imported.map()?,
            len,
        })
    }

    unsafe fn unmap(&self, _mapping: RawMapping) {
        // SAFETY: per the caller's contract, mapped by `map` for this mapping and unused from
        // now on.
        unsafe { self.imported.unmap() };
    }
}

/// What Vulkan does with a POSIX-fd `cuMemCreate` allocation of `ctx`'s GPU: the result of
/// importing it into the host-visible device-local type and mapping it, and of importing it
/// into a device-only type (which tells "no import at all" from "no host-visible import").
#[derive(Debug, Clone, serde::Serialize)]
pub struct VulkanImportOutcome {
    /// Importing the allocation's fd into the host-visible device-local memory type; the error
    /// as text.
    pub host_visible_import: Result<(), String>,
    /// `vkMapMemory` of that import (an error saying "not imported" when the import failed).
    pub host_visible_map: Result<(), String>,
    /// Importing the same allocation into a device-local type without HOST_VISIBLE.
    pub device_only_import: Result<(), String>,
}

/// Tries the Vulkan import of CUDA VMM memory both ways (see [`VulkanImportOutcome`]).
pub fn vulkan_import_outcome(ctx: &Context) -> Result<VulkanImportOutcome, PinError> {
    let be = VulkanBackend::new(ctx)?;
    let buf = vmm::VmmBuffer::new(ctx, 1)?;
    let size = buf.alloc_size();
    let host = be.import_fd(buf.export_fd()?, size, true);
    let host_visible_map = match &host {
        Ok(imp) => imp.map().map(|_| {
            // SAFETY: mapped just now, not used.
            unsafe { imp.unmap() }
        }),
        Err(_) => Err(BarError::BadLayout("not imported".into())),
    }
    .map_err(|e| e.to_string());
    let device_only_import = be
        .import_fd(buf.export_fd()?, size, false)
        .map(drop)
        .map_err(|e| e.to_string());
    Ok(VulkanImportOutcome {
        host_visible_import: host.map(drop).map_err(|e| e.to_string()),
        host_visible_map,
        device_only_import,
    })
}
