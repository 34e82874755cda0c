#!/usr/bin/env bash
# gdr in a container-like sandbox (issue 41, item 4), on a GPU host from a bundle
# (bundle/sandbox-gpu.sh; run.sh runs it as the part `sandbox`). Usage: sandbox-gpu.sh OUT [--probe]
# The sandbox is bubblewrap's: an unprivileged user (uid SANDBOX_UID, default 65534), no
# capabilities, new user, pid, ipc, uts and net namespaces, a read-only root, a fresh /dev with
# only /dev/nvidiaN, nvidiactl, nvidia-uvm and nvidia-uvm-tools, a fresh /proc, and private
# tmpfs /tmp and HOME (/tmp/home); environment cleared. The host's bwrap, or the one the bundle
# carries (gl/sandbox/bubblewrap_*.deb, unpacked with dpkg -x into a private folder, never /).
# How bwrap is started, first that works (the line `sandbox: mode ...` says which, and why not
# the others):
#   user         as uid SANDBOX_UID (setpriv, when run as root): needs unprivileged user namespaces
#   root-userns  bwrap as root, --unshare-user --uid/--gid SANDBOX_UID (root outside, no capabilities)
#   root-setpriv bwrap as root without a user namespace; the command itself drops to SANDBOX_UID
#                and all capabilities through setpriv (SANDBOX_MODE=NAME forces one)
# Built outside the sandbox, run inside (gdr, the programs, the Python package and its tests are
# copied to a world-readable folder bound read-only at /tmp/gdr):
#   isolation    uid, no capabilities, / not writable, /dev holds only the GPU nodes, only `lo`
#   gdr-check    `gdr check` exits 0
#   capi-*       libgdrapi's C programs (capi/check.sh's compile lines, pkg-config gdrapi)
#   alloc-pool   alloc_check.cu (nvcc) `pool` under `gdr run` (clients/rank_check.c with cc when
#                there is no nvcc)
#   python       pytest on the Python package's tests (with bench/ beside them, which one test
#                runs), GDR_REQUIRE_GPU=1, PYTHONPATH the wheel
# and the negative cases of item 3, each passing when gdr says what is missing:
#   no-icd       VK_DRIVER_FILES at a missing file, container=podman: `gdr check` exits 1 and
#                names NVIDIA_DRIVER_CAPABILITIES and graphics
#   no-uvm       /dev/nvidia-uvm not bound in: `gdr check` exits non-zero and names /dev/nvidia-uvm
#   ro-home      HOME read-only: `gdr copylat` works and says "caching calibrations in"
# --probe stops after `isolation` (no GPU needed: it only proves the sandbox starts).
# Logs in OUT; a table OUT/sandbox.md; one `ok`/`FAILED` line a check; last line
# `sandbox-gpu: N passed, M failed`. Every step is bounded (timeout); the staging folder and the
# unpacked bwrap are removed at exit.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: sandbox-gpu.sh OUT [--probe]"
if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && [ "$2" != --probe ]; }; then
  echo "$usage"; exit 2
