//! The Rust side of the package's benchmarks: the copies that `Buffer.write`/`read_into` and
//! `AutoCopier.write`/`read_into` make, run `k` times in a loop in Rust, on the same memory
//! and host buffer as the Python calls beside them. The difference between a Python call and
//! this loop is what the Python layer costs, measured in one process with nothing else changed
//! (bench/bench_vkgdr.py). Not part of the public API.

use crate::args;
use crate::buffer::Buffer;
use crate::errors;
use crate::gpu::AutoCopier;
use crate::pybuf::HeldBuffer;
use gdr::mem::{check_range, MappedMemory};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::time::Instant;

/// Copies per call at most: a bound on how long one call can hold its caller (the benchmark
/// asks for far fewer).
const MAX_LOOP: usize = 1 << 24;

/// Times `k` copies of `host` into (`"write"`) or out of (`"read"`) `buf` at `offset`, made
/// from Rust with the interpreter let go: through the mapping on one thread (what
/// `buf.write(host, offset)` / `buf.read_into(host, offset)` do), or through `auto` when
/// given (what `auto.write(buf, host, offset)` / `auto.read_into(buf, host, offset)` do).
/// Returns the loop's nanoseconds in all.
#[pyfunction]
#[pyo3(signature = (direction, buf, host, k, offset = 0, auto = None))]
pub(crate) fn _rust_copy_loop(
    py: Python<'_>,
    direction: &str,
    buf: &Bound<'_, PyAny>,
    host: &Bound<'_, PyAny>,
    k: usize,
    #[pyo3(from_py_with = args::offset)] offset: usize,
    auto: Option<&Bound<'_, AutoCopier>>,
) -> PyResult<u64> {
    if !(1..=MAX_LOOP).contains(&k) {
        return Err(PyValueError::new_err(format!(
            "k={k}: between 1 and {MAX_LOOP} copies"
        )));
    }
    let buf = buf
        .cast::<Buffer>()
        .map_err(|_| PyTypeError::new_err("the loop copies to and from a gdr.Buffer"))?;
    let mem = buf.get().h.get("the buffer")?;
    let writing = match direction {
        "write" => true,
        "read" => false,
        _ => {
            return Err(PyValueError::new_err(format!(
                "direction {direction:?}: \"write\" or \"read\""
            )))
        }
    };
    let mut held = if writing {
        HeldBuffer::readable(host)?
    } else {
        HeldBuffer::writable(host)?
    };
    check_range(offset, held.len(), mem.size()).map_err(errors::access)?;
    let auto = match auto {
        Some(a) => match mem.mapped_buffer() {
            Some((mb, base)) => Some((a.get().copier(), mb, base + offset)),
            None => {
                return Err(PyTypeError::new_err(
                    "the auto copier copies to and from memory gdr allocated (Gpu.alloc)",
                ))
            }
        },
        None => None,
    };
    let mut host = if writing {
        Host::From(held.as_slice())
    } else {
        Host::Into(held.as_mut_slice())
    };
    let timed = py.detach(|| {
        let t0 = Instant::now();
        for _ in 0..k {
            match (&auto, &mut host) {
                (Some((c, mb, at)), Host::From(s)) => c.write(*mb, *at, s).map_err(Failed::Bar)?,
                (Some((c, mb, at)), Host::Into(d)) => c.read(*mb, *at, d).map_err(Failed::Bar)?,
                (None, Host::From(s)) => {
                    mem.write_parallel(offset, s, 1).map_err(Failed::Access)?
                }
                (None, Host::Into(d)) => mem.read_parallel(offset, d, 1).map_err(Failed::Access)?,
            }
        }
        Ok(t0.elapsed())
    });
    match timed {
        Ok(t) => Ok(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)),
        Err(Failed::Bar(e)) => Err(errors::bar(e)),
        Err(Failed::Access(e)) => Err(errors::access(e)),
    }
}

/// The host side of the loop: the bytes written, or the buffer read into.
enum Host<'a> {
    From(&'a [u8]),
    Into(&'a mut [u8]),
}

/// A copy's error, turned into a Python exception once the interpreter is held again.
enum Failed {
    Bar(gdr::bar::BarError),
    Access(gdr::mem::AccessError),
}
