//! Memory a device can reach by DMA once it is mapped into the IOMMU: page-aligned host buffers
//! ([`HostBuffer`]), BARs of other devices ([`crate::vfio::Bar`]) and any other CPU mapping
//! ([`RawRegion`], e.g. GPU memory that gdr exposes through BAR1).
//!
//! The CPU reaches such memory only through explicit copies ([`DmaMemory::read_at`],
//! [`DmaMemory::write_at`]) rather than long-lived slices, because a device may write it at any
//! moment while it is mapped.

use crate::error::{DmaError, Result};
use std::ptr::NonNull;

/// A CPU mapping that may be handed to the IOMMU.
///
/// # Safety
/// Implementors promise that `dma_ptr()..dma_ptr()+dma_len()` is a live, readable and writable
/// mapping for as long as the value is borrowed, and that it stays at the same address.
pub unsafe trait DmaMemory {
    fn dma_ptr(&self) -> NonNull<u8>;
    fn dma_len(&self) -> usize;

    /// Copies `out.len()` bytes starting at `offset` out of the region.
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_span(offset, out.len(), self.dma_len())?;
        // SAFETY: the span is inside the live mapping (trait contract + check above); `out` is a
        // distinct Rust buffer so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.dma_ptr().as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_span(offset, data.len(), self.dma_len())?;
        // SAFETY: as in `read_at`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.dma_ptr().as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// Reads native-endian 32-bit words starting at byte `offset`.
    fn read_words(&self, offset: usize, out: &mut [u32]) -> Result<()> {
        let mut bytes = vec![0u8; out.len() * 4];
        self.read_at(offset, &mut bytes)?;
        for (w, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// Writes native-endian 32-bit words starting at byte `offset`.
    fn write_words(&self, offset: usize, words: &[u32]) -> Result<()> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.write_at(offset, &bytes)
    }
}

fn check_span(offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(DmaError::Oversize {
            what: "CPU access past the end of the region",
            len: (offset as u64).saturating_add(len as u64),
            limit: total as u64,
        }),
    }
}

/// The CPU page size (the granule of IOMMU mappings).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(v: u64, align: u64) -> Option<u64> {
    Some(v.checked_add(align - 1)? & !(align - 1))
}

/// Zeroed, page-aligned anonymous memory, unmapped on drop.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: the buffer is plain anonymous memory owned by this value; all CPU access goes through
// copies, so sending or sharing the handle between threads cannot create data races in Rust.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&HostBuffer` only permits copies in and out.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` bytes (rounded up to whole pages), zero-filled.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(DmaError::Invalid("zero-length host buffer".into()));
        }
        let map_len = align_up(len as u64, page_size())
            .ok_or_else(|| DmaError::Invalid(format!("host buffer of {len} bytes")))?
            as usize;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DmaError::last_os(format!(
                "mmap {map_len} bytes of host memory"
            )));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| DmaError::Invalid("mmap gave NULL".into()))?;
        Ok(HostBuffer { ptr, len, map_len })
    }

    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr/map_len are exactly what mmap returned, unmapped once here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

// SAFETY: the mapping lives until drop and never moves.
unsafe impl DmaMemory for HostBuffer {
    fn dma_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn dma_len(&self) -> usize {
        // The whole mapping: IOMMU mappings are whole pages.
        self.map_len
    }
}

/// Any other CPU mapping, e.g. GPU memory reached through a gdr BAR1 mapping or a sysfs
/// `resourceN` mmap. The lifetime ties it to whatever owns the mapping.
pub struct RawRegion<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _owner: std::marker::PhantomData<&'a ()>,
}

impl<'a> RawRegion<'a> {
    /// # Safety
    /// `ptr..ptr+len` must be mapped readable and writable for all of `'a`.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        RawRegion {
            ptr,
            len,
            _owner: std::marker::PhantomData,
        }
    }
}

// SAFETY: guaranteed by the contract of `RawRegion::new`.
unsafe impl DmaMemory for RawRegion<'_> {
    fn dma_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn dma_len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_is_zeroed_page_aligned_and_bounds_checked() {
        let b = HostBuffer::new(5000).unwrap();
        assert_eq!(b.len(), 5000);
        assert_eq!(b.dma_len() as u64 % page_size(), 0);
        assert_eq!(b.dma_ptr().as_ptr() as u64 % page_size(), 0);
        let mut out = vec![0xffu8; 5000];
        b.read_at(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        let words: Vec<u32> = (0..16).map(|i| i * 0x0101_0101).collect();
        b.write_words(4096 - 8, &words).unwrap();
        let mut back = vec![0u32; 16];
        b.read_words(4096 - 8, &mut back).unwrap();
        assert_eq!(back, words);
        assert!(matches!(
            b.read_at(b.dma_len() - 1, &mut [0u8; 2]),
            Err(DmaError::Oversize { .. })
        ));
        assert!(matches!(
            b.write_at(usize::MAX, &[1]),
            Err(DmaError::Oversize { .. })
        ));
        assert!(matches!(HostBuffer::new(0), Err(DmaError::Invalid(_))));
    }
}
