#!/usr/bin/env python3
"""NCCL (through torch.distributed, one process, one GPU) with gdr's libgdrapi as its gdrcopy.

Usage: nccl_gdrcopy.py [--with-gdr | --without-gdr] [--out DIR]

  --with-gdr     runs the collectives child with NCCL_GDRCOPY_ENABLE=1 NCCL_GDRCOPY_FIFO_ENABLE=1
                 and checks, in the captured log, that NCCL took the library ("GDRCOPY enabled
                 library ...") and that the library pinned and mapped NCCL's work FIFO.
  --without-gdr  runs the same child without NCCL_GDRCOPY_ENABLE and checks NCCL did not use it.
  (neither)      both, then a table of the 8 B all_reduce median latency with and without.

The child runs all_reduce (sum), all_gather (list and into-tensor) and broadcast on float32,
int32 and uint8 tensors of 8 B .. 256 MiB filled with fresh random data, several times each,
and compares with the expected result computed independently (world size 1: every one of
these returns its input). Full logs go to DIR/nccl-gdr.log and DIR/nccl-nogdr.log (DIR: --out,
default a new temp dir). Ends with `nccl_gdrcopy: N passed, M failed`; exits 1 on any failure.
Without torch, NCCL or a GPU: `nccl_gdrcopy: skipped: no GPU`, exit 0 (1 when GDR_REQUIRE_GPU=1).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

NAME = "nccl_gdrcopy"
CHILD_TIMEOUT_S = 300

# Both runs: NCCL's INIT/ALLOC log (where it says whether it took gdrcopy and allocates the
# FIFO) and the library's INFO log (gdr_open / gdr_pin_buffer / gdr_map lines). NVLS is off:
# it is irrelevant to one rank and only adds setup.
COMMON_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,ALLOC",
    "NCCL_NVLS_ENABLE": "0",
    "GDRCOPY_ENABLE_LOGGING": "1",
    "GDRCOPY_LOG_LEVEL": "2",
    "PYTHONUNBUFFERED": "1",
}
# Only the --with-gdr run: NCCL loads libgdrapi.so and puts its work FIFO in GPU memory that the
# CPU writes through a gdr mapping.
GDR_ENV = {
    "NCCL_GDRCOPY_ENABLE": "1",
    "NCCL_GDRCOPY_FIFO_ENABLE": "1",
}

MiB = 1 << 20
# 8 B, 32 B, ..., 128 MiB (powers of 4), then 256 MiB.
SIZES = [8 * 4 ** k for k in range(13)] + [256 * MiB]
REPS = 3
LATENCY_WARMUP = 100
LATENCY_RUNS = 1000


def size_str(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def gpu_available():
    """(True, "") when torch imports, sees a CUDA device and has NCCL, else (False, why)."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # a broken install counts as "no torch" here; GDR_REQUIRE_GPU=1 catches it
        return False, f"torch not importable: {e}"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    if not dist.is_available() or not dist.is_nccl_available():
        return False, "torch.distributed has no NCCL backend"
    return True, ""


def skip(why):
    print(f"info {why}")
    print(f"{NAME}: skipped: no GPU", flush=True)
    return 1 if os.environ.get("GDR_REQUIRE_GPU") == "1" else 0


class Checks:
    """Counts and prints one line per check; the child also keeps them for its result file."""

    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.lines = []

    def record(self, good, what):
        line = f"{'ok' if good else 'FAIL'} {what}"
        print(line, flush=True)
        self.lines.append(line)
        if good:
            self.passed += 1
        else:
            self.failed += 1
        return good

    def expect(self, cond, what, why=""):
        return self.record(bool(cond), what if cond or not why else f"{what}: {why}")


# ---- child: the collectives, in a process whose stdout+stderr the parent captures ----

def random_tensor(torch, dtype, nbytes):
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    if dtype == torch.float32:
        return torch.randn(n, dtype=dtype, device="cuda")
    if dtype == torch.int32:
        return torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=dtype, device="cuda")
    return torch.randint(0, 256, (n,), dtype=dtype, device="cuda")


