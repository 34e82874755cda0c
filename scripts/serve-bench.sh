#!/usr/bin/env bash
# The gdr serve measurements on a GPU host, from the bundle; about 3-6 minutes.
# Usage: scripts/serve-bench.sh OUTDIR [GDR]   (GDR: the gdr binary, default bundle/gdr, or ./gdr
# next to this script). Writes per-run JSON (server totals, load report) and summary.json with
# the ratios the targets are about:
#   lenet at low load: server-side p50 host-centric / gpu-queue (>= 3), end-to-end p50 (>= 1.5)
#   lenet peak throughput, same server cores: gpu-queue / host-centric (>= 1.2)
#   10^6 requests under load: sent = answered + lost, lost = server drops + client drops
#   2 GPUs vs 1 with a heavy app (--work), when the host has 2 GPUs (>= 1.7)
# Environment: SERVE_THREADS (server network threads = cores, default 2), SERVE_CPUS (cores
# for the server, default 2-(1+threads)), LOAD_CPUS (default the rest), HEAVY_WORK (default 40),
# PEAK_SERVE_THREADS (server network threads of the peak runs, both modes alike; default 4 on a
# host of 12 cores or more, else SERVE_THREADS; on cores PEAK_SERVE_CPUS, default
# 2-(1+threads), the load on PEAK_LOAD_CPUS, default the rest), PEAK_THREADS (load-generator
# threads of the peak runs, 64 outstanding each; default 2 x PEAK_SERVE_THREADS + 2, at most the
# load cores),
# SERVE_ROUNDS (default 3: the low-load and the peak comparisons each run that many rounds,
# the GPU mode and host-centric alternated; summary.json gives the median of each mode over its
# rounds, the ratio of the medians, and every round beside them),
# SERVE_ONLY (space-separated parts to run: low profile peak floor million sweep heavy sockperf
# sockets; default all); "sweep" runs the million run at each rate of SERVE_SWEEP_RATES (default 200k-700k
# in steps of 100k). "floor" runs echo (no compute, LeNet's 784-byte request) at low load and at
# peak in the GPU mode: the server's path without the app, whose figures bound the ratios
# (summary.json "floor"). "sockets" runs the peak runs (echo, and LeNet in both modes) with the
# network threads sharing one socket, with one socket each (`--sockets per-thread`,
# SO_REUSEPORT) and with one each and stealing (`--sockets stealing`), alternated over
# SERVE_ROUNDS rounds on the same cores (summary.json "sockets"; SERVE_SOCKET_KINDS picks the
# kinds, default all three). SERVE_SOCKETS (shared, per-thread or stealing) is passed to every
# other server; default the server's own.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: serve-bench.sh OUTDIR [GDR]}
g=${2:-}
if [ -z "$g" ]; then
  for c in "$here/../bundle/gdr" "$here/gdr" "$(command -v gdr || true)"; do
    [ -n "$c" ] && [ -x "$c" ] && { g=$c; break; }
  done
fi
[ -x "$g" ] || { echo "no gdr binary (pass it as the second argument)"; exit 2; }
mkdir -p "$out"
# Vulkan loader for the BAR1 mapping (as run-gpu.sh does).
if ! ldconfig -p | grep -q libvulkan.so.1 && [ -d "$here/gl" ]; then
  for f in "$here"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$icd}

ncpu=$(nproc)
T=${SERVE_THREADS:-2}
SCPUS=${SERVE_CPUS:-2-$((1 + T))}
LCPUS=${LOAD_CPUS:-$((2 + T))-$((ncpu - 1))}
HEAVY=${HEAVY_WORK:-40}
# The peak runs give the server more network cores where the host has them: gdr's peak is set
# by its network threads (echo peaks where LeNet does), host-centric's by its launches, and both
# modes get the same cores.
if [ "$ncpu" -ge 12 ]; then PT=${PEAK_SERVE_THREADS:-4}; else PT=${PEAK_SERVE_THREADS:-$T}; fi
PSCPUS=${PEAK_SERVE_CPUS:-2-$((1 + PT))}
PLCPUS=${PEAK_LOAD_CPUS:-$((2 + PT))-$((ncpu - 1))}
pl=$(( 2 * PT + 2 < ncpu - 2 - PT ? 2 * PT + 2 : ncpu - 2 - PT ))
PEAK_THREADS=${PEAK_THREADS:-$(( pl > 0 ? pl : 1 ))}
ROUNDS=${SERVE_ROUNDS:-3}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "SERVE_ROUNDS must be a positive integer, not '$ROUNDS'"; exit 2; }
export PEAK_SERVE_THREADS=$PT
# The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries when it is set (one GPU of a
# larger host), else every GPU nvidia-smi lists.
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  ngpu=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); ngpu=${ngpu:-0}
fi
port=9400
pid=
echo "gdr: $g; server cores $SCPUS ($T threads), load cores $LCPUS, $ngpu GPU(s); peak runs: server cores $PSCPUS ($PT threads), load cores $PLCPUS ($PEAK_THREADS load threads); $ROUNDS rounds"

