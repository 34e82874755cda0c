//! `gdr sanity`: data validation through the CPU mapping against cuMemcpy.
//!
//! Every check uses fresh random data and poisoned destinations with guard bytes on both sides,
//! so a short, long or misplaced copy is caught, not only a wrong byte.

use super::gpu::{self, GpuArg};
use super::CmdResult;
use gdr::bar::auto::AutoCopier;
use gdr::bar::{BarError, MappedBuffer, VulkanBackend};
use gdr::cuda;
use gdr::mem::{AccessError, MappedMemory};
use rand::{Rng, RngCore};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
pub struct SanityArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
    /// Stop at the first failing check
    #[arg(long)]
    pub fail_fast: bool,
}

/// Sizes checked: 1 B .. 1 MiB, powers of two and their odd neighbours.
const SIZES: &[usize] = &[
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    15,
    16,
    17,
    31,
    32,
    33,
    63,
    64,
    65,
    127,
    128,
    129,
    255,
    256,
    257,
    1000,
    4095,
    4096,
    4097,
    65_535,
    65_536,
    65_537,
    262_143,
    1 << 20,
];
const GUARD: usize = 64;
const POISON_GPU: u8 = 0xA5;
const POISON_CPU: u8 = 0xEE;

#[derive(Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    pub ms: f64,
}

#[derive(Serialize, Default)]
pub struct SanityReport {
    pub checks: Vec<Check>,
    pub passed: usize,
    pub failed: usize,
}

type CheckResult = Result<String, String>;

struct Runner {
    report: SanityReport,
    json: bool,
    /// Print failures only (for `gdr check`).
    quiet: bool,
    fail_fast: bool,
}

impl Runner {
    fn check(&mut self, name: String, f: impl FnOnce() -> CheckResult) -> bool {
        if self.fail_fast && self.report.failed > 0 {
            return false;
        }
        let t = Instant::now();
        let r = f();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let ok = r.is_ok();
        let detail = r.unwrap_or_else(|e| e);
        if !(self.json || self.quiet && ok) {
            println!(
                "{} {name}{}{detail}",
                if ok { "PASS" } else { "FAIL" },
                if detail.is_empty() { "" } else { ": " }
            );
        }
        if ok {
            self.report.passed += 1;
        } else {
            self.report.failed += 1;
        }
        self.report.checks.push(Check {
            name,
            ok,
            detail,
            ms,
        });
        ok
    }
}

fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

fn e2s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// First differing index of two equal-length slices, for messages.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn verify_guarded(out: &[u8], at: usize, want: &[u8], poison: u8) -> Result<(), String> {
    if let Some(i) = out[..at].iter().position(|&b| b != poison) {
        return Err(format!("byte {i} before the destination was overwritten"));
    }
    if let Some(i) = first_diff(&out[at..at + want.len()], want) {
        return Err(format!("byte {i} of {} differs", want.len()));
    }
    if let Some(i) = out[at + want.len()..].iter().position(|&b| b != poison) {
        return Err(format!("byte {i} after the destination was overwritten"));
    }
    Ok(())
}

/// CPU -> GPU through the mapping at every destination offset 0..63 (and, interleaved, every
/// source offset 0..63), read back with cuMemcpyDtoH.
fn to_gpu_offsets(be: &VulkanBackend, size: usize) -> CheckResult {
    let buf = be.alloc(size + 2 * GUARD, 64).map_err(e2s)?;
    let src = random(size + GUARD);
    let mut out = vec![0u8; buf.len()];
    for d in 0..64 {
        let s = (d * 37 + size) % 64;
        cuda::memset(&buf, POISON_GPU).map_err(e2s)?;
        buf.context().synchronize().map_err(e2s)?;
        buf.write(d, &src[s..s + size]).map_err(e2s)?;
        out.fill(POISON_CPU);
        cuda::memcpy_dtoh(&mut out, &buf, 0).map_err(e2s)?;
        verify_guarded(&out, d, &src[s..s + size], POISON_GPU)
            .map_err(|e| format!("dst offset {d}, src offset {s}: {e}"))?;
    }
    Ok(String::new())
}

/// GPU -> CPU through the mapping at every source offset 0..63 into destinations at every
/// offset 0..63, against data put there by cuMemcpyHtoD.
fn from_gpu_offsets(be: &VulkanBackend, size: usize) -> CheckResult {
    let buf = be.alloc(size + 2 * GUARD, 64).map_err(e2s)?;
    let data = random(buf.len());
    cuda::memcpy_htod(&buf, 0, &data).map_err(e2s)?;
    buf.context().synchronize().map_err(e2s)?;
    let mut out = vec![0u8; size + 2 * GUARD];
    for s in 0..64 {
        let d = (s * 29 + size) % 64;
        out.fill(POISON_CPU);
        buf.read(s, &mut out[d..d + size]).map_err(e2s)?;
        verify_guarded(&out, d, &data[s..s + size], POISON_CPU)
            .map_err(|e| format!("src offset {s}, dst offset {d}: {e}"))?;
    }
    Ok(String::new())
}

