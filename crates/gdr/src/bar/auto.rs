//! The auto copier: for each direction and size, the fastest of CPU stores/loads through the
//! BAR mapping (on 1..N threads) and the GPU's copy engines (`cuMemcpy`), from crossover points
//! it measures once per machine and caches on disk.
//!
//! Decisions are kept per power-of-two size class: class `k` covers sizes `[2^k, 2^(k+1))` and
//! holds the path that was fastest when copying `2^k` bytes. Looking a path up costs a
//! leading-zero count and an index.
//!
//! Where calibration found the copy engine and the one-thread mapping near-tied (around the
//! read crossover; docs/perf.md), the class keeps measuring both while copying and follows the
//! faster ([`contest`]); elsewhere, thread counts included, calibration's choice is fixed.
//!
//! What a finished copy means is the same on every path: after [`AutoCopier::write`] returns
//! the bytes are in GPU memory (stores fenced, or the copy engine's copy synchronised); after
//! [`AutoCopier::read`] returns `dst` holds them.

use crate::bar::{BarError, DeviceMapped, MappedBuffer, VulkanBackend};
use crate::timing;
use std::path::PathBuf;
use std::time::Duration;

pub mod contest;
use contest::{Contest, Turn};

/// Number of size classes: 1 B .. 2^(CLASSES-1) B; larger sizes use the last class.
pub const CLASSES: usize = 29; // up to 256 MiB

/// A way to move bytes between host memory and a [`DeviceMapped`] (a [`MappedBuffer`], a C
/// library mapping, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Path {
    /// CPU stream stores / stream loads through the BAR mapping, on this many threads.
    Mapping {
        /// CPU threads the copy is split over (1: the calling thread alone); a small copy
        /// runs on fewer ([`Path::runs_as`]).
        threads: usize,
    },
    /// `cuMemcpyHtoD` (+ legacy-stream synchronize), or a copy-engine read
    /// (`gdr::cuda::read_into_host`: through page-locked chunks up to 1 MiB).
    CopyEngine,
}

impl Path {
    /// The path as it runs for `len` bytes: the mapping on as many threads as the copy is
    /// split into ([`crate::copy::part_count`]), so asking 8 threads for 32 KiB is 2 threads.
    pub fn runs_as(self, len: usize) -> Path {
        match self {
            Path::Mapping { threads } => Path::Mapping {
                threads: crate::copy::part_count(len, threads),
            },
            Path::CopyEngine => Path::CopyEngine,
        }
    }

    /// True when the path runs as asked at `len` (not as a smaller thread count).
    pub fn is_distinct_at(self, len: usize) -> bool {
        self.runs_as(len) == self
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Mapping { threads: 1 } => write!(f, "mapping"),
            Path::Mapping { threads } => write!(f, "mapping x{threads}"),
            Path::CopyEngine => write!(f, "copy engine"),
        }
    }
}

/// Direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    /// CPU memory -> GPU memory.
    ToGpu,
    /// GPU memory -> CPU memory.
    FromGpu,
}

/// One measured point of a calibration.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Point {
    /// The direction copied.
    pub direction: Direction,
    /// Bytes per copy (a power of two: the first size of its class).
    pub size: usize,
    /// The path timed.
    pub path: Path,
    /// The median time of one copy in microseconds, over one pass's interleaved rounds.
    pub median_us: f64,
}

/// The measured crossovers for one machine.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Identifies the machine and gdr version the numbers hold for.
    pub key: String,
    /// The path chosen for host-to-GPU copies, one per size class ([`CLASSES`] entries, index
    /// [`class_of`] the size).
    pub to_gpu: Vec<Path>,
    /// The path chosen for GPU-to-host copies, indexed as `to_gpu`.
    pub from_gpu: Vec<Path>,
    /// Every median measured: the first pass, then the second.
    pub points: Vec<Point>,
}

impl Calibration {
    /// Decisions for a machine without a cached calibration, shaped like those measured on a
    /// PCIe gen5 host (docs/perf.md): CPU->GPU on one thread below 32 KiB, two threads to
    /// 64 KiB, four to 4 MiB and eight above (at most the cores there are); GPU->CPU through
    /// the mapping below 16 KiB and the copy engine from there (loads through a BAR are slow,
    /// the copy engine's reads are not). No points: nothing is contested.
    pub fn typical() -> Calibration {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = |n: usize| Path::Mapping {
            threads: n.min(cores).max(1),
        };
        let to_gpu = (0..CLASSES)
            .map(|k| match k {
                0..=14 => threads(1),
                15 => threads(2),
                16..=21 => threads(4),
                _ => threads(8),
            })
            .collect();
        let from_gpu = (0..CLASSES)
            .map(|k| if k < 14 { threads(1) } else { Path::CopyEngine })
            .collect();
        Calibration {
            key: String::from("typical"),
            to_gpu,
            from_gpu,
            points: Vec::new(),
        }
    }
}

