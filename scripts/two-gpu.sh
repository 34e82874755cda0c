#!/usr/bin/env bash
# The checks that need a host with two GPUs, from a bundle folder (scripts/bundle.sh copies this
# to DIR/two-gpu.sh). Usage: two-gpu.sh OUTDIR   (about 5-8 minutes; run as root, like run.sh)
#   nccl   clients/nccl_gdrcopy.py --ranks 2: two processes, one GPU each, NCCL's default
#          transports (P2P/NVLink), with and without NCCL_GDRCOPY_ENABLE=1 NCCL_GDRCOPY_FIFO_ENABLE=1
#          and the installed libgdrapi; all_reduce, all_gather, broadcast 8 B..256 MiB checked
#          against expected results every rank computes itself; every rank's log must show
#          "GDRCOPY enabled library" (OUTDIR/nccl2/)
#   net    the same with --net: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, NCCL's socket network
#          transport over lo, the path between machines (OUTDIR/nccl2-net/)
#   serve  SERVE_ONLY=heavy serve-bench.sh: gdr serve on GPU 0, then on GPUs 0,1 (OUTDIR/serve/)
#   topo   gdr topo (text, --json, --capture) beside nvidia-smi topo -m, GPU pairs compared
#          (OUTDIR/topo/)
# Then the 8 B all_reduce latency of the four NCCL runs in one table (OUTDIR/latency.json) and
# `N passed, M failed` over the steps; exit 1 when M > 0. PARTS="nccl net serve topo" runs a
# subset (each of nccl and net takes 1-3 minutes, so the parts can go into separate commands).
# GDR=path/to/gdr overrides the bundle's gdr binary (to run from a source tree).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: two-gpu.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
g=${GDR:-$here/gdr}
want() { [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]; }

# Setup as run.sh does it: the Vulkan loader from the carried packages when the host has none,
# libgdrapi installed into /usr/local as a user installs it (NCCL dlopens libgdrapi.so from there).
if ! ldconfig -p | grep -q libvulkan.so.1 && [ -d "$here/gl" ]; then
  for f in "$here"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$icd}
if [ -d "$here/capi/root/usr/local" ]; then
  cp -a "$here/capi/root/usr/local/." /usr/local/ && ldconfig
else
  echo "note: no capi/root here (not a bundle): using the libgdrapi the loader finds"
fi
export GDR_REQUIRE_GPU=1
ldconfig -p | grep libgdrapi | sed 's/^/libgdrapi: /'
nvidia-smi -L >"$out/gpus.txt" 2>&1
ngpu=$(grep -c '^GPU' "$out/gpus.txt"); ngpu=${ngpu:-0}
echo "$ngpu GPU(s):"; sed 's/^/  /' "$out/gpus.txt"
[ "$ngpu" -ge 2 ] || echo "WARNING: this host has $ngpu GPU(s); the two-GPU steps will fail"

pass=0; fail=0
result() { # ok|FAILED, name, detail
  if [ "$1" = ok ]; then pass=$((pass+1)); else fail=$((fail+1)); fi
  echo "$2: $1${3:+ ($3)}"
}
# Failures and their indented detail lines, then the last line, from a client's output.
failures() { awk '/^FAIL/{p=1; print "  " $0; next} /^    \|/{if (p) print "  " $0; next} {p=0}' "$1" | head -60; }

nccl() { # name, extra args...
  local n=$1; shift
  echo "== $n: nccl_gdrcopy.py --ranks 2 $*"
  timeout 1000 python3 "$here/clients/nccl_gdrcopy.py" --ranks 2 "$@" --out "$out/$n" >"$out/$n.txt" 2>&1
  local rc=$?
  failures "$out/$n.txt"
  if [ $rc -eq 0 ]; then result ok "$n" "$(tail -1 "$out/$n.txt")"
  else result FAILED "$n" "exit $rc: $(tail -1 "$out/$n.txt")"; fi
}
want nccl && nccl nccl2
want net && nccl nccl2-net --net

if want serve; then
  echo "== serve: SERVE_ONLY=heavy serve-bench.sh (gdr serve on GPU 0, then GPUs 0,1)"
  if [ ! -x "$g" ]; then
    result FAILED serve "no gdr binary at $g (set GDR=)"
  else
    SERVE_ONLY=heavy timeout 600 bash "$here/serve-bench.sh" "$out/serve" "$g" >"$out/serve.log" 2>&1
    rc=$?
    # Both runs answered and verified, each server's JSON names its GPUs; the throughput ratio
    # against serve-bench's target (>= 1.7) is a separate line.
    python3 - "$out/serve" "$rc" <<'PY'