def poisoned_like(torch, x, numel):
    """An output buffer that cannot equal the expected result by accident: NaN never compares
    equal, and for integers the random input makes a match of all elements vanishingly rare."""
    out = torch.empty(numel, dtype=x.dtype, device=x.device)
    out.fill_(float("nan") if x.dtype == torch.float32 else 0x5A)
    return out


# Each runs one collective on x and returns the tensor holding the result. With one rank, the
# expected result of each is the input itself: the SUM over one rank, the gather of one piece,
# the broadcast from rank 0 to itself.
def coll_all_reduce(torch, dist, x):
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def coll_all_gather(torch, dist, x):
    outs = [poisoned_like(torch, x, x.numel()) for _ in range(dist.get_world_size())]
    dist.all_gather(outs, x)
    return torch.cat(outs)


def coll_all_gather_into_tensor(torch, dist, x):
    out = poisoned_like(torch, x, x.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(out, x)
    return out


def coll_broadcast(torch, dist, x):
    dist.broadcast(x, src=0)
    return x


COLLECTIVES = [
    ("all_reduce", coll_all_reduce),
    ("all_gather", coll_all_gather),
    ("all_gather_into_tensor", coll_all_gather_into_tensor),
    ("broadcast", coll_broadcast),
]


def check_collective(torch, dist, checks, name, fn, dtype):
    """One check line per (collective, dtype): every size, REPS times, fresh data each time."""
    dname = str(dtype).replace("torch.", "")
    failures = []
    for nbytes in SIZES:
        for rep in range(REPS):
            try:
                x = random_tensor(torch, dtype, nbytes)
                # The expected result, taken on the host before NCCL touches x.
                expected = x.cpu()
                result = fn(torch, dist, x)
                torch.cuda.synchronize()
                got = result.cpu()
                if not torch.equal(got, expected):
                    bad = (got != expected).nonzero()
                    i = int(bad[0]) if bad.numel() else -1
                    failures.append(f"{size_str(nbytes)} rep {rep}: {bad.numel()} of "
                                    f"{expected.numel()} elements differ, first at {i}")
            except Exception as e:
                failures.append(f"{size_str(nbytes)} rep {rep}: {type(e).__name__}: {e}")
            finally:
                x = result = None  # let the allocator reuse the memory for the next size
    what = f"{name} {dname}: {size_str(SIZES[0])} .. {size_str(SIZES[-1])}, {len(SIZES)} sizes x {REPS}"
    checks.expect(not failures, what, "; ".join(failures[:3]) +
                  (f"; and {len(failures) - 3} more" if len(failures) > 3 else ""))


def measure_latency(torch, dist):
    """Median wall time of one 8-byte all_reduce including the wait for it, in microseconds."""
    x = torch.ones(2, dtype=torch.float32, device="cuda")  # 8 bytes
    for _ in range(LATENCY_WARMUP):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    samples = []
    for _ in range(LATENCY_RUNS):
        t0 = time.perf_counter_ns()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return {
        "median_us": statistics.median(samples),
        "p10_us": samples[len(samples) // 10],
        "p90_us": samples[len(samples) * 9 // 10],
    }


def child_main(result_path):
    checks = Checks()
    result = {"latency": None, "versions": ""}
    store_dir = tempfile.mkdtemp(prefix="nccl_gdrcopy_store.")
    try:
        import torch
        import torch.distributed as dist
        nccl = torch.cuda.nccl.version()  # a tuple (2, 28, 9) in recent torch, an int before
        nccl = ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
        result["versions"] = f"torch {torch.__version__}, torch's NCCL {nccl}"
        print(f"info {result['versions']}", flush=True)

        torch.cuda.set_device(0)
        torch.manual_seed(int.from_bytes(os.urandom(8), "little"))  # fresh data every run
        # A file store: one process, nothing to connect to, no port to pick.
        dist.init_process_group("nccl", init_method="file://" + os.path.join(store_dir, "store"),
                                rank=0, world_size=1)
        for dtype in (torch.float32, torch.int32, torch.uint8):
            for name, fn in COLLECTIVES:
                check_collective(torch, dist, checks, name, fn, dtype)
        result["latency"] = measure_latency(torch, dist)
        lat = result["latency"]
        print(f"time all_reduce 8 B: median {lat['median_us']:.2f} us (p10 {lat['p10_us']:.2f}, "
              f"p90 {lat['p90_us']:.2f}, {LATENCY_RUNS} runs)", flush=True)
        dist.destroy_process_group()
        checks.record(True, "destroy_process_group")
    except Exception as e:
        checks.record(False, f"child: unexpected {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    result.update(passed=checks.passed, failed=checks.failed, lines=checks.lines)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 1 if checks.failed else 0


# ---- parent: run the child, keep its log, check what NCCL and the library wrote ----

def run_child(with_gdr, out_dir):
    """Runs the child with the gdr (or no-gdr) environment. Returns (rc or None on timeout,
    log text, result dict or None)."""
    tag = "gdr" if with_gdr else "nogdr"
    env = dict(os.environ)
    env.update(COMMON_ENV)
    for key in GDR_ENV:
        env.pop(key, None)
    if with_gdr:
        env.update(GDR_ENV)
    result_path = os.path.join(out_dir, f"nccl-{tag}-result.json")
    if os.path.exists(result_path):
        os.remove(result_path)  # a stale one must not pass for this run's

    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--result", result_path]
    try:
        # stderr into stdout: NCCL logs to stdout, the library to stderr; one log, in order.
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=CHILD_TIMEOUT_S)
        rc, log = proc.returncode, proc.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc, log = None, (e.stdout or b"").decode(errors="replace")

    log_path = os.path.join(out_dir, f"nccl-{tag}.log")
    with open(log_path, "w") as f:
        f.write(log)
    print(f"info {tag}: log in {log_path}", flush=True)

    result = None
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
    return rc, log, result


def grep(lines, pattern):
    return [ln for ln in lines if re.search(pattern, ln)]


def show(lines, limit=20):
    for ln in lines[:limit]:
        print(f"    | {ln}")
    if len(lines) > limit:
        print(f"    | ... {len(lines) - limit} more")


def check_child_ran(checks, tag, rc, log, result):
    """The child finished in time, cleanly, and its own checks count into ours."""
    if rc is None:
        checks.record(False, f"{tag}: child timed out after {CHILD_TIMEOUT_S} s; last lines:")
        show(log.splitlines()[-20:])
    elif result is None:
        checks.record(False, f"{tag}: child exited with {rc} and wrote no result; last lines:")
        show(log.splitlines()[-20:])
    else:
        checks.expect(rc == 0, f"{tag}: child exited with 0", f"exited with {rc}")
    if result is None:
        return
    # Re-print and count the child's own check lines, tagged with the run they came from.
    for line in result["lines"]:
        good, _, what = line.partition(" ")
        checks.record(good == "ok", f"{tag}: {what}")


def check_gdr_log(checks, log):
    lines = log.splitlines()

    # (c) which NCCL wrote this log.
    version = grep(lines, r"NCCL version")
    print(f"info gdr: {version[0].strip() if version else 'no NCCL version line (NCCL_DEBUG=INFO not honoured?)'}")

    # (a) NCCL took the library: gdrwrap logs "GDRCOPY enabled library X.Y driver X.Y" at INIT.
    enabled = grep(lines, r"GDRCOPY enabled library")
    warnings = grep(lines, r"NCCL WARN.*(?i:gdr|dlsym|dlopen|libgdrapi)")
    if checks.expect(enabled, "gdr: NCCL logged 'GDRCOPY enabled library'"):
        show(enabled)
    else:
        # The lines that say why: NCCL's warnings about the library and anything gdrcopy-ish.
        show(list(dict.fromkeys(warnings + grep(lines, r"(?i)gdrcopy|dlsym|libgdrapi"))), 30)
    if not checks.expect(not warnings, "gdr: no NCCL warnings about gdrcopy"):
        show(warnings)

    # (b) the library was opened and NCCL's work FIFO pinned and mapped through it.
    opened = grep(lines, r"gdrapi INFO: gdr_open:")
    pinned = grep(lines, r"gdrapi INFO: gdr_pin_buffer: .*pinned")
    mapped = grep(lines, r"gdrapi INFO: gdr_map: handle \S+ mapped")
    if checks.expect(opened, "gdr: the library logged gdr_open:"):
        show(opened)
    if checks.expect(pinned, f"gdr: the library logged gdr_pin_buffer: ... pinned ({len(pinned)} lines)"):
        show(pinned, 5)
    if checks.expect(mapped, f"gdr: the library logged gdr_map: ... mapped ({len(mapped)} lines)"):
        show(mapped, 5)
    errors = grep(lines, r"gdrapi (ERR|WARN):")
    if not checks.expect(not errors, "gdr: no gdrapi ERR/WARN lines"):
        show(errors)


def check_nogdr_log(checks, log):
    lines = log.splitlines()
    version = grep(lines, r"NCCL version")
    print(f"info nogdr: {version[0].strip() if version else 'no NCCL version line'}")
    enabled = grep(lines, r"GDRCOPY enabled")
    if not checks.expect(not enabled, "nogdr: NCCL did not log 'GDRCOPY enabled'"):
        show(enabled)
    # Informational: without NCCL_GDRCOPY_ENABLE, NCCL does not even dlopen the library.
    print(f"info nogdr: {len(grep(lines, r'gdrapi (INFO|DBG|WARN|ERR):'))} gdrapi log lines")


def run_variant(checks, with_gdr, out_dir):
    tag = "gdr" if with_gdr else "nogdr"
    print(f"== {tag} ==", flush=True)
    rc, log, result = run_child(with_gdr, out_dir)
    if result and result.get("versions"):
        print(f"info {tag}: {result['versions']}")
    check_child_ran(checks, tag, rc, log, result)
    if with_gdr:
        check_gdr_log(checks, log)
    else:
        check_nogdr_log(checks, log)
    return result["latency"] if result else None


def print_comparison(with_lat, without_lat):
    print(f"8 B all_reduce latency, 1 rank, median of {LATENCY_RUNS} (us):")
    print(f"  {'':16} {'median':>9} {'p10':>9} {'p90':>9}")
    for label, lat in (("with gdrcopy", with_lat), ("without gdrcopy", without_lat)):
        if lat:
            print(f"  {label:16} {lat['median_us']:9.2f} {lat['p10_us']:9.2f} {lat['p90_us']:9.2f}")
        else:
            print(f"  {label:16} {'n/a':>9}")
    if with_lat and without_lat:
        print(f"  with / without   {with_lat['median_us'] / without_lat['median_us']:9.2f}x")


def parent_main(args):
    available, why = gpu_available()
    if not available:
        return skip(why)
    out_dir = args.out or tempfile.mkdtemp(prefix="nccl_gdrcopy.")
    os.makedirs(out_dir, exist_ok=True)

    checks = Checks()
    latency = {}
    if not args.without_gdr:
        latency["gdr"] = run_variant(checks, True, out_dir)
    if not args.with_gdr:
        latency["nogdr"] = run_variant(checks, False, out_dir)
    if len(latency) == 2:
        print_comparison(latency["gdr"], latency["nogdr"])
    print(f"info logs in {out_dir}")
    print(f"{NAME}: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--with-gdr", action="store_true", help="only the NCCL_GDRCOPY_ENABLE=1 run")
    which.add_argument("--without-gdr", action="store_true", help="only the run without it")
    ap.add_argument("--out", metavar="DIR", help="where to write nccl-gdr.log / nccl-nogdr.log")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args.result)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
