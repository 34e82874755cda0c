#!/usr/bin/env bash
# Runs in a bundle folder on a GPU host: every test binary with GDR_REQUIRE_GPU=1, then the
# tools and benchmarks. Usage: run.sh OUTDIR [--tests-only]. Logs and JSON go to OUTDIR; a summary is printed.
# ONLY="tests capi clients apiperf ..." runs just the named parts (names: tests, info, sanity,
# copylat, copybw, ccopies, storebw, pplat, mq, apiperf, capi, clients, alloc, ranks, faults,
# outside, ucx, ucxx, mpi, python, sandbox, serve; soak runs only when ONLY names it). `ccopies` times
# libgdrapi's copies against the Rust auto copier on one allocation (copylat 8 B-64 KiB and copybw with --capi-memory allocated); `storebw` is the CPU->GPU
# write-ceiling experiment. `alloc` is
# alloc-gpu.sh (gdr's allocator: C checks, its cost, PyTorch and CuPy under `gdr run`);
# `outside` is outside-gpu.sh on the folder OUTSIDE names (gdrcopy's and UCX's programs, built
# outside the repository), run only when OUTSIDE is set; `ucx` (ucx-gpu.sh: no harm, bytes
# intact, tag latency by size), `ucxx` (ucxx-gpu.sh: UCXX's send_recv benchmark with CuPy arrays)
# and `mpi` (mpi-gpu.sh: the OSU benchmarks through Open MPI) take OUTSIDE/ucx, OUTSIDE/ucxx,
# OUTSIDE/ompi and OUTSIDE/osu, and run only when those exist. `ranks` (ranks-gpu.sh: 8 and 32
# rank_check processes at once under `gdr run`; first-allocation time, device memory and BAR1 per
# process), `faults` (faults-gpu.sh: kill -9 mid-copy, out of device memory, fork while mapped,
# dlclose of libgdrapi while mapped) and `soak` (soak.sh: SOAK_MINUTES, default 8, of 8 x 4
# threads of rank_check and 2 PyTorch processes pinning tensors, sampled every 10 s) use
# clients/rank_check.c. The soak is not in the
# default set, since it alone takes most of a 10-minute call: ONLY=soak runs it. `sandbox`
# (sandbox-gpu.sh: bubblewrap, the host's or gl/sandbox's .deb, as an unprivileged user with no
# capabilities, a read-only root and only the GPU's device nodes; inside, `gdr check`, libgdrapi's
# C programs, a cudaMalloc program under `gdr run`, the Python tests, and the messages for a
# missing ICD, a missing /dev/nvidia-uvm and a read-only HOME; docs/containers.md).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUTDIR}
mkdir -p "$out"
# The Vulkan loader is often missing on compute-only hosts: unpack the carried packages.
if ! ldconfig -p | grep -q libvulkan.so.1 && [ -d "$here/gl" ]; then
  for f in "$here"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$icd}
# libgdrapi and libgdr_alloc installed as a user installs them (into /usr/local, then
# ldconfig), unless GDR_RUN_INSTALLED=1 says it is done (lanes.sh installs once, then starts
# several run.sh at once); pkg-config for the C programs built against them, from the carried
# packages when the host has none.
if [ "${GDR_RUN_INSTALLED:-}" != 1 ]; then
  cp -a "$here/capi/root/usr/local/." /usr/local/ && ldconfig
fi
if ! command -v pkg-config >/dev/null && [ -d "$here/gl" ]; then
  for f in "$here"/gl/pkgconf*.deb "$here"/gl/libpkgconf3*.deb; do dpkg -x "$f" /; done; ldconfig
