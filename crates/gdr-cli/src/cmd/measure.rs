//! Timing one copy path between host memory and a mapped buffer (copylat, copybw, check).

use gdr::bar::{BarError, MappedBuffer};
use gdr::copy::auto::{read_on, write_on, AutoCopier, Direction, Path};
use gdr::cuda;
use gdr::stats::{time_per_call_us, Summary};
use std::time::Duration;

/// What is timed.
#[derive(Clone, Copy, Debug)]
pub enum Timed {
    /// One path as the auto copier runs it (copy-engine writes include the final synchronize).
    Path(Path),
    /// The plain `cuMemcpyHtoD` / `cuMemcpyDtoH` call, as gdrcopy's copylat times it.
    PlainCuMemcpy,
    /// The auto copier.
    Auto,
}

/// Times `what` copying `len` bytes in `dir` (fresh data put in `host` by the caller).
pub fn time(
    what: Timed,
    dir: Direction,
    buf: &MappedBuffer,
    host: &mut [u8],
    auto: &AutoCopier,
    budget: Duration,
) -> Result<Summary, BarError> {
    let samples = 201;
    let min_batch = Duration::from_micros(20);
    time_per_call_us(
        || match (what, dir) {
            (Timed::Path(p), Direction::ToGpu) => write_on(p, buf, 0, host),
            (Timed::Path(p), Direction::FromGpu) => read_on(p, buf, 0, host),
            (Timed::PlainCuMemcpy, Direction::ToGpu) => Ok(cuda::memcpy_htod(buf, 0, host)?),
            (Timed::PlainCuMemcpy, Direction::FromGpu) => Ok(cuda::memcpy_dtoh(host, buf, 0)?),
            (Timed::Auto, Direction::ToGpu) => auto.write(buf, 0, host),
            (Timed::Auto, Direction::FromGpu) => auto.read(buf, 0, host),
        },
        samples,
        min_batch,
        budget,
    )
}

pub fn dir_name(d: Direction) -> &'static str {
    match d {
        Direction::ToGpu => "cpu->gpu",
        Direction::FromGpu => "gpu->cpu",
    }
}
