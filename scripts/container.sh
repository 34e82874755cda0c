#!/usr/bin/env bash
# Builds and runs gdr's image (containers/Containerfile; docs/containers.md).
#
# Usage: scripts/container.sh build [BUILD OPTIONS...]   the image, tagged $GDR_IMAGE (gdr)
#        scripts/container.sh run [RUN OPTIONS...] [-- CMD...]
#                                               CMD (default: gdr check) in it, with every GPU
# The tool is $CONTAINER_TOOL, else the first of podman, docker and buildah found (buildah
# builds only). Build options go to the tool as they are, e.g. other bases:
#   --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04
#   --build-arg RUST_IMAGE=rust:1.95-bookworm
# or, where the tool cannot start a container of its own (buildah/podman): --isolation chroot.
# `run` asks for the GPUs the way the tool does (docker: --gpus all; podman: the CDI device
# nvidia.com/gpu=all, which `nvidia-ctk cdi generate` describes) with graphics among the
# driver capabilities, which the Vulkan ICD needs.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${GDR_IMAGE:-gdr}
tool=${CONTAINER_TOOL:-}
if [ -z "$tool" ]; then
  for t in podman docker buildah; do
    if command -v $t >/dev/null; then tool=$t; break; fi
  done
fi
[ -n "$tool" ] || { echo "container.sh: no podman, docker or buildah here" >&2; exit 2; }
what=${1:-}
[ $# -gt 0 ] && shift
case $what in
  build)
    exec "$tool" build -f containers/Containerfile -t "$image" "$@" .
    ;;
  run)
    opts=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    case $tool in
      docker) gpus=(--gpus all) ;;
      podman) gpus=(--device nvidia.com/gpu=all) ;;
      *) echo "container.sh: $tool cannot run containers; use podman or docker" >&2; exit 2 ;;
    esac
    exec "$tool" run --rm "${gpus[@]}" \
      -e NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics "${opts[@]}" "$image" "$@"
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    [ "$what" = -h ] || [ "$what" = --help ]
    ;;
esac
