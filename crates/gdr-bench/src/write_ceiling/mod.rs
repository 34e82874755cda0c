//! What caps CPU -> GPU writes through the mapping (`gdr storebw`).
//!
//! Every case writes the same number of bytes into the same GPU memory, timed interleaved
//! round by round ([`gdr::timing::time_interleaved`]), so the rows of one run compare:
//! - the **PCIe reference**: the copy engine (`cuMemcpyHtoD`) from page-locked host memory,
//!   which moves data in the GPU's own large read requests, and from pageable memory;
//! - gdr-mem's **library copy** (`copy_to_mapping_parallel_with`) at each ISA and thread count:
//!   what gdr's users get;
//! - **stores from registers** (no source to read): whatever caps these is on the way out of
//!   the core, not in reading the source;
//! - **store width** (16, 32, 64 bytes per instruction): write combining should make them equal;
//! - **half lines** (the first 32 bytes of every 64-byte line): each line then leaves as a
//!   partial write of half the bytes, so if bandwidth halves while lines per second stay, the
//!   cap is a count of writes, not of bytes;
//! - **orders**: each thread one block (the library's split), 4 KiB pages dealt round robin
//!   over the threads, and each block's pages last to first;
//! - **host memory** as the target of the same stores: the core's and the memory's side
//!   without PCIe;
//! - **one thread, prefetching its source** at several distances ahead and into L1, L2 or
//!   non-temporally, and loading it in 1 KiB groups before storing them, against the same loop
//!   without prefetching: whether a source that is not in cache is what slows one thread.
//!
//! The kernels are x86-64 (each case runs where its instructions exist; the others are left
//! out and named).

mod crew;
mod kernels;

pub use kernels::{Hint, Reads, Width, LINE};

use crew::Crew;
use gdr::copy::{self, Isa};
use gdr::cuda::{self, Context, DeviceMemory, HostBuffer};
use gdr::mem::MappedMemory;
use gdr::timing::{time_interleaved, Op, Summary};
use std::fmt;
use std::time::Duration;

/// The granule the cases deal to threads and the unit of [`Order::Interleaved`].
pub const PAGE: usize = 4096;

/// Where a case's stores go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Target {
    /// The GPU memory behind the mapping (over PCIe).
    Gpu,
    /// Ordinary host memory of the same size (no PCIe).
    Host,
}

/// What a store loop writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// A constant held in a register: no memory is read.
    Registers,
    /// A host buffer of the same size (fresh pseudo-random bytes), read as `reads` says.
    Buffer {
        /// How the loop reads its source.
        reads: Reads,
    },
}

/// How the bytes are dealt to threads and visited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Order {
    /// Each thread one contiguous block, first line to last (the library's split).
    Blocks,
    /// 4 KiB pages dealt round robin: thread i writes pages i, i + n, i + 2n, ...
    Interleaved,
    /// Each thread one block, its pages last to first (each page first line to last).
    PagesDescending,
}

/// One way of writing `size` bytes, timed beside the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Case {
    /// `cuMemcpyHtoD` from page-locked host memory.
    CopyEnginePinned,
    /// `cuMemcpyHtoD` from pageable host memory (the driver stages it).
    CopyEnginePageable,
    /// gdr-mem's parallel copy into the mapping, as gdr's copies run.
    Library {
        /// The kernel's instruction set.
        #[serde(serialize_with = "isa_name")]
        isa: Isa,
        /// Threads asked for.
        threads: usize,
    },
    /// An experiment store loop ([`kernels`](self)).
    Stores {
        /// Bytes per store instruction.
        width: Width,
        /// Only the first half of each 64-byte line.
        half_lines: bool,
        /// What is stored.
        source: Source,
        /// How threads share the bytes.
        order: Order,
        /// Threads.
        threads: usize,
        /// Where the stores go.
        target: Target,
    },
}

/// An [`Isa`] as its short name in JSON.
fn isa_name<S: serde::Serializer>(isa: &Isa, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(isa.name())
}

impl Case {
    /// Threads the case runs on (1 for the copy engine's: one calling thread).
    pub fn threads(&self) -> usize {
        match *self {
            Case::CopyEnginePinned | Case::CopyEnginePageable => 1,
            Case::Library { threads, .. } | Case::Stores { threads, .. } => threads,
        }
    }