start_server() { # name, serve args...
  local name=$1; shift
  port=$((port + 1))
  # --stats: the loads account for drops with the server's counters.
  # SERVE_SOCKETS for every server whose arguments do not choose the sharing themselves.
  local sock=()
  [[ " $* " == *" --sockets "* ]] || [ -z "${SERVE_SOCKETS:-}" ] || sock=(--sockets "$SERVE_SOCKETS")
  taskset -c "$SCPUS" "$g" serve --listen 127.0.0.1:$port --threads "$T" --idle spin --stats \
    --duration 120 --json "${sock[@]}" "$@" >"$out/$name.server.json" 2>"$out/$name.server.log" &
  pid=$!
  for _ in $(seq 600); do
    grep -q "ready on" "$out/$name.server.log" 2>/dev/null && return 0
    kill -0 $pid 2>/dev/null || { echo "$name: server died: $(tail -1 "$out/$name.server.log")"; return 1; }
    sleep 0.1
  done
  echo "$name: server not ready in 60 s"; stop_server; return 1
}
stop_server() {
  [ -n "$pid" ] || return 0
  kill -INT $pid 2>/dev/null
  for _ in $(seq 150); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -0 $pid 2>/dev/null && { echo "server did not stop in 15 s (hang)"; kill -KILL $pid; }
  wait $pid 2>/dev/null; pid=
}
# A server must not outlive this script (it would hold the GPU), however the script ends.
trap stop_server EXIT
trap 'exit 130' INT TERM
load() { # name, load args...
  local name=$1; shift
  timeout 90 taskset -c "$LCPUS" "$g" load --target 127.0.0.1:$port --json "$@" \
    >"$out/$name.load.json" 2>"$out/$name.load.log" || echo "$name: load failed: $(tail -1 "$out/$name.load.log")"
}
run() { # name, "serve args", load args...
  local name=$1 sargs=$2; shift 2
  echo "== $name"
  # shellcheck disable=SC2086
  if start_server "$name" $sargs; then
    # A second of the same load first, its --duration (and --requests) replaced: given twice,
    # gdr load refuses the options, and until 2026-11-28 every warm-up failed so, unseen.
    local warm=() skip=0 a
    for a in "$@"; do
      if [ $skip = 1 ]; then skip=0; continue; fi
      case $a in --duration|--requests) skip=1; continue ;; --duration=*|--requests=*) continue ;; esac
      warm+=("$a")
    done
    load "$name.warm" "${warm[@]}" --duration 1
    load "$name" "$@"
    stop_server
  fi
}

want() { [ -z "${SERVE_ONLY:-}" ] || [[ " $SERVE_ONLY " == *" $1 "* ]]; }
case ${SERVE_SOCKETS:-shared} in shared|per-thread|stealing) ;; *)
  echo "SERVE_SOCKETS must be shared, per-thread or stealing, not '$SERVE_SOCKETS'"; exit 2 ;; esac
socket_kinds=${SERVE_SOCKET_KINDS:-shared per-thread stealing}
for sk in $socket_kinds; do
  case $sk in shared|per-thread|stealing) ;; *)
    echo "SERVE_SOCKET_KINDS: shared, per-thread or stealing, not '$sk'"; exit 2 ;; esac
done

# The comparisons the ratios come from run in rounds, the two modes alternated: on one machine
# the host-centric baseline's p50 moves from one run to the next by more than the differences
# compared, so one pair of runs says less than the median of several.
want low && for r in $(seq "$ROUNDS"); do
  for mode in gpu-queue host-centric; do
    run "lenet-low-$mode-r$r" "--app lenet --mode $mode" --app lenet --outstanding 1 --duration 3 --verify
  done
