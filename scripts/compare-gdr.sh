#!/usr/bin/env bash
# Compares two builds of the gdr CLI on one GPU host, in one run: copylat, pplat and mq bench,
# each run ROUNDS times (default 2) alternating A, B, A, B so that drift on the host hits both
# alike. Usage: compare-gdr.sh GDR_A GDR_B OUTDIR. JSON per run goes to OUTDIR; the table of
# medians (the median over rounds of each figure) and the B/A ratios is printed and written to
# OUTDIR/compare.txt. Used to check that a refactor costs no speed (docs/perf.md).
set -uo pipefail
a=${1:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
b=${2:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
out=${3:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
rounds=${ROUNDS:-2}
mkdir -p "$out"
run() { # label, binary, round
  local l=$1 g=$2 r=$3
  timeout 300 "$g" copylat --max-size 16M --json >"$out/copylat-$l-$r.json" 2>"$out/copylat-$l-$r.err" ||
    echo "copylat $l round $r failed: $(tail -1 "$out/copylat-$l-$r.err")"
  timeout 300 "$g" pplat --json >"$out/pplat-$l-$r.json" 2>"$out/pplat-$l-$r.err" ||
    echo "pplat $l round $r failed: $(tail -1 "$out/pplat-$l-$r.err")"
  timeout 300 "$g" mq bench --json >"$out/mq-$l-$r.json" 2>"$out/mq-$l-$r.err" ||
    echo "mq bench $l round $r failed: $(tail -1 "$out/mq-$l-$r.err")"
}
for r in $(seq 1 "$rounds"); do
  echo "round $r: A"; run A "$a" "$r"
  echo "round $r: B"; run B "$b" "$r"
done
python3 - "$out" "$rounds" <<'EOF' | tee "$out/compare.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(kind, label):
    runs = []
    for r in range(1, rounds + 1):
        try:
            with open(f"{out}/{kind}-{label}-{r}.json") as f:
                runs.append(json.load(f))
        except (OSError, ValueError):
            pass
    return runs
def figures(kind, runs):
    """name -> list of values over runs (lower is better unless the name says msg/s)."""
    acc = {}
    for doc in runs:
        if kind == "copylat":
            for row in doc:
                acc.setdefault(f"copylat {row['direction']} {row['size']} B mapping p50 us", []).append(row["mapping_median_us"])
                acc.setdefault(f"copylat {row['direction']} {row['size']} B auto p50 us", []).append(row["auto_median_us"])
        elif kind == "pplat":
            for row in doc["rows"]:
                acc.setdefault(f"pplat {row['path']} p50 us", []).append(row["us"]["median"])
        else:
            for row in doc["latency"]:
                acc.setdefault(f"mq {row['path']} {row['size']} B p50 us", []).append(row["p50_us"])
            for row in doc["throughput"]:
                acc.setdefault(f"mq {row['placement']} {row['size']} B x{row['queues']} msg/s", []).append(row["msgs_per_s"])
    return acc
print(f"{'figure':64} {'A':>12} {'B':>12} {'B/A':>7}")
worst = []
for kind in ("copylat", "pplat", "mq"):
    fa, fb = figures(kind, load(kind, "A")), figures(kind, load(kind, "B"))
    for name in fa:
        if name not in fb:
            print(f"{name:64} {'':>12} {'missing':>12}")
            continue
        va, vb = statistics.median(fa[name]), statistics.median(fb[name])
        ratio = vb / va if va else float("nan")
        print(f"{name:64} {va:12.3f} {vb:12.3f} {ratio:7.3f}")
        # Slower in B: a larger time, or a smaller rate.
        worst.append((ratio if "msg/s" not in name else (1 / ratio if ratio else float("inf")), name))
worst.sort(reverse=True)
print("\nmost slowed in B (B/A as a cost ratio, 1.0 = same):")
for r, n in worst[:8]:
    print(f"  {r:6.3f}  {n}")
EOF