fn parallel(be: &VulkanBackend, threads: usize) -> CheckResult {
    let size = (1 << 20) + 13;
    let buf = be.alloc(size + 2 * GUARD, 64).map_err(e2s)?;
    let src = random(size);
    cuda::memset(&buf, POISON_GPU).map_err(e2s)?;
    buf.context().synchronize().map_err(e2s)?;
    buf.write_parallel(7, &src, threads).map_err(e2s)?;
    let mut out = vec![0u8; buf.len()];
    cuda::memcpy_dtoh(&mut out, &buf, 0).map_err(e2s)?;
    verify_guarded(&out, 7, &src, POISON_GPU).map_err(|e| format!("write: {e}"))?;
    let mut back = vec![POISON_CPU; size + 2 * GUARD];
    buf.read_parallel(7, &mut back[3..3 + size], threads)
        .map_err(e2s)?;
    verify_guarded(&back, 3, &src, POISON_CPU).map_err(|e| format!("read: {e}"))?;
    Ok(String::new())
}

fn auto(be: &VulkanBackend, copier: &AutoCopier, size: usize) -> CheckResult {
    let buf = be.alloc(size + 2 * GUARD, 64).map_err(e2s)?;
    let src = random(size);
    cuda::memset(&buf, POISON_GPU).map_err(e2s)?;
    buf.context().synchronize().map_err(e2s)?;
    copier.write(&buf, 5, &src).map_err(e2s)?;
    let mut out = vec![0u8; buf.len()];
    cuda::memcpy_dtoh(&mut out, &buf, 0).map_err(e2s)?;
    verify_guarded(&out, 5, &src, POISON_GPU).map_err(|e| format!("write: {e}"))?;
    let mut back = vec![POISON_CPU; size + 2 * GUARD];
    copier.read(&buf, 5, &mut back[9..9 + size]).map_err(e2s)?;
    verify_guarded(&back, 9, &src, POISON_CPU).map_err(|e| format!("read: {e}"))?;
    Ok(format!(
        "write via {}, read via {}",
        copier.path_for(gdr::bar::auto::Direction::ToGpu, size),
        copier.path_for(gdr::bar::auto::Direction::FromGpu, size)
    ))
}

