//! `gdr.Gpu` (one GPU: allocation, pinning, the auto copier) and `gdr.AutoCopier`.

use crate::args;
use crate::buffer::Buffer;
use crate::errors;
use crate::handle::DETACH_AT;
use crate::mem::{self, Mem};
use crate::pin::{self, Pin};
use crate::pybuf::HeldBuffer;
use gdr::bar::auto::{self, Direction};
use gdr::bar::{MappedBuffer, Pinner, VulkanBackend};
use gdr::cuda::{Context, Device};
use gdr::mem::{check_range, MappedMemory};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex};

/// One GPU: its CUDA primary context (shared with PyTorch and CuPy), BAR-mapped allocation,
/// pinning of existing memory and the auto copier. `gdr.open(n)` returns one per device.
#[pyclass(frozen, module = "gdr", name = "Gpu")]
pub(crate) struct Gpu {
    ordinal: usize,
    ctx: Context,
    backend: Mutex<Option<VulkanBackend>>,
    pinner: Mutex<Option<Pinner>>,
    auto: Mutex<Option<Py<AutoCopier>>>,
    /// Held while the auto copier calibrates, so that two threads do not calibrate at once
    /// (each would time the other's copies). Waited for detached from the interpreter: the
    /// calibrating thread needs it back to finish.
    calibrating: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gpu {
    /// The Vulkan backend, opened on first use.
    fn backend(&self, py: Python<'_>) -> PyResult<VulkanBackend> {
        if let Some(b) = lock(&self.backend).as_ref() {
            return Ok(b.clone());
        }
        let ctx = self.ctx.clone();
        let be = py
            .detach(move || VulkanBackend::new(&ctx))
            .map_err(errors::bar)?;
        Ok(lock(&self.backend).get_or_insert(be).clone())
    }

    /// The pinning backend (GDR_BACKEND, else the first that works here), chosen on first use.
    fn pinner(&self, py: Python<'_>) -> PyResult<Pinner> {
        if let Some(p) = lock(&self.pinner).as_ref() {
            return Ok(p.clone());
        }
        let ctx = self.ctx.clone();
        let p = py
            .detach(move || Pinner::new(&ctx, None))
            .map_err(errors::pin)?;
        Ok(lock(&self.pinner).get_or_insert(p).clone())
    }
}

#[pymethods]
impl Gpu {
    /// Opens GPU `device` (its CUDA primary context). Raises `gdr.UnavailableError` saying what
    /// is missing on a machine without the driver or the GPU.
    #[new]
    #[pyo3(signature = (device = 0))]
    fn new(py: Python<'_>, #[pyo3(from_py_with = args::device)] device: usize) -> PyResult<Gpu> {
        let ctx = py
            .detach(move || Device::get(device).and_then(Context::new))
            .map_err(errors::cuda)?;
        Ok(Gpu {
            ordinal: device,
            ctx,
            backend: Mutex::new(None),
            pinner: Mutex::new(None),
            auto: Mutex::new(None),
            calibrating: Mutex::new(()),
        })
    }

    #[getter]
    fn device(&self) -> usize {
        self.ordinal
    }

    #[getter]
    fn name(&self) -> PyResult<String> {
        self.ctx.device().name().map_err(errors::cuda)
    }

    /// PCI bus id, as `0000:17:00.0`.
    #[getter]
    fn bus_id(&self) -> PyResult<String> {
        self.ctx.device().pci_bus_id().map_err(errors::cuda)
    }

    fn __repr__(&self) -> String {
        let d = self.ctx.device();
        format!(
            "<gdr.Gpu {} {:?} at {}>",
            self.ordinal,
            d.name().unwrap_or_default(),
            d.pci_bus_id().unwrap_or_default()
        )
    }

