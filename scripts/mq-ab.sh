#!/usr/bin/env bash
# Alternates two gdr binaries in `gdr mq bench` (latency of the best placement, both RX
# formats, one 64-byte throughput point) and prints each run's p50s, worker stages and rate,
# so a change to the mq worker is compared with the code before it on one machine.
# Usage: scripts/mq-ab.sh OUT ROUNDS OLD_GDR NEW_GDR   (on a GPU host, e.g. from a bundle)
set -uo pipefail
out=${1:?usage: mq-ab.sh OUT ROUNDS OLD_GDR NEW_GDR}; n=${2:-3}
old=${3:?old gdr binary}; new=${4:?new gdr binary}
mkdir -p "$out"
L="mq bench --json --placements lynx --rx-format both --throughput-placements lynx --queues 1 --sizes 64 --ms 200 --rounds 1"
for r in $(seq "$n"); do
  for b in "$old" "$new"; do
    tag=$(basename "$b")-$r
    timeout 120 "$b" $L >"$out/lat-$tag.json" 2>"$out/lat-$tag.err" || { echo "$tag: failed: $(tail -1 "$out/lat-$tag.err")"; continue; }
    python3 - "$out/lat-$tag.json" "$tag" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lat = {l['path']: round(l['p50_us'], 3) for l in d.get('latency', [])}
st = {l['path']: [round(l['gpu_stages'][k]) for k in ('recv_ns', 'handler_ns', 'tx_copy_ns')]
      for l in d.get('latency', []) if l.get('gpu_stages')}
thr = [round(t['msgs_per_s'] / 1e6, 2) for t in d.get('throughput', [])]
print(sys.argv[2], 'p50 us', lat, 'stages ns', st, 'M msg/s', thr)
PY
  done
done