done
want low && run "lenet-low-gpu-queue-words" "--app lenet --mode gpu-queue --rx-format words" --app lenet --outstanding 1 --duration 5 --verify
# lenet's default worker on Hopper and later runs each request over a thread-block cluster
# of 8 SMs; the same over other cluster sizes (SERVE_CLUSTERS; 1 = the one-block worker).
for c in ${SERVE_CLUSTERS:-1 4}; do
  want low && run "lenet-low-gpu-queue-cluster$c" "--app lenet --mode gpu-queue --cluster $c" --app lenet --outstanding 1 --duration 5 --verify
done
# Where the GPU-queue worker's time goes (separate runs: the clock reads cost a little).
want profile && for f in header words; do
  run "lenet-profile-$f" "--app lenet --mode gpu-queue --profile --rx-format $f" --app lenet --outstanding 1 --duration 2
  run "echo-profile-$f" "--app echo --mode gpu-queue --profile --rx-format $f" --app echo --size 64 --outstanding 1 --duration 2
done
want profile && run "lenet-profile-cluster1" "--app lenet --mode gpu-queue --profile --cluster 1" --app lenet --outstanding 1 --duration 2
# run_peak: run with the peak runs' server threads and cores.
run_peak() {
  local t=$T s=$SCPUS l=$LCPUS
  T=$PT SCPUS=$PSCPUS LCPUS=$PLCPUS
  run "$@"
  T=$t SCPUS=$s LCPUS=$l
}
want peak && for r in $(seq "$ROUNDS"); do
  for mode in gpu-queue host-centric; do
    run_peak "lenet-peak-$mode-r$r" "--app lenet --mode $mode --max-in-flight 512 --streams 8" \
      --app lenet --outstanding 64 --threads "$PEAK_THREADS" --duration 4 --verify
  done
done
want peak && run_peak "lenet-peak-gpu-queue-cluster1" "--app lenet --mode gpu-queue --cluster 1 --max-in-flight 512" \
  --app lenet --outstanding 64 --threads "$PEAK_THREADS" --duration 6 --verify
# The path without the app: echo of LeNet's request size, one outstanding and at peak.
want floor && run "echo-low-gpu-queue" "--app echo --mode gpu-queue" \
  --app echo --size 784 --outstanding 1 --duration 3 --verify
want floor && run_peak "echo-peak-gpu-queue" "--app echo --mode gpu-queue --max-in-flight 512" \
  --app echo --size 784 --outstanding 64 --threads "$PEAK_THREADS" --duration 6 --verify
# Socket sharing at peak, the kinds alternated round by round on the same cores.
want sockets && for r in $(seq "$ROUNDS"); do
  for sk in $socket_kinds; do
    run_peak "sockets-echo-$sk-r$r" "--app echo --mode gpu-queue --max-in-flight 512 --sockets $sk" \
      --app echo --size 784 --outstanding 64 --threads "$PEAK_THREADS" --duration 4 --verify
    for mode in gpu-queue host-centric; do
      run_peak "sockets-lenet-$mode-$sk-r$r" \
        "--app lenet --mode $mode --max-in-flight 512 --streams 8 --sockets $sk" \
        --app lenet --outstanding 64 --threads "$PEAK_THREADS" --duration 4 --verify
    done
  done
done
want million && run "million-gpu-queue" "--app lenet --mode gpu-queue" \
  --app lenet --rate 400000 --requests 1000000 --threads 4 --duration 60 --timeout-ms 2000
# Where the million run starts to shed: 10^6 LeNet requests at each rate of SERVE_SWEEP_RATES,
# one server each (summary.json "sweep": answered, shed and lost per rate, and the knee).
want sweep && for rate in ${SERVE_SWEEP_RATES:-200000 300000 400000 500000 600000 700000}; do
  run "sweep-$rate" "--app lenet --mode gpu-queue" \
    --app lenet --rate "$rate" --requests 1000000 --threads 4 --duration 60 --timeout-ms 2000
done
if [ "$ngpu" -ge 2 ] && want heavy; then
  for gpus in 0 0,1; do
    run "heavy-gpus-${gpus/,/-}" "--app lenet --work $HEAVY --mode gpu-queue --gpus $gpus --max-in-flight 512" \
      --app lenet --outstanding 128 --threads 4 --duration 6 --verify
  done
