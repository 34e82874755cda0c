//! Large copies split over several CPU threads.
//!
//! One thread tops out well below what PCIe carries: more threads keep more write-combining
//! lines (and, for reads, more streaming loads) in flight (`gdr copybw` times each thread
//! count: docs/perf.md). A copy is cut into contiguous parts on 64-byte (large parts: 4 KiB)
//! boundaries of the mapping side, and each part is copied by the single-thread kernel, which
//! ends with its own fence. Copies of a MiB and more get several parts per thread, so a thread
//! that is descheduled mid-copy delays one small part rather than its whole share.
//!
//! The threads come from one persistent pool, created lazily and grown to the largest count asked
//! for, so that a copy of tens of KiB, short in itself, does not pay for spawning threads. The
//! calling thread works too. After a job, workers spin for a short while ([`WORKER_SPIN`])
//! watching for the next one, then park. Parts are claimed dynamically, so a worker that wakes
//! late simply finds nothing left: a parked pool never makes a copy slower than one thread by
//! more than the wake-up calls.
//!
//! Ordering: the caller publishes a job with one release store of the `claim` word (generation,
//! part count, next part). A worker takes a part with a compare-exchange on that word that checks
//! the generation, so it can never take a part of a later job with an earlier job's pointers; the
//! job's fields are read only after a part was taken, and they cannot change before that part is
//! done. Each finished part bumps `done` with release after its kernel's fence; the caller returns
//! once it reads `done == parts` with acquire, so every byte is written (and visible) by then.
//! Concurrent callers take turns on the pool.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use super::{load_kernel, store_kernel, CopyError, Isa, Kernel};

/// The most threads one parallel copy uses (larger requests are clamped to it).
pub const PARALLEL_MAX_THREADS: usize = 64;

/// The smallest part worth a thread: a copy gets at most `len / PARALLEL_MIN_PART` threads, so
/// anything under twice this size runs on the calling thread alone.
pub const PARALLEL_MIN_PART: usize = 16 * 1024;

/// How long an idle worker keeps watching for the next job before parking.
pub const WORKER_SPIN: Duration = Duration::from_micros(50);

/// Parts at least this large are cut on 4 KiB boundaries instead of 64-byte ones.
const PAGE_SPLIT_MIN: usize = 256 * 1024;

/// Copies `src` into a mapping at `dst` using up to `threads` threads (the caller included); see
/// [`super::copy_to_mapping`]. `threads` of 0 means 1; small copies use fewer threads than asked.
/// Returns when every part is written and fenced.
///
/// # Safety
/// As [`super::copy_to_mapping`].
pub unsafe fn copy_to_mapping_parallel(dst: *mut u8, src: &[u8], threads: usize) {
    // SAFETY: the caller's contract; the detected ISA is available.
    unsafe {
        run(
            Direction::ToMapping,
            Isa::detected_store(),
            dst,
            src.as_ptr(),
            src.len(),
            threads,
        )
    }
}

/// Copies from a mapping at `src` into `dst` using up to `threads` threads (the caller
/// included); see [`super::copy_from_mapping`]. `threads` of 0 means 1.
///
/// # Safety
/// As [`super::copy_from_mapping`].
pub unsafe fn copy_from_mapping_parallel(dst: &mut [u8], src: *const u8, threads: usize) {
    let len = dst.len();
    // SAFETY: the caller's contract; the detected ISA is available.
    unsafe {
        run(
            Direction::FromMapping,
            Isa::detected_load(),
            dst.as_mut_ptr(),
            src,
            len,
            threads,
        )
    }
}

/// [`copy_to_mapping_parallel`] with an explicit ISA.
///
/// # Errors
/// [`CopyError::Unsupported`] when this CPU lacks `isa`; nothing is written then.
///
/// # Safety
/// As [`super::copy_to_mapping`].
pub unsafe fn copy_to_mapping_parallel_with(
    isa: Isa,
    dst: *mut u8,
    src: &[u8],
    threads: usize,
) -> Result<(), CopyError> {
    let isa = isa.require()?;
    // SAFETY: the caller's contract; `require` checked the ISA.
    unsafe {
        run(
            Direction::ToMapping,
            isa,
            dst,
            src.as_ptr(),
            src.len(),
            threads,
        )
    };
    Ok(())
}

