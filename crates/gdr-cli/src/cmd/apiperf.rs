//! `gdr apiperf`: what making GPU memory reachable costs, by size — gdrcopy's apiperf for every
//! backend that works here, plus the registration cache's hit and miss.
//!
//! Rows (each op timed separately, median and min of `--iters` runs; the cache hit, a lookup
//! too short to time one at a time, is timed in batches of 1000 and reported per call; the
//! current figures are in docs/perf.md#pinning-export-registration-cache-gdr-apiperf):
//! - `dmabuf`: export (`cuMemGetHandleForAddressRange`) and close of the fd.
//! - `vulkan-alloc`: a dedicated Vulkan allocation, mapped and imported into CUDA (this
//!   backend's pin+map: new memory, not an existing range), and its free.
//! - `pin-<backend>`: every [`Pinner`] backend that works here: pin, map, unmap, unpin of an
//!   existing allocation (of a POSIX-fd `cuMemCreate` allocation for `pin-vulkan`).
//! - `capi-<backend>`: the same four operations through libgdrapi's C entry points
//!   (`gdr_pin_buffer`, `gdr_map`, `gdr_unmap`, `gdr_unpin_buffer`) on the same kind of memory,
//!   so the C layer's cost shows beside the Rust API's in one run.
//! - `cache`: [`RegCache`](gdr::peer::RegCache) over dma-buf exports: a miss (export + insert)
//!   and a hit.

use super::gpu::GpuArg;
use super::table::{parse_size, size as hsize, Table};
use super::CmdResult;
use gdr::bar::{PinBackend, Pinner, VulkanBackend};
use gdr::cuda::{vmm::VmmBuffer, Context, DeviceBuffer, DeviceMemory};
use gdr::peer::{dmabuf_cache, DmaBuf};
use gdr_bench::stats::Summary;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Instant;

/// The most `--iters`: each run pins and maps, so more than this takes hours at 1 GiB.
const MAX_ITERS: usize = 100_000;

#[derive(clap::Args)]
pub struct ApiperfArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Smallest size (bytes; K/M/G suffixes)
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub min_size: usize,
    /// Largest size
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub max_size: usize,
    /// Runs of each operation per size, from 1 to 100000 (at most 5 for sizes over 256 MiB)
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Row {
    backend: String,
    op: &'static str,
    size: usize,
    median_us: f64,
    min_us: f64,
    n: usize,
}

#[derive(Serialize, Default)]
struct Report {
    rows: Vec<Row>,
    /// Backends (or steps) that could not be timed here, and why.
    skipped: Vec<String>,
}

type E = Box<dyn std::error::Error + Send + Sync>;