/// Size class of `len` (floor of log2, clamped).
#[inline]
pub fn class_of(len: usize) -> usize {
    let k = (usize::BITS - 1).saturating_sub(len.max(1).leading_zeros()) as usize;
    k.min(CLASSES - 1)
}

/// Writes `src` into `mem` at `offset` on `path`: on one thread
/// [`write_at`](crate::mem::MappedMemory::write_at), on several
/// [`write_parallel`](crate::mem::MappedMemory::write_parallel), on the copy engine
/// [`DeviceMapped::engine_write`].
pub fn write_on(
    path: Path,
    mem: &(impl DeviceMapped + ?Sized),
    offset: usize,
    src: &[u8],
) -> Result<(), BarError> {
    match path {
        Path::Mapping { threads: 1 } => Ok(mem.write_at(offset, src)?),
        Path::Mapping { threads } => Ok(mem.write_parallel(offset, src, threads)?),
        Path::CopyEngine => mem.engine_write(offset, src),
    }
}

/// Reads `dst.len()` bytes of `mem` at `offset` into `dst` on `path`, as [`write_on`].
pub fn read_on(
    path: Path,
    mem: &(impl DeviceMapped + ?Sized),
    offset: usize,
    dst: &mut [u8],
) -> Result<(), BarError> {
    match path {
        Path::Mapping { threads: 1 } => Ok(mem.read_at(offset, dst)?),
        Path::Mapping { threads } => Ok(mem.read_parallel(offset, dst, threads)?),
        Path::CopyEngine => mem.engine_read(offset, dst),
    }
}

/// Options for [`calibrate`].
#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    /// Thread counts to try for the mapping path (1 is always tried).
    pub threads: Vec<usize>,
    /// Largest size measured; larger classes reuse its decision.
    pub max_measured: usize,
    /// Time spent on one (size, path) at most.
    pub budget_per_point: Duration,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        CalibrateOptions {
            threads: [2, 4, 8].into_iter().filter(|&t| t <= cores).collect(),
            max_measured: 64 << 20,
            budget_per_point: Duration::from_millis(60),
        }
    }
}

