#!/usr/bin/env bash
# The Python part of the bundle (scripts/bundle.sh), into DIR: gdr's wheel (one abi3 wheel for
# CPython 3.10+, manylinux2014 x86-64: maturin links with zig so that this machine's newer glibc
# does not leak into it), with gdr's allocator library (libgdr_alloc.so) inside when
# crates/gdr-alloc-preload builds; the package's tests; the benchmark beside vkgdr and the
# measure of a call's cost (bench/call_cost.py, which a test runs); and the
# wheels of .whl/ (scripts/python-wheels.sh: vkgdr, cffi, pycparser, pytest).
# Usage: scripts/python-bundle.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:?usage: python-bundle.sh DIR}
mkdir -p "$dest"
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
# maturin and zig, from PyPI, in a venv of their own kept in the target directory.
tools=$target/python-tools
if ! "$tools/bin/python" -c 'import ziglang' 2>/dev/null || [ ! -x "$tools/bin/maturin" ]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet "maturin>=1.9,<2" ziglang
fi
pkg=crates/gdr-python/python/gdr
staged=
cleanup() { if [ -n "$staged" ]; then rm -f "$staged"; fi; }
trap cleanup EXIT
rm -f "$dest/with-allocator"
if [ -f crates/gdr-alloc-preload/Cargo.toml ]; then
  if so=$(cargo build --release -p gdr-alloc-preload --message-format=json |
    python3 -c '
import json, sys
files = [f for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact"
         for f in m.get("filenames", []) if f.endswith("/libgdr_alloc_preload.so")]
print(files[-1] if files else "")
') && [ -n "$so" ]; then
    # cargo names the file after the crate's Rust name; the package carries it under the
    # library's public name (its soname, libgdr_alloc.so.0, is the same either way).
    cp "$so" "$pkg/libgdr_alloc.so"
    staged=$pkg/libgdr_alloc.so
    echo "python-bundle: the wheel carries $so"
  else
    echo "python-bundle: warning: gdr-alloc-preload did not build; the wheel goes without libgdr_alloc.so"
  fi
fi
rm -f "$dest"/gdr-*.whl
# A target folder of its own: zig-linked artifacts would otherwise displace the release build
# of the rest of the bundle (and be rebuilt from scratch each time).
CARGO_TARGET_DIR=$target/python-wheel PATH="$tools/bin:$PATH" \
  maturin build --release --zig --compatibility manylinux2014 \
  --manifest-path crates/gdr-python/Cargo.toml --out "$dest"
if [ -n "$staged" ]; then touch "$dest/with-allocator"; fi
rm -rf "$dest/tests"
mkdir -p "$dest/tests/include"
cp crates/gdr-python/tests/*.py "$dest/tests/"
for h in crates/gdr-alloc-preload/include/gdr_alloc.h crates/gdr-alloc/include/gdr_alloc.h; do
  if [ -f "$h" ]; then cp "$h" "$dest/tests/include/"; break; fi
done
cp crates/gdr-python/bench/bench_vkgdr.py "$dest/"
# call_cost.py where the tests look for it (tests/../bench), for test_call_cost.py.
mkdir -p "$dest/bench" && cp crates/gdr-python/bench/call_cost.py "$dest/bench/"
mkdir -p "$dest/wheels"
if ls .whl/*.whl >/dev/null 2>&1; then
  cp .whl/*.whl "$dest/wheels/"
else
  echo "python-bundle: warning: .whl/ is empty (run scripts/python-wheels.sh): no vkgdr, no pytest"
fi
echo "python-bundle: $(ls "$dest"/gdr-*.whl) and $(ls "$dest/wheels" | wc -l) other wheels"
