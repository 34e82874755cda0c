//! Order statistics of a set of samples ([`Summary`]) and batch timing of one operation, for
//! the benchmarks and the tools; built on the sample quantile and the batch length of the
//! parent module.

use super::{batch_length, quantile};
use std::time::{Duration, Instant};

/// Order statistics of a set of samples (in whatever unit they were given).
///
/// # Examples
///
/// ```
/// use gdr::timing::Summary;
///
/// let mut us = [5.0, 1.0, 4.0, 2.0, 3.0];
/// let s = Summary::of(&mut us);
/// assert_eq!((s.n, s.min, s.median, s.max, s.mean), (5, 1.0, 3.0, 5.0, 3.0));
/// assert_eq!(us, [1.0, 2.0, 3.0, 4.0, 5.0], "sorted in place");
/// assert!(Summary::of(&mut []).median.is_nan());
/// ```
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// The smallest sample.
    pub min: f64,
    /// The sample at quantile 0.5 ([`super::quantile`]: rank `round(0.5 * (n - 1))`).
    pub median: f64,
    /// The sample at quantile 0.99.
    pub p99: f64,
    /// The sample at quantile 0.999.
    pub p999: f64,
    /// The largest sample.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (reordered in place). Empty input gives NaNs.
    pub fn of(samples: &mut [f64]) -> Summary {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let q = |p: f64| quantile(samples, p);
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

/// The sample at quantile `q` of `sorted_ns` (ascending nanoseconds), in microseconds: the one
/// at index `floor(n * q)`, as `gdr mq bench` reports its latencies. NaN when empty.
pub fn ns_quantile_us(sorted_ns: &[u64], q: f64) -> f64 {
    match sorted_ns.len() {
        0 => f64::NAN,
        n => sorted_ns[((n as f64 * q) as usize).min(n - 1)] as f64 / 1000.0,
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
    let (batch, _) = batch_length(&mut op, min_batch)?;
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
        let ns: Vec<u64> = (1..=1000).map(|v| v * 1000).collect();
        assert_eq!(ns_quantile_us(&ns, 0.5), 501.0);
        assert_eq!(ns_quantile_us(&ns, 0.999), 1000.0);
        assert!(ns_quantile_us(&[], 0.5).is_nan());
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
