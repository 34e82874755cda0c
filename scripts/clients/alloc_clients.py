#!/usr/bin/env python3
"""PyTorch and CuPy with their default allocators under gdr's allocator (`gdr run`).

Usage: alloc_clients.py [all|train|cupy] [--out DIR]

  all    (default) runs each check in child processes, with and without the allocator, and
         compares them:
         - train: a short training loop (deterministic algorithms on, fixed seed) gives
           bit-identical losses with and without the allocator; its median step time with the
           allocator is within 5% of the time without (the median over
           ALLOC_CLIENTS_TRAIN_ROUNDS runs of each, default 4, alternated with the order
           rotated, each after a second of matrix products that brings the GPU's clocks up;
           reported, and checked). A third side, the allocator preloaded but serving nothing,
           and the GPU's time per step (CUDA events) are reported beside it, to tell the cost of
           the interposed calls from that of the memory. Under the allocator a weight tensor
           (default allocator, cudaMalloc) is pinned and mapped through libgdrapi and reads
           back the tensor's bytes, and bytes written through the mapping are what torch then
           reads;
         - cupy: an array from CuPy's default memory pool is pinned, mapped, written through
           the mapping and read by CuPy, and the reverse; without the allocator the pin is
           refused (ENOTSUP on a host without gdrdrv).
  train, cupy   one child (what `all` runs); prints its checks and one JSON line `result {...}`.

The allocator is preloaded with `$GDR_BIN run --` when GDR_BIN names the gdr binary, else with
LD_PRELOAD=$GDR_ALLOC_LIB (default libgdr_alloc.so.0, from the loader's path). Prints one
`ok ...` / `FAIL ...` line per check and ends with `alloc_clients: N passed, M failed`; exit 1
on a failure. Without torch or a GPU: `alloc_clients: skipped: no GPU` (exit 1 under
GDR_REQUIRE_GPU=1).
"""

import ctypes
import errno
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gdrapi import GdrInfoV2, GdrMh, load_gdrapi  # noqa: E402

NAME = "alloc_clients"
CHILD_TIMEOUT_S = 300
STEPS = 60
WARMUP = 10
STEP_TIME_LIMIT = 1.05
# Seconds of matrix products before the training steps, to bring the GPU's clocks up.
GPU_WARMUP_S = 1.0
# Training runs on each side, alternated (ALLOC_CLIENTS_TRAIN_ROUNDS).
TRAIN_ROUNDS = max(1, int(os.environ.get("ALLOC_CLIENTS_TRAIN_ROUNDS", "4")))


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def expect(self, cond, what, why=""):
        print(f"{'ok' if cond else 'FAIL'} {what}{'' if cond or not why else ': ' + why}",
              flush=True)
        if cond:
            self.passed += 1
        else:
            self.failed += 1
        return cond


def pinned_mapping(lib, g, ptr, n):
    """Pins the 64 KiB pages around [ptr, ptr+n) (gdr_map maps only page-aligned pins, as
    gdrcopy) and maps them: (rc, handle, cpu address of ptr, info, map base)."""
    mh = GdrMh()
    lo = ptr & ~0xFFFF
    rc = lib.gdr_pin_buffer(g, lo, n + (ptr - lo), 0, 0, ctypes.byref(mh))
    if rc:
        return rc, None, None, None, None
    info = GdrInfoV2()
    lib.gdr_get_info_v2(g, mh, ctypes.byref(info))
    base = ctypes.c_void_p()
    rc = lib.gdr_map(g, mh, ctypes.byref(base), info.mapped_size)
    if rc:
        lib.gdr_unpin_buffer(g, mh)
        return rc, None, None, None, None
    return 0, mh, base.value + (ptr - info.va), info, base


def release(lib, g, mh, info, base):
    lib.gdr_unmap(g, mh, base, info.mapped_size)
    lib.gdr_unpin_buffer(g, mh)


