//! Correctness of the copy kernels on ordinary memory (streaming stores and loads behave the same
//! on write-back memory, only the speed differs). Every case uses fresh random data and a freshly
//! poisoned destination with guard bytes on both sides, and checks the whole region: the copied
//! bytes must match and every other byte must keep its poison.

use super::isa::choice_from;
use super::*;
use rand::{Rng, RngCore};

/// Bytes checked on each side of a destination range.
const GUARD: usize = 64;

/// Fills `buf` with fresh random bytes: a seed from `rand` per call, expanded with SplitMix64 (far
/// faster than a cryptographic generator in unoptimised test builds, which matters for the
/// million-case sweeps).
fn fill_random(buf: &mut [u8], rng: &mut impl RngCore) {
    let mut state = rng.next_u64();
    for chunk in buf.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_ne_bytes()[..chunk.len()]);
    }
}

/// A byte buffer with a 64-byte aligned index `base` that has at least `GUARD` (and one line of)
/// bytes before it and `room + GUARD + 64` after it.
struct Arena {
    buf: Vec<u8>,
    base: usize,
}

impl Arena {
    fn new(room: usize) -> Arena {
        let buf = vec![0u8; room + 2 * GUARD + 3 * 64];
        let addr = buf.as_ptr() as usize;
        let base = ((addr + GUARD + 63) & !63) - addr;
        Arena { buf, base }
    }
}

/// Reusable buffers for a sweep.
struct Bench {
    src: Arena,
    dst: Arena,
    expected: Vec<u8>,
}

impl Bench {
    fn new(room: usize) -> Bench {
        Bench {
            src: Arena::new(room),
            dst: Arena::new(room),
            expected: Vec::with_capacity(room + 2 * GUARD + 64),
        }
    }
}

/// Panics with the first difference between what a region holds and what it should hold.
fn compare(what: &str, got: &[u8], want: &[u8], first: usize, len: usize) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        let place = if at < first {
            "guard before"
        } else if at < first + len {
            "copied range"
        } else {
            "guard after"
        };
        panic!(
            "{what}: byte {at} of the checked region differs ({place}; range at {first}, \
             len {len}): got {:#04x}, want {:#04x}",
            got[at], want[at]
        );
    }
}

/// One copy into a "mapping" (the dst arena) at `map_off`, from `src_off` in the src arena.
fn case_store(
    b: &mut Bench,
    rng: &mut impl RngCore,
    isa: Option<Isa>,
    len: usize,
    map_off: usize,
    src_off: usize,
) {
    let s0 = b.src.base + src_off;
    fill_random(&mut b.src.buf[s0..s0 + len], rng);
    let lo = b.dst.base - GUARD;
    let hi = b.dst.base + map_off + len + GUARD;
    fill_random(&mut b.dst.buf[lo..hi], rng);
    b.expected.clear();
    b.expected.extend_from_slice(&b.dst.buf[lo..hi]);
    let first = GUARD + map_off;
    b.expected[first..first + len].copy_from_slice(&b.src.buf[s0..s0 + len]);
    let dst = b.dst.buf[b.dst.base + map_off..].as_mut_ptr();
    let src = &b.src.buf[s0..s0 + len];
    match isa {
        // SAFETY: `dst` has `len + GUARD` writable bytes after it inside the dst arena, which
        // does not overlap the src arena.
        Some(isa) => unsafe { copy_to_mapping_with(isa, dst, src) }.expect("ISA available"),
        // SAFETY: as above.
        None => unsafe { copy_to_mapping(dst, src) },
    }
    compare(
        &format!("store {isa:?} len {len} map_off {map_off} src_off {src_off}"),
        &b.dst.buf[lo..hi],
        &b.expected,
        first,
        len,
    );
}

