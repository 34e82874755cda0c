"""CuPy with gdr: arrays over gdr buffers (no copy), pins of arrays, and gdr's allocator as
CuPy's, so that every array of a program can be pinned and mapped.

    import cupy, gdr, gdr.cupy
    gdr.cupy.use_gdr_allocator()
    a = cupy.zeros(1 << 20, dtype=cupy.uint8)
    with gdr.pin(a) as p:                      # the array's memory, mapped for the CPU
        p.write(b"\\x01" * 16)
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional, Sequence, Union

from . import allocator
from ._gdr import Buffer, Pin
from . import pin as _pin

__all__ = ["use_gdr_allocator", "allocator_function", "array", "pin"]


def allocator_function(lib: Optional[allocator.Library] = None) -> Callable[[int], Any]:
    """The function ``cupy.cuda.set_allocator`` takes: ``size -> cupy.cuda.MemoryPointer`` over
    memory of gdr's allocator on the current device, freed when CuPy lets go of it."""
    import cupy

    lib = lib or allocator.library()

    def malloc(size: int) -> Any:
        device = cupy.cuda.runtime.getDevice()
        ptr = lib.malloc(size, device)
        owner = _Allocation()
        # Freed when the last MemoryPointer over it goes (its UnownedMemory holds the owner);
        # not at interpreter exit, when arrays may still be in use and the process's end frees
        # everything anyway.
        weakref.finalize(owner, _free, lib, ptr).atexit = False
        mem = cupy.cuda.UnownedMemory(ptr, size, owner, device_id=device)
        return cupy.cuda.MemoryPointer(mem, 0)

    return malloc


class _Allocation:
    """Stands for one allocation of gdr's allocator; it is freed when this is collected."""

    __slots__ = ("__weakref__",)


def _free(lib: allocator.Library, ptr: int) -> None:
    try:
        lib.free(ptr)
    except Exception:  # at interpreter exit the driver may be gone already
        pass


def use_gdr_allocator() -> None:
    """Makes gdr's allocator (``libgdr_alloc.so``, see :mod:`gdr.allocator`) CuPy's, through
    ``cupy.cuda.set_allocator``. Arrays made afterwards can be pinned (:func:`pin`).

    Raises :class:`gdr.AllocatorNotFoundError` when the library is not found."""
    import cupy

    cupy.cuda.set_allocator(allocator_function())


def array(
    buf: Buffer,
    dtype: Any = None,
    shape: Union[None, int, Sequence[int]] = None,
    offset: int = 0,
) -> Any:
    """A CuPy array over ``buf``'s memory (no copy): ``shape`` elements of ``dtype`` (uint8 by
    default) at byte ``offset``. The array keeps the memory."""
    import cupy

    return cupy.from_dlpack(buf.view(dtype, shape, offset))


def pin(a: Any, size: Optional[int] = None) -> Pin:
    """``gdr.pin(a)``: the array's memory pinned and mapped for the CPU (it must be
    C-contiguous). The pin holds the array."""
    return _pin(a, size)
