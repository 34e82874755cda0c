//! What a `Buffer` and a `Pin` share: the hold on their memory, which `close()` lets go of, and
//! the copies (stream stores and loads through the mapping) and NumPy views made through it.

use crate::dtype::{self, DType};
use crate::errors;
use crate::mem::Mem;
use crate::pybuf::HeldBuffer;
use gdr::mem::{check_range, MappedMemory};
use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Copies of at least this many bytes let other Python threads run meanwhile (detached from
/// the interpreter); shorter ones keep it, since letting go and taking it back costs more than
/// they do.
pub(crate) const DETACH_AT: usize = 64 << 10;

/// A Python object's hold on its memory.
pub(crate) struct Handle {
    mem: RwLock<Option<Arc<Mem>>>,
    /// Set once `__cuda_array_interface__` was handed out: its consumers hold the Python object,
    /// not the memory, so `close()` must keep the memory until the object is collected.
    interface_given: AtomicBool,
    kept: Mutex<Option<Arc<Mem>>>,
    /// Bytes, kept for `repr()` after close.
    len: usize,
}

impl Handle {
    pub(crate) fn new(mem: Arc<Mem>) -> Handle {
        Handle {
            len: mem.size(),
            mem: RwLock::new(Some(mem)),
            interface_given: AtomicBool::new(false),
            kept: Mutex::new(None),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, for `len()` and `nbytes`: `ClosedError` once closed, since docs/python.md
    /// promises that every use of a closed object raises it.
    pub(crate) fn open_len(&self, what: &str) -> PyResult<usize> {
        if self.is_closed() {
            return Err(errors::closed(what));
        }
        Ok(self.len)
    }

    /// The memory, for one operation; `what` names the object in the error when it is closed.
    #[inline]
    pub(crate) fn get(&self, what: &str) -> PyResult<Arc<Mem>> {
        // The lock is let go before the error is made: making it may run Python (an import),
        // and nothing may wait for the interpreter while holding the lock.
        let mem = self.mem.read().unwrap_or_else(|p| p.into_inner()).clone();
        mem.ok_or_else(|| errors::closed(what))
    }

    /// Runs `f` on the memory under the read lock, without taking a reference to it: for
    /// short copies, where cloning and dropping the `Arc` is a measurable part of the call.
    /// `f` must neither run Python nor wait for the interpreter (a `close()` on another thread
    /// waits for the lock while attached), so it is plain Rust: a copy on the calling thread.
    #[inline]
    pub(crate) fn with_mem<R>(&self, what: &str, f: impl FnOnce(&Mem) -> R) -> PyResult<R> {
        let r = {
            let guard = self.mem.read().unwrap_or_else(|p| p.into_inner());
            guard.as_deref().map(f)
        };
        // As in `get`: the error is made after the lock is let go.
        r.ok_or_else(|| errors::closed(what))
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.mem.read().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Calls `f` with the owner of the memory (a pinned tensor) when this handle is the only
    /// holder of the memory; for the garbage collector's traversal, which must not block, run
    /// Python or drop references (so nothing is cloned here).
    pub(crate) fn with_sole_owner<R>(&self, f: impl FnOnce(&Py<PyAny>) -> R) -> Option<R> {
        let guard = self.mem.try_read().ok()?;
        let mem = guard.as_ref()?;
        if Arc::strong_count(mem) != 1 {
            return None;
        }
        mem.owner().map(f)
    }

    /// Notes that a `__cuda_array_interface__` was handed out.
    pub(crate) fn interface_given(&self) {
        self.interface_given.store(true, Ordering::Relaxed);
    }

    /// Lets go of the memory: it is freed now unless a view, a tensor or a copy in progress
    /// still holds it (then when the last of them goes), or a `__cuda_array_interface__` was
    /// handed out (then when this object is collected). Closing twice is allowed.
    pub(crate) fn close(&self) {
        let mem = self.mem.write().unwrap_or_else(|p| p.into_inner()).take();
        if self.interface_given.load(Ordering::Relaxed) {
            if let Some(m) = mem {
                *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
            }
        }
        // Otherwise `mem` drops here, after the lock is released.
    }
}

fn check(offset: usize, len: usize, size: usize) -> PyResult<()> {
    check_range(offset, len, size).map_err(errors::access)
}

/// Writes the bytes of `data` at `offset` (stream stores, store fence).
#[inline]
pub(crate) fn write(
    py: Python<'_>,
    h: &Handle,
    what: &str,
    data: &Bound<'_, PyAny>,
    offset: usize,
    threads: usize,
) -> PyResult<()> {
    let src = HeldBuffer::readable(data)?;
    let bytes = src.as_slice();
    let r = if bytes.len() >= DETACH_AT {
        // Detached, the copy holds a reference rather than the lock: letting go of the lock
        // after the copy needs the interpreter back, which a `close()` waiting for the lock
        // while attached would never give.
        let mem = h.get(what)?;
        py.detach(|| mem.write_parallel(offset, bytes, threads))
    } else {
        h.with_mem(what, |mem| mem.write_parallel(offset, bytes, threads))?
    };
    r.map_err(errors::access)
}

/// Reads `size` bytes (all from `offset` when `None`) into a new `bytes` (stream loads).
pub(crate) fn read<'py>(
    py: Python<'py>,
    h: &Handle,
    what: &str,
    size: Option<usize>,
    offset: usize,
    threads: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let mem = h.get(what)?;
    let total = mem.size();
    let n = match size {
        Some(n) => n,
        None => total.checked_sub(offset).ok_or_else(|| {
            errors::access(gdr::mem::AccessError::OutOfBounds {
                offset,
                len: 0,
                size: total,
            })
        })?,
    };
    check(offset, n, total)?;
    PyBytes::new_with(py, n, |dst| {
        let r = if n >= DETACH_AT {
            py.detach(|| mem.read_parallel(offset, dst, threads))
        } else {
            mem.read_parallel(offset, dst, threads)
        };
        r.map_err(errors::access)
    })
}

/// Reads `len(out)` bytes at `offset` into the writable buffer `out`; returns the count.
#[inline]
pub(crate) fn read_into(
    py: Python<'_>,
    h: &Handle,
    what: &str,
    out: &Bound<'_, PyAny>,
    offset: usize,
    threads: usize,
) -> PyResult<usize> {
    let mut dst = HeldBuffer::writable(out)?;
    let n = dst.len();
    let slice = dst.as_mut_slice();
    let r = if n >= DETACH_AT {
        let mem = h.get(what)?; // a reference, not the lock: see `write`
        py.detach(|| mem.read_parallel(offset, slice, threads))
    } else {
        h.with_mem(what, |mem| mem.read_parallel(offset, slice, threads))?
    };
    r.map_err(errors::access)?;
    Ok(n)
}

/// A NumPy array over the CPU mapping itself (no copy): `shape` elements of `dtype` at
/// `offset`. Its base object holds the memory.
pub(crate) fn numpy_view<'py>(
    py: Python<'py>,
    mem: Arc<Mem>,
    dtype: &Bound<'py, PyAny>,
    shape: Option<&Bound<'py, PyAny>>,
    offset: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let dt = DType::parse(dtype)?;
    let typestr = dt.typestr().ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("NumPy has no {} type", dt.name))
    })?;
    let size = mem.size();
    check(offset, 0, size)?;
    let shape = dtype::parse_shape(shape, size - offset, dt)?;
    let nbytes = dtype::nbytes(&shape, dt)
        .ok_or_else(|| pyo3::exceptions::PyOverflowError::new_err("shape too large"))?;
    check(offset, nbytes, size)?;
    let holder = Bound::new(
        py,
        ArrayInterface {
            address: mem.cpu_ptr() as usize + offset,
            shape,
            typestr,
            _mem: mem,
        },
    )?;
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let asarray = ASARRAY
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            let np = py.import("numpy").map_err(|e| {
                PyImportError::new_err(format!("a NumPy view needs NumPy ({e}): pip install numpy"))
            })?;
            Ok(np.getattr("asarray")?.unbind())
        })?
        .bind(py);
    asarray.call1((holder,))
}

