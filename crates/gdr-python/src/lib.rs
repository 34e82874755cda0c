//! gdr-python: the `gdr` Python package's extension module, `gdr._gdr`.
//!
//! GPU memory the CPU maps through BAR1 (gdr's Vulkan backend), gdr's copy routines and auto
//! copier on it, pinning of existing tensors and arrays, DLPack and `__cuda_array_interface__`
//! export to PyTorch and CuPy, NumPy views, and `gdr info` / `gdr topo` as data. The Python
//! part of the package (crates/gdr-python/python/gdr) adds the allocator hooks for PyTorch and
//! CuPy and the exception classes.
//!
//! Layers: `mem` (the memory every Python object shares through an `Arc`), `pybuf` (bytes-like
//! objects through the buffer protocol), `dlpack` (capsules), `dtype`; then the Python classes
//! (`handle` shared by `buffer` and `pin`, `gpu`), and `bench`, the Rust side of the
//! package's benchmarks. Unsafe code is only at the CPython and DLPack
//! edges (`pybuf`, `dlpack`) and where memory is owned (`mem`).
//!
//! Nothing here needs a GPU, CUDA or Vulkan to load: they are loaded on first use, and what is
//! missing is raised then as `gdr.UnavailableError`.

mod args;
mod bench;
mod buffer;
mod dlpack;
mod dtype;
mod errors;
mod gpu;
mod handle;
mod mem;
mod pin;
mod pybuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// `json.loads(text)`: gdr's serde data as Python dicts and lists.
pub(crate) fn json_loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOADS.import(py, "json", "loads")?.call1((text,))
}

/// `8 B`, `4 KiB`, `1 MiB` for messages.
pub(crate) fn size_name(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Number of CUDA devices. Raises `gdr.UnavailableError` without the driver.
#[pyfunction]
fn device_count(py: Python<'_>) -> PyResult<usize> {
    py.detach(gdr::cuda::Device::count).map_err(errors::cuda)
}

/// The CUDA device ordinal that owns device address `addr` (`cuPointerGetAttribute`).
#[pyfunction]
fn pointer_device(py: Python<'_>, #[pyo3(from_py_with = args::addr)] addr: u64) -> PyResult<usize> {
    py.detach(move || gdr::cuda::pointer_device(addr))
        .map_err(errors::cuda)
}

/// What `gdr info --json` reports, as a dict: driver, NVML, NVRTC and Vulkan loader versions,
/// gdrdrv, each GPU (BAR1, PCIe, attributes, which mapping backends work) and `missing`, the
/// list of what is not there and why. Never raises for what is missing: it reports it.
#[pyfunction]
fn info(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let text = py
        .detach(|| serde_json::to_string(&gdr::info::gather()))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    json_loads(py, &text)
}

fn topology(py: Python<'_>, sysfs: &str) -> PyResult<gdr::topo::Topology> {
    let sysfs = sysfs.to_owned();
    py.detach(move || {
        let mut t = gdr::topo::Topology::read(&sysfs)?;
        if sysfs == "/sys" {
            // NVLink counts come from NVML (sysfs has none); without NVML the matrix is PCIe only.
            if let Ok(links) = gdr::nvml::nvlinks() {
                let parsed: Vec<_> = links
                    .iter()
                    .filter_map(|(a, b, n)| Some((a.parse().ok()?, b.parse().ok()?, *n)))
                    .collect();
                let _ = t.set_nvlinks(&parsed);
            }
        }
        Ok::<_, gdr::topo::TopoError>(t)
    })
    .map_err(|e| errors::Exc::Gdr.err(e.to_string()))
}

/// `gdr topo --json` as a dict: the devices (GPUs and their peers, or every endpoint with
/// `all`), bridges and switches, and every pair with its path class (PIX, PXB, PHB, NODE, SYS,
/// NV#), verdict (good, works-slower, poor-or-unsupported) and reasons. `sysfs` reads a capture
/// instead of /sys.
#[pyfunction]
#[pyo3(signature = (sysfs = "/sys", all = false))]
fn topo<'py>(py: Python<'py>, sysfs: &str, all: bool) -> PyResult<Bound<'py, PyAny>> {
    let t = topology(py, sysfs)?;
    let shown = if all { t.endpoints() } else { t.gpu_view() };
    let text = serde_json::to_string(&t.report(&shown))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    json_loads(py, &text)
}

