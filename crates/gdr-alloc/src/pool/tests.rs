//! The pool over host memory: chunk addresses are made up (a GiB apart, like GPU virtual
//! addresses), and a chunk's "mapping" is a host buffer, so bytes written through a pin land
//! where the pool says they do.

use super::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const GRAN: usize = 2 << 20;

#[derive(Default)]
struct Counters {
    created: AtomicUsize,
    released: AtomicUsize,
    mapped: AtomicUsize,
    /// Bytes held; creation fails with OutOfMemory beyond `capacity`.
    held: AtomicU64,
}

struct HostSource {
    capacity: u64,
    next: AtomicU64,
    n: Arc<Counters>,
    fail_map: bool,
    /// Every protection change asked for: (cpu, len, accessible); none are made.
    protects: Arc<Mutex<Vec<(usize, usize, bool)>>>,
    /// What `protect` answers.
    can_protect: bool,
}

impl HostSource {
    fn new(capacity: u64) -> (HostSource, Arc<Counters>) {
        let n = Arc::new(Counters::default());
        (
            HostSource {
                capacity,
                next: AtomicU64::new(1),
                n: n.clone(),
                fail_map: false,
                protects: Arc::default(),
                can_protect: true,
            },
            n,
        )
    }
}

struct HostChunk {
    size: usize,
    bytes: Mutex<Vec<u8>>,
    n: Arc<Counters>,
}

impl Drop for HostChunk {
    fn drop(&mut self) {
        self.n.released.fetch_add(1, Ordering::SeqCst);
        self.n.held.fetch_sub(self.size as u64, Ordering::SeqCst);
    }
}

impl ChunkSource for HostSource {
    type Chunk = HostChunk;
    type Mapping = ();
    fn granularity(&self, _device: i32) -> Result<usize, SourceError> {
        Ok(GRAN)
    }
    fn create(&self, _device: i32, size: usize) -> Result<(u64, HostChunk), SourceError> {
        assert_eq!(
            size % GRAN,
            0,
            "chunk sizes are multiples of the granularity"
        );
        if self.n.held.load(Ordering::SeqCst) + size as u64 > self.capacity {
            return Err(SourceError::OutOfMemory);
        }
        self.n.held.fetch_add(size as u64, Ordering::SeqCst);
        self.n.created.fetch_add(1, Ordering::SeqCst);
        let base = self.next.fetch_add(1, Ordering::SeqCst) << 30;
        Ok((
            base,
            HostChunk {
                size,
                bytes: Mutex::new(vec![0; size]),
                n: self.n.clone(),
            },
        ))
    }
    fn map(&self, _device: i32, chunk: &HostChunk) -> Result<(*mut u8, ()), SourceError> {
        if self.fail_map {
            return Err(SourceError::Failed {
                code: None,
                what: "no mapping here".into(),
            });
        }
        self.n.mapped.fetch_add(1, Ordering::SeqCst);
        let p = chunk.bytes.lock().unwrap().as_mut_ptr();
        Ok((p, ()))
    }
    fn protect(&self, cpu: *mut u8, len: usize, accessible: bool) -> bool {
        self.protects
            .lock()
            .unwrap()
            .push((cpu as usize, len, accessible));
        self.can_protect
    }
}

fn pool(capacity: u64, cache: u64) -> (Pool<HostSource>, Arc<Counters>) {
    let (s, n) = HostSource::new(capacity);
    (Pool::new(s, cache), n)
}

#[test]
fn small_requests_share_a_chunk_rounded_and_aligned() {
    let (p, n) = pool(1 << 40, u64::MAX);
    let mut live = Vec::new();
    for size in [1u64, 16, 511, 512, 513, 4096, 65535, 65536, 100_000] {
        let a = p.alloc(0, size).unwrap();
        assert_eq!(a % ALIGN as u64, 0, "{size}");
        if size >= LARGE_ALIGN as u64 {
            assert_eq!(a % LARGE_ALIGN as u64, 0, "{size}");
        }
        assert_eq!(p.block_at(a).unwrap().size, size);
        live.push((a, size.next_multiple_of(ALIGN as u64)));
    }
    assert_eq!(
        n.created.load(Ordering::SeqCst),
        1,
        "one 2 MiB chunk holds them all"
    );
    live.sort();
    for w in live.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap: {w:?}");
    }
    let s = p.stats();
    assert_eq!(s.live_allocations, 9);
    assert_eq!(s.reserved_bytes, GRAN as u64);
    assert_eq!(s.chunks, 1);
    // A byte inside a block finds it; its padding and free space do not.
    let (a, _) = live[0];
    assert_eq!(p.block_at(a).unwrap().addr, a);
    assert!(p.owns(a) && !p.owns(a + (4 << 30)));
}