def child_train(under_allocator):
    import numpy as np
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(1234)
    checks = Checks()
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(99)
    x_all = torch.randn(STEPS, 128, 3, 32, 32, generator=gen)
    y_all = torch.randint(0, 10, (STEPS, 128), generator=gen)
    # The GPU's clocks first: an idle GPU runs the first steps slowly, and 60 steps are over
    # before it has sped up, so without this each run measures mostly how idle the GPU was.
    a = torch.ones(4096, 4096, device=dev)
    t_end = time.perf_counter() + GPU_WARMUP_S
    while time.perf_counter() < t_end:
        for _ in range(8):
            a = a @ a * (1.0 / 4096)
        torch.cuda.synchronize()
    del a
    losses, step_ms, gpu_ms = [], [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(STEPS):
        x, y = x_all[i].to(dev), y_all[i].to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        end.record()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        # The GPU's time from the step's first queued work to its last: when it is close to
        # the wall time, the step waits on the GPU; when far below, on the CPU's launches.
        gpu_ms.append(start.elapsed_time(end))
        losses.append(loss.item())
    checks.expect(all(np.isfinite(losses)), f"{STEPS} training steps, finite losses "
                  f"({losses[0]:.4f} -> {losses[-1]:.4f})")
    result = {"losses": losses, "step_ms": step_ms[WARMUP:], "gpu_ms": gpu_ms[WARMUP:]}
    if under_allocator:
        # A weight of the trained model: default-allocator memory, pinned through libgdrapi.
        lib = load_gdrapi()
        g = lib.gdr_open()
        w = model[7].weight.data
        ptr, n = w.data_ptr(), w.numel() * w.element_size()
        rc, mh, cpu, info, base = pinned_mapping(lib, g, ptr, n)
        if checks.expect(rc == 0, f"a {n}-byte weight tensor pins and maps", f"rc {rc}"):
            torch.cuda.synchronize()
            host = np.empty(n, dtype=np.uint8)
            lib.gdr_copy_from_mapping(mh, host.ctypes.data, cpu, n)
            want = w.cpu().numpy().view(np.uint8).reshape(-1)
            checks.expect(np.array_equal(host, want), "the mapping reads the weights' bytes")
            fresh = np.random.default_rng().standard_normal(w.numel()).astype(np.float32)
            lib.gdr_copy_to_mapping(mh, cpu, fresh.ctypes.data, n)
            got = w.cpu().numpy().reshape(-1)
            checks.expect(np.array_equal(got, fresh), "torch reads what the CPU wrote through the mapping")
            release(lib, g, mh, info, base)
        lib.gdr_close(g)
    return checks, result


def child_cupy(under_allocator):
    import cupy
    import numpy as np
    checks = Checks()
    lib = load_gdrapi()
    g = lib.gdr_open()
    checks.expect(bool(g), "gdr_open")
    n = 3 * (1 << 20) + 5
    a = cupy.zeros(n, dtype=cupy.uint8)  # CuPy's default memory pool (cudaMalloc)
    ptr = a.data.ptr
    rc, mh, cpu, info, base = pinned_mapping(lib, g, ptr, n)
    result = {"pin_rc": rc}
    if not under_allocator:
        checks.expect(rc == errno.ENOTSUP, "without the allocator: the pin of CuPy memory is "
                      f"refused with ENOTSUP (rc {rc})")
        if rc == 0:
            release(lib, g, mh, info, base)
    elif checks.expect(rc == 0, f"a {n}-byte CuPy array pins and maps", f"rc {rc}"):
        data = np.frombuffer(os.urandom(n), dtype=np.uint8).copy()
        cupy.cuda.Device().synchronize()
        lib.gdr_copy_to_mapping(mh, cpu, data.ctypes.data, n)
        checks.expect(np.array_equal(cupy.asnumpy(a), data), "CPU -> GPU: CuPy reads what the CPU wrote")
        b = cupy.arange(n, dtype=cupy.uint32).astype(cupy.uint8) ^ cupy.uint8(0x5A)
        a[...] = b
        cupy.cuda.Device().synchronize()
        host = np.full(n + 64, 0xEE, dtype=np.uint8)
        lib.gdr_copy_from_mapping(mh, host.ctypes.data, cpu, n)
        checks.expect(np.array_equal(host[:n], cupy.asnumpy(b)) and (host[n:] == 0xEE).all(),
                      "GPU -> CPU: the mapping reads what CuPy wrote, and nothing past it is touched")
        release(lib, g, mh, info, base)
    lib.gdr_close(g)
    return checks, result


def run_child_mode(mode):
    under = bool(os.environ.get("LD_PRELOAD", "").count("gdr_alloc"))
    # The "preload" side of the step-time comparison: the library is in, but serves nothing.
    serving = under and os.environ.get("GDR_ALLOC_MIN_SIZE") != SERVE_NOTHING
    checks, result = (child_train if mode == "train" else child_cupy)(serving)
    result["under_allocator"] = serving
    print("result " + json.dumps(result), flush=True)
    print(f"{NAME}: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


# The sides of a run: the driver alone; the allocator serving (`gdr run`); and the allocator
# preloaded but serving nothing (every request below GDR_ALLOC_MIN_SIZE), which separates what
# its interposed calls cost from what its memory costs.
SIDES = ("driver", "alloc", "preload")
SERVE_NOTHING = str(1 << 62)


def command(mode, side):
    py = [sys.executable, os.path.abspath(__file__), mode]
    env = dict(os.environ, PYTHONUNBUFFERED="1", GDR_REQUIRE_GPU="1")
    env.pop("LD_PRELOAD", None)
    env.pop("GDR_ALLOC_MIN_SIZE", None)
    if side == "driver":
        return py, env
    if side == "preload":
        env["GDR_ALLOC_MIN_SIZE"] = SERVE_NOTHING
    gdr = os.environ.get("GDR_BIN")
    if gdr:
        return [gdr, "run", "--"] + py, env
    env["LD_PRELOAD"] = os.environ.get("GDR_ALLOC_LIB", "libgdr_alloc.so.0")
    return py, env


def run_child(mode, side, out_dir, tag=None):
    cmd, env = command(mode, side)
    tag = tag or f"{mode}-{side}"
    print(f"== {tag}: {' '.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=CHILD_TIMEOUT_S)
        out, rc = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace"), None
    if out_dir:
        with open(os.path.join(out_dir, f"{NAME}-{tag}.log"), "w") as f:
            f.write(out)
    passed = failed = 0
    result = None
    for line in out.splitlines():
        if line.startswith("result "):
            result = json.loads(line[len("result "):])
        elif line.startswith(f"{NAME}: "):
            parts = line.split()
            passed, failed = int(parts[1]), int(parts[3])
        else:
            print("  " + line)
    if rc != 0 and failed == 0:
        failed = 1
        print(f"FAIL {tag}: child exited with {rc}")
    return passed, failed, result


def run_all(out_dir):
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
    except Exception as e:
        print(f"info {e}")
        print(f"{NAME}: skipped: no GPU", flush=True)
        return 1 if os.environ.get("GDR_REQUIRE_GPU") == "1" else 0
    checks = Checks()
    total_p = total_f = 0
    results = {}
    # The training runs alternate, TRAIN_ROUNDS times, with the order of the sides rotated
    # each round: a step is a few milliseconds of kernel launches, so one run of each side
    # mostly measures what else the host was doing at the time, and a side that always ran
    # second would always run in the wake of the first's exit.
    train = {side: [] for side in SIDES}
    for rnd in range(TRAIN_ROUNDS):
        for k in range(len(SIDES)):
            side = SIDES[(rnd + k) % len(SIDES)]
            p, f, r = run_child("train", side, out_dir, f"train-{side}-{rnd + 1}")
            total_p, total_f = total_p + p, total_f + f
            if r is not None:
                train[side].append(r)
    for side in ("driver", "alloc"):
        p, f, r = run_child("cupy", side, out_dir)
        total_p, total_f = total_p + p, total_f + f
    if checks.expect(all(len(runs) == TRAIN_ROUNDS for runs in train.values()),
                     f"all {len(SIDES) * TRAIN_ROUNDS} training runs reported"):
        a = train["driver"][0]
        others = train["driver"][1:] + train["alloc"] + train["preload"]
        differ = [b for b in others if b["losses"] != a["losses"]]
        first = differ[0]["losses"] if differ else a["losses"]
        checks.expect(not differ, f"the {STEPS} losses are bit-identical in every run, with and "
                      "without the allocator",
                      f"{len(differ)} run(s) differ; the first at step "
                      f"{next((i for i, (x, y) in enumerate(zip(a['losses'], first)) if x != y), '?')}")
        med = {}
        for key in ("step_ms", "gpu_ms"):
            for side in SIDES:
                runs = [statistics.median(r[key]) for r in train[side]]
                med[side, key] = statistics.median(runs)
                print(f"time training {'step' if key == 'step_ms' else 'GPU time per step'} "
                      f"median over {TRAIN_ROUNDS} runs, {side}: {med[side, key]:.3f} ms "
                      f"({', '.join(f'{m:.3f}' for m in runs)}), "
                      f"{med[side, key] / med['driver', key]:.3f}x the driver's", flush=True)
        ma, mb = med["driver", "step_ms"], med["alloc", "step_ms"]
        checks.expect(mb <= ma * STEP_TIME_LIMIT, f"step time with the allocator within "
                      f"{(STEP_TIME_LIMIT - 1) * 100:.0f}% ({mb / ma:.3f}x)")
        if out_dir:
            with open(os.path.join(out_dir, f"{NAME}-train.json"), "w") as f:
                json.dump({"without": train["driver"], "with": train["alloc"],
                           "preload": train["preload"], "ratio": mb / ma}, f)
    total_p += checks.passed
    total_f += checks.failed
    print(f"{NAME}: {total_p} passed, {total_f} failed", flush=True)
    return 1 if total_f else 0


def main(argv):
    out_dir = None
    if "--out" in argv:
        out_dir = argv[argv.index("--out") + 1]
        os.makedirs(out_dir, exist_ok=True)
        argv = [x for i, x in enumerate(argv) if x != "--out" and (i == 0 or argv[i - 1] != "--out")]
    mode = argv[1] if len(argv) > 1 else "all"
    if mode == "all":
        return run_all(out_dir)
    if mode in ("train", "cupy"):
        return run_child_mode(mode)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
