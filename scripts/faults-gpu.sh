#!/usr/bin/env bash
# Faults under gdr's allocator and libgdrapi on a GPU host (issue 42, item 5), from a bundle
# (bundle/faults-gpu.sh; run.sh runs it as the part `faults`). Usage: faults-gpu.sh OUT
# Each case prints one `ok CASE: ...` or `FAILED CASE: ...` line:
#   kill   6 rank_check processes (2 threads, 4 buffers each held pinned and mapped throughout)
#          under `gdr run`; once all say `ready`, 5 s on, 2 of them get SIGKILL mid-copy. Passes
#          when the 4 others exit 0 (every check of theirs passed), the 2 died of SIGKILL, and
#          within 60 s of the last exit the GPU's BAR1 use and memory use are back to their
#          baseline (sampled before the start) within FAULT_SLACK_MIB (default 64) MiB.
#   oom    rank_check --oom: cudaMalloc until it fails; it must fail with
#          cudaErrorMemoryAllocation, leave the context working, and allocation and a round of
#          pin/map/copy checks must work after the frees (rank_check exits 0); the GPU's memory
#          use back to its baseline after the process.
#   fork   rank_check --fork with 2 loop threads beside: the main thread forks while it holds a
#          pin and a mapping; every gdr call of the child on the parent's gdr_t and handles
#          must give EINVAL (gdrapi.h), its own gdr_open a gdr_t that only closes, a store
#          through the parent's mapping must fault in the child, and the parent's bytes and
#          copies must be intact (rank_check exits 0).
#   unload tests/c/unload.c (capi/c in a bundle), built without -lgdrapi: dlopen()s the
#          installed libgdrapi.so.2, allocates and maps with it, dlclose()s it with everything
#          held, then checks that the library is still loaded (-z nodelete), that the mapping
#          kept its bytes and still reaches the GPU, and that the handle still frees, unmaps and
#          closes; exits 0, and the GPU's BAR1 and memory use are back to the baseline after.
# Every process is bounded (timeout; the kill case's wait 160 s). Last line:
# `faults-gpu: N passed, M failed`. Needs cc, CUDA_HOME (default /usr/local/cuda), nvidia-smi and
# libgdrapi installed; GDR_BIN names gdr (default the one beside this script); GPU_INDEX the
# nvidia-smi index of CUDA device 0 (default 0).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/rank-lib.sh
. "$here/rank-lib.sh"
[ $# -eq 1 ] || { echo "usage: faults-gpu.sh OUT"; exit 2; }
rl_setup "$1" faults-gpu
slack=${FAULT_SLACK_MIB:-64}
pass=0; fail=0
result() { # ok|FAILED, case, text
  if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
  echo "$1 $2: $3"
}
rl_build || { echo "faults-gpu: 0 passed, 4 failed"; exit 1; }

# The GPU's "BAR1 FB" figures (MiB) as the largest of three samples a second apart.
baseline() {
  local i line b=0 f=0
  for i in 1 2 3; do
    line=$(rl_gpu_line)
    [[ "$line" =~ ^[0-9]+\ [0-9]+$ ]] || { echo "- -"; return; }
    [ "${line% *}" -gt "$b" ] && b=${line% *}
    [ "${line#* }" -gt "$f" ] && f=${line#* }
    [ "$i" = 3 ] || sleep 1
  done
  echo "$b $f"
}

# Polls until BAR1 and memory use are within the slack of BASE ("BAR1 FB"), at most SECONDS.
# Prints what it saw last; true when back.
back_to() { # BASE SECONDS
  local base=$1 end=$((SECONDS + $2)) line
  while :; do
    line=$(rl_gpu_line)
    if [[ "$line" =~ ^[0-9]+\ [0-9]+$ ]] && [[ "$base" =~ ^[0-9]+\ [0-9]+$ ]] &&
      [ "${line% *}" -le $((${base% *} + slack)) ] && [ "${line#* }" -le $((${base#* } + slack)) ]; then
      echo "$line"; return 0
    fi
    [ "$SECONDS" -lt "$end" ] || { echo "$line"; return 1; }
    sleep 2
  done
}

# ---- kill ----
d=$RL_OUT/kill
rm -rf "$d" && mkdir -p "$d"
base=$(baseline)
pids=()
for i in 1 2 3 4 5 6; do
  rl_start "$d/rank$i.log" "$RL_BIN" --seconds 40 --threads 2 --hold 4 --report "$d/rank$i.json"
  pids+=("$RL_LAST_PID")
done
ready=0
for _ in $(seq 1 90); do
  ready=$(grep -l ': ready$' "$d"/rank*.log 2>/dev/null | wc -l)
  [ "$ready" -ge 6 ] && break
  sleep 1
done
if [ "$ready" -lt 6 ]; then
  rl_wait 0 "${pids[@]}"
  result FAILED kill "only $ready of 6 processes became ready within 90 s"
else
  sleep 5
  peak=$(rl_gpu_line)
  victims=("${pids[1]}" "${pids[4]}")
  kill -9 "${victims[@]}"
  rl_wait 160 "${pids[@]}"
  problems=()
  for i in 0 1 2 3 4 5; do
    p=${pids[$i]} s=${RL_STATUS[${pids[$i]}]}
    if [ "$i" = 1 ] || [ "$i" = 4 ]; then
      [ "$s" = 137 ] || problems+=("killed rank$((i + 1)) ended with $s, not SIGKILL")
    elif [ "$s" != 0 ]; then
      problems+=("rank$((i + 1)) (pid $p) exited $s: $(grep -m1 FAIL "$d/rank$((i + 1)).log")")
    fi
  done
  seen=$(back_to "$base" 60) || problems+=("BAR1/memory use (MiB) $seen after 60 s, baseline $base, slack $slack")
  apps=$(rl_smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ')
  for p in "${pids[@]}"; do
    grep -qx "$p" <<<"$apps" && problems+=("nvidia-smi still lists pid $p")
  done
  summary="BAR1/memory use (MiB) baseline $base, with 6 running $peak, after $seen; survivors: $(grep -h -o '[0-9]* checks, [0-9]* failures' "$d"/rank{1,3,4,6}.log 2>/dev/null | paste -sd';')"
  if [ ${#problems[@]} -eq 0 ]; then
    result ok kill "2 of 6 killed mid-run, the 4 others passed; $summary"
  else
    result FAILED kill "$(printf '%s; ' "${problems[@]}")$summary"
  fi
fi

# ---- oom ----
d=$RL_OUT/oom
rm -rf "$d" && mkdir -p "$d"
base=$(baseline)
timeout 300 "$RL_GDR" run -q -- "$RL_BIN" --oom --report "$d/oom.json" >"$d/oom.log" 2>&1
s=$?
grep -h 'oom:' "$d/oom.log" | sed 's/^/  /'
seen=$(back_to "$base" 60); back=$?
if [ "$s" = 0 ] && [ "$back" = 0 ]; then
  result ok oom "cudaErrorMemoryAllocation when full, allocation and copies worked after the frees; BAR1/memory use (MiB) $base before, $seen after"
else
  why="exit $s"; [ "$s" = 124 ] && why="timed out (300 s)"
  [ "$back" = 0 ] || why="$why; BAR1/memory use (MiB) $seen after 60 s, baseline $base"
  result FAILED oom "$why: $(grep -m3 -E 'FAIL|rror' "$d/oom.log" | paste -sd'|')"
fi

# ---- fork ----
d=$RL_OUT/fork
rm -rf "$d" && mkdir -p "$d"
timeout 300 "$RL_GDR" run -q -- "$RL_BIN" --fork --seconds 20 --threads 2 --hold 2 \
  --report "$d/fork.json" >"$d/fork.log" 2>&1
s=$?
if [ "$s" = 0 ]; then
  result ok fork "$(grep -h -o '[0-9]* checks, [0-9]* failures.*rounds' "$d/fork.log")"
else
  why="exit $s"; [ "$s" = 124 ] && why="timed out (300 s)"
  result FAILED fork "$why: $(grep -m3 -E 'FAIL|rror' "$d/fork.log" | paste -sd'|')"
fi

# ---- unload ----
d=$RL_OUT/unload
rm -rf "$d" && mkdir -p "$d"
src=$here/capi/c/unload.c
[ -f "$src" ] || src=$here/../crates/gdr-capi/tests/c/unload.c
prefix=${GDR_PREFIX:-/usr/local}
cflags=$(pkg-config --cflags gdrapi 2>/dev/null) || cflags="-I$prefix/include"
libdir=$(pkg-config --variable=libdir gdrapi 2>/dev/null) || libdir=$prefix/lib
base=$(baseline)
# shellcheck disable=SC2086 # cflags is a list of compiler words
if timeout 120 cc -std=gnu11 -O2 -Wall -Wextra -Werror $cflags -o "$d/unload" "$src" -ldl \
    >"$d/build.log" 2>&1; then
  GDR_REQUIRE_GPU=1 timeout 120 "$d/unload" "$libdir/libgdrapi.so.2" >"$d/unload.log" 2>&1
  s=$?
  seen=$(back_to "$base" 60); back=$?
  if [ "$s" = 0 ] && [ "$back" = 0 ] && grep -q 'unload: all checks passed' "$d/unload.log"; then
    result ok unload "dlclose with a handle, an allocation and a mapping held: the library stayed loaded, the mapping kept its bytes and reached the GPU, the handle closed; BAR1/memory use (MiB) $base before, $seen after"
  else
    why="exit $s"; [ "$s" = 124 ] && why="timed out (120 s)"
    [ "$back" = 0 ] || why="$why; BAR1/memory use (MiB) $seen after 60 s, baseline $base"
    result FAILED unload "$why: $(grep -m3 -E 'FAIL|rror' "$d/unload.log" | paste -sd'|')"
  fi
else
  result FAILED unload "build of $src: $(tail -3 "$d/build.log" | paste -sd'|')"
fi

echo "faults-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