/// One copy out of a "mapping" (the src arena) at `map_off`, into `dst_off` of the dst arena.
fn case_load(
    b: &mut Bench,
    rng: &mut impl RngCore,
    isa: Option<Isa>,
    len: usize,
    map_off: usize,
    dst_off: usize,
) {
    let s0 = b.src.base + map_off;
    // Random bytes around the range too, so a kernel copying a neighbour byte is caught.
    fill_random(&mut b.src.buf[b.src.base - 64..s0 + len + 64], rng);
    let lo = b.dst.base - GUARD;
    let hi = b.dst.base + dst_off + len + GUARD;
    fill_random(&mut b.dst.buf[lo..hi], rng);
    b.expected.clear();
    b.expected.extend_from_slice(&b.dst.buf[lo..hi]);
    let first = GUARD + dst_off;
    b.expected[first..first + len].copy_from_slice(&b.src.buf[s0..s0 + len]);
    let src = b.src.buf[s0..].as_ptr();
    let d0 = b.dst.base + dst_off;
    let dst = &mut b.dst.buf[d0..d0 + len];
    match isa {
        // SAFETY: the 64-byte lines covering [src, src+len) lie inside the src arena (a full
        // line of slack on each side of the aligned base and range), which does not overlap the
        // dst arena.
        Some(isa) => unsafe { copy_from_mapping_with(isa, dst, src) }.expect("ISA available"),
        // SAFETY: as above.
        None => unsafe { copy_from_mapping(dst, src) },
    }
    compare(
        &format!("load {isa:?} len {len} map_off {map_off} dst_off {dst_off}"),
        &b.dst.buf[lo..hi],
        &b.expected,
        first,
        len,
    );
}

/// The ISAs to sweep: each available one, plus `None` for the plain dispatching routine.
fn variants(store: bool) -> Vec<Option<Isa>> {
    let list = if store {
        Isa::available_for_store()
    } else {
        Isa::available_for_load()
    };
    let mut v: Vec<Option<Isa>> = list.into_iter().map(Some).collect();
    v.push(None);
    v
}

const SMALL_MAX: usize = 300;

/// Every size 0..=300 at every mapping offset 0..63 and every ordinary-side offset 0..63.
fn sweep_small(store: bool, isa: Option<Isa>) {
    let mut b = Bench::new(SMALL_MAX + 64);
    let mut rng = rand::thread_rng();
    for len in 0..=SMALL_MAX {
        for map_off in 0..64 {
            for other in 0..64 {
                if store {
                    case_store(&mut b, &mut rng, isa, len, map_off, other);
                } else {
                    case_load(&mut b, &mut rng, isa, len, map_off, other);
                }
            }
        }
    }
}

#[test]
fn store_small_sizes_every_offset() {
    for isa in variants(true) {
        sweep_small(true, isa);
    }
}

#[test]
fn load_small_sizes_every_offset() {
    for isa in variants(false) {
        sweep_small(false, isa);
    }
}

/// Sizes around powers of two and random sizes up to 4 MiB, at sampled offset pairs.
fn large_sizes(rng: &mut impl Rng) -> Vec<usize> {
    let mut sizes = Vec::new();
    for k in 6..=22 {
        let p = 1usize << k;
        sizes.extend([p - 1, p, p + 1]);
    }
    for _ in 0..12 {
        sizes.push(rng.gen_range(301..=4 << 20));
    }
    sizes
}

fn sweep_large(store: bool) {
    const MAX: usize = (4 << 20) + 1;
    let mut b = Bench::new(MAX + 64);
    let mut rng = rand::thread_rng();
    let sizes = large_sizes(&mut rng);
    for isa in variants(store) {
        for &len in &sizes {
            let mut pairs = vec![(0, 0), (63, 1), (1, 63), (32, 32)];
            for _ in 0..2 {
                pairs.push((rng.gen_range(0..64), rng.gen_range(0..64)));
            }
            for (map_off, other) in pairs {
                if store {
                    case_store(&mut b, &mut rng, isa, len, map_off, other);
                } else {
                    case_load(&mut b, &mut rng, isa, len, map_off, other);
                }
            }
        }
    }
}

#[test]
fn store_large_sizes() {
    sweep_large(true);
}

#[test]
fn load_large_sizes() {
    sweep_large(false);
}

/// Maps three pages with the outer two inaccessible, so any access outside the middle page
/// faults (and fails the test run).
struct GuardedPage {
    base: *mut u8,
    page: usize,
}

