//! Timing and its statistics.
//!
//! - Interleaved timing of operations ([`time_interleaved`]) and the sample quantile: the
//!   measurement primitive the library itself needs (the auto copier times its paths against
//!   each other when it calibrates).
//! - The statistics of the benchmarks, the tools and the server, built on them: order
//!   statistics of a sample set ([`Summary`]), batch timing of one operation
//!   ([`time_per_call_us`]), and a latency histogram for every request of a server or load run
//!   ([`Histogram`], [`LatencySummary`]).

mod hist;
mod stats;

pub use hist::{Histogram, LatencySummary};
pub use stats::{ns_quantile_us, time_per_call_us, Summary};

use std::time::{Duration, Instant};

/// Least time an operation runs untimed before each of its timed batches.
pub const WARM_UP: Duration = Duration::from_micros(200);

/// Operations at least this long are not warmed up before their timed batches.
pub const LONG_OP: Duration = Duration::from_millis(2);

/// An operation to time: returns an error to abort the measurement.
pub type Op<'a, E> = Box<dyn FnMut() -> Result<(), E> + 'a>;

/// The sample at quantile `p` of `sorted` (ascending): the one at rank `round(p * (n - 1))`.
/// Empty input gives NaN.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else {
        sorted[((p * (n - 1) as f64).round() as usize).min(n - 1)]
    }
}

/// The median of `samples` (reordered in place), as [`quantile`] picks it; NaN when empty.
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    quantile(samples, 0.5)
}

/// Runs `op` in batches of 1, 2, 4, ... calls until one batch takes at least `min_batch` (or
/// reaches 2^20 calls): that batch length, and the time per call in the last batch. The runs
/// also warm the operation up.
pub fn batch_length<E>(
    op: &mut impl FnMut() -> Result<(), E>,
    min_batch: Duration,
) -> Result<(usize, Duration), E> {
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            op()?;
        }
        let el = t.elapsed();
        if el >= min_batch || batch >= 1 << 20 {
            return Ok((batch, el / batch as u32));
        }
        batch *= 2;
    }
}

/// Times several operations interleaved: every round runs each operation once as a batch, so
/// drift on a shared machine (other tenants, clocks, PCIe traffic) hits all of them alike and
/// their ratios stay fair. Each operation's batch length is its [`batch_length`].
///
/// The order is shuffled afresh every round: an operation can leave state behind that slows
/// or speeds the next one (parked worker threads, dirty cache lines, driver staging buffers),
/// and with a fixed order the same operation would always pay for the same neighbour: two
/// slots timing the same copy-engine read in a fixed order then differ in their medians.
///
/// Each timed batch is preceded by an untimed batch (and at least [`WARM_UP`]) of the same
/// operation, so each is timed in its own steady state rather than paying for the operation
/// that ran before it (operations of [`LONG_OP`] and more skip it).
///
/// Each operation has its own share of `budget` (`budget / ops.len()`, warm-ups included): it
/// takes part in rounds until it has `samples`, or until it has at least 9 samples (or
/// `samples` if fewer) and has spent its share. So a fast operation timed beside one 20 times
/// slower still gets its share of samples, not the slow one's few.
///
/// Returns the per-call microseconds of every sample for each operation, in the order given.
pub fn time_interleaved<E>(
    ops: &mut [Op<'_, E>],
    samples: usize,
    min_batch: Duration,
    budget: Duration,
) -> Result<Vec<Vec<f64>>, E> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let mut batches = Vec::with_capacity(ops.len());
    let mut per_call = Vec::with_capacity(ops.len());
    for op in ops.iter_mut() {
        // Warm up first: a cold first call (worker threads parked by the operation before) can
        // take longer than `min_batch` alone and leave this operation with shorter batches than
        // its neighbours. Without this, the auto copier's 2- and 4-thread 32-64 KiB writes,
        // third in copylat's list, timed slower than the same writes later in the list; with
        // it, level.
        let w = Instant::now();
        while w.elapsed() < WARM_UP {
            op()?;
        }
        let (batch, per) = batch_length(op, min_batch)?;
        per_call.push(per);
        batches.push(batch);
    }
    let share = budget / ops.len() as u32;
    // At least 9 samples even past the budget: a median of fewer swings with one slow sample.
    let floor = samples.min(9);
    let mut out: Vec<Vec<f64>> = vec![Vec::with_capacity(samples); ops.len()];
    let mut spent = vec![Duration::ZERO; ops.len()];
    let mut order: Vec<usize> = Vec::with_capacity(ops.len());
    let mut rng = Shuffler::new();
    loop {
        order.clear();
        order.extend((0..ops.len()).filter(|&i| {
            let n = out[i].len();
            n < samples && (n < floor || spent[i] < share)
        }));
        if order.is_empty() {
            return Ok(out);
        }
        rng.shuffle(&mut order);
        for &i in &order {
            let op = &mut ops[i];
            let w = Instant::now();
            // Warm up for a whole batch and at least WARM_UP, so threads parked by the
            // previous operation are awake again before the clock starts (waking an idle vCPU
            // in a VM can take tens of microseconds).
            // Operations of milliseconds skip it: a wake-up is noise against them, and
            // warming would double the time of the largest copies.
            if per_call[i] < LONG_OP {
                let mut n = 0;
                while n < batches[i] || (w.elapsed() < WARM_UP && n < 64 * batches[i]) {
                    op()?;
                    n += 1;
                }
            }
            let t = Instant::now();
            for _ in 0..batches[i] {
                op()?;
            }
            let timed = t.elapsed();
            out[i].push(timed.as_secs_f64() * 1e6 / batches[i] as f64);
            spent[i] += w.elapsed();
        }
    }
}

