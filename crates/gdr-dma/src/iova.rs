//! IOVA allocation: which device-visible addresses are taken. The window is chosen per engine
//! (QEMU's edu only decodes 28 address bits) and narrowed to what the IOMMU reports usable.

use crate::error::{DmaError, Result};
use std::collections::BTreeMap;

/// A range of I/O virtual addresses: what a device puts in its descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovaRange {
    /// The first address.
    pub iova: u64,
    /// Bytes in the range.
    pub len: u64,
}

impl IovaRange {
    /// The `len` bytes from `iova` on; nothing is checked (see [`IovaRange::end`]).
    pub fn new(iova: u64, len: u64) -> Self {
        IovaRange { iova, len }
    }

    /// One past the last address, or `None` if the range wraps.
    pub fn end(&self) -> Option<u64> {
        self.iova.checked_add(self.len)
    }

    /// The sub-range `[offset, offset+len)`, if it lies inside this one.
    pub fn slice(&self, offset: u64, len: u64) -> Result<IovaRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(IovaRange::new(self.iova + offset, len)),
            _ => Err(DmaError::Oversize {
                what: "slice of an IOVA range",
                len: offset.saturating_add(len),
                limit: self.len,
            }),
        }
    }

    /// True when `other` lies entirely inside `self`.
    pub fn contains(&self, other: &IovaRange) -> bool {
        match (self.end(), other.end()) {
            (Some(se), Some(oe)) => other.iova >= self.iova && oe <= se,
            _ => false,
        }
    }
}

/// First-fit allocator over `[base, limit)`. Every range it gives out is `align`-aligned.
///
/// # Examples
///
/// ```
/// use gdr_dma::{DmaError, IovaAllocator};
///
/// let mut iovas = IovaAllocator::new(0x1000, 0x10_0000)?;
/// let a = iovas.alloc(0x3000, 0x1000)?;
/// let b = iovas.alloc(0x1000, 0x1_0000)?;
/// assert_eq!((a, b), (0x1000, 0x1_0000), "lowest fit, aligned");
/// assert!(iovas.reserve(0x2000, 0x1000).is_err(), "inside `a`");
/// iovas.free(a);
/// iovas.reserve(0x2000, 0x1000)?; // free again
/// assert!(matches!(
///     iovas.alloc(0x10_0000, 0x1000),
///     Err(DmaError::IovaExhausted { limit: 0x10_0000, .. })
/// ));
/// # Ok::<(), DmaError>(())
/// ```
#[derive(Debug)]
pub struct IovaAllocator {
    base: u64,
    limit: u64,
    used: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// `base` and `limit` bound the window; `base` must be below `limit`.
    pub fn new(base: u64, limit: u64) -> Result<Self> {
        if base >= limit {
            return Err(DmaError::Invalid(format!(
                "empty IOVA window {base:#x}..{limit:#x}"
            )));
        }
        Ok(IovaAllocator {
            base,
            limit,
            used: BTreeMap::new(),
        })
    }

    /// One past the highest IOVA this allocator hands out.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Takes the lowest free `len`-byte range aligned to `align` (a power of two).
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64> {
        if len == 0 || !align.is_power_of_two() {
            return Err(DmaError::Invalid(format!(
                "IOVA allocation of {len:#x} bytes aligned to {align:#x}"
            )));
        }
        let exhausted = DmaError::IovaExhausted {
            len,
            limit: self.limit,
        };
        let mut cursor = self.base;
        for (&start, &used_len) in &self.used {
            let cand = match crate::memory::align_up(cursor, align) {
                Some(c) => c,
                None => return Err(exhausted),
            };
            if cand.checked_add(len).is_some_and(|e| e <= start) {
                self.used.insert(cand, len);
                return Ok(cand);
            }
            cursor = cursor.max(start + used_len);
        }
        let cand = crate::memory::align_up(cursor, align).ok_or(DmaError::IovaExhausted {
            len,
            limit: self.limit,
        })?;
        if cand.checked_add(len).is_some_and(|e| e <= self.limit) {
            self.used.insert(cand, len);
            Ok(cand)
        } else {
            Err(exhausted)
        }
    }

    /// Takes exactly `[iova, iova+len)` if it is free and inside the window.
    pub fn reserve(&mut self, iova: u64, len: u64) -> Result<()> {
        let want = IovaRange::new(iova, len);
        let window = IovaRange::new(self.base, self.limit - self.base);
        if len == 0 || !window.contains(&want) {
            return Err(DmaError::Invalid(format!(
                "IOVA {iova:#x}+{len:#x} outside the window {:#x}..{:#x}",
                self.base, self.limit
            )));
        }
        let overlaps = self
            .used
            .range(..iova + len)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > iova);
        if overlaps {
            return Err(DmaError::Invalid(format!(
                "IOVA {iova:#x}+{len:#x} is taken"
            )));
        }
        self.used.insert(iova, len);
        Ok(())
    }

    /// Gives a range back. Unknown addresses are ignored (double free cannot corrupt the map).
    pub fn free(&mut self, iova: u64) {
        self.used.remove(&iova);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_respects_alignment_window_and_reuse() {
        let mut a = IovaAllocator::new(0x1000, 0x10_0000).unwrap();
        let x = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(x, 0x1000);
        let y = a.alloc(0x3000, 0x1_0000).unwrap();
        assert_eq!(y, 0x1_0000);
        let z = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(z, 0x2000, "fills the gap below y");
        a.free(x);
        assert_eq!(a.alloc(0x1000, 0x1000).unwrap(), 0x1000);
        assert!(matches!(
            a.alloc(0x10_0000, 0x1000),
            Err(DmaError::IovaExhausted { .. })
        ));
        assert!(a.alloc(0, 0x1000).is_err());
        assert!(a.alloc(0x1000, 3).is_err());
        // Fill the rest exactly, then nothing fits.
        let rest = 0x10_0000 - 0x1_3000;
        assert_eq!(a.alloc(rest, 0x1000).unwrap(), 0x1_3000);
        assert!(
            a.alloc(0x1000, 0x1000).is_ok(),
            "gap 0x3000..0x10000 still free"
        );
    }

    #[test]
    fn reserve_rejects_overlap_and_outside() {
        let mut a = IovaAllocator::new(0x1000, 0x9000).unwrap();
        a.reserve(0x4000, 0x2000).unwrap();
        assert!(a.reserve(0x5000, 0x1000).is_err());
        assert!(a.reserve(0x3000, 0x2000).is_err());
        assert!(a.reserve(0x8000, 0x2000).is_err());
        assert!(a.reserve(0, 0x1000).is_err());
        a.reserve(0x6000, 0x1000).unwrap();
        assert_eq!(a.alloc(0x3000, 0x1000).unwrap(), 0x1000);
        assert!(IovaAllocator::new(5, 5).is_err());
    }

    #[test]
    fn range_slice_and_contains() {
        let r = IovaRange::new(0x1000, 0x100);
        assert_eq!(r.slice(0x10, 0x20).unwrap(), IovaRange::new(0x1010, 0x20));
        assert!(r.slice(0xf0, 0x20).is_err());
        assert!(r.slice(u64::MAX, 2).is_err());
        assert!(r.contains(&IovaRange::new(0x1000, 0x100)));
        assert!(!r.contains(&IovaRange::new(0x10ff, 2)));
        assert!(!r.contains(&IovaRange::new(u64::MAX, 2)));
    }
}
