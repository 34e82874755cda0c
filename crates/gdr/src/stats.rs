//! Measurement helpers shared by the benchmarks: batch timing and order statistics.

use std::time::{Duration, Instant};

/// Order statistics of a set of samples (in whatever unit they were given).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (reordered in place). Empty input gives NaNs.
    pub fn of(samples: &mut [f64]) -> Summary {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let q = |p: f64| {
            if n == 0 {
                f64::NAN
            } else {
                samples[((p * (n - 1) as f64).round() as usize).min(n - 1)]
            }
        };
        Summary {
            n,
            min: q(0.0),
            median: q(0.5),
            p99: q(0.99),
            p999: q(0.999),
            max: q(1.0),
            mean: if n == 0 {
                f64::NAN
            } else {
                samples.iter().sum::<f64>() / n as f64
            },
        }
    }
}

/// Times `op` in batches so that timer overhead stays small against short operations:
/// finds a batch length whose run takes at least `min_batch`, then records `samples` batches
/// (or fewer if `budget` runs out, but at least 3) and returns the per-call times in
/// microseconds.
pub fn time_per_call_us<E>(
    mut op: impl FnMut() -> Result<(), E>,
    samples: usize,
    min_batch: Duration,
    budget: Duration,
) -> Result<Summary, E> {
    // Warm-up, and the batch length.
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            op()?;
        }
        let el = t.elapsed();
        if el >= min_batch || batch >= 1 << 20 {
            break;
        }
        batch *= 2;
    }
    let start = Instant::now();
    let mut out = Vec::with_capacity(samples);
    while out.len() < samples && (out.len() < 3 || start.elapsed() < budget) {
        let t = Instant::now();
        for _ in 0..batch {
            op()?;
        }
        out.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
    }
    Ok(Summary::of(&mut out))
}

/// Least time an operation runs untimed before each of its timed batches.
pub const WARM_UP: Duration = Duration::from_micros(200);

/// Operations at least this long are not warmed up before their timed batches.
pub const LONG_OP: Duration = Duration::from_millis(2);

/// An operation to time: returns an error to abort the measurement.
pub type Op<'a, E> = Box<dyn FnMut() -> Result<(), E> + 'a>;

/// Times several operations interleaved: every round runs each operation once as a batch, so
/// drift on a shared machine (other tenants, clocks, PCIe traffic) hits all of them alike and
/// their ratios stay fair. Batch lengths are chosen per operation as in [`time_per_call_us`].
/// Each timed batch is preceded by an untimed batch (and at least [`WARM_UP`]) of the same
/// operation, so each is timed
/// in its own steady state (worker threads awake, caches and TLBs warm for its buffers) rather
/// than paying for the operation that ran before it.
/// Returns per-call microseconds for each operation, in order.
pub fn time_interleaved_us<E>(
    ops: &mut [Op<'_, E>],
    samples: usize,
    min_batch: Duration,
    budget: Duration,
) -> Result<Vec<Summary>, E> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let mut batches = Vec::with_capacity(ops.len());
    let mut per_call = Vec::with_capacity(ops.len());
    for op in ops.iter_mut() {
        let mut batch = 1usize;
        loop {
            let t = Instant::now();
            for _ in 0..batch {
                op()?;
            }
            let el = t.elapsed();
            if el >= min_batch || batch >= 1 << 20 {
                per_call.push(el / batch as u32);
                break;
            }
            batch *= 2;
        }
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
    Ok(out.iter_mut().map(|v| Summary::of(v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_set() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!(s.n, 1000);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.median, 501.0);
        assert_eq!(s.p99, 990.0);
        assert!((s.mean - 500.5).abs() < 1e-9);
        assert!(Summary::of(&mut []).median.is_nan());
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
        let s = time_interleaved_us(
            &mut ops,
            5,
            Duration::from_micros(50),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].median > s[1].median, "{s:?}");
        assert!(s[1].median >= 100.0);
    }

    #[test]
    fn batch_timing_reports_per_call_time_and_propagates_errors() {
        let s = time_per_call_us(
            || {
                std::thread::sleep(Duration::from_micros(200));
                Ok::<(), ()>(())
            },
            5,
            Duration::from_micros(100),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(s.median >= 200.0 && s.median < 20_000.0, "{s:?}");
        let mut calls = 0;
        let r = time_per_call_us(
            || {
                calls += 1;
                if calls > 3 {
                    Err("boom")
                } else {
                    Ok(())
                }
            },
            5,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert_eq!(r.unwrap_err(), "boom");
    }
}