#[test]
fn an_address_is_known_by_its_chunk_not_its_block() {
    let (p, _) = pool(1 << 40, 0);
    let a = p.alloc(0, 1000).unwrap();
    let b = p.alloc(0, 3 << 20).unwrap();
    let c = p.alloc(0, 5000).unwrap();
    // a and c share one small chunk; b sits in a 20 MiB chunk of its class, not at its start
    // once another medium block came first.
    let b2 = p.alloc(0, 3 << 20).unwrap();
    let (base_a, size_a) = p.chunk_range(a + 10).unwrap();
    assert_eq!(p.chunk_range(c).unwrap(), (base_a, size_a));
    assert_eq!(size_a, GRAN as u64);
    assert!(base_a <= a && c + 5000 <= base_a + size_a);
    let (base_b, size_b) = p.chunk_range(b2 + (3 << 20) - 1).unwrap();
    assert_eq!(p.chunk_range(b).unwrap(), (base_b, size_b));
    assert_eq!(size_b, 20 << 20);
    assert!(
        b2 > base_b,
        "the second medium block is inside the chunk, not at its base"
    );
    // The chunk stays known between blocks and after every block of it is freed (it is cached).
    assert_eq!(p.chunk_range(base_a + size_a - 1).unwrap().0, base_a);
    assert!(p
        .chunk_range(base_a + size_a)
        .is_none_or(|(x, _)| x != base_a));
    assert!(p.chunk_range(1).is_none());
}

#[test]
fn size_classes_keep_to_their_chunks() {
    let (p, n) = pool(1 << 40, u64::MAX);
    let small = p.alloc(0, 1 << 20).unwrap();
    let mid = p.alloc(0, (1 << 20) + 1).unwrap();
    let big = p.alloc(0, 64 << 20).unwrap();
    assert_eq!(n.created.load(Ordering::SeqCst), 3);
    let s = p.stats();
    assert_eq!(
        s.reserved_bytes,
        (GRAN + LARGE_CHUNK + (64 << 20)) as u64,
        "a small chunk, a shared 20 MiB chunk and a chunk of the big request's own size"
    );
    // Another small request goes into the small chunk's free half, not the large chunk.
    let small2 = p.alloc(0, 1 << 20).unwrap();
    assert_eq!(n.created.load(Ordering::SeqCst), 3);
    assert_eq!(small2 >> 30, small >> 30, "in the small chunk");
    // A third does not fit there and gets a small chunk of its own.
    let small3 = p.alloc(0, 1 << 20).unwrap();
    assert_eq!(n.created.load(Ordering::SeqCst), 4);
    assert!(p.free(small3).is_some());
    // Other GPUs get chunks of their own.
    let other = p.alloc(1, 512).unwrap();
    assert_eq!(p.block_at(other).unwrap().device, 1);
    assert_eq!(n.created.load(Ordering::SeqCst), 5);
    for a in [small, mid, big, small2, other] {
        assert!(p.free(a).is_some());
    }
    assert_eq!(p.stats().live_allocations, 0);
    assert!(p.free(small).is_none(), "a double free is refused");
    assert!(p.alloc(0, 0).is_err());
    assert!(matches!(p.alloc(0, u64::MAX), Err(AllocError::BadSize(_))));
}