/// The cache key: the GPU, the CPU and this gdr version.
fn machine_key(be: &VulkanBackend) -> Result<String, BarError> {
    let uuid = be.context().device().uuid()?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(format!(
        "gdr {} calibration {CALIBRATION_VERSION} gpu {} cpu {cpu} x{cores}",
        env!("CARGO_PKG_VERSION"),
        uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// Bumped when calibration changes, so cached decisions made the old way are measured again.
const CALIBRATION_VERSION: u32 = 3;

/// How long both directions of both kinds of path run before calibration starts, so that the
/// first sizes are not timed against a GPU and host still waking from idle (without it, copylat
/// found the copy engine much faster than calibration had rated it at some sizes).
const WARM_UP_FOR: Duration = Duration::from_millis(300);

/// Copies 1 MiB (or the buffer) both ways on the mapping and on the copy engine for `dur`.
fn warm_up(buf: &MappedBuffer, dur: Duration) -> Result<(), BarError> {
    let mut host = vec![0x5Au8; buf.len().min(1 << 20)];
    let start = std::time::Instant::now();
    while start.elapsed() < dur {
        for p in [Path::Mapping { threads: 1 }, Path::CopyEngine] {
            write_on(p, buf, 0, &host)?;
            read_on(p, buf, 0, &mut host)?;
        }
    }
    Ok(())
}

/// The median per-call time (us) of each of `paths` copying `size` bytes in `dir`, timed
/// interleaved round by round (`samples` rounds at most, `budget` in all).
fn median_times(
    buf: &MappedBuffer,
    paths: &[Path],
    dir: Direction,
    size: usize,
    samples: usize,
    budget: Duration,
) -> Result<Vec<f64>, BarError> {
    // One host buffer for every path: they run one at a time, and pageable copies depend on the
    // buffer (alignment, pages), which must not differ between paths.
    let host = std::cell::RefCell::new(vec![0x5Au8; size]);
    let host = &host;
    let mut ops: Vec<timing::Op<'_, BarError>> = paths
        .iter()
        .map(|&p| -> timing::Op<'_, BarError> {
            Box::new(move || match dir {
                Direction::ToGpu => write_on(p, buf, 0, &host.borrow()),
                Direction::FromGpu => read_on(p, buf, 0, &mut host.borrow_mut()),
            })
        })
        .collect();
    let samples = timing::time_interleaved(&mut ops, samples, Duration::from_micros(20), budget)?;
    Ok(samples
        .into_iter()
        .map(|mut s| timing::median(&mut s))
        .collect())
}

/// Measures every path at every power-of-two size and keeps the fastest per class.
///
/// Two passes, seconds apart. The first times every path at every size of both directions;
/// the second times the same paths again, and each path is rated by the lower of its two
/// medians ([`choose`]).
/// A shared machine has slow spells that hit one path and not another (one calibration can
/// time a path several times slower than the next does); a slow spell only ever adds time, so
/// the lower median of two passes far apart in time is the one that did not fall in it.
pub fn calibrate(be: &VulkanBackend, opts: &CalibrateOptions) -> Result<Calibration, BarError> {
    let max = opts
        .max_measured
        .next_power_of_two()
        .min(1 << (CLASSES - 1));
    let buf = be.alloc(max, 4096)?;
    let mut paths = vec![Path::Mapping { threads: 1 }];
    paths.extend(
        opts.threads
            .iter()
            .filter(|&&t| t > 1)
            .map(|&t| Path::Mapping { threads: t }),
    );
    paths.push(Path::CopyEngine);
    let mut points = Vec::new();
    warm_up(&buf, WARM_UP_FOR)?;
    // First pass: (path, median) per measured class, per direction.
    let mut first_pass = |dir: Direction| -> Result<Vec<Vec<(Path, f64)>>, BarError> {
        let mut per_class = Vec::with_capacity(CLASSES);
        // A mapping path that lost by more than 4x at two sizes in a row is not measured at
        // larger sizes: its time grows with the size at a fixed bandwidth (BAR reads), so it
        // only falls further behind. The copy engine is always measured: its fixed cost loses
        // at small sizes and wins at large ones.
        let mut losing: Vec<u8> = vec![0; paths.len()];
        for k in 0..CLASSES {
            let size = 1usize << k;
            if size > max {
                break;
            }
            let measured: Vec<(usize, Path)> = paths
                .iter()
                .copied()
                .enumerate()
                // Only paths that run as asked: 8 threads asked for 32 KiB run as 2, and
                // timing the same copy twice only lets noise pick between the two names.
                .filter(|&(i, p)| losing[i] < 2 && p.is_distinct_at(size))
                .collect();
            let paths_now: Vec<Path> = measured.iter().map(|&(_, p)| p).collect();
            let medians = median_times(
                &buf,
                &paths_now,
                dir,
                size,
                31,
                opts.budget_per_point * measured.len() as u32,
            )?;
            let best = medians.iter().copied().fold(f64::INFINITY, f64::min);
            for (&(i, p), &median_us) in measured.iter().zip(&medians) {
                points.push(Point {
                    direction: dir,
                    size,
                    path: p,
                    median_us,
                });
                losing[i] = if median_us / best > 4.0 && p != Path::CopyEngine {
                    losing[i] + 1
                } else {
                    0
                };
            }
            per_class.push(paths_now.into_iter().zip(medians).collect());
        }
        Ok(per_class)
    };
    let first = [
        first_pass(Direction::ToGpu)?,
        first_pass(Direction::FromGpu)?,
    ];
    // Second pass and the choice ([`choose`]). Every path of the first pass is timed again,
    // beside the same others: a path's speed depends on what runs between its copies (8
    // threads timed against mapping paths only come near 4; beside the copy engine, as in the
    // first pass and in copylat, they fall clearly behind).
    let mut decide =
        |dir: Direction, classes: &[Vec<(Path, f64)>]| -> Result<Vec<Path>, BarError> {
            let mut best_per_class = Vec::with_capacity(CLASSES);
            for (k, first) in classes.iter().enumerate() {
                let ps: Vec<Path> = first.iter().map(|r| r.0).collect();
                let again = if ps.len() > 1 {
                    median_times(
                        &buf,
                        &ps,
                        dir,
                        1 << k,
                        31,
                        opts.budget_per_point * ps.len() as u32,
                    )?
                } else {
                    vec![first[0].1]
                };
                for (&p, &median_us) in ps.iter().zip(&again) {
                    points.push(Point {
                        direction: dir,
                        size: 1 << k,
                        path: p,
                        median_us,
                    });
                }
                best_per_class.push(choose(first, &again));
            }
            // Classes past the largest measured size keep its decision.
            while best_per_class.len() < CLASSES {
                let last = *best_per_class.last().expect("class 0 measured");
                best_per_class.push(last);
            }
            Ok(best_per_class)
        };
    let to_gpu = decide(Direction::ToGpu, &first[0])?;
    let from_gpu = decide(Direction::FromGpu, &first[1])?;
    Ok(Calibration {
        key: machine_key(be)?,
        to_gpu,
        from_gpu,
        points,
    })
}

/// The path to use, from the first pass's (path, median us) and the second pass's medians of
/// the same paths: the one with the lowest of its two medians. (Summing the two passes instead
/// let one slow spell decide; preferring fewer threads among near-ties chose 2 threads where 4
/// or 8 were steadily faster.)
///
/// # Panics
/// When `first` is empty or `second` is shorter.
pub fn choose(first: &[(Path, f64)], second: &[f64]) -> Path {
    assert!(!first.is_empty() && second.len() >= first.len());
    first
        .iter()
        .zip(second)
        .map(|(&(p, m1), &m2)| (p, m1.min(m2)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(p, _)| p)
        .expect("checked non-empty")
}

/// Where calibrations are meant to be cached: `$GDR_CACHE_DIR`, else `$XDG_CACHE_HOME/gdr`, else
/// `~/.cache/gdr`; `None` when none of the three variables is set.
pub fn preferred_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GDR_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("gdr"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gdr"))
}

/// The largest cached calibration read back: far more than one holds; a larger file is not
/// one of ours.
const MAX_CALIBRATION_BYTES: u64 = 1 << 20;

/// Where calibrations are read from and written to, decided once per process by
/// [`CacheDirs::choose`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDirs {
    /// Where to look for a calibration, in order: the preferred directory (a read-only one may
    /// still hold one), then the fallback.
    pub read: Vec<PathBuf>,
    /// Where a new calibration is written: the preferred directory when it can be written,
    /// else the fallback; `None` when neither can (calibrations are then not kept).
    pub write: Option<PathBuf>,
    /// Set when `write` is not the preferred directory: what went wrong and what is done
    /// instead, for the front ends to say once ([`take_cache_note`]).
    pub note: Option<String>,
}

impl CacheDirs {
    /// Picks the directories: `preferred` ([`preferred_cache_dir`]) when it can be made and
    /// written, else `fallback` (a directory of this user's under the temporary directory),
    /// else none. A read-only or missing home (a container's) thus costs a calibration per
    /// boot of the temporary directory, not one per process, and never an error.
    pub fn choose(preferred: Option<PathBuf>, fallback: PathBuf) -> CacheDirs {
        let problem = match &preferred {
            Some(p) => match writable(p) {
                Ok(()) => {
                    return CacheDirs {
                        read: vec![p.clone()],
                        write: Some(p.clone()),
                        note: None,
                    }
                }
                Err(e) => format!(
                    "the calibration cache {} cannot be written ({e})",
                    p.display()
                ),
            },
            None => "no calibration cache directory (GDR_CACHE_DIR, XDG_CACHE_HOME and HOME are \
                     unset)"
                .to_string(),
        };
        let mut read: Vec<PathBuf> = preferred.into_iter().collect();
        match writable(&fallback).and_then(|()| owned_by_me(&fallback)) {
            Ok(()) => {
                let note = format!(
                    "{problem}; caching calibrations in {} instead (set GDR_CACHE_DIR to keep \
                     them elsewhere)",
                    fallback.display()
                );
                read.push(fallback.clone());
                CacheDirs {
                    read,
                    write: Some(fallback),
                    note: Some(note),
                }
            }
            Err(e) => CacheDirs {
                read,
                write: None,
                note: Some(format!(
                    "{problem}, nor can {} ({e}): calibrations are not kept, so each process \
                     measures its own (set GDR_CACHE_DIR to a writable directory)",
                    fallback.display()
                )),
            },
        }
    }
}

/// Makes `dir` (mode 0700 where it is new) and proves that a file can be created in it.
fn writable(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(probe)
}

/// The shared temporary directory is everyone's: a fallback there made by another user could
/// hand this process calibrations it did not measure, so only one's own is used.
fn owned_by_me(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let owner = std::fs::metadata(dir)?.uid();
    if owner == me {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "owned by uid {owner}, not {me}"
        )))
    }
}

