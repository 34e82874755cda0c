//! Run-time choice among the paths that calibration found near-tied for one size class.
//!
//! Calibration rates every path once per machine, but near a crossover the order of two paths
//! does not always hold afterwards: an 8 KiB mapping read that calibration rated level with the
//! copy engine ran steadily slower than it in a copylat run minutes later
//! (docs/perf.md#how-the-auto-copier-chooses). So where another path came within
//! [`CONTEND_WITHIN`] of the chosen one, the class keeps a running estimate of each contender's
//! per-call time and copies on the lowest. (The copier lets only the copy engine and the
//! one-thread mapping contend: [`super::can_contend`].)
//!
//! - every [`TIME_EVERY`]th call of the current path is timed and feeds its estimate, so a path
//!   that has become slower is left once its estimate passes a contender's;
//! - now and then the calls go to another contender for a short burst (after
//!   [`EXPLORE_FIRST`] calls, then at doubling intervals up to [`EXPLORE_LAST`]), so one that
//!   has become faster is found. Every call of a burst is timed; it ends after
//!   [`EXPLORE_SAMPLES`] samples counted, or [`EXPLORE_MAX_CALLS`] calls.
//!
//! **What is timed is the period of steady calls**, not a call's own duration: a sample is the
//! time from one timed call's start to the next one's, over the calls in between (8 for the
//! current path, 1 in a burst), all on the same path. That is what a stream of copies costs,
//! and it is what a call's duration misses: a single-thread 32 KiB write returns well before
//! the next one can follow (its posted writes drain after it returns and slow the next one), so
//! timed by duration, 2 threads looked slower than one and the copier moved to one thread. Time
//! the caller spends between copies is in the period too, alike for every path. A sample counts
//! only once calls on its path have run for [`STEADY_AFTER`] (after a switch or a pause the
//! first calls find an idle link, cold caches or parked pool threads), and not when its period
//! is over [`PAUSE_FACTOR`] times the estimate (the caller paused; the stream starts again from
//! there). A program whose copies are always far apart never counts a sample, and keeps
//! calibration's choice.
//!
//! Estimates are exponentially smoothed and scaled to the class's base size (a 12 KiB copy in
//! the 8 KiB class counts two thirds of its time), and a sample counts at most 1.25 times the
//! estimate, so one call that hit a page fault or a descheduling cannot move the choice.
//!
//! The state is shared by every thread using the copier. Counters and estimates are plain
//! relaxed loads and stores, not read-modify-writes: two threads racing may lose a count or a
//! sample, which only delays an exploration or a switch, and no copy depends on it for
//! correctness (every path copies the same bytes).

use super::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A path contends when calibration rated it within this factor of the chosen one.
pub const CONTEND_WITHIN: f64 = 1.35;

/// At most this many paths contend in one class (the chosen one included).
pub const MAX_CONTENDERS: usize = 4;

/// One call of the current path in this many is timed.
pub const TIME_EVERY: u64 = 8;

/// Calls before the first burst; the number of calls between bursts doubles after each one.
pub const EXPLORE_FIRST: u64 = 256;

/// The most calls between two bursts.
pub const EXPLORE_LAST: u64 = 4096;

/// Samples counted in one burst.
pub const EXPLORE_SAMPLES: u64 = 4;

/// The longest burst, in calls (reached when the calls are never steady).
pub const EXPLORE_MAX_CALLS: u64 = 256;

/// How long calls on one path must have run back to back before one counts.
pub const STEADY_AFTER: Duration = Duration::from_micros(200);

/// A period this many times the estimate or more is a pause, not a sample.
pub const PAUSE_FACTOR: f64 = 4.0;

/// Another path takes over when its estimate is this much below the current one's.
pub const SWITCH_MARGIN: f64 = 0.03;

/// A sample counts at most this many times the estimate: a call that hit a page fault or a
/// descheduling moves an estimate by at most a few percent, a path that has really become
/// slower still passes a contender 10% behind within five samples.
const SAMPLE_CAP: f64 = 1.25;

