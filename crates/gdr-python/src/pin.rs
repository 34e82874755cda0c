//! `gdr.Pin`: existing GPU memory (a tensor, an array) pinned and mapped for the CPU.

use crate::args;
use crate::buffer::{Buffer, View};
use crate::errors;
use crate::handle::{self, Handle};
use crate::mem::{Backing, Mem};
use gdr::mem::MappedMemory;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt};
use pyo3::PyTraverseError;
use std::sync::Arc;

/// Existing GPU memory pinned and mapped for the CPU, made by `Gpu.pin` / `gdr.pin`.
///
/// It holds the object it was made from (a tensor, an array), so that object's memory cannot be
/// freed while mapped; `close()` (or leaving a `with` block, or the pin being collected) unmaps
/// and unpins, then lets the object go. NumPy views of the pin hold it until they are gone.
#[pyclass(frozen, module = "gdr", name = "Pin")]
pub(crate) struct Pin {
    h: Handle,
}

const WHAT: &str = "the pin";

impl Pin {
    pub(crate) fn new(mem: Arc<Mem>) -> Pin {
        Pin {
            h: Handle::new(mem),
        }
    }
}

/// `(device address, bytes, owner)` of what `Gpu.pin` was given.
pub(crate) fn resolve(
    obj: &Bound<'_, PyAny>,
    size: Option<usize>,
) -> PyResult<(u64, usize, Option<Py<PyAny>>)> {
    let owner = Some(obj.clone().unbind());
    let fit = |avail: usize| -> PyResult<usize> {
        match size {
            Some(s) if s > avail => Err(PyValueError::new_err(format!(
                "size {s} is larger than the object's {avail} bytes"
            ))),
            Some(s) => Ok(s),
            None => Ok(avail),
        }
    };
    if let Ok(b) = obj.cast::<Buffer>() {
        let mem = b.get().h.get("the buffer")?;
        let addr = mem
            .device_ptr()
            .ok_or_else(|| PyTypeError::new_err("host memory (a _host_buffer) cannot be pinned"))?;
        return Ok((addr, fit(mem.size())?, owner));
    }
    if let Ok(v) = obj.cast::<View>() {
        let addr: u64 = v.getattr("device_ptr")?.extract()?;
        let n: usize = v.getattr("nbytes")?.extract()?;
        return Ok((addr, fit(n)?, owner));
    }
    if obj.is_instance_of::<PyInt>() {
        let addr = args::addr(obj)?;
        let size = size.ok_or_else(|| {
            PyTypeError::new_err("pinning a device address needs its size: pin(addr, size)")
        })?;
        return Ok((addr, size, None));
    }
    let cai = obj.getattr("__cuda_array_interface__");
    if let Ok(cai) = &cai {
        if let Ok(d) = cai.cast::<PyDict>() {
            let (addr, n) = from_interface(d)?;
            return Ok((addr, fit(n)?, owner));
        }
    }
    // PyTorch refuses __cuda_array_interface__ on tensors that require grad.
    if let (Ok(ptr), Ok(nbytes)) = (obj.getattr("data_ptr"), obj.getattr("nbytes")) {
        if obj
            .call_method0("is_contiguous")
            .and_then(|c| c.extract::<bool>())
            .is_ok_and(|c| !c)
        {
            return Err(PyValueError::new_err(
                "the tensor is not contiguous: pin tensor.contiguous()",
            ));
        }
        let addr: u64 = ptr.call0()?.extract()?;
        return Ok((addr, fit(nbytes.extract()?)?, owner));
    }
    Err(match cai {
        Err(e) => PyTypeError::new_err(format!(
            "cannot pin a {}: give a CUDA tensor or array (with __cuda_array_interface__), a \
             gdr buffer, or a device address and size ({e})",
            obj.get_type().name()?
        )),
        Ok(_) => PyTypeError::new_err("__cuda_array_interface__ is not a dict"),
    })
}

