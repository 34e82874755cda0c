//! The integer arguments of the Python API (sizes, offsets, lengths, thread counts, device
//! ordinals, alignments, addresses), checked as docs/python.md promises: what is not an int
//! raises `TypeError`, an int out of range `ValueError`, each naming the argument.
//!
//! PyO3's own conversion to `usize` raises `OverflowError` for a negative int, which is neither
//! (and which code catching bad arguments as `ValueError` misses). These functions are used
//! through `#[pyo3(from_py_with = ...)]`, so the checks run while the arguments are extracted,
//! before the method body: before any driver, GPU or Vulkan call, so that a machine without a
//! GPU reports a bad argument as one rather than as the missing GPU.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

/// The most threads a copy may be asked for. A copy uses at most
/// `gdr::copy::PARALLEL_MAX_THREADS` of them (more are clamped to it); the bound is wider so
/// that `os.cpu_count()` of a large host is a valid request, and narrow enough to catch a
/// count that is a mistake (a negative number cast to unsigned).
pub(crate) const MAX_THREADS: usize = 1024;

/// `obj` as an int (anything with `__index__`, as Python's own APIs take), or `TypeError`.
/// `None` for an int outside `i64::MIN..=u64::MAX`, which no range here reaches.
fn int(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<i128>> {
    let py = obj.py();
    let overflow = |e: &PyErr| e.is_instance_of::<PyOverflowError>(py);
    // i64 first: one C call for every int a caller passes in practice (the copies' offsets and
    // thread counts are on the hot path); u64 only for addresses of 2**63 and more.
    let err = match obj.extract::<i64>() {
        Ok(v) => return Ok(Some(v.into())),
        Err(e) => e,
    };
    if overflow(&err) {
        return match obj.extract::<u64>() {
            Ok(v) => Ok(Some(v.into())),
            Err(e) if overflow(&e) => Ok(None),
            Err(e) => Err(e),
        };
    }
    if !err.is_instance_of::<PyTypeError>(py) {
        return Err(err); // raised by the object's own __index__
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be an int, not {}",
        obj.get_type().name()?
    )))
}

/// `obj` as an int in `lo..=hi`; `ValueError` naming `name` and the range otherwise.
fn in_range<T>(obj: &Bound<'_, PyAny>, name: &str, lo: T, hi: T) -> PyResult<T>
where
    T: TryFrom<i128> + Into<i128> + Copy + std::fmt::Display,
{
    let v = int(obj, name)?;
    match v.and_then(|v| T::try_from(v).ok()) {
        Some(t) if t.into() >= lo.into() && t.into() <= hi.into() => Ok(t),
        _ => Err(PyValueError::new_err(format!(
            "{name} must be an int from {lo} to {hi}, not {}",
            obj.str()?
        ))),
    }
}

/// A count of bytes that the platform can hold: `0..=usize::MAX` as `u64` (the only `usize`
/// this extension builds for is 64 bits wide).
fn bytes(obj: &Bound<'_, PyAny>, name: &str, lo: u64) -> PyResult<usize> {
    if let Some(v) = small_nonnegative_int(obj).filter(|&v| v as u64 >= lo) {
        return Ok(v);
    }
    let v = in_range(obj, name, lo, usize::MAX as u64)?;
    Ok(v as usize)
}

/// `obj` when it is an `int` (or a subclass) from 0 to `isize::MAX`: one C call, for the
/// arguments of the copies, which are on the hot path of every small copy. `None` for
/// anything else, which the full check then takes (and reports).
#[inline]
fn small_nonnegative_int(obj: &Bound<'_, PyAny>) -> Option<usize> {
    if !obj.is_instance_of::<PyInt>() {
        return None;
    }
    // SAFETY: `obj` is a live int (checked above) and we are attached to the interpreter.
    // PyLong_AsSsize_t takes ints only, which it is, and sets an error only for one out of
    // range, which is taken (cleared) below before any other call.
    let v = unsafe { pyo3::ffi::PyLong_AsSsize_t(obj.as_ptr()) };
    if v < 0 {
        // -1 with OverflowError set, or a negative int: the full check decides.
        drop(PyErr::take(obj.py()));
        return None;
    }
    Some(v as usize)
}

/// `offset=`: a byte offset, `0..=usize::MAX` (whether it lies inside the memory is
/// `BoundsError`'s to say).
pub(crate) fn offset(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes(obj, "offset", 0)
}

/// `size=` of a read: `None` (to the end) or a count of bytes.
pub(crate) fn opt_size(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    bytes(obj, "size", 0).map(Some)
}

/// `size=` of a pin: `None` (the whole object) or at least 1 byte.
pub(crate) fn pin_size(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    bytes(obj, "size", 1).map(Some)
}

/// `device=` where `None` means the memory's own device (`gdr.pin`).
pub(crate) fn opt_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    device(obj).map(Some)
}

