"""PyTorch with gdr: tensors over gdr buffers (no copy), pins of tensors, and gdr's allocator as
PyTorch's, so that every tensor of a program can be pinned and mapped.

    import torch, gdr, gdr.torch
    gdr.torch.use_gdr_allocator()              # first, before any CUDA tensor is made
    t = torch.zeros(1 << 20, device="cuda")
    with gdr.pin(t) as p:                      # the tensor's memory, mapped for the CPU
        p.write(b"\\x01" * 16)                  # ... and PyTorch sees it
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from . import allocator
from ._gdr import Buffer, Pin
from . import pin as _pin

__all__ = ["use_gdr_allocator", "tensor", "pin"]


def use_gdr_allocator() -> None:
    """Makes gdr's allocator (``libgdr_alloc.so``, see :mod:`gdr.allocator`) PyTorch's CUDA
    allocator, through ``torch.cuda.memory.CUDAPluggableAllocator``. Call it before the first
    CUDA tensor is made (PyTorch refuses to swap an allocator in use). Needless under
    ``gdr run -- python ...``, which preloads the library under ``cudaMalloc`` itself.

    Raises :class:`gdr.AllocatorNotFoundError` when the library is not found."""
    import torch

    lib = allocator.library()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        lib.path, "gdr_alloc_torch_malloc", "gdr_alloc_torch_free"
    )
    torch.cuda.memory.change_current_allocator(alloc)


def tensor(
    buf: Buffer,
    dtype: Any = None,
    shape: Union[None, int, Sequence[int]] = None,
    offset: int = 0,
) -> Any:
    """A CUDA tensor over ``buf``'s memory (no copy): ``shape`` elements of ``dtype`` (a
    ``torch.dtype``; uint8 by default) at byte ``offset``. The tensor keeps the memory."""
    import torch

    return torch.from_dlpack(buf.view(dtype, shape, offset))


def pin(t: Any, size: Optional[int] = None) -> Pin:
    """``gdr.pin(t)``: the tensor's memory pinned and mapped for the CPU (it must be
    contiguous). The pin holds the tensor."""
    return _pin(t, size)
