//! `gdr mq bench`: round-trip latency per placement, throughput with batching over 1..N
//! queues, and the host-centric baseline, measured in one run on one GPU.

use crate::host_centric::HostCentric;
use crate::stats::ns_quantile_us;
use gdr::cuda::Context;
use gdr_mq::{GpuConfig, GpuWorkers, Handler, MqError, Placement, QueueConfig};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Placements whose one-message round trip is measured (each in every RX format of
    /// `rx_formats`, each with a profiled run for [`GpuStages`]).
    pub placements: Vec<Placement>,
    /// RX formats for latency (false: header + doorbell, true: words); each placement is
    /// measured in each.
    pub rx_formats: Vec<bool>,
    /// Round trips timed per latency point.
    pub latency_iters: usize,
    /// Bytes of the latency message.
    pub latency_size: u32,
    /// Message sizes for throughput.
    pub sizes: Vec<u32>,
    /// Queue counts for throughput.
    pub queues: Vec<u32>,
    /// Placements for throughput.
    pub throughput_placements: Vec<Placement>,
    /// Messages per doorbell.
    pub batch: u32,
    /// Slots per ring in throughput runs.
    pub slots: u32,
    /// Worker warps per queue in throughput runs (header format; the word format has one).
    pub warps_per_queue: u32,
    /// Throughput runs' RX format: the word format (one worker warp per queue), else header.
    pub throughput_rx_words: bool,
    /// Time per throughput point.
    pub duration: Duration,
    /// Runs of each throughput point; the median is reported (with the lowest and highest).
    pub throughput_rounds: u32,
}

impl BenchConfig {
    /// The default run (well under a minute).
    pub fn full() -> Self {
        BenchConfig {
            placements: Placement::ALL.to_vec(),
            rx_formats: vec![false, true],
            latency_iters: 20_000,
            latency_size: 64,
            sizes: vec![64, 1024],
            queues: vec![1, 2, 4, 8],
            throughput_placements: vec![Placement::LYNX, Placement::HOST],
            batch: 64,
            slots: 1024,
            warps_per_queue: 8,
            throughput_rx_words: false,
            duration: Duration::from_millis(500),
            throughput_rounds: 3,
        }
    }

    /// A short run (under ~15 s).
    pub fn quick() -> Self {
        BenchConfig {
            latency_iters: 3_000,
            queues: vec![1, 4],
            throughput_placements: vec![Placement::LYNX],
            duration: Duration::from_millis(200),
            throughput_rounds: 1,
            ..Self::full()
        }
    }
}

/// One latency point: the round trips of one path, timed one at a time.
///
/// A queue path's round trip runs from before `send` to the echoed response in hand after
/// `recv` (one queue, one worker warp, 64 slots); a host-centric one is a whole copy in,
/// launch, copy out and synchronise. The quantiles are the samples at index `floor(n * q)` of
/// the sorted times ([`ns_quantile_us`]); all are NaN when `iters` is 0.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Latency {
    /// `rx-gpu/tx-host`, `host-centric`, `host-centric-graph`.
    pub path: String,
    /// Bytes of the request, and of its echoed response.
    pub size: u32,
    /// Round trips timed (after an untimed warm-up of a tenth as many, at least 100 for a
    /// queue and 50 for the host-centric paths).
    pub iters: usize,
    /// Median round trip, microseconds.
    pub p50_us: f64,
    /// 99th percentile round trip, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile round trip, microseconds.
    pub p999_us: f64,
    /// Mean round trip, microseconds.
    pub mean_us: f64,
    /// Median time inside `send` per round trip (queue placements only): packing the request
    /// and writing it out (stores and the fence that pushes them out of the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_send_p50_us: Option<f64>,
    /// Where a worker's time goes per message (queue placements only), from a separate
    /// profiled run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_stages: Option<GpuStages>,
}