import json, os, sys
d, rc = sys.argv[1], int(sys.argv[2])
def j(name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except Exception:
        return None
s = j("summary.json") or {}
problems = []
if rc != 0:
    problems.append(f"serve-bench.sh exited {rc}")
rps = s.get("two_gpu_rps") or {}
if not (rps.get("one") and rps.get("two")):
    problems.append("no two_gpu_rps in summary.json (a heavy run failed: see serve.log)")
if s.get("verify_failures"):
    problems.append(f"verify failures: {s['verify_failures']}")
for name, gpus in (("heavy-gpus-0", [0]), ("heavy-gpus-0-1", [0, 1])):
    srv = j(name + ".server.json")
    if not srv:
        problems.append(f"no {name}.server.json")
    elif srv.get("gpus") != gpus:
        problems.append(f"{name}: server ran on GPUs {srv.get('gpus')}, not {gpus}")
    else:
        c = (srv.get("report") or {}).get("counters") or {}
        print(f"  {name}: answered {c.get('answered')}, shed {c.get('shed')}, "
              f"kernel drops {c.get('kernel_drops')}")
with open(os.path.join(d, "two-gpu-check.txt"), "w") as f:
    f.write("\n".join(problems) + "\n")
ratio = s.get("two_gpu_ratio")
print(f"  throughput rps: one GPU {rps.get('one')}, two GPUs {rps.get('two')}, ratio {ratio}")
sys.exit(1 if problems else 0)
PY
    if [ $? -eq 0 ]; then result ok serve "GPU 0 and GPUs 0,1 served, answers verified"
    else result FAILED serve "$(paste -sd';' "$out/serve/two-gpu-check.txt" 2>/dev/null)"; fi
    ratio=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("two_gpu_ratio"))' \
      "$out/serve/summary.json" 2>/dev/null)
    if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 1.7 else 1)' "$ratio" 2>/dev/null; then
      result ok serve-scaling "2 GPUs / 1 GPU throughput $ratio, target >= 1.7"
    else
      result FAILED serve-scaling "2 GPUs / 1 GPU throughput ${ratio:-none}, target >= 1.7"
    fi
  fi
fi

if want topo; then
  echo "== topo: gdr topo beside nvidia-smi topo -m"
  t="$out/topo"; rm -rf "$t"; mkdir -p "$t"
  nvidia-smi topo -m >"$t/nvidia-smi-topo-m.txt" 2>&1
  "$g" topo >"$t/gdr-topo.txt" 2>"$t/gdr-topo.err"
  "$g" topo --json >"$t/gdr-topo.json" 2>>"$t/gdr-topo.err"
  # A capture in the form of the committed fixtures (crates/gdr-pci/tests/fixtures/topo/<name>/).
  "$g" topo --capture "$t/capture" >"$t/capture.txt" 2>&1 &&
    cp "$t/nvidia-smi-topo-m.txt" "$t/capture/nvidia-smi-topo-m.txt"
  python3 - "$t" <<'PY'
import json, os, re, sys
t = sys.argv[1]
def read(name):
    with open(os.path.join(t, name), errors="replace") as f:
        return f.read()
smi = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", read("nvidia-smi-topo-m.txt"))
gtxt = read("gdr-topo.txt")

# Side by side: gdr topo on the left, nvidia-smi on the right, tabs expanded.
left = [ln.expandtabs(8) for ln in gtxt.splitlines()]
right = [ln.expandtabs(8) for ln in smi.splitlines()]
w = max([len(x) for x in left] + [10]) + 3
with open(os.path.join(t, "side-by-side.txt"), "w") as f:
    f.write(f"{'gdr topo':<{w}}nvidia-smi topo -m\n")
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        f.write(f"{a:<{w}}{b}".rstrip() + "\n")

# nvidia-smi: the GPU x GPU cells and each GPU's CPU / NUMA affinity.
lines = smi.splitlines()
header = [h.strip() for h in lines[0].split("\t")] if lines else []
labels = [h for h in header[1:] if re.fullmatch(r"(GPU|NIC)\d+", h)]
cells, affinity = {}, {}
for ln in lines[1:]:
    fields = [x.strip() for x in ln.split("\t")]
    if not fields or fields[0] not in labels or not fields[0].startswith("GPU"):
        continue
    for col, cell in zip(labels, fields[1:]):
        if col.startswith("GPU"):
            cells[(fields[0], col)] = cell
    rest = fields[1 + len(labels):]
    affinity[fields[0]] = (rest[0] if rest else "", rest[1] if len(rest) > 1 else "")
