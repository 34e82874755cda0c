#!/usr/bin/env python3
"""Tables and verdicts of ranks-gpu.sh and soak.sh, from the files they leave in a run folder:

  status.tsv    one line a process: PID, exit status, name (written by the script)
  *.json        one report a process (rank_check --report, torch_pin_loop.py --report):
                pid, checks, failures, first_malloc_us (rank_check)
  samples.tsv   rank-lib.sh's sampler: `T gpu BAR1_MIB FB_MIB` and `T PID RSS_KIB FDS GPU_MIB`

Usage:
  rank_report.py ranks OUT N...   the table of ranks-gpu.sh (folders OUT/nN); exit status: how
                                  many N failed (a process did not exit 0 or a report is missing)
  rank_report.py soak DIR WARMUP_S WINDOW_S
                                  soak.sh's verdict: every process exited 0 with 0 failures, and
                                  every sampled series is flat (below); writes DIR/soak.md and
                                  DIR/soak.json; exit status 1 when it fails
Flat: the largest value of a series in its last WINDOW_S seconds is at most the largest in the
WINDOW_S seconds after WARMUP_S plus the larger of a share of that (GROWTH: 10% for a process's
figures, 5% for the GPU-wide ones, which add up every process) and a fixed slack (SLACK).
Decreases always pass.
"""

import json
import os
import statistics
import sys

# What a series may grow by after the warm-up, in its unit: the larger of SLACK and GROWTH times
# its value after the warm-up.
SLACK = {"rss_kib": 16 * 1024, "fds": 4, "gpu_mib": 64, "bar1_mib": 64, "fb_mib": 64}
GROWTH = {"rss_kib": 0.10, "fds": 0.10, "gpu_mib": 0.10, "bar1_mib": 0.05, "fb_mib": 0.05}


