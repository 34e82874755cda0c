//! Timing copy paths between host memory and a mapped buffer, interleaved ([`time_all`]), as
//! `gdr copylat`, `gdr copybw` and `gdr check` do ([`copylat`](crate::copylat),
//! [`copybw`](crate::copybw)).

use crate::capi_map::{CapiError, CapiMapping};
use crate::stats::{Op, Summary};
use gdr::bar::auto::{read_on, write_on, AutoCopier, Direction, Path};
use gdr::bar::{BarError, MappedBuffer};
use gdr::cuda;
use gdr::mem::MappedMemory;
use rand::RngCore;
use std::time::Duration;

/// Where `--raw-samples` goes. A write that fails does not stop the measurement; the first
/// error is kept and [`RawLog::finish`] returns it.
pub struct RawLog {
    out: std::cell::RefCell<std::io::BufWriter<std::fs::File>>,
    error: std::cell::RefCell<Option<std::io::Error>>,
}

impl RawLog {
    /// Creates (truncates) `path`, when one was given.
    pub fn create(path: Option<&str>) -> std::io::Result<Option<RawLog>> {
        path.map(|p| {
            std::fs::File::create(p).map(|f| RawLog {
                out: std::cell::RefCell::new(std::io::BufWriter::new(f)),
                error: std::cell::RefCell::new(None),
            })
        })
        .transpose()
    }

    fn write(&self, dir: Direction, size: usize, what: &[Timed], samples: &[Vec<f64>]) {
        use std::io::Write;
        let paths: Vec<serde_json::Value> = what
            .iter()
            .zip(samples)
            .map(|(w, s)| serde_json::json!({ "timed": w.name(), "us": s }))
            .collect();
        let line = serde_json::json!({ "direction": dir_name(dir), "size": size, "paths": paths });
        if let Err(e) = writeln!(self.out.borrow_mut(), "{line}") {
            self.error.borrow_mut().get_or_insert(e);
        }
    }

    /// Flushes the file; the first write error, if any.
    pub fn finish(self) -> std::io::Result<()> {
        use std::io::Write;
        if let Some(e) = self.error.into_inner() {
            return Err(e);
        }
        self.out.into_inner().flush()
    }
}

/// What is timed.
#[derive(Clone, Copy, Debug)]
pub enum Timed {
    /// One path as the auto copier runs it (copy-engine writes include the final synchronize).
    Path(Path),
    /// The plain `cuMemcpyHtoD` / `cuMemcpyDtoH` call, as gdrcopy's copylat times it.
    PlainCuMemcpy,
    /// The auto copier.
    Auto,
    /// The floor for an 8-byte read: one volatile 8-byte load from the mapping, nothing else
    /// (no dispatch, no fences, no copy out). Reads only; the reference row of copylat.
    BareLoad,
    /// libgdrapi's `gdr_copy_to_mapping` / `gdr_copy_from_mapping`, on a mapping of its own
    /// (the [`CapiMapping`] passed to [`time_all`]).
    Capi,
}