impl GuardedPage {
    fn new() -> GuardedPage {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page");
        // SAFETY: an anonymous private mapping of fresh memory; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap");
        let base = base.cast::<u8>();
        // SAFETY: the middle page is inside the mapping just made.
        let rc = unsafe {
            libc::mprotect(
                base.add(page).cast(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(rc, 0, "mprotect");
        GuardedPage { base, page }
    }

    /// The accessible page.
    fn middle(&mut self) -> &mut [u8] {
        // SAFETY: the middle page is mapped read-write and owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(self.page), self.page) }
    }
}

impl Drop for GuardedPage {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping `new` made.
        unsafe { libc::munmap(self.base.cast(), 3 * self.page) };
    }
}

/// Ranges that start at the first byte or end at the last byte of a page with inaccessible
/// neighbours: any kernel access beyond the covering lines (or the exact range, for stores) would
/// fault.
#[test]
fn accesses_stay_inside_the_page() {
    let mut rng = rand::thread_rng();
    let mut g = GuardedPage::new();
    let page = g.page;
    let mut data = vec![0u8; page];
    let mut out = vec![0u8; page];
    for isa in Isa::available() {
        for len in [1usize, 7, 8, 63, 64, 65, 255, 256, 1000, page - 1, page] {
            for start in [0, page - len] {
                fill_random(&mut data[..len], &mut rng);
                fill_random(g.middle(), &mut rng);
                let mut want = g.middle().to_vec();
                want[start..start + len].copy_from_slice(&data[..len]);
                let dst = g.middle()[start..].as_mut_ptr();
                // SAFETY: [start, start+len) is inside the accessible page.
                unsafe { copy_to_mapping_with(isa, dst, &data[..len]) }.expect("ISA available");
                compare(
                    &format!("store {isa} at {start} len {len}"),
                    g.middle(),
                    &want,
                    start,
                    len,
                );

                fill_random(&mut out[..len], &mut rng);
                let src = g.middle()[start..].as_ptr();
                // SAFETY: the lines covering [start, start+len) are inside the accessible page.
                unsafe { copy_from_mapping_with(isa, &mut out[..len], src) }
                    .expect("ISA available");
                assert_eq!(
                    &out[..len],
                    &g.middle()[start..start + len],
                    "load {isa} at {start} len {len}"
                );
            }
        }
    }
}

#[test]
fn empty_copies_touch_nothing() {
    let mut g = GuardedPage::new();
    let page = g.page;
    for isa in Isa::available() {
        // One past the end of the accessible page: a zero-length copy there must not touch it.
        let end = g.middle()[page..].as_mut_ptr();
        // SAFETY: zero bytes are written or read.
        unsafe { copy_to_mapping_with(isa, end, &[]) }.expect("ISA available");
        // SAFETY: as above.
        unsafe { copy_from_mapping_with(isa, &mut [], end) }.expect("ISA available");
        // SAFETY: as above.
        unsafe { copy_to_mapping_parallel_with(isa, end, &[], 4) }.expect("ISA available");
        // SAFETY: as above.
        unsafe { copy_from_mapping_parallel_with(isa, &mut [], end, 4) }.expect("ISA available");
    }
    // SAFETY: as above.
    unsafe {
        copy_to_mapping(g.middle()[page..].as_mut_ptr(), &[]);
        copy_from_mapping(&mut [], g.middle()[page..].as_ptr());
    }
}

/// An aligned 8-byte flag next to other flags: writing one leaves its neighbours alone, and a
/// read of one returns just it.
#[test]
fn eight_byte_flags_are_independent() {
    let mut rng = rand::thread_rng();
    let mut a = Arena::new(256);
    for isa in Isa::available() {
        for slot in 0..8 {
            fill_random(&mut a.buf, &mut rng);
            let before = a.buf.clone();
            let value: u64 = rng.gen();
            let at = a.base + 8 * slot;
            let dst = a.buf[at..].as_mut_ptr();
            // SAFETY: 8 bytes inside the arena.
            unsafe { copy_to_mapping_with(isa, dst, &value.to_ne_bytes()) }.expect("available");
            let mut want = before;
            want[at..at + 8].copy_from_slice(&value.to_ne_bytes());
            assert_eq!(a.buf, want, "{isa} slot {slot}");
            let mut back = [0u8; 8];
            // SAFETY: the covering line is inside the arena.
            unsafe { copy_from_mapping_with(isa, &mut back, a.buf[at..].as_ptr()) }
                .expect("available");
            assert_eq!(u64::from_ne_bytes(back), value, "{isa} slot {slot}");
        }
    }
}

/// A parallel copy of `len` bytes at the given offsets with `threads`, checked like the others.
fn case_parallel(
    b: &mut Bench,
    rng: &mut impl RngCore,
    (store, isa): (bool, Option<Isa>),
    len: usize,
    (map_off, other): (usize, usize),
    threads: usize,
) {
    if store {
        let s0 = b.src.base + other;
        fill_random(&mut b.src.buf[s0..s0 + len], rng);
        let lo = b.dst.base - GUARD;
        let hi = b.dst.base + map_off + len + GUARD;
        fill_random(&mut b.dst.buf[lo..hi], rng);
        b.expected.clear();
        b.expected.extend_from_slice(&b.dst.buf[lo..hi]);
        let first = GUARD + map_off;
        b.expected[first..first + len].copy_from_slice(&b.src.buf[s0..s0 + len]);
        let dst = b.dst.buf[b.dst.base + map_off..].as_mut_ptr();
        let src = &b.src.buf[s0..s0 + len];
        match isa {
            // SAFETY: the range is inside the dst arena, apart from the src arena.
            Some(isa) => unsafe { copy_to_mapping_parallel_with(isa, dst, src, threads) }
                .expect("ISA available"),
            // SAFETY: as above.
            None => unsafe { copy_to_mapping_parallel(dst, src, threads) },
        }
        compare(
            &format!("parallel store {isa:?} len {len} threads {threads} offs {map_off}/{other}"),
            &b.dst.buf[lo..hi],
            &b.expected,
            first,
            len,
        );
    } else {
        let s0 = b.src.base + map_off;
        fill_random(&mut b.src.buf[s0..s0 + len], rng);
        let lo = b.dst.base - GUARD;
        let hi = b.dst.base + other + len + GUARD;
        fill_random(&mut b.dst.buf[lo..hi], rng);
        b.expected.clear();
        b.expected.extend_from_slice(&b.dst.buf[lo..hi]);
        let first = GUARD + other;
        b.expected[first..first + len].copy_from_slice(&b.src.buf[s0..s0 + len]);
        let src = b.src.buf[s0..].as_ptr();
        let d0 = b.dst.base + other;
        let dst = &mut b.dst.buf[d0..d0 + len];
        match isa {
            // SAFETY: the covering lines are inside the src arena, apart from the dst arena.
            Some(isa) => unsafe { copy_from_mapping_parallel_with(isa, dst, src, threads) }
                .expect("ISA available"),
            // SAFETY: as above.
            None => unsafe { copy_from_mapping_parallel(dst, src, threads) },
        }
        compare(
            &format!("parallel load {isa:?} len {len} threads {threads} offs {map_off}/{other}"),
            &b.dst.buf[lo..hi],
            &b.expected,
            first,
            len,
        );
    }
}

const PARALLEL_SIZES: [usize; 7] = [
    0,
    100,
    2 * PARALLEL_MIN_PART - 1,
    2 * PARALLEL_MIN_PART + 13,
    (64 << 10) + 1,
    (1 << 20) - 3,
    (3 << 20) + 333,
];

#[test]
fn parallel_copies_every_thread_count() {
    let mut b = Bench::new((3 << 20) + 400);
    let mut rng = rand::thread_rng();
    for store in [true, false] {
        for isa in [None, Some(Isa::Portable)] {
            for threads in 0..=9 {
                for len in PARALLEL_SIZES {
                    let (m, o) = (rng.gen_range(0..64), rng.gen_range(0..64));
                    case_parallel(&mut b, &mut rng, (store, isa), len, (m, o), threads);
                }
            }
        }
        // Every ISA once at a size that splits eight ways, and a request beyond the maximum.
        for isa in Isa::available() {
            case_parallel(
                &mut b,
                &mut rng,
                (store, Some(isa)),
                (1 << 20) + 7,
                (5, 9),
                8,
            );
        }
        case_parallel(&mut b, &mut rng, (store, None), 3 << 20, (17, 3), 1000);
    }
}

#[test]
fn concurrent_callers() {
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut b = Bench::new((1 << 20) + 400);
                let mut rng = rand::thread_rng();
                for i in 0..25 {
                    let len = rng.gen_range(0..=1 << 20);
                    let threads = rng.gen_range(1..=8);
                    let store = (i + t) % 2 == 0;
                    let (m, o) = (rng.gen_range(0..64), rng.gen_range(0..64));
                    case_parallel(&mut b, &mut rng, (store, None), len, (m, o), threads);
                    if store {
                        case_store(&mut b, &mut rng, None, len / 7, m, o);
                    } else {
                        case_load(&mut b, &mut rng, None, len / 7, m, o);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a concurrent caller failed");
    }
}

#[test]
fn parts_tile_the_range() {
    let mut rng = rand::thread_rng();
    for _ in 0..2000 {
        let len = rng.gen_range(0..1usize << 24);
        let parts = rng.gen_range(1..=PARALLEL_MAX_THREADS);
        let map = rng.gen_range(0..1usize << 40);
        let grain = if rng.gen() { 64 } else { 4096 };
        let mut at = 0;
        for i in 0..parts {
            let (lo, hi) = parallel::part_range(map, len, parts, grain, i);
            assert_eq!(lo, at, "parts must be contiguous");
            assert!(hi >= lo && hi <= len);
            if i + 1 < parts && hi > 0 && hi < len {
                assert_eq!((map + hi) % grain, 0, "cut on the mapping grain");
            }
            at = hi;
        }
        assert_eq!(at, len, "parts must cover the range");
    }
    assert_eq!(parallel::part_count(0, 8), 1);
    assert_eq!(parallel::part_count(2 * PARALLEL_MIN_PART - 1, 8), 1);
    assert_eq!(parallel::part_count(2 * PARALLEL_MIN_PART, 8), 2);
    assert_eq!(parallel::part_count(1 << 30, 0), 1);
    assert_eq!(parallel::part_count(1 << 30, 1000), PARALLEL_MAX_THREADS);
}

#[test]
fn isa_names_and_errors() {
    for isa in Isa::ALL {
        assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        assert_eq!(isa.to_string(), isa.name());
    }
    assert_eq!("AVX512F".parse::<Isa>(), Ok(Isa::Avx512));
    assert_eq!(" sse41 ".parse::<Isa>(), Ok(Isa::Sse41));
    assert_eq!(
        "avx3".parse::<Isa>(),
        Err(CopyError::UnknownIsa("avx3".to_string()))
    );
    assert_eq!(
        Isa::Avx2.require_given(false),
        Err(CopyError::Unsupported(Isa::Avx2))
    );
    assert_eq!(Isa::Avx2.require_given(true), Ok(Isa::Avx2));
    assert!(CopyError::Unsupported(Isa::Avx512)
        .to_string()
        .contains("avx512"));
    assert_eq!(choice_from(None), None);
    assert_eq!(choice_from(Some("bogus")), None);
    assert_eq!(choice_from(Some("portable")), Some(Isa::Portable));
    for isa in Isa::ALL {
        let want = isa.is_available().then_some(isa);
        assert_eq!(choice_from(Some(isa.name())), want);
    }
}

#[test]
fn availability_and_detection() {
    let all = Isa::available();
    assert_eq!(all.first(), Some(&Isa::Portable));
    assert!(!Isa::available_for_store().contains(&Isa::Sse41));
    assert!(Isa::detected_store().is_available());
    assert!(Isa::detected_load().is_available());
    assert_ne!(Isa::detected_store(), Isa::Sse41);
    if std::env::var(ISA_ENV).is_err() {
        let widest_store = *Isa::available_for_store()
            .last()
            .expect("portable at least");
        assert_eq!(Isa::detected_store(), widest_store);
        assert_eq!(
            Isa::detected_load(),
            *all.last().expect("portable at least")
        );
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert!(Isa::Sse2.is_available(), "SSE2 is baseline on x86-64");
        assert_eq!(
            Isa::Avx512.is_available(),
            std::arch::is_x86_feature_detected!("avx512f")
        );
    }
    // An ISA this CPU lacks is refused and nothing is touched.
    let mut rng = rand::thread_rng();
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        let mut buf = [0u8; 128];
        fill_random(&mut buf, &mut rng);
        let before = buf;
        let src = [0u8; 64];
        // SAFETY: 64 bytes inside `buf`.
        let r = unsafe { copy_to_mapping_with(isa, buf.as_mut_ptr(), &src) };
        assert_eq!(r, Err(CopyError::Unsupported(isa)));
        assert_eq!(buf, before);
    }
    store_fence();
}
