#!/usr/bin/env bash
# The project's test command (README.md): every test that runs without a GPU.
# GPU tests print `skipped: no GPU` here; set GDR_REQUIRE_GPU=1 to make them fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
bash scripts/qemu-dma-test.sh
