#!/usr/bin/env python3
"""What one small call of gdr's Python API costs on top of its copy, without a GPU.

Each call copies 8 bytes to or from a buffer of host memory (``gdr._gdr._host_buffer``: the same
Rust code as a GPU buffer's, on ordinary memory), so what is measured is the call itself:
Python's call of the method, PyO3's argument parsing, taking the bytes-like object's buffer,
the lock on the memory, the bounds check. The baseline is an empty loop of the same length in
the same run.

Two measures:
- time (default): the best of --rounds loops of --calls calls, in ns per call, less the empty
  loop's. On a busy machine the spread is wide; the instruction count is not.
- ``--instructions``: instructions per call, counted by valgrind's cachegrind (each mode run at
  two loop lengths, the difference divided by the calls between them, so that start-up cancels),
  less the empty loop's. Deterministic to a few instructions; needs valgrind.

The NumPy modes (write_np, read_into_np: the same copies from and into NumPy arrays) run when
NumPy is installed.

Usage: call_cost.py [--instructions] [--calls N] [--rounds R] [--mode NAME ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict

MODES = ["empty", "write", "write_kw", "read_into", "read", "len", "write_np", "read_into_np"]


def loop_of(mode: str) -> Callable[[int], None]:
    import gdr

    buf = gdr._gdr._host_buffer(4096)
    data = bytes(range(8))
    out = bytearray(8)
    write, read_into, read = buf.write, buf.read_into, buf.read
    length = buf.__len__

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def w(n: int) -> None:
        for _ in range(n):
            write(data, 0)

    def w_kw(n: int) -> None:
        for _ in range(n):
            write(data, 0, threads=1)

    def ri(n: int) -> None:
        for _ in range(n):
            read_into(out, 0)

    def r(n: int) -> None:
        for _ in range(n):
            read(8, 0)

    def ln(n: int) -> None:
        for _ in range(n):
            length()

    loops = {"empty": empty, "write": w, "write_kw": w_kw, "read_into": ri, "read": r, "len": ln}
    if mode.endswith("_np"):
        # The same copies from and into NumPy arrays (slices of larger ones, as in
        # bench_vkgdr.py): NumPy's buffer export costs more than bytes' and bytearray's.
        import numpy as np

        src = np.frombuffer(data * 1024, np.uint8)[:8]
        dst = np.zeros(8192, np.uint8)[:8]

        def w_np(n: int) -> None:
            for _ in range(n):
                write(src, 0)

        def ri_np(n: int) -> None:
            for _ in range(n):
                read_into(dst, 0)

        loops.update(write_np=w_np, read_into_np=ri_np)
    # Every mode is checked before it is timed: the bytes written come back.
    write(data, 0)
    read_into(out, 0)
    if bytes(out) != data or read(8, 0) != data:
        raise SystemExit("call_cost: the host buffer did not give back the bytes written")
    if mode.endswith("_np"):
        dst[:] = 0
        write(bytes(8), 0)
        write(src, 0)
        read_into(dst, 0)
        if dst.tobytes() != data:
            raise SystemExit("call_cost: the NumPy copies did not give back the bytes written")
    return loops[mode]


def timed(modes, calls: int, rounds: int) -> Dict[str, float]:
    loops = {m: loop_of(m) for m in modes}
    best = {m: float("inf") for m in modes}
    for _ in range(rounds):
        for m, f in loops.items():  # interleaved, so that a slow spell hits every mode
            t0 = time.perf_counter_ns()
            f(calls)
            best[m] = min(best[m], (time.perf_counter_ns() - t0) / calls)
    return best


def instructions(mode: str, calls: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--run", mode, "--calls", str(calls)],
        capture_output=True, text=True, check=True,
    ).stderr
    m = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if not m:
        raise SystemExit(f"call_cost: no instruction count from valgrind:\n{out}")
    return int(m.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per call with valgrind instead of timing")
    ap.add_argument("--calls", type=int, default=None,
                    help="calls per loop (default 200000 timed, 100000 counted)")
    ap.add_argument("--rounds", type=int, default=15, help="timed loops per mode (default 15)")
    ap.add_argument("--mode", action="append", choices=MODES, help="only these modes")
    ap.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)  # one loop, for valgrind
    a = ap.parse_args()
    if a.calls is not None and a.calls < 1:
        ap.error("--calls must be at least 1")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.run:
        loop_of(a.run)(a.calls or 1)
        return 0
    default = [m for m in MODES if not m.endswith("_np")]
    try:
        import numpy  # noqa: F401  (the NumPy modes only where it is installed)

        default = MODES
    except ImportError:
        pass
    modes = ["empty"] + [m for m in (a.mode or default) if m != "empty"]
    if a.instructions:
        if not shutil.which("valgrind"):
            print("call_cost: --instructions needs valgrind (apt-get install valgrind)")
            return 2
        n = a.calls or 100_000
        per = {m: (instructions(m, n + 10_000) - instructions(m, 10_000)) / n for m in modes}
        unit = "instructions"
    else:
        per = timed(modes, a.calls or 200_000, a.rounds)
        unit = "ns"
    print(f"per call, {unit}, over the empty loop ({per['empty']:.1f} {unit} an iteration):")
    for m in modes[1:]:
        print(f"  {m:13} {per[m] - per['empty']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