fi
# sockperf 3.7 (Debian's, carried to the GPU host in gl/) against the echo app in sockperf
# framing, in each server mode: ping-pong at sockperf's minimum message (14 B) and at 64 B,
# throughput, and under-load. Each result is saved; sockperf-summary.txt has one line per run.
if want sockperf; then
  if ! command -v sockperf >/dev/null; then
    echo "sockperf: not installed (Debian package sockperf; carry it in gl/)" | tee "$out/sockperf-summary.txt"
  else
    echo "== sockperf against echo (sockperf framing)"
    : >"$out/sockperf-summary.txt"
    modes=${SOCKPERF_MODES:-gpu-queue cpu}
    [ "$ngpu" -ge 1 ] || modes=cpu
    for mode in $modes; do
      # The CPU mode runs a spinning worker beside each network thread: one network thread,
      # so that the server's cores are not oversubscribed (spinning threads sharing a core
      # answer in milliseconds, a scheduler time slice, not microseconds).
      threads=$T
      [ "$mode" = cpu ] && threads=1
      T=$threads start_server "sockperf-$mode" --app echo --mode "$mode" --framing sockperf || continue
      for t in "ping-pong -m 14" "ping-pong -m 64" "throughput -m 64" "under-load -m 64"; do
        f="$out/sockperf-$mode-${t// /_}.txt"
        # shellcheck disable=SC2086 # $t is the sockperf subcommand and its options
        if timeout 30 taskset -c "$LCPUS" sockperf $t -i 127.0.0.1 -p $port -t 3 >"$f" 2>&1 &&
          ! grep -qiE "error|aborted|higher then expected" "$f"; then
          r=ok
        else
          r=FAILED
        fi
        printf '%s %s: %s: %s\n' "$mode" "$t" "$r" \
          "$(grep -E "Summary: (Latency|Message Rate|BandWidth)|percentile 50.000" "$f" | head -2 | tr -s ' ' | tr '\n' ' ')" |
          tee -a "$out/sockperf-summary.txt"
      done
      stop_server
    done
  fi
fi

python3 - "$out" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
def j(name):
    try:
        with open(os.path.join(out, name)) as f: return json.load(f)
    except Exception as e:
        return None
s = {}
def server_drops(load):
    """Requests the server counted as not answered (the load report's copy of its counters)."""
    srv = load.get("server") or {}
    return sum(srv.get(k, 0) for k in ("shed", "kernel_drops", "bad_dropped", "send_failed", "abandoned"))
def ratio(a, b):
    return round(a / b, 3) if a and b else None
def rounds(part, kind):
    """{round: report} of the runs lenet-PART-MODE-rN.KIND.json, by mode."""
    by = {"gpu-queue": {}, "host-centric": {}}
    for f in os.listdir(out):
        m = re.fullmatch(r"lenet-%s-(gpu-queue|host-centric)-r(\d+)\.%s\.json" % (part, kind), f)
        if m:
            r = j(f)
            if r: by[m.group(1)][int(m.group(2))] = r
    return by
def median(xs):
    return statistics.median(xs) if xs else None
# Low load: each mode's median over its rounds; the ratio is of the medians. The rounds
# themselves (and each round's own ratio) are listed beside.
srv, lod = rounds("low", "server"), rounds("low", "load")
gs = [r["report"]["server_time"]["p50_us"] for _, r in sorted(srv["gpu-queue"].items())]
hs = [r["report"]["server_time"]["p50_us"] for _, r in sorted(srv["host-centric"].items())]
ge = [r["latency"]["p50_us"] for _, r in sorted(lod["gpu-queue"].items())]
he = [r["latency"]["p50_us"] for _, r in sorted(lod["host-centric"].items())]
gl, hl, gL, hL = median(gs), median(hs), median(ge), median(he)
if gl and hl:
    s["low_server_p50_us"] = {"gpu_queue": gl, "host_centric": hl}
    s["low_server_p50_ratio"] = ratio(hl, gl)
    s["low_rounds"] = [
        {"round": k, "server_p50_us": {"gpu_queue": g["report"]["server_time"]["p50_us"],
                                       "host_centric": h["report"]["server_time"]["p50_us"]},
         "server_p50_ratio": ratio(h["report"]["server_time"]["p50_us"], g["report"]["server_time"]["p50_us"])}
        for k in sorted(set(srv["gpu-queue"]) & set(srv["host-centric"]))
        for g, h in [(srv["gpu-queue"][k], srv["host-centric"][k])]]