/// A worker's time per one-message batch, by stage, from `clock64` (lane 0).
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuStages {
    /// Claim to requests in hand (slot header read and checked).
    pub recv_ns: f64,
    /// Requests in hand to the handler's return (for a lone message in the word format's
    /// lone-message loop: from the request stored to the warp's buffer).
    pub handler_ns: f64,
    /// Response header and payload stores issued into TX.
    pub tx_copy_ns: f64,
    /// The TX fence stage: 0 since the self-publishing TX word format (kept so older
    /// profiles compare).
    pub tx_fence_ns: f64,
    /// The rated SM clock the cycles were converted with.
    pub clock_mhz: f64,
}

/// One throughput point: `queues` queue pairs each streamed by its own CPU thread, which
/// sends up to `batch` echo requests behind one doorbell whenever half a batch of credits is
/// free (or nothing is in flight) and takes every response there is, for [`BenchConfig::duration`] after a warm-up of a
/// fifth of it. Rates count responses received in the measured interval.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Throughput {
    /// The placement's name, `rx-gpu/tx-host` style ([`Placement::name`]).
    pub placement: String,
    /// `header` or `words`.
    pub rx_format: &'static str,
    /// Bytes of each request and of its echoed response.
    pub size: u32,
    /// Queue pairs streamed at once, one CPU thread and one worker block each.
    pub queues: u32,
    /// Messages per doorbell asked for ([`BenchConfig::batch`]); `per_doorbell` is what the
    /// credits allowed.
    pub batch: u32,
    /// Worker warps serving each queue (1 in the word format).
    pub warps_per_queue: u32,
    /// Responses received over all queues in the measured interval (of the median run).
    pub messages: u64,
    /// The measured interval in seconds: the longest of the threads' (of the median run).
    pub seconds: f64,
    /// The median of `rounds` runs of the point (the figures beside it are that run's).
    pub msgs_per_s: f64,
    /// Runs made of the point ([`BenchConfig::throughput_rounds`]).
    pub rounds: u32,
    /// The lowest rate of the runs, messages per second.
    pub msgs_per_s_min: f64,
    /// The highest rate of the runs, messages per second.
    pub msgs_per_s_max: f64,
    /// Payload bytes per second, one direction.
    pub gbytes_per_s: f64,
    /// Messages per doorbell actually achieved.
    pub per_doorbell: f64,
    /// Share of the CPU threads' time (mean over the threads) in the measured interval
    /// spent sending (`try_send_batch` in passes that sent) and receiving (the receive
    /// loop in passes that took a response). Near 1 together: the CPU threads are the
    /// limit; the rest is passes that found nothing to do, waiting for the GPU.
    pub host_send_share: f64,
    /// The receiving part of that share, 0 to 1 (see `host_send_share`).
    pub host_recv_share: f64,
    /// Share of the CPU threads' passes (send what there is room for, take every response
    /// there is) that found less than half a batch of room in the ring: the workers are
    /// behind.
    pub ring_full_share: f64,
}

/// The result of [`run`]: what `gdr mq bench` prints (and writes as JSON).
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    /// The GPU's name as the driver gives it (empty if it gives none).
    pub device: String,
    /// One point per placement and RX format of the configuration, in that order, then
    /// `host-centric` and `host-centric-graph`.
    pub latency: Vec<Latency>,
    /// One point per throughput placement, size and queue count, in that order; counts above
    /// the GPU's SMs are left out (every worker block must be resident).
    pub throughput: Vec<Throughput>,
    /// The path of the queue latency point with the lowest p50 (`"none"` if no placement was
    /// measured).
    pub best_placement: String,
    /// That point's p50, microseconds (NaN if none).
    pub best_p50_us: f64,
    /// The host-centric p50 over `best_p50_us`: how many times faster the best queue path is
    /// than copy-launch-copy per request.
    pub speedup_vs_host_centric: f64,
    /// The same against the host-centric path replayed as a CUDA graph.
    pub speedup_vs_graph: f64,
}

fn latency_of(path: String, size: u32, mut ns: Vec<u64>) -> Latency {
    ns.sort_unstable();
    // An empty sample (iters = 0) reads as NaN rather than panicking.
    let pick = |q: f64| ns_quantile_us(&ns, q);
    Latency {
        path,
        size,
        iters: ns.len(),
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        p999_us: pick(0.999),
        mean_us: ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0,
        host_send_p50_us: None,
        gpu_stages: None,
    }
}

