//! A simulated IOMMU for tests and engine models: an [`IommuBackend`] that records what is
//! mapped and lets a model device read and write memory by IOVA, faulting on anything unmapped,
//! just as a real IOMMU would block the access.

use crate::error::{DmaError, Result};
use crate::iommu::IommuBackend;
use crate::iova::IovaRange;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A DMA access that hit no mapping (what the model reports as a read or write error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IovaFault {
    /// Start of the access.
    pub iova: u64,
    /// Bytes of the access.
    pub len: u64,
}

/// Records IOMMU mappings (IOVA -> CPU address) and performs device accesses through them.
pub struct SimIommu {
    page: u64,
    maps: Mutex<BTreeMap<u64, (usize, u64)>>,
}

impl SimIommu {
    /// An IOMMU with nothing mapped and a granule of `page` bytes.
    pub fn new(page: u64) -> Self {
        SimIommu {
            page,
            maps: Mutex::new(BTreeMap::new()),
        }
    }

    /// The mapped IOVA ranges, lowest first.
    pub fn mapped_ranges(&self) -> Vec<IovaRange> {
        self.lock()
            .iter()
            .map(|(&iova, &(_, len))| IovaRange::new(iova, len))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (usize, u64)>> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The CPU address behind `[iova, iova+len)` if one mapping covers it all.
    fn translate(&self, iova: u64, len: u64) -> Result<usize, IovaFault> {
        let fault = IovaFault { iova, len };
        let maps = self.lock();
        let (&base, &(vaddr, mlen)) = maps.range(..=iova).next_back().ok_or(fault)?;
        if !IovaRange::new(base, mlen).contains(&IovaRange::new(iova, len)) {
            return Err(fault);
        }
        Ok(vaddr + (iova - base) as usize)
    }

    /// A device read of `out.len()` bytes at `iova`.
    pub fn read(&self, iova: u64, out: &mut [u8]) -> Result<(), IovaFault> {
        let p = self.translate(iova, out.len() as u64)?;
        // SAFETY: `IommuSpace` only maps CPU memory that stays alive until it unmaps it, and the
        // translated span lies inside one such mapping.
        unsafe { std::ptr::copy(p as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A device write of `data` at `iova`.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), IovaFault> {
        let p = self.translate(iova, data.len() as u64)?;
        // SAFETY: as in `read`, the translated span lies inside one mapping whose CPU memory
        // `IommuSpace` keeps alive until it unmaps it; `data` is a separate, live buffer.
        unsafe { std::ptr::copy(data.as_ptr(), p as *mut u8, data.len()) };
        Ok(())
    }
}

impl IommuBackend for SimIommu {
    fn page_size(&self) -> u64 {
        self.page
    }

    fn map(&self, vaddr: usize, iova: u64, len: u64) -> Result<()> {
        if !(vaddr as u64).is_multiple_of(self.page)
            || !iova.is_multiple_of(self.page)
            || !len.is_multiple_of(self.page)
        {
            return Err(DmaError::io(
                "simulated VFIO_IOMMU_MAP_DMA",
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        let mut maps = self.lock();
        let new = IovaRange::new(iova, len);
        let clash = maps.iter().any(|(&b, &(_, l))| {
            let old = IovaRange::new(b, l);
            new.iova < old.iova + old.len && old.iova < new.iova + new.len
        });
        if clash {
            return Err(DmaError::io(
                "simulated VFIO_IOMMU_MAP_DMA",
                std::io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        maps.insert(iova, (vaddr, len));
        Ok(())
    }

    fn unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut maps = self.lock();
        match maps.get(&iova) {
            Some(&(_, l)) if l == len => {
                maps.remove(&iova);
                Ok(())
            }
            _ => Err(DmaError::io(
                "simulated VFIO_IOMMU_UNMAP_DMA",
                std::io::Error::from_raw_os_error(libc::ENOENT),
            )),
        }
    }
}
