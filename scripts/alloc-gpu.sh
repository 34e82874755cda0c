#!/usr/bin/env bash
# gdr's allocator on a GPU host, from a bundle (bundle/alloc-gpu.sh; run.sh runs it as the part
# `alloc`). Needs nvcc, and libgdrapi + libgdr_alloc installed (run.sh installs both into
# /usr/local first). Usage: alloc-gpu.sh OUTDIR [PARTS]
#   PARTS (default all): check bench clients
#   check    alloc_check.cu built twice (CUDA runtime linked statically, nvcc's default, and
#            shared), each run without the allocator ("driver": CUDA semantics, pins of
#            cudaMalloc memory refused) and under `gdr run` ("pool": the same semantics, and
#            pins of any allocation work, at <= 10 us)
#   bench    alloc_bench.cu without and under `gdr run`, side by side (OUTDIR/alloc-bench.md)
#   clients  torch_gdrapi.py (its allocator mode too) and alloc_clients.py (PyTorch training
#            loop with and without, CuPy round trip)
# Logs go to OUTDIR; the last line is `alloc-gpu: N passed, M failed`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: alloc-gpu.sh OUTDIR [PARTS]}
parts=${2:-check bench clients}
mkdir -p "$out"
out=$(cd "$out" && pwd)
gdr=${GDR_BIN:-$here/gdr}
export GDR_BIN=$gdr
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cuda=$(cd "$(dirname "$nvcc")/.." && pwd)
src=$here/alloc
[ -d "$src" ] || src=$here/../crates/gdr-alloc-preload  # from the source tree
pass=0; fail=0
want() { [[ " $parts " == *" $1 "* ]]; }
step() { # name, command... (the output goes to OUTDIR/name.log; the last line is shown)
  local n=$1; shift
  if timeout 600 "$@" >"$out/$n.log" 2>&1; then
    pass=$((pass+1)); echo "ok $n: $(grep -E 'passed|time |median' "$out/$n.log" | tail -1)"
  else
    fail=$((fail+1)); echo "FAILED $n:"; grep -E '^FAIL|rror' "$out/$n.log" | head -20 | sed 's/^/  /'
    tail -3 "$out/$n.log" | sed 's/^/  | /'
  fi
}
find_src() { [ -f "$src/$1" ] && echo "$src/$1" || echo "$src/tests/gpu/$1"; }
flags=(-O2 -std=c++17 -I/usr/local/include -L/usr/local/lib -lgdrapi -L"$cuda/lib64/stubs" -lcuda)
if want check; then
  check_src=$(find_src alloc_check.cu)
  step build-alloc_check_static "$nvcc" -o "$out/alloc_check_static" "$check_src" "${flags[@]}"
  step build-alloc_check_shared "$nvcc" -cudart shared -o "$out/alloc_check_shared" "$check_src" "${flags[@]}"
  for v in static shared; do
    [ -x "$out/alloc_check_$v" ] || continue
    step "alloc_check_$v-driver" "$out/alloc_check_$v" driver
    step "alloc_check_$v-pool" "$gdr" run -- "$out/alloc_check_$v" pool
  done
fi
if want bench; then
  bench_src=$(find_src alloc_bench.cu)
  [ -f "$bench_src" ] || bench_src=$src/bench/alloc_bench.cu
  step build-alloc_bench "$nvcc" -O2 -std=c++17 -o "$out/alloc_bench" "$bench_src"
  if [ -x "$out/alloc_bench" ]; then
    # Alternated, two rounds each, in this one call: drift on the host hits both alike.
    for r in 1 2; do
      step "alloc_bench-driver-$r" sh -c "'$out/alloc_bench' > '$out/alloc-bench-driver-$r.json'"
      step "alloc_bench-pool-$r" sh -c "'$gdr' run -q -- '$out/alloc_bench' > '$out/alloc-bench-pool-$r.json'"
      # The same with the probe measured in the process (no probe cache): the first
      # allocation's cost before the cache.
      step "alloc_bench-probe-$r" sh -c "GDR_ALLOC_PROBE=always '$gdr' run -q -- '$out/alloc_bench' > '$out/alloc-bench-probe-$r.json'"
    done
    python3 - "$out" <<'EOF' | tee "$out/alloc-bench.md"
import json, sys, statistics
out = sys.argv[1]
def load(kind):
    runs = []
    for r in (1, 2):
        try:
            runs.append(json.load(open(f"{out}/alloc-bench-{kind}-{r}.json")))
        except (OSError, ValueError):
            pass
    return runs
d, p, q = load("driver"), load("pool"), load("probe")
if not d or not p or not q:
    sys.exit("alloc-bench: missing runs")
def med(runs, size, key):
    return statistics.median(next(x[key] for x in r["sizes"] if x["size"] == size) for r in runs)
def human(n):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << s:
            return f"{n >> s} {unit}"
    return f"{n} B"
print("| size | cudaMalloc+cudaFree, driver (us) | with gdr's allocator (us) | ratio | alloc / free with (us) | first cudaMalloc driver / with (us) | first with, probe measured (GDR_ALLOC_PROBE=always) (us) |")
print("|---|---|---|---|---|---|---|")
for row in d[0]["sizes"]:
    s = row["size"]
    a, b = med(d, s, "pair_us"), med(p, s, "pair_us")
    print(f"| {human(s)} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {med(p, s, 'alloc_us'):.2f} / {med(p, s, 'free_us'):.2f} | {med(d, s, 'first_us'):.0f} / {med(p, s, 'first_us'):.0f} | {med(q, s, 'first_us'):.0f} |")
bd = statistics.median(r["burst"]["bytes_per_allocation"] for r in d)
bp = statistics.median(r["burst"]["bytes_per_allocation"] for r in p)
td = statistics.median(r["burst"]["seconds"] for r in d)
tp = statistics.median(r["burst"]["seconds"] for r in p)
print(f"\n10^5 allocations of 64 B: device memory per allocation {bd:.0f} B (driver) vs {bp:.0f} B "
      f"(gdr's allocator); time {td * 1e3:.1f} ms vs {tp * 1e3:.1f} ms")
EOF
  fi
fi
if want clients; then
  step torch_gdrapi python3 "$here/clients/torch_gdrapi.py"
  step alloc_clients python3 "$here/clients/alloc_clients.py" --out "$out/clients"
fi
echo "alloc-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