#[test]
fn freed_memory_is_reused_and_idle_chunks_are_cached() {
    let (p, n) = pool(1 << 40, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    p.free(a).unwrap();
    let b = p.alloc(0, 4096).unwrap();
    assert_eq!(a, b, "the freed block comes back");
    p.free(b).unwrap();
    assert_eq!(
        n.released.load(Ordering::SeqCst),
        0,
        "an idle chunk is kept"
    );
    assert_eq!(p.trim(None), GRAN as u64);
    assert_eq!(n.released.load(Ordering::SeqCst), 1);
    assert_eq!(p.stats().chunks, 0);
    assert_eq!(p.stats().chunks_released, 1);
}

#[test]
fn at_exit_only_chunks_never_mapped_are_released() {
    let (p, n) = pool(1 << 40, u64::MAX);
    let a = p.alloc(0, 64).unwrap();
    let b = p.alloc(0, 32 << 20).unwrap();
    let pin = p.pin(b, 64).unwrap();
    p.unpin(pin.id).unwrap();
    p.free(a).unwrap();
    p.free(b).unwrap();
    assert_eq!(
        p.trim_unmapped(),
        GRAN as u64,
        "the small chunk, never mapped"
    );
    assert_eq!(n.released.load(Ordering::SeqCst), 1);
    assert_eq!(p.stats().chunks, 1, "the mapped chunk stays");
    assert_eq!(p.trim(None), 32 << 20);
}

#[test]
fn the_cache_limit_releases_chunks_emptied_beyond_it() {
    let (p, n) = pool(1 << 40, GRAN as u64);
    let a = p.alloc(0, 64).unwrap();
    let b = p.alloc(0, 32 << 20).unwrap();
    p.free(a).unwrap(); // 2 MiB idle: within the limit
    assert_eq!(n.released.load(Ordering::SeqCst), 0);
    p.free(b).unwrap(); // 34 MiB idle: the 32 MiB chunk goes
    assert_eq!(n.released.load(Ordering::SeqCst), 1);
    assert_eq!(p.stats().reserved_bytes, GRAN as u64);
}

#[test]
fn out_of_memory_gives_idle_chunks_back_and_retries() {
    let (p, n) = pool(40 << 20, u64::MAX);
    let a = p.alloc(0, 30 << 20).unwrap();
    p.free(a).unwrap(); // idle 30 MiB chunk cached
    let b = p.alloc(0, 20 << 20).unwrap(); // 20 MiB fits in the cached chunk
    assert_eq!(n.created.load(Ordering::SeqCst), 1);
    p.free(b).unwrap();
    // 36 MiB does not fit in the cached 30 MiB chunk, and 30 + 36 > 40: the cache is trimmed.
    let c = p.alloc(0, 36 << 20).unwrap();
    assert_eq!(n.released.load(Ordering::SeqCst), 1);
    assert!(p.block_at(c).is_some());
    // Nothing idle left to give back: out of memory, and the pool is unchanged.
    assert_eq!(p.alloc(0, 8 << 20), Err(AllocError::OutOfMemory(8 << 20)));
    assert_eq!(p.stats().live_allocations, 1);
}

#[test]
fn a_pin_maps_its_chunk_once_and_the_bytes_land_in_place() {
    let (p, n) = pool(1 << 40, u64::MAX);
    let bufs: Vec<u64> = (0..64).map(|i| p.alloc(0, 4096 + i).unwrap()).collect();
    let mut pins = Vec::new();
    for &a in &bufs {
        // UCX's pin: the 64 KiB pages around the buffer.
        let lo = a & !0xffff;
        let hi = (a + 4096).next_multiple_of(0x10000);
        let pin = p.pin(lo, hi - lo).unwrap();
        assert!(pin.base <= lo && hi <= pin.base + pin.size);
        pins.push(pin);
    }
    assert_eq!(
        n.mapped.load(Ordering::SeqCst),
        1,
        "one mapping for the chunk"
    );
    assert_eq!(p.stats().mapped_chunks, 1);
    assert_eq!(p.stats().pins, 64);
    // Each buffer's bytes, written through its pin, land at its offset in the chunk.
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let data: Vec<Vec<u8>> = bufs
        .iter()
        .map(|_| (0..4096).map(|_| rng.gen()).collect())
        .collect();
    for ((a, pin), d) in bufs.iter().zip(&pins).zip(&data) {
        let dst = pin.cpu.wrapping_add((a - pin.base) as usize);
        // SAFETY: dst..dst+4096 lies in the chunk's host buffer (the block is 4096+ bytes).
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), dst, d.len()) };
    }
    for ((a, pin), d) in bufs.iter().zip(&pins).zip(&data) {
        let src = pin.cpu.wrapping_add((a - pin.base) as usize);
        // SAFETY: as above.
        let got = unsafe { std::slice::from_raw_parts(src, d.len()) };
        assert_eq!(got, &d[..], "buffer {a:#x}");
    }
    for pin in pins {
        p.unpin(pin.id).unwrap();
    }
    assert_eq!(p.unpin(12345), Err(PoolUnpinError(12345)));
    assert_eq!(p.stats().pins, 0);
}

