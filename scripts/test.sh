#!/usr/bin/env bash
# The project's test command (README.md): every test that runs without a GPU.
# GPU tests print `skipped: no GPU` here; set GDR_REQUIRE_GPU=1 to make them fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# libgdrapi installed the way users install it (cargo cinstall), and C programs built against it
# with pkg-config, as C99 and C++11 (without a GPU the GPU programs report skipped).
command -v pkg-config >/dev/null || { apt-get update && apt-get install -y pkgconf; }
capi=$(mktemp -d)
trap 'rm -rf "$capi"' EXIT
bash scripts/install-capi.sh --prefix "$capi/prefix"
PKG_CONFIG_PATH="$capi/prefix/lib/pkgconfig" bash scripts/capi-check.sh crates/gdr-capi/tests/c "$capi/build"
bash scripts/qemu-dma-test.sh
