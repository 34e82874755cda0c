#!/usr/bin/env bash
# The Python package as users install it, then its tests: a fresh virtual environment,
# `pip install ./crates/gdr-python[test]` (maturin builds the extension from this workspace;
# pip fetches maturin, pytest and NumPy from PyPI), `import gdr` from outside the source tree,
# then pytest on crates/gdr-python/tests. Without a GPU the GPU tests skip (GDR_REQUIRE_GPU=1
# makes them fail); every skip goes to $GDR_SKIP_LOG when it is set (scripts/test.sh counts them).
# Usage: scripts/python-test.sh [VENV_DIR]   (default: a temporary directory, removed after)
# The last line is pytest's summary (`N passed, M skipped in S s`); exit status pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ -n "${1:-}" ]; then
  venv=$1
else
  venv=$(mktemp -d)/venv
  trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
py=${PYTHON:-python3}
"$py" -m venv "$venv" || { echo "python-test: cannot make a virtual environment with $py"; exit 1; }
"$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
echo "python-test: pip install ./crates/gdr-python[test] into a fresh virtual environment" \
  "(network: maturin, pytest and NumPy from PyPI; the extension compiles, about a minute)"
if ! "$venv/bin/python" -m pip install --quiet "./crates/gdr-python[test]"; then
  echo "python-test: pip install ./crates/gdr-python failed"
  exit 1
fi
# Imports anywhere, with no GPU, CUDA or Vulkan: from a directory outside the source tree.
if ! (cd / && "$venv/bin/python" -c 'import gdr, gdr.torch, gdr.cupy, gdr.allocator; print("python-test: import gdr", gdr.__version__, "ok")'); then
  echo "python-test: import gdr failed"
  exit 1
fi
cd "$root/crates/gdr-python" && "$venv/bin/python" -m pytest -q tests
