//! DLPack export (`__dlpack__`): a capsule holding a `DLManagedTensor` (the legacy protocol) or a
//! `DLManagedTensorVersioned` (DLPack 1.0, when the consumer passes `max_version >= (1, 0)`)
//! over gdr memory, as `torch.from_dlpack`, `cupy.from_dlpack` and `numpy.from_dlpack` take
//! them.
//!
//! The tensor's manager context holds an `Arc` of the memory: the memory stays while the
//! consumer's tensor does, whatever happens to the gdr object it came from. The consumer calls
//! the deleter when its tensor goes, from any thread and perhaps without the interpreter; the
//! deleter only drops Rust values. A capsule that is never consumed frees the tensor from its
//! own destructor.

use crate::dtype::DType;
use crate::mem::Mem;
use gdr::mem::MappedMemory;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;

/// The DLPack version this module implements, reported in versioned tensors.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What a tensor's shape and strides point into, and the memory it keeps.
struct Keep {
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    _mem: Arc<Mem>,
}

/// A legacy managed tensor and what it keeps, in one allocation (`managed` first, so a pointer
/// to the holder is a pointer to the managed tensor).
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    keep: Keep,
}

#[repr(C)]
struct Versioned {
    managed: DLManagedTensorVersioned,
    keep: Keep,
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if !p.is_null() {
        // SAFETY: p is the first field of a Legacy boxed by `export` (repr(C)); the consumer
        // calls the deleter once.
        drop(unsafe { Box::from_raw(p.cast::<Legacy>()) });
    }
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if !p.is_null() {
        // SAFETY: as in delete_legacy, for a Versioned.
        drop(unsafe { Box::from_raw(p.cast::<Versioned>()) });
    }
}

/// The capsule's destructor: a capsule that a consumer took was renamed (`used_dltensor`) and
/// its tensor is the consumer's to delete; one never taken still has its name, and its tensor
/// is deleted here.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the capsule being destroyed, attached to the interpreter.
    // PyCapsule_IsValid never raises; PyCapsule_GetPointer cannot fail once IsValid said the
    // name matches.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(d) = (*p).deleter {
                d(p);
            }
        } else if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(d) = (*p).deleter {
                d(p);
            }
        }
    }
}

/// What `__dlpack__` was asked.
pub(crate) struct Request {
    pub(crate) max_version: Option<(u32, u32)>,
    pub(crate) dl_device: Option<(i32, i32)>,
    pub(crate) copy: Option<bool>,
}

/// `(device_type, device_id)` of `mem` for `__dlpack_device__`.
pub(crate) fn device_of(mem: &Mem) -> (i32, i32) {
    match mem.device() {
        Some(d) => (DEVICE_CUDA, d as i32),
        None => (DEVICE_CPU, 0),
    }
}

/// A DLPack capsule over `shape` elements of `dtype` at `offset` of `mem` (C-contiguous; the
/// caller checked that it fits).
pub(crate) fn export<'py>(
    py: Python<'py>,
    mem: Arc<Mem>,
    offset: usize,
    shape: &[usize],
    dtype: DType,
    req: &Request,
) -> PyResult<Bound<'py, PyAny>> {
    let device = device_of(&mem);
    if let Some(want) = req.dl_device {
        if want != device {
            return Err(PyBufferError::new_err(format!(
                "this memory is on DLPack device {device:?}, not {want:?}, and gdr does not copy"
            )));
        }
    }
    if req.copy == Some(true) {
        return Err(PyBufferError::new_err(
            "gdr exports its memory without a copy (copy=True asked for one)",
        ));
    }
    let data = match mem.device_ptr() {
        Some(p) => (p + offset as u64) as *mut c_void,
        None => mem.cpu_ptr().wrapping_add(offset).cast::<c_void>(),
    };
    let shape: Box<[i64]> = shape.iter().map(|&d| d as i64).collect();
    // C-contiguous strides, in elements.
    let mut strides = vec![1i64; shape.len()].into_boxed_slice();
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let mut keep = Keep {
        shape,
        strides,
        _mem: mem,
    };
    let tensor = DLTensor {
        data,
        device: DLDevice {
            device_type: device.0,
            device_id: device.1,
        },
        ndim: keep.shape.len() as i32,
        dtype: DLDataType {
            code: dtype.kind as u8,
            bits: dtype.bits,
            lanes: 1,
        },
        // The boxed slices do not move when `keep` does.
        shape: keep.shape.as_mut_ptr(),
        strides: keep.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let versioned = req.max_version.is_some_and(|(major, _)| major >= 1);
    let (ptr, name): (*mut c_void, &CStr) = if versioned {
        let holder = Box::into_raw(Box::new(Versioned {
            managed: DLManagedTensorVersioned {
                version: VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor,
            },
            keep,
        }));
        // SAFETY: holder is the live box just made.
        unsafe { (*holder).managed.manager_ctx = holder.cast() };
        (holder.cast(), NAME_VERSIONED)
    } else {
        let holder = Box::into_raw(Box::new(Legacy {
            managed: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            keep,
        }));
        // SAFETY: holder is the live box just made.
        unsafe { (*holder).managed.manager_ctx = holder.cast() };
        (holder.cast(), NAME)
    };
    // SAFETY: ptr is a managed tensor owned by the capsule from here on (its destructor, or
    // the consumer, deletes it); the name is a 'static C string.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours to delete, once.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}