gw, gW = j("lenet-low-gpu-queue-words.server.json"), j("lenet-low-gpu-queue-words.load.json")
if gw and hl:
    s["low_server_p50_us_words"] = gw["report"]["server_time"]["p50_us"]
    s["low_server_p50_ratio_words"] = ratio(hl, gw["report"]["server_time"]["p50_us"])
if gW and hL:
    s["low_e2e_p50_us_words"] = gW["latency"]["p50_us"]
    s["low_e2e_p50_ratio_words"] = ratio(hL, gW["latency"]["p50_us"])
for f in sorted(os.listdir(out)):
    if f.startswith("lenet-low-gpu-queue-cluster") and f.endswith(".server.json") and hl:
        c = f[len("lenet-low-gpu-queue-"):-len(".server.json")]
        us = j(f)["report"]["server_time"]["p50_us"]
        s["low_server_p50_us_" + c] = us
        s["low_server_p50_ratio_" + c] = ratio(hl, us)
        cl = j(f[:-len(".server.json")] + ".load.json")
        if cl and hL:
            s["low_e2e_p50_ratio_" + c] = ratio(hL, cl["latency"]["p50_us"])
if gL and hL:
    s["low_e2e_p50_us"] = {"gpu_queue": gL, "host_centric": hL}
    s["low_e2e_p50_ratio"] = ratio(hL, gL)
    for x in s.get("low_rounds", []):
        g, h = lod["gpu-queue"].get(x["round"]), lod["host-centric"].get(x["round"])
        if g and h:
            x["e2e_p50_us"] = {"gpu_queue": g["latency"]["p50_us"], "host_centric": h["latency"]["p50_us"]}
# Peak: likewise, the median rate of each mode over its rounds.
pk = rounds("peak", "load")
gps = [r["throughput_rps"] for _, r in sorted(pk["gpu-queue"].items())]
hps = [r["throughput_rps"] for _, r in sorted(pk["host-centric"].items())]
gp, hp = median(gps), median(hps)
if gp and hp:
    s["peak_server_threads"] = int(os.environ.get("PEAK_SERVE_THREADS", "0"))
    s["peak_rps"] = {"gpu_queue": gp, "host_centric": hp}
    s["peak_ratio"] = ratio(gp, hp)
    s["peak_rounds"] = [
        {"round": k, "rps": {"gpu_queue": pk["gpu-queue"][k]["throughput_rps"],
                             "host_centric": pk["host-centric"][k]["throughput_rps"]},
         "ratio": ratio(pk["gpu-queue"][k]["throughput_rps"], pk["host-centric"][k]["throughput_rps"])}
        for k in sorted(set(pk["gpu-queue"]) & set(pk["host-centric"]))]
gc = j("lenet-peak-gpu-queue-cluster1.load.json")
if gc and hp:
    s["peak_rps_cluster1"] = gc["throughput_rps"]
    s["peak_ratio_cluster1"] = ratio(gc["throughput_rps"], hp)
# The floor: the same server path with echo (no compute). A latency ratio against
# host-centric cannot pass the one its floor gives, whatever the app costs: server-side and
# end-to-end p50 host-centric / echo. The peak bound, echo / host-centric, is approximate:
# echo answers with 784 bytes where LeNet answers with 40.
el, eL, ep = j("echo-low-gpu-queue.server.json"), j("echo-low-gpu-queue.load.json"), j("echo-peak-gpu-queue.load.json")
if el and eL:
    f = {"echo_server_p50_us": el["report"]["server_time"]["p50_us"], "echo_e2e_p50_us": eL["latency"]["p50_us"]}
    if hl and hL:
        f["server_ratio_bound"] = ratio(hl, f["echo_server_p50_us"])
        f["e2e_ratio_bound"] = ratio(hL, f["echo_e2e_p50_us"])
    if ep:
        f["echo_peak_rps"] = ep["throughput_rps"]
        if hp:
            f["peak_ratio_bound"] = ratio(ep["throughput_rps"], hp)
    s["floor"] = f