/// The base object of a NumPy view: NumPy reads `__array_interface__` once and keeps this
/// object, which keeps the memory.
#[pyclass(frozen, module = "gdr", name = "_ArrayInterface")]
pub(crate) struct ArrayInterface {
    address: usize,
    shape: Vec<usize>,
    typestr: String,
    _mem: Arc<Mem>,
}

#[pymethods]
impl ArrayInterface {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", &self.typestr)?;
        d.set_item("data", (self.address, false))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }
}

/// The `#[pymethods]` block of a class over a [`Handle`] (its field `h`), with the methods such
/// classes share: the copies (`write`, `read`, `read_into`), `fence` and `numpy`, whose
/// docstrings (and other attributes) each class gives before a bare `fn write;` and so on, and
/// `closed`, `__enter__`, `__exit__` and `__len__`, the same in every class. `$what` names the
/// object in `ClosedError`s ("the buffer"); the class's own methods follow. One block, because
/// PyO3 takes one `#[pymethods]` block a class.
macro_rules! handle_pymethods {
    (
        impl $ty:ident ($what:expr);
        $(# $write:tt)* fn write;
        $(# $read:tt)* fn read;
        $(# $read_into:tt)* fn read_into;
        $(# $fence:tt)* fn fence;
        $(# $numpy:tt)* fn numpy;
        $($rest:tt)*
    ) => {
        #[::pyo3::pymethods]
        impl $ty {
            $(# $write)*
            #[pyo3(signature = (data, offset = 0, *, threads = 1))]
            fn write(
                &self,
                py: ::pyo3::Python<'_>,
                data: &::pyo3::Bound<'_, ::pyo3::PyAny>,
                #[pyo3(from_py_with = crate::args::offset)] offset: usize,
                #[pyo3(from_py_with = crate::args::threads)] threads: usize,
            ) -> ::pyo3::PyResult<()> {
                crate::handle::write(py, &self.h, $what, data, offset, threads)
            }

            $(# $read)*
            #[pyo3(signature = (size = None, offset = 0, *, threads = 1))]
            fn read<'py>(
                &self,
                py: ::pyo3::Python<'py>,
                #[pyo3(from_py_with = crate::args::opt_size)] size: Option<usize>,
                #[pyo3(from_py_with = crate::args::offset)] offset: usize,
                #[pyo3(from_py_with = crate::args::threads)] threads: usize,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'py, ::pyo3::types::PyBytes>> {
                crate::handle::read(py, &self.h, $what, size, offset, threads)
            }

            $(# $read_into)*
            #[pyo3(signature = (out, offset = 0, *, threads = 1))]
            fn read_into(
                &self,
                py: ::pyo3::Python<'_>,
                out: &::pyo3::Bound<'_, ::pyo3::PyAny>,
                #[pyo3(from_py_with = crate::args::offset)] offset: usize,
                #[pyo3(from_py_with = crate::args::threads)] threads: usize,
            ) -> ::pyo3::PyResult<usize> {
                crate::handle::read_into(py, &self.h, $what, out, offset, threads)
            }

            $(# $fence)*
            fn fence(&self) -> ::pyo3::PyResult<()> {
                self.h.get($what)?.publish();
                Ok(())
            }

            $(# $numpy)*
            #[pyo3(signature = (dtype = None, shape = None, offset = 0))]
            fn numpy<'py>(
                &self,
                py: ::pyo3::Python<'py>,
                dtype: Option<&::pyo3::Bound<'py, ::pyo3::PyAny>>,
                shape: Option<&::pyo3::Bound<'py, ::pyo3::PyAny>>,
                #[pyo3(from_py_with = crate::args::offset)] offset: usize,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'py, ::pyo3::PyAny>> {
                let mem = self.h.get($what)?;
                let u8_name = ::pyo3::types::PyString::new(py, "uint8").into_any();
                crate::handle::numpy_view(py, mem, dtype.unwrap_or(&u8_name), shape, offset)
            }

            #[getter]
            fn closed(&self) -> bool {
                self.h.is_closed()
            }

            /// `with` on a closed object raises `ClosedError`, as Python's files do.
            fn __enter__(
                slf: ::pyo3::Bound<'_, Self>,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'_, Self>> {
                slf.get().h.get($what)?;
                Ok(slf)
            }

            #[pyo3(signature = (*_exc))]
            fn __exit__(&self, _exc: &::pyo3::Bound<'_, ::pyo3::types::PyTuple>) -> bool {
                self.h.close();
                false
            }

            fn __len__(&self) -> ::pyo3::PyResult<usize> {
                self.h.open_len($what)
            }

            $($rest)*
        }
    };
}
pub(crate) use handle_pymethods;
