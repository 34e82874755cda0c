//! Interleaved timing of operations, and the sample quantile: the one measurement primitive the
//! library itself needs (the auto copier times its paths against each other when it calibrates).
//!
//! The statistics and timing helpers of the benchmarks (`Summary`, `time_interleaved_us`,
//! histograms) live in the `gdr-bench` crate, built on these two functions.

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
/// their ratios stay fair. Each operation's batch length is its [`batch_length`]; rounds are
/// recorded until `samples` or until `budget` runs out (but at least 9 rounds, or `samples` if
/// fewer). Each timed batch is preceded by an untimed batch (and at least [`WARM_UP`]) of the
/// same operation, so each is timed in its own steady state (worker threads awake, caches and
/// TLBs warm for its buffers) rather than paying for the operation that ran before it.
/// Returns the per-call microseconds of every round for each operation, in order.
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
        let (batch, per) = batch_length(op, min_batch)?;
        per_call.push(per);
        batches.push(batch);
    }
    let start = Instant::now();
    let mut out: Vec<Vec<f64>> = vec![Vec::with_capacity(samples); ops.len()];
    // At least 9 rounds even past the budget: a median of fewer swings with one slow sample.
    let floor = samples.min(9);
    while out[0].len() < samples && (out[0].len() < floor || start.elapsed() < budget) {
        for (i, op) in ops.iter_mut().enumerate() {
            // Warm up for a whole batch and at least WARM_UP, so threads parked by the
            // previous operation are awake again before the clock starts (waking an idle vCPU
            // in a VM can take tens of microseconds).
            // Operations of milliseconds skip it: a wake-up is noise against them, and
            // warming would double the time of the largest copies.
            if per_call[i] < LONG_OP {
                let w = Instant::now();
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
            out[i].push(t.elapsed().as_secs_f64() * 1e6 / batches[i] as f64);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Box::new(|| {
                std::thread::sleep(Duration::from_micros(400));
                Ok(())
            }),
            Box::new(|| {
                std::thread::sleep(Duration::from_micros(100));
                Ok(())
            }),
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
}
