"""gdr.allocator: finding and loading libgdr_alloc.so, and its C API through ctypes.

Checked against a stand-in library compiled here from the real header (gdr_alloc.h): the
compiler holds the stand-in to the header's signatures and structures, and the tests hold the
ctypes declarations to the stand-in. No GPU is needed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gdr
from gdr import allocator

from conftest import repo_root

FAKE = r"""
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "gdr_alloc.h"

#ifndef ABI
#define ABI GDR_ALLOC_ABI_VERSION
#endif
static uint64_t live;
int gdr_alloc_abi_version(void) { return ABI; }
int gdr_alloc_active(int device, char *why, size_t len) {
    if (device == 0) return 1;
    if (why && len) { strncpy(why, "no such device here", len - 1); why[len - 1] = 0; }
    return 0;
}
int gdr_alloc_malloc(uint64_t *dptr, size_t size, int device) {
    if (device != 0) return 801;        /* CUDA_ERROR_NOT_SUPPORTED */
    if (size > (1u << 30)) return 2;    /* CUDA_ERROR_OUT_OF_MEMORY */
    void *p = malloc(size);
    *dptr = (uint64_t)(uintptr_t)p;
    live++;
    return 0;
}
int gdr_alloc_free(uint64_t dptr) {
    if (!dptr) return 1;                /* CUDA_ERROR_INVALID_VALUE */
    free((void *)(uintptr_t)dptr);
    live--;
    return 0;
}
void *gdr_alloc_torch_malloc(ssize_t size, int device, void *stream) { return malloc(size); }
void gdr_alloc_torch_free(void *ptr, ssize_t size, int device, void *stream) { free(ptr); }
int gdr_alloc_pin(uint64_t addr, size_t size, gdr_alloc_pin_t *out) { return ENOENT; }
int gdr_alloc_unpin(uint64_t id) { return EINVAL; }
int gdr_alloc_pin_freed(uint64_t id, int *freed) { return EINVAL; }
int gdr_alloc_get_stats(gdr_alloc_stats_t *out) {
    if (!out) return EINVAL;
    /* Each field gets its position (1-based), live_allocations the live count times 100. */
    out->live_allocations = 100 * live;
    out->live_bytes = 2; out->reserved_bytes = 3; out->chunks = 4; out->mapped_chunks = 5;
    out->pins = 6; out->quarantined_bytes = 7; out->allocations = 8; out->passed_through = 9;
    out->chunks_released = 10;
    return 0;
}
uint64_t gdr_alloc_trim(void) { return 4096; }
"""


#: The name of the stand-ins loaded into this (pytest's) process. It must not look like the
#: allocator's (``libgdr_alloc.so*``): ``allocator.library_path()`` takes a copy already loaded in
#: the process, so a stand-in under that name would be handed to the GPU tests that run later in
#: the same session, and their children would allocate CUDA memory from ``malloc``.
STAND_IN = "libgdr_alloc_stand_in.so"


def header_dir() -> Path:
    """gdr_alloc.h: in the source tree, or beside the tests in the bundle."""
    here = Path(__file__).resolve().parent / "include"
    if (here / "gdr_alloc.h").is_file():
        return here
    root = repo_root()
    for rel in ("crates/gdr-alloc-preload/include", "crates/gdr-alloc/include"):
        if root is not None and (root / rel / "gdr_alloc.h").is_file():
            return root / rel
    pytest.skip("gdr_alloc.h not found (neither in a source tree nor beside the tests)")


def build(tmp: Path, name: str, *defines: str, source: str = FAKE) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp / (name + ".c")
    src.write_text(source)
    out = tmp / name
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wall", "-Werror", "-Wno-unused-parameter",
         f"-I{header_dir()}", *defines, "-o", str(out), str(src)],
        check=True,
    )
    return out


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(allocator.ENV, raising=False)
    allocator._forget()
    yield
    allocator._forget()


def test_without_the_library_the_error_says_where_it_looked():
    if any(f() for f in (allocator._loaded_copy, allocator._packaged_copy,
                         allocator._installed_copy)):
        pytest.skip("a copy of the library is loaded, packaged or installed here")
    with pytest.raises(gdr.AllocatorNotFoundError) as e:
        allocator.library()
    msg = str(e.value)
    assert allocator.ENV in msg and "gdr run" in msg and "gdr-alloc-preload" in msg
    assert "install-capi.sh" in msg
    assert isinstance(e.value, gdr.UnavailableError)


def test_the_environment_variable_must_name_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv(allocator.ENV, str(tmp_path / "missing.so"))
    with pytest.raises(gdr.AllocatorNotFoundError, match="names no file"):
        allocator.library_path()


def test_a_library_that_is_not_the_allocator_is_refused(monkeypatch, tmp_path):
    not_elf = tmp_path / "libnot.so"
    not_elf.write_bytes(b"not an ELF file")
    monkeypatch.setenv(allocator.ENV, str(not_elf))
    with pytest.raises(gdr.AllocatorNotFoundError, match="cannot load"):
        allocator.library()
    other = build(tmp_path, "libother.so", source="int gdr_alloc_abi_version(void) { return 1; }\n")
    monkeypatch.setenv(allocator.ENV, str(other))
    allocator._forget()
    with pytest.raises(gdr.AllocatorNotFoundError, match="is not gdr's allocator"):
        allocator.library()


def test_the_abi_version_must_match(monkeypatch, tmp_path):
    lib = build(tmp_path, "libgdr_alloc_v2.so", "-DABI=2")
    monkeypatch.setenv(allocator.ENV, str(lib))
    with pytest.raises(gdr.AllocatorNotFoundError, match="ABI version 2"):
        allocator.library()


def test_the_c_api_through_ctypes(monkeypatch, tmp_path):
    lib_path = build(tmp_path, STAND_IN)
    monkeypatch.setenv(allocator.ENV, str(lib_path))
    lib = allocator.library()
    assert lib.path == str(lib_path) and allocator.library() is lib
    assert lib.active(0) == (True, "")
    assert lib.active(1) == (False, "no such device here")
    p = lib.malloc(100, 0)
    q = lib.malloc(0, 0)  # 0 bytes asks for 1
    assert p and q and p != q
    stats = lib.stats()
    assert list(stats) == list(allocator._STATS)
    assert stats["live_allocations"] == 200
    assert [stats[k] for k in list(stats)[1:]] == list(range(2, 11))
    lib.free(p)
    lib.free(q)
    assert lib.stats()["live_allocations"] == 0
    assert lib.trim() == 4096
    with pytest.raises(gdr.OutOfMemoryError):
        lib.malloc(2 << 30, 0)
    with pytest.raises(gdr.GdrError, match="does not serve GPU 1: no such device here"):
        lib.malloc(8, 1)
    with pytest.raises(gdr.GdrError, match="CUresult 1"):
        lib.free(0)
    assert STAND_IN in repr(lib)
    # Loaded here, the stand-in is not taken for a preloaded allocator by what runs later.
    assert allocator._loaded_copy() != str(lib_path)
    allocator._forget()
    monkeypatch.delenv(allocator.ENV)
    try:
        assert allocator.library_path() != str(lib_path)
    except gdr.AllocatorNotFoundError:
        pass


def test_the_c_api_refuses_ints_that_ctypes_would_wrap(monkeypatch, tmp_path):
    monkeypatch.setenv(allocator.ENV, str(build(tmp_path, STAND_IN)))
    lib = allocator.library()
    for call, name in (
        (lambda: lib.malloc(-1, 0), "size"),
        (lambda: lib.malloc(8, -1), "device"),
        (lambda: lib.malloc(8, 2**31), "device"),
        (lambda: lib.active(-1), "device"),
        (lambda: lib.free(-1), "ptr"),
        (lambda: lib.free(2**64), "ptr"),
    ):
        with pytest.raises(ValueError, match=name):
            call()
    with pytest.raises(TypeError, match="size must be an int"):
        lib.malloc("8", 0)
    assert lib.stats()["live_allocations"] == 0, "nothing was allocated"


@pytest.mark.parametrize("name", ["libgdr_alloc.so.0", "libgdr_alloc_preload.so"])
def test_a_preloaded_copy_is_found_without_the_variable(tmp_path, name):
    """Installed, the library is libgdr_alloc.so.0; `gdr run` from a cargo build preloads it
    under the crate's Rust name."""
    lib_path = build(tmp_path, name)
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
        "from gdr import allocator; print(allocator.library_path())"
    )
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV}
    out = subprocess.run(
        [sys.executable, "-c", code, str(lib_path)], capture_output=True, text=True, env=env,
        check=True,
    ).stdout.strip()
    assert out == str(lib_path)


