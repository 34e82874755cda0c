#!/usr/bin/env bash
# Runs in a bundle folder on a GPU host: every test binary with GDR_REQUIRE_GPU=1, then the
# tools and benchmarks. Usage: run.sh OUTDIR [--tests-only]. Logs and JSON go to OUTDIR; a summary is printed.
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
export GDR_REQUIRE_GPU=1
export GDR_TOPO_FIXTURES="$here/fixtures/topo"
pass=0; fail=0
for t in "$here"/tests/*; do
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
    if timeout 300 "$@" >"$out/$n" 2>"$out/$n.err"; then pass=$((pass+1)); echo "bench $n: ok"; else fail=$((fail+1)); echo "bench $n: FAILED ($(tail -1 "$out/$n.err"))"; fi
  }
  bench info.json "$g" info --json
  bench sanity.txt "$g" sanity
  bench copylat.json "$g" copylat --max-size 256M --json --plot "$out/copylat.svg"
  bench copybw.json "$g" copybw --json --plot "$out/copybw.svg"
  bench pplat.json "$g" pplat --json
  bench mq.json "$g" mq bench --json
  bench apiperf.json "$g" apiperf --json
  bench gdrapi_test.txt "$here/capi/gdrapi_test"
  # The network server against its host-centric baseline (writes $out/serve/summary.json).
  if timeout 300 bash "$here/serve-bench.sh" "$out/serve" "$g" >"$out/serve.log" 2>&1; then
    pass=$((pass+1)); echo "bench serve: ok"
  else
    fail=$((fail+1)); echo "bench serve: FAILED ($(tail -1 "$out/serve.log"))"
  fi
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
