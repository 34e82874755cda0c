#!/usr/bin/env python3
"""NCCL (through torch.distributed, one GPU per process) with gdr's libgdrapi as its gdrcopy.

Usage: nccl_gdrcopy.py [--with-gdr | --without-gdr] [--ranks N] [--net] [--seed S] [--out DIR]

  --with-gdr     runs the collectives with NCCL_GDRCOPY_ENABLE=1 NCCL_GDRCOPY_FIFO_ENABLE=1
                 and checks, in the captured log of every rank, that NCCL took the library
                 ("GDRCOPY enabled library ...") and that the library pinned and mapped NCCL's
                 work FIFO.
  --without-gdr  runs the same without NCCL_GDRCOPY_ENABLE and checks NCCL did not use it.
  (neither)      both, then a table of the 8 B all_reduce latency with and without.
  --ranks N      N processes, rank r on CUDA device r, world size N (default 1: one process).
  --net          (N >= 2) NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket
                 NCCL_SOCKET_IFNAME=lo: the ranks talk through NCCL's socket network transport
                 over loopback (the path between machines); every rank's log must show
                 `via NET/Socket` connections and no P2P/SHM ones.
  --seed S       the seed of the multi-rank inputs (default: a fresh one, printed).

One rank: all_reduce (sum), all_gather (list and into-tensor) and broadcast on float32, int32 and
uint8 tensors of 8 B .. 256 MiB filled with fresh random data, several times each, compared with
the input copied to the host beforehand (world size 1: every one of these returns its input).
N ranks: each rank's input is generated on the host from (seed, dtype, size, repetition, rank),
so every rank regenerates every other rank's input and computes the expected result itself:
all_reduce the elementwise sum (exact: int32 and uint8 wrap like NCCL's integer sum, float32
holds multiples of 1/4 below 32 in magnitude), all_gather the inputs of ranks 0..N-1 in order,
broadcast from rank 0 and from rank N-1 the source's input.
Logs: DIR/nccl-gdr.log and DIR/nccl-nogdr.log with one rank, DIR/nccl-<tag>-rank<r>.log with N
(tag gdr, nogdr, gdr-net, nogdr-net); DIR/nccl-summary.json has the counts and latencies (DIR:
--out, default a new temp dir). Ends with `nccl_gdrcopy: N passed, M failed`; exits 1 on any
failure. Without torch, NCCL or a GPU: `nccl_gdrcopy: skipped: no GPU`; with fewer than N GPUs:
`nccl_gdrcopy: skipped: needs N GPUs, found M`; both exit 0 (1 when GDR_REQUIRE_GPU=1).
"""

import argparse
import collections
import datetime
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
# All N ranks of one variant together; they move every size 5 times over (sockets with --net).
MULTI_TIMEOUT_S = 420
# After one rank exits with an error, the others get this long before they are killed: a rank
# that is gone leaves its peers waiting in a collective.
PEER_GRACE_S = 30
# torch.distributed's own bound on one collective (and on the rendezvous) with N ranks.
COLL_TIMEOUT_S = 180

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
# Only --net: no peer-to-peer and no shared-memory transport between the ranks, so NCCL connects
# them through its network transport; the internal socket one (not IB, not a plugin), over
# loopback. NET in the debug subsystems for "NET/Socket : Using ..." (the channel lines, "via
# NET/Socket/0", are INIT|NET and print with INIT already).
NET_ENV = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NET": "Socket",
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_DEBUG_SUBSYS": "INIT,ALLOC,NET",
}
# Without --net these must not leak in from the caller's environment.
TRANSPORT_OFF = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")

MiB = 1 << 20
# 8 B, 32 B, ..., 128 MiB (powers of 4), then 256 MiB.
SIZES = [8 * 4 ** k for k in range(13)] + [256 * MiB]
REPS = 3
LATENCY_WARMUP = 100
LATENCY_RUNS = 1000
# Part of the per-input seed, so that the dtypes do not share data.
DTYPE_CODES = {"float32": 1, "int32": 2, "uint8": 3}


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


def require_gpu():
    return os.environ.get("GDR_REQUIRE_GPU") == "1"


def skip(why):
    print(f"info {why}")
    print(f"{NAME}: skipped: no GPU", flush=True)
    return 1 if require_gpu() else 0


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


def coll_broadcast_from(src):
    def fn(torch, dist, x):
        dist.broadcast(x, src=src)
        return x
    return fn


