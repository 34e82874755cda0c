use super::*;
use rand::{Rng, RngCore};
use std::cell::UnsafeCell;

/// Page-aligned host memory standing in for a GPU mapping (the store loops are only slower,
/// not wrong, on cached memory). Its `DeviceMemory` side is never used: no CUDA context is
/// passed, so the copy-engine cases are skipped.
struct FakeMapping {
    buf: Box<[UnsafeCell<u8>]>,
    skew: usize,
    len: usize,
}

impl FakeMapping {
    fn new(len: usize, poison: u8) -> FakeMapping {
        let buf: Box<[UnsafeCell<u8>]> = (0..len + PAGE).map(|_| UnsafeCell::new(poison)).collect();
        let skew = (buf.as_ptr() as *const u8).align_offset(PAGE);
        FakeMapping { buf, skew, len }
    }
    fn bytes(&self) -> Vec<u8> {
        // SAFETY: no store loop runs while the test reads.
        (0..self.len)
            .map(|i| unsafe { *self.buf[self.skew + i].get() })
            .collect()
    }
}

// SAFETY: the pointer covers `len` owned bytes behind UnsafeCells, page aligned, alive as long
// as self.
unsafe impl MappedMemory for FakeMapping {
    fn cpu_ptr(&self) -> *mut u8 {
        self.buf[self.skew].get()
    }
    fn size(&self) -> usize {
        self.len
    }
    fn caching(&self) -> gdr::mem::Caching {
        gdr::mem::Caching::WriteCombined
    }
}

impl DeviceMemory for FakeMapping {
    fn device_ptr(&self) -> u64 {
        0
    }
    fn len(&self) -> usize {
        self.len
    }
}

fn config(sizes: Vec<usize>, cases: Vec<Case>) -> CeilingConfig {
    CeilingConfig {
        sizes,
        cases,
        budget: Duration::from_millis(5),
        samples: 9,
    }
}

#[test]
fn pieces_cover_every_page_once_in_each_order() {
    for pages in [1usize, 2, 3, 7, 16, 33] {
        for n in 1..=6 {
            for order in [Order::Blocks, Order::Interleaved, Order::PagesDescending] {
                let mut seen = vec![0u32; pages];
                for i in 0..n {
                    let mut last: Option<usize> = None;
                    for_each_piece(order, pages * PAGE, i, n, |off, len| {
                        assert_eq!(off % PAGE, 0);
                        assert_eq!(len % PAGE, 0);
                        assert!(len > 0);
                        for s in &mut seen[off / PAGE..(off + len) / PAGE] {
                            *s += 1;
                        }
                        match (order, last) {
                            (Order::PagesDescending, Some(l)) => assert!(off < l, "{order:?}"),
                            (_, Some(l)) => assert!(off > l, "{order:?}"),
                            _ => {}
                        }
                        last = Some(off);
                    });
                }
                assert!(
                    seen.iter().all(|&s| s == 1),
                    "{order:?} pages {pages} n {n}: {seen:?}"
                );
            }
        }
    }
}

#[test]
fn interleaved_pieces_are_dealt_round_robin() {
    let mut got = Vec::new();
    for_each_piece(Order::Interleaved, 10 * PAGE, 1, 3, |off, _| {
        got.push(off / PAGE)
    });
    assert_eq!(got, [1, 4, 7]);
}

#[test]
fn fill_writes_whole_or_half_lines_and_nothing_else() {
    for width in [Width::B16, Width::B32, Width::B64] {
        if !width.is_available() {
            eprintln!("skipped: this CPU lacks {}-byte stores", width.bytes());
            continue;
        }
        for half in [false, true] {
            if half && width == Width::B64 {
                continue;
            }
            let m = FakeMapping::new(3 * PAGE, 0x11);
            // Two pages in the middle; the first and last stay poisoned.
            // SAFETY: page 1..3 of the fake mapping, aligned, nothing else touches it.
            unsafe { kernels::fill(m.cpu_ptr().add(PAGE), PAGE, width, half, 0xA5) };
            let b = m.bytes();
            for (i, &v) in b.iter().enumerate() {
                let written = (PAGE..2 * PAGE).contains(&i) && (!half || i % LINE < LINE / 2);
                assert_eq!(
                    v,
                    if written { 0xA5 } else { 0x11 },
                    "{width:?} half {half} byte {i}"
                );
            }
        }
    }
}