/// This process's cache directories, decided at the first use of the cache.
static DIRS: std::sync::OnceLock<CacheDirs> = std::sync::OnceLock::new();

/// This process's cache directories ([`CacheDirs::choose`] over [`preferred_cache_dir`] and a
/// directory of this user's under the temporary directory), decided at the first call. Also
/// where gdr's allocator keeps its probe results.
pub fn cache_dirs() -> &'static CacheDirs {
    DIRS.get_or_init(|| {
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        CacheDirs::choose(
            preferred_cache_dir(),
            std::env::temp_dir().join(format!("gdr-cache-{uid}")),
        )
    })
}

/// The directory calibrations are written to in this process: [`preferred_cache_dir`] when it
/// can be written, else the fallback under the temporary directory; `None` when neither can.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dirs().write.clone()
}

/// The note of [`CacheDirs::note`] (why the preferred cache directory is not used, and what is
/// done instead) the first time it is asked for after the cache was first used; `None` before
/// (so asking decides nothing and makes no directory), after, and where there is no note. A
/// front end asks after its work, and whichever asks first says it, once.
pub fn take_cache_note() -> Option<&'static str> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let note = DIRS.get()?.note.as_deref()?;
    (!SAID.swap(true, std::sync::atomic::Ordering::Relaxed)).then_some(note)
}

