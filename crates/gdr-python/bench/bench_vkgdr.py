#!/usr/bin/env python3
"""gdr's Python calls beside vkgdr 0.1's, in one process on one GPU, and beside the Rust calls.

vkgdr (PyPI, SARAO) allocates CUDA memory that the CPU maps and hands out its host pointer;
its users copy with NumPy (``np.copyto`` on the mapping's ``__array_interface__``) or
``ctypes.memmove``, and both are timed here, the faster one per size standing for vkgdr. gdr's
side: ``Buffer.write``/``read_into`` (stream stores and loads on one thread) and the auto
copier (mapping on 1..N threads, or the copy engine), and gdr's NumPy view of the mapping
(``np.copyto``, vkgdr's own path: writes with no store fence, as vkgdr's; reads the slow path
docs/python.md warns about), the fastest per size standing for gdr. Every path is checked for
byte-exact results before it is timed.

Timing: each call runs in a plain Python loop (``for _ in range(k): f(a, b)``) of k calls
lasting about 200 us, rounds of every path in a shuffled order, for a time budget per size; a
path's figure is the median per-call time over its rounds. Beside each gdr call, the same copy
(same buffer, same host array, same offset) runs k times in a loop in Rust
(``gdr._gdr._rust_copy_loop``), in the same rounds: the Python overhead of a call is its
per-call time less the loop's own per-iteration time less the Rust copy's, and for bulk copies
the speed ratio is the Rust copy's time over the Python call's. These four paths then run
again on their own, at least 9 rounds more, since vkgdr's slow reads leave few rounds at the
largest sizes. ``--gdr``/``--copylat`` add ``gdr copylat``'s figures (another process, its own
host buffer) for comparison only.

Goals (issues 28 and 44): at least vkgdr's speed on small writes; 10x or more on reads from
1 KiB; 2x or more on writes from 1 MiB; a small call (8 B, 64 B) within 0.10 us of the same
copy from Rust; auto-copier reads from 1 MiB at 95% or more of Rust's speed.

Usage: bench_vkgdr.py [--gdr PATH | --copylat FILE] [--json OUT] [--budget S] [--max-read MiB]
Exit status: 0 when it measured both (whatever the goals), 2 when vkgdr could not run.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

import gdr
from gdr._gdr import _rust_copy_loop

LAT_SIZES = [8, 64, 1024, 4096]
BW_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
PAIRED = ("gdr", "gdr rust", "gdr auto", "gdr auto rust")  # timed again, on their own
NUMPY_VIEW_MAX = 1 << 20  # reads through gdr's NumPy view beyond this only take time
perf = time.perf_counter_ns


def loop2(k: int, f: Callable, a: Any, b: Any) -> int:
    t0 = perf()
    for _ in range(k):
        f(a, b)
    return perf() - t0


def loop3(k: int, f: Callable, a: Any, b: Any, c: Any) -> int:
    t0 = perf()
    for _ in range(k):
        f(a, b, c)
    return perf() - t0


def empty_loop(k: int) -> int:
    t0 = perf()
    for _ in range(k):
        pass
    return perf() - t0


class Op:
    """One timed path: ``f(*args)`` per call."""

    def __init__(self, name: str, f: Callable, *args: Any) -> None:
        self.name, self.f, self.args = name, f, args
        self.k = 1
        self.samples: List[float] = []

    def run(self, k: int) -> int:
        if len(self.args) == 2:
            return loop2(k, self.f, *self.args)
        return loop3(k, self.f, *self.args)


class RustOp(Op):
    """The same copy as a gdr op, looped k times in Rust (``gdr._gdr._rust_copy_loop``) on the
    same buffer and host array: the Rust call's time, with no Python call per copy."""

    def __init__(self, name: str, direction: str, buf: Any, host: Any, auto: Any = None) -> None:
        super().__init__(name, _rust_copy_loop)
        self.direction, self.buf, self.host, self.auto = direction, buf, host, auto

    def run(self, k: int) -> int:
        return _rust_copy_loop(self.direction, self.buf, self.host, k, 0, auto=self.auto)


