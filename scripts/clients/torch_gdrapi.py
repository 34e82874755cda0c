#!/usr/bin/env python3
"""PyTorch tensors through gdr's libgdrapi.so.2 (the gdrcopy 2.6 C API), driven with ctypes.

Usage: torch_gdrapi.py [all|expandable|default|allocator]

  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: tensors are cuMemCreate memory
              with a POSIX-fd handle, which every backend can pin. Pins, maps and copies both
              ways through the mapping for several sizes and an odd-offset slice; times pin+map.
  default     the default allocator (cudaMalloc): on the vulkan backend the pin must fail with
              ENOTSUP (95) and the library must say why on stderr (GDRCOPY_ENABLE_LOGGING=1).
  allocator   the default allocator under gdr's allocator (the child runs under `$GDR_BIN run`,
              or LD_PRELOAD=$GDR_ALLOC_LIB): cudaMalloc memory is pool memory, and every tensor
              of the expandable checks must pin, map and copy both ways (a 64 MiB tensor too:
              it is one cudaMalloc, so one allocation).
  all         (default) runs each as a child process (the allocator config is read once, at
              CUDA init, so each needs a fresh process) and sums their results; `allocator`
              only when GDR_BIN or GDR_ALLOC_LIB names the allocator.

Prints one `ok ...` / `FAIL ...` line per check and ends with `torch_gdrapi: N passed, M failed`;
exits 1 on any failure. Without torch or a GPU: `torch_gdrapi: skipped: no GPU`, exit 0
(exit 1 when GDR_REQUIRE_GPU=1).
"""

import ctypes
import errno
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

NAME = "torch_gdrapi"
LIB_NAME = "libgdrapi.so.2"
CHILD_TIMEOUT_S = 300

KiB = 1 << 10
MiB = 1 << 20
GPU_PAGE_SIZE = 1 << 16
GPU_PAGE_MASK = ~(GPU_PAGE_SIZE - 1)

# gdr extension (gdrapi.h): which backend gdr_open() picked.
GDR_ATTR_GDR_BACKEND = 0x1000
BACKEND_NAMES = {1: "gdrdrv", 2: "dmabuf", 3: "vulkan"}
GDR_GDR_BACKEND_VULKAN = 3

# Bytes left after the copied range in host buffers: they must still hold the poison afterwards,
# which catches a copy that writes past `size`.
GUARD_BYTES = 64
POISON = 0xEE
TIMING_RUNS = 20


# ---- the C API, declared exactly as gdrapi.h has it ----

class GdrMh(ctypes.Structure):
    """gdr_mh_t: a struct of one unsigned long, passed BY VALUE to most calls."""
    _fields_ = [("h", ctypes.c_ulong)]


class GdrInfoV2(ctypes.Structure):
    """gdr_info_v2_t (48 bytes). The two C bitfields `mapped:1, wc_mapping:1` share one
    unsigned int, declared here as `flags` (bit 0 mapped, bit 1 wc_mapping)."""
    _fields_ = [
        ("va", ctypes.c_uint64),
        ("mapped_size", ctypes.c_uint64),
        ("page_size", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),  # the C compiler's padding before the next uint64_t
        ("tm_cycles", ctypes.c_uint64),
        ("cycles_per_ms", ctypes.c_uint32),
        ("flags", ctypes.c_uint),
        ("mapping_type", ctypes.c_int),
    ]

    @property
    def mapped(self):
        return self.flags & 1

    @property
    def wc_mapping(self):
        return (self.flags >> 1) & 1


# A wrong layout would make every info check below meaningless: fail loudly at import.
assert ctypes.sizeof(GdrInfoV2) == 48, ctypes.sizeof(GdrInfoV2)