/// Per-op sample lists for one backend and size.
struct Samples(Vec<(&'static str, Vec<f64>)>);

impl Samples {
    fn new(ops: &[&'static str]) -> Self {
        Samples(ops.iter().map(|&o| (o, Vec::new())).collect())
    }
    fn time<T>(&mut self, op: &'static str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        let us = t.elapsed().as_secs_f64() * 1e6;
        if let Some((_, v)) = self.0.iter_mut().find(|(o, _)| *o == op) {
            v.push(us);
        }
        r
    }
    fn into_rows(self, backend: &str, size: usize, out: &mut Vec<Row>) {
        for (op, mut v) in self.0 {
            if v.is_empty() {
                continue;
            }
            let s = Summary::of(&mut v);
            out.push(Row {
                backend: backend.to_owned(),
                op,
                size,
                median_us: s.median,
                min_us: s.min,
                n: s.n,
            });
        }
    }
}

/// Powers of four times 4 KiB from `min` (rounded up) to `max`, with checked arithmetic: a
/// `--max-size` near 2^64 ends the list instead of wrapping.
fn sizes(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(min.max(4096).checked_next_power_of_two(), |s| {
        s.checked_mul(4)
    })
    .take_while(|&s| s <= max)
    .collect()
}

fn dmabuf(ctx: &Context, size: usize, iters: usize, out: &mut Vec<Row>) -> Result<(), E> {
    let buf = DeviceBuffer::new(ctx, size)?;
    let mut s = Samples::new(&["export", "close"]);
    for _ in 0..iters {
        let d = s.time("export", || {
            DmaBuf::export(ctx, buf.device_ptr(), size as u64)
        })?;
        s.time("close", || drop(d));
    }
    s.into_rows("dmabuf", size, out);
    Ok(())
}

fn vulkan_alloc(
    be: &VulkanBackend,
    size: usize,
    iters: usize,
    out: &mut Vec<Row>,
) -> Result<(), E> {
    let mut s = Samples::new(&["alloc+map+import", "free"]);
    for _ in 0..iters {
        let b = s.time("alloc+map+import", || be.alloc_dedicated(size))?;
        s.time("free", || drop(b));
    }
    s.into_rows("vulkan-alloc", size, out);
    Ok(())
}

fn pinned(p: &Pinner, size: usize, iters: usize, out: &mut Vec<Row>) -> Result<(), E> {
    let ctx = p.context();
    let mem: Box<dyn DeviceMemory> = match p.backend() {
        PinBackend::Vulkan => Box::new(VmmBuffer::new(ctx, size)?),
        _ => Box::new(DeviceBuffer::new(ctx, size)?),
    };
    let mut s = Samples::new(&["pin", "map", "unmap", "unpin"]);
    for _ in 0..iters {
        let pin = s.time("pin", || p.pin(mem.device_ptr(), size as u64))?;
        let m = s.time("map", || pin.map())?;
        s.time("unmap", || drop(m));
        s.time("unpin", || drop(pin));
    }
    s.into_rows(&format!("pin-{}", p.backend()), size, out);
    Ok(())
}

/// libgdrapi's C entry points on memory the backend can pin (POSIX-fd VMM memory for vulkan).
fn capi(
    g: *mut std::ffi::c_void,
    ctx: &Context,
    backend: PinBackend,
    size: usize,
    iters: usize,
    out: &mut Vec<Row>,
) -> Result<(), E> {
    use gdrapi::{gdr_map, gdr_pin_buffer, gdr_unmap, gdr_unpin_buffer, GdrMh};
    let mem: Box<dyn DeviceMemory> = match backend {
        PinBackend::Vulkan => Box::new(VmmBuffer::new(ctx, size)?),
        _ => Box::new(DeviceBuffer::new(ctx, size)?),
    };
    let check = |what: &str, rc: i32| match rc {
        0 => Ok(()),
        e => Err(format!("{what}: errno {e}")),
    };
    let mut s = Samples::new(&["pin", "map", "unmap", "unpin"]);
    for _ in 0..iters {
        let mut mh = GdrMh { h: 0 };
        let addr = mem.device_ptr() as std::ffi::c_ulong;
        check(
            "gdr_pin_buffer",
            // SAFETY: `mh` is a GdrMh to write the handle to.
            s.time("pin", || unsafe {
                gdr_pin_buffer(g, addr, size, 0, 0, &mut mh)
            }),
        )?;
        let mut va = std::ptr::null_mut();
        // SAFETY: an out-pointer to a pointer.
        let map = || unsafe { gdr_map(g, mh, &mut va, size) };
        check("gdr_map", s.time("map", map))?;
        check("gdr_unmap", s.time("unmap", || gdr_unmap(g, mh, va, size)))?;
        check(
            "gdr_unpin_buffer",
            s.time("unpin", || gdr_unpin_buffer(g, mh)),
        )?;
    }
    s.into_rows(&format!("capi-{backend}"), size, out);
    Ok(())
}

fn cache(ctx: &Context, size: usize, iters: usize, out: &mut Vec<Row>) -> Result<(), E> {
    let buf = DeviceBuffer::new(ctx, size)?;
    let mut s = Samples::new(&["miss", "hit"]);
    for _ in 0..iters {
        let c = dmabuf_cache(ctx);
        let h = s.time("miss", || c.acquire(buf.device_ptr(), size as u64))?;
        drop(h);
        // A hit is too short to time alone: time a batch and record the per-call figure.
        const BATCH: u32 = 1000;
        let t = Instant::now();
        for _ in 0..BATCH {
            std::hint::black_box(c.acquire(buf.device_ptr() + 64, 64)?);
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(BATCH);
        if let Some((_, v)) = s.0.iter_mut().find(|(o, _)| *o == "hit") {
            v.push(us);
        }
    }
    s.into_rows("cache", size, out);
    Ok(())
}

pub fn run(args: ApiperfArgs) -> CmdResult {
    if args.min_size > args.max_size {
        return Err("--min-size is larger than --max-size".into());
    }
    // Checked before the GPU is opened.
    let sizes = sizes(args.min_size, args.max_size);
    if sizes.is_empty() {
        return Err(format!(
            "no size from --min-size {} to --max-size {}",
            args.min_size, args.max_size
        )
        .into());
    }
    // 0 ran once, silently; a huge count ran for days.
    super::in_range("iters", &[args.iters], 1, MAX_ITERS)?;
    let ctx = Context::on(args.gpu.gpu)?;
    let mut rep = Report::default();
    let vulkan = VulkanBackend::new(&ctx);
    if let Err(e) = &vulkan {
        rep.skipped.push(format!("vulkan-alloc: {e}"));
    }
    let mut pinners = Vec::new();
    for b in PinBackend::ALL {
        match Pinner::new(&ctx, Some(b)) {
            Ok(p) => pinners.push(p),
            Err(e) => rep.skipped.push(format!("pin-{b}: {e}")),
        }
    }
    // libgdrapi as a C caller sees it: its own gdr_open, which pins through the GPU that owns
    // each address (so --gpu's memory), with the backend gdr_open found.
    let g = gdrapi::gdr_open();
    let mut code = 0;
    let capi_backend = (!g.is_null()
        // SAFETY: an out-pointer to a c_int.
        && unsafe { gdrapi::gdr_get_attribute(g, gdrapi::ATTR_GDR_BACKEND, &mut code) } == 0)
        .then(|| {
            PinBackend::ALL
                .into_iter()
                .find(|&b| gdrapi::backend_code(b) == code)
        })
        .flatten();
    if capi_backend.is_none() {
        rep.skipped
            .push("capi: gdr_open() failed (GDRCOPY_ENABLE_LOGGING=1 says why)".into());
    }
    for &size in &sizes {
        let iters = if size > 256 << 20 {
            args.iters.clamp(1, 5)
        } else {
            args.iters.max(1)
        };
        let mut note = |what: &str, r: Result<(), E>| {
            if let Err(e) = r {
                rep.skipped.push(format!("{what} at {}: {e}", hsize(size)));
            }
        };
        note("dmabuf", dmabuf(&ctx, size, iters, &mut rep.rows));
        if let Ok(be) = &vulkan {
            note("vulkan-alloc", vulkan_alloc(be, size, iters, &mut rep.rows));
        }
        for p in &pinners {
            note(
                &format!("pin-{}", p.backend()),
                pinned(p, size, iters, &mut rep.rows),
            );
        }
        if let Some(b) = capi_backend {
            note(
                &format!("capi-{b}"),
                capi(g, &ctx, b, size, iters, &mut rep.rows),
            );
        }
        note("cache", cache(&ctx, size, iters, &mut rep.rows));
    }
    if !g.is_null() {
        gdrapi::gdr_close(g);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        let mut t = Table::new(&["Backend", "Op", "Size", "Median(us)", "Min(us)", "N"]);
        for r in &rep.rows {
            t.row(vec![
                r.backend.clone(),
                r.op.to_string(),
                hsize(r.size),
                format!("{:.2}", r.median_us),
                format!("{:.2}", r.min_us),
                r.n.to_string(),
            ]);
        }
        t.print();
        for s in &rep.skipped {
            println!("not timed: {s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_go_by_fours_from_4k() {
        assert_eq!(sizes(4096, 1 << 30).len(), 10);
        assert_eq!(sizes(1, 65536), vec![4096, 16384, 65536]);
        assert!(sizes(1 << 20, 4096).is_empty());
        // Near 2^64 the list ends instead of wrapping around.
        assert_eq!(sizes(1 << 62, usize::MAX), vec![1 << 62]);
        assert!(sizes((1 << 63) + 1, usize::MAX).is_empty());
        assert_eq!(*sizes(4096, usize::MAX).last().unwrap(), 1 << 62);
    }
}
