#!/usr/bin/env bash
# UCX with gdr on a GPU host: first that it does no harm, then what it gains (docs/ucx.md).
# UCX is built from its published source outside this repository, configured --with-cuda and
# --with-gdrcopy against gdr's installed gdrapi.h (the project carries neither its code nor a
# recipe for building it); this script takes its install folder:
#   UCX/bin/{ucx_info,ucx_perftest}, UCX/lib (libucp.so.0 ..., ucx/ modules), UCX/include
# Usage: ucx-gpu.sh UCX OUTDIR [PARTS]     PARTS (default all but sweep):
#   info   ucx_info -d: gdr_copy is listed under `gdr run`, and left out without it (libgdrapi
#          refuses gdr_open where UCX runs without gdr's allocator)
#   data   scripts/clients/ucp_check.c: random bytes 1 B..16 MiB between two processes, from
#          CUDA buffers at offsets inside shared allocator chunks, every byte compared; both
#          under `gdr run`, one under it, neither; UCX's default transports, and sm,cuda_copy,
#          gdr_copy
#   lat    ucx_perftest tag_lat -m cuda, two processes, 8 B..4 MiB (GDR_UCX_SIZES), in four
#          setups per size, alternated, GDR_UCX_ROUNDS rounds (default 2, medians): not under
#          gdr run (UCX_TLS unset), the same with UCX_TLS=^gdr_copy (as if gdr were absent),
#          under gdr run, under gdr run --ucx
#   proto  UCX_PROTO_INFO=y of a tag send from CUDA memory, with and without gdr_copy
#   calls  the driver calls UCX makes per message (scripts/clients/cucount.c), gdr absent and
#          under gdr run, at GDR_UCX_CALL_SIZES (default 4096 1048576), with the variables of
#          GDR_UCX_CALL_ENV (space-separated VAR=VALUE) added to both
#   sweep  UCX settings under gdr run, each beside plain gdr run (the experiment behind
#          `gdr run --ucx`): GDR_UCX_SWEEP lists them, `;` between settings, spaces between the
#          variables of one; sizes GDR_UCX_SWEEP_SIZES
# GDR_UCX_SERVER_GPU / GDR_UCX_CLIENT_GPU put the two processes on two GPUs (CUDA ordinals).
# Needs libgdrapi and libgdr_alloc installed where the loader finds them (bundle/run.sh does),
# GDR_BIN (default: the gdr next to this script), cc and the CUDA toolkit (CUDA_HOME, default
# /usr/local/cuda). Logs to OUTDIR; tables in OUTDIR/ucx.md, figures in OUTDIR/ucx.json; the
# last line is `ucx-gpu: N passed, M failed`. NCCL_NVLS_ENABLE=0 stays set.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ucx=${1:?usage: ucx-gpu.sh UCX OUTDIR [PARTS]}
out=${2:?usage: ucx-gpu.sh UCX OUTDIR [PARTS]}
parts=${3:-info data lat proto}
ucx=$(cd "$ucx" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
gdr=${GDR_BIN:-$here/gdr}
cuda=${CUDA_HOME:-/usr/local/cuda}
export NCCL_NVLS_ENABLE=0
# This UCX, not one the host has installed.
export LD_LIBRARY_PATH=$ucx/lib:/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset UCX_TLS
pass=0; fail=0
want() { [[ " $parts " == *" $1 "* ]]; }
ok() { pass=$((pass+1)); echo "ok $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
port=$((20000 + RANDOM % 20000))
next_port() { port=$((port + 1)); }
# The settings `gdr run --ucx` applies, read back from gdr itself (the UCX variables it adds).
ucx_env=$(comm -13 <(env | sort) <("$gdr" run -q --ucx -- env | sort) | grep -E '^UCX_' | tr '\n' ' ')

# run_pair LOG WRAP ENV -- SERVER_ARGS -- CLIENT_ARGS: a server and a client, each under WRAP
# (`gdr` for `gdr run -q --`, `none`), with ENV (space-separated VAR=VALUE, or -), bounded.
run_pair() {
  local log=$1 wrap_s=$2 wrap_c=$3 envs=$4; shift 4
  local sargs=() cargs=() side=s
  for a in "$@"; do
    if [ "$a" = -- ]; then side=c; continue; fi
    if [ $side = s ]; then sargs+=("$a"); else cargs+=("$a"); fi
  done
  local e=() pre_s=() pre_c=()
  [ "$envs" != - ] && read -r -a e <<<"$envs"
  [ "$wrap_s" = gdr ] && pre_s=("$gdr" run -q --)
  [ "$wrap_c" = gdr ] && pre_c=("$gdr" run -q --)
  # Two GPUs: the server's process sees only GDR_UCX_SERVER_GPU, the client's only
  # GDR_UCX_CLIENT_GPU (unset: both see every GPU and use the first).
  local gs=() gc=()
  [ -n "${GDR_UCX_SERVER_GPU:-}" ] && gs=("CUDA_VISIBLE_DEVICES=$GDR_UCX_SERVER_GPU")
  [ -n "${GDR_UCX_CLIENT_GPU:-}" ] && gc=("CUDA_VISIBLE_DEVICES=$GDR_UCX_CLIENT_GPU")
  env ${e[@]+"${e[@]}"} ${gs[@]+"${gs[@]}"} timeout 120 ${pre_s[@]+"${pre_s[@]}"} "${sargs[@]}" >"$out/$log.server" 2>&1 &
  local srv=$!
  # The client starts once the server listens (ucx_perftest's client does not retry, and its
  # server takes the first connection as its client, so the port is only looked at).
  local hex
  hex=$(printf '%04X' "$port")
  for _ in $(seq 200); do
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" {f = 1} END {exit !f}' /proc/net/tcp 2>/dev/null && break
    kill -0 $srv 2>/dev/null || break
    sleep 0.05
  done
  env ${e[@]+"${e[@]}"} ${gc[@]+"${gc[@]}"} timeout 120 ${pre_c[@]+"${pre_c[@]}"} "${cargs[@]}" >"$out/$log" 2>&1
  local rc=$?
  wait $srv
  local rs=$?
  [ $rc = 0 ] && [ $rs = 0 ]
}

if want info; then
  timeout 60 "$gdr" run -q -- "$ucx/bin/ucx_info" -d >"$out/info-gdr-run.log" 2>&1
  if grep -q 'Transport: gdr_copy' "$out/info-gdr-run.log"; then
    ok "ucx_info -d under gdr run lists gdr_copy"
  else
    bad "ucx_info -d under gdr run does not list gdr_copy"
  fi
  timeout 60 "$ucx/bin/ucx_info" -d >"$out/info-plain.log" 2>&1
  if grep -q 'Transport: cuda_copy' "$out/info-plain.log" && ! grep -q 'Transport: gdr_copy' "$out/info-plain.log"; then
    ok "ucx_info -d without gdr run lists cuda_copy and leaves gdr_copy out"
  else
    bad "ucx_info -d without gdr run: gdr_copy listed, or cuda_copy missing"
  fi
fi

if want data; then
  if cc -O2 "$here/clients/ucp_check.c" -o "$out/ucp_check" -I"$ucx/include" -I"$cuda/include" \
      -L"$ucx/lib" -L"$cuda/lib64" -L"$cuda/lib64/stubs" -lucp -lucs -lcudart -lcuda 2>"$out/ucp_check.build.log"; then
    for tls in default gdr; do
      envs=-; [ $tls = gdr ] && envs="UCX_TLS=sm,cuda_copy,gdr_copy"
      for w in "gdr gdr" "gdr none" "none none"; do
        set -- $w
        next_port
        tag="data-$tls-$1-$2"
        if run_pair "$tag.log" "$1" "$2" "$envs" "$out/ucp_check" server $port -- "$out/ucp_check" client $port; then
          ok "ucp_check ($tls transports; under gdr run: server ${1/none/no}, client ${2/none/no}): $(tail -1 "$out/$tag.log")"
        else
          bad "ucp_check ($tls transports; under gdr run: server ${1/none/no}, client ${2/none/no}): see $out/$tag.log"
          grep -hE 'FAIL|ucp_check:|error' "$out/$tag.log" "$out/$tag.log.server" | head -5 | sed 's/^/  | /'
        fi
      done
    done
  else
    bad "ucp_check does not build: $(head -3 "$out/ucp_check.build.log")"
  fi
fi

# p50 of a tag_lat pair's client log (ucx_perftest's `typical` latency column), or "failed".
typical() {
  awk '/Final:/ {v = $3} END {if (v == "") print "failed"; else print v}' "$1"
}

if want lat; then
  sizes=${GDR_UCX_SIZES:-8 64 1024 2048 4096 8192 16384 32768 65536 262144 1048576 4194304}
  setups=(plain nogdr run runucx)
  : >"$out/lat.tsv"
  # Rounds over all sizes and setups, alternated; each figure is the median of its rounds.
  for round in $(seq "${GDR_UCX_ROUNDS:-2}"); do
  for s in $sizes; do
    n=5000; w=500
    [ "$s" -ge 65536 ] && { n=2000; w=200; }
    [ "$s" -ge 1048576 ] && { n=500; w=50; }
    for st in "${setups[@]}"; do
      case $st in
        plain) wrap=none; envs=- ;;
        nogdr) wrap=none; envs="UCX_TLS=^gdr_copy" ;;
        run) wrap=gdr; envs=- ;;
        runucx) wrap=gdr; envs=${ucx_env:--} ;;
      esac
      next_port
      run_pair "lat-$st-$s-$round.log" $wrap $wrap "$envs" "$ucx/bin/ucx_perftest" -p $port -- \
        "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t tag_lat -m cuda -s "$s" -n $n -w $w
      echo -e "$s\t$st\t$(typical "$out/lat-$st-$s-$round.log")" >>"$out/lat.tsv"
    done
  done
  done
  python3 - "$out" "$here" <<'EOF'