def measure(ops: Sequence[Op], budget_s: float, min_rounds: int = 3, max_rounds: int = 41,
            more: bool = False) -> None:
    """Fills each op's samples (us per call), interleaved round by round. The caller ran each
    op once already (its check), which warmed it up. With `more`, adds rounds to the samples
    an earlier call took, with the same loop lengths."""
    if not more:
        for op in ops:
            once = max(op.run(1), 1)
            op.k = int(min(max(200_000 // once, 1), 20_000))
            op.samples = []
    rng = random.Random(1)
    start = time.monotonic()
    rounds = 0
    order = list(ops)
    while rounds < max_rounds and (rounds < min_rounds or time.monotonic() - start < budget_s):
        rng.shuffle(order)
        for op in order:
            op.samples.append(op.run(op.k) / op.k / 1000.0)
        rounds += 1


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def loop_overhead_us() -> float:
    k = 200_000
    empty_loop(k)
    return min(empty_loop(k) for _ in range(5)) / k / 1000.0


def size_name(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def rust_figures(args: argparse.Namespace) -> Optional[List[Dict[str, Any]]]:
    """`gdr copylat` rows (the Rust calls): from --copylat FILE or by running --gdr."""
    if args.copylat:
        with open(args.copylat) as f:
            return json.load(f)
    if args.gdr:
        cmd = [args.gdr, "copylat", "--min-size", "8", "--max-size", "4K", "--budget-ms", "300",
               "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            why = r.stderr.strip()[-500:]
            print(f"gdr copylat failed ({r.returncode}): {why}", file=sys.stderr)
            return None
        return json.loads(r.stdout)
    return None


class Vkgdr:
    """vkgdr's memory as its users reach it: a NumPy view and the host address."""

    def __init__(self, size: int) -> None:
        import vkgdr  # noqa: PLC0415

        self.module = vkgdr
        # gdr.open(0) made GPU 0's primary context current on this thread.
        self.handle = vkgdr.Vkgdr.open_current_context()
        self.mem = vkgdr.RawMemory(self.handle, size)
        self.coherent = bool(self.mem.is_coherent)
        self.ptr = int(self.mem.__array_interface__["data"][0])
        self.array = np.asarray(self.mem).view(np.uint8)
        self.version = getattr(vkgdr, "__version__", "?")

    def close(self) -> None:
        self.array = None
        self.mem.free()


def check(name: str, got: bytes, want: bytes) -> None:
    if got != want:
        bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        raise SystemExit(f"{name}: wrong bytes (first difference at byte {bad})")


def vk_sample(vk: "Vkgdr", want: np.ndarray, name: str) -> None:
    """Checks vkgdr's memory against `want`: whole up to 4 MiB, else its first and last 64 KiB
    and 16 windows of 4 KiB (plain loads of its mapping run at tens of MB/s)."""
    n = want.size
    if n <= 4 << 20:
        check(name, vk.array[:n].tobytes(), want.tobytes())
        return
    rng = random.Random(n)
    windows = [(0, 64 << 10), (n - (64 << 10), n)]
    windows += [(o, o + 4096) for o in (rng.randrange(0, n - 4096) for _ in range(16))]
    for a, b in windows:
        check(f"{name} [{a}:{b}]", vk.array[a:b].tobytes(), want[a:b].tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gdr", help="the gdr CLI, to time the Rust calls (gdr copylat)")
    ap.add_argument("--copylat", help="a `gdr copylat --json` file to take the Rust figures from")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--budget", type=float, default=0.6, help="seconds per size (default 0.6)")
    ap.add_argument("--max-read", type=int, default=256,
                    help="largest read timed on vkgdr's mapping, MiB (default 256)")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()

    gpu = gdr.open(args.device)
    max_size = max(BW_SIZES)
    buf = gpu.alloc(max_size, 4096)
    t0 = time.monotonic()
    auto = gpu.auto_copier()
    if auto.calibrated_now:
        print(f"(the auto copier calibrated in {time.monotonic() - t0:.0f} s)", file=sys.stderr)
    gview = buf.numpy()
    rng = np.random.default_rng(28)
    src = rng.integers(0, 256, max_size, dtype=np.uint8)
    dst = np.zeros(max_size, np.uint8)

    vk: Optional[Vkgdr] = None
    vk_error = None
    try:
        vk = Vkgdr(max_size)
    except Exception as e:  # reported; gdr's side is still measured
        vk_error = f"{type(e).__name__}: {e}"
        print(f"vkgdr unavailable: {vk_error}", file=sys.stderr)

    loop_us = loop_overhead_us()
    rows: List[Dict[str, Any]] = []
    for size in LAT_SIZES + BW_SIZES:
        s, d = src[:size], dst[:size]
        want = s.tobytes()
        for direction in ("write", "read"):
            ops: List[Op] = []
            ops.append(RustOp("gdr rust", direction, buf, s if direction == "write" else d))
            ops.append(RustOp("gdr auto rust", direction, buf, s if direction == "write" else d,
                              auto))
            if direction == "write":
                ops.append(Op("gdr", buf.write, s, 0))
                ops.append(Op("gdr auto", auto.write, buf, s, 0))
                if size <= NUMPY_VIEW_MAX:
                    # vkgdr's own path on gdr's mapping: a NumPy copy, no fence (buf.fence()
                    # makes such stores visible to the GPU; buf.write ends with one itself).
                    ops.append(Op("gdr numpy view", np.copyto, gview[:size], s))
                if vk is not None:
                    vk_n = vk.array[:size]
                    ops.append(Op("vkgdr numpy", np.copyto, vk_n, s))
                    ops.append(Op("vkgdr memmove", ctypes.memmove, vk.ptr, s.ctypes.data, size))
            else:
                ops.append(Op("gdr", buf.read_into, d, 0))
                ops.append(Op("gdr auto", auto.read_into, buf, d, 0))
                if size <= NUMPY_VIEW_MAX:
                    ops.append(Op("gdr numpy view", np.copyto, d, gview[:size]))
                if vk is not None and size <= args.max_read << 20:
                    vk_n = vk.array[:size]
                    ops.append(Op("vkgdr numpy", np.copyto, d, vk_n))
                    ops.append(Op("vkgdr memmove", ctypes.memmove, d.ctypes.data, vk.ptr, size))
            # Each path once, checked, before it is timed.
            poison = np.bitwise_not(s)
            for op in ops:
                if direction == "write":
                    if op.name.startswith("gdr"):
                        buf.write(poison)
                    else:
                        np.copyto(vk.array[:size], poison)
                    op.run(1)
                    if op.name.startswith("gdr"):
                        buf.fence()
                        check(f"{op.name} write {size}", buf.read(size), want)
                    else:
                        vk_sample(vk, s, f"{op.name} write {size}")
                else:
                    if op.name.startswith("gdr"):
                        buf.write(s)
                    else:
                        np.copyto(vk.array[:size], s)
                    d[:] = 0
                    op.run(1)
                    check(f"{op.name} read {size}", d.tobytes(), want)
            measure(ops, args.budget)
            # The Python calls and their Rust loops again, on their own: vkgdr's slow reads
            # leave the largest sizes only the minimum of rounds above, too few for a ratio.
            pairs = [op for op in ops if op.name in PAIRED]
            measure(pairs, args.budget, min_rounds=9, more=True)
            med = {op.name: median(op.samples) for op in ops}
            gdr_best = min(med[n] for n in ("gdr", "gdr auto", "gdr numpy view") if n in med)
            vk_paths = [med[n] for n in ("vkgdr numpy", "vkgdr memmove") if n in med]
            vk_best = min(vk_paths) if vk_paths else None
            rows.append({
                "direction": direction,
                "size": size,
                "median_us": med,
                "rounds": {op.name: len(op.samples) for op in ops},
                "gdr_us": med["gdr"],
                "gdr_auto_us": med["gdr auto"],
                "gdr_best_us": gdr_best,
                "gdr_best_path": "gdr" if med["gdr"] <= med["gdr auto"] else "gdr auto",
                "auto_path": auto.path(direction, size),
                "vkgdr_best_us": vk_best,
                "speedup": (vk_best / gdr_best) if vk_best else None,
                "gdr_gbps": size / gdr_best / 1e3,
                "vkgdr_gbps": (size / vk_best / 1e3) if vk_best else None,
            })
            print(f"\r{direction:5} {size_name(size):>8}", end="", file=sys.stderr, flush=True)
    print("\r" + " " * 20 + "\r", end="", file=sys.stderr)

    # gdr's Python calls over the same copies looped in Rust (same process, buffer and host
    # array, interleaved rounds): the call's cost for small copies, the speed ratio for bulk.
    overhead = []
    for r in rows:
        m = r["median_us"]
        for py_name, rust_name, path in (("gdr", "gdr rust", "mapping"),
                                         ("gdr auto", "gdr auto rust", "auto")):
            overhead.append({
                "direction": r["direction"],
                "size": r["size"],
                "path": path,
                "python_us": m[py_name],
                "loop_us": loop_us,
                "rust_us": m[rust_name],
                "overhead_us": m[py_name] - loop_us - m[rust_name],
                "python_over_rust_speed": m[rust_name] / m[py_name],
            })
    # The same copies timed by `gdr copylat` in another process (the figures before the
    # in-process loop existed), for comparison only.
    rust = rust_figures(args)

    goals = evaluate(rows, overhead, vk is not None)
    print_report(rows, overhead, goals, loop_us, vk, rust)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu.name,
        "bus_id": gpu.bus_id,
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gdr": gdr.__version__,
        "vkgdr": vk.version if vk else None,
        "vkgdr_error": vk_error,
        "vkgdr_coherent": vk.coherent if vk else None,
        "loop_us": loop_us,
        "budget_s_per_size": args.budget,
        "rows": rows,
        "rust": rust,
        "overhead": overhead,
        "goals": goals,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if vk:
        vk.close()
    buf.close()
    return 0 if vk is not None else 2


def evaluate(rows, overhead, have_vk: bool) -> List[Dict[str, Any]]:
    def pick(direction: str, sizes) -> List[Dict[str, Any]]:
        return [r for r in rows
                if r["direction"] == direction and r["size"] in sizes and r["speedup"]]

    goals = []
    if have_vk:
        for name, direction, sizes, need in (
            ("small writes at least vkgdr's speed", "write", (8, 64), 1.0),
            ("reads from 1 KiB 10x vkgdr or more", "read",
             [s for s in LAT_SIZES + BW_SIZES if s >= 1024], 10.0),
            ("writes from 1 MiB 2x vkgdr or more", "write",
             [s for s in BW_SIZES if s >= 1 << 20], 2.0),
        ):
            rs = pick(direction, sizes)
            if not rs:
                continue
            worst = min(rs, key=lambda r: r["speedup"])
            goals.append({
                "goal": name,
                "met": worst["speedup"] >= need,
                "worst_size": worst["size"],
                "worst_speedup": worst["speedup"],
                "needed": need,
                "detail": ", ".join(f"{size_name(r['size'])} {r['speedup']:.2f}x" for r in rs),
            })
    small = [o for o in overhead if o["path"] == "mapping" and o["size"] in (8, 64)]
    if small:
        worst = max(small, key=lambda o: o["overhead_us"])
        goals.append({
            "goal": "Python call within 0.10 us of the Rust call (8 B, 64 B, same process)",
            "met": worst["overhead_us"] <= 0.10,
            "worst_size": worst["size"],
            "worst_direction": worst["direction"],
            "worst_overhead_us": worst["overhead_us"],
            "needed": 0.10,
            "detail": ", ".join(
                f"{o['direction']} {size_name(o['size'])} {o['overhead_us']:+.3f} us" for o in small
            ),
        })
    bulk = [o for o in overhead
            if o["path"] == "auto" and o["direction"] == "read" and o["size"] >= 1 << 20]
    if bulk:
        worst = min(bulk, key=lambda o: o["python_over_rust_speed"])
        goals.append({
            "goal": "Python auto reads from 1 MiB at 95% of Rust's speed or more (same process)",
            "met": worst["python_over_rust_speed"] >= 0.95,
            "worst_size": worst["size"],
            "worst_ratio": worst["python_over_rust_speed"],
            "needed": 0.95,
            "detail": ", ".join(
                f"{size_name(o['size'])} {o['python_over_rust_speed']:.3f}" for o in bulk
            ),
        })
    return goals


def print_report(rows, overhead, goals, loop_us, vk, rust) -> None:
    head = ("dir", "size", "gdr us", "gdr auto", "auto path", "vk numpy", "vk memmove",
            "gdr/np view", "vkgdr/gdr", "gdr GB/s", "vkgdr GB/s")
    lines = [head]
    for r in rows:
        m = r["median_us"]
        f = lambda k: f"{m[k]:.3f}" if k in m else "-"  # noqa: E731
        lines.append((
            r["direction"], size_name(r["size"]), f"{r['gdr_us']:.3f}", f("gdr auto"),
            r["auto_path"], f("vkgdr numpy"), f("vkgdr memmove"), f("gdr numpy view"),
            f"{r['speedup']:.2f}x" if r["speedup"] else "-",
            f"{r['gdr_gbps']:.2f}", f"{r['vkgdr_gbps']:.2f}" if r["vkgdr_gbps"] else "-",
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(str(c).rjust(w) for c, w in zip(line, widths)))
    print(f"\nper-call medians in us; vkgdr/gdr = vkgdr's best path / gdr's best path; "
          f"an empty Python loop iteration takes {loop_us * 1000:.1f} ns")
    if vk is not None and not vk.coherent:
        print("note: vkgdr reports its memory non-coherent; its paths ran without flushes")
    if overhead:
        print("\nPython calls over the same copies looped in Rust (same process, buffer, host "
              "array):")
        for o in overhead:
            print(f"  {o['path']:7} {o['direction']:5} {size_name(o['size']):>8}: "
                  f"python {o['python_us']:.3f} us, rust {o['rust_us']:.3f} us, "
                  f"loop {o['loop_us']:.3f} us -> overhead {o['overhead_us']:+.3f} us, "
                  f"speed {o['python_over_rust_speed']:.3f} of Rust's")
    if rust:
        print("\ngdr copylat (another process, its own host buffer), mapping p50 us: " + ", ".join(
            f"{x['direction']} {size_name(x['size'])} {x['mapping_median_us']:.3f}" for x in rust))
    print()
    for g in goals:
        state = "MET" if g["met"] else "NOT MET"
        print(f"goal: {g['goal']}: {state} ({g['detail']})")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
