"""gdr's allocator library (``libgdr_alloc.so``, the crate gdr-alloc-preload): allocations that
are CUDA memory and can be pinned and mapped for the CPU on hosts without gdrdrv.

:mod:`gdr.torch` and :mod:`gdr.cupy` install it as the frameworks' allocator; this module finds
and loads it and wraps its C API (``gdr_alloc.h``) with ctypes.

Where the library is looked for, in order:

1. ``$GDR_ALLOC_LIB``, the path of the library (an error if it names nothing loadable);
2. the copy already loaded in this process (``gdr run -- python ...`` preloads it);
3. a copy shipped inside this package (``gdr/libgdr_alloc.so``, in wheels built with it);
4. an installed copy the dynamic loader finds (``libgdr_alloc.so.0``, which
   ``scripts/install-capi.sh`` installs beside libgdrapi).

Without any, :class:`gdr.AllocatorNotFoundError` says where it looked.
"""

from __future__ import annotations

import ctypes
import operator
import os
import threading
from pathlib import Path
from typing import Dict, Optional, Tuple

from ._errors import AllocatorNotFoundError, GdrError, OutOfMemoryError

__all__ = [
    "ABI_VERSION",
    "ENV",
    "Library",
    "library",
    "library_path",
]

#: The ``GDR_ALLOC_ABI_VERSION`` this module is written against.
ABI_VERSION = 1
#: The environment variable that names the library.
ENV = "GDR_ALLOC_LIB"

_NAMES = ("libgdr_alloc.so", "libgdr_alloc.so.0")
#: The file name `cargo build` gives the library (after the crate's Rust name), which
#: ``gdr run`` preloads from target/<profile>.
_CARGO_NAME = "libgdr_alloc_preload.so"
# CUresult codes of gdr_alloc_malloc.
_CUDA_SUCCESS = 0
_CUDA_ERROR_OUT_OF_MEMORY = 2
_CUDA_ERROR_NOT_SUPPORTED = 801


_STATS = (
    "live_allocations",
    "live_bytes",
    "reserved_bytes",
    "chunks",
    "mapped_chunks",
    "pins",
    "quarantined_bytes",
    "allocations",
    "passed_through",
    "chunks_released",
)


class _Stats(ctypes.Structure):
    """``gdr_alloc_stats_t``."""

    _fields_ = [(name, ctypes.c_uint64) for name in _STATS]