/// Address and bytes of a C-contiguous `__cuda_array_interface__`.
fn from_interface(d: &Bound<'_, PyDict>) -> PyResult<(u64, usize)> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("__cuda_array_interface__ lacks {k:?}")))
    };
    let (addr, _readonly): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<usize> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let itemsize: usize = typestr
        .get(2..)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| PyValueError::new_err(format!("typestr {typestr:?} has no item size")))?;
    let n = shape
        .iter()
        .try_fold(itemsize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| PyValueError::new_err("shape too large"))?;
    if let Some(strides) = d.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<usize> = strides.extract()?;
        let mut want = itemsize;
        for (i, &dim) in shape.iter().enumerate().rev() {
            if dim > 1 && strides[i] != want {
                return Err(PyValueError::new_err(
                    "the array is not C-contiguous: pin a contiguous copy",
                ));
            }
            want *= dim;
        }
    }
    Ok((addr, n))
}

handle::handle_pymethods! {
    impl Pin (WHAT);
    /// Writes a bytes-like object at `offset` (stream stores, then a store fence).
    fn write;

    /// Reads `size` bytes at `offset` (to the end when None) into a new `bytes`.
    fn read;

    /// Fills the writable bytes-like object `out` from `offset`; returns the bytes read.
    fn read_into;

    /// Makes stores through `numpy()` views visible to the GPU (a store fence).
    fn fence;

    /// A NumPy array over the mapping itself (no copy); see `Buffer.numpy`.
    fn numpy;

    /// The device address of the first pinned byte (the object's own address).
    #[getter]
    fn device_ptr(&self) -> PyResult<u64> {
        let mem = self.h.get(WHAT)?;
        mem.device_ptr()
            .ok_or_else(|| errors::Exc::Gdr.err("a pin has a device address"))
    }

    #[getter]
    fn device(&self) -> PyResult<Option<usize>> {
        Ok(self.h.get(WHAT)?.device())
    }

    /// How the memory is mapped: `vulkan`, `dmabuf` or `gdrdrv` (a pin), or `buffer` (memory
    /// of a gdr buffer, mapped through the buffer).
    #[getter]
    fn backend(&self) -> PyResult<&'static str> {
        Ok(self.h.get(WHAT)?.kind())
    }

    /// The range the backend pinned, rounded to its granularity: (device address, bytes).
    #[getter]
    fn pinned_range(&self) -> PyResult<(u64, u64)> {
        let mem = self.h.get(WHAT)?;
        Ok(match mem.backing() {
            Backing::Pinned(p) => (p.pinned().start(), p.pinned().pinned_len()),
            _ => (mem.device_ptr().unwrap_or(0), mem.size() as u64),
        })
    }

    /// Whether the memory was freed while pinned (gdrdrv's callback; the other backends keep
    /// it allocated while pinned, so False).
    #[getter]
    fn freed(&self) -> PyResult<bool> {
        let mem = self.h.get(WHAT)?;
        Ok(match mem.backing() {
            Backing::Pinned(p) => p.pinned().callback_fired().unwrap_or(false),
            _ => false,
        })
    }

    /// The object the pin was made from (None for a bare address).
    #[getter]
    fn obj(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self.h.get(WHAT)?.owner().map(|o| o.clone_ref(py)))
    }

    /// Bytes pinned (also `len(pin)`); `ClosedError` once closed, as every use.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        self.h.open_len(WHAT)
    }

    /// Unmaps and unpins (once no NumPy view of the pin is left), then lets the object go.
    fn close(&self) {
        self.h.close();
    }

    fn __repr__(&self) -> String {
        match self.h.get(WHAT) {
            Ok(m) => format!(
                "<gdr.Pin {} bytes on GPU {} at {:#x} ({})>",
                self.h.len(),
                m.device().unwrap_or(0),
                m.device_ptr().unwrap_or(0),
                m.kind()
            ),
            Err(_) => format!("<gdr.Pin {} bytes, closed>", self.h.len()),
        }
    }

    /// The owner is reachable through this pin only when nothing else (a NumPy view, a copy in
    /// progress) shares the memory; only then is it reported, so the collector never counts a
    /// reference twice.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.h.with_sole_owner(|o| visit.call(o)).unwrap_or(Ok(()))
    }

    fn __clear__(&self) {
        self.h.close();
    }
}
