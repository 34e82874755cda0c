//! Timing one copy path between host memory and a mapped buffer (copylat, copybw, check).

use gdr::bar::auto::{read_on, write_on, AutoCopier, Direction, Path};
use gdr::bar::{BarError, MappedBuffer};
use gdr::cuda;
use gdr::mem::MappedMemory;
use gdr_bench::stats::{time_interleaved_us, Op, Summary};
use rand::RngCore;
use std::time::Duration;

/// Output and calibration flags shared by copylat and copybw.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Measure the auto copier's crossovers again instead of using the cached ones
    #[arg(long)]
    pub recalibrate: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Write a plot of the results against size (SVG) to this file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,
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
}

/// Times each of `what` copying `size` bytes in `dir`, interleaved round by round so that
/// drift on the machine affects every path alike. All share one host buffer of fresh random
/// data.
pub fn time_all(
    what: &[Timed],
    dir: Direction,
    buf: &MappedBuffer,
    size: usize,
    auto: &AutoCopier,
    budget: Duration,
) -> Result<Vec<Summary>, BarError> {
    // One host buffer for every path: they run one at a time, and pageable copies depend on
    // the buffer (alignment, pages), which must not differ between the paths compared.
    let mut data = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut data);
    let host = std::cell::RefCell::new(data);
    let host = &host;
    let mut ops: Vec<Op<'_, BarError>> = what
        .iter()
        .map(|&w| -> Op<'_, BarError> {
            Box::new(move || match (w, dir) {
                (Timed::Path(p), Direction::ToGpu) => write_on(p, buf, 0, &host.borrow()),
                (Timed::Path(p), Direction::FromGpu) => read_on(p, buf, 0, &mut host.borrow_mut()),
                (Timed::PlainCuMemcpy, Direction::ToGpu) => {
                    Ok(cuda::memcpy_htod(buf, 0, &host.borrow())?)
                }
                (Timed::PlainCuMemcpy, Direction::FromGpu) => {
                    Ok(cuda::memcpy_dtoh(&mut host.borrow_mut(), buf, 0)?)
                }
                (Timed::Auto, Direction::ToGpu) => auto.write(buf, 0, &host.borrow()),
                (Timed::Auto, Direction::FromGpu) => auto.read(buf, 0, &mut host.borrow_mut()),
                (Timed::BareLoad, _) => {
                    std::hint::black_box(buf.load_u64(0)?);
                    Ok(())
                }
            })
        })
        .collect();
    time_interleaved_us(
        &mut ops,
        201,
        Duration::from_micros(20),
        budget * what.len() as u32,
    )
}

pub fn dir_name(d: Direction) -> &'static str {
    match d {
        Direction::ToGpu => "cpu->gpu",
        Direction::FromGpu => "gpu->cpu",
    }
}