fi
probe=0
[ $# -eq 1 ] || probe=1
if ! mkdir -p "$1" || ! out=$(cd "$1" && pwd); then echo "sandbox-gpu: cannot create $1"; exit 2; fi
gdr=${GDR_BIN:-$here/gdr}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cuda=${CUDA_HOME:-/usr/local/cuda}
uid=${SANDBOX_UID:-65534}
pass=0; fail=0; rows=()
stage=""
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() { [ -z "$stage" ] || rm -rf "$stage"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# One check's result: name, ok|FAILED, what it says (also a row of OUT/sandbox.md).
record() {
  if [ "$2" = ok ]; then pass=$((pass+1)); else fail=$((fail+1)); fi
  echo "$2 $1: $3"
  rows+=("| $1 | $2 | ${3//|/\\|} |")
}
finish() {
  {
    echo "| check | result | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "sandbox mode: ${mode:-none}; bwrap: ${bwrap_from:-none}"
  } >"$out/sandbox.md"
  echo "sandbox-gpu: $pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
}

# The staging folder: what the sandbox runs, readable by SANDBOX_UID (the bundle may sit in a
# folder only root can enter, such as /root).
if ! stage=$(mktemp -d /tmp/gdr-sandbox.XXXXXX) || ! chmod 755 "$stage"; then
  echo "sandbox-gpu: cannot make a folder in /tmp"; exit 2
fi
mkdir -p "$stage/bin" "$stage/bwrap"

# bwrap: the host's, else the carried .deb (and, when its libraries are missing here, theirs).
bwrap=$(command -v bwrap || true)
bwrap_env=()
bwrap_from="host ($bwrap)"
if [ -z "$bwrap" ]; then
  bwrap_from="none"
  deb=""
  for d in "$here"/gl/sandbox/bubblewrap_*.deb; do [ -f "$d" ] && deb=$d; done
  if [ -n "$deb" ] && timeout 60 dpkg -x "$deb" "$stage/bwrap" && [ -x "$stage/bwrap/usr/bin/bwrap" ]; then
    bwrap=$stage/bwrap/usr/bin/bwrap
    bwrap_from="carried ($(basename "$deb"))"
    if ldd "$bwrap" 2>/dev/null | grep -q 'not found'; then
      for d in "$here"/gl/sandbox/lib*.deb; do [ -f "$d" ] && timeout 60 dpkg -x "$d" "$stage/bwrap"; done
      libs=$(find "$stage/bwrap" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
      bwrap_env=(env LD_LIBRARY_PATH="$libs")
      bwrap_from="$bwrap_from with its carried libraries"
    fi
  fi
fi
chmod -R a+rX "$stage"
if [ -z "$bwrap" ]; then
  record sandbox FAILED "no bwrap on this host and no gl/sandbox/bubblewrap_*.deb in the bundle"
  finish
fi
echo "sandbox: bwrap $("${bwrap_env[@]}" "$bwrap" --version 2>&1 | head -1), $bwrap_from"

# The GPU's device nodes (every /dev/nvidiaN, the control and UVM nodes).
nodes=()
for n in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
  [ -e "$n" ] && nodes+=("$n")
done
echo "sandbox: device nodes: ${nodes[*]:-none}"

# The host's python3 (often a virtual environment's, such as PyTorch's, outside the usual
# PATH): its directory comes first in the sandbox's PATH, so the tests get its NumPy, PyTorch
# and CuPy, as a container built on that image would.
py_dir=$(dirname "$(command -v python3 2>/dev/null || echo /usr/bin/python3)")
case $py_dir in /usr/bin|/bin|/usr/local/bin) py_dir="" ;; esac

# sb SECONDS [--no-uvm] [--ro-home] -- NAME=VALUE... CMD...: runs CMD in the sandbox with only
# the environment given (PATH, HOME, LANG and GDR_REQUIRE_GPU are always set), killed after
# SECONDS (bwrap's --die-with-parent takes the sandbox with it).
mode=""
sb() {
  local t=$1 no_uvm=0 ro_home=0 n
  shift
  while [ "$1" != -- ]; do
    case $1 in --no-uvm) no_uvm=1 ;; --ro-home) ro_home=1 ;; esac
    shift
  done
  shift
  local args=(--die-with-parent --new-session
    --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /tmp/home
    --ro-bind "$stage" /tmp/gdr --unsetenv LD_LIBRARY_PATH)
  for n in "${nodes[@]}"; do
    if [ "$no_uvm" = 1 ] && [[ $n == /dev/nvidia-uvm* ]]; then continue; fi
    args+=(--dev-bind "$n" "$n")
  done
  [ "$ro_home" = 0 ] || args+=(--remount-ro /tmp/home)
  local envs=(PATH="/tmp/gdr/bin${py_dir:+:$py_dir}:/usr/local/bin:/usr/bin:/bin" HOME=/tmp/home
    LANG=C.UTF-8 GDR_REQUIRE_GPU=1)
  [ -z "${VK_DRIVER_FILES:-}" ] || envs+=(VK_DRIVER_FILES="$VK_DRIVER_FILES")
  local setpriv_to=(setpriv --reuid "$uid" --regid "$uid" --clear-groups)
  case $mode in
    user)
      if [ "$(id -u)" = 0 ]; then
        timeout "$t" env -i "${envs[@]}" "${setpriv_to[@]}" "${bwrap_env[@]}" "$bwrap" --unshare-all "${args[@]}" \
          --cap-drop ALL -- env "$@"
      else
        timeout "$t" env -i "${envs[@]}" "${bwrap_env[@]}" "$bwrap" --unshare-all "${args[@]}" --cap-drop ALL -- env "$@"
      fi ;;
    root-userns)
      timeout "$t" env -i "${envs[@]}" "${bwrap_env[@]}" "$bwrap" --unshare-user --uid "$uid" --gid "$uid" \
        --unshare-all "${args[@]}" --cap-drop ALL -- env "$@" ;;
    root-setpriv)
      # No user namespace to drop capabilities in: setpriv leaves uid 0, and with it every
      # capability, and the bounding set, inside the namespaces bwrap made.
      timeout "$t" env -i "${envs[@]}" "${bwrap_env[@]}" "$bwrap" --unshare-pid --unshare-ipc --unshare-uts \
        --unshare-net --unshare-cgroup-try "${args[@]}" -- "${setpriv_to[@]}" \
        --bounding-set=-all --inh-caps=-all --no-new-privs -- env "$@" ;;
    *) echo "sandbox-gpu: no mode $mode (user, root-userns or root-setpriv)"; return 2 ;;
  esac
}