import json, sys
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from lat_medians import load
# A setup that failed in any round counts as failed; else the median of its rounds.
runs, rows = load(f"{out}/lat.tsv")
names = {"plain": "not under gdr run", "nogdr": "not under gdr run, UCX_TLS=^gdr_copy",
         "run": "gdr run", "runucx": "gdr run --ucx"}
with open(f"{out}/ucx.md", "a") as f:
    f.write("\nucx_perftest tag_lat -m cuda, two processes, UCX's default transports, p50 (us):\n\n")
    f.write("| size | " + " | ".join(names.values()) + " | gdr run / absent | --ucx / absent |\n")
    f.write("|---|---|---|---|---|---|---|\n")
    for s, r in rows.items():
        cell = lambda k: "failed" if r.get(k) is None else f"{r[k]:.2f}"
        ratio = lambda k: (f"{r[k] / r['nogdr']:.2f}" if r.get(k) and r.get("nogdr") else "")
        f.write(f"| {s} | " + " | ".join(cell(k) for k in names) + f" | {ratio('run')} | {ratio('runucx')} |\n")
    f.write(f"\nEach figure: the median of {len(next(iter(runs.values()))['plain'])} alternated rounds.\n")
json.dump({"tag_lat_p50_us": {str(s): r for s, r in rows.items()},
           "rounds": {str(s): r for s, r in runs.items()}}, open(f"{out}/ucx-lat.json", "w"), indent=1)
