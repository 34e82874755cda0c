#!/usr/bin/env python3
"""PyTorch tensors pinned through libgdrapi in a loop, for scripts/soak.sh: run it under
`gdr run`, so that PyTorch's cudaMalloc segments are gdr's allocator's memory.

Usage: torch_pin_loop.py [--seconds S] [--max-size BYTES] [--seed N] [--report FILE]

Each round: a uint8 tensor of a random size (1 B .. --max-size, log-uniform), a slice of it at a
random offset and length, then torch_gdrapi.py's checks of that slice (pin of the 64 KiB pages
around it, gdr_get_info_v2, gdr_map, random bytes through the mapping read back with
tensor.cpu() with the bytes around the slice unchanged, bytes torch wrote read through the
mapping into a poisoned buffer, unmap, unpin). Checks are counted and only failures printed.
Ends with `torch_pin_loop: pid P: N checks, F failures, R rounds`; --report writes the same as
JSON. Exit status 1 on any failure, or when torch, a GPU or libgdrapi is missing.
"""

import argparse
import ctypes
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gdrapi  # noqa: E402  (the ctypes declarations and the checks of one tensor)


class CountingChecks(torch_gdrapi.Checks):
    """torch_gdrapi's checks, with passes counted silently (a soak makes millions) and only the
    first MAX_MESSAGES failures printed."""

    MAX_MESSAGES = 20

    def ok(self, what):
        self.passed += 1

    def fail(self, what):
        if self.failed < self.MAX_MESSAGES:
            print(f"FAIL {what}", flush=True)
        elif self.failed == self.MAX_MESSAGES:
            print("FAIL ... further failures are counted, not shown", flush=True)
        self.failed += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-size", type=int, default=4 << 20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--report")
    a = ap.parse_args()
    if not (a.seconds > 0 and 1 <= a.max_size <= 1 << 30):
        ap.error("--seconds must be > 0 and --max-size 1 B .. 1 GiB")
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    pid = os.getpid()

    usable, why = torch_gdrapi.gpu_available()
    if not usable:
        print(f"torch_pin_loop: pid {pid}: FAIL no GPU: {why}", flush=True)
        return 1
    import torch

    # Per-round detail lines of torch_gdrapi (allocation ranges, info fields) are not wanted here.
    torch_gdrapi.info = lambda text: None
    lib = torch_gdrapi.load_gdrapi()
    g = lib.gdr_open()
    if not g:
        print(f"torch_pin_loop: pid {pid}: FAIL gdr_open returned NULL", flush=True)
        return 1
    checks = CountingChecks()
    rounds = 0
    bits = int(math.log2(a.max_size))
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        n = min(a.max_size, rng.randint(1, 1 << rng.randint(0, bits)))
        big = torch.empty(n, dtype=torch.uint8, device="cuda")
        off = rng.randrange(n)
        length = rng.randint(1, n - off)
        case = {"name": f"round {rounds}: [{off}:{off + length}] of {n}",
                "tensor": big[off:off + length], "parent": big, "offset": off}
        torch_gdrapi.check_case(lib, g, checks, torch, case)
        del case, big
        rounds += 1
    rc = lib.gdr_close(g)
    checks.expect(rc == 0, "gdr_close", f"rc {rc}")
    print(f"torch_pin_loop: pid {pid}: {checks.passed + checks.failed} checks, {checks.failed} "
          f"failures, {rounds} rounds, seed {seed}", flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"pid": pid, "mode": "torch", "checks": checks.passed + checks.failed,
                       "failures": checks.failed, "rounds": rounds, "seed": seed,
                       "seconds": a.seconds}, f)
            f.write("\n")
    return 1 if checks.failed or not checks.passed else 0


if __name__ == "__main__":
    sys.exit(main())
