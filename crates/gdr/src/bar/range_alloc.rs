//! First-fit allocator of byte ranges inside one block, with coalescing on free.
//!
//! Pure bookkeeping over offsets: it never touches memory, so it is tested without a GPU.

use std::collections::BTreeMap;

/// Free ranges of a block of `size` bytes, keyed by start offset.
///
/// # Examples
///
/// ```
/// use gdr::bar::RangeAlloc;
///
/// let mut r = RangeAlloc::new(4096);
/// let a = r.alloc(100, 64).unwrap();
/// let b = r.alloc(100, 256).unwrap();
/// assert_eq!((a, b), (0, 256), "first fit, aligned");
/// assert_eq!((r.used(), r.fragments()), (200, 2), "a hole before `b`, the rest after it");
/// assert_eq!(r.alloc(4096, 64), None, "no room");
/// r.free(a, 100);
/// r.free(b, 100);
/// assert!(r.is_empty());
/// assert_eq!(r.fragments(), 1, "freed neighbours merge");
/// ```
#[derive(Debug)]
pub struct RangeAlloc {
    size: usize,
    free: BTreeMap<usize, usize>,
    used: usize,
}

impl RangeAlloc {
    /// A block of `size` bytes with nothing allocated (one free range, none if `size` is 0).
    pub fn new(size: usize) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        RangeAlloc {
            size,
            free,
            used: 0,
        }
    }

    /// Reserves `len` bytes (more than 0) at an offset that is a multiple of `align` (a power
    /// of two), in the first free range where it fits; `None` when none does.
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<usize> {
        debug_assert!(align.is_power_of_two() && len > 0);
        let (start, size, at) = self.free.iter().find_map(|(&start, &size)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            let end = at.checked_add(len)?;
            (end <= start + size).then_some((start, size, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + len;
        if end < start + size {
            self.free.insert(end, start + size - end);
        }
        self.used += len;
        Some(at)
    }

    /// Returns `[offset, offset+len)`, merging it with free neighbours. The range must be one
    /// that [`alloc`](Self::alloc) handed out; a range that was not allocated corrupts the
    /// bookkeeping (debug builds assert against double frees and ranges past the end, and
    /// freeing more than is used panics on the counter's underflow).
    pub fn free(&mut self, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.size);
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free at {offset}");
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if let Some(&nl) = self.free.get(&end) {
            self.free.remove(&end);
            end += nl;
        }
        self.free.insert(start, end - start);
        self.used -= len;
    }

    /// Bytes allocated now (the sum of the live ranges' lengths).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The block's size in bytes, as given to [`new`](Self::new).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of separate free ranges (1 when nothing is allocated).
    pub fn fragments(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn alignment_and_exhaustion() {
        let mut a = RangeAlloc::new(4096);
        let x = a.alloc(1, 1).unwrap();
        let y = a.alloc(10, 256).unwrap();
        assert_eq!(x, 0);
        assert_eq!(y, 256);
        assert_eq!(a.used(), 11);
        assert!(a.alloc(4096, 1).is_none());
        let z = a.alloc(4096 - 266, 1).unwrap();
        assert_eq!(z, 266);
        assert!(a.alloc(1, 1).is_some()); // the gap between 1 and 256
        a.free(y, 10);
        a.free(x, 1);
        a.free(z, 4096 - 266);
    }

    #[test]
    fn freeing_everything_coalesces_to_one_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let mut a = RangeAlloc::new(1 << 20);
        let mut live: Vec<(usize, usize)> = Vec::new();
        for _ in 0..20_000 {
            if live.is_empty() || rng.gen_bool(0.55) {
                let len = rng.gen_range(1..5000);
                let align = 1 << rng.gen_range(0..12);
                if let Some(off) = a.alloc(len, align) {
                    assert_eq!(off % align, 0);
                    for &(o, l) in &live {
                        assert!(off + len <= o || o + l <= off, "overlap");
                    }
                    live.push((off, len));
                }
            } else {
                let i = rng.gen_range(0..live.len());
                let (o, l) = live.swap_remove(i);
                a.free(o, l);
            }
            assert_eq!(a.used(), live.iter().map(|x| x.1).sum::<usize>());
        }
        for (o, l) in live.drain(..) {
            a.free(o, l);
        }
        assert!(a.is_empty());
        assert_eq!(a.fragments(), 1);
        assert_eq!(a.alloc(1 << 20, 1), Some(0));
    }
}