# The first mode that starts `true`.
modes=(user root-userns root-setpriv)
[ "$(id -u)" = 0 ] || modes=(user)
[ -z "${SANDBOX_MODE:-}" ] || modes=("$SANDBOX_MODE")
why=()
for m in "${modes[@]}"; do
  if [ "$m" != user ] && [ "$(id -u)" != 0 ]; then why+=("$m: needs root"); continue; fi
  mode=$m
  if sb 30 -- /bin/true >"$out/mode-$m.log" 2>&1; then break; fi
  why+=("$m: $(tail -1 "$out/mode-$m.log")")
  mode=""
done
for w in ${why[@]+"${why[@]}"}; do echo "sandbox: not $w"; done
if [ -z "$mode" ]; then
  record sandbox FAILED "bwrap cannot start here: $(IFS=';'; echo "${why[*]}")"
  finish
fi
case $mode in
  user) how="bwrap as uid $uid in a user namespace of its own" ;;
  root-userns) how="bwrap as root, --unshare-user --uid $uid (unprivileged user namespaces are off)" ;;
  root-setpriv) how="bwrap as root without a user namespace, setpriv to uid $uid inside (no user namespace even for root)" ;;
esac
echo "sandbox: mode $mode: $how"

# isolation: what a container gives, checked from inside.
# shellcheck disable=SC2016 # expanded by the sandbox's shell
if sb 60 -- sh -c 'echo "uid $(id -u)"; grep ^CapEff /proc/self/status
  touch /sandbox-probe 2>/dev/null && echo "root writable"
  echo "dev $(ls /dev | grep nvidia | LC_ALL=C sort | paste -sd,)"
  echo "net $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | paste -sd,)"
  echo "pid $$"' >"$out/isolation.log" 2>&1; then
  want_dev=$(for n in "${nodes[@]}"; do basename "$n"; done | LC_ALL=C sort | paste -sd,)
  bad=()
  grep -qx "uid $uid" "$out/isolation.log" || bad+=("not uid $uid")
  grep -q '^CapEff:[[:space:]]*0*$' "$out/isolation.log" || bad+=("capabilities left")
  grep -q 'root writable' "$out/isolation.log" && bad+=("/ writable")
  grep -qx "dev $want_dev" "$out/isolation.log" || bad+=("/dev is not just $want_dev")
  grep -qx 'net lo' "$out/isolation.log" || bad+=("network interfaces other than lo")
  pid=$(sed -n 's/^pid //p' "$out/isolation.log")
  [ "${pid:-99}" -lt 10 ] || bad+=("no pid namespace (pid $pid)")
  if [ ${#bad[@]} -eq 0 ]; then
    record isolation ok "uid $uid, CapEff 0, / read-only, /dev: ${want_dev:-no GPU nodes}, net: lo, pid $pid ($mode)"
  else
    record isolation FAILED "$(IFS=';'; echo "${bad[*]}")"
  fi
else
  record isolation FAILED "the sandbox did not run sh: $(tail -1 "$out/isolation.log")"
fi
[ "$probe" = 0 ] || finish

# Built outside, run inside: gdr, the C programs, the cudaMalloc program, the Python package.
cp "$gdr" "$stage/bin/gdr"
step() { # name, command... (outside the sandbox; only failures are checks)
  local n=$1; shift
  timeout 300 "$@" >"$out/$n.log" 2>&1 && return 0
  record "$n" FAILED "$(tail -1 "$out/$n.log")"
  return 1
}
capi=()
if flags=$(pkg-config --cflags --libs gdrapi 2>"$out/pkg-config.log"); then
  # capi/check.sh's compile lines (its programs that need nothing beyond libgdrapi).
  # shellcheck disable=SC2086 # flags is a list of compiler words
  step build-api_names cc -std=c99 -Wall -Wextra -Werror "$here/capi/c/api_names.c" -o "$stage/bin/api_names" $flags -ldl && capi+=(api_names)
  for p in gdrapi_test copy_overhead; do
    # shellcheck disable=SC2086
    step "build-$p" cc -std=c99 -O2 -Wall -Wextra -Werror "$here/capi/c/$p.c" -o "$stage/bin/$p" $flags -ldl && capi+=("$p")
  done
  # shellcheck disable=SC2086
  step build-semantics cc -std=c99 -O2 -Wall -Wextra -Werror -pthread "$here/capi/c/semantics.c" -o "$stage/bin/semantics" $flags -ldl && capi+=(semantics)
else
  record capi FAILED "pkg-config has no gdrapi: $(tail -1 "$out/pkg-config.log")"
fi
alloc=()
if [ -x "$nvcc" ]; then
  src=$here/alloc/alloc_check.cu
  [ -f "$src" ] || src=$here/../crates/gdr-alloc-preload/tests/gpu/alloc_check.cu
  step build-alloc_check "$nvcc" -O2 -std=c++17 -o "$stage/bin/alloc_check" "$src" -I/usr/local/include \
    -L/usr/local/lib -lgdrapi -L"$cuda/lib64/stubs" -lcuda && alloc=(/tmp/gdr/bin/alloc_check pool)
else
  lf=$(pkg-config --cflags --libs gdrapi 2>/dev/null) || lf="-I/usr/local/include -L/usr/local/lib -lgdrapi"
  # shellcheck disable=SC2086
  step build-rank_check cc -O2 -Wall -std=gnu11 -o "$stage/bin/rank_check" "$here/clients/rank_check.c" \
    -I"$cuda/include" $lf -L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcudart -L"$cuda/lib64/stubs" \
    -lcuda -lpthread -ldl && alloc=(/tmp/gdr/bin/rank_check --seconds 5 --threads 2)
fi
py=0
if [ -d "$here/python/tests" ]; then
  mkdir -p "$stage/site"
  for w in "$here"/python/gdr-*.whl "$here"/python/wheels/*.whl; do
    [ -f "$w" ] || continue
    timeout 300 python3 -m pip install --quiet --no-index --no-deps --target "$stage/site" "$w" 2>/dev/null ||
      timeout 300 python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$stage/site"
  done
  cp -a "$here/python/tests" "$stage/tests"
  # Beside tests/, as in the source tree: tests/test_call_cost.py runs ../bench/call_cost.py.
  [ -d "$here/python/bench" ] && cp -a "$here/python/bench" "$stage/bench"
  [ -d "$here/fixtures/topo" ] && cp -a "$here/fixtures/topo" "$stage/topo"
  py=1
fi
chmod -R a+rX "$stage"

# run NAME SECONDS [sb options] -- NAME=VALUE... CMD...: a check that passes on exit 0.
run() {
  local n=$1 t=$2; shift 2
  if sb "$t" "$@" >"$out/$n.log" 2>&1; then
    local said
    said=$(grep -E 'passed|ok|time' "$out/$n.log" | tail -1)
    record "$n" ok "${said:-$(tail -1 "$out/$n.log")}"
  else
    record "$n" FAILED "exit $? ($(tail -1 "$out/$n.log"))"
  fi
}
run gdr-check 120 -- gdr check
for p in "${capi[@]}"; do run "capi-$p" 300 -- "/tmp/gdr/bin/$p"; done
[ ${#alloc[@]} -eq 0 ] || run "alloc-$(basename "${alloc[0]}")" 300 -- gdr run -- "${alloc[@]}"
if [ "$py" = 1 ]; then
  req_alloc=0
  [ -f "$here/python/with-allocator" ] && req_alloc=1
  run python 900 -- PYTHONPATH=/tmp/gdr/site PYTHONDONTWRITEBYTECODE=1 GDR_REQUIRE_ALLOC=$req_alloc \
    GDR_TOPO_FIXTURES=/tmp/gdr/topo python3 -m pytest -q -p no:cacheprovider -rs /tmp/gdr/tests
else
  record python FAILED "no python/tests in the bundle"
fi

# The negative cases: `gdr check`'s exit status and what it names.
negative() { # name, want-exit (1, or "nonzero"), pattern..., -- sb arguments
  local n=$1 want=$2 rc=0 p missing=(); shift 2
  local pats=()
  while [ "$1" != -- ]; do pats+=("$1"); shift; done
  shift
  sb 120 "$@" >"$out/$n.log" 2>&1 || rc=$?
  for p in "${pats[@]}"; do grep -qF -- "$p" "$out/$n.log" || missing+=("'$p'"); done
  if { [ "$want" = nonzero ] && [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || [ "$rc" = "$want" ]; then
    if [ ${#missing[@]} -eq 0 ]; then
      record "$n" ok "exit $rc, names ${pats[*]}"
      return
    fi
  fi
  record "$n" FAILED "exit $rc (want $want)${missing[*]:+, does not name ${missing[*]}}"
}
negative no-icd 1 NVIDIA_DRIVER_CAPABILITIES graphics -- -- \
  VK_DRIVER_FILES=/nonexistent/nvidia_icd.json container=podman gdr check
negative no-uvm nonzero /dev/nvidia-uvm -- --no-uvm -- container=podman gdr check
# A read-only HOME: the calibration falls back to /tmp and says so once; nothing fails.
negative ro-home 0 "caching calibrations in" -- --ro-home -- \
  gdr copylat --min-size 8 --max-size 4K --budget-ms 100
finish
