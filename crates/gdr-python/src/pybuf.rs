//! The bytes of a bytes-like object (`bytes`, `bytearray`, `memoryview`, a contiguous NumPy
//! array, `array.array`, ...) through Python's buffer protocol, without a copy.
//!
//! The protocol's two functions joined the limited API only in Python 3.11, so the abi3
//! bindings of PyO3 built for 3.10 leave them out. Every CPython 3 exports them, with the
//! `Py_buffer` layout below unchanged since 3.3, so this module declares them itself: the
//! extension then loads on 3.10 as well as on every later version.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;

/// CPython's `Py_buffer` (Include/pybuffer.h, the same from 3.3 to today).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// `PyBUF_SIMPLE`: a contiguous buffer, no shape or strides (exporters that cannot give one
/// raise `BufferError`, as NumPy does for a non-contiguous array).
const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`.
const PYBUF_WRITABLE: c_int = 1;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// A held buffer of a Python object: its bytes stay where they are (a `bytearray` cannot be
/// resized, a NumPy array cannot be reallocated) until this is dropped. Not `Send`: it is
/// released on the thread, and under the interpreter attachment, that took it.
pub(crate) struct HeldBuffer<'py> {
    view: RawBuffer,
    _py: PhantomData<Python<'py>>,
    /// `*const` keeps the guard on its thread (the release needs the interpreter).
    _not_send: PhantomData<*const ()>,
}

impl<'py> HeldBuffer<'py> {
    /// The bytes of `obj`, read-only.
    pub(crate) fn readable(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE)
    }

    /// The bytes of `obj`, which must be writable (`bytes` is not; `bytearray` and NumPy
    /// arrays are).
    pub(crate) fn writable(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_WRITABLE)
    }

    fn get(obj: &Bound<'py, PyAny>, flags: c_int) -> PyResult<Self> {
        let mut view = RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        };
        // SAFETY: obj is a live object (we hold a reference and are attached); view is a
        // properly laid out Py_buffer that the call fills in.
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(HeldBuffer {
            view,
            _py: PhantomData,
            _not_send: PhantomData,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }

    /// The bytes, for one copy. The exporter keeps them in place while the buffer is held; the
    /// copy routines read them once through the pointer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len() == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter guarantees buf..buf+len is readable and stays so until the
        // release in drop, which borrowck orders after this borrow.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.len()) }
    }

    /// The bytes, writable: only for buffers taken with [`HeldBuffer::writable`].
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len() == 0 || self.view.buf.is_null() {
            return &mut [];
        }
        debug_assert_eq!(self.view.readonly, 0, "taken with PyBUF_WRITABLE");
        // SAFETY: as in as_slice; the buffer was taken with PyBUF_WRITABLE, so the exporter
        // allows writes, and the &mut self borrow keeps this the only slice of it here.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), self.len()) }
    }
}

impl Drop for HeldBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once,
        // on the thread that took it, which is attached to the interpreter ('py).
        unsafe { PyBuffer_Release(&mut self.view) };
    }
}
