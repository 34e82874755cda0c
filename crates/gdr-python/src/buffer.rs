//! `gdr.Buffer` (GPU memory with a CPU mapping) and `gdr.View` (a typed window on it for
//! frameworks).

use crate::args;
use crate::dlpack::{self, Request};
use crate::dtype::{self, DType};
use crate::errors;
use crate::handle::{self, Handle};
use crate::mem::Mem;
use gdr::mem::{check_range, MappedMemory};
use pyo3::exceptions::{PyAttributeError, PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::sync::Arc;

/// GPU memory that is at once a CUDA device pointer and a write-combined CPU mapping (BAR1).
///
/// Made by `Gpu.alloc`. `write`/`read`/`read_into` copy through the mapping with gdr's stream
/// stores and loads; frameworks take the memory without a copy through DLPack
/// (`torch.from_dlpack(buf)`, `cupy.from_dlpack(buf)`) or `__cuda_array_interface__`, as
/// 1-D uint8 (use `view()` for other types and shapes). `numpy()` is a NumPy view of the
/// mapping itself: fast to write, slow to read (see docs/python.md).
///
/// `close()` (or leaving a `with` block) lets go of the memory; tensors, arrays and views made
/// from the buffer keep it until they are gone.
#[pyclass(frozen, module = "gdr", name = "Buffer")]
pub(crate) struct Buffer {
    pub(crate) h: Handle,
}

const WHAT: &str = "the buffer";

impl Buffer {
    pub(crate) fn new(mem: Arc<Mem>) -> Buffer {
        Buffer {
            h: Handle::new(mem),
        }
    }
}

handle::handle_pymethods! {
    impl Buffer (WHAT);
    /// Writes a bytes-like object (bytes, bytearray, memoryview, a contiguous NumPy array) at
    /// `offset`. When it returns, the bytes are visible to GPU work started afterwards.
    #[inline]
    fn write;

    /// Reads `size` bytes at `offset` (to the end when `size` is None) into a new `bytes`.
    fn read;

    /// Fills the writable bytes-like object `out` (bytearray, NumPy array, ...) from `offset`;
    /// returns the number of bytes read.
    #[inline]
    fn read_into;

    /// Makes stores through `numpy()` views visible to the GPU (a store fence). `write()` needs
    /// none: it ends with one.
    fn fence;

    /// A NumPy array over the CPU mapping itself, without a copy: `shape` elements of `dtype`
    /// at `offset`. Writing through it is fast (call `fence()` before the GPU reads); reading
    /// through it is slow (uncached loads of write-combined memory: use `read_into`).
    fn numpy;

    /// A typed window on the memory for frameworks (`torch.from_dlpack(buf.view("float32"))`):
    /// `shape` elements of `dtype` at `offset` (as many as fit when `shape` is None).
    #[pyo3(signature = (dtype = None, shape = None, offset = 0))]
    fn view(
        &self,
        dtype: Option<&Bound<'_, PyAny>>,
        shape: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = args::offset)] offset: usize,
    ) -> PyResult<View> {
        let mem = self.h.get(WHAT)?;
        let dt = match dtype {
            Some(d) if !d.is_none() => DType::parse(d)?,
            _ => dtype::UINT8,
        };
        View::new(mem, dt, shape, offset)
    }

    /// The CUDA device address of the first byte.
    #[getter]
    fn device_ptr(&self) -> PyResult<u64> {
        device_ptr(&*self.h.get(WHAT)?)
    }

    /// The CUDA device ordinal (None for the host memory of `_host_buffer`).
    #[getter]
    fn device(&self) -> PyResult<Option<usize>> {
        Ok(self.h.get(WHAT)?.device())
    }

    /// Bytes in the buffer (also `len(buf)`); `ClosedError` once closed, as every use.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        self.h.open_len(WHAT)
    }

    /// Lets go of the memory. It is freed now unless tensors, arrays or views made from the
    /// buffer still use it; those keep it until they are gone. Closing twice is allowed.
    fn close(&self) {
        self.h.close();
    }

    fn __repr__(&self) -> String {
        match self.h.get(WHAT) {
            Ok(m) => match (m.device(), m.device_ptr()) {
                (Some(d), Some(p)) => {
                    format!("<gdr.Buffer {} bytes on GPU {d} at {p:#x}>", self.h.len())
                }
                _ => format!("<gdr.Buffer {} bytes of host memory>", self.h.len()),
            },
            Err(_) => format!("<gdr.Buffer {} bytes, closed>", self.h.len()),
        }
    }

    /// The CUDA Array Interface (version 3): the whole buffer as 1-D uint8.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Noted first, so that a close() racing with this keeps the memory.
        self.h.interface_given();
        let mem = self.h.get(WHAT)?;
        cuda_array_interface(py, &mem, 0, &[mem.size()], dtype::UINT8)
    }

    /// DLPack export (1-D uint8); `max_version >= (1, 0)` gives a versioned tensor.
    #[pyo3(signature = (stream = None, *, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = args::max_version)] max_version: Option<(u32, u32)>,
        #[pyo3(from_py_with = args::dl_device)] dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream; // the bytes are in place when a write returns: nothing to order
        let mem = self.h.get(WHAT)?;
        let size = mem.size();
        let req = Request {
            max_version,
            dl_device,
            copy,
        };
        dlpack::export(py, mem, 0, &[size], dtype::UINT8, &req)
    }

    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        Ok(dlpack::device_of(&*self.h.get(WHAT)?))
    }
}

