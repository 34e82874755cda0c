//! gdr's errors as Python exceptions.
//!
//! The exception classes are defined in Python (`gdr/_errors.py`), where a class can have two
//! bases (`OutOfMemoryError` is a `MemoryError` too, `BoundsError` an `IndexError`); this module
//! maps every Rust error of gdr to one of them, with the Rust error's message, which says what
//! is missing and how to get it.

use gdr::bar::{BarError, PinError};
use gdr::cuda::CudaError;
use gdr::mem::AccessError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes of `gdr._errors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exc {
    /// Base of every gdr error.
    Gdr,
    /// Something this machine lacks (driver, GPU, Vulkan, BAR1, a backend, a library).
    Unavailable,
    /// A CUDA call failed.
    Cuda,
    OutOfMemory,
    /// Memory that cannot be pinned or mapped.
    Pin,
    /// Use of a closed buffer or pin.
    Closed,
    /// An access outside the memory.
    Bounds,
}

impl Exc {
    fn name(self) -> &'static str {
        match self {
            Exc::Gdr => "GdrError",
            Exc::Unavailable => "UnavailableError",
            Exc::Cuda => "CudaError",
            Exc::OutOfMemory => "OutOfMemoryError",
            Exc::Pin => "PinError",
            Exc::Closed => "ClosedError",
            Exc::Bounds => "BoundsError",
        }
    }

    fn cell(self) -> &'static PyOnceLock<Py<PyType>> {
        static CELLS: [PyOnceLock<Py<PyType>>; 7] = [
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
        ];
        &CELLS[self as usize]
    }

    /// The error, raised as this class with `msg`.
    pub(crate) fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(
            |py| match self.cell().import(py, "gdr._errors", self.name()) {
                Ok(ty) => PyErr::from_type(ty.clone(), msg),
                // Only if the package is broken: say so rather than lose the message.
                Err(e) => e,
            },
        )
    }
}

pub(crate) fn cuda(e: CudaError) -> PyErr {
    let kind = match &e {
        CudaError::Load(_)
        | CudaError::NoDevice
        | CudaError::MissingNodes { .. }
        | CudaError::BadOrdinal { .. } => Exc::Unavailable,
        e if e.is_out_of_memory() => Exc::OutOfMemory,
        CudaError::OutOfBounds { .. } => Exc::Bounds,
        _ => Exc::Cuda,
    };
    kind.err(e.to_string())
}

pub(crate) fn bar(e: BarError) -> PyErr {
    let kind = match e {
        BarError::Cuda(c) => return cuda(c),
        BarError::NoLoader(_)
        | BarError::NoIcd { .. }
        | BarError::DeviceNotFound { .. }
        | BarError::NoHostVisibleVram
        | BarError::NoInterop(_) => Exc::Unavailable,
        BarError::OutOfMemory { .. } => Exc::OutOfMemory,
        BarError::BadLayout(ref why) => return PyValueError::new_err(why.clone()),
        BarError::Access(a) => return access(a),
        BarError::Vulkan { .. } => Exc::Gdr,
    };
    kind.err(e.to_string())
}

pub(crate) fn pin(e: PinError) -> PyErr {
    let kind = match e {
        PinError::Cuda(c) => return cuda(c),
        PinError::Bar(b) => return bar(b),
        PinError::Access(a) => return access(a),
        PinError::NoBackend(_) => Exc::Unavailable,
        PinError::UnknownBackend(_) | PinError::Empty { .. } => {
            return PyValueError::new_err(e.to_string())
        }
        PinError::Peer(ref p) if p.is_out_of_memory() => Exc::OutOfMemory,
        _ => Exc::Pin,
    };
    kind.err(e.to_string())
}

pub(crate) fn access(e: AccessError) -> PyErr {
    Exc::Bounds.err(e.to_string())
}

pub(crate) fn closed(what: &str) -> PyErr {
    Exc::Closed.err(format!("{what} is closed"))
}
