#!/usr/bin/env bash
# A soak of gdr's allocator and libgdrapi on a GPU host (issue 42, item 4), from a bundle
# (bundle/soak.sh; run.sh runs it as the part `soak` only when ONLY names it, since it takes
# MINUTES). Usage: soak.sh OUT [MINUTES]   (MINUTES 1..9, default 8: it fits a 10-minute call)
# Load, all at once under `gdr run`, each for MINUTES:
#   - SOAK_RANKS (default 8) rank_check processes of SOAK_THREADS (default 4) threads, each
#     thread looping cudaMalloc/cuMemAlloc of random sizes (up to 4 MiB) and offsets, pin, map,
#     copies both ways checked, unpin, free, and holding 2 pinned, mapped buffers throughout;
#   - SOAK_TORCH (default 2) Python processes (clients/torch_pin_loop.py) pinning slices of
#     PyTorch tensors through libgdrapi with ctypes, checked both ways.
# Every SOAK_INTERVAL (default 10) s: each process's RSS (/proc/PID/status VmRSS), open fds
# (/proc/PID/fd), device memory (nvidia-smi --query-compute-apps) and the GPU's BAR1 use and
# memory use (nvidia-smi).
# Passes when every process exits 0 with 0 data errors and every sampled series is flat after
# the warm-up: the largest value in the last minute is at most the largest in the minute after
# the warm-up (2 min; a quarter of the run when shorter, and the windows likewise) plus a share
# or a fixed slack, whichever is larger: a process's RSS 10% or 16 MiB, open fds 10% or 4, device
# memory 10% or 64 MiB; the GPU's BAR1 use and memory use 5% or 64 MiB (scripts/rank_report.py).
# Writes OUT/soak.md (the table) and OUT/soak.json (every sample). The GPU-wide figures count
# every process on the GPU: run the soak with the host's GPUs otherwise idle (on a two-GPU
# host, processes kept to the other GPU by CUDA_VISIBLE_DEVICES still raised this GPU's use).
# Last line: `soak: passed` or `soak: FAILED`. Needs cc, python3 with PyTorch, CUDA_HOME
# (default /usr/local/cuda) and libgdrapi installed; GDR_BIN names gdr (default beside this).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/rank-lib.sh
. "$here/rank-lib.sh"
usage="usage: soak.sh OUT [MINUTES]   (MINUTES 1..9, default 8)"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then echo "$usage"; exit 2; fi
minutes=${2:-8}
[[ "$minutes" =~ ^[1-9]$ ]] || { echo "soak: MINUTES must be 1..9: $minutes"; echo "$usage"; exit 2; }
rl_setup "$1" soak
ranks=${SOAK_RANKS:-8}
threads=${SOAK_THREADS:-4}
torch_procs=${SOAK_TORCH:-2}
interval=${SOAK_INTERVAL:-10}
secs=$((minutes * 60))
warmup=$((secs / 4 < 120 ? secs / 4 : 120))
window=$((secs / 4 < 60 ? secs / 4 : 60))
fail() { echo "soak: $1"; echo "soak: FAILED"; exit 1; }
rl_build || fail "rank_check did not build"
if [ "$torch_procs" -gt 0 ] && ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  fail "python3 has no PyTorch with CUDA (SOAK_TORCH=0 runs without the Python processes)"
fi
d=$RL_OUT
rm -f "$d"/rank*.json "$d"/torch*.json
: >"$d/pids"; : >"$d/names"
rl_sampler_start "$d/samples.tsv" "$interval" "$d/pids"
for i in $(seq 1 "$ranks"); do
  rl_start_in "$d" "rank$i" "$RL_BIN" --seconds "$secs" --threads "$threads" --hold 2 \
    --report "$d/rank$i.json"
done
for i in $(seq 1 "$torch_procs"); do
  rl_start_in "$d" "torch$i" python3 "$here/clients/torch_pin_loop.py" --seconds "$secs" \
    --report "$d/torch$i.json"
done
echo "soak: ${ranks} x ${threads} threads of rank_check and ${torch_procs} PyTorch processes for ${minutes} min, sampled every ${interval} s; warm-up ${warmup} s, windows ${window} s"
# PyTorch's start (import, CUDA) comes before its loop's time: 45 s more for everyone.
rl_wait_in "$d" $((secs + 45))
rl_sampler_stop
grep -h -E '^(rank_check|torch_pin_loop): pid .*checks' "$d"/rank*.log "$d"/torch*.log 2>/dev/null | sed 's/^/  /'
grep -h -E 'FAIL' "$d"/rank*.log "$d"/torch*.log 2>/dev/null | head -20 | sed 's/^/  | /'
if python3 "$here/rank_report.py" soak "$d" "$warmup" "$window"; then
  echo "soak: passed"
else
  echo "soak: FAILED"
  exit 1
fi
