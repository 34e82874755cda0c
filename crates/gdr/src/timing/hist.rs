//! A latency histogram in nanoseconds: log-linear buckets (64 per power of two, so a
//! quantile is off by under 1.6 %), fixed size, mergeable, cheap enough to record every
//! request on the hot path.

const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
/// Values up to 2^40 ns (~18 minutes); larger ones land in the last bucket.
const BUCKETS: usize = SUB * (40 - SUB_BITS as usize + 1);

/// Latencies in nanoseconds, counted in log-linear buckets: exact below 64 ns, then 64
/// buckets per power of two up to 2^40 ns (larger values share the last bucket). The count,
/// sum, minimum and maximum are kept exactly. 2240 counters (17.5 KiB), allocated once.
///
/// # Examples
///
/// ```
/// use gdr::timing::Histogram;
///
/// // Two threads' latencies, merged; values below 64 ns are counted exactly.
/// let (mut a, mut b) = (Histogram::new(), Histogram::new());
/// for ns in [10, 20, 30] {
///     a.record(ns);
/// }
/// b.record(40);
/// a.merge(&b);
/// assert_eq!(a.count(), 4);
/// assert_eq!((a.quantile(0.5), a.quantile(1.0)), (20, 40));
/// // Larger values land in buckets a few percent wide.
/// let mut big = Histogram::new();
/// big.record(1_000_000);
/// let q = big.quantile(0.5) as f64;
/// assert!((q - 1e6).abs() / 1e6 < 0.016, "{q}");
/// assert_eq!(big.summary().max_us, 1000.0, "the extremes are exact");
/// ```
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
    min: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram({:?})", self.summary())
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS
    let shift = e - SUB_BITS;
    let i = (shift as usize + 1) * SUB + ((v >> shift) as usize - SUB);
    i.min(BUCKETS - 1)
}

/// The midpoint of bucket `i`.
fn value_of(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let shift = (i / SUB - 1) as u32;
    let lo = ((SUB + i % SUB) as u64) << shift;
    lo + ((1u64 << shift) >> 1)
}

/// Quantiles in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Their exact mean.
    pub mean_us: f64,
    /// The exact minimum.
    pub min_us: f64,
    /// The median (a bucket's midpoint, clamped to the exact minimum and maximum).
    pub p50_us: f64,
    /// The 90th percentile, as the median.
    pub p90_us: f64,
    /// The 99th percentile, as the median.
    pub p99_us: f64,
    /// The 99.9th percentile, as the median.
    pub p999_us: f64,
    /// The exact maximum.
    pub max_us: f64,
}

impl Histogram {
    /// An empty histogram (all buckets allocated now, so recording never allocates).
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
            min: u64::MAX,
        }
    }

    /// Counts one value of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket(ns)] += 1;
        self.total += 1;
        self.sum += ns as u128;
        self.max = self.max.max(ns);
        self.min = self.min.min(ns);
    }

    /// Values recorded (merged ones included).
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Adds every value counted in `o` (another thread's or interval's histogram) to this one.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
        self.min = self.min.min(o.min);
    }

    /// The value at quantile `q` in ns (0 when empty), clamped to the exact min and max.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_of(i).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// The count, mean, extremes and quantiles in microseconds; all zero when empty.
    pub fn summary(&self) -> LatencySummary {
        if self.total == 0 {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: self.total,
            mean_us: self.sum as f64 / self.total as f64 / 1000.0,
            min_us: us(self.min),
            p50_us: us(self.quantile(0.5)),
            p90_us: us(self.quantile(0.9)),
            p99_us: us(self.quantile(0.99)),
            p999_us: us(self.quantile(0.999)),
            max_us: us(self.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn quantiles_are_within_bucket_precision_of_the_exact_ones() {
        let mut rng = rand::thread_rng();
        let mut h = Histogram::new();
        let mut v: Vec<u64> = (0..20000).map(|_| rng.gen_range(0..5_000_000u64)).collect();
        for &x in &v {
            h.record(x);
        }
        v.sort();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = v[((q * v.len() as f64).ceil() as usize).max(1) - 1] as f64;
            let got = h.quantile(q) as f64;
            assert!(
                (got - exact).abs() <= exact * 0.02 + 2.0,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.summary().max_us, *v.last().unwrap() as f64 / 1000.0);
        assert_eq!(h.count(), 20000);
    }

    #[test]
    fn buckets_are_monotonic_and_merge_adds() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(37) {
            let b = bucket(v);
            assert!(b >= last);
            last = b;
            assert!(value_of(b) as f64 >= v as f64 * 0.98 - 1.0);
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.quantile(1.0), 1_000_000);
        assert_eq!(a.quantile(0.5), 10);
        assert_eq!(Histogram::new().summary(), LatencySummary::default());
    }
}