EOF
  # No harm: every setup ran at every size; not under gdr run equals gdr absent (5%); gdr run
  # is nowhere slower than gdr absent (5%).
  res=$(python3 - "$out" <<'EOF'
import json, sys
r = json.load(open(f"{sys.argv[1]}/ucx-lat.json"))["tag_lat_p50_us"]
bad = []
for s, v in r.items():
    for k in ("plain", "nogdr", "run", "runucx"):
        if v.get(k) is None:
            bad.append(f"{k} failed at {s} B")
    if v.get("plain") and v.get("nogdr") and v["plain"] > 1.05 * v["nogdr"]:
        bad.append(f"not under gdr run {v['plain']} vs {v['nogdr']} us at {s} B")
    for k in ("run", "runucx"):
        if v.get(k) and v.get("nogdr") and v[k] > 1.05 * v["nogdr"]:
            bad.append(f"{k} {v[k]} vs {v['nogdr']} us at {s} B")
print("; ".join(bad))
EOF
)
  if [ -z "$res" ]; then ok "tag_lat: no setup failed, none slower than gdr absent (5%)"; else bad "tag_lat: $res"; fi
fi

if want proto; then
  for st in run nogdr; do
    wrap=gdr; envs="UCX_PROTO_INFO=y"
    [ $st = nogdr ] && { wrap=none; envs="UCX_PROTO_INFO=y UCX_TLS=^gdr_copy"; }
    next_port
    run_pair "proto-$st.log" $wrap $wrap "$envs" "$ucx/bin/ucx_perftest" -p $port -- \
      "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t tag_lat -m cuda -s 4096 -n 100 -w 10
  done
  echo "proto: UCX_PROTO_INFO tables in $out/proto-*.log"
fi