    /// Allocates `size` bytes (at least 1) of GPU memory with a CPU mapping, aligned to `align`
    /// (a power of two up to 2 MiB; smaller ones give 64) on both sides.
    #[pyo3(signature = (size, align = 64))]
    fn alloc(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = args::alloc_size)] size: usize,
        #[pyo3(from_py_with = args::align)] align: usize,
    ) -> PyResult<Buffer> {
        let be = self.backend(py)?;
        // Vulkan leaves an allocation larger than its heap undefined (a valid-usage rule, not an
        // error code): refuse it here.
        let heap = be.info().heap_size;
        if size as u64 > heap {
            return Err(errors::bar(gdr::bar::BarError::OutOfMemory { size, heap }));
        }
        let ctx = self.ctx.clone();
        let buf = py
            .detach(move || {
                ctx.bind()?;
                be.alloc(size, align)
            })
            .map_err(errors::bar)?;
        Ok(Buffer::new(Mem::mapped(buf, self.ordinal)))
    }

    /// Pins existing GPU memory and maps it for the CPU: a PyTorch tensor or CuPy array (any
    /// object with `__cuda_array_interface__`, C-contiguous), a gdr buffer or view, or a device
    /// address with `size`. The pin holds the object, so it cannot be freed while mapped.
    ///
    /// Works for memory gdr allocated, memory of gdr's allocator (libgdr_alloc), `cuMemCreate`
    /// memory made with a POSIX-fd handle (PyTorch's expandable segments), and any memory on
    /// hosts with gdrdrv or CUDA 13.3+ dma-buf mmap. Raises `gdr.PinError` saying why otherwise.
    #[pyo3(signature = (obj, size = None))]
    fn pin(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::pin_size)] size: Option<usize>,
    ) -> PyResult<Pin> {
        let (addr, len, owner) = pin::resolve(obj, size)?;
        if len == 0 {
            return Err(PyValueError::new_err("nothing to pin: size 0"));
        }
        // Memory of a gdr buffer (a tensor made from one): its own mapping, no pin.
        if let Some((parent, off)) = mem::find_buffer(addr, len) {
            let m = Mem::within(parent, off, len, owner).map_err(errors::access)?;
            return Ok(Pin::new(m));
        }
        let ctx = self.ctx.clone();
        let where_ = py
            .detach(move || {
                ctx.bind()?;
                gdr::cuda::pointer_device(addr)
            })
            .map_err(|e| {
                errors::Exc::Pin.err(format!("{addr:#x} is not CUDA device memory: {e}"))
            })?;
        if where_ != self.ordinal {
            return Err(PyValueError::new_err(format!(
                "{addr:#x} is memory of GPU {where_}, not of GPU {}: use gdr.open({where_})",
                self.ordinal
            )));
        }
        let pinner = self.pinner(py)?;
        let map = py
            .detach(move || pinner.pin(addr, len as u64)?.map())
            .map_err(errors::pin)?;
        Ok(Pin::new(Mem::pinned(map, owner, self.ordinal)))
    }

    /// The pinning backend this GPU uses (`gdrdrv`, `dmabuf` or `vulkan`) and why; chooses it
    /// on first call.
    fn pin_backend(&self, py: Python<'_>) -> PyResult<(String, String)> {
        let p = self.pinner(py)?;
        Ok((p.backend().name().to_owned(), p.reason().to_owned()))
    }

    /// The auto copier of this GPU: for each direction and size, the fastest of the mapping
    /// (1..N threads) and the copy engine. The first use on a machine measures the crossovers
    /// (about ten seconds) and caches them (`$GDR_CACHE_DIR`, else `$XDG_CACHE_HOME/gdr`, else
    /// `~/.cache/gdr`; where that cannot be written, a directory under the temporary one, with
    /// a RuntimeWarning saying so).
    #[pyo3(signature = (recalibrate = false))]
    fn auto_copier(&self, py: Python<'_>, recalibrate: bool) -> PyResult<Py<AutoCopier>> {
        if !recalibrate {
            if let Some(a) = lock(&self.auto).as_ref() {
                return Ok(a.clone_ref(py));
            }
        }
        let _one_at_a_time = self
            .calibrating
            .lock_py_attached(py)
            .unwrap_or_else(|p| p.into_inner());
        if !recalibrate {
            // Made by another thread while this one waited.
            if let Some(a) = lock(&self.auto).as_ref() {
                return Ok(a.clone_ref(py));
            }
        }
        let be = self.backend(py)?;
        let (copier, measured) = py
            .detach(move || {
                be.context().bind()?;
                if recalibrate {
                    auto::AutoCopier::recalibrate(&be).map(|c| (c, true))
                } else {
                    auto::AutoCopier::new(&be)
                }
            })
            .map_err(errors::bar)?;
        // A calibration cache that could not go where it should (a read-only or missing home,
        // as in many containers): said once, as a RuntimeWarning.
        if let Some(note) = auto::take_cache_note() {
            let msg = std::ffi::CString::new(note).unwrap_or_default();
            let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
            PyErr::warn(py, &category, &msg, 1)?;
        }
        let a = Py::new(
            py,
            AutoCopier {
                inner: Arc::new(copier),
                calibrated_now: measured,
            },
        )?;
        *lock(&self.auto) = Some(a.clone_ref(py));
        Ok(a)
    }

    /// Free and total memory of the GPU, in bytes (`cuMemGetInfo`).
    fn mem_info(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        let ctx = self.ctx.clone();
        py.detach(move || {
            ctx.bind()?;
            ctx.mem_info()
        })
        .map_err(errors::cuda)
    }
}