/// Why a timed copy failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A Rust path.
    #[error(transparent)]
    Bar(#[from] BarError),
    /// A C entry point.
    #[error(transparent)]
    Capi(#[from] CapiError),
    /// [`Timed::Capi`] asked for without a mapping.
    #[error("the C API's copies were asked for without a libgdrapi mapping")]
    NoCapiMapping,
}

impl From<cuda::CudaError> for MeasureError {
    fn from(e: cuda::CudaError) -> Self {
        MeasureError::Bar(e.into())
    }
}

impl Timed {
    /// The name used in `--raw-samples`.
    pub fn name(self) -> String {
        match self {
            Timed::Path(p) => p.to_string(),
            Timed::PlainCuMemcpy => "cuMemcpy".into(),
            Timed::Auto => "auto".into(),
            Timed::BareLoad => "bare load".into(),
            Timed::Capi => "C API".into(),
        }
    }
}

/// Times each of `what` copying `size` bytes in `dir`, interleaved round by round so that
/// drift on the machine affects every path alike. All share one host buffer of fresh random
/// data. [`Timed::Capi`] copies through `capi`.
#[allow(clippy::too_many_arguments)]
pub fn time_all(
    what: &[Timed],
    dir: Direction,
    buf: &MappedBuffer,
    size: usize,
    auto: &AutoCopier,
    capi: Option<&CapiMapping>,
    budget: Duration,
    raw: Option<&RawLog>,
) -> Result<Vec<Summary>, MeasureError> {
    // One host buffer for every path: they run one at a time, and pageable copies depend on
    // the buffer (alignment, pages), which must not differ between the paths compared.
    let mut data = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut data);
    let host = std::cell::RefCell::new(data);
    let host = &host;
    let mut ops: Vec<Op<'_, MeasureError>> = what
        .iter()
        .map(|&w| -> Op<'_, MeasureError> {
            Box::new(move || match (w, dir) {
                (Timed::Path(p), Direction::ToGpu) => Ok(write_on(p, buf, 0, &host.borrow())?),
                (Timed::Path(p), Direction::FromGpu) => {
                    Ok(read_on(p, buf, 0, &mut host.borrow_mut())?)
                }
                (Timed::PlainCuMemcpy, Direction::ToGpu) => {
                    Ok(cuda::memcpy_htod(buf, 0, &host.borrow())?)
                }
                (Timed::PlainCuMemcpy, Direction::FromGpu) => {
                    Ok(cuda::memcpy_dtoh(&mut host.borrow_mut(), buf, 0)?)
                }
                (Timed::Auto, Direction::ToGpu) => Ok(auto.write(buf, 0, &host.borrow())?),
                (Timed::Auto, Direction::FromGpu) => {
                    Ok(auto.read(buf, 0, &mut host.borrow_mut())?)
                }
                (Timed::BareLoad, _) => {
                    std::hint::black_box(buf.load_u64(0).map_err(BarError::from)?);
                    Ok(())
                }
                (Timed::Capi, Direction::ToGpu) => Ok(capi
                    .ok_or(MeasureError::NoCapiMapping)?
                    .write(&host.borrow())?),
                (Timed::Capi, Direction::FromGpu) => Ok(capi
                    .ok_or(MeasureError::NoCapiMapping)?
                    .read(&mut host.borrow_mut())?),
            })
        })
        .collect();
    let mut samples = gdr::timing::time_interleaved(
        &mut ops,
        201,
        Duration::from_micros(20),
        budget * what.len() as u32,
    )?;
    if let Some(log) = raw {
        log.write(dir, size, what, &samples);
    }
    Ok(samples.iter_mut().map(|v| Summary::of(v)).collect())
}

/// One path contending in the auto copier's size class and its running estimate (JSON output).
#[derive(serde::Serialize)]
pub struct Contender {
    /// The path, as the auto copier names it.
    pub path: String,
    /// Per-call microseconds at the class's base size (a power of two).
    pub estimate_us: f64,
}

/// The auto copier's contenders for `size` in `dir` with their estimates after the row was
/// timed; empty where calibration's choice had no near rival.
pub fn contenders(auto: &AutoCopier, dir: Direction, size: usize) -> Vec<Contender> {
    let Some(c) = auto.contest(dir, size) else {
        return Vec::new();
    };
    (0..c.paths().len())
        .map(|i| Contender {
            path: c.path(i).to_string(),
            estimate_us: c.estimate_us(i),
        })
        .collect()
}

/// The direction as the rows and `--raw-samples` write it: `cpu->gpu` or `gpu->cpu`.
pub fn dir_name(d: Direction) -> &'static str {
    match d {
        Direction::ToGpu => "cpu->gpu",
        Direction::FromGpu => "gpu->cpu",
    }
}
