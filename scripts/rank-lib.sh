# shellcheck shell=bash
# rank-lib.sh: what ranks-gpu.sh, soak.sh and faults-gpu.sh share. Sourced, not run; the caller
# sets `here` (its own folder: scripts/ or the bundle) first.
#   rl_setup OUT NAME        OUT made absolute as RL_OUT; the gdr binary (GDR_BIN, default the one
#                            beside the script) as RL_GDR; an EXIT trap that kills what was started
#   rl_build                 builds clients/rank_check.c into RL_OUT/rank_check (RL_BIN) with cc
#                            against CUDA_HOME (default /usr/local/cuda) and the installed libgdrapi
#   rl_start LOG CMD...      starts `gdr run -q -- CMD...` in the background, output into LOG;
#                            its pid (gdr run execs CMD, so it is CMD's) in RL_LAST_PID
#   rl_start_in DIR NAME CMD...
#                            rl_start with the log DIR/NAME.log, the pid added to DIR/pids and
#                            "PID NAME" to DIR/names
#   rl_wait SECONDS PIDS...  waits for them, at most SECONDS, then kills what is left; each
#                            one's exit status in RL_STATUS[pid] (137 when killed)
#   rl_wait_in DIR SECONDS   rl_wait for DIR/pids, then DIR/status.tsv: "PID STATUS NAME" lines
#   rl_sampler_start FILE INTERVAL PIDFILE / rl_sampler_stop
#                            samples every INTERVAL s (gpu.tsv format below) the processes named
#                            in PIDFILE (one pid a line, read at each sample) and the GPU
#   rl_gpu_line              one sample of the GPU: "bar1_used_mib fb_used_mib"
# Sample lines (tab separated): `T gpu BAR1_USED_MIB FB_USED_MIB` and
# `T PID RSS_KIB FDS GPU_MIB` (GPU_MIB `-` where nvidia-smi does not list the pid, as in a PID
# namespace of its own), T in seconds since the sampler started.

RL_PIDS=()
RL_SAMPLER=""
declare -A RL_STATUS=()

rl_setup() {
  RL_NAME=$2
  if ! mkdir -p "$1" || ! RL_OUT=$(cd "$1" && pwd); then echo "$RL_NAME: cannot create $1"; exit 2; fi
  RL_GDR=${GDR_BIN:-$here/gdr}
  [ -x "$RL_GDR" ] || { echo "$RL_NAME: no gdr binary at $RL_GDR (set GDR_BIN)"; exit 2; }
  RL_GPU=${GPU_INDEX:-0}
  trap rl_cleanup EXIT
  trap 'exit 130' INT TERM
}

# True while pid runs (a zombie not yet reaped counts as gone).
rl_alive() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

rl_cleanup() {
  local p
  for p in "${RL_PIDS[@]}"; do
    rl_alive "$p" && kill -9 "$p" 2>/dev/null
  done
  rl_sampler_stop
}

rl_build() {
  local cuda=${CUDA_HOME:-/usr/local/cuda} prefix=${GDR_PREFIX:-/usr/local} flags
  RL_BIN=$RL_OUT/rank_check
  # gdrapi.pc when pkg-config has it (run.sh installs it), else the prefix's include and lib.
  flags=$(pkg-config --cflags --libs gdrapi 2>/dev/null) ||
    flags="-I$prefix/include -L$prefix/lib -Wl,-rpath,$prefix/lib -lgdrapi"
  # shellcheck disable=SC2086 # flags is a list of compiler words
  if timeout 120 cc -O2 -Wall -std=gnu11 -o "$RL_BIN" "$here/clients/rank_check.c" \
      -I"$cuda/include" $flags -L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcudart \
      -L"$cuda/lib64/stubs" -lcuda -lpthread -ldl >"$RL_OUT/build.log" 2>&1; then
    return 0
  fi
  echo "FAILED build of rank_check (CUDA_HOME=$cuda):"
  tail -20 "$RL_OUT/build.log" | sed 's/^/  | /'
  return 1
}

rl_start() {
  local log=$1; shift
  "$RL_GDR" run -q -- "$@" >"$log" 2>&1 &
  RL_LAST_PID=$!
  RL_PIDS+=("$RL_LAST_PID")
}

rl_start_in() {
  local dir=$1 name=$2; shift 2
  rl_start "$dir/$name.log" "$@"
  echo "$RL_LAST_PID" >>"$dir/pids"
  printf '%s\t%s\n' "$RL_LAST_PID" "$name" >>"$dir/names"
}

rl_wait_in() {
  local dir=$1 p name
  # shellcheck disable=SC2046 # one pid a line
  rl_wait "$2" $(cat "$dir/pids")
  : >"$dir/status.tsv"
  while read -r p name; do
    printf '%s\t%s\t%s\n' "$p" "${RL_STATUS[$p]:-255}" "$name" >>"$dir/status.tsv"
  done <"$dir/names"
}

rl_wait() {
  local end=$((SECONDS + $1)) p left; shift
  while :; do
    left=0
    for p in "$@"; do rl_alive "$p" && left=1; done
    if [ "$left" = 0 ] || [ "$SECONDS" -ge "$end" ]; then break; fi
    sleep 1
  done
  for p in "$@"; do
    rl_alive "$p" && { echo "$RL_NAME: pid $p still running after the bound: killed"; kill -9 "$p"; }
    wait "$p" 2>/dev/null
    # shellcheck disable=SC2034 # read by the scripts that source this file
    RL_STATUS[$p]=$?
  done
}

# nvidia-smi, bounded: a wedged driver must not hang the scripts.
rl_smi() { timeout 30 nvidia-smi "$@" 2>/dev/null; }

rl_gpu_line() {
  local bar1 fb
  bar1=$(rl_smi -i "$RL_GPU" -q -d MEMORY | awk '/BAR1 Memory Usage/ {b = 1} b && /Used/ {print $3; exit}')
  fb=$(rl_smi -i "$RL_GPU" --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ')
  echo "${bar1:--} ${fb:--}"
}

rl_sample_once() { # FILE T PIDFILE
  local file=$1 t=$2 pidfile=$3 apps p rss fds mem gpu
  gpu=$(rl_gpu_line)
  printf '%s\tgpu\t%s\t%s\n' "$t" "${gpu% *}" "${gpu#* }" >>"$file"
  apps=$(rl_smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr -d ' ')
  while read -r p; do
    if [ -z "$p" ] || ! rl_alive "$p"; then continue; fi
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
    fds=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    mem=$(awk -F, -v p="$p" '$1 == p {s += $2; f = 1} END {if (f) print s}' <<<"$apps")
    printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$p" "${rss:--}" "$fds" "${mem:--}" >>"$file"
  done <"$pidfile"
}

rl_sampler_start() { # FILE INTERVAL PIDFILE
  local file=$1 interval=$2 pidfile=$3
  : >"$file"
  (
    start=$SECONDS
    k=0
    while :; do
      rl_sample_once "$file" $((SECONDS - start)) "$pidfile"
      # On a grid of INTERVAL seconds, however long nvidia-smi took.
      k=$((k + 1))
      while [ $((SECONDS - start)) -lt $((k * interval)) ]; do sleep 1; done
    done
  ) &
  RL_SAMPLER=$!
}

rl_sampler_stop() {
  [ -n "$RL_SAMPLER" ] || return 0
  kill "$RL_SAMPLER" 2>/dev/null
  wait "$RL_SAMPLER" 2>/dev/null
  RL_SAMPLER=""
}