/// A small xorshift generator for the round order: the order only has to differ from round to
/// round and from run to run, not be unpredictable.
struct Shuffler(u64);

impl Shuffler {
    fn new() -> Shuffler {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded per process (and per instance) by the standard library.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x9e37_79b9_7f4a_7c15);
        Shuffler(h.finish() | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Fisher-Yates.
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation that sleeps for `d`.
    fn sleeping(d: Duration) -> Op<'static, ()> {
        Box::new(move || {
            std::thread::sleep(d);
            Ok(())
        })
    }

    #[test]
    fn quantile_and_median_of_a_known_set() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        assert_eq!(median(&mut v), 501.0);
        assert_eq!(quantile(&v, 0.99), 990.0);
        assert_eq!(quantile(&v, 1.0), 1000.0);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn interleaved_timing_keeps_order_and_ratio() {
        let mut ops: Vec<Op<'_, ()>> = vec![
            sleeping(Duration::from_micros(400)),
            sleeping(Duration::from_micros(100)),
        ];
        let mut s = time_interleaved(
            &mut ops,
            5,
            Duration::from_micros(50),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].len(), 5);
        let (a, b) = (median(&mut s[0]), median(&mut s[1]));
        assert!(a > b, "{s:?}");
        assert!(b >= 100.0);
    }

    #[test]
    fn a_fast_operation_gets_its_own_share_of_samples() {
        let mut ops: Vec<Op<'_, ()>> = vec![
            sleeping(Duration::from_millis(10)),
            sleeping(Duration::from_micros(200)),
        ];
        // 40 ms each: the slow operation stops at the floor of 9 samples (90 ms), the fast one
        // goes on to about 40 ms / (200 us + its warm-up) samples.
        let s = time_interleaved(
            &mut ops,
            1000,
            Duration::from_micros(50),
            Duration::from_millis(80),
        )
        .unwrap();
        assert_eq!(s[0].len(), 9, "{:?}", s[0]);
        assert!(s[1].len() > 20, "{}", s[1].len());
        assert!(s[1].len() < 1000);
    }

    #[test]
    fn every_order_is_a_permutation_and_orders_differ() {
        let mut rng = Shuffler::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut v: Vec<usize> = (0..5).collect();
            rng.shuffle(&mut v);
            let mut sorted = v.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..5).collect::<Vec<_>>());
            seen.insert(v);
        }
        // 120 orders of 5: 200 draws that found fewer than 60 of them are not shuffling.
        assert!(seen.len() > 60, "{} distinct orders", seen.len());
        // Each operation comes first in some round.
        for first in 0..5 {
            assert!(seen.iter().any(|v| v[0] == first));
        }
    }
}