smi_gpus = sorted({a for a, _ in cells})

# gdr topo --json: labels of the GPUs, the path of every GPU pair.
problems = []
try:
    rep = json.loads(read("gdr-topo.json"))
except Exception as e:
    rep = {"devices": [], "pairs": []}
    problems.append(f"gdr topo --json unreadable: {e}")
label = {d["bdf"]: d.get("label", "") for d in rep.get("devices", [])}
gdr_gpus = sorted(d["label"] for d in rep.get("devices", []) if d.get("class") == "gpu")
print(f"  GPUs: gdr {gdr_gpus}, nvidia-smi {smi_gpus}")
if gdr_gpus != smi_gpus:
    problems.append(f"GPU lists differ: gdr {gdr_gpus}, nvidia-smi {smi_gpus}")
compared = 0
for p in rep.get("pairs", []):
    a, b = label.get(p["a"], ""), label.get(p["b"], "")
    if not (a.startswith("GPU") and b.startswith("GPU")):
        continue
    for x, y in ((a, b), (b, a)):
        want = cells.get((x, y))
        compared += 1
        mark = "same" if want == p["path"] else "DIFFERENT"
        print(f"  {x}-{y}: gdr {p['path']} ({p['verdict']}), nvidia-smi {want}: {mark}")
        if want != p["path"]:
            problems.append(f"{x}-{y}: gdr {p['path']}, nvidia-smi {want}")
if compared == 0:
    problems.append("no GPU pair to compare")
# Affinities: reported, not counted (format differences are possible and harmless).
for d in rep.get("devices", []):
    if d.get("class") != "gpu":
        continue
    cpu, numa = affinity.get(d["label"], ("?", "?"))
    gnuma = ",".join(str(n) for n in d.get("numa_affinity") or []) or "N/A"
    same = "same" if (d.get("cpulist") or "") == cpu and gnuma == numa else "differs"
    print(f"  {d['label']} affinity: gdr cpus {d.get('cpulist')} numa {gnuma}; "
          f"nvidia-smi cpus {cpu} numa {numa}: {same}")
with open(os.path.join(t, "compare.txt"), "w") as f:
    f.write("\n".join(problems) + "\n")
sys.exit(1 if problems else 0)
PY
  if [ $? -eq 0 ]; then result ok topo "GPU pairs match nvidia-smi; $t/side-by-side.txt"
  else result FAILED topo "$(paste -sd';' "$t/compare.txt" 2>/dev/null)"; fi
fi

# The 8 B all_reduce latency of the NCCL runs, one table.
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows, table = [], {}
for sub, transport in (("nccl2", "default (P2P)"), ("nccl2-net", "net (sockets, lo)")):
    try:
        with open(os.path.join(out, sub, "nccl-summary.json")) as f:
            s = json.load(f)
    except Exception:
        continue
    lat = s.get("latency") or {}
    table[s.get("transport", sub)] = lat
    for key, label in (("gdr", "with gdr"), ("nogdr", "without")):
        v = lat.get(key) or {}
        r0 = v.get("rank0")
        medians = [x["median_us"] for x in v.get("per_rank") or [] if x]
        rows.append((transport, label, r0, max(medians) if medians else None))
    if (lat.get("gdr") or {}).get("rank0") and (lat.get("nogdr") or {}).get("rank0"):
        rows.append((transport, "with / without",
                     lat["gdr"]["rank0"]["median_us"] / lat["nogdr"]["rank0"]["median_us"], None))
if rows:
    print("8 B all_reduce latency, 2 ranks, 1000 runs, rank 0 (us; max: slowest rank's median):")
    print(f"  {'transport':18} {'gdrcopy':15} {'median':>9} {'p10':>9} {'p90':>9} {'max':>9}")
    for transport, label, r0, mx in rows:
        if isinstance(r0, float):
            print(f"  {transport:18} {label:15} {r0:8.2f}x")
        elif r0:
            print(f"  {transport:18} {label:15} {r0['median_us']:9.2f} {r0['p10_us']:9.2f} "
                  f"{r0['p90_us']:9.2f} " + (f"{mx:9.2f}" if mx is not None else f"{'n/a':>9}"))
        else:
            print(f"  {transport:18} {label:15} {'n/a':>9}")
    with open(os.path.join(out, "latency.json"), "w") as f:
        json.dump(table, f, indent=2)
PY

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
