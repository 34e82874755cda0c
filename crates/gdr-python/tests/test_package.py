"""The package itself: it imports anywhere, its errors say what is missing, its stubs match."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import gdr
import gdr._gdr


def test_import_pulls_in_no_framework():
    code = (
        "import sys, gdr, gdr.allocator; "
        "print(sorted(m for m in ('numpy', 'torch', 'cupy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out


def test_version_matches_the_crate():
    assert gdr.__version__ == gdr._gdr.__version__
    assert gdr.__version__.count(".") == 2


def test_exceptions_form_one_tree_with_the_builtin_bases_users_catch():
    for cls in (
        gdr.UnavailableError,
        gdr.AllocatorNotFoundError,
        gdr.CudaError,
        gdr.OutOfMemoryError,
        gdr.PinError,
        gdr.ClosedError,
        gdr.BoundsError,
    ):
        assert issubclass(cls, gdr.GdrError), cls
    assert issubclass(gdr.AllocatorNotFoundError, gdr.UnavailableError)
    assert issubclass(gdr.OutOfMemoryError, MemoryError)
    assert issubclass(gdr.ClosedError, ValueError)
    assert issubclass(gdr.BoundsError, IndexError)


def test_every_public_name_is_exported():
    for name in gdr.__all__:
        assert hasattr(gdr, name), name


def test_without_a_gpu_first_use_says_what_is_missing(no_gpu):
    with pytest.raises(gdr.UnavailableError) as e:
        gdr.open(0)
    assert "libcuda.so.1" in str(e.value) and "install" in str(e.value)
    with pytest.raises(gdr.UnavailableError):
        gdr.device_count()
    with pytest.raises(gdr.UnavailableError):
        gdr.alloc(4096)
    with pytest.raises(gdr.UnavailableError):
        gdr.pin(0x7F0000000000, 4096)
    with pytest.raises(gdr.UnavailableError):
        gdr.Gpu(3)


def test_info_is_a_dict_listing_what_is_missing(no_gpu):
    info = gdr.info()
    assert info["gpus"] == []
    assert info["cuda_driver"] is None and "libcuda.so.1" in info["cuda_error"]
    missing = info["missing"]
    assert any(m.startswith("CUDA driver: ") for m in missing), missing
    for backend in ("mapping backend vulkan", "pinning backend vulkan", "pinning backend dmabuf"):
        assert any(m.startswith(backend) for m in missing), (backend, missing)


def _stub_tree() -> ast.Module:
    path = Path(gdr.__file__).with_name("_gdr.pyi")
    return ast.parse(path.read_text())


def test_the_package_is_typed():
    here = Path(gdr.__file__).parent
    assert (here / "py.typed").is_file()
    assert (here / "_gdr.pyi").is_file()


def test_stubs_name_exactly_what_the_extension_has():
    tree = _stub_tree()
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = {
                n.name
                for n in node.body
                if isinstance(n, ast.FunctionDef) and n.name != "__init__"  # Rust's __new__
            }
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed[node.target.id] = None
    real = {n for n in dir(gdr._gdr) if not n.startswith("__") or n == "__version__"}
    real -= {"_ArrayInterface"}  # NumPy's view base: internal
    assert real == set(stubbed), (real ^ set(stubbed))
    for cls_name, methods in stubbed.items():
        if methods is None:
            continue
        cls = getattr(gdr._gdr, cls_name)
        have = {
            n
            for n, v in vars(cls).items()
            if not n.startswith("_") or n in ("__len__", "__enter__", "__exit__",
                                                "__dlpack__", "__dlpack_device__",
                                                "__cuda_array_interface__")
        }
        assert have == methods, (cls_name, have ^ methods)


def test_every_public_callable_has_a_docstring():
    for name in gdr.__all__:
        obj = getattr(gdr, name)
        if callable(obj):
            assert inspect.getdoc(obj), name
    for cls in (gdr.Gpu, gdr.Buffer, gdr.View, gdr.Pin, gdr.AutoCopier):
        for n, v in vars(cls).items():
            if n.startswith("_") or not callable(v):
                continue
            assert inspect.getdoc(v), f"{cls.__name__}.{n}"
