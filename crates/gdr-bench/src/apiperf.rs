//! `gdr apiperf`: what making GPU memory reachable costs, by size — gdrcopy's apiperf for every
//! backend that works here, plus the registration cache's hit and miss ([`measure`]).
//!
//! Rows (each op timed separately, median and min of `iters` runs; the cache hit, a lookup
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

use crate::stats::Summary;
use gdr::bar::{BarError, PinBackend, PinError, Pinner, VulkanBackend};
use gdr::cuda::{vmm::VmmBuffer, Context, CudaError, DeviceBuffer, DeviceMemory};
use gdr::peer::{dmabuf_cache, CacheError, DmaBuf, PeerError};
use serde::Serialize;
use std::time::Instant;

/// One operation of one backend at one size.
#[derive(Debug, Serialize)]
pub struct ApiperfRow {
    /// `dmabuf`, `vulkan-alloc`, `pin-<backend>`, `capi-<backend>` or `cache`.
    pub backend: String,
    /// The operation (`export`, `pin`, `map`, `miss`, ...).
    pub op: &'static str,
    /// Bytes of the range or allocation.
    pub size: usize,
    /// Median, in microseconds per call.
    pub median_us: f64,
    /// Fastest call.
    pub min_us: f64,
    /// Runs timed.
    pub n: usize,
}

/// What `gdr apiperf` reports.
#[derive(Debug, Default)]
pub struct ApiperfReport {
    /// Every operation timed, by size, then backend.
    pub rows: Vec<ApiperfRow>,
    /// Backends (or steps) that could not be timed here, and why.
    pub skipped: Vec<ApiperfSkip>,
}

/// A backend (or a step) that could not be timed here.
#[derive(Debug)]
pub struct ApiperfSkip {
    /// The backend, as [`ApiperfRow::backend`] names it (`capi` where `gdr_open` failed).
    pub what: String,
    /// The size it failed at; `None` where the backend did not open at all.
    pub size: Option<usize>,
    /// Why.
    pub why: ApiperfError,
}

/// Why a backend (or a step) could not be timed; [`measure`] writes it into
/// [`ApiperfReport::skipped`].
#[derive(Debug, thiserror::Error)]
pub enum ApiperfError {
    /// A CUDA allocation.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A Vulkan allocation.
    #[error(transparent)]
    Bar(#[from] BarError),
    /// A pin or map through a [`Pinner`].
    #[error(transparent)]
    Pin(#[from] PinError),
    /// A dma-buf export.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// A registration cache lookup.
    #[error(transparent)]
    Cache(#[from] CacheError<PeerError>),
    /// libgdrapi's `gdr_open` failed (or did not say its backend).
    #[error("gdr_open() failed (GDRCOPY_ENABLE_LOGGING=1 says why)")]
    Open,
    /// A C entry point returned an errno.
    #[error("{call}: errno {errno}")]
    Capi {
        /// The C function.
        call: &'static str,
        /// What it returned.
        errno: i32,
    },
}

type E = ApiperfError;

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
    fn into_rows(self, backend: &str, size: usize, out: &mut Vec<ApiperfRow>) {
        for (op, mut v) in self.0 {
            if v.is_empty() {
                continue;
            }
            let s = Summary::of(&mut v);
            out.push(ApiperfRow {
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
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(min.max(4096).checked_next_power_of_two(), |s| {
        s.checked_mul(4)
    })
    .take_while(|&s| s <= max)
    .collect()
}

fn dmabuf(ctx: &Context, size: usize, iters: usize, out: &mut Vec<ApiperfRow>) -> Result<(), E> {
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
    out: &mut Vec<ApiperfRow>,
) -> Result<(), E> {
    let mut s = Samples::new(&["alloc+map+import", "free"]);
    for _ in 0..iters {
        let b = s.time("alloc+map+import", || be.alloc_dedicated(size))?;
        s.time("free", || drop(b));
    }
    s.into_rows("vulkan-alloc", size, out);
    Ok(())
}

fn pinned(p: &Pinner, size: usize, iters: usize, out: &mut Vec<ApiperfRow>) -> Result<(), E> {
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
    out: &mut Vec<ApiperfRow>,
) -> Result<(), E> {
    use gdrapi::{gdr_map, gdr_pin_buffer, gdr_unmap, gdr_unpin_buffer, GdrMh};
    let mem: Box<dyn DeviceMemory> = match backend {
        PinBackend::Vulkan => Box::new(VmmBuffer::new(ctx, size)?),
        _ => Box::new(DeviceBuffer::new(ctx, size)?),
    };
    let check = |call: &'static str, rc: i32| match rc {
        0 => Ok(()),
        errno => Err(E::Capi { call, errno }),
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

fn cache(ctx: &Context, size: usize, iters: usize, out: &mut Vec<ApiperfRow>) -> Result<(), E> {
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

/// Times every backend that opens here at each of `sizes`, `iters` runs of each operation
/// (at most 5 for sizes over 256 MiB), on `ctx`'s GPU; libgdrapi's rows through its own
/// `gdr_open`, which pins through the GPU that owns each address (so `ctx`'s memory), with the
/// backend `gdr_open` found. What fails is left out, with the reason in
/// [`ApiperfReport::skipped`].
pub fn measure(ctx: &Context, sizes: &[usize], iters: usize) -> ApiperfReport {
    let mut rep = ApiperfReport::default();
    let vulkan = match VulkanBackend::new(ctx) {
        Ok(be) => Some(be),
        Err(e) => {
            rep.skipped.push(ApiperfSkip {
                what: "vulkan-alloc".into(),
                size: None,
                why: e.into(),
            });
            None
        }
    };
    let mut pinners = Vec::new();
    for b in PinBackend::ALL {
        match Pinner::new(ctx, Some(b)) {
            Ok(p) => pinners.push(p),
            Err(e) => rep.skipped.push(ApiperfSkip {
                what: format!("pin-{b}"),
                size: None,
                why: e.into(),
            }),
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
        rep.skipped.push(ApiperfSkip {
            what: "capi".into(),
            size: None,
            why: E::Open,
        });
    }
    for &size in sizes {
        let iters = if size > 256 << 20 {
            iters.clamp(1, 5)
        } else {
            iters.max(1)
        };
        let mut note = |what: &str, r: Result<(), E>| {
            if let Err(why) = r {
                rep.skipped.push(ApiperfSkip {
                    what: what.to_owned(),
                    size: Some(size),
                    why,
                });
            }
        };
        note("dmabuf", dmabuf(ctx, size, iters, &mut rep.rows));
        if let Some(be) = &vulkan {
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
                capi(g, ctx, b, size, iters, &mut rep.rows),
            );
        }
        note("cache", cache(ctx, size, iters, &mut rep.rows));
    }
    if !g.is_null() {
        gdrapi::gdr_close(g);
    }
    rep
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