def _loaded_copy() -> Optional[str]:
    """The path of a libgdr_alloc already mapped into this process (a preload)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    name = os.path.basename(path)
                    if name.startswith(_NAMES[0]) or name == _CARGO_NAME:
                        return path
    except OSError:
        pass
    return None


def _packaged_copy() -> Optional[str]:
    here = Path(__file__).resolve().parent
    for name in _NAMES:
        p = here / name
        if p.is_file():
            return str(p)
    return None


def _installed_copy() -> Optional[str]:
    """The path of the libgdr_alloc.so.0 the dynamic loader finds, if any."""
    try:
        ctypes.CDLL(_NAMES[1])
    except OSError:
        return None
    return _loaded_copy()


def library_path() -> str:
    """Where the allocator library is (see the module's doc for the order); raises
    :class:`gdr.AllocatorNotFoundError` listing where it looked."""
    env = os.environ.get(ENV)
    if env:
        if not os.path.isfile(env):
            raise AllocatorNotFoundError(
                f"{ENV}={env} names no file; point it at libgdr_alloc.so "
                f"(cargo build --release -p gdr-alloc-preload builds it as {_CARGO_NAME})"
            )
        return env
    for look in (_loaded_copy, _packaged_copy, _installed_copy):
        found = look()
        if found:
            return found
    raise AllocatorNotFoundError(
        "gdr's allocator library libgdr_alloc.so was not found: "
        f"${ENV} is not set, no copy is loaded in this process (gdr run -- python ... "
        f"preloads one), this package has none ({Path(__file__).resolve().parent}), and the "
        "dynamic loader finds no libgdr_alloc.so.0 (scripts/install-capi.sh installs it); "
        "or build it with `cargo build --release -p gdr-alloc-preload` and set "
        f"{ENV} to target/release/{_CARGO_NAME}"
    )


class Library:
    """The loaded allocator library: ``gdr_alloc.h`` through ctypes."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise AllocatorNotFoundError(f"cannot load {path}: {e}") from None
        try:
            lib.gdr_alloc_abi_version.restype = ctypes.c_int
            lib.gdr_alloc_abi_version.argtypes = []
            lib.gdr_alloc_active.restype = ctypes.c_int
            lib.gdr_alloc_active.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
            lib.gdr_alloc_malloc.restype = ctypes.c_int
            lib.gdr_alloc_malloc.argtypes = [
                ctypes.POINTER(ctypes.c_uint64),
                ctypes.c_size_t,
                ctypes.c_int,
            ]
            lib.gdr_alloc_free.restype = ctypes.c_int
            lib.gdr_alloc_free.argtypes = [ctypes.c_uint64]
            lib.gdr_alloc_get_stats.restype = ctypes.c_int
            lib.gdr_alloc_get_stats.argtypes = [ctypes.POINTER(_Stats)]
            lib.gdr_alloc_trim.restype = ctypes.c_uint64
            lib.gdr_alloc_trim.argtypes = []
            # Checked for presence: PyTorch looks these up by name.
            lib.gdr_alloc_torch_malloc  # noqa: B018
            lib.gdr_alloc_torch_free  # noqa: B018
        except AttributeError as e:
            raise AllocatorNotFoundError(
                f"{path} is not gdr's allocator library (it lacks {e})"
            ) from None
        version = lib.gdr_alloc_abi_version()
        if version != ABI_VERSION:
            raise AllocatorNotFoundError(
                f"{path} has allocator ABI version {version}; this gdr package speaks "
                f"{ABI_VERSION}: use the library built with it"
            )
        self._lib = lib

    def active(self, device: int = 0) -> Tuple[bool, str]:
        """Whether allocations on ``device`` are served by the pool (mappable), and if not why
        (they are then passed through to the driver)."""
        device = _int_arg("device", device, 0, _C_INT_MAX)
        why = ctypes.create_string_buffer(512)
        on = self._lib.gdr_alloc_active(device, why, len(why)) == 1
        return on, "" if on else why.value.decode("utf-8", "replace")

    def malloc(self, size: int, device: int) -> int:
        """A device address of ``size`` bytes (at least 1) from the pool of ``device``."""
        size = _int_arg("size", size, 0, _U64_MAX)
        device = _int_arg("device", device, 0, _C_INT_MAX)
        ptr = ctypes.c_uint64(0)
        rc = self._lib.gdr_alloc_malloc(ctypes.byref(ptr), max(size, 1), device)
        if rc == _CUDA_SUCCESS:
            return ptr.value
        if rc == _CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfMemoryError(f"gdr's allocator: out of memory allocating {size} bytes")
        if rc == _CUDA_ERROR_NOT_SUPPORTED:
            _, why = self.active(device)
            raise GdrError(f"gdr's allocator does not serve GPU {device}: {why}")
        raise GdrError(f"gdr_alloc_malloc({size}, device {device}) failed: CUresult {rc}")

    def free(self, ptr: int) -> None:
        """Gives back an address :meth:`malloc` returned."""
        ptr = _int_arg("ptr", ptr, 0, _U64_MAX)
        rc = self._lib.gdr_alloc_free(ptr)
        if rc != _CUDA_SUCCESS:
            raise GdrError(f"gdr_alloc_free({ptr:#x}) failed: CUresult {rc}")

    def stats(self) -> Dict[str, int]:
        """The pool's counters (``gdr_alloc_stats_t``) as a dict."""
        s = _Stats()
        if self._lib.gdr_alloc_get_stats(ctypes.byref(s)) != 0:
            raise GdrError("gdr_alloc_get_stats failed")
        return {name: getattr(s, name) for name in _STATS}

    def trim(self) -> int:
        """Gives every empty, unpinned chunk back to the driver; returns the bytes released."""
        return int(self._lib.gdr_alloc_trim())

    def __repr__(self) -> str:
        return f"<gdr.allocator.Library {self.path}>"


def _int_arg(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..=hi``, else ``TypeError``/``ValueError`` as the rest of gdr
    raises: ctypes would otherwise wrap a negative int around to a huge unsigned one."""
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be an int from {lo} to {hi}, not {v}")
    return v


_C_INT_MAX = 2**31 - 1
_U64_MAX = 2**64 - 1


_library: Optional[Library] = None
_library_lock = threading.Lock()


def library() -> Library:
    """The allocator library, loaded once (see :func:`library_path`)."""
    global _library
    with _library_lock:
        if _library is None:
            _library = Library(library_path())
        return _library


def _forget() -> None:
    """Forgets the loaded library, so the next :func:`library` looks again (for tests)."""
    global _library
    with _library_lock:
        _library = None
