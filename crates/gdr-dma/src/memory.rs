//! Memory a device can reach by DMA once it is mapped into the IOMMU: anything that is
//! [`MappedMemory`] (gdr-mem's trait for CPU mappings of device-reachable memory): page-aligned
//! host buffers ([`HostPages`]), BARs of other devices ([`MappedBar`](crate::MappedBar)), GPU memory that
//! gdr maps through BAR1 (`gdr::bar::MappedBuffer`), and any other CPU mapping ([`RawRegion`]).
//!
//! The CPU reaches such memory only through explicit copies ([`MappedMemory::read_at`],
//! [`MappedMemory::write_at`]) rather than long-lived slices, because a device may write it at
//! any moment while it is mapped.

use crate::error::{DmaError, Result};
pub use gdr_mem::{AccessError, Caching, MappedMemory};
use std::ptr::NonNull;

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
///
/// # Examples
///
/// ```
/// use gdr_dma::{AccessError, DmaError, HostPages, MappedMemory};
///
/// let pages = HostPages::new(100)?;
/// assert_eq!(pages.len(), 100);
/// assert!(pages.size() >= 4096 && pages.size() % 4096 == 0, "whole pages are mapped");
/// pages.write_at(90, b"0123456789")?;
/// let mut back = [0u8; 12];
/// pages.read_at(88, &mut back)?;
/// assert_eq!(&back, b"\0\00123456789", "zero-filled around what was written");
/// assert!(matches!(
///     pages.write_at(pages.size() - 4, &[1; 8]),
///     Err(AccessError::OutOfBounds { .. })
/// ));
/// assert!(HostPages::new(0).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// Zeroed, page-aligned anonymous memory, unmapped on drop.
pub struct HostPages {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: the buffer is plain anonymous memory owned by this value; all CPU access goes through
// copies, so sending or sharing the handle between threads cannot create data races in Rust.
unsafe impl Send for HostPages {}
// SAFETY: as above; `&HostPages` only permits copies in and out.
unsafe impl Sync for HostPages {}

impl HostPages {
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
        Ok(HostPages { ptr, len, map_len })
    }

    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length asked for is 0 (never so: [`HostPages::new`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostPages {
    fn drop(&mut self) {
        // SAFETY: ptr/map_len are exactly what mmap returned, unmapped once here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

// SAFETY: the mapping lives, page-aligned and at a fixed address, until drop; it is only
// reached through copies.
unsafe impl MappedMemory for HostPages {
    fn cpu_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        // The whole mapping: IOMMU mappings are whole pages.
        self.map_len
    }
    fn caching(&self) -> Caching {
        Caching::WriteBack
    }
}

/// A CPU mapping that no Rust type owns, e.g. a sysfs `resourceN` mmap or a mapping made by C
/// code. The lifetime ties it to whatever owns the mapping. Mappings that gdr makes (BAR1
/// mappings of GPU memory, ring regions, buffers) are [`MappedMemory`] themselves and need no
/// `RawRegion`.
pub struct RawRegion<'a> {
    ptr: NonNull<u8>,
    len: usize,
    caching: Caching,
    _owner: std::marker::PhantomData<&'a ()>,
}

impl<'a> RawRegion<'a> {
    /// # Safety
    /// `ptr..ptr+len` must be mapped readable and writable for all of `'a`, with no Rust
    /// reference to those bytes, and cached as `caching` says (see [`MappedMemory`]'s
    /// contract for write-combined memory).
    pub unsafe fn new(ptr: NonNull<u8>, len: usize, caching: Caching) -> Self {
        RawRegion {
            ptr,
            len,
            caching,
            _owner: std::marker::PhantomData,
        }
    }
}

// SAFETY: guaranteed by the contract of `RawRegion::new`.
unsafe impl MappedMemory for RawRegion<'_> {
    fn cpu_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        self.len
    }
    fn caching(&self) -> Caching {
        self.caching
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_is_zeroed_page_aligned_and_bounds_checked() {
        let b = HostPages::new(5000).unwrap();
        assert_eq!(b.len(), 5000);
        assert_eq!(b.size() as u64 % page_size(), 0);
        assert_eq!(b.cpu_ptr() as u64 % page_size(), 0);
        let mut out = vec![0xffu8; 5000];
        b.read_at(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        let words: Vec<u32> = (0..16).map(|i| i * 0x0101_0101).collect();
        b.write_u32s(4096 - 8, &words).unwrap();
        let mut back = vec![0u32; 16];
        b.read_u32s(4096 - 8, &mut back).unwrap();
        assert_eq!(back, words);
        assert!(matches!(
            b.read_at(b.size() - 1, &mut [0u8; 2]),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.write_at(usize::MAX, &[1]),
            Err(AccessError::OutOfBounds { .. })
        ));
        assert!(matches!(HostPages::new(0), Err(DmaError::Invalid(_))));
    }
}