fn concurrent(be: &VulkanBackend, threads: usize, rounds: usize) -> CheckResult {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<(), String> {
                    be.context().bind().map_err(e2s)?;
                    let mut rng = rand::thread_rng();
                    for r in 0..rounds {
                        let size = rng.gen_range(1..100_000);
                        let buf = be.alloc(size, 1 << rng.gen_range(0..13)).map_err(e2s)?;
                        let data = random(size);
                        buf.write(0, &data).map_err(e2s)?;
                        let mut a = vec![POISON_CPU; size];
                        buf.read(0, &mut a).map_err(e2s)?;
                        let mut b = vec![POISON_CPU; size];
                        cuda::memcpy_dtoh(&mut b, &buf, 0).map_err(e2s)?;
                        if a != data || b != data {
                            return Err(format!("thread {t} round {r}: size {size} differs"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a thread panicked".to_string())??;
        }
        Ok(format!("{threads} threads x {rounds} buffers"))
    })
}

fn churn(be: &VulkanBackend, ops: usize) -> CheckResult {
    let mut rng = rand::thread_rng();
    let mut live: Vec<(MappedBuffer, u8)> = Vec::new();
    for i in 0..ops {
        if live.len() > 300 || (!live.is_empty() && rng.gen_bool(0.45)) {
            let (buf, tag) = live.swap_remove(rng.gen_range(0..live.len()));
            let mut b = [0u8; 2];
            buf.read(0, &mut b[..1]).map_err(e2s)?;
            buf.read(buf.len() - 1, &mut b[1..]).map_err(e2s)?;
            if b != [tag, tag] {
                return Err(format!("buffer {i} changed while live: {b:?} != {tag}"));
            }
        } else {
            let size = if rng.gen_bool(0.01) {
                rng.gen_range(16 << 20..40 << 20)
            } else {
                rng.gen_range(1..300_000)
            };
            let buf = be.alloc(size, 1 << rng.gen_range(0..16)).map_err(e2s)?;
            let tag = rng.gen();
            buf.write(0, &[tag]).map_err(e2s)?;
            buf.write(size - 1, &[tag]).map_err(e2s)?;
            live.push((buf, tag));
        }
    }
    drop(live);
    if be.shared_blocks() > 1 {
        return Err(format!(
            "{} blocks still held after freeing everything",
            be.shared_blocks()
        ));
    }
    Ok(format!("{ops} allocations and frees"))
}

fn errors(be: &VulkanBackend) -> CheckResult {
    if !matches!(be.alloc(0, 64), Err(BarError::BadLayout(_))) {
        return Err("a 0-byte allocation was not refused".into());
    }
    if !matches!(be.alloc(8, 48), Err(BarError::BadLayout(_))) {
        return Err("alignment 48 was not refused".into());
    }
    let buf = be.alloc(100, 64).map_err(e2s)?;
    if !matches!(
        buf.write(99, &[0, 0]),
        Err(BarError::Access(AccessError::OutOfBounds { .. }))
    ) {
        return Err("a write past the end was not refused".into());
    }
    let mut out = [0u8; 1];
    if !matches!(
        buf.read(100, &mut out),
        Err(BarError::Access(AccessError::OutOfBounds { .. }))
    ) {
        return Err("a read past the end was not refused".into());
    }
    Ok(String::new())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// dma-buf exports at odd offsets and sizes: aligned to host pages, covering the request, the
/// caller's offset kept.
fn dmabuf_odd(ctx: &cuda::Context) -> CheckResult {
    use gdr::cuda::DeviceMemory;
    let page = gdr::host_page_size();
    let buf = cuda::DeviceBuffer::new(ctx, 4 << 20).map_err(e2s)?;
    let mut mapping = None;
    for off in [0u64, 1, 63, 4095, 4097, 65_535, (1 << 20) + 3] {
        for size in [1u64, 3, 4095, 4097, 65_537, 1 << 20] {
            let addr = buf.device_ptr() + off;
            let d = gdr::peer::DmaBuf::export(ctx, addr, size)
                .map_err(|e| format!("offset {off} size {size}: {e}"))?;
            if d.start() % page != 0 || d.len() % page != 0 {
                return Err(format!("{d:?} is not page aligned"));
            }
            if !d.covers(addr, size) || d.start() + d.offset() != addr {
                return Err(format!("{d:?} does not cover offset {off} size {size}"));
            }
            mapping = Some(d.mapping());
        }
    }
    Ok(format!(
        "42 exports, mapping type {}",
        mapping.map_or("?".into(), |m| m.to_string())
    ))
}

/// The dma-buf registration cache against real allocations: miss, hit, invalidation by the
/// free hook, a free the cache was not told of caught by the tag check.
fn cache_real(ctx: &cuda::Context) -> CheckResult {
    use gdr::cuda::DeviceMemory;
    use gdr::peer::{dmabuf_cache, CacheError, Tracked};
    let cache = std::sync::Arc::new(dmabuf_cache(ctx));
    let a = Tracked::new(
        cuda::DeviceBuffer::new(ctx, 1 << 20).map_err(e2s)?,
        cache.clone(),
    );
    let h1 = cache.acquire(a.device_ptr() + 7, 999).map_err(e2s)?;
    let h2 = cache
        .acquire_checked(a.device_ptr() + 4000, 10)
        .map_err(e2s)?;
    if !h1.same_registration(&h2) {
        return Err("second lookup in the same allocation missed".into());
    }
    drop(a);
    if !h1.is_invalidated() {
        return Err("freeing tracked memory did not invalidate its entry".into());
    }
    drop((h1, h2));
    let b = cuda::DeviceBuffer::new(ctx, 1 << 20).map_err(e2s)?;
    let addr = b.device_ptr();
    drop(cache.acquire(addr, 4096).map_err(e2s)?);
    drop(b);
    match cache.acquire_checked(addr, 4096) {
        Err(CacheError::Freed { .. }) => {}
        Ok(_) => return Err("a freed allocation was returned by a checked lookup".into()),
        Err(e) => return Err(e.to_string()),
    }
    let s = cache.stats();
    if s.hits < 1 || s.misses < 2 || s.invalidations < 2 {
        return Err(format!("unexpected counters: {s:?}"));
    }
    Ok(format!(
        "{} hits, {} misses, {} invalidations",
        s.hits, s.misses, s.invalidations
    ))
}

/// An existing allocation pinned through the automatically chosen backend, data both ways.
fn pinned_auto(ctx: &cuda::Context) -> CheckResult {
    use gdr::bar::{PinBackend, Pinner};
    use gdr::cuda::DeviceMemory;
    let p = match Pinner::new(ctx, None) {
        Ok(p) => p,
        // A fact of the machine (`gdr info` says why per backend), not a data error.
        Err(gdr::bar::PinError::NoBackend(why)) => {
            return Ok(format!("not run: no backend can pin here ({why})"))
        }
        Err(e) => return Err(e.to_string()),
    };
    let mem: Box<dyn DeviceMemory> = match p.backend() {
        PinBackend::Vulkan => Box::new(cuda::vmm::VmmBuffer::new(ctx, 1 << 20).map_err(e2s)?),
        _ => Box::new(cuda::DeviceBuffer::new(ctx, 1 << 20).map_err(e2s)?),
    };
    let (off, size) = (4097usize, 100_003usize);
    let pin = p
        .pin(mem.device_ptr() + off as u64, size as u64)
        .map_err(e2s)?;
    let m = pin.map().map_err(e2s)?;
    let src = random(size);
    m.write(0, &src).map_err(e2s)?;
    let mut out = vec![POISON_CPU; size];
    cuda::memcpy_dtoh(&mut out, &mem, off).map_err(e2s)?;
    if let Some(i) = first_diff(&out, &src) {
        return Err(format!("write: byte {i} differs"));
    }
    let src2 = random(size);
    cuda::memcpy_htod(&mem, off, &src2).map_err(e2s)?;
    cuda::synchronize_legacy_stream().map_err(e2s)?;
    m.read(0, &mut out).map_err(e2s)?;
    if let Some(i) = first_diff(&out, &src2) {
        return Err(format!("read: byte {i} differs"));
    }
    Ok(format!("backend {}", p.backend()))
}

fn peer_checks(r: &mut Runner, ctx: &cuda::Context) {
    r.check("dma-buf export at odd offsets and sizes".into(), || {
        dmabuf_odd(ctx)
    });
    r.check(
        "registration cache hit/miss/invalidate on real allocations".into(),
        || cache_real(ctx),
    );
    r.check(
        "existing allocation pinned (automatic backend), data both ways".into(),
        || pinned_auto(ctx),
    );
    r.check(
        "no file descriptor leaked by the peer checks".into(),
        || {
            // The driver keeps a few fds open after a process's first export, so compare
            // two passes of the same work: the second must leave the count where it was.
            let fds = open_fds();
            dmabuf_odd(ctx)?;
            cache_real(ctx)?;
            pinned_auto(ctx)?;
            let now = open_fds();
            if now == fds {
                Ok(format!("{now} open before and after a second pass"))
            } else {
                Err(format!("{fds} open before a second pass, {now} after"))
            }
        },
    );
}

pub fn run(args: SanityArgs) -> CmdResult {
    run_with(args.gpu, args.json, false, args.fail_fast)
}

/// Sanity with only failures and the summary printed.
pub fn run_quiet(gpu: GpuArg) -> CmdResult {
    run_with(gpu, false, true, false)
}

/// Every check's result, nothing printed (for `gdr check --json`).
pub fn report(gpu: GpuArg) -> Result<SanityReport, Box<dyn std::error::Error + Send + Sync>> {
    checks(gpu, true, false, false)
}

fn run_with(gpu: GpuArg, json: bool, quiet: bool, fail_fast: bool) -> CmdResult {
    let report = checks(gpu, json, quiet, fail_fast)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{} passed, {} failed", report.passed, report.failed);
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Runs the checks; prints each (failures only when `quiet`) unless `json`.
fn checks(
    gpu: GpuArg,
    json: bool,
    quiet: bool,
    fail_fast: bool,
) -> Result<SanityReport, Box<dyn std::error::Error + Send + Sync>> {
    let be = gpu::open(gpu)?;
    let mut r = Runner {
        report: SanityReport::default(),
        json,
        quiet,
        fail_fast,
    };
    for &size in SIZES {
        r.check(
            format!("cpu->gpu mapping, size {size}, offsets 0..63"),
            || to_gpu_offsets(&be, size),
        );
    }
    for &size in SIZES {
        r.check(
            format!("gpu->cpu mapping, size {size}, offsets 0..63"),
            || from_gpu_offsets(&be, size),
        );
    }
    for threads in [2, 4, 8] {
        r.check(
            format!("parallel copy both ways, {threads} threads, 1 MiB + 13"),
            || parallel(&be, threads),
        );
    }
    match AutoCopier::new(&be) {
        Ok((copier, _)) => {
            for size in [1, 8, 4097, (1 << 20) + 1, (8 << 20) + 3] {
                r.check(format!("auto copier both ways, size {size}"), || {
                    auto(&be, &copier, size)
                });
            }
        }
        Err(e) => {
            r.check("auto copier calibration".into(), || Err(e.to_string()));
        }
    }
    r.check("concurrent threads on distinct buffers".into(), || {
        concurrent(&be, 8, 100)
    });
    r.check("allocation/free churn".into(), || churn(&be, 5000));
    r.check("bad requests are refused".into(), || errors(&be));
    peer_checks(&mut r, be.context());
    Ok(r.report)
}
