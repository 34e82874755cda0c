#!/usr/bin/env python3
"""Turns the JSON that bundle/run.sh writes (copylat.json, copybw.json, pplat.json, mq.json) into
the markdown tables of docs/perf.md. Usage: scripts/perf_tables.py OUTDIR > tables.md"""

import json
import os
import sys


def size(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def copylat(rows):
    print("| direction | size | mapping median us | mapping min us | cuMemcpy median us | speed-up | auto median us | auto path | auto / best path |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(f"| {r['direction']} | {size(r['size'])} | {r['mapping_median_us']:.3f} | {r['mapping_min_us']:.3f} "
              f"| {r['cumemcpy_median_us']:.3f} | {r['speedup']:.1f}x | {r['auto_median_us']:.3f} | {r['auto_path']} "
              f"| {100 * r['auto_vs_best']:.0f}% ({r['best_path']}) |")
    worst = min(rows, key=lambda r: r["auto_vs_best"])
    print(f"\nLowest auto / best: {100 * worst['auto_vs_best']:.0f}% ({worst['direction']}, {size(worst['size'])}).")


def copybw(rows):
    threads = [t for t, _ in rows[0]["mapping_gbps"]]
    print("| direction | size | " + " | ".join(f"mapping x{t} GB/s" for t in threads) + " | copy engine GB/s | auto GB/s | auto path | auto / best |")
    print("|---|---:|" + "---:|" * len(threads) + "---:|---:|---|---:|")
    for r in rows:
        m = " | ".join(f"{g:.2f}" for _, g in r["mapping_gbps"])
        print(f"| {r['direction']} | {size(r['size'])} | {m} | {r['copy_engine_gbps']:.2f} | {r['auto_gbps']:.2f} "
              f"| {r['auto_path']} | {100 * r['auto_vs_best']:.0f}% |")


def pplat(rep):
    print("| path | min us | median us | p99 us | p99.9 us |")
    print("|---|---:|---:|---:|---:|")
    for r in rep["rows"]:
        u = r["us"]
        print(f"| {r['path']} | {u['min']:.2f} | {u['median']:.2f} | {u['p99']:.2f} | {u['p999']:.2f} |")
    print(f"\nPersistent GPU thread (best placement) vs host-centric median: {rep['speedup_vs_host_centric']:.1f}x lower.")


def mq(rep):
    print("| path | size | p50 us | p99 us | p99.9 us |")
    print("|---|---:|---:|---:|---:|")
    for r in rep.get("latency", []):
        print(f"| {r['path']} | {r['size']} | {r['p50_us']:.2f} | {r['p99_us']:.2f} | {r['p999_us']:.2f} |")
    print()
    print("| placement | size | queues | batch | warps | messages/s (median) | lowest..highest run | GB/s | CPU time sending / receiving |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rep.get("throughput", []):
        spread = (f"{r['msgs_per_s_min'] / 1e6:.2f}..{r['msgs_per_s_max'] / 1e6:.2f} M"
                  if 'msgs_per_s_min' in r else "-")
        shares = (f"{100 * r['host_send_share']:.0f}% / {100 * r['host_recv_share']:.0f}%"
                  if 'host_send_share' in r else "-")
        print(f"| {r['placement']} | {r['size']} | {r['queues']} | {r['batch']} | {r.get('warps_per_queue', '-')} | {r['msgs_per_s'] / 1e6:.2f} M | {spread} | {r['gbytes_per_s']:.2f} | {shares} |")


def main():
    d = sys.argv[1]
    for name, fn, title in (("copylat.json", copylat, "copylat"), ("copybw.json", copybw, "copybw"),
                            ("pplat.json", pplat, "pplat"), ("mq.json", mq, "mq bench")):
        data = load(d, name)
        if data:
            print(f"### {title}\n")
            fn(data)
            print()


if __name__ == "__main__":
    main()
