#!/usr/bin/env bash
# Builds gdr's C test programs against an INSTALLED libgdrapi the way its users do,
# `cc app.c $(pkg-config --cflags --libs gdrapi)`, runs them with nothing else set (no
# LD_LIBRARY_PATH), and checks that the unversioned name NCCL dlopens resolves.
# Usage: scripts/capi-check.sh SRC_DIR [BUILD_DIR]
#   SRC_DIR: the C sources (crates/gdr-capi/tests/c, or capi/c in a bundle)
#   pkg-config must find gdrapi.pc (set PKG_CONFIG_PATH for a non-default prefix).
# GPU programs say `<program>: skipped: <why>` without a GPU (and fail instead under
# GDR_REQUIRE_GPU=1): those count as skipped, not passed, each with a `skipped: no GPU: <check>`
# line, also appended to the file $GDR_SKIP_LOG names when set (scripts/test.sh counts them).
# Ends with `capi-check: P passed, F failed, S skipped`.
set -uo pipefail
src=${1:?usage: capi-check.sh SRC_DIR [BUILD_DIR]}
build=${2:-$(mktemp -d)}
mkdir -p "$build"
command -v pkg-config >/dev/null || { echo "capi-check: pkg-config not found" >&2; exit 1; }
flags=$(pkg-config --cflags --libs gdrapi) || { echo "capi-check: pkg-config has no gdrapi" >&2; exit 1; }
echo "capi-check: gdrapi $(pkg-config --modversion gdrapi): $flags"
pass=0; fail=0; skip=0
check() { # name, command...
  local n=$1 rc=0; shift
  "$@" >"$build/$n.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    if grep -q ': skipped: ' "$build/$n.log"; then
      skip=$((skip+1)); echo "skipped: no GPU: $n"
      echo "  why: $(grep ': skipped: ' "$build/$n.log" | head -1)"
      [ -z "${GDR_SKIP_LOG:-}" ] || echo "skipped: no GPU: capi-check $n" >>"$GDR_SKIP_LOG"
    else
      pass=$((pass+1)); echo "ok $n: $(grep -E 'passed' "$build/$n.log" | tail -1)"
    fi
  else
    # A program killed by a signal says which (its last lines are kept: the runs below are
    # line-buffered).
    local why="exit $rc"
    [ "$rc" -gt 128 ] && why="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))"
    fail=$((fail+1)); echo "FAILED $n: $why"; tail -20 "$build/$n.log" | sed 's/^/  /'
  fi
}
# The test programs' output line by line, so that a crash leaves what was printed before it.
linebuf=()
command -v stdbuf >/dev/null && linebuf=(stdbuf -oL -eL)
# Each program as C99; the API-names program also as C++11.
check build-api_names-c99 cc -std=c99 -Wall -Wextra -Werror "$src/api_names.c" -o "$build/api_names" $flags -ldl
check build-api_names-cxx11 c++ -std=c++11 -x c++ -Wall -Wextra -Werror "$src/api_names.c" -o "$build/api_names_cxx" $flags -ldl
check build-gdrapi_test cc -std=c99 -O2 -Wall -Wextra -Werror "$src/gdrapi_test.c" -o "$build/gdrapi_test" $flags -ldl
check build-semantics cc -std=c99 -O2 -Wall -Wextra -Werror -pthread "$src/semantics.c" -o "$build/semantics" $flags -ldl
check build-copy_overhead cc -std=c99 -O2 -Wall -Wextra -Werror "$src/copy_overhead.c" -o "$build/copy_overhead" $flags -ldl
check build-ucx_staged cc -std=c99 -O2 -Wall -Wextra -Werror "$src/ucx_staged.c" -o "$build/ucx_staged" $flags -ldl
for p in api_names api_names_cxx gdrapi_test semantics copy_overhead; do
  [ -x "$build/$p" ] && check "run-$p" env -u LD_LIBRARY_PATH timeout 300 ${linebuf[@]+"${linebuf[@]}"} "$build/$p"
done
# libgdrapi in a UCX process: a stand-in for UCX's gdr_copy module (its soname is what
# libgdrapi looks for), then gdr_open without gdr's allocator (NULL, no GPU needed), staged
# pins of plain memory, and, with the gdr binary at hand ($GDR_BIN), the same under `gdr run`.
stub=$build/ucx-module/libuct_cuda_gdrcopy.so.0
mkdir -p "$(dirname "$stub")"
if echo 'int uct_gdr_copy_stand_in;' | cc -x c - -shared -fPIC -Wl,-soname,libuct_cuda_gdrcopy.so.0 -o "$stub"; then
  if [ -x "$build/ucx_staged" ]; then
    check run-ucx_staged-guard env -u LD_LIBRARY_PATH -u GDR_CAPI_UCX GDRCOPY_ENABLE_LOGGING=1 \
      GDRCOPY_LOG_LEVEL=3 timeout 120 "$build/ucx_staged" guard "$stub"
    # NULL alone would also come from a machine without a GPU: the reason must be UCX's.
    check ucx_staged-guard-reason grep -m1 "UCX's gdr_copy module loaded this library" \
      "$build/run-ucx_staged-guard.log"
  fi
else
  fail=$((fail+1)); echo "FAILED build-ucx-module-stand-in"
fi
[ -x "$build/ucx_staged" ] && check run-ucx_staged-staged env -u LD_LIBRARY_PATH timeout 120 "$build/ucx_staged" staged
if [ -n "${GDR_BIN:-}" ] && [ -x "$build/ucx_staged" ]; then
  check run-ucx_staged-allocator env -u LD_LIBRARY_PATH -u GDR_CAPI_UCX timeout 120 "$GDR_BIN" run -q -- "$build/ucx_staged" allocator "$stub"
fi
# NCCL opens the unversioned name; NVSHMEM and UCX the soname. Both must resolve the same way
# a dlopen() from any program does (rpath of the caller does not help a library's dlopen).
cat >"$build/dlopen.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h || !dlsym(h, "gdr_get_info") || !dlsym(h, "gdr_get_info_v2")) {
            printf("dlopen %s: %s\n", argv[i], h ? "symbols missing" : dlerror());
            return 1;
        }
        printf("dlopen %s: ok\n", argv[i]);
    }
    printf("dlopen: all checks passed\n");
    return 0;
}
EOF
libdir=$(pkg-config --variable=libdir gdrapi)
if cc -std=c99 "$build/dlopen.c" -o "$build/dlopen" -ldl; then
  if ldconfig -p | grep -q "libgdrapi.so "; then
    check dlopen-by-name env -u LD_LIBRARY_PATH "$build/dlopen" libgdrapi.so libgdrapi.so.2
  else
    # A prefix outside the loader's path: clients find it through LD_LIBRARY_PATH.
    check dlopen-by-name env LD_LIBRARY_PATH="$libdir" "$build/dlopen" libgdrapi.so libgdrapi.so.2
  fi
else
  fail=$((fail+1)); echo "FAILED build-dlopen"
fi
echo "capi-check: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