/// Weight of one sample of the current path in its estimate.
const CURRENT_WEIGHT: f64 = 1.0 / 8.0;

/// Weight of one sample of a burst in the explored path's estimate (bursts are rare).
const EXPLORE_WEIGHT: f64 = 1.0 / 4.0;

const STEADY_AFTER_NS: u64 = STEADY_AFTER.as_nanos() as u64;

/// No contender (between bursts; before the first timed call).
const NONE: usize = usize::MAX;

/// Monotonic nanoseconds on the clock [`Contest::record`] takes its times on.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What to do for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Copy on this path; nothing to record.
    Plain(Path),
    /// Copy on contender `i` (the current one) and [`Contest::record`] the times.
    Timed(usize),
    /// Copy on contender `i`, explored in a burst, and record the times.
    Explore(usize),
}

/// The contenders of one size class and their estimates.
#[derive(Debug)]
pub struct Contest {
    paths: Vec<Path>,
    /// Per-call nanoseconds scaled to the class size, as `f64` bits.
    est_ns: Vec<AtomicU64>,
    current: AtomicUsize,
    calls: AtomicU64,
    next_explore: AtomicU64,
    explorations: AtomicU64,
    /// The contender a burst is exploring ([`NONE`] between bursts), its calls so far and
    /// the samples it has counted.
    burst_path: AtomicUsize,
    burst_calls: AtomicU64,
    burst_counted: AtomicU64,
    /// The last timed call: its contender, when it started, and since when calls on that
    /// contender have run without a pause ([`now_ns`] nanoseconds).
    last_path: AtomicUsize,
    last_start_ns: AtomicU64,
    steady_since_ns: AtomicU64,
}

impl Contest {
    /// Contenders with their calibrated per-call times (us at the class size); the first
    /// starts as current. Keeps at most [`MAX_CONTENDERS`].
    ///
    /// # Panics
    /// With fewer than two contenders.
    pub fn new(mut contenders: Vec<(Path, f64)>) -> Contest {
        assert!(contenders.len() >= 2, "a contest needs two paths");
        contenders.truncate(MAX_CONTENDERS);
        Contest {
            paths: contenders.iter().map(|c| c.0).collect(),
            est_ns: contenders
                .iter()
                .map(|c| AtomicU64::new((c.1 * 1e3).to_bits()))
                .collect(),
            current: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            next_explore: AtomicU64::new(EXPLORE_FIRST),
            explorations: AtomicU64::new(0),
            burst_path: AtomicUsize::new(NONE),
            burst_calls: AtomicU64::new(0),
            burst_counted: AtomicU64::new(0),
            last_path: AtomicUsize::new(NONE),
            last_start_ns: AtomicU64::new(0),
            steady_since_ns: AtomicU64::new(0),
        }
    }

    /// The paths that contend, the one calibration chose first.
    pub fn paths(&self) -> &[Path] {
        &self.paths
    }

    /// Contender `i`.
    pub fn path(&self, i: usize) -> Path {
        self.paths[i]
    }

    /// The path calls go to now.
    pub fn current(&self) -> Path {
        self.paths[self.current.load(Relaxed)]
    }

    /// The current estimate of contender `i`, in us per call at the class size.
    pub fn estimate_us(&self, i: usize) -> f64 {
        f64::from_bits(self.est_ns[i].load(Relaxed)) / 1e3
    }

