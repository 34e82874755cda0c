#!/usr/bin/env bash
# Runs the bundle's parts on several GPUs at once, and several parts side by side on one GPU,
# so that a bundle fits a bounded call on a multi-GPU host (bundle/lanes.sh; run.sh beside it).
# Usage: lanes.sh OUTDIR LANE...
#   LANE k runs on GPU k: CUDA_VISIBLE_DEVICES=k, GPU_INDEX=k, CUDA_DEVICE_ORDER=PCI_BUS_ID.
#   LANE  = GROUP[|GROUP...]   groups run side by side on the lane's GPU
#   GROUP = [@CPUS:]STEP[;STEP...]   steps one after another, under `taskset -c CPUS` if given
#   STEP  = sleep:SECONDS, or an ONLY= list of run.sh's parts (space-separated)
# Example, two GPUs: lanes.sh OUT "@0-15:alloc ucx" "@16-31:tests ranks|@16-31:sleep:60;python"
# LIMIT (seconds, default 560) bounds every step from lanes.sh's start; a step with less than
# 20 s left is skipped and says so. libgdrapi, libgdr_alloc and the Vulkan loader are installed
# once (run.sh with ONLY=none), then every run.sh starts with GDR_RUN_INSTALLED=1.
# Parts whose checks are GPU-wide count every process on their GPU: soak, faults, capi and
# sandbox (the semantics program's free-memory check, close_releases) and the BAR1 figures of
# ranks. These parts also see processes kept to the host's other GPUs (each adds some memory on
# every GPU): give them their GPU, and for the soak the host, alone. UCXX's part starts a process
# pair every few seconds for minutes, and beside it the sandbox's free-memory checks have failed
# (docs/results/2026-11-28-bundle.md, section "3d6a486"): keep ucxx away from the soak, faults,
# capi and sandbox.
# Writes OUTDIR/L<k>G<g>S<s>/ (run.sh's OUTDIR of lane k, group g, step s) and beside it a .txt
# with run.sh's summary and a last line `rc=N step=[...] cpus=[...] end=Ss`; OUTDIR/summary.txt
# holds them all. Exit status 0 when every step that ran exited 0 and none was skipped.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: lanes.sh OUTDIR LANE...   (LANE: [@CPUS:]PARTS[;PARTS...][|...])"
[ $# -ge 2 ] || { echo "$usage"; exit 2; }
out=$1; shift
mkdir -p "$out" && out=$(cd "$out" && pwd)
limit=${LIMIT:-560}
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "lanes: LIMIT must be a number of seconds: $limit"; exit 2; }
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_ORDER=PCI_BUS_ID
if ! ONLY=none "$here/run.sh" "$out/install" >"$out/install.log" 2>&1; then
  echo "lanes: installing the libraries failed (see $out/install.log)"; exit 1
fi
export GDR_RUN_INSTALLED=1
t0=$SECONDS

group() { # lane, group, text
  local k=$1 g=$2 text=$3 cpus="" s=0 rem tag
  if [[ "$text" == @* ]]; then cpus=${text%%:*}; cpus=${cpus#@}; text=${text#*:}; fi
  local pre=()
  [ -n "$cpus" ] && pre=(taskset -c "$cpus")
  IFS=';' read -ra steps <<<"$text"
  for step in "${steps[@]}"; do
    tag="L${k}G${g}S${s}"
    s=$((s + 1))
    if [[ "$step" == sleep:* ]]; then sleep "${step#sleep:}"; continue; fi
    rem=$((limit - (SECONDS - t0)))
    if [ "$rem" -lt 20 ]; then
      echo "skipped: ${rem}s left; rc=skipped step=[$step] cpus=[$cpus]" >"$out/$tag.txt"
      continue
    fi
    timeout "$rem" "${pre[@]}" env CUDA_VISIBLE_DEVICES="$k" GPU_INDEX="$k" ONLY="$step" \
      "$here/run.sh" "$out/$tag" >"$out/$tag.txt" 2>&1
    echo "rc=$? step=[$step] cpus=[$cpus] end=$((SECONDS - t0))s" >>"$out/$tag.txt"
  done
}

k=0
for lane in "$@"; do
  IFS='|' read -ra groups <<<"$lane"
  g=0
  for grp in "${groups[@]}"; do
    group "$k" "$g" "$grp" &
    g=$((g + 1))
  done
  k=$((k + 1))
done
wait
: >"$out/summary.txt"
bad=0
for f in "$out"/L*G*S*.txt; do
  [ -f "$f" ] || continue
  { echo "== $(basename "$f" .txt)"; cat "$f"; } >>"$out/summary.txt"
  tail -1 "$f" | grep -q '^rc=0 ' || bad=1
done
cat "$out/summary.txt"
echo "lanes: $k lanes, $((SECONDS - t0)) s; $([ $bad = 0 ] && echo 'every step exited 0' || echo 'a step failed or was skipped')"
exit $bad