/// `size=` of an allocation: at least 1 byte.
pub(crate) fn alloc_size(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes(obj, "size", 1)
}

/// `size=` of `AutoCopier.path` and of a host test buffer: any count of bytes.
pub(crate) fn size(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes(obj, "size", 0)
}

/// `align=`: a power of two. The Vulkan backend also caps it (at its block granule) and says
/// so with `ValueError`, but only once it is open.
pub(crate) fn align(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let a = bytes(obj, "align", 1)?;
    if !a.is_power_of_two() {
        return Err(PyValueError::new_err(format!(
            "align must be a power of two, not {a}"
        )));
    }
    Ok(a)
}

/// `threads=`: `1..=MAX_THREADS`.
pub(crate) fn threads(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Some(t) = small_nonnegative_int(obj).filter(|t| (1..=MAX_THREADS).contains(t)) {
        return Ok(t);
    }
    let t = in_range(obj, "threads", 1u64, MAX_THREADS as u64)?;
    Ok(t as usize)
}

/// `device=`: a CUDA device ordinal, `0..=usize::MAX` (whether the device exists is
/// `UnavailableError`'s to say, once the driver is loaded).
pub(crate) fn device(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    bytes(obj, "device", 0)
}

/// A device address, `0..=2**64-1`.
pub(crate) fn addr(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    in_range(obj, "addr", 0, u64::MAX)
}

/// `None` or a pair of ints in `0..=hi`, for DLPack's pairs; `names` name the argument and its
/// two parts.
fn opt_pair<T>(obj: &Bound<'_, PyAny>, names: [&str; 3], hi: T) -> PyResult<Option<(T, T)>>
where
    T: TryFrom<i128> + Into<i128> + Copy + std::fmt::Display + From<u8>,
{
    let [name, first, second] = names;
    if obj.is_none() {
        return Ok(None);
    }
    let (a, b): (Bound<'_, PyAny>, Bound<'_, PyAny>) = obj.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be None or a ({first}, {second}) pair of ints"
        ))
    })?;
    let zero = T::from(0);
    Ok(Some((
        in_range(&a, &format!("{name}'s {first}"), zero, hi)?,
        in_range(&b, &format!("{name}'s {second}"), zero, hi)?,
    )))
}

/// DLPack's `max_version=`: `None` or a `(major, minor)` pair of non-negative 32-bit ints.
pub(crate) fn max_version(obj: &Bound<'_, PyAny>) -> PyResult<Option<(u32, u32)>> {
    opt_pair(obj, ["max_version", "major", "minor"], u32::MAX)
}

/// DLPack's `dl_device=`: `None` or a `(device type, device id)` pair of non-negative 32-bit
/// ints.
pub(crate) fn dl_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    opt_pair(obj, ["dl_device", "device type", "device id"], i32::MAX)
}

/// A shape: an int or a sequence of ints, each `0..=usize::MAX`.
pub(crate) fn shape(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if int(obj, "shape").is_ok() {
        return Ok(vec![bytes(obj, "shape", 0)?]);
    }
    let dims: Vec<Bound<'_, PyAny>> = obj
        .extract()
        .map_err(|_| PyTypeError::new_err("shape must be an int or a sequence of ints"))?;
    dims.iter()
        .map(|d| bytes(d, "each dimension of shape", 0))
        .collect()
}