/// `gdr topo --explain A B --json` as a dict: the path between two devices hop by hop, with
/// its verdict and reasons. A and B: an address (`0000:17:00.0`), a name (`gpu0`, `mlx5_0`)
/// or a matrix label (`GPU0`).
#[pyfunction]
#[pyo3(signature = (a, b, sysfs = "/sys"))]
fn topo_explain<'py>(
    py: Python<'py>,
    a: &str,
    b: &str,
    sysfs: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let t = topology(py, sysfs)?;
    let bad = |e: gdr::topo::TopoError| PyValueError::new_err(e.to_string());
    let path = t
        .path(t.find(a).map_err(bad)?.bdf, t.find(b).map_err(bad)?.bdf)
        .map_err(bad)?;
    let text = serde_json::to_string(&path).map_err(|e| PyValueError::new_err(e.to_string()))?;
    json_loads(py, &text)
}

/// A buffer of ordinary host memory with the Python surface of `Buffer` (its DLPack device is
/// the CPU, it has no device pointer): for tests of the Python layer on machines without a
/// GPU. Not for use otherwise.
#[pyfunction]
fn _host_buffer(#[pyo3(from_py_with = args::size)] size: usize) -> buffer::Buffer {
    buffer::Buffer::new(mem::Mem::host(size))
}

/// How many pieces of gdr memory are alive (buffers, pins and the ranges they share), for tests
/// of lifetimes: memory must go when, and only when, the last object holding it does.
#[pyfunction]
fn _live_memories() -> usize {
    mem::live_count()
}

/// `gdr.open`'s argument, checked by the extractor of `Gpu(device)` so that the cache of
/// opened GPUs is keyed by a plain int.
#[pyfunction]
fn _device_arg(#[pyo3(from_py_with = args::device)] device: usize) -> usize {
    device
}

/// `gdr.alloc`'s arguments, checked by the extractors of `Gpu.alloc` before the wrapper opens
/// the GPU: a bad argument raises `TypeError`/`ValueError` on any machine, not
/// `UnavailableError` on one without a GPU.
#[pyfunction]
fn _alloc_args(
    #[pyo3(from_py_with = args::alloc_size)] size: usize,
    #[pyo3(from_py_with = args::device)] device: usize,
    #[pyo3(from_py_with = args::align)] align: usize,
) -> (usize, usize, usize) {
    (size, device, align)
}

/// `gdr.pin`'s `size` and `device`, checked as `Gpu.pin` checks them, before the wrapper asks
/// the driver which device the memory is on.
#[pyfunction]
fn _pin_args(
    #[pyo3(from_py_with = args::pin_size)] size: Option<usize>,
    #[pyo3(from_py_with = args::opt_device)] device: Option<usize>,
) -> (Option<usize>, Option<usize>) {
    (size, device)
}

#[pymodule]
fn _gdr(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<gpu::Gpu>()?;
    m.add_class::<gpu::AutoCopier>()?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<buffer::View>()?;
    m.add_class::<pin::Pin>()?;
    m.add_class::<handle::ArrayInterface>()?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(pointer_device, m)?)?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(topo, m)?)?;
    m.add_function(wrap_pyfunction!(topo_explain, m)?)?;
    m.add_function(wrap_pyfunction!(_host_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(_live_memories, m)?)?;
    m.add_function(wrap_pyfunction!(_device_arg, m)?)?;
    m.add_function(wrap_pyfunction!(_alloc_args, m)?)?;
    m.add_function(wrap_pyfunction!(_pin_args, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_rust_copy_loop, m)?)?;
    Ok(())
}