def load_gdrapi():
    """dlopen libgdrapi.so.2 (as gdrcopy clients link it) and declare the calls used here."""
    lib = ctypes.CDLL(LIB_NAME)
    g_t = ctypes.c_void_p  # gdr_t is an opaque pointer

    lib.gdr_open.argtypes = []
    lib.gdr_open.restype = g_t
    lib.gdr_close.argtypes = [g_t]
    lib.gdr_close.restype = ctypes.c_int

    lib.gdr_pin_buffer.argtypes = [g_t, ctypes.c_ulong, ctypes.c_size_t, ctypes.c_uint64,
                                   ctypes.c_uint32, ctypes.POINTER(GdrMh)]
    lib.gdr_pin_buffer.restype = ctypes.c_int
    lib.gdr_unpin_buffer.argtypes = [g_t, GdrMh]
    lib.gdr_unpin_buffer.restype = ctypes.c_int

    lib.gdr_get_info_v2.argtypes = [g_t, GdrMh, ctypes.POINTER(GdrInfoV2)]
    lib.gdr_get_info_v2.restype = ctypes.c_int

    lib.gdr_map.argtypes = [g_t, GdrMh, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.gdr_map.restype = ctypes.c_int
    lib.gdr_unmap.argtypes = [g_t, GdrMh, ctypes.c_void_p, ctypes.c_size_t]
    lib.gdr_unmap.restype = ctypes.c_int

    lib.gdr_copy_to_mapping.argtypes = [GdrMh, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.gdr_copy_to_mapping.restype = ctypes.c_int
    lib.gdr_copy_from_mapping.argtypes = [GdrMh, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_size_t]
    lib.gdr_copy_from_mapping.restype = ctypes.c_int

    lib.gdr_runtime_get_version.argtypes = [ctypes.POINTER(ctypes.c_int),
                                            ctypes.POINTER(ctypes.c_int)]
    lib.gdr_runtime_get_version.restype = None
    lib.gdr_driver_get_version.argtypes = [g_t, ctypes.POINTER(ctypes.c_int),
                                           ctypes.POINTER(ctypes.c_int)]
    lib.gdr_driver_get_version.restype = ctypes.c_int
    lib.gdr_get_attribute.argtypes = [g_t, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.gdr_get_attribute.restype = ctypes.c_int
    return lib


# ---- small helpers ----

class Checks:
    """Counts and prints one line per check."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, what):
        print(f"ok {what}", flush=True)
        self.passed += 1

    def fail(self, what):
        print(f"FAIL {what}", flush=True)
        self.failed += 1

    def expect(self, cond, what, why=""):
        if cond:
            self.ok(what)
        else:
            self.fail(f"{what}: {why}" if why else what)
        return cond

    def summary(self):
        print(f"{NAME}: {self.passed} passed, {self.failed} failed", flush=True)
        return 1 if self.failed else 0


def info(text):
    print(f"info {text}", flush=True)


def rc_name(rc):
    return errno.errorcode.get(rc, "?") if rc else "0"


def gpu_available():
    """(True, "") when torch imports and sees a CUDA device, else (False, why)."""
    try:
        import torch
    except Exception as e:  # a broken install counts as "no torch" here; GDR_REQUIRE_GPU=1 catches it
        return False, f"torch not importable: {e}"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    return True, ""


def skip(why):
    print(f"info {why}")
    print(f"{NAME}: skipped: no GPU", flush=True)
    return 1 if os.environ.get("GDR_REQUIRE_GPU") == "1" else 0


def backend_name(lib, g):
    v = ctypes.c_int(0)
    rc = lib.gdr_get_attribute(g, GDR_ATTR_GDR_BACKEND, ctypes.byref(v))
    if rc != 0:
        return None, f"unknown (gdr_get_attribute rc {rc})"
    return v.value, BACKEND_NAMES.get(v.value, f"#{v.value}")


def print_versions(lib, g):
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib.gdr_runtime_get_version(ctypes.byref(major), ctypes.byref(minor))
    dmaj, dmin = ctypes.c_int(0), ctypes.c_int(0)
    rc = lib.gdr_driver_get_version(g, ctypes.byref(dmaj), ctypes.byref(dmin))
    _, backend = backend_name(lib, g)
    info(f"libgdrapi runtime {major.value}.{minor.value}, driver "
         f"{dmaj.value}.{dmin.value} (rc {rc}), backend {backend}")


def cuda_allocation_range(ptr):
    """(base, size) of the CUDA allocation holding ptr (cuMemGetAddressRange), or None.
    Diagnostic only: a pin that covers more than one allocation is a common reason to fail
    (PyTorch maps an expandable segment as many separate 2 MiB / 20 MiB cuMemCreate chunks)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        f = cuda.cuMemGetAddressRange_v2
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                  ctypes.c_uint64]
    f.restype = ctypes.c_int
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    if f(ctypes.byref(base), ctypes.byref(size), ptr) != 0:
        return None
    return base.value, size.value


def describe_mismatch(got, want):
    import numpy as np
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return "equal"
    i = int(bad[0])
    return (f"{bad.size} of {want.size} bytes differ, first at {i}: "
            f"got 0x{int(got[i]):02x} want 0x{int(want[i]):02x}")


def random_bytes(n):
    """n fresh random bytes as a writable numpy uint8 array."""
    import numpy as np
    return np.frombuffer(os.urandom(n), dtype=np.uint8).copy()


def call_capturing_stderr(fn):
    """Runs fn() with file descriptor 2 pointed at a temp file and returns (result, text).
    The library writes its log with write(2) on fd 2, below Python's sys.stderr, so only an
    fd-level redirect sees it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return result, text


# ---- expandable mode ----

def make_cases(torch):
    """The tensors to test, allocated in this order so the small ones and the slice sit inside
    one cuMemCreate chunk of their pool; the 64 MiB one necessarily spans several."""
    def empty(n):
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    cases = [
        {"name": "4 KiB", "tensor": empty(4 * KiB)},
        {"name": "1 MiB + 3", "tensor": empty(MiB + 3)},
    ]
    big = empty(8 * MiB)
    off, n = 12345, 2 * MiB + 7  # odd offset and odd size: neither end is page aligned
    cases.append({"name": f"slice [{off}:{off + n}] of 8 MiB", "tensor": big[off:off + n],
                  "parent": big, "offset": off})
    cases.append({"name": "64 MiB", "tensor": empty(64 * MiB)})
    return cases


def check_info(checks, name, ptr, n, info_v2):
    """What gdrapi.h promises about gdr_get_info_v2 after a pin and map."""
    va, size = info_v2.va, info_v2.mapped_size
    info(f"{name}: info va 0x{va:x} mapped_size {size} page_size {info_v2.page_size} "
         f"mapped {info_v2.mapped} wc {info_v2.wc_mapping} mapping_type {info_v2.mapping_type}")
    problems = []
    if info_v2.page_size != GPU_PAGE_SIZE:
        problems.append(f"page_size {info_v2.page_size}, want {GPU_PAGE_SIZE}")
    if not (va <= ptr and ptr + n <= va + size):
        problems.append(f"[0x{va:x}, +{size}) does not cover the tensor [0x{ptr:x}, +{n})")
    if va != ptr & GPU_PAGE_MASK:
        problems.append(f"va 0x{va:x} is not the tensor address rounded down to 64 KiB")
    if not info_v2.mapped:
        problems.append("mapped bit is 0 after gdr_map")
    checks.expect(not problems, f"{name}: gdr_get_info_v2 after map", "; ".join(problems))


def check_cpu_to_gpu(lib, checks, torch, case, mh, cpu_ptr):
    """CPU writes random bytes through the mapping; the tensor must hold exactly them."""
    import numpy as np
    name, t = case["name"], case["tensor"]
    n = t.numel()
    parent = case.get("parent")
    if parent is not None:
        # Known bytes around the slice, to see that the write stayed inside it.
        parent.copy_(torch.from_numpy(random_bytes(parent.numel())).cuda())
        parent_before = parent.cpu().numpy()
    # No GPU work may still be writing the tensor when the CPU writes it.
    torch.cuda.synchronize()

    data = random_bytes(n)
    rc = lib.gdr_copy_to_mapping(mh, cpu_ptr, data.ctypes.data, n)
    if not checks.expect(rc == 0, f"{name}: gdr_copy_to_mapping", f"rc {rc} ({rc_name(rc)})"):
        return
    torch.cuda.synchronize()
    got = t.cpu().numpy()
    checks.expect(np.array_equal(got, data), f"{name}: CPU -> GPU, tensor.cpu() equals the bytes "
                  "written through the mapping", describe_mismatch(got, data))
    if parent is not None:
        off = case["offset"]
        after = parent.cpu().numpy()
        same = (np.array_equal(after[:off], parent_before[:off])
                and np.array_equal(after[off + n:], parent_before[off + n:]))
        checks.expect(same, f"{name}: bytes around the slice unchanged",
                      "a write through the mapping landed outside the slice")


def check_gpu_to_cpu(lib, checks, torch, case, mh, cpu_ptr):
    """torch writes random bytes into the tensor; reading the mapping must give exactly them."""
    import numpy as np
    name, t = case["name"], case["tensor"]
    n = t.numel()
    data = random_bytes(n)
    t.copy_(torch.from_numpy(data).cuda())
    torch.cuda.synchronize()

    host = np.full(n + GUARD_BYTES, POISON, dtype=np.uint8)
    rc = lib.gdr_copy_from_mapping(mh, host.ctypes.data, cpu_ptr, n)
    if not checks.expect(rc == 0, f"{name}: gdr_copy_from_mapping", f"rc {rc} ({rc_name(rc)})"):
        return
    checks.expect(np.array_equal(host[:n], data), f"{name}: GPU -> CPU, the mapping reads what "
                  "torch wrote", describe_mismatch(host[:n], data))
    checks.expect(bool((host[n:] == POISON).all()), f"{name}: host bytes past the copy untouched",
                  "gdr_copy_from_mapping wrote past size")


def check_case(lib, g, checks, torch, case):
    name, t = case["name"], case["tensor"]
    ptr, n = t.data_ptr(), t.numel()  # uint8: elements are bytes
    rng = cuda_allocation_range(ptr)
    if rng:
        base, size = rng
        spans = "inside it" if ptr + n <= base + size else f"ends {ptr + n - (base + size)} bytes past it"
        info(f"{name}: tensor 0x{ptr:x} +{n}; its CUDA allocation 0x{base:x} +{size}; tensor {spans}")

    # gdr_map maps only pins that start on a GPU page (as gdrcopy): pin the 64 KiB pages around
    # the tensor, as UCX and NCCL do.
    lo = ptr & GPU_PAGE_MASK
    mh = GdrMh()
    rc = lib.gdr_pin_buffer(g, lo, n + (ptr - lo), 0, 0, ctypes.byref(mh))
    if rng and ptr + n > rng[0] + rng[1]:
        # gdrapi.h: a pin lies inside one CUDA allocation. PyTorch maps a large expandable
        # segment as several cuMemCreate chunks, so this pin must be refused with EINVAL (as
        # gdrdrv refuses a range across allocations), not half-served.
        checks.expect(rc == errno.EINVAL,
                      f"{name}: spans several CUDA allocations: gdr_pin_buffer refused (EINVAL)",
                      f"rc {rc} ({rc_name(rc)})")
        if rc == 0:
            lib.gdr_unpin_buffer(g, mh)
        return
    if rc != 0:
        hint = ""
        if rc == errno.ENOTSUP:
            hint = " (not POSIX-fd cuMemCreate memory: was expandable_segments:True in effect?)"
        elif rc == errno.EINVAL and rng and ptr + n > rng[0] + rng[1]:
            hint = " (the tensor spans more than one CUDA allocation)"
        checks.fail(f"{name}: gdr_pin_buffer(0x{lo:x}, {n + ptr - lo}) = {rc} ({rc_name(rc)}), "
                    f"want 0{hint}")
        return
    checks.ok(f"{name}: gdr_pin_buffer(0x{lo:x}, {n + ptr - lo}) = 0, handle {mh.h}")

    try:
        info_v2 = GdrInfoV2()
        rc = lib.gdr_get_info_v2(g, mh, ctypes.byref(info_v2))
        if not checks.expect(rc == 0, f"{name}: gdr_get_info_v2", f"rc {rc} ({rc_name(rc)})"):
            return
        map_ptr = ctypes.c_void_p()
        rc = lib.gdr_map(g, mh, ctypes.byref(map_ptr), info_v2.mapped_size)
        if not checks.expect(rc == 0 and map_ptr.value, f"{name}: gdr_map {info_v2.mapped_size} bytes",
                             f"rc {rc} ({rc_name(rc)}), va {map_ptr.value}"):
            return
        try:
            # Again after the map, so the `mapped` bit can be checked.
            rc = lib.gdr_get_info_v2(g, mh, ctypes.byref(info_v2))
            if rc == 0:
                check_info(checks, name, ptr, n, info_v2)
            else:
                checks.fail(f"{name}: gdr_get_info_v2 after map: rc {rc} ({rc_name(rc)})")
            # gdrapi.h: the byte at GPU address dptr is at map + (dptr - info.va).
            cpu_ptr = map_ptr.value + (ptr - info_v2.va)
            check_cpu_to_gpu(lib, checks, torch, case, mh, cpu_ptr)
            check_gpu_to_cpu(lib, checks, torch, case, mh, cpu_ptr)
        finally:
            rc = lib.gdr_unmap(g, mh, map_ptr, info_v2.mapped_size)
            checks.expect(rc == 0, f"{name}: gdr_unmap", f"rc {rc} ({rc_name(rc)})")
    finally:
        rc = lib.gdr_unpin_buffer(g, mh)
        checks.expect(rc == 0, f"{name}: gdr_unpin_buffer", f"rc {rc} ({rc_name(rc)})")


def time_pin_map(lib, g, checks, case):
    """Median time of pin + get_info + map (what a client does before its first copy: the map
    size comes from get_info) and of unmap + unpin, over TIMING_RUNS runs."""
    name, t = case["name"], case["tensor"]
    ptr, n = t.data_ptr(), t.numel()
    lo = ptr & GPU_PAGE_MASK  # the page-aligned pin that gdr_map maps
    setup_us, teardown_us, errors = [], [], []
    for _ in range(TIMING_RUNS):
        mh, info_v2, map_ptr = GdrMh(), GdrInfoV2(), ctypes.c_void_p()
        t0 = time.perf_counter_ns()
        rc_pin = lib.gdr_pin_buffer(g, lo, n + (ptr - lo), 0, 0, ctypes.byref(mh))
        rc_info = lib.gdr_get_info_v2(g, mh, ctypes.byref(info_v2)) if rc_pin == 0 else -1
        rc_map = lib.gdr_map(g, mh, ctypes.byref(map_ptr), info_v2.mapped_size) if rc_info == 0 else -1
        t1 = time.perf_counter_ns()
        rc_unmap = lib.gdr_unmap(g, mh, map_ptr, info_v2.mapped_size) if rc_map == 0 else -1
        rc_unpin = lib.gdr_unpin_buffer(g, mh) if rc_pin == 0 else -1
        t2 = time.perf_counter_ns()
        rcs = (rc_pin, rc_info, rc_map, rc_unmap, rc_unpin)
        if any(rcs):
            errors.append(rcs)
            continue
        setup_us.append((t1 - t0) / 1000)
        teardown_us.append((t2 - t1) / 1000)
    if not checks.expect(not errors, f"{name}: {TIMING_RUNS} x pin/get_info/map/unmap/unpin all 0",
                         f"{len(errors)} runs failed, first (pin, info, map, unmap, unpin) = {errors[:1]}"):
        return
    print(f"time {name}: pin+get_info+map median {statistics.median(setup_us):.1f} us, "
          f"unmap+unpin median {statistics.median(teardown_us):.1f} us ({TIMING_RUNS} runs)",
          flush=True)


def run_expandable(checks, lib):
    import torch
    g = lib.gdr_open()
    if not checks.expect(bool(g), "gdr_open", "returned NULL (GDRCOPY_ENABLE_LOGGING=1 says why)"):
        return
    print_versions(lib, g)
    cases = make_cases(torch)
    for case in cases:
        check_case(lib, g, checks, torch, case)
    time_pin_map(lib, g, checks, cases[1])  # the 1 MiB + 3 tensor
    rc = lib.gdr_close(g)
    checks.expect(rc == 0, "gdr_close", f"rc {rc} ({rc_name(rc)})")


# ---- default mode ----

def run_default(checks, lib):
    import torch
    g = lib.gdr_open()
    if not checks.expect(bool(g), "gdr_open", "returned NULL (GDRCOPY_ENABLE_LOGGING=1 says why)"):
        return
    print_versions(lib, g)
    backend_id, backend = backend_name(lib, g)

    t = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # cudaMalloc memory
    ptr, n = t.data_ptr(), t.numel()
    mh = GdrMh()
    rc, err = call_capturing_stderr(lambda: lib.gdr_pin_buffer(g, ptr, n, 0, 0, ctypes.byref(mh)))
    sys.stderr.write(err)  # pass the library's line on, so it shows in the output too
    sys.stderr.flush()

    if backend_id == GDR_GDR_BACKEND_VULKAN:
        checks.expect(rc == errno.ENOTSUP, f"default allocator: gdr_pin_buffer(0x{ptr:x}, {n}) = "
                      f"{rc} ({rc_name(rc)}), want {errno.ENOTSUP} (ENOTSUP) on the vulkan backend")
        lines = [ln for ln in err.splitlines() if "cannot pin" in ln]
        checks.expect(bool(lines) and "expandable_segments" in lines[0] and "gdr run" in lines[0],
                      "default allocator: the library's stderr says it cannot pin and names "
                      "`gdr run` and expandable_segments", f"stderr was: {err.strip()!r}")
        for ln in lines:
            info(f"library said: {ln}")
        if rc == 0:
            lib.gdr_unpin_buffer(g, mh)
    else:
        # gdrdrv and dmabuf pin any cudaMalloc range: the refusal is vulkan's alone.
        info(f"backend {backend}: cudaMalloc memory is expected to pin here")
        checks.expect(rc == 0, f"default allocator on {backend}: gdr_pin_buffer = {rc} "
                      f"({rc_name(rc)}), want 0", err.strip())
        if rc == 0:
            rc = lib.gdr_unpin_buffer(g, mh)
            checks.expect(rc == 0, "default allocator: gdr_unpin_buffer", f"rc {rc}")
    rc = lib.gdr_close(g)
    checks.expect(rc == 0, "gdr_close", f"rc {rc} ({rc_name(rc)})")


# ---- one mode in this process ----

def run_mode(mode):
    # The allocator reads PYTORCH_CUDA_ALLOC_CONF once, when CUDA starts: set it before torch.
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the default allocator: cudaMalloc
        # The refusal line is what is checked; the library reads this at its first message.
        os.environ.setdefault("GDRCOPY_ENABLE_LOGGING", "1")

    available, why = gpu_available()
    if not available:
        return skip(why)

    checks = Checks()
    try:
        lib = load_gdrapi()
    except OSError as e:
        checks.fail(f"load {LIB_NAME}: {e} (install gdr's library or set LD_LIBRARY_PATH)")
        return checks.summary()
    try:
        if mode in ("expandable", "allocator"):
            run_expandable(checks, lib)
        else:
            run_default(checks, lib)
    except Exception as e:  # count it and still print the summary line
        checks.fail(f"{mode}: unexpected {type(e).__name__}: {e}")
    return checks.summary()


# ---- driver: both modes in fresh processes ----

SUMMARY_RE = re.compile(rf"^{NAME}: (\d+) passed, (\d+) failed$")


def run_child(mode):
    """Runs one mode in a child process, echoes its output, returns (passed, failed)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"     # keep our lines and the library's stderr in order
    env["GDR_REQUIRE_GPU"] = "1"      # the driver saw a GPU: a child that does not is a failure
    env["GDRCOPY_ENABLE_LOGGING"] = "1"  # errors only (unless GDRCOPY_LOG_LEVEL): failures explain themselves
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)

    print(f"== {mode} ==", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), mode]
    if mode == "allocator":
        if os.environ.get("GDR_BIN"):
            cmd = [os.environ["GDR_BIN"], "run", "--"] + cmd
        else:
            env["LD_PRELOAD"] = os.environ["GDR_ALLOC_LIB"]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=CHILD_TIMEOUT_S)
        out, rc = proc.stdout.decode(errors="replace"), proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace"), None

    passed = failed = None
    for line in out.splitlines():
        m = SUMMARY_RE.match(line)
        if m:
            passed, failed = int(m.group(1)), int(m.group(2))
        else:
            print(line)
    if rc is None:
        print(f"FAIL {mode}: child timed out after {CHILD_TIMEOUT_S} s")
        return (passed or 0), (failed or 0) + 1
    if passed is None:
        print(f"FAIL {mode}: child exited with {rc} without a summary line")
        return 0, 1
    if rc != 0 and failed == 0:
        print(f"FAIL {mode}: child exited with {rc}")
        failed += 1
    print(f"-- {mode}: {passed} passed, {failed} failed", flush=True)
    return passed, failed


def run_all():
    available, why = gpu_available()
    if not available:
        return skip(why)
    passed = failed = 0
    modes = ["expandable", "default"]
    if os.environ.get("GDR_BIN") or os.environ.get("GDR_ALLOC_LIB"):
        modes.append("allocator")
    else:
        print("info allocator mode not run: neither GDR_BIN nor GDR_ALLOC_LIB is set")
    for mode in modes:
        p, f = run_child(mode)
        passed += p
        failed += f
    print(f"{NAME}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def main(argv):
    mode = argv[1] if len(argv) > 1 else "all"
    if mode == "all":
        return run_all()
    if mode in ("expandable", "default", "allocator"):
        return run_mode(mode)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
