#!/usr/bin/env bash
# Many ranks under gdr's allocator (issue 41, item 5), on a GPU host from a bundle
# (bundle/ranks-gpu.sh; run.sh runs it as the part `ranks`). Usage: ranks-gpu.sh OUT [N...]
# For each N (default 8 and 32): N processes of clients/rank_check.c started at once under
# `gdr run`, each looping for RANK_SECONDS (default 20) on RANK_THREADS threads (default 1):
# cudaMalloc/cuMemAlloc of random sizes up to RANK_MAX_SIZE (default 4M), random offsets, pin,
# map, bytes checked both ways, unpin, free. While they run, GPU_INDEX's (default 0) BAR1 use and
# each process's device memory are sampled every 2 s (nvidia-smi).
# Passes for an N when every process exits 0 (rank_check exits non-zero on any failed check or
# API error, or when it checked nothing) and wrote its report; a process still running 120 s
# after its time is killed and fails. Prints a table (OUT/ranks.md): checks, failures, the
# first cudaMalloc's time (median, max: the allocator's first-allocation cost), device memory
# per process, BAR1 used before and at peak. Last line: `ranks-gpu: N passed, M failed` (one per N).
# Needs cc, CUDA_HOME (default /usr/local/cuda) and libgdrapi installed (run.sh installs it
# into /usr/local); GDR_BIN names gdr (default the one beside this script).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/rank-lib.sh
. "$here/rank-lib.sh"
usage="usage: ranks-gpu.sh OUT [N...]"
[ $# -ge 1 ] || { echo "$usage"; exit 2; }
rl_setup "$1" ranks-gpu; shift
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(8 32)
for n in "${counts[@]}"; do
  if ! [[ "$n" =~ ^[1-9][0-9]{0,2}$ ]] || [ "$n" -gt 128 ]; then
    echo "ranks-gpu: N must be 1..128: $n"; echo "$usage"; exit 2
  fi
done
secs=${RANK_SECONDS:-20}
threads=${RANK_THREADS:-1}
max=${RANK_MAX_SIZE:-4M}
if ! rl_build; then echo "ranks-gpu: 0 passed, ${#counts[@]} failed"; exit 1; fi
for n in "${counts[@]}"; do
  d=$RL_OUT/n$n
  rm -rf "$d" && mkdir -p "$d"
  : >"$d/pids"; : >"$d/names"
  # The sampler's first line comes before any rank starts: the BAR1 baseline.
  rl_sampler_start "$d/samples.tsv" 2 "$d/pids"
  sleep 3
  for i in $(seq 1 "$n"); do
    rl_start_in "$d" "rank$i" "$RL_BIN" --seconds "$secs" --threads "$threads" --max-size "$max" \
      --report "$d/rank$i.json"
  done
  rl_wait_in "$d" $((secs + 120))
  rl_sampler_stop
  # Each process's summary line, and the failure lines of those that failed.
  grep -h '^rank_check: pid .*checks' "$d"/rank*.log | sed 's/^/  /'
  for i in $(seq 1 "$n"); do
    grep -q ' 0 failures' "$d/rank$i.log" 2>/dev/null || tail -5 "$d/rank$i.log" | sed "s/^/  rank$i | /"
  done
done
python3 "$here/rank_report.py" ranks "$RL_OUT" "${counts[@]}" | tee "$RL_OUT/ranks.md"
failed=${PIPESTATUS[0]}
[ "$failed" -le ${#counts[@]} ] || failed=${#counts[@]}
echo "ranks-gpu: $((${#counts[@]} - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