if want sweep; then
  # One setting at a time under gdr run, sizes 2-64 KiB, beside plain gdr run in the same loop.
  : >"$out/sweep.tsv"
  IFS=';' read -r -a settings <<<"${GDR_UCX_SWEEP:-}"
  for s in ${GDR_UCX_SWEEP_SIZES:-2048 8192 16384 65536}; do
    for cfg in - "${settings[@]}"; do
      next_port
      tag=$(echo "$cfg" | tr -c 'A-Za-z0-9=_\n' '_' | cut -c1-80)
      run_pair "sweep-$tag-$s.log" gdr gdr "$cfg" "$ucx/bin/ucx_perftest" -p $port -- \
        "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t tag_lat -m cuda -s "$s" -n 5000 -w 500
      echo -e "$s\t$cfg\t$(typical "$out/sweep-$tag-$s.log")" >>"$out/sweep.tsv"
    done
  done
  cat "$out/sweep.tsv"
fi
if want calls; then
  # Which driver calls UCX makes per message, and their time, with the driver's memory (gdr
  # absent) and with the allocator's (gdr run): scripts/clients/cucount.c, preloaded ahead of
  # the allocator so that the allocator's own answers are timed too.
  alloc=$("$gdr" run -q -- printenv LD_PRELOAD | cut -d: -f1)
  if cc -O2 -shared -fPIC "$here/clients/cucount.c" -o "$out/libcucount.so" -ldl 2>"$out/cucount.build.log"; then
    : >"$out/calls.tsv"
    for s in ${GDR_UCX_CALL_SIZES:-4096 1048576}; do
      n=2000
      for st in nogdr run; do
        d="$out/calls-$st-$s"; rm -rf "$d"; mkdir -p "$d"
        pre="$out/libcucount.so"; envs="${GDR_UCX_CALL_ENV:-} CUCOUNT_OUT=$d UCX_TLS=^gdr_copy"
        [ $st = run ] && { pre="$pre:$alloc"; envs="${GDR_UCX_CALL_ENV:-} CUCOUNT_OUT=$d"; }
        next_port
        run_pair "calls-$st-$s.log" none none "$envs LD_PRELOAD=$pre" "$ucx/bin/ucx_perftest" -p $port -- \
          "$ucx/bin/ucx_perftest" 127.0.0.1 -p $port -t tag_lat -m cuda -s "$s" -n $n -w 0
        echo -e "$s\t$st\t$(typical "$out/calls-$st-$s.log")\t$d\t$n" >>"$out/calls.tsv"
      done
    done
    python3 - "$out" "${GDR_UCX_CALL_ENV:-}" <<'EOF'
import glob, sys
out = sys.argv[1]
rows = [l.split("\t") for l in open(f"{out}/calls.tsv").read().splitlines()]
extra = f" ({sys.argv[2]})" if sys.argv[2].strip() else ""
with open(f"{out}/ucx.md", "a") as md:
    for size in dict.fromkeys(r[0] for r in rows):
        table, lat = {}, {}
        for s, st, p50, d, n in rows:
            if s != size:
                continue
            lat[st] = p50
            for f in glob.glob(f"{d}/cucount.*"):
                lines = open(f).read().splitlines()
                role = "client" if "127.0.0.1" in lines[0] else "server"
                for l in lines[1:]:
                    name, calls, ns = l.split()
                    table.setdefault(name, {})[(st, role)] = (int(calls) / int(n), int(ns) / int(calls) / 1000)
        md.write(f"\nDriver calls per iteration of tag_lat at {size} B{extra}, as calls (us per call); "
                 f"p50 gdr absent {lat.get('nogdr')} us, gdr run {lat.get('run')} us:\n\n")
        cols = [(st, role) for role in ("server", "client") for st in ("nogdr", "run")]
        md.write("| function | " + " | ".join(f"{role}, {'gdr absent' if st == 'nogdr' else 'gdr run'}" for st, role in cols) + " |\n")
        md.write("|---" * (len(cols) + 1) + "|\n")
        for name, v in sorted(table.items()):
            cell = lambda k: f"{v[k][0]:.2f} ({v[k][1]:.2f})" if k in v else "-"
            md.write(f"| {name} | " + " | ".join(cell(k) for k in cols) + " |\n")
        absent = {k[0] for v in table.get("cuMemcpyAsync", {}) for k in [v]}
        ipc = {k[0] for v in table.get("cuMemcpyDtoDAsync_v2", {}) for k in [v]}
        if "nogdr" in absent and "nogdr" not in ipc:
            md.write("\nNote: gdr absent, UCX copied through host memory (cuMemcpyAsync), not "
                     "cuda_ipc: with the counting preload it does not share the driver's memory "
                     "(cause not found), so those columns are no baseline.\n")
EOF
    ok "calls: driver calls per message in $out/ucx.md"
  else
    bad "cucount does not build: $(head -3 "$out/cucount.build.log")"
  fi
fi
[ -f "$out/ucx.md" ] && cat "$out/ucx.md"
echo "ucx-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