fn cache_file_name(key: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    format!("calibration-{:016x}.json", h.finish())
}

/// Chooses a path per direction and size and copies on it.
pub struct AutoCopier {
    cal: Calibration,
    to_gpu: Vec<Slot>,
    from_gpu: Vec<Slot>,
}

/// One size class of one direction: a fixed path (one match on the copy's way, as cheap as a
/// table lookup), or a contest timed while copying.
enum Slot {
    Fixed(Path),
    Contested(Box<Contest>),
}

impl AutoCopier {
    /// Uses the cached calibration for this machine, or measures one (seconds; docs/perf.md)
    /// and caches it. Returns the copier and whether it was freshly calibrated.
    pub fn new(be: &VulkanBackend) -> Result<(AutoCopier, bool), BarError> {
        if let Some(copier) = AutoCopier::cached(be)? {
            return Ok((copier, false));
        }
        Ok((AutoCopier::recalibrate(be)?, true))
    }

    /// The copier of this machine's cached calibration, or `None` when there is none (no
    /// measuring: for callers that cannot wait for a calibration, such as the C library,
    /// which then uses [`Calibration::typical`]).
    pub fn cached(be: &VulkanBackend) -> Result<Option<AutoCopier>, BarError> {
        let key = machine_key(be)?;
        let name = cache_file_name(&key);
        Ok(cache_dirs()
            .read
            .iter()
            .filter_map(|d| crate::regular_file::read(&d.join(&name), MAX_CALIBRATION_BYTES).ok())
            .filter_map(|b| serde_json::from_slice::<Calibration>(&b).ok())
            .find(|c| c.key == key && c.to_gpu.len() == CLASSES && c.from_gpu.len() == CLASSES)
            .map(AutoCopier::from_calibration))
    }

    /// Measures a fresh calibration (ignoring the cache) and caches it.
    pub fn recalibrate(be: &VulkanBackend) -> Result<AutoCopier, BarError> {
        let copier = AutoCopier::from_calibration(calibrate(be, &CalibrateOptions::default())?);
        copier.save();
        Ok(copier)
    }

    /// Uses a given calibration (e.g. one just measured), following near-tied paths at run
    /// time ([`contest`]).
    ///
    /// # Panics
    /// When a direction has fewer than [`CLASSES`] decisions.
    pub fn from_calibration(cal: Calibration) -> AutoCopier {
        AutoCopier::build(cal, true)
    }

    /// Uses a given calibration and always copies on the path it chose for a class: no
    /// timing, no exploration (for reproducing a run, or measuring one path's decisions).
    ///
    /// # Panics
    /// When a direction has fewer than [`CLASSES`] decisions.
    pub fn fixed(cal: Calibration) -> AutoCopier {
        AutoCopier::build(cal, false)
    }

    fn build(cal: Calibration, adaptive: bool) -> AutoCopier {
        assert!(
            cal.to_gpu.len() >= CLASSES && cal.from_gpu.len() >= CLASSES,
            "a calibration holds {CLASSES} classes per direction"
        );
        let slots = |dir: Direction, chosen: &[Path]| -> Vec<Slot> {
            (0..CLASSES)
                .map(|k| {
                    let paths = if adaptive {
                        contenders(&cal.points, dir, k, chosen[k])
                    } else {
                        Vec::new()
                    };
                    if paths.len() > 1 {
                        Slot::Contested(Box::new(Contest::new(paths)))
                    } else {
                        Slot::Fixed(chosen[k])
                    }
                })
                .collect()
        };
        AutoCopier {
            to_gpu: slots(Direction::ToGpu, &cal.to_gpu),
            from_gpu: slots(Direction::FromGpu, &cal.from_gpu),
            cal,
        }
    }

    /// Writes the calibration to the cache ([`cache_dir`]: the fallback where the preferred
    /// directory cannot be written, nowhere where neither can). A failed write is ignored: the
    /// next process measures again.
    pub fn save(&self) {
        if let Some(d) = cache_dir() {
            if let Ok(json) = serde_json::to_vec_pretty(&self.cal) {
                let _ = std::fs::write(d.join(cache_file_name(&self.cal.key)), json);
            }
        }
    }

    /// The calibration the copier was built from (its choices and every point measured).
    pub fn calibration(&self) -> &Calibration {
        &self.cal
    }