def test_a_packaged_copy_is_found(monkeypatch, tmp_path):
    lib_path = build(tmp_path, "libgdr_alloc.so")
    here = Path(allocator.__file__).resolve().parent
    monkeypatch.setattr(allocator, "__file__", str(tmp_path / "allocator.py"))
    assert allocator._packaged_copy() == str(lib_path)
    monkeypatch.setattr(allocator, "__file__", str(here / "allocator.py"))


def test_cupy_allocator_function_frees_when_cupy_lets_go(monkeypatch, tmp_path):
    """The CuPy hook over a stand-in ``cupy`` module: each allocation is freed exactly when
    the last MemoryPointer over it is collected."""
    import gc
    import types

    lib_path = build(tmp_path, STAND_IN)
    monkeypatch.setenv(allocator.ENV, str(lib_path))

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDevice=lambda: 0),
            UnownedMemory=UnownedMemory,
            MemoryPointer=MemoryPointer,
            set_allocator=lambda f: None,
        )
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    import gdr.cupy

    malloc = gdr.cupy.allocator_function()
    lib = allocator.library()
    mp = malloc(1000)
    assert mp.mem.size == 1000 and mp.mem.device_id == 0 and mp.ptr
    assert lib.stats()["live_allocations"] == 100
    del mp
    gc.collect()
    assert lib.stats()["live_allocations"] == 0