# Socket sharing: each kind's median peak over its rounds, the rounds beside; per-thread /
# shared for each run, and LeNet gpu-queue / host-centric with each sharing.
sk = {}
for f in os.listdir(out):
    m = re.fullmatch(r"sockets-(echo|lenet-gpu-queue|lenet-host-centric)-(shared|per-thread|stealing)-r(\d+)\.load\.json", f)
    if m and j(f):
        sk.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = j(f)["throughput_rps"]
if sk:
    t = {"server_threads": int(os.environ.get("PEAK_SERVE_THREADS", "0")), "rounds": sk}
    med = {k: {h: median(list(v.values())) for h, v in by.items()} for k, by in sk.items()}
    t["median_rps"] = med
    t["per_thread_over_shared"] = {k: ratio(m.get("per-thread"), m.get("shared")) for k, m in med.items()}
    t["stealing_over_shared"] = {k: ratio(m.get("stealing"), m.get("shared")) for k, m in med.items()}
    t["stealing_over_per_thread"] = {k: ratio(m.get("stealing"), m.get("per-thread")) for k, m in med.items()}
    g, h = med.get("lenet-gpu-queue", {}), med.get("lenet-host-centric", {})
    t["lenet_ratio"] = {x: ratio(g.get(x), h.get(x)) for x in ("shared", "per-thread", "stealing")}
    t["lenet_ratio_rounds"] = {
        x: [ratio(sk["lenet-gpu-queue"][x].get(r), sk["lenet-host-centric"][x].get(r))
            for r in sorted(sk.get("lenet-gpu-queue", {}).get(x, {}))]
        for x in ("shared", "per-thread", "stealing") if x in sk.get("lenet-gpu-queue", {}) and x in sk.get("lenet-host-centric", {})}
    s["sockets"] = t
m = j("million-gpu-queue.load.json")
if m:
    answered = m["ok"] + sum(m["errors"].values())
    drops = server_drops(m)
    s["million"] = {"sent": m["sent"], "answered": answered, "lost": m["lost"], "server_drops": drops,
                    "client_drops": m["client_drops"],
                    "sent_eq_answered_plus_lost": m["sent"] == answered + m["lost"],
                    "lost_eq_counted_drops": m["lost"] == drops + m["client_drops"]}
sweep = []
for name in sorted(glob.glob(os.path.join(out, "sweep-*.load.json"))):
    rate = os.path.basename(name)[len("sweep-"):-len(".load.json")]
    w = j(os.path.basename(name))
    if not w or not rate.isdigit():
        continue
    srv = w.get("server") or {}
    sweep.append({"rate": int(rate), "sent": w["sent"], "answered": w["ok"] + sum(w["errors"].values()),
                  "lost": w["lost"], "shed": srv.get("shed", 0), "kernel_drops": srv.get("kernel_drops", 0),
                  "server_drops": server_drops(w),
                  "client_drops": w["client_drops"], "achieved_rps": w.get("throughput_rps")})
if sweep:
    sweep.sort(key=lambda r: r["rate"])
    lossless = [r["rate"] for r in sweep if r["lost"] == 0]
    s["sweep"] = {"runs": sweep, "highest_lossless_rate": max(lossless) if lossless else None}
h1, h2 = j("heavy-gpus-0.load.json"), j("heavy-gpus-0-1.load.json")
if h1 and h2:
    s["two_gpu_rps"] = {"one": h1["throughput_rps"], "two": h2["throughput_rps"]}
    s["two_gpu_ratio"] = ratio(h2["throughput_rps"], h1["throughput_rps"])
for name in ("lenet-profile-header", "echo-profile-header", "lenet-profile-words", "echo-profile-words",
             "lenet-profile-cluster1"):
    r = j(name + ".server.json")
    if r:
        s[name] = {"server_stages_p50_us": {k: v["p50_us"] for k, v in r["report"]["server_stages"].items()},
                   "worker_stages_ns": r["report"].get("worker_stages")}
wrong = {}
for f in os.listdir(out):
    if f.endswith(".load.json"):
        r = j(f)
        if r and r.get("verify_failed"): wrong[f] = r["verify_failed"]
s["verify_failures"] = wrong
with open(os.path.join(out, "summary.json"), "w") as f: json.dump(s, f, indent=2)
print(json.dumps(s, indent=2))
PY