    /// The path the next copy of `len` bytes in direction `dir` goes to (bar an exploration):
    /// calibration's choice, or the contender that has been faster since.
    #[inline]
    pub fn path_for(&self, dir: Direction, len: usize) -> Path {
        match self.slot(dir, len) {
            Slot::Fixed(p) => *p,
            Slot::Contested(c) => c.current(),
        }
    }

    /// The contest of the class of `len` bytes in `dir`; `None` where calibration's choice is
    /// fixed (nothing came near it, or [`AutoCopier::fixed`]).
    pub fn contest(&self, dir: Direction, len: usize) -> Option<&Contest> {
        match self.slot(dir, len) {
            Slot::Fixed(_) => None,
            Slot::Contested(c) => Some(c),
        }
    }

    #[inline]
    fn slot(&self, dir: Direction, len: usize) -> &Slot {
        let k = class_of(len);
        match dir {
            Direction::ToGpu => &self.to_gpu[k],
            Direction::FromGpu => &self.from_gpu[k],
        }
    }

    /// The smallest copy in `dir` that may leave the one-thread mapping: every size class below
    /// it is fixed to [`Path::Mapping`] on one thread, so a caller can send smaller copies
    /// straight there without asking (usize::MAX when no class leaves it).
    pub fn smallest_off_one_thread(&self, dir: Direction) -> usize {
        let slots = match dir {
            Direction::ToGpu => &self.to_gpu,
            Direction::FromGpu => &self.from_gpu,
        };
        slots
            .iter()
            .position(|s| !matches!(s, Slot::Fixed(Path::Mapping { threads: 1 })))
            .map_or(usize::MAX, |k| 1usize << k)
    }

    /// Runs one copy of `len` bytes in `dir` with `copy`, on the path its class's contest picks.
    /// [`write`](Self::write) and [`read`](Self::read) are this with [`write_on`] and
    /// [`read_on`]; memory that is a [`DeviceMapped`] needs nothing else. `copy` is called
    /// once, with the path to take, and whatever it returns is returned.
    #[inline]
    pub fn copy_with<E>(
        &self,
        dir: Direction,
        len: usize,
        mut copy: impl FnMut(Path) -> Result<(), E>,
    ) -> Result<(), E> {
        let contest = match self.slot(dir, len) {
            Slot::Fixed(p) => return copy(*p),
            Slot::Contested(c) => c,
        };
        let class_size = 1usize << class_of(len);
        match contest.turn() {
            Turn::Plain(p) => copy(p),
            turn @ (Turn::Timed(i) | Turn::Explore(i)) => {
                let explored = matches!(turn, Turn::Explore(_));
                contest.record(i, contest::now_ns(), len, class_size, explored);
                copy(contest.path(i))
            }
        }
    }

    /// Copies `src` into `dst` at `offset` on the fastest path for its size.
    pub fn write(
        &self,
        dst: &(impl DeviceMapped + ?Sized),
        offset: usize,
        src: &[u8],
    ) -> Result<(), BarError> {
        self.copy_with(Direction::ToGpu, src.len(), |p| {
            write_on(p, dst, offset, src)
        })
    }

    /// Copies `dst.len()` bytes at `offset` of `src` into `dst` on the fastest path.
    pub fn read(
        &self,
        src: &(impl DeviceMapped + ?Sized),
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), BarError> {
        let len = dst.len();
        self.copy_with(Direction::FromGpu, len, |p| read_on(p, src, offset, dst))
    }
}

/// Whether `path` can contend at run time: the copy engine and the one-thread mapping. A
/// multi-thread path's choice stays calibration's: timed at run time beside other work, its
/// periods do not hold (in copylat the copier rated 2 threads at 32 KiB slower than they ran,
/// and moved to one thread, which was slower still; docs/perf.md#how-the-auto-copier-chooses).
pub fn can_contend(path: Path) -> bool {
    matches!(path, Path::CopyEngine | Path::Mapping { threads: 1 })
}