    /// Bytes the case stores per byte of `size` (0.5 for half lines).
    pub fn payload_fraction(&self) -> f64 {
        match *self {
            Case::Stores {
                half_lines: true, ..
            } => 0.5,
            _ => 1.0,
        }
    }

    /// Why this CPU cannot run the case, if it cannot.
    pub fn unavailable(&self) -> Option<String> {
        match *self {
            Case::CopyEnginePinned | Case::CopyEnginePageable => None,
            Case::Library { isa, .. } => {
                (!isa.is_available()).then(|| format!("this CPU lacks {isa}"))
            }
            Case::Stores {
                width,
                half_lines,
                source,
                ..
            } => {
                if half_lines && width == Width::B64 {
                    Some("a 64-byte store cannot write half a line".into())
                } else if !width.is_available() {
                    Some(format!("this CPU lacks {}-byte stores", width.bytes()))
                } else if matches!(source, Source::Buffer { .. }) && !Width::B64.is_available() {
                    Some("the buffer loop needs AVX-512F".into())
                } else {
                    None
                }
            }
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Case::CopyEnginePinned => write!(f, "copy engine, pinned source"),
            Case::CopyEnginePageable => write!(f, "copy engine, pageable source"),
            Case::Library { isa, threads } => write!(f, "library copy {isa} x{threads}"),
            Case::Stores {
                width,
                half_lines,
                source,
                order,
                threads,
                target,
            } => {
                write!(f, "{}B stores", width.bytes())?;
                if half_lines {
                    write!(f, " half lines")?;
                }
                match source {
                    Source::Registers => write!(f, " from registers")?,
                    Source::Buffer {
                        reads: Reads::Prefetch { distance: 0, .. },
                    } => write!(f, " from a buffer")?,
                    Source::Buffer {
                        reads: Reads::Prefetch { distance, hint },
                    } => write!(f, " from a buffer, prefetch{} +{distance}", hint.name())?,
                    Source::Buffer {
                        reads: Reads::Staged,
                    } => write!(f, " from a buffer, 1 KiB groups")?,
                }
                match order {
                    Order::Blocks => {}
                    Order::Interleaved => write!(f, ", pages interleaved")?,
                    Order::PagesDescending => write!(f, ", pages descending")?,
                }
                write!(f, " x{threads}")?;
                if target == Target::Host {
                    write!(f, " to host memory")?;
                }
                Ok(())
            }
        }
    }
}

/// The experiment's cases for these thread counts (the largest of them runs the width, half-
/// line, order and host-memory variations).
pub fn cases(threads: &[usize]) -> Vec<Case> {
    // Each count once, ascending: a count given twice would time the same case twice.
    let mut threads = threads.to_vec();
    threads.sort_unstable();
    threads.dedup();
    let max = threads.last().copied().unwrap_or(1);
    let stores = |width, half_lines, source, order, threads, target| Case::Stores {
        width,
        half_lines,
        source,
        order,
        threads,
        target,
    };
    let regs = Source::Registers;
    let best = Isa::detected_store();
    let mut v = vec![Case::CopyEnginePinned, Case::CopyEnginePageable];
    for &t in &threads {
        v.push(Case::Library {
            isa: best,
            threads: t,
        });
    }
    for isa in [Isa::Sse2, Isa::Avx2] {
        if isa != best {
            v.push(Case::Library { isa, threads: max });
        }
    }
    // Stores from registers: each thread count, then the widths, half lines, orders and host
    // memory at the largest count (and host memory on one thread).
    let mut from_registers: Vec<(Width, bool, Order, usize, Target)> = threads
        .iter()
        .map(|&t| (Width::B64, false, Order::Blocks, t, Target::Gpu))
        .collect();
    from_registers.extend([
        (Width::B32, false, Order::Blocks, max, Target::Gpu),
        (Width::B16, false, Order::Blocks, max, Target::Gpu),
        (Width::B32, true, Order::Blocks, max, Target::Gpu),
        (Width::B64, false, Order::Interleaved, max, Target::Gpu),
        (Width::B64, false, Order::PagesDescending, max, Target::Gpu),
        (Width::B64, false, Order::Blocks, 1, Target::Host),
        (Width::B64, false, Order::Blocks, max, Target::Host),
    ]);
    for (width, half, order, t, target) in from_registers {
        v.push(stores(width, half, regs, order, t, target));
    }
    // A buffer read by plain loads (no prefetch ahead of them).
    let plain = Source::Buffer {
        reads: Reads::Prefetch {
            distance: 0,
            hint: Hint::T0,
        },
    };
    let reads = [
        (0, Hint::T0),
        (1024, Hint::T0),
        (4096, Hint::T0),
        (16384, Hint::T0),
        (4096, Hint::T2),
        (16384, Hint::T2),
        (1024, Hint::Nta),
        (4096, Hint::Nta),
    ]
    .map(|(distance, hint)| Reads::Prefetch { distance, hint })
    .into_iter()
    .chain([Reads::Staged]);
    for reads in reads {
        let src = Source::Buffer { reads };
        v.push(stores(
            Width::B64,
            false,
            src,
            Order::Blocks,
            1,
            Target::Gpu,
        ));
    }
    // The one-thread copy again, into host memory: what the core gets from an uncached source
    // with no PCIe write in the path (the floor under the one-thread copy to the GPU).
    v.push(stores(
        Width::B64,
        false,
        plain,
        Order::Blocks,
        1,
        Target::Host,
    ));
    v.dedup();
    v
}