#[test]
fn copy_moves_the_bytes_at_every_prefetch_distance() {
    if !Width::B64.is_available() {
        eprintln!("skipped: this CPU lacks AVX-512F");
        return;
    }
    let mut rng = rand::thread_rng();
    let mut all = vec![Reads::Staged];
    for distance in [0, 64, 1024, 16384] {
        for hint in [Hint::T0, Hint::T2, Hint::Nta] {
            all.push(Reads::Prefetch { distance, hint });
        }
    }
    for reads in all {
        let m = FakeMapping::new(4 * PAGE, 0x5A);
        let mut src = vec![0u8; 2 * PAGE + 7];
        rng.fill_bytes(&mut src);
        let skew = rng.gen_range(0..7);
        // SAFETY: two pages of the fake mapping from page 1; the source has 2 pages after skew.
        unsafe { kernels::copy(m.cpu_ptr().add(PAGE), src[skew..].as_ptr(), 2 * PAGE, reads) };
        let b = m.bytes();
        assert_eq!(&b[PAGE..3 * PAGE], &src[skew..skew + 2 * PAGE], "{reads:?}");
        assert!(b[..PAGE].iter().chain(&b[3 * PAGE..]).all(|&v| v == 0x5A));
    }
}

#[test]
fn measure_runs_each_case_and_names_what_it_skips() {
    let m = FakeMapping::new(8 * PAGE, 0);
    let cases = cases(&[1, 3]);
    let (rows, skipped) =
        measure(None, &m, &config(vec![4 * PAGE, 8 * PAGE], cases.clone())).unwrap();
    // The copy engine needs a context; everything else runs where its instructions exist.
    for c in &cases {
        let ran = rows.iter().filter(|r| r.detail == *c).count();
        let why = skipped.iter().find(|s| s.case == c.to_string());
        match c {
            Case::CopyEnginePinned | Case::CopyEnginePageable => {
                assert_eq!(ran, 0);
                assert_eq!(why.unwrap().why, "no CUDA context");
            }
            _ if c.unavailable().is_some() => assert!(ran == 0 && why.is_some(), "{c}"),
            _ => assert_eq!(ran, 2, "{c}: one row per size"),
        }
    }
    for r in &rows {
        assert!(r.gbps.is_finite() && r.gbps > 0.0, "{}: {}", r.case, r.gbps);
        assert!(r.gbps_best >= r.gbps);
        assert!(r.us.n >= 9);
        let lines = (r.size / LINE) as f64 / r.us.median;
        assert!((r.lines_per_us - lines).abs() < 1e-9 * lines.max(1.0));
    }
    // The half-line case reports half the bytes for the same lines.
    if let Some(h) = rows.iter().find(|r| r.detail.payload_fraction() == 0.5) {
        assert!(
            (h.gbps * 2.0 / 1e3 * h.us.median - h.size as f64 / 1e6).abs() < 1e-6 * h.size as f64
        );
    }
}

#[test]
fn a_store_case_leaves_its_pattern_in_the_target() {
    let m = FakeMapping::new(4 * PAGE, 0x33);
    let case = Case::Stores {
        width: Width::B16,
        half_lines: true,
        source: Source::Registers,
        order: Order::Interleaved,
        threads: 3,
        target: Target::Gpu,
    };
    measure(None, &m, &config(vec![2 * PAGE], vec![case])).unwrap();
    let b = m.bytes();
    for (i, &v) in b.iter().enumerate() {
        let written = i < 2 * PAGE && i % LINE < LINE / 2;
        assert_eq!(v, if written { 0xA5 } else { 0x33 }, "byte {i}");
    }
}

#[test]
fn bad_sizes_are_refused_before_anything_runs() {
    let m = FakeMapping::new(2 * PAGE, 0x77);
    let c = vec![Case::Library {
        isa: Isa::Portable,
        threads: 1,
    }];
    for size in [0, 100, PAGE + 64, 3 * PAGE] {
        let e = measure(None, &m, &config(vec![size], c.clone())).unwrap_err();
        assert!(
            matches!(e, CeilingError::Size { size: s, max } if s == size && max == 2 * PAGE),
            "{e}"
        );
    }
    assert!(m.bytes().iter().all(|&v| v == 0x77), "nothing written");
}

#[test]
fn case_names_are_distinct() {
    let cs = cases(&[1, 2, 4, 8, 16]);
    let mut names: Vec<String> = cs.iter().map(|c| c.to_string()).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "{names:?}");
    assert!(cs.contains(&Case::CopyEnginePinned));
    // The one-thread copy's floor: the same copy into host memory.
    assert!(cs
        .iter()
        .any(|c| c.to_string() == "64B stores from a buffer x1 to host memory"));
    // A count given twice or out of order is the same experiment.
    assert_eq!(cases(&[4, 1, 4, 2]), cases(&[1, 2, 4]));
}