/// The paths that contend in class `k` of `dir`: `chosen` first, then every other path that
/// calibration rated (lowest of its medians at `2^k`) within [`contest::CONTEND_WITHIN`] of
/// it, fastest first, each with its rating; only paths that [`can_contend`]. Classes past the
/// largest measured size take the largest one's paths at ratings scaled by the size. Without
/// a rating for `chosen` (a calibration made by hand) only `chosen` runs.
pub fn contenders(points: &[Point], dir: Direction, k: usize, chosen: Path) -> Vec<(Path, f64)> {
    if !can_contend(chosen) {
        return vec![(chosen, 0.0)];
    }
    let measured = points
        .iter()
        .filter(|p| p.direction == dir && p.size <= 1 << k)
        .map(|p| p.size)
        .max();
    let Some(size) = measured else {
        return vec![(chosen, 0.0)];
    };
    let scale = (1usize << k) as f64 / size as f64;
    let mut rated: Vec<(Path, f64)> = Vec::new();
    for p in points
        .iter()
        .filter(|p| p.direction == dir && p.size == size)
    {
        let us = p.median_us * scale;
        match rated.iter_mut().find(|r| r.0 == p.path) {
            Some(r) => r.1 = r.1.min(us),
            None => rated.push((p.path, us)),
        }
    }
    let Some(&(_, base)) = rated.iter().find(|r| r.0 == chosen) else {
        return vec![(chosen, 0.0)];
    };
    let mut others: Vec<(Path, f64)> = rated
        .into_iter()
        .filter(|r| r.0 != chosen && can_contend(r.0) && r.1 <= base * contest::CONTEND_WITHIN)
        .collect();
    others.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = vec![(chosen, base)];
    out.extend(others);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_preferred_cache_is_used_silently() {
        let t = tempfile::tempdir().unwrap();
        let pref = t.path().join("home/.cache/gdr");
        let d = CacheDirs::choose(Some(pref.clone()), t.path().join("tmp/gdr-cache"));
        assert_eq!(d.write.as_ref(), Some(&pref));
        assert_eq!(d.read, std::slice::from_ref(&pref));
        assert_eq!(d.note, None);
        assert!(pref.is_dir());
    }

    #[test]
    fn an_unwritable_or_absent_home_falls_back_to_the_temporary_directory_and_says_so() {
        let t = tempfile::tempdir().unwrap();
        // A "home" that is a file: nothing can be made under it, root or not (a read-only
        // mount would do the same, but tests run as root, which writes anywhere else).
        let home = t.path().join("home");
        std::fs::write(&home, "").unwrap();
        let pref = home.join(".cache/gdr");
        let fallback = t.path().join("tmp/gdr-cache-1000");
        let d = CacheDirs::choose(Some(pref.clone()), fallback.clone());
        assert_eq!(d.write.as_ref(), Some(&fallback));
        assert_eq!(d.read, [pref.clone(), fallback.clone()]);
        let note = d.note.unwrap();
        assert!(
            note.starts_with(&format!(
                "the calibration cache {} cannot be written (",
                pref.display()
            )) && note.contains(&format!(
                "; caching calibrations in {} instead",
                fallback.display()
            )),
            "{note}"
        );

        let none = CacheDirs::choose(None, fallback.clone());
        assert_eq!(none.write.as_ref(), Some(&fallback));
        assert!(none
            .note
            .unwrap()
            .starts_with("no calibration cache directory (GDR_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); caching calibrations in"));

        // Neither: no cache, and the note says each process measures its own.
        let nowhere = CacheDirs::choose(Some(pref), home.join("tmp"));
        assert_eq!(nowhere.write, None);
        let note = nowhere.note.unwrap();
        assert!(
            note.contains("calibrations are not kept, so each process measures its own"),
            "{note}"
        );
    }

    #[test]
    fn the_cache_note_is_given_once() {
        let _ = cache_dirs();
        let first = take_cache_note();
        assert_eq!(take_cache_note(), None);
        assert_eq!(first.is_some(), cache_dirs().note.is_some());
    }

    #[test]
    fn size_classes_are_floor_log2() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(2), 1);
        assert_eq!(class_of(3), 1);
        assert_eq!(class_of(4096), 12);
        assert_eq!(class_of(8191), 12);
        assert_eq!(class_of(256 << 20), 28);
        assert_eq!(class_of(usize::MAX), CLASSES - 1);
    }

    #[test]
    fn paths_run_on_as_many_threads_as_the_copy_is_split_into() {
        let x = |t| Path::Mapping { threads: t };
        assert_eq!(x(8).runs_as(32 << 10), x(2));
        assert_eq!(x(8).runs_as(64 << 10), x(4));
        assert_eq!(x(8).runs_as(1 << 20), x(8));
        assert_eq!(x(4).runs_as(8 << 10), x(1));
        assert_eq!(Path::CopyEngine.runs_as(1), Path::CopyEngine);
        assert!(x(2).is_distinct_at(32 << 10));
        assert!(!x(4).is_distinct_at(32 << 10));
        assert!(x(1).is_distinct_at(1));
    }

    #[test]
    fn the_path_with_the_lowest_of_its_two_medians_is_chosen() {
        let x = |t| Path::Mapping { threads: t };
        let ce = Path::CopyEngine;
        // The same winner in both passes.
        assert_eq!(
            choose(&[(x(1), 2.0), (x(2), 1.8), (ce, 13.0)], &[2.1, 1.7, 12.0]),
            x(2)
        );
        // A slow spell in the first pass (the copy engine at 3.6x) does not decide...
        assert_eq!(
            choose(&[(x(8), 1800.0), (ce, 2030.0)], &[1790.0, 560.0]),
            ce
        );
        // ...nor one in the second pass.
        assert_eq!(choose(&[(x(1), 4.4), (ce, 8.7)], &[10.3, 8.6]), x(1));
        // A lone path.
        assert_eq!(choose(&[(x(1), 0.2)], &[0.2]), x(1));
    }

    fn point(direction: Direction, size: usize, path: Path, median_us: f64) -> Point {
        Point {
            direction,
            size,
            path,
            median_us,
        }
    }

    #[test]
    fn near_tied_paths_contend_and_far_ones_do_not() {
        let x = |t| Path::Mapping { threads: t };
        let ce = Path::CopyEngine;
        let d = Direction::FromGpu;
        let points = vec![
            // First pass, then second; each path is rated by its lower median.
            point(d, 8192, x(1), 9.0),
            point(d, 8192, ce, 11.0),
            point(d, 8192, x(1), 8.4),
            point(d, 8192, ce, 9.2),
            point(d, 16384, x(1), 17.0),
            point(d, 16384, ce, 10.0),
            point(Direction::ToGpu, 8192, ce, 8.5),
        ];
        assert_eq!(
            contenders(&points, d, 13, x(1)),
            vec![(x(1), 8.4), (ce, 9.2)]
        );
        // 17 us is 1.7x the copy engine: no contest.
        assert_eq!(contenders(&points, d, 14, ce), vec![(ce, 10.0)]);
        // Past the largest measured size: its paths, ratings scaled by the size.
        assert_eq!(contenders(&points, d, 16, ce), vec![(ce, 40.0)]);
        // Calibration's choice comes first even when not rated fastest.
        assert_eq!(contenders(&points, d, 13, ce), vec![(ce, 9.2), (x(1), 8.4)]);
        // Multi-thread paths keep calibration's choice: they neither contend nor are contended.
        let with_threads = [
            points.clone(),
            vec![point(d, 8192, x(2), 8.3), point(d, 8192, x(4), 8.0)],
        ]
        .concat();
        assert_eq!(
            contenders(&with_threads, d, 13, x(1)),
            vec![(x(1), 8.4), (ce, 9.2)]
        );
        assert_eq!(contenders(&with_threads, d, 13, x(4)), vec![(x(4), 0.0)]);
        // A choice without a rating (made by hand) runs alone.
        assert_eq!(contenders(&points, d, 13, x(4)), vec![(x(4), 0.0)]);
        assert_eq!(contenders(&[], d, 13, ce), vec![(ce, 0.0)]);
    }

    #[test]
    fn a_fixed_copier_keeps_calibrations_choice() {
        let x1 = Path::Mapping { threads: 1 };
        let d = Direction::FromGpu;
        let cal = Calibration {
            key: "k".into(),
            to_gpu: vec![x1; CLASSES],
            from_gpu: vec![x1; CLASSES],
            points: vec![
                point(d, 8192, x1, 8.4),
                point(d, 8192, Path::CopyEngine, 9.2),
            ],
        };
        let adaptive = AutoCopier::from_calibration(cal.clone());
        assert_eq!(adaptive.contest(d, 8192).map(|c| c.paths().len()), Some(2));
        // A class with one path is fixed: never timed.
        assert!(adaptive.contest(d, 4096).is_none());
        assert_eq!(adaptive.path_for(d, 4096), x1);
        let fixed = AutoCopier::fixed(cal);
        assert!(fixed.contest(d, 8192).is_none());
        assert_eq!(fixed.path_for(d, 8192), x1);
    }

    #[test]
    fn calibration_round_trips_through_json() {
        let cal = Calibration {
            key: "k".into(),
            to_gpu: vec![Path::Mapping { threads: 1 }; CLASSES],
            from_gpu: vec![Path::CopyEngine; CLASSES],
            points: vec![Point {
                direction: Direction::ToGpu,
                size: 8,
                path: Path::Mapping { threads: 4 },
                median_us: 0.1,
            }],
        };
        let back: Calibration =
            serde_json::from_str(&serde_json::to_string(&cal).unwrap()).unwrap();
        let c = AutoCopier::from_calibration(back);
        assert_eq!(
            c.path_for(Direction::ToGpu, 123),
            Path::Mapping { threads: 1 }
        );
        assert_eq!(c.path_for(Direction::FromGpu, 1 << 30), Path::CopyEngine);
        assert_eq!(c.calibration().points[0].path, Path::Mapping { threads: 4 });
    }
}