fn device_ptr(mem: &Mem) -> PyResult<u64> {
    mem.device_ptr()
        .ok_or_else(|| PyAttributeError::new_err("host memory has no CUDA device address"))
}

/// `__cuda_array_interface__` (v3) for `shape` elements of `dtype` at `offset` of `mem`.
fn cuda_array_interface<'py>(
    py: Python<'py>,
    mem: &Mem,
    offset: usize,
    shape: &[usize],
    dtype: DType,
) -> PyResult<Bound<'py, PyDict>> {
    let ptr = device_ptr(mem)?;
    let typestr = dtype.typestr().ok_or_else(|| {
        PyAttributeError::new_err(format!(
            "__cuda_array_interface__ cannot name {}; use DLPack",
            dtype.name
        ))
    })?;
    let d = PyDict::new(py);
    d.set_item("version", 3)?;
    d.set_item("shape", PyTuple::new(py, shape)?)?;
    d.set_item("typestr", typestr)?;
    d.set_item("data", (ptr + offset as u64, false))?;
    d.set_item("strides", py.None())?;
    // The bytes are in place when a write returns: no stream to wait on.
    d.set_item("stream", py.None())?;
    Ok(d)
}

/// A typed, shaped window on gdr memory (C-contiguous), for frameworks: `__dlpack__`,
/// `__dlpack_device__` and `__cuda_array_interface__`. Holds the memory while it lives.
#[pyclass(frozen, module = "gdr", name = "View")]
pub(crate) struct View {
    mem: Arc<Mem>,
    offset: usize,
    shape: Vec<usize>,
    dtype: DType,
}

impl View {
    pub(crate) fn new(
        mem: Arc<Mem>,
        dtype: DType,
        shape: Option<&Bound<'_, PyAny>>,
        offset: usize,
    ) -> PyResult<View> {
        let size = mem.size();
        check_range(offset, 0, size).map_err(errors::access)?;
        let shape = dtype::parse_shape(shape, size - offset, dtype)?;
        let nbytes = dtype::nbytes(&shape, dtype)
            .ok_or_else(|| PyOverflowError::new_err("shape too large"))?;
        check_range(offset, nbytes, size).map_err(errors::access)?;
        if mem.device().is_some() && !offset.is_multiple_of(dtype.itemsize()) {
            return Err(PyValueError::new_err(format!(
                "offset {offset} is not a multiple of {}'s size ({} bytes): CUDA needs aligned \
                 elements",
                dtype.name,
                dtype.itemsize()
            )));
        }
        Ok(View {
            mem,
            offset,
            shape,
            dtype,
        })
    }
}

#[pymethods]
impl View {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The element type's name (`"float32"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }

    #[getter]
    fn nbytes(&self) -> usize {
        dtype::nbytes(&self.shape, self.dtype).unwrap_or(0)
    }

    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    #[getter]
    fn device_ptr(&self) -> PyResult<u64> {
        Ok(device_ptr(&self.mem)? + self.offset as u64)
    }

    /// The first dimension, as for arrays.
    fn __len__(&self) -> PyResult<usize> {
        self.shape
            .first()
            .copied()
            .ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("len() of a 0-d view"))
    }

    fn __repr__(&self) -> String {
        format!(
            "<gdr.View {} {:?} at offset {} of {} bytes>",
            self.dtype.name,
            self.shape,
            self.offset,
            self.mem.size()
        )
    }

    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cuda_array_interface(py, &self.mem, self.offset, &self.shape, self.dtype)
    }

    #[pyo3(signature = (stream = None, *, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = args::max_version)] max_version: Option<(u32, u32)>,
        #[pyo3(from_py_with = args::dl_device)] dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let req = Request {
            max_version,
            dl_device,
            copy,
        };
        dlpack::export(
            py,
            self.mem.clone(),
            self.offset,
            &self.shape,
            self.dtype,
            &req,
        )
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        dlpack::device_of(&self.mem)
    }
}
