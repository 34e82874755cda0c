#!/usr/bin/env bash
# Builds the release CLI and release test binaries into one folder that runs on a GPU host with
# no Rust toolchain. Usage: scripts/bundle.sh [DIR]   (default: bundle/)
# Then on the GPU host: DIR/run.sh OUTDIR   (runs every test with GDR_REQUIRE_GPU=1, then the
# benchmarks, writing logs and JSON into OUTDIR).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bundle}
rm -rf "$out"; mkdir -p "$out/tests"
# The CLI at the path cargo reports (its target directory may be CARGO_TARGET_DIR, not ./target).
cargo build --release -p gdr-cli --message-format=json |
  python3 -c '
import json, sys, shutil
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gdr" and m.get("executable")]
if not exe:
    sys.exit("bundle.sh: cargo built no gdr executable")
shutil.copy(exe[-1], sys.argv[1])
' "$out/gdr"
# libgdrapi and libgdr_alloc staged as they install under /usr/local (run.sh copies them there
# and runs ldconfig), with the C test programs' sources, built on the GPU host against the
# installed libraries.
bash scripts/install-capi.sh --prefix /usr/local --destdir "$out/capi/root"
mkdir -p "$out/capi/c" && cp crates/gdr-capi/tests/c/*.c "$out/capi/c/"
cp scripts/capi-check.sh "$out/capi/check.sh"
mkdir -p "$out/clients" && cp scripts/clients/*.py scripts/clients/*.c "$out/clients/"
cargo test --release --workspace --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil, os, collections
out = sys.argv[1]
bins = []
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        t = m["target"]
        name = t["name"] if "lib" not in t["kind"] else t["name"] + "-lib"
        crate = os.path.basename(os.path.dirname(os.path.dirname(t["src_path"])))
        # These build C from the source tree: the bundle runs capi/check.sh and alloc-gpu.sh
        # instead.
        if name in ("c_programs", "passthrough"):
            continue
        bins.append((name, crate, m["executable"]))
# Two crates may have a test file of the same name (cuda_sources): those get the crate in front.
count = collections.Counter(n for n, _, _ in bins)
for name, crate, exe in bins:
    shutil.copy(exe, os.path.join(out, "tests", name if count[name] == 1 else crate + "-" + name))
' "$out"
strip "$out/gdr" "$out"/tests/* 2>/dev/null || true
cp scripts/run-gpu.sh "$out/run.sh"
cp scripts/serve-bench.sh "$out/serve-bench.sh"
cp scripts/two-gpu.sh "$out/two-gpu.sh"
cp scripts/compare-gdr.sh "$out/compare-gdr.sh"
cp scripts/lanes.sh "$out/lanes.sh"
cp scripts/ucx-gpu.sh scripts/ucxx-gpu.sh scripts/mpi-gpu.sh scripts/lat_medians.py "$out/"
# gdr's allocator on the GPU host: the CUDA programs (built there with nvcc) and the scripts.
mkdir -p "$out/alloc"
cp crates/gdr-alloc-preload/tests/gpu/alloc_check.cu crates/gdr-alloc-preload/bench/alloc_bench.cu "$out/alloc/"
cp scripts/alloc-gpu.sh "$out/alloc-gpu.sh"
# Many ranks, faults and the soak (clients/rank_check.c and torch_pin_loop.py come with clients/).
cp scripts/rank-lib.sh scripts/rank_report.py scripts/ranks-gpu.sh scripts/soak.sh scripts/faults-gpu.sh "$out/"
cp scripts/outside-gpu.sh "$out/outside-gpu.sh"
mkdir -p "$out/fixtures" && cp -a crates/gdr-pci/tests/fixtures/topo "$out/fixtures/"
[ -d .gl ] && { mkdir -p "$out/gl"; cp .gl/*.deb "$out/gl/"; }
# bubblewrap and its libraries for the sandbox part, apart from gl/*.deb (which run.sh unpacks
# into / when the Vulkan loader is missing): sandbox-gpu.sh unpacks them into a folder of its own.
cp scripts/sandbox-gpu.sh "$out/sandbox-gpu.sh"
[ -d .gl/sandbox ] && { mkdir -p "$out/gl/sandbox"; cp .gl/sandbox/*.deb "$out/gl/sandbox/"; }
# The Python package: its wheel (with libgdr_alloc inside), its tests, the benchmark beside
# vkgdr and the wheels the GPU host cannot download (scripts/python-bundle.sh).
bash scripts/python-bundle.sh "$out/python"
echo "bundle in $out: $(ls "$out/tests" | wc -l) test binaries, $(du -sh "$out" | cut -f1)"
