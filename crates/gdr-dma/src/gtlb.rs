//! The GPU translation table (GTLB) that an FPGA NIC such as FpgaNIC keeps to DMA GPU memory by
//! virtual address: built from the GPU's 64 KiB pages, with one 2 MiB entry wherever 32
//! consecutive pages of a 2 MiB-aligned virtual block are physically contiguous and the physical
//! start is 2 MiB-aligned, and 64 KiB entries elsewhere. The table has separate capacities for
//! the two entry sizes, checked when it is built.

use std::collections::BTreeMap;

/// Bytes of a small entry: one GPU page (64 KiB).
pub const SMALL: u64 = 64 << 10;
/// Bytes of a large entry: 2 MiB, 32 contiguous GPU pages.
pub const LARGE: u64 = 2 << 20;
const PAGES_PER_LARGE: u64 = LARGE / SMALL;

/// One GPU page: virtual -> physical (bus) address, both 64 KiB aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPage {
    /// GPU virtual address of the page.
    pub va: u64,
    /// Physical (bus) address the page maps to, as a peer reaches it.
    pub pa: u64,
}

/// A table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GtlbEntry {
    /// GPU virtual address of the first byte the entry covers.
    pub va: u64,
    /// Physical (bus) address of that byte; the entry covers `size` contiguous bytes.
    pub pa: u64,
    /// Bytes covered: 64 KiB (one GPU page) or 2 MiB (32 of them).
    pub size: u64,
}

/// How many entries of each size the hardware table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GtlbCapacity {
    /// 2 MiB entries the table holds.
    pub large: usize,
    /// 64 KiB entries the table holds.
    pub small: usize,
}

/// Why a table could not be built from the pages given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GtlbError {
    /// A page's virtual or physical address is not a multiple of 64 KiB.
    #[error("page va {va:#x} pa {pa:#x} is not 64 KiB aligned")]
    Misaligned {
        /// The page's virtual address.
        va: u64,
        /// The page's physical address.
        pa: u64,
    },
    /// One virtual page was given two physical pages.
    #[error("virtual page {va:#x} is listed twice with different physical pages")]
    Conflict {
        /// The virtual address listed twice.
        va: u64,
    },
    /// The pages need more entries of one size than the table holds.
    #[error("{kind} entries: need {needed}, the table holds {capacity}")]
    Capacity {
        /// Which entry size: "2 MiB" or "64 KiB".
        kind: &'static str,
        /// Entries of that size the pages need.
        needed: usize,
        /// Entries of that size the table holds.
        capacity: usize,
    },
}

/// A built table: entries sorted by virtual address.
///
/// # Examples
///
/// ```
/// use gdr_dma::{GpuPage, Gtlb, GtlbCapacity, GtlbError};
///
/// const SMALL: u64 = 64 << 10; // a GPU page
/// const LARGE: u64 = 2 << 20;
/// // 2 MiB of GPU memory, physically contiguous and aligned, then one stray page.
/// let mut pages: Vec<GpuPage> = (0..32)
///     .map(|i| GpuPage { va: 0x7f00_0000_0000 + i * SMALL, pa: 0x38_0000_0000 + i * SMALL })
///     .collect();
/// pages.push(GpuPage { va: 0x7f00_0020_0000, pa: 0x38_1234_0000 });
/// let cap = GtlbCapacity { large: 4, small: 4 };
/// let table = Gtlb::build(&pages, cap)?;
/// assert_eq!(table.counts(), (1, 1), "one 2 MiB entry, one 64 KiB entry");
/// assert_eq!(table.translate(0x7f00_0000_0000 + LARGE - 1), Some(0x38_0000_0000 + LARGE - 1));
/// assert_eq!(table.translate(0x7f00_0020_0010), Some(0x38_1234_0010));
/// assert_eq!(table.translate(0x7f00_0021_0000), None, "past the last page");
/// // A table with no room for 64 KiB entries cannot hold the stray page.
/// assert!(matches!(
///     Gtlb::build(&pages, GtlbCapacity { large: 4, small: 0 }),
///     Err(GtlbError::Capacity { needed: 1, capacity: 0, .. })
/// ));
/// # Ok::<(), GtlbError>(())
/// ```
/// A built table: entries sorted by virtual address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gtlb {
    entries: Vec<GtlbEntry>,
    large: usize,
    small: usize,
}

impl Gtlb {
    /// Builds the table for `pages` (any order; exact duplicates are merged).
    pub fn build(pages: &[GpuPage], cap: GtlbCapacity) -> Result<Self, GtlbError> {
        let mut map = BTreeMap::new();
        for p in pages {
            if p.va % SMALL != 0 || p.pa % SMALL != 0 {
                return Err(GtlbError::Misaligned { va: p.va, pa: p.pa });
            }
            if let Some(old) = map.insert(p.va, p.pa) {
                if old != p.pa {
                    return Err(GtlbError::Conflict { va: p.va });
                }
            }
        }
        let mut entries = Vec::new();
        let (mut large, mut small) = (0, 0);
        let mut it = map.iter().peekable();
        while let Some((&va, &pa)) = it.next() {
            if va % LARGE == 0 && pa % LARGE == 0 {
                let whole = (1..PAGES_PER_LARGE)
                    .all(|k| map.get(&(va + k * SMALL)) == Some(&(pa + k * SMALL)));
                if whole {
                    entries.push(GtlbEntry {
                        va,
                        pa,
                        size: LARGE,
                    });
                    large += 1;
                    for _ in 1..PAGES_PER_LARGE {
                        it.next();
                    }
                    continue;
                }
            }
            entries.push(GtlbEntry {
                va,
                pa,
                size: SMALL,
            });
            small += 1;
        }
        for (kind, needed, capacity) in [("2 MiB", large, cap.large), ("64 KiB", small, cap.small)]
        {
            if needed > capacity {
                return Err(GtlbError::Capacity {
                    kind,
                    needed,
                    capacity,
                });
            }
        }
        Ok(Gtlb {
            entries,
            large,
            small,
        })
    }

