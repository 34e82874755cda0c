"""gdr's exception classes. Every error gdr raises is a :class:`GdrError` (or, for bad
arguments, a plain ``ValueError``/``TypeError``)."""

from __future__ import annotations

__all__ = [
    "GdrError",
    "UnavailableError",
    "AllocatorNotFoundError",
    "CudaError",
    "OutOfMemoryError",
    "PinError",
    "ClosedError",
    "BoundsError",
]


class GdrError(RuntimeError):
    """Base class of gdr's errors."""


class UnavailableError(GdrError):
    """Something this machine lacks: the CUDA driver, a GPU, the Vulkan loader or the NVIDIA
    Vulkan driver, a large BAR1, CUDA-Vulkan interop, a pinning backend. The message says what
    is missing and how to get it (``gdr.info()["missing"]`` lists everything at once)."""


class AllocatorNotFoundError(UnavailableError):
    """gdr's allocator library (``libgdr_alloc.so``) was not found; the message lists where it
    was looked for."""


class CudaError(GdrError):
    """A CUDA driver call failed."""


class OutOfMemoryError(GdrError, MemoryError):
    """Out of GPU memory, or of BAR-mappable memory."""


class PinError(GdrError):
    """The memory cannot be pinned or mapped here (the message says why, and what works)."""


class ClosedError(GdrError, ValueError):
    """The buffer or pin was closed."""


class BoundsError(GdrError, IndexError):
    """An access outside the memory."""