def read_status(folder):
    """{pid: (status, name)} from status.tsv."""
    out = {}
    try:
        with open(os.path.join(folder, "status.tsv")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    out[int(parts[0])] = (int(parts[1]), parts[2])
    except OSError:
        pass
    return out


def read_reports(folder):
    """{pid: report} from the folder's JSON reports."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json") or name == "soak.json":
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(r, dict) and "pid" in r:
            out[int(r["pid"])] = r
    return out


def read_samples(folder):
    """(gpu, procs): gpu = [(t, bar1, fb)], procs = {pid: [(t, rss_kib, fds, gpu_mib)]};
    a figure that was not available is None."""
    def num(x):
        try:
            return float(x)
        except ValueError:
            return None

    gpu, procs = [], {}
    try:
        with open(os.path.join(folder, "samples.tsv")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) == 4 and p[1] == "gpu":
                    gpu.append((float(p[0]), num(p[2]), num(p[3])))
                elif len(p) == 5 and p[1].isdigit():
                    procs.setdefault(int(p[1]), []).append(
                        (float(p[0]), num(p[2]), num(p[3]), num(p[4])))
    except OSError:
        pass
    return gpu, procs


def problems_of(status, reports):
    """Why the processes of a run do not pass: [] when each exited 0 and reported 0 failures."""
    why = []
    for pid, (rc, name) in sorted(status.items()):
        r = reports.get(pid)
        if rc != 0:
            sig = f" (signal {rc - 128})" if rc > 128 else ""
            why.append(f"{name} (pid {pid}) exited {rc}{sig}")
        elif r is None:
            why.append(f"{name} (pid {pid}) wrote no report")
        elif r.get("failures", 1) != 0 or r.get("checks", 0) <= 0:
            why.append(f"{name} (pid {pid}): {r.get('checks')} checks, {r.get('failures')} failures")
    if not status:
        why.append("no process ran")
    return why


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def ranks(out, counts):
    rows, verdicts, failed = [], [], 0
    for n in counts:
        folder = os.path.join(out, f"n{n}")
        status, reports = read_status(folder), read_reports(folder)
        gpu, procs = read_samples(folder)
        why = problems_of(status, reports)
        if len(status) != n:
            why.insert(0, f"{len(status)} processes ran, want {n}")
        checks = sum(r.get("checks", 0) for r in reports.values())
        failures = sum(r.get("failures", 0) for r in reports.values())
        first = [r["first_malloc_us"] / 1e3 for r in reports.values() if "first_malloc_us" in r]
        # A process's device memory: the most nvidia-smi showed for it.
        mem = [max(s[3] for s in v if s[3] is not None) for v in procs.values()
               if any(s[3] is not None for s in v)]
        bar1 = [s[1] for s in gpu if s[1] is not None]
        base = bar1[0] if bar1 else None  # sampled before the processes started
        peak = max(bar1) if bar1 else None
        per_proc = (peak - base) / n if bar1 else None
        rows.append(
            f"| {n} | {sum(1 for s in status.values() if s[0] == 0)}/{n} | {checks} | {failures} "
            f"| {fmt(statistics.median(first) if first else None, 1)} / "
            f"{fmt(max(first) if first else None, 1)} "
            f"| {fmt(statistics.median(mem) if mem else None)} / {fmt(max(mem) if mem else None)} "
            f"| {fmt(base)} / {fmt(peak)} ({fmt(per_proc, 1)} per process) |")
        if why:
            failed += 1
            verdicts.append(f"FAILED {n} ranks: " + "; ".join(why[:8]))
        else:
            verdicts.append(f"ok {n} ranks: {checks} checks, 0 failures")
    print("| ranks | exited 0 | checks | failures | first cudaMalloc median / max (ms) "
          "| device memory per process median / max (MiB) | BAR1 used before / peak (MiB) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nDevice memory per process: the most `nvidia-smi --query-compute-apps` showed for it "
          "(`-` where it lists none of the processes' pids). BAR1: `nvidia-smi -q -d MEMORY`, "
          "GPU-wide; per process = (peak - before) / ranks.\n")
    print("\n".join(verdicts))
    return failed


def flat(series, warmup, window, growth, slack):
    """(ok, ref, last, why) for [(t, value)]: see the module's docstring."""
    vals = [(t, v) for t, v in series if v is not None]
    if not vals:
        return None, None, None, "no samples"
    t_end = vals[-1][0]
    ref = [v for t, v in vals if warmup <= t < warmup + window]
    last = [v for t, v in vals if t >= t_end - window and t >= warmup]
    if not ref or not last:
        return False, None, None, f"no samples in a window (last sample at {t_end:.0f} s)"
    r, m = max(ref), max(last)
    limit = r + max(r * growth, slack)
    ok = m <= limit
    return ok, r, m, "" if ok else f"grew from {r:.0f} to {m:.0f} (limit {limit:.0f})"


def soak(folder, warmup, window):
    status, reports = read_status(folder), read_reports(folder)
    gpu, procs = read_samples(folder)
    why = problems_of(status, reports)
    series = []  # (what, key, [(t, v)])
    series.append(("GPU BAR1 used (MiB)", "bar1_mib", [(t, b) for t, b, _ in gpu]))
    series.append(("GPU memory used (MiB)", "fb_mib", [(t, f) for t, _, f in gpu]))
    for pid in sorted(procs):
        name = status.get(pid, (0, "pid"))[1]
        s = procs[pid]
        series.append((f"{name} {pid} RSS (KiB)", "rss_kib", [(x[0], x[1]) for x in s]))
        series.append((f"{name} {pid} open fds", "fds", [(x[0], x[2]) for x in s]))
        series.append((f"{name} {pid} device memory (MiB)", "gpu_mib", [(x[0], x[3]) for x in s]))
    rows, result = [], []
    for what, key, s in series:
        ok, ref, last, note = flat(s, warmup, window, GROWTH[key], SLACK[key])
        if ok is None and key == "gpu_mib":
            note = "not listed by nvidia-smi (PID namespace?): GPU-wide figure above"
        elif ok is None:
            ok = False
        if ok is False:
            why.append(f"{what}: {note}")
        verdict = "-" if ok is None else "ok" if ok else "FAIL"
        rows.append(f"| {what} | {fmt(ref)} | {fmt(last)} | {verdict} {note} |")
        result.append({"series": what, "kind": key, "ref": ref, "last": last, "ok": ok,
                       "note": note, "samples": s})
    checks = sum(r.get("checks", 0) for r in reports.values())
    failures = sum(r.get("failures", 0) for r in reports.values())
    lines = [
        f"Processes: {len(status)} ({sum(1 for s in status.values() if s[0] == 0)} exited 0); "
        f"{checks} checks, {failures} data errors.",
        "",
        f"Flat: the largest value in the last {window:.0f} s against the largest in the "
        f"{window:.0f} s after a {warmup:.0f} s warm-up, plus a share of that or a slack, "
        f"whichever is larger: "
        f"{', '.join(f'{k} {GROWTH[k]:.0%} or {v}' for k, v in SLACK.items())}.",
        "",
        "| series | after warm-up (max) | last window (max) | verdict |",
        "|---|---|---|---|",
    ] + rows
    text = "\n".join(lines) + "\n"
    with open(os.path.join(folder, "soak.md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, "soak.json"), "w") as f:
        json.dump({"passed": not why, "problems": why, "checks": checks, "failures": failures,
                   "warmup_s": warmup, "window_s": window, "slack": SLACK, "growth": GROWTH,
                   "processes": {str(p): {"status": s[0], "name": s[1]}
                                 for p, s in status.items()},
                   "series": result}, f, indent=1)
    print(text)
    for w in why:
        print(f"FAILED {w}")
    return 1 if why else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "ranks":
        return min(ranks(argv[2], [int(n) for n in argv[3:]]), 100)
    if len(argv) == 5 and argv[1] == "soak":
        return soak(argv[2], float(argv[3]), float(argv[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