    /// The entries, sorted by virtual address, as they would be written to the hardware.
    pub fn entries(&self) -> &[GtlbEntry] {
        &self.entries
    }

    /// (2 MiB entries, 64 KiB entries) used.
    pub fn counts(&self) -> (usize, usize) {
        (self.large, self.small)
    }

    /// Translates a virtual address as the hardware would.
    pub fn translate(&self, va: u64) -> Option<u64> {
        let i = self.entries.partition_point(|e| e.va <= va);
        let e = self.entries.get(i.checked_sub(1)?)?;
        (va < e.va + e.size).then(|| e.pa + (va - e.va))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    const CAP: GtlbCapacity = GtlbCapacity {
        large: 1024,
        small: 4096,
    };

    fn contiguous(va: u64, pa: u64, n: u64) -> Vec<GpuPage> {
        (0..n)
            .map(|k| GpuPage {
                va: va + k * SMALL,
                pa: pa + k * SMALL,
            })
            .collect()
    }

    #[test]
    fn contiguous_aligned_blocks_become_large_entries() {
        // 4 MiB contiguous at aligned VA and PA, then 3 more pages.
        let mut pages = contiguous(0x7f00_0000_0000, 0x38_0000_0000, 67);
        pages.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
        let t = Gtlb::build(&pages, CAP).unwrap();
        assert_eq!(t.counts(), (2, 3));
        assert_eq!(t.entries()[0].size, LARGE);
        assert_eq!(
            t.entries()[2],
            GtlbEntry {
                va: 0x7f00_0040_0000,
                pa: 0x38_0040_0000,
                size: SMALL
            }
        );
        for p in &pages {
            assert_eq!(t.translate(p.va + 0x1234), Some(p.pa + 0x1234));
        }
        assert_eq!(t.translate(0x7f00_0000_0000 - 1), None);
        assert_eq!(t.translate(0x7f00_0000_0000 + 67 * SMALL), None);
    }

    #[test]
    fn broken_or_misaligned_blocks_stay_small() {
        // Physically contiguous but PA not 2 MiB aligned.
        let t = Gtlb::build(&contiguous(0x20_0000, 0x1_0001_0000, 32), CAP).unwrap();
        assert_eq!(t.counts(), (0, 32));
        // VA not 2 MiB aligned.
        let t = Gtlb::build(&contiguous(0x21_0000, 0x40_0000, 32), CAP).unwrap();
        assert_eq!(t.counts(), (0, 32));
        // One page of the block physically elsewhere.
        let mut p = contiguous(0x20_0000, 0x40_0000, 32);
        p[17].pa = 0x900_0000;
        let t = Gtlb::build(&p, CAP).unwrap();
        assert_eq!(t.counts(), (0, 32));
        assert_eq!(t.translate(0x20_0000 + 17 * SMALL + 5), Some(0x900_0005));
        // A hole in the block.
        let mut p = contiguous(0x20_0000, 0x40_0000, 32);
        p.remove(31);
        assert_eq!(Gtlb::build(&p, CAP).unwrap().counts(), (0, 31));
    }

    #[test]
    fn random_layouts_translate_every_page() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let mut pages = Vec::new();
        let mut va = 0x7000_0000_0000u64;
        for _ in 0..20 {
            let n = rng.gen_range(1..80u64);
            let pa = if rng.gen_bool(0.5) {
                rng.gen_range(0..1000u64) * LARGE
            } else {
                rng.gen_range(0..100_000u64) * SMALL
            };
            pages.extend(contiguous(va, pa, n));
            va += n * SMALL + rng.gen_range(0..3u64) * SMALL;
        }
        let t = Gtlb::build(&pages, CAP).unwrap();
        let (l, s) = t.counts();
        assert_eq!(l as u64 * PAGES_PER_LARGE + s as u64, pages.len() as u64);
        for p in &pages {
            assert_eq!(t.translate(p.va), Some(p.pa));
            assert_eq!(t.translate(p.va + SMALL - 1), Some(p.pa + SMALL - 1));
        }
    }

    #[test]
    fn errors_for_misalignment_conflicts_and_capacity() {
        assert_eq!(
            Gtlb::build(&[GpuPage { va: 0x1000, pa: 0 }], CAP),
            Err(GtlbError::Misaligned { va: 0x1000, pa: 0 })
        );
        let dup = [GpuPage { va: 0, pa: 0 }, GpuPage { va: 0, pa: SMALL }];
        assert_eq!(Gtlb::build(&dup, CAP), Err(GtlbError::Conflict { va: 0 }));
        let same = [GpuPage { va: 0, pa: 0 }, GpuPage { va: 0, pa: 0 }];
        assert_eq!(Gtlb::build(&same, CAP).unwrap().counts(), (0, 1));
        let tight = GtlbCapacity { large: 1, small: 2 };
        assert!(matches!(
            Gtlb::build(&contiguous(0, 0, 64), tight),
            Err(GtlbError::Capacity {
                kind: "2 MiB",
                needed: 2,
                capacity: 1
            })
        ));
        assert!(matches!(
            Gtlb::build(&contiguous(0, SMALL, 3), tight),
            Err(GtlbError::Capacity {
                kind: "64 KiB",
                needed: 3,
                capacity: 2
            })
        ));
        Gtlb::build(&contiguous(0, 0, 34), tight).unwrap();
    }
}