#[test]
fn pins_outside_the_pool_or_their_chunk_are_refused() {
    let (p, _) = pool(1 << 40, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    assert_eq!(p.pin(a + (8 << 30), 4096), Err(PinFailure::NotPool));
    assert_eq!(
        p.pin(a - 1, 16),
        Err(PinFailure::NotPool),
        "below the first chunk"
    );
    let e = p.pin(a, GRAN as u64 + 1).unwrap_err();
    assert!(matches!(e, PinFailure::OutsideChunk { .. }), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(matches!(p.pin(a, 0), Err(PinFailure::OutsideChunk { .. })));
    assert!(matches!(
        p.pin(a, u64::MAX),
        Err(PinFailure::OutsideChunk { .. })
    ));
    assert_eq!(PinFailure::NotPool.errno(), libc::ENOENT);
}

#[test]
fn a_chunk_that_cannot_be_mapped_refuses_the_pin_and_stays_usable() {
    let (mut s, _) = HostSource::new(1 << 40);
    s.fail_map = true;
    let p = Pool::new(s, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    let e = p.pin(a, 4096).unwrap_err();
    assert!(matches!(e, PinFailure::Map(_)), "{e}");
    assert_eq!(e.errno(), libc::ENOTSUP);
    assert_eq!(p.stats().pins, 0);
    p.free(a).unwrap();
    assert_eq!(
        p.trim(None),
        GRAN as u64,
        "the failed pin left nothing behind"
    );
}

/// The pages open at `cpu`, replaying the protection changes made so far (all closed first).
fn open_pages(protects: &[(usize, usize, bool)], cpu: usize, size: usize) -> Vec<bool> {
    let page = VIEW_PAGE as usize;
    let mut open = vec![false; size / page];
    for &(at, len, acc) in protects {
        assert_eq!((at - cpu) % page, 0, "changes start on a view page");
        let pages = (at - cpu) / page..(at - cpu + len).div_ceil(page);
        open[pages].fill(acc);
    }
    open
}

#[test]
fn maps_open_exactly_the_pages_of_mapped_pins() {
    let (s, _) = HostSource::new(1 << 40);
    let protects = s.protects.clone();
    let p = Pool::new(s, u64::MAX);
    let a = p.alloc(0, 100 << 10).unwrap(); // 64 KiB aligned: pages 0 and 1
    let b = p.alloc(0, 4096).unwrap(); // right after it, in page 1
    let pa = p.pin(a, 100 << 10).unwrap();
    let cpu = pa.cpu as usize;
    {
        let log = protects.lock().unwrap();
        assert_eq!(
            log[..],
            [(cpu, GRAN, false)],
            "a new mapping is closed whole"
        );
    }
    let pb = p.pin(b & !0xffff, 0x10000).unwrap();
    let wide = p.pin(a, 3 << 16).unwrap(); // pages 0..3
    let opened = |want: &[usize]| {
        let got = open_pages(&protects.lock().unwrap(), cpu, GRAN);
        let want: Vec<bool> = (0..GRAN / 0x10000).map(|i| want.contains(&i)).collect();
        assert_eq!(got, want);
    };
    opened(&[]);
    p.map(pa.id).unwrap();
    opened(&[0, 1]);
    p.map(wide.id).unwrap();
    opened(&[0, 1, 2]);
    p.map(pb.id).unwrap();
    p.unmap(wide.id).unwrap();
    opened(&[0, 1]); // pa's; page 1 is pb's too
    p.unmap(pa.id).unwrap();
    opened(&[1]); // pb's
    assert_eq!(
        p.unmap(pa.id),
        Err(PoolUnpinError(pa.id)),
        "not mapped any more"
    );
    // An unpin closes what its pin still had open.
    p.unpin(pb.id).unwrap();
    opened(&[]);
    assert_eq!(p.map(pb.id), Err(PoolUnpinError(pb.id)));
    p.map(wide.id).unwrap();
    p.map(wide.id).unwrap();
    p.unmap(wide.id).unwrap();
    opened(&[0, 1, 2]);
    p.unpin(wide.id).unwrap();
    p.unpin(pa.id).unwrap();
    opened(&[]);
}

#[test]
fn without_protection_maps_change_nothing() {
    let (mut s, _) = HostSource::new(1 << 40);
    s.can_protect = false;
    let protects = s.protects.clone();
    let p = Pool::new(s, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    let pin = p.pin(a, 4096).unwrap();
    p.map(pin.id).unwrap();
    p.unmap(pin.id).unwrap();
    assert_eq!(
        protects.lock().unwrap().len(),
        1,
        "only the refused attempt to close it"
    );
}

#[test]
fn memory_freed_while_pinned_is_flagged_and_held_until_the_unpin() {
    let (p, n) = pool(1 << 40, 0);
    let a = p.alloc(0, 4096).unwrap();
    let pin = p.pin(a, 4096).unwrap();
    assert_eq!(p.pin_freed(pin.id), Some(false));
    p.free(a).unwrap();
    assert_eq!(p.pin_freed(pin.id), Some(true), "the callback flag");
    assert_eq!(p.stats().quarantined_bytes, 4096);
    // Not handed out again while pinned, and the chunk stays (cache limit 0 notwithstanding).
    let b = p.alloc(0, 4096).unwrap();
    assert_ne!(b, a);
    p.free(b).unwrap();
    assert_eq!(n.released.load(Ordering::SeqCst), 0);
    assert_eq!(p.trim(None), 0, "a pinned chunk is not trimmed");
    p.unpin(pin.id).unwrap();
    assert_eq!(p.pin_freed(pin.id), None);
    assert_eq!(p.stats().quarantined_bytes, 0);
    // The unpin left the chunk idle, and the cache limit is 0: it went back to the driver.
    assert_eq!(n.released.load(Ordering::SeqCst), 1);
}

#[test]
fn the_flag_tracks_the_blocks_a_pin_overlapped_when_made() {
    let (p, _) = pool(1 << 40, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    let b = p.alloc(0, 4096).unwrap();
    let far = p.alloc(0, 256 << 10).unwrap();
    let pin = p.pin(a, 4096).unwrap();
    p.free(b).unwrap(); // a neighbour outside the pinned range
    p.free(far).unwrap();
    assert_eq!(p.pin_freed(pin.id), Some(false));
    // A block made inside the pinned range after the pin: freeing it does not fire the flag,
    // but it is held all the same.
    let wide = p.pin(a, 64 << 10).unwrap();
    let c = p.alloc(0, 4096).unwrap();
    assert!(
        c > a && c < a + (64 << 10),
        "c reuses b's place, inside the wide pin"
    );
    p.free(c).unwrap();
    assert_eq!(p.pin_freed(wide.id), Some(false));
    assert_ne!(p.alloc(0, 4096).unwrap(), c, "held while pinned");
    p.free(a).unwrap();
    assert_eq!(p.pin_freed(pin.id), Some(true));
    assert_eq!(p.pin_freed(wide.id), Some(true));
}

#[test]
fn a_block_under_two_pins_waits_for_both() {
    let (p, _) = pool(1 << 40, u64::MAX);
    let a = p.alloc(0, 4096).unwrap();
    let one = p.pin(a, 4096).unwrap();
    let two = p.pin(a & !0xffff, 0x10000).unwrap();
    p.free(a).unwrap();
    p.unpin(one.id).unwrap();
    assert_ne!(p.alloc(0, 4096).unwrap(), a, "still under the second pin");
    p.unpin(two.id).unwrap();
    assert_eq!(p.stats().quarantined_bytes, 0);
    assert_eq!(p.alloc(0, 4096).unwrap(), a);
}

/// Random allocations, frees, pins and unpins against a model: live and quarantined blocks
/// never overlap, a quarantined block is never handed out, the flag is exactly the model's,
/// and at the end everything goes back to the source.
#[test]
fn random_operations_keep_every_invariant() {
    let seed = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (p, n) = pool(1 << 34, 64 << 20);
    let mut live: Vec<(u64, u64)> = Vec::new();
    // pin id -> (range, the live blocks it overlapped, whether one of them was freed)
    type Model = ((u64, u64), Vec<u64>, bool);
    let mut pins: HashMap<u64, Model> = HashMap::new();
    // Freed under pins: (address, size, the pins over it when freed).
    let mut held: Vec<(u64, u64, Vec<u64>)> = Vec::new();
    for step in 0..20_000 {
        match rng.gen_range(0..10) {
            0..=3 => {
                let size = match rng.gen_range(0..10) {
                    0..=6 => rng.gen_range(1..8192),
                    7 | 8 => rng.gen_range(8192..(3 << 20)),
                    _ => rng.gen_range((10 << 20)..(24 << 20)),
                };
                let a = p.alloc(0, size).unwrap();
                let r = size.next_multiple_of(ALIGN as u64);
                let held_ranges = held.iter().map(|h| (h.0, h.1));
                for (b, l) in live.iter().copied().chain(held_ranges) {
                    assert!(
                        a + r <= b || b + l.next_multiple_of(ALIGN as u64) <= a,
                        "seed {seed} step {step}: {a:#x}+{r} overlaps {b:#x}+{l}"
                    );
                }
                live.push((a, size));
            }
            4..=6 if !live.is_empty() => {
                let (a, size) = live.swap_remove(rng.gen_range(0..live.len()));
                let r = size.next_multiple_of(ALIGN as u64);
                let mut under = Vec::new();
                for (id, ((s, e), overl, freed)) in pins.iter_mut() {
                    if *s < a + r && a < *e {
                        under.push(*id);
                        *freed |= overl.contains(&a);
                    }
                }
                if !under.is_empty() {
                    held.push((a, size, under));
                }
                assert_eq!(p.free(a).map(|b| b.size), Some(size));
            }
            7 | 8 if !live.is_empty() => {
                let (a, size) = live[rng.gen_range(0..live.len())];
                let lo = a & !0xffff;
                let Ok(pin) = p.pin(lo, (a + size).next_multiple_of(0x10000) - lo) else {
                    continue; // the 64 KiB pages around it leave its chunk
                };
                let range = (lo, (a + size).next_multiple_of(0x10000));
                let overl = live
                    .iter()
                    .filter(|(b, l)| *b < range.1 && range.0 < b + l.next_multiple_of(ALIGN as u64))
                    .map(|x| x.0)
                    .collect();
                pins.insert(pin.id, (range, overl, false));
            }
            9 if !pins.is_empty() => {
                let id = *pins.keys().nth(rng.gen_range(0..pins.len())).unwrap();
                let (_, _, freed) = pins.remove(&id).unwrap();
                assert_eq!(p.pin_freed(id), Some(freed), "seed {seed} step {step}");
                p.unpin(id).unwrap();
                for h in &mut held {
                    h.2.retain(|&x| x != id);
                }
                held.retain(|h| !h.2.is_empty());
            }
            _ => {}
        }
        let s = p.stats();
        assert_eq!(
            s.live_allocations,
            live.len() as u64,
            "seed {seed} step {step}"
        );
        assert_eq!(s.live_bytes, live.iter().map(|x| x.1).sum::<u64>());
        assert_eq!(s.pins, pins.len() as u64);
        assert_eq!(
            s.quarantined_bytes,
            held.iter()
                .map(|x| x.1.next_multiple_of(ALIGN as u64))
                .sum::<u64>(),
            "seed {seed} step {step}"
        );
    }
    for (a, _) in live {
        p.free(a).unwrap();
    }
    for id in pins.into_keys() {
        p.unpin(id).unwrap();
    }
    p.trim(None);
    let s = p.stats();
    assert_eq!((s.chunks, s.reserved_bytes, s.quarantined_bytes), (0, 0, 0));
    assert_eq!(
        n.held.load(Ordering::SeqCst),
        0,
        "every chunk went back to the source"
    );
    assert_eq!(
        n.created.load(Ordering::SeqCst),
        n.released.load(Ordering::SeqCst)
    );
}

/// Gives a block's units up, then frees it (in that order, so no other thread can be handed
/// the memory while the units are still claimed).
fn release(p: &Pool<HostSource>, taken: &Mutex<BTreeMap<u64, (u64, u64)>>, (a, size): (u64, u64)) {
    {
        let mut set = taken.lock().unwrap();
        for u in (a..a + size).step_by(ALIGN) {
            set.remove(&u);
        }
    }
    p.free(a).unwrap();
}

#[test]
fn threads_never_get_overlapping_blocks() {
    let (p, _) = pool(1 << 36, u64::MAX);
    let p = Arc::new(p);
    // 512-byte unit -> (thread, block) holding it.
    let taken = Arc::new(Mutex::new(BTreeMap::<u64, (u64, u64)>::new()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (p, taken) = (p.clone(), taken.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut mine = Vec::new();
                for _ in 0..2000 {
                    if mine.is_empty() || rng.gen_bool(0.6) {
                        let size = rng.gen_range(1..70_000u64);
                        let a = p.alloc(0, size).unwrap();
                        // Every 512-byte unit of the block is claimed; a clash is an overlap.
                        let mut set = taken.lock().unwrap();
                        for u in (a..a + size).step_by(ALIGN) {
                            if let Some(o) = set.insert(u, (t, a)) {
                                panic!("{u:#x} handed out twice: thread {t} {a:#x}, and {o:x?}");
                            }
                        }
                        mine.push((a, size));
                    } else {
                        let i = rng.gen_range(0..mine.len());
                        release(&p, &taken, mine.swap_remove(i));
                    }
                }
                for block in mine {
                    release(&p, &taken, block);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(p.stats().live_allocations, 0);
}