COLLECTIVES = [
    ("all_reduce", coll_all_reduce),
    ("all_gather", coll_all_gather),
    ("all_gather_into_tensor", coll_all_gather_into_tensor),
    ("broadcast", coll_broadcast),
]


def check_collective(torch, dist, checks, name, fn, dtype):
    """One rank. One check line per (collective, dtype): every size, REPS times, fresh data each
    time."""
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
    checks.expect(not failures, what, failures_text(failures))


def failures_text(failures):
    return "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")


# -- N ranks: inputs every rank can regenerate, expected results computed on the host --

def rank_input(np, seed, dname, nbytes, rep, r):
    """Rank r's input for one (dtype, size, repetition): the same array in every process.
    PCG64 seeded from all five numbers; raw 64-bit words viewed as the dtype. float32 takes one
    random signed byte per element, divided by 4: multiples of 1/4 in [-32, 31.75], so any sum
    over ranks is exact whatever order NCCL adds in."""
    rng = np.random.default_rng([seed, DTYPE_CODES[dname], nbytes, rep, r])
    if dname == "float32":
        n = nbytes // 4
        raw = rng.bit_generator.random_raw((n + 7) // 8).view(np.int8)[:n]
        return raw.astype(np.float32) * np.float32(0.25)
    raw = rng.bit_generator.random_raw((nbytes + 7) // 8)
    if dname == "int32":
        return raw.view(np.int32)[: nbytes // 4]
    return raw.view(np.uint8)[:nbytes]


def expected_sum(np, inputs):
    """The elementwise sum over ranks as NCCL computes it: integers wrap (added as unsigned,
    which numpy wraps by definition), float32 is exact for these inputs."""
    first = inputs[0]
    if first.dtype == np.float32:
        acc = first.copy()
        for a in inputs[1:]:
            acc += a
        return acc
    unsigned = np.uint32 if first.dtype == np.int32 else np.uint8
    acc = first.view(unsigned).copy()
    for a in inputs[1:]:
        acc += a.view(unsigned)
    return acc.view(first.dtype)


def compare_pieces(np, got, pieces):
    """None when got is the concatenation of pieces, else what differs (count, first index)."""
    n = pieces[0].size
    if got.size != n * len(pieces):
        return f"{got.size} elements, expected {n * len(pieces)}"
    bad, first = 0, None
    for i, exp in enumerate(pieces):
        part = got[i * n:(i + 1) * n]
        if np.array_equal(part, exp):
            continue
        diff = np.flatnonzero(part != exp)  # NaN (the poison) differs from everything
        bad += diff.size
        if first is None and diff.size:
            j = int(diff[0])
            first = f"first at {i * n + j} (got {part[j]!r}, expected {exp[j]!r})"
    return f"{bad} of {got.size} elements differ, {first}" if bad else None


def multi_collectives(world):
    """(name, fn, what the result must be): "sum", "gather" (all inputs in rank order) or a
    source rank (its input)."""
    return [
        ("all_reduce", coll_all_reduce, "sum"),
        ("all_gather", coll_all_gather, "gather"),
        ("all_gather_into_tensor", coll_all_gather_into_tensor, "gather"),
        ("broadcast from rank 0", coll_broadcast_from(0), 0),
        (f"broadcast from rank {world - 1}", coll_broadcast_from(world - 1), world - 1),
    ]


def check_collectives_multi(torch, dist, checks, dtype, seed, rank, world):
    """N ranks. One check line per (collective, dtype): every size, REPS times, new inputs for
    each (size, repetition) shared by the collectives, each collective on a fresh copy."""
    import numpy as np
    dname = str(dtype).replace("torch.", "")
    specs = multi_collectives(world)
    failures = {name: [] for name, _, _ in specs}
    device = torch.device("cuda", rank)
    for nbytes in SIZES:
        for rep in range(REPS):
            try:
                inputs = [rank_input(np, seed, dname, nbytes, rep, r) for r in range(world)]
                own = torch.from_numpy(inputs[rank]).to(device)
            except Exception as e:
                for name in failures:
                    failures[name].append(f"{size_str(nbytes)} rep {rep}: inputs: {type(e).__name__}: {e}")
                continue
            total = None
            for name, fn, want in specs:
                x = result = got = None
                try:
                    x = own.clone()
                    result = fn(torch, dist, x)
                    torch.cuda.synchronize()
                    got = result.cpu().numpy()
                    if want == "sum":
                        if total is None:
                            total = expected_sum(np, inputs)
                        pieces = [total]
                    elif want == "gather":
                        pieces = inputs
                    else:
                        pieces = [inputs[want]]
                    why = compare_pieces(np, got, pieces)
                    if why:
                        failures[name].append(f"{size_str(nbytes)} rep {rep}: {why}")
                except Exception as e:
                    failures[name].append(f"{size_str(nbytes)} rep {rep}: {type(e).__name__}: {e}")
                finally:
                    x = result = got = None
            inputs = own = total = None
    for name, _, _ in specs:
        what = (f"{name} {dname}: {size_str(SIZES[0])} .. {size_str(SIZES[-1])}, "
                f"{len(SIZES)} sizes x {REPS}, rank {rank} of {world}")
        checks.expect(not failures[name], what, failures_text(failures[name]))


def loaded_libgdrapi():
    """The libgdrapi files mapped into this process (NCCL dlopens it at communicator init)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split(None, 5)[5].strip() for ln in f
                     if "libgdrapi" in ln and len(ln.split(None, 5)) == 6}
        return sorted(paths)
    except OSError:
        return []


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


def child_main(args):
    rank, world = args.rank, args.world
    checks = Checks()
    result = {"latency": None, "versions": "", "rank": rank, "world": world, "libgdrapi": []}
    own_store = None
    store = args.store
    if not store:
        own_store = tempfile.mkdtemp(prefix="nccl_gdrcopy_store.")
        store = os.path.join(own_store, "store")
    try:
        import torch
        import torch.distributed as dist
        nccl = torch.cuda.nccl.version()  # a tuple (2, 28, 9) in recent torch, an int before
        nccl = ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
        result["versions"] = f"torch {torch.__version__}, torch's NCCL {nccl}"
        print(f"info {result['versions']}", flush=True)

        torch.cuda.set_device(rank)
        kwargs = {}
        if world == 1:
            torch.manual_seed(int.from_bytes(os.urandom(8), "little"))  # fresh data every run
        else:
            print(f"info rank {rank} of {world} on cuda:{rank} "
                  f"({torch.cuda.get_device_name(rank)}), seed {args.seed}", flush=True)
            kwargs["timeout"] = datetime.timedelta(seconds=COLL_TIMEOUT_S)
        # A file store: nothing to connect to, no port to pick, and with N ranks one file that
        # the parent named for all of them.
        dist.init_process_group("nccl", init_method="file://" + store,
                                rank=rank, world_size=world, **kwargs)
        for dtype in (torch.float32, torch.int32, torch.uint8):
            if world == 1:
                for name, fn in COLLECTIVES:
                    check_collective(torch, dist, checks, name, fn, dtype)
            else:
                check_collectives_multi(torch, dist, checks, dtype, args.seed, rank, world)
        result["libgdrapi"] = loaded_libgdrapi()
        print(f"info libgdrapi mapped: {', '.join(result['libgdrapi']) or 'none'}", flush=True)
        result["latency"] = measure_latency(torch, dist)
        lat = result["latency"]
        print(f"time all_reduce 8 B: median {lat['median_us']:.2f} us (p10 {lat['p10_us']:.2f}, "
              f"p90 {lat['p90_us']:.2f}, {LATENCY_RUNS} runs)", flush=True)
        dist.destroy_process_group()
        checks.record(True, "destroy_process_group")
    except Exception as e:
        checks.record(False, f"child: unexpected {type(e).__name__}: {e}")
    finally:
        if own_store:
            shutil.rmtree(own_store, ignore_errors=True)
    result.update(passed=checks.passed, failed=checks.failed, lines=checks.lines)
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 1 if checks.failed else 0


# ---- parent: run the children, keep their logs, check what NCCL and the library wrote ----

def variant_tag(with_gdr, net):
    return ("gdr" if with_gdr else "nogdr") + ("-net" if net else "")


def rank_label(tag, r, ranks):
    """The prefix of check lines: `gdr` with one rank (as before), `gdr rank0` with N."""
    return tag if ranks == 1 else f"{tag} rank{r}"


def run_children(with_gdr, args, out_dir, store_dir):
    """Runs the N ranks of one variant at once, each with its own log file. Returns one
    (rc or None when killed, log text, result dict or None, why killed) per rank."""
    tag = variant_tag(with_gdr, args.net)
    ranks = args.ranks
    env = dict(os.environ)
    env.update(COMMON_ENV)
    for key in list(GDR_ENV) + list(TRANSPORT_OFF):
        env.pop(key, None)
    if with_gdr:
        env.update(GDR_ENV)
    if args.net:
        env.update(NET_ENV)
    store = os.path.join(store_dir, f"store-{tag}")
    if os.path.exists(store):
        os.remove(store)

    procs = []
    for r in range(ranks):
        suffix = "" if ranks == 1 else f"-rank{r}"
        result_path = os.path.join(out_dir, f"nccl-{tag}{suffix}-result.json")
        log_path = os.path.join(out_dir, f"nccl-{tag}{suffix}.log")
        if os.path.exists(result_path):
            os.remove(result_path)  # a stale one must not pass for this run's
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--result", result_path,
               "--rank", str(r), "--world", str(ranks), "--store", store, "--seed", str(args.seed)]
        # stderr into stdout: NCCL logs to stdout, the library to stderr; one log per rank, in
        # order, written straight to its file (no pipe to drain while the others run).
        log_file = open(log_path, "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        procs.append({"proc": proc, "log_file": log_file, "log_path": log_path,
                      "result_path": result_path, "killed": None})

    timeout = CHILD_TIMEOUT_S if ranks == 1 else MULTI_TIMEOUT_S
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p["proc"].poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p["proc"].poll() not in (None, 0) for p in procs):
            failed_at = now
        why = None
        if now > deadline:
            why = f"timed out after {timeout} s"
        elif failed_at is not None and now - failed_at > PEER_GRACE_S:
            why = f"killed {PEER_GRACE_S} s after another rank failed"
        if why:
            for p in procs:
                if p["proc"].poll() is None:
                    p["proc"].kill()
                    p["killed"] = why
            for p in procs:
                p["proc"].wait()
            break
        time.sleep(0.2)

    out = []
    for p in procs:
        p["log_file"].close()
        with open(p["log_path"], errors="replace") as f:
            log = f.read()
        print(f"info {tag}: log in {p['log_path']}", flush=True)
        result = None
        if os.path.exists(p["result_path"]):
            with open(p["result_path"]) as f:
                result = json.load(f)
        rc = None if p["killed"] else p["proc"].returncode
        out.append((rc, log, result, p["killed"]))
    if os.path.exists(store):  # torch removes it when the last rank closes it, unless one died
        os.remove(store)
    return out


def grep(lines, pattern):
    return [ln for ln in lines if re.search(pattern, ln)]


def show(lines, limit=20):
    for ln in lines[:limit]:
        print(f"    | {ln}")
    if len(lines) > limit:
        print(f"    | ... {len(lines) - limit} more")


def check_child_ran(checks, tag, rc, log, result, killed=None):
    """The child finished in time, cleanly, and its own checks count into ours."""
    if rc is None:
        checks.record(False, f"{tag}: child {killed or f'timed out after {CHILD_TIMEOUT_S} s'}; last lines:")
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


def check_gdr_log(checks, log, tag="gdr", net=False):
    lines = log.splitlines()

    # (c) which NCCL wrote this log.
    version = grep(lines, r"NCCL version")
    print(f"info {tag}: {version[0].strip() if version else 'no NCCL version line (NCCL_DEBUG=INFO not honoured?)'}")

    # (a) NCCL took the library: gdrwrap logs "GDRCOPY enabled library X.Y driver X.Y" at INIT.
    enabled = grep(lines, r"GDRCOPY enabled library")
    warnings = grep(lines, r"NCCL WARN.*(?i:gdr|dlsym|dlopen|libgdrapi)")
    if checks.expect(enabled, f"{tag}: NCCL logged 'GDRCOPY enabled library'"):
        show(enabled)
    else:
        # The lines that say why: NCCL's warnings about the library and anything gdrcopy-ish.
        show(list(dict.fromkeys(warnings + grep(lines, r"(?i)gdrcopy|dlsym|libgdrapi"))), 30)
    if not checks.expect(not warnings, f"{tag}: no NCCL warnings about gdrcopy"):
        show(warnings)

    # (b) the library was opened and NCCL's work FIFO pinned and mapped through it.
    opened = grep(lines, r"gdrapi INFO: gdr_open:")
    pinned = grep(lines, r"gdrapi INFO: gdr_pin_buffer: .*pinned")
    mapped = grep(lines, r"gdrapi INFO: gdr_map: handle \S+ mapped")
    if checks.expect(opened, f"{tag}: the library logged gdr_open:"):
        show(opened)
    if checks.expect(pinned, f"{tag}: the library logged gdr_pin_buffer: ... pinned ({len(pinned)} lines)"):
        show(pinned, 5)
    if checks.expect(mapped, f"{tag}: the library logged gdr_map: ... mapped ({len(mapped)} lines)"):
        show(mapped, 5)
    if net:
        # NCCL's net transport keeps each connection's head/tail word in GPU memory written by
        # its proxy thread through gdrcopy (NCCL_GDRCOPY_SYNC_ENABLE, default 1) whenever the
        # proxy runs in the rank's process: pins beyond the one work FIFO.
        checks.expect(len(pinned) >= 2 and len(mapped) >= 2,
                      f"{tag}: the net proxy's sync words pinned and mapped too (more than the FIFO)",
                      f"{len(pinned)} pinned, {len(mapped)} mapped")
    errors = grep(lines, r"gdrapi (ERR|WARN):")
    if not checks.expect(not errors, f"{tag}: no gdrapi ERR/WARN lines"):
        show(errors)


def check_nogdr_log(checks, log, tag="nogdr"):
    lines = log.splitlines()
    version = grep(lines, r"NCCL version")
    print(f"info {tag}: {version[0].strip() if version else 'no NCCL version line'}")
    enabled = grep(lines, r"GDRCOPY enabled")
    if not checks.expect(not enabled, f"{tag}: NCCL did not log 'GDRCOPY enabled'"):
        show(enabled)
    # Informational: without NCCL_GDRCOPY_ENABLE, NCCL does not even dlopen the library.
    print(f"info {tag}: {len(grep(lines, r'gdrapi (INFO|DBG|WARN|ERR):'))} gdrapi log lines")


def connection_kinds(lines):
    """How NCCL connected the channels, from its "Channel .. via X" INIT lines: {X: count}."""
    kinds = collections.Counter()
    for ln in lines:
        m = re.search(r"Channel .* via (\S+)", ln)
        if m:
            kinds[m.group(1)] += 1
    return kinds


def check_transport_log(checks, log, tag, net):
    lines = log.splitlines()
    kinds = connection_kinds(lines)
    summary = ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "no 'Channel .. via' lines"
    print(f"info {tag}: connections: {summary}")
    for ln in grep(lines, r"Using network|NET/Socket : Using")[:3]:
        print(f"info {tag}: {ln.strip()}")
    if not net:
        return
    # NCCL's net transport logs "Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0" (and
    # [receive]); matched loosely, case aside.
    via_net = grep(lines, r"(?i)via NET/Socket")
    if checks.expect(via_net, f"{tag}: NCCL connected the ranks through NET/Socket ({len(via_net)} lines)"):
        show(via_net, 4)
    else:
        show(grep(lines, r"(?i) via |Using network|NET/"), 20)
    other = grep(lines, r"via (P2P|SHM)")
    if not checks.expect(not other, f"{tag}: no P2P or SHM connections"):
        show(other, 5)


def run_variant(checks, with_gdr, args, out_dir, store_dir):
    tag = variant_tag(with_gdr, args.net)
    print(f"== {tag}" + (f" ({args.ranks} ranks)" if args.ranks > 1 else " =="), flush=True)
    runs = run_children(with_gdr, args, out_dir, store_dir)
    versions = ""
    for r, (rc, log, result, killed) in enumerate(runs):
        label = rank_label(tag, r, args.ranks)
        if result and result.get("versions"):
            versions = result["versions"]
            print(f"info {label}: {versions}")
        if result:
            print(f"info {label}: libgdrapi mapped: {', '.join(result.get('libgdrapi') or []) or 'none'}")
        check_child_ran(checks, label, rc, log, result, killed)
        if with_gdr:
            check_gdr_log(checks, log, label, args.net)
        else:
            check_nogdr_log(checks, log, label)
        if args.ranks > 1:
            check_transport_log(checks, log, label, args.net)
    if args.ranks > 1:
        # The merge: every rank finished cleanly with all of its checks passed, and (with gdr)
        # NCCL took the library in every one of them.
        clean = [r for r, (rc, _, res, _) in enumerate(runs)
                 if rc == 0 and res is not None and res.get("failed") == 0]
        checks.expect(len(clean) == args.ranks, f"{tag}: all {args.ranks} ranks passed",
                      f"only ranks {clean}")
        if with_gdr:
            took = [r for r, (_, log, _, _) in enumerate(runs) if re.search(r"GDRCOPY enabled library", log)]
            checks.expect(len(took) == args.ranks,
                          f"{tag}: 'GDRCOPY enabled library' in all {args.ranks} ranks' logs",
                          f"only in ranks {took}")
    lats = [res["latency"] if res else None for _, _, res, _ in runs]
    return {"rank0": lats[0], "per_rank": lats, "versions": versions}


def print_comparison(with_lat, without_lat, ranks=1, net=False):
    if ranks == 1:
        print(f"8 B all_reduce latency, 1 rank, median of {LATENCY_RUNS} (us):")
    else:
        print(f"8 B all_reduce latency, {ranks} ranks, {'net (sockets)' if net else 'default'} "
              f"transport, {LATENCY_RUNS} runs, rank 0 (us; max: slowest rank's median):")
    print(f"  {'':16} {'median':>9} {'p10':>9} {'p90':>9}" + (f" {'max':>9}" if ranks > 1 else ""))
    for label, lat in (("with gdrcopy", with_lat), ("without gdrcopy", without_lat)):
        r0 = lat["rank0"] if lat else None
        if r0:
            row = f"  {label:16} {r0['median_us']:9.2f} {r0['p10_us']:9.2f} {r0['p90_us']:9.2f}"
            if ranks > 1:
                medians = [x["median_us"] for x in lat["per_rank"] if x]
                row += f" {max(medians):9.2f}" if len(medians) == ranks else f" {'n/a':>9}"
            print(row)
        else:
            print(f"  {label:16} {'n/a':>9}")
    if with_lat and without_lat and with_lat["rank0"] and without_lat["rank0"]:
        ratio = with_lat["rank0"]["median_us"] / without_lat["rank0"]["median_us"]
        print(f"  with / without   {ratio:9.2f}x")


def parent_main(args):
    available, why = gpu_available()
    if not available:
        return skip(why)
    if args.ranks > 1:
        import torch
        found = torch.cuda.device_count()
        if found < args.ranks:
            print(f"{NAME}: skipped: needs {args.ranks} GPUs, found {found}", flush=True)
            return 1 if require_gpu() else 0
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(8), "little")
    out_dir = args.out or tempfile.mkdtemp(prefix="nccl_gdrcopy.")
    os.makedirs(out_dir, exist_ok=True)
    store_dir = tempfile.mkdtemp(prefix="nccl_gdrcopy_store.")
    if args.ranks > 1:
        print(f"info {args.ranks} ranks, {'net (sockets over lo)' if args.net else 'default'} "
              f"transport, seed {args.seed} (--seed {args.seed} repeats these inputs)", flush=True)

    checks = Checks()
    latency = {}
    try:
        if not args.without_gdr:
            latency["gdr"] = run_variant(checks, True, args, out_dir, store_dir)
        if not args.with_gdr:
            latency["nogdr"] = run_variant(checks, False, args, out_dir, store_dir)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    if len(latency) == 2:
        print_comparison(latency["gdr"], latency["nogdr"], args.ranks, args.net)
    summary = {
        "ranks": args.ranks,
        "transport": "net" if args.net else "default",
        "seed": args.seed if args.ranks > 1 else None,
        "latency_runs": LATENCY_RUNS,
        "latency": latency,
        "passed": checks.passed,
        "failed": checks.failed,
    }
    with open(os.path.join(out_dir, "nccl-summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"info logs in {out_dir}")
    print(f"{NAME}: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--with-gdr", action="store_true", help="only the NCCL_GDRCOPY_ENABLE=1 run")
    which.add_argument("--without-gdr", action="store_true", help="only the run without it")
    ap.add_argument("--ranks", type=int, default=1, metavar="N",
                    help="processes, one GPU each: rank r on cuda:r (default 1)")
    ap.add_argument("--net", action="store_true",
                    help="N >= 2: NCCL's socket network transport over lo instead of P2P/SHM")
    ap.add_argument("--seed", type=int, metavar="S",
                    help="seed of the multi-rank inputs (default: fresh, printed)")
    ap.add_argument("--out", metavar="DIR", help="where to write the logs and nccl-summary.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args)
    if args.ranks < 1:
        ap.error("--ranks must be at least 1")
    if args.net and args.ranks < 2:
        ap.error("--net needs --ranks 2 or more (one rank has no peer to connect to)")
    if args.seed is not None and args.seed < 0:
        ap.error("--seed must be non-negative")
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
