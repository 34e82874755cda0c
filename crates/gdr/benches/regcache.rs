//! Cost of the registration cache itself, with a registrar that does nothing: what a hit, a
//! checked hit and a miss cost on top of the real registration, and how hits scale with threads.
//!
//! Run: `cargo bench -p gdr --bench regcache`. Each single-threaded figure is the median and p99
//! over batches (a batch is timed with `Instant` and divided by its length), so the p99 is of
//! batch means, not of single operations.

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gdr::peer::{CacheConfig, RegCache, Registrar, GPU_PAGE_SIZE};
use rand::{Rng, SeedableRng};

const PAGE: u64 = GPU_PAGE_SIZE;
/// Entries in the warm cache the hit benchmarks look up in.
const ENTRIES: u64 = 1024;

/// Registers nothing; a registration is its start address.
struct Nothing;

impl Registrar for Nothing {
    type Reg = u64;
    type Error = Infallible;

    fn register(&self, start: u64, _len: u64) -> Result<u64, Infallible> {
        Ok(start)
    }
}

fn warm_cache() -> RegCache<Nothing> {
    let cache = RegCache::new(Nothing, CacheConfig::new(u64::MAX, usize::MAX)).unwrap();
    // Entries two pages apart, so that no two are adjacent.
    for i in 0..ENTRIES {
        drop(cache.acquire(2 * i * PAGE, PAGE).unwrap());
    }
    cache
}

/// Addresses of `len`-byte requests inside the warm cache's entries, in random order.
fn hit_addrs(n: usize, len: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    (0..n)
        .map(|_| 2 * rng.gen_range(0..ENTRIES) * PAGE + rng.gen_range(0..PAGE - len))
        .collect()
}

struct Summary {
    median: f64,
    p99: f64,
}

/// Times `batches` batches of `per_batch` calls of `op(i)`; returns per-op figures in ns.
fn time_batches(batches: usize, per_batch: usize, mut op: impl FnMut(usize)) -> Summary {
    let mut per_op = Vec::with_capacity(batches);
    let mut i = 0;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per_batch {
            op(i);
            i += 1;
        }
        per_op.push(t.elapsed().as_nanos() as f64 / per_batch as f64);
    }
    per_op.sort_by(f64::total_cmp);
    Summary {
        median: per_op[per_op.len() / 2],
        p99: per_op[per_op.len() * 99 / 100],
    }
}

/// Hits per second over all threads, each looking up random entries for `dur`.
fn hit_throughput(cache: &Arc<RegCache<Nothing>>, threads: usize, dur: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (cache, stop, total, start) = (
                Arc::clone(cache),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let addrs = hit_addrs(4096, 64);
                let mut n = t * 977;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        let h = cache.acquire(addrs[n % addrs.len()], 64).unwrap();
                        black_box(h.reg());
                        n += 1;
                    }
                    total.fetch_add(64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let mut rows: Vec<(String, Summary)> = Vec::new();

    let cache = warm_cache();
    let addrs = hit_addrs(1 << 16, 64);
    let mask = addrs.len() - 1;
    rows.push((
        format!("hit, {ENTRIES} entries, acquire+drop"),
        time_batches(20_000, 256, |i| {
            let h = cache.acquire(addrs[i & mask], 64).unwrap();
            black_box(h.reg());
        }),
    ));
    rows.push((
        "hit, same entry every time".into(),
        time_batches(20_000, 256, |_| {
            let h = cache.acquire(black_box(0x100), 64).unwrap();
            black_box(h.reg());
        }),
    ));
    rows.push((
        "checked hit (tag query that does nothing)".into(),
        time_batches(20_000, 256, |i| {
            let h = cache.acquire_checked(addrs[i & mask], 64).unwrap();
            black_box(h.reg());
        }),
    ));
    assert_eq!(cache.stats().misses, ENTRIES, "the hit runs must not miss");
    drop(cache);

    // Misses that grow the map: every request is a new page.
    let cache = RegCache::new(Nothing, CacheConfig::new(u64::MAX, usize::MAX)).unwrap();
    rows.push((
        "miss, map growing to 200k entries".into(),
        time_batches(3_125, 64, |i| {
            drop(black_box(cache.acquire(i as u64 * 2 * PAGE, 1).unwrap()));
        }),
    ));
    drop(cache);

    // Misses at steady state: each new page evicts the least recently used one.
    let cache = RegCache::new(Nothing, CacheConfig::new(u64::MAX, ENTRIES as usize)).unwrap();
    for i in 0..ENTRIES {
        drop(cache.acquire(i * 2 * PAGE, 1).unwrap());
    }
    rows.push((
        format!("miss + LRU eviction, {ENTRIES} entries"),
        time_batches(1_000, 64, |i| {
            let addr = (ENTRIES + i as u64) * 2 * PAGE;
            drop(black_box(cache.acquire(addr, 1).unwrap()));
        }),
    ));
    let s = cache.stats();
    assert_eq!(s.entries, ENTRIES);
    drop(cache);

    println!("registration cache, no-op registrar (ns per operation)");
    println!("| {:<44} | {:>9} | {:>9} |", "operation", "median", "p99");
    println!("| {:-<44} | {:->9} | {:->9} |", "", "", "");
    for (name, s) in &rows {
        println!("| {name:<44} | {:>9.1} | {:>9.1} |", s.median, s.p99);
    }

    let cache = Arc::new(warm_cache());
    println!();
    println!("hit throughput, {ENTRIES} entries, random lookups, acquire+drop");
    println!(
        "| {:>7} | {:>12} | {:>16} |",
        "threads", "Mhits/s", "ns/hit/thread"
    );
    println!("| {:->7} | {:->12} | {:->16} |", "", "", "");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, 2, 4, 8] {
        let rate = hit_throughput(&cache, threads, Duration::from_millis(400));
        let per_thread_ns = 1e9 * threads as f64 / rate;
        println!(
            "| {threads:>7} | {:>12.2} | {per_thread_ns:>16.1} |",
            rate / 1e6
        );
    }
    println!("({cores} CPUs available; beyond that, threads share cores)");
}
