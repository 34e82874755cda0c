#!/usr/bin/env bash
# The project's test command (README.md), four parts:
#   1. cargo test --workspace: every test, doctests included (the README's library example and
#      each crate's example among them); GPU tests skip where there is no GPU
#      (GDR_REQUIRE_GPU=1 makes them fail instead); then every test binary again from /, as
#      the GPU bundle runs them away from the source tree (only failures count there);
#   2. libgdrapi installed as users install it (cargo cinstall) and the C programs built against
#      it with pkg-config (scripts/capi-check.sh);
#   3. the Python package installed as users install it (pip install ./crates/gdr-python into a
#      fresh virtual environment) and its pytest suite (scripts/python-test.sh; needs PyPI for
#      maturin, pytest and NumPy);
#   4. the QEMU/VFIO test of gdr-dma (scripts/qemu-dma-test.sh; needs root and network the first
#      time, and skips without root outside CI).
# cargo counts a skipped test as passed and hides what it printed, so every skip is also written
# to a log (GDR_SKIP_LOG, see crates/gdr-testing) and counted here. The last line of output is
#   N passed, M failed, K skipped
# over all four parts: N counts only tests that ran and passed, K the skipped ones (listed just
# above it), M every failed test plus every part that failed without a count (a build error, a
# crashed test binary). Exit status 0 when M is 0, else 1.
# No `set -e`: a failing part must not stop the others from running and being counted.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GDR_SKIP_LOG=$tmp/skipped
: >"$GDR_SKIP_LOG"
passed=0 failed=0
parts=()
skips() { wc -l <"$GDR_SKIP_LOG"; }
# tally PART RC PASSED FAILED SKIPPED: adds one part's counts; a non-zero exit with no failure
# counted is one failure (the part broke before it could count).
tally() {
  local part=$1 rc=$2 p=$3 f=$4 k=$5
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
    f=1
    echo "test.sh: $part exited $rc without counting a failure: counted as 1 failed"
  fi
  passed=$((passed + p)) failed=$((failed + f))
  parts+=("$part: $p passed, $f failed, $k skipped")
}

# 1. cargo test. --no-fail-fast: every test binary runs, so the counts cover them all.
cargo test --workspace --no-fail-fast 2>&1 | tee "$tmp/cargo.log"
rc=${PIPESTATUS[0]}
# `test result: ok. 12 passed; 0 failed; 1 ignored; ...`, one line per test binary.
read -r p f < <(awk '/^test result: /{
    for (i = 2; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) }
  } END { print p + 0, f + 0 }' "$tmp/cargo.log")
k=$(skips)
tally "cargo test" "$rc" $((p - k)) "$f" "$k"

# 1b. The same test binaries run from / instead of their crate's directory, as the GPU bundle
# runs them: a test that opens a file relative to the working directory fails here. Only
# failures count (the tests were counted above); their skips go to a log of their own.
(
  cargo test --workspace --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
' >"$tmp/test-binaries"
  f=0 n=0
  while read -r exe; do
    n=$((n + 1))
    if ! (cd / && GDR_SKIP_LOG=$tmp/skipped-from-root "$exe" -q >"$tmp/from-root.log" 2>&1); then
      bf=$(awk '/^test result: /{for (i = 2; i <= NF; i++) if ($i ~ /^failed;?$/) s += $(i-1)} END {print s + 0}' "$tmp/from-root.log")
      [ "$bf" = 0 ] && bf=1 # it broke before it could count
      f=$((f + bf))
      echo "test.sh: $(basename "$exe") failed when run from /:"
      grep -E '^(test .* FAILED|---- |thread .* panicked)' "$tmp/from-root.log" | head -20 | sed 's/^/  /'
    fi
  done <"$tmp/test-binaries"
  echo "test.sh: $n test binaries run from /: $f failed"
  echo "$f" >"$tmp/from-root.failed"
)
f=$(cat "$tmp/from-root.failed" 2>/dev/null || echo 1)
tally "tests run from /" 0 0 "$f" 0

# 2. libgdrapi installed the way users install it, and C programs built against it with
# pkg-config, as C99 and C++11.
k0=$(skips)
command -v pkg-config >/dev/null || {
  echo "test.sh: pkg-config is missing: installing pkgconf with apt-get (once; network)"
  apt-get update && apt-get install -y pkgconf
}
capi=$tmp/capi
if bash scripts/install-capi.sh --prefix "$capi/prefix"; then
  PKG_CONFIG_PATH="$capi/prefix/lib/pkgconfig" bash scripts/capi-check.sh crates/gdr-capi/tests/c "$capi/build" |
    tee "$tmp/capi.log"
  rc=${PIPESTATUS[0]}
  read -r p f < <(sed -n 's/^capi-check: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' "$tmp/capi.log" | tail -1)
  tally capi-check "$rc" "${p:-0}" "${f:-0}" $(($(skips) - k0))
else
  tally install-capi 1 0 1 0
fi

# 3. The Python package: pip install into a fresh venv, import, pytest. pytest's last line is
# `1 failed, 41 passed, 32 skipped in 2.01s` (each count only when not 0); its skips are in the
# skip log already (the package's conftest writes them there).
k0=$(skips)
bash scripts/python-test.sh 2>&1 | tee "$tmp/python.log"
rc=${PIPESTATUS[0]}
count() { tail -1 "$tmp/python.log" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
tally pytest "$rc" "$(count passed)" "$(($(count failed) + $(count error)))" $(($(skips) - k0))

# 4. The QEMU/VFIO test. Exit 77: it skipped (a prerequisite is missing; it said which).
bash scripts/qemu-dma-test.sh 2>&1 | tee "$tmp/qemu.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 77 ]; then
  grep -m1 '^qemu-dma-test: skipped: ' "$tmp/qemu.log" >>"$GDR_SKIP_LOG" ||
    echo "qemu-dma-test: skipped" >>"$GDR_SKIP_LOG"
  tally qemu-dma-test 0 0 0 1
else
  read -r p f < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$tmp/qemu.log" | tail -1)
  tally qemu-dma-test "$rc" "${p:-0}" "${f:-0}" 0
fi

echo
printf 'test.sh: %s\n' "${parts[@]}"
k=$(skips)
if [ "$k" -gt 0 ]; then
  echo "test.sh: $k skipped (they did not run; GDR_REQUIRE_GPU=1 makes the GPU ones fail):"
  sed 's/^/  /' "$GDR_SKIP_LOG"
fi
echo "$passed passed, $failed failed, $k skipped"
[ "$failed" = 0 ]