    /// Decides one call.
    #[inline]
    pub fn turn(&self) -> Turn {
        let x = self.burst_path.load(Relaxed);
        if x != NONE {
            return Turn::Explore(x);
        }
        let n = self.calls.load(Relaxed) + 1;
        self.calls.store(n, Relaxed);
        let cur = self.current.load(Relaxed);
        if n >= self.next_explore.load(Relaxed) {
            let e = self.explorations.load(Relaxed);
            self.explorations.store(e + 1, Relaxed);
            // 2^16 is past EXPLORE_LAST / EXPLORE_FIRST, and far from shifting the bits out.
            let interval = (EXPLORE_FIRST << (e + 1).min(16)).min(EXPLORE_LAST);
            self.next_explore.store(n + interval, Relaxed);
            // The others in turn.
            let j = (e % (self.paths.len() as u64 - 1)) as usize;
            let x = if j >= cur { j + 1 } else { j };
            self.burst_calls.store(0, Relaxed);
            self.burst_counted.store(0, Relaxed);
            self.burst_path.store(x, Relaxed);
            return Turn::Explore(x);
        }
        if n.is_multiple_of(TIME_EVERY) {
            Turn::Timed(cur)
        } else {
            Turn::Plain(self.paths[cur])
        }
    }

    /// Records that a timed call on contender `i` of `len` bytes starts at `start_ns`
    /// ([`now_ns`] clock; `explored`: the call is a [`Turn::Explore`]). When the calls since
    /// the last timed one were steady (see the module docs), their period feeds the
    /// contender's estimate, and calls move to the contender with the lowest estimate when it
    /// is [`SWITCH_MARGIN`] below the current one's.
    pub fn record(&self, i: usize, start_ns: u64, len: usize, class_size: usize, explored: bool) {
        // Calls since the last timed one (the burst's calls are all timed).
        let calls = if explored { 1 } else { TIME_EVERY };
        let last = self.last_start_ns.load(Relaxed);
        let same_path = self.last_path.load(Relaxed) == i && start_ns >= last;
        self.last_path.store(i, Relaxed);
        self.last_start_ns.store(start_ns, Relaxed);
        let sample =
            (start_ns.wrapping_sub(last) / calls) as f64 * class_size as f64 / len.max(1) as f64;
        let old = f64::from_bits(self.est_ns[i].load(Relaxed));
        let paused = old > 0.0 && sample >= PAUSE_FACTOR * old;
        if !same_path || paused {
            self.steady_since_ns.store(start_ns, Relaxed);
        }
        let steady = same_path
            && !paused
            && last.saturating_sub(self.steady_since_ns.load(Relaxed)) >= STEADY_AFTER_NS;
        if explored {
            let calls = self.burst_calls.load(Relaxed) + 1;
            self.burst_calls.store(calls, Relaxed);
            let counted = self.burst_counted.load(Relaxed) + u64::from(steady);
            self.burst_counted.store(counted, Relaxed);
            if counted >= EXPLORE_SAMPLES || calls >= EXPLORE_MAX_CALLS {
                self.burst_path.store(NONE, Relaxed);
            }
        }
        if !steady {
            return;
        }
        let new = if old > 0.0 {
            let w = if explored {
                EXPLORE_WEIGHT
            } else {
                CURRENT_WEIGHT
            };
            old + (sample.min(SAMPLE_CAP * old) - old) * w
        } else {
            sample
        };
        self.est_ns[i].store(new.to_bits(), Relaxed);
        let est = |j: usize| f64::from_bits(self.est_ns[j].load(Relaxed));
        let cur = self.current.load(Relaxed);
        let best = (0..self.paths.len())
            .min_by(|&a, &b| est(a).total_cmp(&est(b)))
            .expect("a class has a path");
        if best != cur && est(best) < est(cur) * (1.0 - SWITCH_MARGIN) {
            self.current.store(best, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const X1: Path = Path::Mapping { threads: 1 };
    const X2: Path = Path::Mapping { threads: 2 };
    const X4: Path = Path::Mapping { threads: 4 };
    const CE: Path = Path::CopyEngine;
    const K: usize = 8192;

    /// What [`drive`] saw.
    #[derive(Default)]
    struct Run {
        /// The path of every call.
        used: Vec<Path>,
        /// Per burst: the calls before it that were not in a burst, and its calls.
        bursts: Vec<(usize, usize)>,
    }

    /// A simulated clock and driver: calls run back to back, contender `i` taking `times[i]`
    /// us a call, with `gap_us` between calls.
    struct Sim {
        now_ns: u64,
        gap_ns: u64,
    }

    impl Sim {
        fn new() -> Sim {
            Sim {
                now_ns: 1_000_000,
                gap_ns: 20,
            }
        }

        fn drive(&mut self, c: &Contest, times: &[f64], calls: usize) -> Run {
            let mut run = Run::default();
            let mut outside = 0;
            for _ in 0..calls {
                let in_burst = c.burst_path.load(Relaxed) != NONE;
                let turn = c.turn();
                let i = match turn {
                    Turn::Plain(p) => c.paths().iter().position(|&q| q == p).unwrap(),
                    Turn::Timed(i) | Turn::Explore(i) => i,
                };
                if matches!(turn, Turn::Explore(_)) {
                    if !in_burst {
                        run.bursts.push((outside, 0));
                        outside = 0;
                    }
                    run.bursts.last_mut().unwrap().1 += 1;
                } else {
                    outside += 1;
                }
                match turn {
                    Turn::Timed(i) => c.record(i, self.now_ns, K, K, false),
                    Turn::Explore(i) => c.record(i, self.now_ns, K, K, true),
                    Turn::Plain(_) => {}
                }
                self.now_ns += (times[i] * 1e3) as u64 + self.gap_ns;
                run.used.push(c.path(i));
            }
            run
        }
    }

    #[test]
    #[should_panic(expected = "a contest needs two paths")]
    fn a_contest_needs_two_paths() {
        Contest::new(vec![(CE, 8.0)]);
    }

    #[test]
    fn a_current_path_that_slows_down_is_left() {
        // Calibrated: mapping 8.4 us, copy engine 9.2. Now: mapping 13.8, copy engine 9.4.
        let c = Contest::new(vec![(X1, 8.4), (CE, 9.2)]);
        assert_eq!(c.current(), X1);
        let mut sim = Sim::new();
        // The first 200 us are not steady yet; then a few samples.
        let run = sim.drive(&c, &[13.8, 9.4], 60);
        assert_eq!(c.current(), CE, "left after a few timed calls");
        assert!(run.used.contains(&X1));
        let run = sim.drive(&c, &[13.8, 9.4], 4000);
        assert_eq!(c.current(), CE);
        // Only bursts go back to the mapping: 16 calls of 13.8 us until the periods begin
        // 200 us into the burst, then 4 counted periods.
        let on_mapping = run.used.iter().filter(|&&p| p == X1).count();
        assert!(!run.bursts.is_empty());
        assert!(run.bursts.iter().all(|b| b.1 == 20), "{:?}", run.bursts);
        assert_eq!(on_mapping, 20 * run.bursts.len());
        assert!(
            (c.estimate_us(0) - 13.8).abs() < 1.5,
            "{}",
            c.estimate_us(0)
        );
    }

    #[test]
    fn a_contender_that_became_faster_is_found() {
        // Calibrated: 2 threads 2.6 us, 4 threads 2.9. Now 2 threads still 2.6, 4 threads 2.3:
        // only a burst can show it, and one is enough.
        let c = Contest::new(vec![(X2, 2.6), (X4, 2.9)]);
        let mut sim = Sim::new();
        let run = sim.drive(&c, &[2.6, 2.3], 400);
        assert_eq!(run.bursts.len(), 1);
        assert_eq!(c.current(), X4);
        // And it stays there.
        sim.drive(&c, &[2.6, 2.3], 10_000);
        assert_eq!(c.current(), X4);
    }

    #[test]
    fn bursts_thin_out_and_visit_every_contender() {
        let c = Contest::new(vec![(X2, 2.0), (X4, 2.5), (X1, 2.6)]);
        let mut sim = Sim::new();
        // Past 64 bursts too: the interval once went to 0 when its doubling shifted out.
        let run = sim.drive(&c, &[2.0, 3.0, 3.0], 300_000);
        assert!(run.bursts.len() > 70, "{} bursts", run.bursts.len());
        let gaps: Vec<usize> = run.bursts.iter().map(|b| b.0).collect();
        // The first burst starts on the 256th call, so 255 calls come before it.
        assert_eq!(&gaps[..6], &[255, 511, 1023, 2047, 4095, 4095]);
        assert!(gaps[5..].iter().all(|&g| g == EXPLORE_LAST as usize - 1));
        // 68 calls of 3 us until the periods begin 200 us into the burst, then 4 counted.
        assert!(
            run.bursts.iter().all(|b| b.1 == 72),
            "{:?}",
            &run.bursts[..3]
        );
        let explored: Vec<Path> = run.used.iter().copied().filter(|&p| p != X2).collect();
        assert!(explored.contains(&X4) && explored.contains(&X1));
        assert_eq!(c.current(), X2);
    }

    #[test]
    fn calls_after_a_pause_do_not_count() {
        // Copies 100 us apart are never steady: calibration's choice stays, and bursts end
        // after EXPLORE_MAX_CALLS without a sample.
        let c = Contest::new(vec![(X2, 2.0), (X1, 2.2)]);
        let mut sim = Sim::new();
        sim.gap_ns = 100_000;
        let run = sim.drive(&c, &[5.0, 1.0], 5000);
        assert_eq!(c.current(), X2);
        assert_eq!(c.estimate_us(0), 2.0);
        assert_eq!(c.estimate_us(1), 2.2);
        assert!(run.bursts.iter().all(|b| b.1 == EXPLORE_MAX_CALLS as usize));
        // Back to back again: the same times now count.
        sim.gap_ns = 20;
        sim.drive(&c, &[5.0, 1.0], 200);
        assert_eq!(c.current(), X1);
    }

    #[test]
    fn one_slow_period_does_not_switch_and_a_pause_is_no_sample() {
        let c = Contest::new(vec![(X1, 8.0), (CE, 8.6)]);
        // Timed calls of a steady stream: 8 calls of 8 us apart.
        let mut t = 0;
        for _ in 0..10 {
            c.record(0, t, K, K, false);
            t += 64_000;
        }
        assert_eq!(c.estimate_us(0), 8.0);
        // Calls 3x as long: the sample counts as 1.25x.
        t += 2 * 64_000;
        c.record(0, t, K, K, false);
        assert_eq!(c.current(), X1, "estimate {}", c.estimate_us(0));
        let est = c.estimate_us(0);
        assert!((est - 8.0 * (1.0 + 0.25 / 8.0)).abs() < 1e-9, "{est}");
        // A pause (10x): no sample, and the next periods wait 50 us before they count.
        t += 10 * 64_000;
        c.record(0, t, K, K, false);
        t += 64_000;
        c.record(0, t, K, K, false);
        assert_eq!(c.estimate_us(0), est);
    }

    #[test]
    fn samples_are_scaled_to_the_class_size() {
        let c = Contest::new(vec![(X1, 8.0), (CE, 9.0)]);
        // Timed calls 8 calls of 8 us apart; the first period starts the stream.
        c.record(0, 0, K, K, false);
        c.record(0, 64_000, K, K, false);
        c.record(0, 128_000, K, K, false);
        assert_eq!(c.estimate_us(0), 8.0);
        // 12 KiB copies every 12 us: 8 us at 8 KiB, no change.
        c.record(0, 128_000 + 8 * 12_000, 12 << 10, K, false);
        assert!((c.estimate_us(0) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn near_ties_within_the_margin_do_not_switch() {
        let c = Contest::new(vec![(X2, 2.60), (X4, 2.62)]);
        Sim::new().drive(&c, &[2.60, 2.56], 20_000);
        assert_eq!(c.current(), X2, "1.5% is inside the switch margin");
    }

    #[test]
    fn contenders_are_capped() {
        let c = Contest::new(vec![(X1, 1.0), (X2, 1.0), (X4, 1.0), (CE, 1.0), (X1, 1.0)]);
        assert_eq!(c.paths().len(), MAX_CONTENDERS);
    }
}
