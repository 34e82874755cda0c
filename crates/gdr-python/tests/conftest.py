"""pytest set-up for gdr's Python package.

GPU tests take the ``gpu`` fixture (and ``torch``/``cupy`` for the frameworks they need). Without
a usable GPU they are skipped as ``no GPU: ...``; with ``GDR_REQUIRE_GPU=1`` (the bundle runner on
GPU hosts) they fail instead, so a broken driver set-up cannot pass for a skipped test. Every skip
is also appended to the file ``$GDR_SKIP_LOG`` names, as ``skipped: no GPU: python::<file>::<test>``
(the line of the Rust tests' gate) or ``skipped: python::<file>::<test>: <why>``: scripts/test.sh
lists and counts them.
"""

from __future__ import annotations

import gc
import importlib
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import gdr

REQUIRE_GPU = os.environ.get("GDR_REQUIRE_GPU") == "1"


def _log_skip(line: str) -> None:
    log = os.environ.get("GDR_SKIP_LOG")
    if log:
        # One short O_APPEND write: lines from parallel runs land whole.
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every skipped test, as a line of $GDR_SKIP_LOG (scripts/test.sh lists and counts them):
    `skipped: no GPU: python::<file>::<test>` for GPU tests, `skipped: python::<file>::<test>:
    <why>` for others."""
    if not report.skipped or report.when not in ("setup", "call"):
        return
    name = "python::" + report.nodeid.rsplit("/", 1)[-1]
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    why = why.removeprefix("Skipped: ")
    if why.startswith("no GPU"):
        _log_skip(f"skipped: no GPU: {name}")
    else:
        _log_skip(f"skipped: {name}: {why}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole file skipped (a module it needs is missing), as one line of $GDR_SKIP_LOG."""
    if report.skipped:
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _log_skip(f"skipped: python::{report.nodeid.rsplit('/', 1)[-1]}: "
                  f"{why.removeprefix('Skipped: ')}")


def skip_or_fail(request: pytest.FixtureRequest, why: str) -> None:
    """Skips a GPU test (`no GPU: ...`), or fails it under GDR_REQUIRE_GPU=1."""
    if REQUIRE_GPU:
        pytest.fail(f"{request.node.name}: GDR_REQUIRE_GPU=1 but {why}", pytrace=False)
    pytest.skip(f"no GPU: {why}")


_gpu_error: Optional[str] = None
_gpu: Optional[gdr.Gpu] = None


def _open_gpu() -> Optional[gdr.Gpu]:
    global _gpu, _gpu_error
    if _gpu is None and _gpu_error is None:
        try:
            _gpu = gdr.open(0)
        except gdr.UnavailableError as e:
            _gpu_error = str(e)
    return _gpu


def gpu_present() -> bool:
    return _open_gpu() is not None


@pytest.fixture
def gpu(request: pytest.FixtureRequest) -> gdr.Gpu:
    """GPU 0, or the test is skipped (failed under GDR_REQUIRE_GPU=1)."""
    g = _open_gpu()
    if g is None:
        skip_or_fail(request, f"no usable GPU: {_gpu_error}")
    assert g is not None
    return g


def _framework(request: pytest.FixtureRequest, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_or_fail(request, f"{name} is not installed ({e})")


@pytest.fixture
def torch(request: pytest.FixtureRequest, gpu: gdr.Gpu) -> Any:
    """PyTorch with CUDA, for GPU tests."""
    t = _framework(request, "torch")
    if not t.cuda.is_available():
        skip_or_fail(request, "torch.cuda.is_available() is False")
    return t


@pytest.fixture
def cupy(request: pytest.FixtureRequest, gpu: gdr.Gpu) -> Any:
    """CuPy, for GPU tests."""
    return _framework(request, "cupy")


@pytest.fixture
def np() -> Any:
    return pytest.importorskip("numpy")


@pytest.fixture
def no_gpu() -> None:
    """For tests of what happens on a machine without a GPU: skipped where there is one."""
    if gpu_present():
        pytest.skip("this machine has a GPU; the test is for machines without one")


@pytest.fixture
def live() -> Iterator[Any]:
    """Checks that a test leaves no gdr memory alive: yields a function giving the memory
    alive since the test started."""
    gc.collect()
    base = gdr._gdr._live_memories()
    yield lambda: gdr._gdr._live_memories() - base
    gc.collect()
    assert gdr._gdr._live_memories() == base, "the test left gdr memory alive"


def repo_root() -> Optional[Path]:
    here = Path(__file__).resolve()
    for p in here.parents:
        if (p / "Cargo.toml").is_file() and (p / "crates").is_dir():
            return p
    return None


def fixtures_dir() -> Optional[Path]:
    """The committed topology fixtures ($GDR_TOPO_FIXTURES in the bundle)."""
    env = os.environ.get("GDR_TOPO_FIXTURES")
    if env:
        return Path(env)
    root = repo_root()
    if root is not None:
        p = root / "crates/gdr-pci/tests/fixtures/topo"
        if p.is_dir():
            return p
    return None


def run_python(code: str, **env: str) -> str:
    """Runs ``code`` in a fresh interpreter (for set-ups that must come before a framework
    touches CUDA: allocators, PyTorch's allocator settings); fails the test with its output
    unless it exits 0. Returns its stdout."""
    import subprocess
    import sys

    full = dict(os.environ)
    full.update(env)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300
    )
    if r.returncode != 0:
        pytest.fail(
            f"child exited {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}",
            pytrace=False,
        )
    return r.stdout


def random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


#: Sizes and offsets of the byte-exact round trips: around every edge of the copy routines
#: (16/32/64-byte vectors, lines, pages) and past 1 MiB.
ODD_SIZES = [1, 2, 3, 7, 8, 9, 15, 31, 63, 64, 65, 127, 255, 257, 1000, 4095, 4096, 4097,
             65535, 65537, (1 << 20) + 5]
ODD_OFFSETS = [0, 1, 3, 7, 63, 64, 65, 4095]


def allocator_library_or_skip() -> str:
    """The path of libgdr_alloc.so, or the test is skipped (the bundle carries it once the
    allocator builds; run-gpu.sh sets GDR_ALLOC_LIB)."""
    from gdr import allocator

    try:
        return allocator.library_path()
    except gdr.AllocatorNotFoundError as e:
        if os.environ.get("GDR_REQUIRE_ALLOC") == "1":
            pytest.fail(f"GDR_REQUIRE_ALLOC=1 but {e}", pytrace=False)
        pytest.skip(f"no allocator library: {e}")


def gpu_test_module_needs(name: str) -> Any:
    """For the module level of a GPU test file: imports `name`, or skips the whole file (fails
    it under GDR_REQUIRE_GPU=1, where the GPU tests must run)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if REQUIRE_GPU:
            pytest.fail(f"GDR_REQUIRE_GPU=1 but {name} is not installed ({e})", pytrace=False)
        pytest.skip(f"{name} is not installed ({e})", allow_module_level=True)