/// One case at one size: bandwidth of the bytes stored, and 64-byte lines per microsecond
/// (the rate of writes, whatever each carries).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CeilingRow {
    /// The case's name (its `Display`).
    pub case: String,
    /// The case.
    pub detail: Case,
    /// Bytes of the region written (a half-line case stores half of them).
    pub size: usize,
    /// Bytes stored per second, in GB/s, at the median time.
    pub gbps: f64,
    /// The same at the fastest sample.
    pub gbps_best: f64,
    /// Lines (64 bytes of the region, whole or half written) per microsecond, at the median.
    pub lines_per_us: f64,
    /// Microseconds per call.
    pub us: Summary,
}

/// A case that could not run here, and why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Skipped {
    /// The case's name.
    pub case: String,
    /// Why.
    pub why: String,
}

/// The experiment's settings.
#[derive(Clone, Debug)]
pub struct CeilingConfig {
    /// Region sizes in bytes (each a multiple of [`PAGE`]).
    pub sizes: Vec<usize>,
    /// The cases, in the order rows are reported.
    pub cases: Vec<Case>,
    /// Time per case and size (at least 9 samples each).
    pub budget: Duration,
    /// At most this many samples per case and size.
    pub samples: usize,
}

/// Why the experiment stopped.
#[derive(Debug, thiserror::Error)]
pub enum CeilingError {
    /// A size that is 0, not a multiple of 4 KiB, or larger than the target memory.
    #[error("size {size}: must be a non-zero multiple of 4096 bytes, at most {max}")]
    Size {
        /// The size given.
        size: usize,
        /// The target's size.
        max: usize,
    },
    /// The target mapping is not aligned to a 64-byte line.
    #[error("the target mapping at {0:#x} is not 64-byte aligned")]
    Misaligned(usize),
    /// The driver refused something a copy-engine case needs (page-locked memory, a copy).
    #[error("copy engine: {0}")]
    Cuda(#[from] cuda::CudaError),
    /// A copy-engine case asked for without a CUDA context to run it in.
    #[error("copy-engine cases need a CUDA context")]
    NoContext,
}

/// A raw region the crew's threads write disjoint parts of.
#[derive(Clone, Copy)]
struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Region is an address range; the cases hand each thread a disjoint part of it and
// the memory outlives every thread (scoped threads, joined before `measure` returns).
unsafe impl Send for Region {}
// SAFETY: as Send: shared only to be split into disjoint parts.
unsafe impl Sync for Region {}

/// Calls `f(offset, len)` for the pieces thread `i` of `n` writes of a `len`-byte region (a
/// multiple of [`PAGE`]), in the order it writes them.
pub fn for_each_piece(
    order: Order,
    len: usize,
    i: usize,
    n: usize,
    mut f: impl FnMut(usize, usize),
) {
    let pages = len / PAGE;
    let (first, end) = (pages * i / n, pages * (i + 1) / n);
    match order {
        Order::Blocks if end > first => f(first * PAGE, (end - first) * PAGE),
        Order::Blocks => {}
        Order::Interleaved => (i..pages).step_by(n).for_each(|p| f(p * PAGE, PAGE)),
        Order::PagesDescending => (first..end).rev().for_each(|p| f(p * PAGE, PAGE)),
    }
}

/// Runs the experiment: every case that can run here at every size, into `gpu` (and host
/// memory of the same size for [`Target::Host`]). `ctx` runs the copy-engine cases; `gpu` must
/// then be device memory of that context (`DeviceMemory` of the mapped buffer).
///
/// The region's bytes are overwritten; after the run they hold whatever case ran last.
pub fn measure<M: MappedMemory + DeviceMemory>(
    ctx: Option<&Context>,
    gpu: &M,
    cfg: &CeilingConfig,
) -> Result<(Vec<CeilingRow>, Vec<Skipped>), CeilingError> {
    let max = cfg.sizes.iter().copied().max().unwrap_or(0);
    for &size in &cfg.sizes {
        if size == 0 || !size.is_multiple_of(PAGE) || size > gpu.size().min(DeviceMemory::len(gpu))
        {
            return Err(CeilingError::Size {
                size,
                max: gpu.size(),
            });
        }
    }
    if !(gpu.cpu_ptr() as usize).is_multiple_of(LINE) {
        return Err(CeilingError::Misaligned(gpu.cpu_ptr() as usize));
    }
    let mut skipped = Vec::new();
    let mut runnable = Vec::new();
    for c in &cfg.cases {
        let why = match c {
            Case::CopyEnginePinned | Case::CopyEnginePageable if ctx.is_none() => {
                Some("no CUDA context".to_string())
            }
            _ => c.unavailable(),
        };
        match why {
            Some(why) => skipped.push(Skipped {
                case: c.to_string(),
                why,
            }),
            None => runnable.push(*c),
        }
    }
    // Sources: a page-aligned pageable buffer of fresh bytes, a pinned one for the copy
    // engine, and host memory as a store target.
    let mut source = vec![0u8; max + PAGE];
    let skew = source.as_ptr().align_offset(PAGE);
    let source = &mut source[skew..skew + max];
    // Fresh bytes each run: no page of zeros the memory system could treat specially.
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), source);
    let needs_host_target = runnable.iter().any(|c| {
        matches!(
            c,
            Case::Stores {
                target: Target::Host,
                ..
            }
        )
    });
    let mut host_target = vec![0u8; if needs_host_target { max + PAGE } else { 0 }];
    let host_region = if needs_host_target {
        let skew = host_target.as_ptr().align_offset(PAGE);
        Region {
            // SAFETY: skew < PAGE and the vector holds max + PAGE bytes.
            ptr: unsafe { host_target.as_mut_ptr().add(skew) },
            len: max,
        }
    } else {
        Region {
            ptr: std::ptr::null_mut(),
            len: 0,
        }
    };
    let pinned = match ctx {
        Some(ctx) if runnable.contains(&Case::CopyEnginePinned) => {
            let mut p = HostBuffer::new(ctx, max)?;
            p.as_mut_slice().copy_from_slice(source);
            Some(p)
        }
        _ => None,
    };
    if let Some(ctx) = ctx {
        ctx.bind()?;
    }
    let gpu_region = Region {
        ptr: gpu.cpu_ptr(),
        len: gpu.size(),
    };
    let source: &[u8] = source;
    let src_region = Region {
        ptr: source.as_ptr().cast_mut(),
        len: source.len(),
    };
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let samples = std::thread::scope(|scope| -> Result<Vec<Vec<f64>>, CeilingError> {
            let mut crews: Vec<Option<Crew<'_>>> = Vec::new();
            for c in &runnable {
                crews.push(match *c {
                    Case::Stores {
                        width,
                        half_lines,
                        source: src,
                        order,
                        threads,
                        target,
                    } if threads > 1 => {
                        let dst = if target == Target::Gpu {
                            gpu_region
                        } else {
                            host_region
                        };
                        Some(Crew::spawn(scope, threads, move |i, n| {
                            // SAFETY: each thread writes its own pieces of the first `size`
                            // bytes of dst (checked <= its length), which outlives the scope.
                            unsafe {
                                run_stores(
                                    dst, src_region, size, width, half_lines, src, order, i, n,
                                )
                            }
                        }))
                    }
                    _ => None,
                });
            }
            let mut ops: Vec<Op<'_, CeilingError>> = Vec::new();
            for (c, crew) in runnable.iter().zip(&crews) {
                let c = *c;
                let op: Op<'_, CeilingError> = match (c, crew) {
                    (_, Some(crew)) => Box::new(move || {
                        crew.run();
                        Ok(())
                    }),
                    (Case::CopyEnginePinned, None) => {
                        let p = pinned.as_ref().ok_or(CeilingError::NoContext)?;
                        Box::new(move || Ok(cuda::memcpy_htod(gpu, 0, &p.as_slice()[..size])?))
                    }
                    (Case::CopyEnginePageable, None) => {
                        Box::new(move || Ok(cuda::memcpy_htod(gpu, 0, &source[..size])?))
                    }
                    (Case::Library { isa, threads }, None) => Box::new(move || {
                        // SAFETY: the first `size` bytes of the mapping (checked above); no
                        // one else touches them during the run.
                        unsafe {
                            copy::copy_to_mapping_parallel_with(
                                isa,
                                gpu_region.ptr,
                                &source[..size],
                                threads,
                            )
                        }
                        .expect("the ISA was checked available");
                        Ok(())
                    }),
                    (
                        Case::Stores {
                            width,
                            half_lines,
                            source: src,
                            order,
                            target,
                            ..
                        },
                        None,
                    ) => {
                        let dst = if target == Target::Gpu {
                            gpu_region
                        } else {
                            host_region
                        };
                        Box::new(move || {
                            // SAFETY: as the crew's job, on this one thread.
                            unsafe {
                                run_stores(
                                    dst, src_region, size, width, half_lines, src, order, 0, 1,
                                )
                            };
                            Ok(())
                        })
                    }
                };
                ops.push(op);
            }
            // time_interleaved shares its budget among the ops: each case gets `cfg.budget`.
            let budget = cfg
                .budget
                .saturating_mul(u32::try_from(ops.len()).unwrap_or(u32::MAX));
            let out = time_interleaved(&mut ops, cfg.samples, Duration::from_millis(1), budget);
            drop(ops);
            drop(crews);
            out
        })?;
        for (c, mut s) in runnable.iter().zip(samples) {
            let us = Summary::of(&mut s);
            let bytes = size as f64 * c.payload_fraction();
            rows.push(CeilingRow {
                case: c.to_string(),
                detail: *c,
                size,
                gbps: bytes / us.median / 1e3,
                gbps_best: bytes / us.min / 1e3,
                lines_per_us: (size / LINE) as f64 / us.median,
                us,
            });
        }
    }
    drop(host_target);
    Ok((rows, skipped))
}

/// One thread's share of a store case.
///
/// # Safety
/// `dst` and `src` cover at least `size` bytes (a multiple of [`PAGE`]), `dst` page aligned;
/// no one else writes this thread's pieces meanwhile; the case's instructions exist here.
#[allow(clippy::too_many_arguments)]
unsafe fn run_stores(
    dst: Region,
    src: Region,
    size: usize,
    width: Width,
    half: bool,
    source: Source,
    order: Order,
    i: usize,
    n: usize,
) {
    debug_assert!(size <= dst.len);
    for_each_piece(order, size, i, n, |off, len| match source {
        // SAFETY: [off, off + len) lies in the first `size` bytes of dst (and of src), page
        // aligned; the caller vouches for the rest.
        Source::Registers => unsafe { kernels::fill(dst.ptr.add(off), len, width, half, 0xA5) },
        // SAFETY: as above.
        Source::Buffer { reads } => unsafe {
            kernels::copy(dst.ptr.add(off), src.ptr.add(off), len, reads)
        },
    });
}

#[cfg(test)]
mod tests;