fn payload(size: u32) -> Vec<u8> {
    (0..size).map(|i| (i * 7 + 3) as u8).collect()
}

fn check(got: &[u8], want: &[u8], what: &str) -> Result<(), MqError> {
    if got != want {
        return Err(MqError::Protocol {
            queue: 0,
            what: format!("{what}: echo returned different bytes"),
        });
    }
    Ok(())
}

/// One-message round trips through one queue with one worker warp, RX in the word format
/// when `rx_words` (the path is then named `<placement> words`).
pub fn queue_latency(
    ctx: &Context,
    placement: Placement,
    rx_words: bool,
    size: u32,
    iters: usize,
) -> Result<Latency, MqError> {
    round_trips(ctx, placement, rx_words, size, iters, false).map(|(l, _)| l)
}

/// As [`queue_latency`], with the worker timing its stages (the clock reads and status
/// writes cost a little, so this is a separate run from the latency it explains).
pub fn queue_stages(
    ctx: &Context,
    placement: Placement,
    rx_words: bool,
    size: u32,
    iters: usize,
) -> Result<GpuStages, MqError> {
    let (_, (cycles, batches)) = round_trips(ctx, placement, rx_words, size, iters, true)?;
    let khz = ctx.device().attribute(gdr::cuda::Attribute::ClockRateKhz)? as f64;
    let per = |c: u64| c as f64 / batches.max(1) as f64 / khz * 1e6;
    Ok(GpuStages {
        recv_ns: per(cycles[0]),
        handler_ns: per(cycles[1]),
        tx_copy_ns: per(cycles[2]),
        tx_fence_ns: per(cycles[3]),
        clock_mhz: khz / 1000.0,
    })
}

fn round_trips(
    ctx: &Context,
    placement: Placement,
    rx_words: bool,
    size: u32,
    iters: usize,
    profile: bool,
) -> Result<(Latency, ([u64; 4], u64)), MqError> {
    let cfg = GpuConfig {
        queue: QueueConfig {
            slots: 64,
            max_msg: size.max(64),
            placement,
            rx_words,
            ..Default::default()
        },
        profile,
        ..Default::default()
    };
    let mut w = GpuWorkers::launch(ctx, &Handler::echo(), &cfg)?;
    let q = w.queue(0);
    let msg = payload(size);
    let mut buf = vec![0u8; size as usize];
    for _ in 0..(iters / 10).max(100) {
        q.call(&msg, &mut buf)?;
    }
    check(&buf, &msg, "latency warm-up")?;
    let mut ns = Vec::with_capacity(iters);
    let mut send_ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        q.send(&msg)?;
        let sent = t.elapsed();
        q.recv(&mut buf)?;
        ns.push(t.elapsed().as_nanos() as u64);
        send_ns.push(sent.as_nanos() as u64);
    }
    check(&buf, &msg, "latency")?;
    let prof = w.queue(0).worker_profile();
    w.stop(Duration::from_secs(5))?;
    let path = if rx_words {
        format!("{} words", placement.name())
    } else {
        placement.name()
    };
    let mut l = latency_of(path, size, ns);
    send_ns.sort_unstable();
    l.host_send_p50_us = send_ns.get(send_ns.len() / 2).map(|&v| v as f64 / 1000.0);
    Ok((l, prof))
}

/// The host-centric baseline: plain and CUDA-graph round trips.
pub fn host_centric_latency(
    ctx: &Context,
    size: u32,
    iters: usize,
) -> Result<(Latency, Latency), MqError> {
    let mut h = HostCentric::new(ctx, &Handler::echo(), size.max(64) as usize)?;
    let msg = payload(size);
    let mut buf = vec![0u8; size as usize];
    let mut run = |graph: bool| -> Result<Vec<u64>, MqError> {
        for _ in 0..(iters / 10).max(50) {
            if graph {
                h.round_trip_graph(&msg, &mut buf)?;
            } else {
                h.round_trip(&msg, &mut buf)?;
            }
        }
        check(&buf, &msg, "host-centric")?;
        let mut ns = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            if graph {
                h.round_trip_graph(&msg, &mut buf)?;
            } else {
                h.round_trip(&msg, &mut buf)?;
            }
            ns.push(t.elapsed().as_nanos() as u64);
        }
        check(&buf, &msg, "host-centric")?;
        Ok(ns)
    };
    let plain = run(false)?;
    let graph = run(true)?;
    Ok((
        latency_of("host-centric".into(), size, plain),
        latency_of("host-centric-graph".into(), size, graph),
    ))
}

