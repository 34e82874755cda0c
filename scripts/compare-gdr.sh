#!/usr/bin/env bash
# Compares two builds of the gdr CLI on one GPU host, in one run: copylat, copybw, pplat, mq
# bench and gdr serve at low load, each run ROUNDS times (default 2) alternating A, B, A, B so
# that drift on the host hits both alike. Usage: compare-gdr.sh GDR_A GDR_B OUTDIR. JSON per run
# goes to OUTDIR; the table of medians (the median over rounds of each figure) and the B/A
# ratios is printed and written to OUTDIR/compare.txt. Used to check that a refactor costs no
# speed (docs/perf.md). copylat and copybw carry their C API columns (libgdrapi's copies, built
# into each gdr), so the C library is compared too. COMPARE_PARTS (default "copylat copybw pplat
# mq serve") picks the benchmarks; serve runs serve-bench.sh (beside this script) with
# SERVE_ONLY=low and one round. COPYLAT_ARGS (default "--max-size 16M"), COPYBW_ARGS, PPLAT_ARGS
# and MQ_ARGS (default none) replace or add each benchmark's options, for shorter budgets.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=${1:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
b=${2:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
out=${3:?usage: compare-gdr.sh GDR_A GDR_B OUTDIR}
rounds=${ROUNDS:-2}
parts=" ${COMPARE_PARTS:-copylat copybw pplat mq serve} "
mkdir -p "$out"
one() { # kind, label, round, command...
  local k=$1 l=$2 r=$3; shift 3
  [[ "$parts" == *" $k "* ]] || return 0
  timeout 300 "$@" >"$out/$k-$l-$r.json" 2>"$out/$k-$l-$r.err" ||
    echo "$k $l round $r failed: $(tail -1 "$out/$k-$l-$r.err")"
}
run() { # label, binary, round
  local l=$1 g=$2 r=$3
  # shellcheck disable=SC2086 # the *_ARGS are option lists
  {
    one copylat "$l" "$r" "$g" copylat ${COPYLAT_ARGS:---max-size 16M} --json
    one copybw "$l" "$r" "$g" copybw ${COPYBW_ARGS:-} --json
    one pplat "$l" "$r" "$g" pplat ${PPLAT_ARGS:-} --json
    one mq "$l" "$r" "$g" mq bench ${MQ_ARGS:-} --json
  }
  if [[ "$parts" == *" serve "* ]]; then
    SERVE_ONLY=low SERVE_ROUNDS=1 timeout 300 bash "$here/serve-bench.sh" "$out/serve-$l-$r" "$g" \
      >"$out/serve-$l-$r.log" 2>&1 || echo "serve $l round $r failed: $(tail -1 "$out/serve-$l-$r.log")"
    cp "$out/serve-$l-$r/summary.json" "$out/serve-$l-$r.json" 2>/dev/null
  fi
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
    """name -> list of values over runs (lower is better unless the name says msg/s or GB/s)."""
    acc = {}
    for doc in runs:
        if kind == "copylat":
            for row in doc:
                acc.setdefault(f"copylat {row['direction']} {row['size']} B mapping p50 us", []).append(row["mapping_median_us"])
                acc.setdefault(f"copylat {row['direction']} {row['size']} B auto p50 us", []).append(row["auto_median_us"])
                if row.get("capi_median_us") is not None:
                    acc.setdefault(f"copylat {row['direction']} {row['size']} B C API p50 us", []).append(row["capi_median_us"])
        elif kind == "pplat":
            for row in doc["rows"]:
                acc.setdefault(f"pplat {row['path']} p50 us", []).append(row["us"]["median"])
        elif kind == "copybw":
            for row in doc:
                pre = f"copybw {row['direction']} {row['size']} B"
                acc.setdefault(f"{pre} auto GB/s", []).append(row["auto_gbps"])
                acc.setdefault(f"{pre} copy engine GB/s", []).append(row["copy_engine_gbps"])
                if row.get("capi_gbps") is not None:
                    acc.setdefault(f"{pre} C API GB/s", []).append(row["capi_gbps"])
        elif kind == "serve":
            for side in ("gpu_queue", "host_centric"):
                for key, what in (("low_server_p50_us", "server-side"), ("low_e2e_p50_us", "end-to-end")):
                    v = doc.get(key, {}).get(side)
                    if v is not None:
                        acc.setdefault(f"serve lenet low {side} {what} p50 us", []).append(v)
        else:
            for row in doc["latency"]:
                acc.setdefault(f"mq {row['path']} {row['size']} B p50 us", []).append(row["p50_us"])
            for row in doc["throughput"]:
                acc.setdefault(f"mq {row['placement']} {row['size']} B x{row['queues']} msg/s", []).append(row["msgs_per_s"])
    return acc
print(f"{'figure':64} {'A':>12} {'B':>12} {'B/A':>7}")
worst = []
for kind in ("copylat", "copybw", "pplat", "mq", "serve"):
    fa, fb = figures(kind, load(kind, "A")), figures(kind, load(kind, "B"))
    for name in fa:
        if name not in fb:
            print(f"{name:64} {'':>12} {'missing':>12}")
            continue
        va, vb = statistics.median(fa[name]), statistics.median(fb[name])
        ratio = vb / va if va else float("nan")
        print(f"{name:64} {va:12.3f} {vb:12.3f} {ratio:7.3f}")
        # Slower in B: a larger time, or a smaller rate.
        rate = "msg/s" in name or "GB/s" in name
        worst.append((ratio if not rate else (1 / ratio if ratio else float("inf")), name))
worst.sort(reverse=True)
print("\nmost slowed in B (B/A as a cost ratio, 1.0 = same):")
for r, n in worst[:8]:
    print(f"  {r:6.3f}  {n}")
EOF
