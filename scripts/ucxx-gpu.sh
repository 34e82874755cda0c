#!/usr/bin/env bash
# UCXX (UCX's Python/C++ binding, from PyPI) with gdr on a GPU host: CuPy arrays sent between
# two processes by UCXX's own benchmark (`python -m ucxx.benchmarks.send_recv`, unmodified),
# through a UCX built with gdr_copy (docs/ucx.md).
# Usage: ucxx-gpu.sh UCX SITE OUTDIR [EXTRA]
#   UCX    a UCX install folder built --with-cuda --with-gdrcopy (lib/libucp.so ...), as for
#          ucx-gpu.sh
#   SITE   a folder holding the unpacked ucxx-cu13/-cu12, libucxx, librmm, rmm and
#          rapids_logger wheels and libucx's Python files (its libraries are not needed:
#          RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true loads UCX's)
#   EXTRA  a folder with UCXX's other dependencies (cuda-core, cuda-bindings, nvidia-ml-py),
#          used only when the host's Python lacks them
# Sizes GDR_UCXX_SIZES (default 8 B, 1, 4, 16 and 64 KiB, 1 MiB), rounds GDR_UCXX_ROUNDS
# (default 2, alternated, medians), iterations GDR_UCXX_ITERS (default 2000). Setups per size:
# gdr absent (not under gdr run, UCX_TLS=^gdr_copy), gdr run without gdr_copy, gdr run, gdr run
# --ucx. Nearly all of a run's time is the start-up of the benchmark's two Python processes,
# so the defaults (48 runs) take most of a 10-minute device call: give the part a call, or a
# lanes.sh lane with nothing after it, of its own (docs/results/2026-11-28-bundle.md has the
# times).
# GDR_UCXX_SERVER_GPU / GDR_UCXX_CLIENT_GPU: the two processes' GPUs (default 0 and 0).
# GDR_UCXX_TIMEOUT bounds each run (default 120 s); a run past it counts as failed, and its
# processes are killed.
# Needs libgdrapi and libgdr_alloc installed (bundle/run.sh installs them), CuPy and NumPy 2.
# Table in OUTDIR/ucxx.md; the last line is `ucxx-gpu: N passed, M failed`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: ucxx-gpu.sh UCX SITE OUTDIR [EXTRA]"
ucx=$(cd "${1:?$usage}" && pwd)
site=$(cd "${2:?$usage}" && pwd)
out=${3:?$usage}
extra=${4:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
gdr=${GDR_BIN:-$here/gdr}
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=$ucx/lib:/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY=true
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
unset UCX_TLS
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
if ! python3 -c 'import cuda.core, pynvml' 2>/dev/null && [ -n "$extra" ]; then
  # After the site: the host's own copies, where it has them, stay first.
  extra=$(cd "$extra" && pwd)
  export PYTHONPATH=$PYTHONPATH:$extra
fi

# UCXX loads this UCX, with gdr_copy, under gdr run.
check='import ucxx
ucxx.init()
libs = {l.split()[-1] for l in open("/proc/self/maps") if ".so" in l}
print("ucx", ucxx.__ucx_version__, "ucxx", ucxx.__version__)
print("\n".join(sorted(l for l in libs if "libucp" in l or "gdrcopy" in l or "gdr_alloc" in l)))'
timeout 120 "$gdr" run -q -- python3 -c "$check" >"$out/load.log" 2>&1
if grep -q "^$ucx/lib/libucp.so" "$out/load.log" && grep -q "libuct_cuda_gdrcopy" "$out/load.log"; then
  ok "UCXX $(grep -o 'ucxx [0-9.]*' "$out/load.log") loads $ucx's UCX and its gdr_copy module under gdr run"
else
  bad "UCXX does not load $ucx's UCX with gdr_copy: $(tail -3 "$out/load.log" | tr '\n' ' ')"
fi

ucx_env=$(comm -13 <(env | sort) <("$gdr" run -q --ucx -- env | sort) | grep -E '^UCX_' | tr '\n' ' ')
: >"$out/lat.tsv"
for round in $(seq "${GDR_UCXX_ROUNDS:-2}"); do
  for s in ${GDR_UCXX_SIZES:-8 1024 4096 16384 65536 1048576}; do
    for st in absent run-nogdrcopy run runucx; do
      pre=("$gdr" run -q --); envs=()
      case $st in
        absent) pre=(); envs=(UCX_TLS=^gdr_copy) ;;
        run-nogdrcopy) envs=(UCX_TLS=^gdr_copy) ;;
        runucx) read -r -a envs <<<"$ucx_env" ;;
      esac
      log="$out/lat-$st-$s-$round.log"
      tag="ucxx-gpu-$$-$st-$s-$round"
      env GDR_UCXX_TAG="$tag" ${envs[@]+"${envs[@]}"} timeout "${GDR_UCXX_TIMEOUT:-120}" ${pre[@]+"${pre[@]}"} python3 -m ucxx.benchmarks.send_recv \
        -o cupy --backend ucxx-core --reuse-alloc -s 127.0.0.1 -n "$s" \
        --n-iter "${GDR_UCXX_ITERS:-2000}" --n-warmup-iter 200 --no-detailed-report \
        -d "${GDR_UCXX_SERVER_GPU:-0}" -e "${GDR_UCXX_CLIENT_GPU:-0}" >"$log" 2>&1
      # A run past its bound leaves the benchmark's spawned server and client behind: they
      # carry this run's tag in their environment, so only they are killed.
      for e in /proc/[0-9]*/environ; do
        grep -qz "^GDR_UCXX_TAG=$tag\$" "$e" 2>/dev/null || continue
        p=${e#/proc/}; kill -9 "${p%/environ}" 2>/dev/null
      done
      # `Latency (median)  12345 ns`
      v=$(awk '/Latency \(median\)/ {print $(NF-1) / 1000}' "$log")
      echo -e "$s\t$st\t${v:-failed}" >>"$out/lat.tsv"
    done
  done
done
res=$(python3 - "$out" "$here" <<'EOF'
import sys
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from lat_medians import load
runs, rows = load(f"{out}/lat.tsv")
names = {"absent": "gdr absent", "run-nogdrcopy": "gdr run, UCX_TLS=^gdr_copy",
         "run": "gdr run", "runucx": "gdr run --ucx"}
bad = []
with open(f"{out}/ucxx.md", "w") as f:
    f.write("UCXX send_recv (ucxx-core backend, CuPy arrays, --reuse-alloc), two processes, "
            "median one-way latency (us):\n\n")
    f.write("| size | " + " | ".join(names.values()) + " | gdr run / absent | --ucx / absent |\n")
    f.write("|---" * 7 + "|\n")
    for s, r in rows.items():
        cell = lambda k: "failed" if r.get(k) is None else f"{r[k]:.1f}"
        ratio = lambda k: f"{r[k] / r['absent']:.2f}" if r.get(k) and r.get("absent") else ""
        f.write(f"| {s} | " + " | ".join(cell(k) for k in names) +
                f" | {ratio('run')} | {ratio('runucx')} |\n")
        bad += [f"{k} failed at {s} B" for k in names if r.get(k) is None]
    f.write(f"\nEach figure: the median of {len(next(iter(runs.values()))['absent'])} "
            "alternated rounds.\n")
print("; ".join(bad))
EOF
)
if [ -z "$res" ]; then ok "UCXX send_recv ran in every setup at every size"; else bad "UCXX send_recv: $res"; fi
cat "$out/ucxx.md"
echo "ucxx-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