/// Copies between host memory and gdr buffers on the fastest path per direction and size:
/// stream stores/loads through the mapping on one or more threads, or the GPU's copy engine.
/// Made by `Gpu.auto_copier()`.
#[pyclass(frozen, module = "gdr", name = "AutoCopier")]
pub(crate) struct AutoCopier {
    inner: Arc<auto::AutoCopier>,
    calibrated_now: bool,
}

fn as_buffer<'a, 'py>(buf: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, Buffer>> {
    buf.cast::<Buffer>()
        .map_err(|_| PyTypeError::new_err("the auto copier copies to and from gdr.Buffer"))
}

/// Why a buffer cannot take a copy: kept as plain Rust inside [`with_target`], where no Python
/// may run, and made an exception after.
enum NoTarget {
    Range(gdr::mem::AccessError),
    NotOurs,
}

impl From<NoTarget> for PyErr {
    fn from(e: NoTarget) -> PyErr {
        match e {
            NoTarget::Range(e) => errors::access(e),
            NoTarget::NotOurs => PyTypeError::new_err(
                "the auto copier copies to and from memory gdr allocated (Gpu.alloc)",
            ),
        }
    }
}

/// `[offset, offset + len)` of `mem` as the copier sees it: the mapped buffer and the offset in
/// it, checked to be in range and gdr's own memory.
fn locate(mem: &Mem, offset: usize, len: usize) -> Result<(&MappedBuffer, usize), NoTarget> {
    check_range(offset, len, mem.size()).map_err(NoTarget::Range)?;
    let (mb, base) = mem.mapped_buffer().ok_or(NoTarget::NotOurs)?;
    Ok((mb, base + offset))
}

/// The buffer's memory, with a reference held: for copies made detached from the interpreter,
/// which [`locate`] their range in it.
fn held(buf: &Bound<'_, PyAny>) -> PyResult<Arc<Mem>> {
    as_buffer(buf)?.get().h.get("the buffer")
}

/// Runs `f` on the mapped buffer and offset of `[offset, offset + len)` of `buf`, under its
/// handle's read lock, with no reference taken: for short copies made attached, where cloning
/// and dropping the `Arc` is a measurable part of the call (as `Buffer.read_into` does). `f` is
/// plain Rust (see `Handle::with_mem`).
#[inline]
fn with_target<R>(
    buf: &Bound<'_, PyAny>,
    offset: usize,
    len: usize,
    f: impl FnOnce(&MappedBuffer, usize) -> R,
) -> PyResult<R> {
    let r = as_buffer(buf)?.get().h.with_mem("the buffer", |mem| {
        locate(mem, offset, len).map(|(mb, at)| f(mb, at))
    })?;
    Ok(r?)
}

impl AutoCopier {
    /// The Rust copier behind this object (for the benchmark loop in `bench`).
    pub(crate) fn copier(&self) -> &auto::AutoCopier {
        &self.inner
    }
}

fn dir(direction: &str) -> PyResult<Direction> {
    match direction {
        "write" | "to_gpu" | "h2d" => Ok(Direction::ToGpu),
        "read" | "from_gpu" | "d2h" => Ok(Direction::FromGpu),
        _ => Err(PyValueError::new_err(format!(
            "direction {direction:?}: use \"write\" (CPU to GPU) or \"read\" (GPU to CPU)"
        ))),
    }
}

#[pymethods]
impl AutoCopier {
    /// Writes a bytes-like object into `buf` at `offset` on the fastest path for its size.
    #[pyo3(signature = (buf, data, offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::offset)] offset: usize,
    ) -> PyResult<()> {
        let src = HeldBuffer::readable(data)?;
        let bytes = src.as_slice();
        let copier = &self.inner;
        if bytes.len() >= DETACH_AT {
            let mem = held(buf)?;
            let (mb, at) = locate(&mem, offset, bytes.len())?;
            py.detach(|| copier.write(mb, at, bytes))
        } else {
            with_target(buf, offset, bytes.len(), |mb, at| {
                copier.write(mb, at, bytes)
            })?
        }
        .map_err(errors::bar)
    }

    /// Fills the writable bytes-like object `out` from `buf` at `offset` on the fastest path;
    /// returns the number of bytes read.
    #[pyo3(signature = (buf, out, offset = 0))]
    fn read_into(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::offset)] offset: usize,
    ) -> PyResult<usize> {
        let mut dst = HeldBuffer::writable(out)?;
        let n = dst.len();
        let slice = dst.as_mut_slice();
        let copier = &self.inner;
        if n >= DETACH_AT {
            let mem = held(buf)?;
            let (mb, at) = locate(&mem, offset, n)?;
            py.detach(|| copier.read(mb, at, slice))
        } else {
            with_target(buf, offset, n, |mb, at| copier.read(mb, at, slice))?
        }
        .map_err(errors::bar)?;
        Ok(n)
    }

    /// Reads `size` bytes of `buf` at `offset` (to the end when None) into a new `bytes`.
    #[pyo3(signature = (buf, size = None, offset = 0))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = args::opt_size)] size: Option<usize>,
        #[pyo3(from_py_with = args::offset)] offset: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let n = match size {
            Some(n) => n,
            None => buf.len()?.saturating_sub(offset),
        };
        let mem = held(buf)?;
        let (mb, at) = locate(&mem, offset, n)?;
        let copier = &self.inner;
        PyBytes::new_with(py, n, |dst| {
            if n >= DETACH_AT {
                py.detach(|| copier.read(mb, at, dst))
            } else {
                copier.read(mb, at, dst)
            }
            .map_err(errors::bar)
        })
    }

    /// The path the next copy of `size` bytes takes: `direction` is `"write"` (CPU to GPU) or
    /// `"read"`; the answer is `"mapping"`, `"mapping xN"` (N threads) or `"copy engine"`.
    fn path(
        &self,
        direction: &str,
        #[pyo3(from_py_with = args::size)] size: usize,
    ) -> PyResult<String> {
        Ok(self.inner.path_for(dir(direction)?, size).to_string())
    }

    /// Whether this copier measured its crossovers when it was made (rather than reading them
    /// from the cache).
    #[getter]
    fn calibrated_now(&self) -> bool {
        self.calibrated_now
    }

    /// The calibration: the chosen path per power-of-two size class and every median measured.
    fn calibration<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = serde_json::to_string(self.inner.calibration())
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        crate::json_loads(py, &json)
    }

    fn __repr__(&self) -> String {
        let paths = |d| {
            [8usize, 4096, 1 << 20, 64 << 20]
                .iter()
                .map(|&s| format!("{}: {}", crate::size_name(s), self.inner.path_for(d, s)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "<gdr.AutoCopier write [{}] read [{}]>",
            paths(Direction::ToGpu),
            paths(Direction::FromGpu)
        )
    }
}