/// [`copy_from_mapping_parallel`] with an explicit ISA.
///
/// # Errors
/// [`CopyError::Unsupported`] when this CPU lacks `isa`; nothing is read then.
///
/// # Safety
/// As [`super::copy_from_mapping`].
pub unsafe fn copy_from_mapping_parallel_with(
    isa: Isa,
    dst: &mut [u8],
    src: *const u8,
    threads: usize,
) -> Result<(), CopyError> {
    let isa = isa.require()?;
    let len = dst.len();
    // SAFETY: the caller's contract; `require` checked the ISA.
    unsafe {
        run(
            Direction::FromMapping,
            isa,
            dst.as_mut_ptr(),
            src,
            len,
            threads,
        )
    };
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Direction {
    ToMapping,
    FromMapping,
}

impl Direction {
    fn kernel(self, isa: Isa) -> Kernel {
        match self {
            Direction::ToMapping => store_kernel(isa),
            Direction::FromMapping => load_kernel(isa),
        }
    }
}

/// How many parts (threads) a copy of `len` bytes gets when `threads` are asked for: at most
/// `len / PARALLEL_MIN_PART`, so e.g. a 32 KiB copy runs on 2 threads whether 2 or 8 are asked.
pub fn part_count(len: usize, threads: usize) -> usize {
    threads
        .clamp(1, PARALLEL_MAX_THREADS)
        .min(len / PARALLEL_MIN_PART)
        .max(1)
}

/// The byte range of part `i` of `parts`: cut points near `i * len / parts`, rounded down to
/// `grain` in terms of the mapping-side address `map`, so the parts tile [0, len) in order.
pub(super) fn part_range(
    map: usize,
    len: usize,
    parts: usize,
    grain: usize,
    i: usize,
) -> (usize, usize) {
    let cut = |k: usize| -> usize {
        if k == 0 {
            0
        } else if k >= parts {
            len
        } else {
            // k < parts, so k * (len / parts) + ... <= len; computed without overflow.
            let nominal = (len / parts) * k + (len % parts) * k / parts;
            let aligned = (map + nominal) & !(grain - 1);
            aligned.saturating_sub(map).min(len)
        }
    };
    (cut(i), cut(i + 1))
}

/// Runs one copy: alone when small, otherwise on the pool.
///
/// # Safety
/// The contract of the direction's single-thread routine; `isa` is available.
unsafe fn run(dir: Direction, isa: Isa, dst: *mut u8, src: *const u8, len: usize, threads: usize) {
    let threads = part_count(len, threads);
    if threads == 1 {
        // SAFETY: forwarded from the caller.
        unsafe { dir.kernel(isa)(dst, src, len) };
        return;
    }
    let map = match dir {
        Direction::ToMapping => dst as usize,
        Direction::FromMapping => src as usize,
    };
    // Large copies get several parts per thread, claimed as threads come free: a worker whose
    // vCPU the host takes away mid-copy then delays one small part, not a 1/threads share (on
    // a VM, equal shares made the rate of large copies swing from run to run).
    let parts = (threads * PARTS_PER_THREAD)
        .min(len / BALANCE_MIN_PART)
        .max(threads);
    let grain = if len / parts >= PAGE_SPLIT_MIN {
        4096
    } else {
        64
    };
    let job = Job {
        dir,
        isa,
        dst: dst as usize,
        src: src as usize,
        len,
        map,
        grain,
    };
    pool().run(job, parts, threads);
}

/// Parts per thread for copies large enough to balance (see `run`).
const PARTS_PER_THREAD: usize = 4;
/// Smallest part when balancing: claiming a part must cost nothing against copying it.
const BALANCE_MIN_PART: usize = 256 << 10;

/// One copy as the workers see it (addresses as integers, so that it can cross threads).
#[derive(Clone, Copy, Debug)]
struct Job {
    dir: Direction,
    isa: Isa,
    dst: usize,
    src: usize,
    len: usize,
    map: usize,
    grain: usize,
}

impl Job {
    /// Copies part `i` of `parts`.
    ///
    /// # Safety
    /// The job's copy contract holds (it is still running: part `i` is not done).
    unsafe fn run_part(&self, parts: usize, i: usize) {
        let (lo, hi) = part_range(self.map, self.len, parts, self.grain, i);
        let kernel = self.dir.kernel(self.isa);
        // SAFETY: [lo, hi) is inside [0, len), so both sub-ranges are inside the caller's ranges
        // (and the mapping side's covering lines are among the whole copy's); the ISA was checked
        // before the job was published.
        unsafe {
            kernel(
                (self.dst + lo) as *mut u8,
                (self.src + lo) as *const u8,
                hi - lo,
            )
        }
    }
}

/// The `claim` word: generation (32 bits) | part count (16) | next unclaimed part (16).
fn pack(generation: u32, parts: usize, next: usize) -> u64 {
    (u64::from(generation) << 32) | ((parts as u64) << 16) | next as u64
}

fn generation_of(claim: u64) -> u32 {
    (claim >> 32) as u32
}

/// State shared with the workers.
struct Shared {
    claim: AtomicU64,
    done: AtomicUsize,
    // The job, written by the caller before the release store of `claim`.
    dir: AtomicUsize,
    isa: AtomicUsize,
    dst: AtomicUsize,
    src: AtomicUsize,
    len: AtomicUsize,
    map: AtomicUsize,
    grain: AtomicUsize,
}

impl Shared {
    /// Claims and copies parts of job `generation` until none are left. Returns how many it did.
    fn work(&self, generation: u32) -> usize {
        let mut did = 0;
        loop {
            let claim = self.claim.load(Ordering::Acquire);
            let parts = ((claim >> 16) & 0xffff) as usize;
            let next = (claim & 0xffff) as usize;
            if generation_of(claim) != generation || next >= parts {
                return did;
            }
            if self
                .claim
                .compare_exchange_weak(claim, claim + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // Part `next` of this generation is ours: the job cannot finish (and its fields cannot
            // be replaced) until we bump `done`, and the acquire above saw the fields' writes.
            let job = self.job();
            // SAFETY: the job's caller is blocked until this part is done, so its contract holds.
            unsafe { job.run_part(parts, next) };
            self.done.fetch_add(1, Ordering::Release);
            did += 1;
        }
    }

    fn job(&self) -> Job {
        let isa = Isa::ALL[self.isa.load(Ordering::Relaxed)];
        let dir = if self.dir.load(Ordering::Relaxed) == 0 {
            Direction::ToMapping
        } else {
            Direction::FromMapping
        };
        Job {
            dir,
            isa,
            dst: self.dst.load(Ordering::Relaxed),
            src: self.src.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            map: self.map.load(Ordering::Relaxed),
            grain: self.grain.load(Ordering::Relaxed),
        }
    }
}

/// A pool worker as the caller sees it.
struct Worker {
    /// Set by the worker just before it parks; the caller unparks it when it finds this set.
    parked: Arc<AtomicBool>,
    thread: Thread,
}

/// The worker list and the job generation; holding the lock means owning the pool for one job.
struct Crew {
    workers: Vec<Worker>,
    generation: u32,
}

struct Pool {
    shared: &'static Shared,
    crew: Mutex<Crew>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            claim: AtomicU64::new(pack(0, 0, 0)),
            done: AtomicUsize::new(0),
            dir: AtomicUsize::new(0),
            isa: AtomicUsize::new(0),
            dst: AtomicUsize::new(0),
            src: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            map: AtomicUsize::new(0),
            grain: AtomicUsize::new(64),
        }));
        Pool {
            shared,
            crew: Mutex::new(Crew {
                workers: Vec::new(),
                generation: 0,
            }),
        }
    })
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Crew> {
        // A panic while holding the lock cannot leave the crew inconsistent (no copy kernel
        // panics, and the worker list only grows), so a poisoned lock is still usable.
        self.crew
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `job` cut into `parts` parts (at least `threads`) on the caller and `threads - 1`
    /// workers; returns when all parts are done.
    fn run(&self, job: Job, parts: usize, threads: usize) {
        debug_assert!(parts >= threads && parts < 1 << 16);
        let mut crew = self.lock();
        self.grow(&mut crew, threads - 1);
        crew.generation = crew.generation.wrapping_add(1);
        let generation = crew.generation;
        let s = self.shared;
        s.dir.store(
            usize::from(job.dir == Direction::FromMapping),
            Ordering::Relaxed,
        );
        s.isa.store(
            Isa::ALL.iter().position(|i| *i == job.isa).unwrap_or(0),
            Ordering::Relaxed,
        );
        s.dst.store(job.dst, Ordering::Relaxed);
        s.src.store(job.src, Ordering::Relaxed);
        s.len.store(job.len, Ordering::Relaxed);
        s.map.store(job.map, Ordering::Relaxed);
        s.grain.store(job.grain, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        // SeqCst: pairs with the worker's store of `parked` then load of `claim` (see
        // `worker_main`), so either the worker sees this job or we see it parked.
        s.claim.store(pack(generation, parts, 0), Ordering::SeqCst);
        for worker in crew.workers.iter().take(threads - 1) {
            if worker.parked.swap(false, Ordering::SeqCst) {
                worker.thread.unpark();
            }
        }
        s.work(generation);
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < parts {
            spins = spins.wrapping_add(1);
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        drop(crew);
    }

    /// Starts workers until there are `want` (fewer if the OS refuses threads; the caller then
    /// does their parts itself).
    fn grow(&self, crew: &mut Crew, want: usize) {
        while crew.workers.len() < want {
            let parked = Arc::new(AtomicBool::new(false));
            let shared = self.shared;
            let flag = Arc::clone(&parked);
            let seen = generation_of(shared.claim.load(Ordering::Acquire));
            let spawned = thread::Builder::new()
                .name(format!("gdr-copy-{}", crew.workers.len()))
                .stack_size(64 * 1024)
                .spawn(move || worker_main(shared, &flag, seen));
            match spawned {
                Ok(handle) => crew.workers.push(Worker {
                    parked,
                    thread: handle.thread().clone(),
                }),
                Err(_) => return,
            }
        }
    }
}

/// A worker: wait for a new generation (spin, then park), take parts of it, repeat forever.
fn worker_main(shared: &'static Shared, parked: &AtomicBool, mut seen: u32) {
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            let generation = generation_of(shared.claim.load(Ordering::Acquire));
            if generation != seen {
                break generation;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || started.elapsed() < WORKER_SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Announce, then look once more: with SeqCst on both sides the caller either sees
            // `parked` (and unparks us) or we see its new generation here. A stray unpark token
            // only makes one later park return early, and the loop looks again.
            parked.store(true, Ordering::SeqCst);
            if generation_of(shared.claim.load(Ordering::SeqCst)) == seen {
                thread::park();
            }
            parked.store(false, Ordering::SeqCst);
        };
        seen = generation;
        shared.work(generation);
    }
}
