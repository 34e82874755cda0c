"""gdr: GPU memory the CPU maps directly (through BAR1, with no kernel module), for NumPy,
PyTorch and CuPy users.

    import gdr
    gpu = gdr.open(0)                     # GPU 0 (its CUDA primary context)
    with gpu.alloc(1 << 20) as buf:       # 1 MiB: a CUDA device pointer and a CPU mapping
        buf.write(b"hello", 0)            # stream stores straight into GPU memory
        t = torch.from_dlpack(buf)        # the same memory as a CUDA tensor, no copy
        print(buf.read(5))                # stream loads back

Importing needs no GPU, CUDA or Vulkan; what is missing is raised on first use as
:class:`gdr.UnavailableError` (and :func:`gdr.info` lists it all). See docs/python.md.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

from . import _gdr
from ._errors import (
    AllocatorNotFoundError,
    BoundsError,
    ClosedError,
    CudaError,
    GdrError,
    OutOfMemoryError,
    PinError,
    UnavailableError,
)
from ._gdr import (
    AutoCopier,
    Buffer,
    Gpu,
    Pin,
    View,
    __version__,
    device_count,
    info,
    pointer_device,
    topo,
    topo_explain,
)

__all__ = [
    "AllocatorNotFoundError",
    "AutoCopier",
    "BoundsError",
    "Buffer",
    "ClosedError",
    "CudaError",
    "GdrError",
    "Gpu",
    "OutOfMemoryError",
    "Pin",
    "PinError",
    "UnavailableError",
    "View",
    "__version__",
    "alloc",
    "device_count",
    "info",
    "open",
    "pin",
    "pointer_device",
    "topo",
    "topo_explain",
]

_gpus: Dict[int, Gpu] = {}
_gpus_lock = threading.Lock()


def open(device: int = 0) -> Gpu:  # noqa: A001 (gdr.open, as in "open a GPU")
    """The :class:`Gpu` for CUDA device ``device``, opened on first call and shared after.

    Raises :class:`UnavailableError` (saying what is missing) without a driver or GPU."""
    device = _gdr._device_arg(device)  # TypeError/ValueError before the driver is loaded
    with _gpus_lock:
        gpu = _gpus.get(device)
        if gpu is None:
            gpu = _gpus[device] = Gpu(device)
        return gpu


def alloc(size: int, device: int = 0, align: int = 64) -> Buffer:
    """``gdr.open(device).alloc(size, align)``: GPU memory with a CPU mapping."""
    # The arguments are checked before the GPU is opened, so that a bad one is reported as
    # such (TypeError/ValueError) on a machine without a GPU too.
    size, device, align = _gdr._alloc_args(size, device, align)
    return open(device).alloc(size, align)


def pin(obj: Any, size: Optional[int] = None, *, device: Optional[int] = None) -> Pin:
    """Pins and maps existing GPU memory for the CPU: a PyTorch tensor, a CuPy array (anything
    with ``__cuda_array_interface__``), a gdr buffer or view, or a device address with
    ``size``. The device is the memory's own unless given. See :meth:`Gpu.pin`."""
    size, device = _gdr._pin_args(size, device)  # checked before the driver is asked
    if device is None:
        device = pointer_device(_address_of(obj))
    return open(device).pin(obj, size)


def _address_of(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    if isinstance(obj, (Buffer, View)):
        return obj.device_ptr
    try:
        return int(obj.__cuda_array_interface__["data"][0])
    except Exception:  # PyTorch refuses the interface on tensors that require grad
        data_ptr = getattr(obj, "data_ptr", None)
        if callable(data_ptr):
            return int(data_ptr())
        raise TypeError(
            f"cannot pin a {type(obj).__name__}: give a CUDA tensor or array, a gdr buffer, "
            "or a device address and size"
        ) from None
