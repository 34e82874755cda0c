#!/usr/bin/env bash
# Downloads the wheels the Python part of the GPU run needs and a GPU host without network
# cannot fetch, into .whl/ (git-ignored; scripts/python-bundle.sh carries them): vkgdr 0.1 and
# its cffi (and pycparser) for the benchmark beside vkgdr, and pytest with its dependencies.
# For CPython 3.12 on manylinux x86-64, the GPU host's Python (PYVER=3.11 etc. for another).
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${PYVER:-3.12}
dl() {
  python3 -m pip download --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$@"
}
dl --no-deps vkgdr==0.1 cffi pycparser
dl pytest
ls .whl