fi
export GDR_REQUIRE_GPU=1
export GDR_TOPO_FIXTURES="$here/fixtures/topo"
# The CLI tests (tests/cli) run the bundled gdr, not the build machine's path baked into them.
export GDR_BIN="$here/gdr"
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
pass=0; fail=0
want tests && for t in "$here"/tests/*; do
  n=$(basename "$t")
  # Bounded: a test that hangs fails here instead of eating the whole run.
  if timeout "${TEST_TIMEOUT:-240}" "$t" --test-threads=1 --nocapture >"$out/test-$n.log" 2>&1; then pass=$((pass+1)); r=ok; else fail=$((fail+1)); r=FAILED; fi
  echo "test $n: $r ($(grep -E '^test result' "$out/test-$n.log" | tail -1))"
done
# The tools and benchmarks, unless --tests-only.
if [ "${2:-}" != "--tests-only" ]; then
  g="$here/gdr"
  bench() { # name, command...
    local n=$1; shift
    if timeout "${T:-300}" "$@" >"$out/$n" 2>"$out/$n.err"; then pass=$((pass+1)); echo "bench $n: ok"; else fail=$((fail+1)); echo "bench $n: FAILED ($(tail -1 "$out/$n.err"))"; fi
  }
  want info && bench info.json "$g" info --json
  want sanity && bench sanity.txt "$g" sanity
  want copylat && bench copylat.json "$g" copylat --max-size 256M --json --plot "$out/copylat.svg"
  want copybw && bench copybw.json "$g" copybw --json --plot "$out/copybw.svg"
  want ccopies && bench ccopies-copylat.json "$g" copylat --min-size 8 --max-size 64K \
    --budget-ms 200 --capi-memory allocated --json
  want ccopies && bench ccopies-copybw.json "$g" copybw --budget-ms 1000 --capi-memory allocated --json
  want storebw && bench storebw.json "$g" storebw --json
  want pplat && bench pplat.json "$g" pplat --json
  want mq && bench mq.json "$g" mq bench --json
  want apiperf && bench apiperf.json "$g" apiperf --json
  # libgdrapi: C programs built with pkg-config against the installed library, then real
  # clients (NCCL through torch.distributed, PyTorch tensors through ctypes).
  want capi && bench capi-check.txt bash "$here/capi/check.sh" "$here/capi/c" "$out/capi-build"
  want clients && bench torch_gdrapi.txt python3 "$here/clients/torch_gdrapi.py"
  want clients && bench nccl_gdrcopy.txt python3 "$here/clients/nccl_gdrcopy.py" --out "$out/nccl"
  # The same with the system's NCCL (another version than torch's), when the host has one.
  sys_nccl=/usr/lib/x86_64-linux-gnu/libnccl.so.2
  want clients && [ -f "$sys_nccl" ] && bench nccl_system.txt env LD_PRELOAD="$sys_nccl" \
    python3 "$here/clients/nccl_gdrcopy.py" --out "$out/nccl-system"
  # gdr's allocator, then programs written elsewhere under it.
  want alloc && T=900 bench alloc.txt bash "$here/alloc-gpu.sh" "$out/alloc"
  # Many processes, faults and the soak: clients/rank_check.c under `gdr run` (rank-lib.sh).
  want ranks && T=600 bench ranks.txt bash "$here/ranks-gpu.sh" "$out/ranks"
  want faults && T=900 bench faults.txt bash "$here/faults-gpu.sh" "$out/faults"
  # A container-like sandbox (bubblewrap) around gdr, its libraries and its Python package.
  want sandbox && T=900 bench sandbox.txt bash "$here/sandbox-gpu.sh" "$out/sandbox"
  if [[ " ${ONLY:-} " == *" soak "* ]]; then
    T=600 bench soak.txt bash "$here/soak.sh" "$out/soak" "${SOAK_MINUTES:-8}"
  fi
  if want outside && [ -n "${OUTSIDE:-}" ]; then
    T=900 bench outside.txt bash "$here/outside-gpu.sh" "$OUTSIDE" "$out/outside"
  fi
  # UCX and MPI over UCX with gdr (docs/ucx.md), on programs built outside the repository.
  if want ucx && [ -d "${OUTSIDE:-/nonexistent}/ucx" ]; then
    T=900 bench ucx.txt bash "$here/ucx-gpu.sh" "$OUTSIDE/ucx" "$out/ucx" "${GDR_UCX_PARTS:-info data lat proto}"
  fi
  # UCXX's own benchmark over that UCX (OUTSIDE/ucxx: the unpacked UCXX wheels; OUTSIDE/ucxx-extra:
  # its other dependencies, for a Python that lacks them).
  if want ucxx && [ -d "${OUTSIDE:-/nonexistent}/ucx" ] && [ -d "$OUTSIDE/ucxx" ]; then
    T=900 bench ucxx.txt bash "$here/ucxx-gpu.sh" "$OUTSIDE/ucx" "$OUTSIDE/ucxx" "$out/ucxx" \
      "$OUTSIDE/ucxx-extra"
  fi
  if want mpi && [ -d "${OUTSIDE:-/nonexistent}/ompi" ] && [ -d "$OUTSIDE/osu" ]; then
    T=900 bench mpi.txt bash "$here/mpi-gpu.sh" "$OUTSIDE/ompi" "$OUTSIDE/ucx" "$OUTSIDE/osu" "$out/mpi" \
      "${MPI_BENCHES:-osu_latency osu_bw osu_bibw}"
  fi
  # The Python package (python/, scripts/python-bundle.sh): its wheel and the carried wheels
  # installed into a folder of their own on PYTHONPATH (the host's NumPy, PyTorch and CuPy stay
  # as they are), its tests with GDR_REQUIRE_GPU=1 (GDR_REQUIRE_ALLOC=1 when the wheel carries
  # libgdr_alloc), then the benchmark beside vkgdr 0.1 with this run's `gdr copylat` figures.
  if want python && [ -d "$here/python" ]; then
    site="$out/python-site"
    rm -rf "$site" && mkdir -p "$site"
    for w in "$here"/python/gdr-*.whl "$here"/python/wheels/*.whl; do
      [ -f "$w" ] || continue
      python3 -m pip install --quiet --no-index --no-deps --target "$site" "$w" 2>/dev/null ||
        python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$site"
    done
    alloc_required=0
    [ -f "$here/python/with-allocator" ] && alloc_required=1
    T=900 bench python-tests.txt env PYTHONPATH="$site" GDR_REQUIRE_ALLOC=$alloc_required \
      python3 -m pytest -q -p no:cacheprovider -rs "$here/python/tests"
    T=900 bench python-bench.txt env PYTHONPATH="$site" \
      python3 "$here/python/bench_vkgdr.py" --gdr "$g" --json "$out/python-bench.json"
  fi
  # The network server against its host-centric baseline (writes $out/serve/summary.json).
  if ! want serve; then :
  elif timeout 570 bash "$here/serve-bench.sh" "$out/serve" "$g" >"$out/serve.log" 2>&1; then
    pass=$((pass+1)); echo "bench serve: ok"
  else
    fail=$((fail+1)); echo "bench serve: FAILED ($(tail -1 "$out/serve.log"))"
  fi
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