/// One CPU thread's share of a throughput point.
struct QueueRun {
    messages: u64,
    doorbells: u64,
    seconds: f64,
    /// Throughput's shares.
    send_share: f64,
    recv_share: f64,
    full_share: f64,
}

/// Where a CPU thread's passes went: time sending (passes that sent), time receiving
/// (passes that took a response), passes in all and passes short of room.
#[derive(Default)]
struct Tally {
    send: Duration,
    recv: Duration,
    passes: u64,
    short: u64,
}

/// Streams `size`-byte messages through `queues` queues (one CPU thread each, `batch`
/// messages per doorbell) for `duration`.
pub fn throughput(
    ctx: &Context,
    placement: Placement,
    size: u32,
    queues: u32,
    bc: &BenchConfig,
) -> Result<Throughput, MqError> {
    let words = bc.throughput_rx_words;
    let warps = if words { 1 } else { bc.warps_per_queue.max(1) };
    let cfg = GpuConfig {
        queue: QueueConfig {
            slots: bc.slots,
            max_msg: size.max(16),
            placement,
            rx_words: words,
            ..Default::default()
        },
        queues,
        blocks_per_queue: 1,
        warps_per_block: warps,
        ..Default::default()
    };
    let mut w = GpuWorkers::launch(ctx, &Handler::echo(), &cfg)?;
    let msg = payload(size);
    let batch: Vec<&[u8]> = vec![&msg[..]; bc.batch.max(1) as usize];
    let duration = bc.duration;
    let results: Vec<Result<QueueRun, MqError>> = std::thread::scope(|s| {
        let handles: Vec<_> = w
            .queues_mut()
            .iter_mut()
            .map(|q| {
                let (batch, msg) = (&batch, &msg);
                s.spawn(move || -> Result<QueueRun, MqError> {
                    ctx.bind()?;
                    let mut bad = 0u64;
                    let mut tally = Tally::default();
                    let mut pump =
                        |q: &mut gdr_mq::QueuePair, tally: &mut Tally| -> Result<(), MqError> {
                            let t0 = Instant::now();
                            let room = (q.credits() as usize).min(batch.len());
                            let mut sent = 0;
                            if room >= batch.len() / 2 || q.in_flight() == 0 {
                                sent = q.try_send_batch(&batch[..room])?;
                            } else {
                                tally.short += 1;
                            }
                            let t1 = Instant::now();
                            let mut got = 0;
                            while let Some(ok) = q.try_recv_with(|b| b.len() == msg.len())? {
                                bad += u64::from(!ok);
                                got += 1;
                            }
                            let t2 = Instant::now();
                            tally.passes += 1;
                            if sent > 0 {
                                tally.send += t1 - t0;
                            }
                            if got > 0 {
                                tally.recv += t2 - t1;
                            }
                            Ok(())
                        };
                    // Warm-up, then the measured interval.
                    let t = Instant::now();
                    while t.elapsed() < duration / 5 {
                        pump(q, &mut tally)?;
                    }
                    let before = q.stats();
                    tally = Tally::default();
                    let t = Instant::now();
                    while t.elapsed() < duration {
                        pump(q, &mut tally)?;
                    }
                    let secs = t.elapsed().as_secs_f64();
                    let after = q.stats();
                    while q.in_flight() > 0 {
                        q.recv_with(|_| ())?;
                    }
                    if bad > 0 {
                        return Err(MqError::Protocol {
                            queue: q.id(),
                            what: format!("{bad} responses had the wrong length"),
                        });
                    }
                    Ok(QueueRun {
                        messages: after.received - before.received,
                        doorbells: after.doorbells - before.doorbells,
                        seconds: secs,
                        send_share: tally.send.as_secs_f64() / secs,
                        recv_share: tally.recv.as_secs_f64() / secs,
                        full_share: tally.short as f64 / tally.passes.max(1) as f64,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    w.stop(Duration::from_secs(5))?;
    let (mut msgs, mut bells, mut secs) = (0u64, 0u64, 0f64);
    let (mut send, mut recv, mut full) = (0f64, 0f64, 0f64);
    for r in results {
        let r = r?;
        msgs += r.messages;
        bells += r.doorbells;
        secs = secs.max(r.seconds);
        send += r.send_share / queues as f64;
        recv += r.recv_share / queues as f64;
        full += r.full_share / queues as f64;
    }
    let rate = msgs as f64 / secs;
    Ok(Throughput {
        placement: placement.name(),
        rx_format: if words { "words" } else { "header" },
        size,
        queues,
        batch: bc.batch,
        warps_per_queue: warps,
        messages: msgs,
        seconds: secs,
        msgs_per_s: rate,
        rounds: 1,
        msgs_per_s_min: rate,
        msgs_per_s_max: rate,
        gbytes_per_s: rate * size as f64 / 1e9,
        per_doorbell: msgs as f64 / bells.max(1) as f64,
        host_send_share: send,
        host_recv_share: recv,
        ring_full_share: full,
    })
}

/// [`throughput`] run `bc.throughput_rounds` times: the median run, with the lowest and
/// highest rates of the rounds (the machine's spread shows beside the figure).
pub fn throughput_median(
    ctx: &Context,
    placement: Placement,
    size: u32,
    queues: u32,
    bc: &BenchConfig,
) -> Result<Throughput, MqError> {
    let rounds = bc.throughput_rounds.max(1);
    let mut runs = (0..rounds)
        .map(|_| throughput(ctx, placement, size, queues, bc))
        .collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.msgs_per_s.total_cmp(&b.msgs_per_s));
    let (min, max) = (runs[0].msgs_per_s, runs[runs.len() - 1].msgs_per_s);
    let mut t = runs.swap_remove(runs.len() / 2);
    t.rounds = rounds;
    t.msgs_per_s_min = min;
    t.msgs_per_s_max = max;
    Ok(t)
}

/// The whole benchmark.
pub fn run(ctx: &Context, bc: &BenchConfig) -> Result<BenchReport, MqError> {
    let mut latency = Vec::new();
    for &p in &bc.placements {
        for &words in &bc.rx_formats {
            let mut l = queue_latency(ctx, p, words, bc.latency_size, bc.latency_iters)?;
            let iters = (bc.latency_iters / 4).max(200);
            l.gpu_stages = Some(queue_stages(ctx, p, words, bc.latency_size, iters)?);
            latency.push(l);
        }
    }
    let base_iters = (bc.latency_iters / 4).max(500);
    let (plain, graph) = host_centric_latency(ctx, bc.latency_size, base_iters)?;
    let best = latency
        .iter()
        .min_by(|a, b| a.p50_us.total_cmp(&b.p50_us))
        .cloned();
    let (best_placement, best_p50) = best
        .map(|l| (l.path, l.p50_us))
        .unwrap_or_else(|| ("none".into(), f64::NAN));
    let speedup = plain.p50_us / best_p50;
    let speedup_graph = graph.p50_us / best_p50;
    latency.push(plain);
    latency.push(graph);
    let mut tput = Vec::new();
    let sms = gdr_mq::sm_count(ctx)?;
    for &p in &bc.throughput_placements {
        for &size in &bc.sizes {
            for &nq in &bc.queues {
                if nq > sms {
                    continue;
                }
                tput.push(throughput_median(ctx, p, size, nq, bc)?);
            }
        }
    }
    Ok(BenchReport {
        device: ctx.device().name().unwrap_or_default(),
        latency,
        throughput: tput,
        best_placement,
        best_p50_us: best_p50,
        speedup_vs_host_centric: speedup,
        speedup_vs_graph: speedup_graph,
    })
}
