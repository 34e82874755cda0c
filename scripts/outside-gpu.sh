#!/usr/bin/env bash
# Programs written elsewhere, run UNMODIFIED on a GPU host with gdr's libgdrapi and gdr's
# allocator (`gdr run`). They are built from their published sources against gdr's installed
# gdrapi.h and libgdrapi.so.2 outside this repository (the project carries neither their code
# nor a recipe for building it); this script takes the folder with the built programs:
#   DIR/gdrcopy/bin/{copylat,copybw,apiperf,sanity}   gdrcopy 2.6's tests (tag v2.6)
#   DIR/ucx/bin/{ucx_info,ucx_perftest}              UCX 1.22 configured --with-cuda
#                                                   --with-gdrcopy (its libs in DIR/ucx/lib)
# Usage: outside-gpu.sh DIR OUTDIR [PARTS]    PARTS: gdrcopy ucx (default both)
# Needs libgdrapi and libgdr_alloc installed where the loader finds them (bundle/run.sh does)
# and GDR_BIN (default: the gdr next to this script). Logs to OUTDIR; tables in
# OUTDIR/gdrcopy.md and OUTDIR/ucx.md; the last line is `outside-gpu: N passed, M failed`.
#
# gdrcopy: copylat, copybw and apiperf on their default allocation (cuMemAlloc) must succeed
# under `gdr run` (without it they stop at their first pin on a host without gdrdrv: shown,
# not counted), and copylat -a cuMemCreate too (the allocator adds the POSIX-fd handle type).
# sanity must pass every test but those listed in SANITY_PRIVATE below, which read gdrcopy's
# private `struct gdr` (the gdrdrv file descriptor, handed to a child over a UNIX socket):
# gdr's gdr_t is a token, not that structure.
#
# UCX: ucx_info -d lists gdr_copy under `gdr run` and not without it; ucx_perftest in one
# process (-l), UCP put latency, put bandwidth and get, host buffer
# to CUDA memory (-m host,cuda; UCP allocates it with cuMemAlloc, served by the allocator),
# 8 B .. 1 MiB, with UCX_TLS=self,cuda_copy,gdr_copy and beside it UCX_TLS=self,cuda_copy,
# in the same call.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: outside-gpu.sh DIR OUTDIR [PARTS]}
out=${2:?usage: outside-gpu.sh DIR OUTDIR [PARTS]}
parts=${3:-gdrcopy ucx}
dir=$(cd "$dir" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
gdr=${GDR_BIN:-$here/gdr}
export LD_LIBRARY_PATH=/usr/local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
pass=0; fail=0
want() { [[ " $parts " == *" $1 "* ]]; }
ok() { pass=$((pass+1)); echo "ok $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
run() { # log, command...: runs with a bound, output to OUTDIR/log; returns the status
  local log=$1; shift
  timeout 600 "$@" >"$out/$log" 2>&1
}

SANITY_PRIVATE="invalidation_unix_sock_shared_fd_gdr_pin_buffer_cumemalloc
invalidation_unix_sock_shared_fd_gdr_pin_buffer_vmmalloc
invalidation_unix_sock_shared_fd_gdr_map_cumemalloc
invalidation_unix_sock_shared_fd_gdr_map_vmmalloc"

if want gdrcopy; then
  b=$dir/gdrcopy/bin
  {
    echo "| program | without the allocator | under gdr run |"
    echo "|---|---|---|"
  } >"$out/gdrcopy.md"
  for p in copylat copybw apiperf "copylat -a cuMemCreate"; do
    tag=${p// /_}
    run "gdrcopy-$tag-driver.log" $b/$p; d=$?
    run "gdrcopy-$tag-alloc.log" "$gdr" run -q -- $b/$p; a=$?
    if [ $a = 0 ]; then
      ok "gdrcopy $p under gdr run (without: exit $d)"
    else
      bad "gdrcopy $p under gdr run: exit $a (see $out/gdrcopy-$tag-alloc.log)"
      tail -5 "$out/gdrcopy-$tag-alloc.log" | sed 's/^/  | /'
    fi
    why=$(grep -m1 -iE 'error|fail' "$out/gdrcopy-$tag-driver.log" | cut -c1-100)
    echo "| $p | exit $d${why:+: $why} | exit $a |" >>"$out/gdrcopy.md"
  done
  # sanity, one test a process (`sanity -t NAME`), four at a time: a test that hangs (the fork
  # tests wait for a child that faulted) costs its bound, not the run.
  $b/sanity -l >"$out/gdrcopy-sanity-list.log" 2>&1
  tests=$(awk '/available tests:/ {f = 1; next} /^$/ {f = 0} f {print $1}' "$out/gdrcopy-sanity-list.log")
  mkdir -p "$out/sanity"
  one() { # mode (alloc|driver), test
    local m=$1 t=$2 bound=30 pre=()
    [ "$m" = alloc ] && pre=("$gdr" run -q --)
    [ "$m" = driver ] && bound=10
    timeout $bound "${pre[@]}" "$b/sanity" -v -t "$t" >"$out/sanity/$t-$m.log" 2>&1
    local rc=$? r
    if [ $rc = 124 ]; then r=timeout
    elif grep -q 'Passed: 1' "$out/sanity/$t-$m.log"; then r=passed
    elif grep -q 'Waived: 1' "$out/sanity/$t-$m.log"; then r=waived
    else r=failed; fi
    echo "$t $m $r"
  }
  export -f one; export b gdr out
  for m in alloc driver; do
    printf '%s\n' $tests | xargs -P 4 -I{} bash -c "one $m {}"
  done >"$out/sanity/results.txt"
  n=$(echo $tests | wc -w)
  res() { awk -v m=$1 -v r=$2 '$2 == m && $3 == r {print $1}' "$out/sanity/results.txt" | sort; }
  echo "info sanity: $n tests; under gdr run: $(res alloc passed | wc -l) passed, $(res alloc waived | wc -l) waived, $(res alloc failed | wc -l) failed, $(res alloc timeout | wc -l) timed out; without: $(res driver passed | wc -l) passed"
  unexpected=$( (res alloc failed; res alloc timeout) | grep -vxF "$SANITY_PRIVATE")
  if [ "$n" -gt 0 ] && [ -z "$unexpected" ]; then
    ok "gdrcopy sanity under gdr run: every test passed or was waived but the private-structure ones"
  else
    bad "gdrcopy sanity under gdr run: unexpected failures: $(echo $unexpected)"
  fi
  {
    echo
    echo "sanity ($n tests, one process each): without the allocator $(res driver passed | wc -l) passed;"
    echo "under gdr run $(res alloc passed | wc -l) passed, $(res alloc waived | wc -l) waived"
    echo
    echo "| sanity test | under gdr run | without |"
    echo "|---|---|---|"
    for t in $tests; do
      echo "| $t | $(awk -v t=$t '$1 == t && $2 == "alloc" {print $3}' "$out/sanity/results.txt") | $(awk -v t=$t '$1 == t && $2 == "driver" {print $3}' "$out/sanity/results.txt") |"
    done
  } >>"$out/gdrcopy.md"
fi

if want ucx; then
  u=$dir/ucx/bin
  # The UCX built for this run, not one the host may have in the system's library folders
  # (its programs carry no run path; a host's older libucs lacks their symbols).
  export LD_LIBRARY_PATH=$dir/ucx/lib:$LD_LIBRARY_PATH
  # gdr_copy is offered under `gdr run` only (docs/ucx.md: outside it libgdrapi's gdr_open
  # fails, as gdrcopy's does without gdrdrv, so that UCX keeps to its other transports).
  if run ucx-info.log "$gdr" run -q -- "$u/ucx_info" -d &&
    grep -q 'Transport: gdr_copy' "$out/ucx-info.log"; then
    ok "ucx_info -d under gdr run lists the gdr_copy transport"
  else
    bad "ucx_info -d under gdr run does not list gdr_copy (UCX_LOG_LEVEL=debug says why)"
  fi
  if run ucx-info-plain.log "$u/ucx_info" -d &&
    ! grep -q 'Transport: gdr_copy' "$out/ucx-info-plain.log"; then
    ok "ucx_info -d without gdr run leaves gdr_copy out"
  else
    bad "ucx_info -d without gdr run lists gdr_copy (or failed)"
  fi
  {
    echo "| test | size | with gdr_copy: latency (us) / bandwidth (MB/s) | cuda_copy only | ratio |"
    echo "|---|---|---|---|---|"
  } >"$out/ucx.md"
  for t in ucp_put_lat ucp_put_bw ucp_get; do
    for s in 8 64 1024 4096 65536 1048576; do
      n=20000; [ "$s" -ge 65536 ] && n=2000
      for tls in gdr nogdr; do
        if [ $tls = gdr ]; then x=self,cuda_copy,gdr_copy; else x=self,cuda_copy; fi
        UCX_TLS=$x UCX_PROTO_INFO=y run "ucx-$t-$s-$tls.log" "$gdr" run -q -- \
          "$u/ucx_perftest" -l -t $t -m host,cuda -s $s -n $n -w 200
        echo $? >"$out/ucx-$t-$s-$tls.rc"
      done
      python3 - "$out" "$t" "$s" <<'EOF' >>"$out/ucx.md"
import sys
out, t, s = sys.argv[1], sys.argv[2], sys.argv[3]
def final(tag):
    """(latency us, bandwidth MB/s) from ucx_perftest's `Final:` row, or None."""
    try:
        rc = int(open(f"{out}/ucx-{t}-{s}-{tag}.rc").read())
        lines = open(f"{out}/ucx-{t}-{s}-{tag}.log", errors="replace").read().splitlines()
    except OSError:
        return None
    rows = [l.split() for l in lines if l.strip().startswith("Final:")]
    if rc != 0 or not rows:
        return None
    r = rows[-1]
    # Final: iterations, latency typical/avg/overall (us), bandwidth avg/overall (MB/s), rate
    return float(r[3]), float(r[6])
g, n = final("gdr"), final("nogdr")
lat = t.endswith("lat") or t == "ucp_get"
fmt = lambda v: "failed" if v is None else (f"{v[0]:.3f} us" if lat else f"{v[1]:.1f} MB/s")
ratio = ""
if g and n:
    ratio = f"{n[0] / g[0]:.2f}x faster" if lat else f"{g[1] / n[1]:.2f}x"
print(f"| {t} | {s} | {fmt(g)} | {fmt(n)} | {ratio} |")
EOF
      if [ "$(cat "$out/ucx-$t-$s-gdr.rc")" = 0 ]; then
        ok "ucx_perftest $t -s $s with gdr_copy"
      else
        bad "ucx_perftest $t -s $s with gdr_copy: exit $(cat "$out/ucx-$t-$s-gdr.rc")"
        grep -iE 'error|fail' "$out/ucx-$t-$s-gdr.log" | head -5 | sed 's/^/  | /'
      fi
    done
  done
  # Two processes, as an MPI rank pair uses UCX: tag-matched messages between CUDA buffers
  # over shared memory; small messages are copied in and out of CUDA memory by the memory-type
  # endpoint, which is gdr_copy when it is enabled.
  {
    echo
    echo "Two processes, UCP tag latency, CUDA buffers on both sides (-m cuda), over shared memory:"
    echo
    echo "| size | sm,cuda_copy,gdr_copy | sm,cuda_copy | ratio |"
    echo "|---|---|---|---|"
  } >>"$out/ucx.md"
  port=13337
  for s in 8 1024 4096 65536; do
    for tls in gdr nogdr; do
      if [ $tls = gdr ]; then x=sm,cuda_copy,gdr_copy; else x=sm,cuda_copy; fi
      port=$((port + 1))
      UCX_TLS=$x timeout 120 "$gdr" run -q -- "$u/ucx_perftest" -p $port >"$out/tag-$s-$tls-server.log" 2>&1 &
      srv=$!
      sleep 1
      UCX_TLS=$x run "tag-$s-$tls.log" "$gdr" run -q -- "$u/ucx_perftest" localhost -p $port \
        -t tag_lat -m cuda -s $s -n 10000 -w 500
      echo $? >"$out/tag-$s-$tls.rc"
      wait $srv
    done
    python3 - "$out" "$s" <<'EOF2' >>"$out/ucx.md"
import sys
out, s = sys.argv[1], sys.argv[2]
def final(tag):
    try:
        rc = int(open(f"{out}/tag-{s}-{tag}.rc").read())
        lines = open(f"{out}/tag-{s}-{tag}.log", errors="replace").read().splitlines()
    except OSError:
        return None
    rows = [l.split() for l in lines if l.strip().startswith("Final:")]
    return float(rows[-1][3]) if rc == 0 and rows else None
g, n = final("gdr"), final("nogdr")
fmt = lambda v: "failed" if v is None else f"{v:.3f} us"
print(f"| {s} | {fmt(g)} | {fmt(n)} | {f'{n / g:.2f}x faster' if g and n else ''} |")
EOF2
    if [ "$(cat "$out/tag-$s-gdr.rc")" = 0 ]; then
      ok "ucx_perftest tag_lat -m cuda -s $s, two processes, with gdr_copy"
    else
      bad "ucx_perftest tag_lat -m cuda -s $s with gdr_copy: exit $(cat "$out/tag-$s-gdr.rc")"
      grep -iE 'error|fail' "$out/tag-$s-gdr.log" | head -3 | sed 's/^/  | /'
    fi
  done
  # Which protocol carried the put: UCX_PROTO_INFO names the transport of each selection.
  sel=$(grep -m1 -A8 'ucp_put\* from host memory to cuda' "$out"/ucx-ucp_put_lat-8-gdr.log |
    grep -m1 -E '\| 0\.\.' | sed 's/.*| *\(.*[^ ]\) *|$/\1/')
  echo "info UCP's protocol for put from host memory to CUDA memory, 8 B: ${sel:-unknown}"
  echo "UCP put, 8 B, from host to CUDA memory: UCP chose: ${sel:-unknown}" >>"$out/ucx.md"
  cat "$out/ucx.md"
fi
echo "outside-gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
