//! `gdr pplat`: CPU <-> GPU ping-pong with a persistent GPU thread, beside the host-centric
//! round trip (copy in, launch, copy out, synchronize; and as a CUDA graph).

use super::gpu::{self, GpuArg};
use super::table::Table;
use super::{in_range, CmdResult};
use gdr_bench::pingpong::{
    bar_read_round_trip, host_centric, ping_pong, GpuLoop, PingPongPlacement,
};
use gdr_bench::stats::Summary;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Duration;

/// The most `--rounds`: every round's time is kept, per path.
const MAX_ROUNDS: u32 = 10_000_000;
/// The most `--warmup` rounds.
const MAX_WARMUP: u32 = 1_000_000;
/// The longest `--timeout-ms`: a round trip that takes a minute has failed.
const MAX_TIMEOUT_MS: u64 = 60_000;

#[derive(clap::Args)]
pub struct PplatArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Measured rounds per path, from 1 to 10000000
    #[arg(long, default_value_t = 20_000)]
    pub rounds: u32,
    /// Unmeasured warm-up rounds per path, at most 1000000
    #[arg(long, default_value_t = 1000)]
    pub warmup: u32,
    /// Give up on a round after this many milliseconds, from 1 to 60000
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
pub struct PplatRow {
    pub path: String,
    pub persistent: bool,
    /// The GPU thread's loop (persistent rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_loop: Option<GpuLoop>,
    pub us: Summary,
}

#[derive(Serialize)]
pub struct PplatReport {
    /// The four placements with the reported GPU loop, the loop's variants, the host-centric
    /// rows, and the bus floor (a CPU read of GPU memory).
    pub rows: Vec<PplatRow>,
    /// Host-centric (plain launches) median / best placement's median (reported loop).
    pub speedup_vs_host_centric: f64,
}

/// The GPU loop's variants, each timed in a placement beside the reported loop: the lean loop
/// and each of its two differences alone where the flag is in GPU memory, the lean loop where
/// the GPU polls host memory, 4 and 16 polling warps in both of those placements, 8 loads of
/// the flag in flight a poll where it is in GPU memory, and 2, 4 and 8 pollers in separate
/// blocks (a flag and an answer each) where the GPU polls host memory.
const LOOP_VARIANTS: [(PingPongPlacement, GpuLoop); 12] = [
    (PingPongPlacement::GpuFlagHostAnswer, GpuLoop::LEAN),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            fence: false,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
    ),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            fence: true,
            ..GpuLoop::LEAN
        },
    ),
    (PingPongPlacement::HostFlagHostAnswer, GpuLoop::LEAN),
    (PingPongPlacement::GpuFlagHostAnswer, pollers(4)),
    (PingPongPlacement::GpuFlagHostAnswer, pollers(16)),
    (PingPongPlacement::HostFlagHostAnswer, pollers(4)),
    (PingPongPlacement::HostFlagHostAnswer, pollers(16)),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            loads: 8,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
    ),
    (PingPongPlacement::HostFlagHostAnswer, blocks(2)),
    (PingPongPlacement::HostFlagHostAnswer, blocks(4)),
    (PingPongPlacement::HostFlagHostAnswer, blocks(8)),
];

/// The reported loop with `n` polling warps.
const fn pollers(n: u32) -> GpuLoop {
    GpuLoop {
        pollers: n,
        ..GpuLoop::TIMER_EACH_POLL_FENCED
    }
}

/// The reported loop with `n` pollers in separate blocks.
const fn blocks(n: u32) -> GpuLoop {
    GpuLoop {
        pollers: n,
        blocks: true,
        ..GpuLoop::TIMER_EACH_POLL_FENCED
    }
}

/// The loop of the four placement rows.
const REPORTED: GpuLoop = GpuLoop::TIMER_EACH_POLL_FENCED;

/// The floor row's name: a CPU read of a GPU word through the mapping, one PCIe round trip.
pub const FLOOR_ROW: &str = "floor: 4-byte CPU read of GPU memory (one PCIe round trip)";

pub fn measure(
    be: &gdr::bar::VulkanBackend,
    warmup: u32,
    rounds: u32,
    timeout: Duration,
) -> Result<PplatReport, Box<dyn std::error::Error + Send + Sync>> {
    let mut rows = Vec::new();
    for p in PingPongPlacement::ALL {
        let s = ping_pong(be, p, REPORTED, warmup, rounds, timeout)?;
        rows.push(PplatRow {
            path: p.to_string(),
            persistent: true,
            gpu_loop: Some(REPORTED),
            us: s,
        });
    }
    // The loop's variants, right after the four placements: each placement's row above is the
    // reference they are read against (each run takes tens of milliseconds, short against the
    // host's drift).
    for (p, l) in LOOP_VARIANTS {
        let s = ping_pong(be, p, l, warmup, rounds, timeout)?;
        rows.push(PplatRow {
            path: format!("{p} [{l}]"),
            persistent: true,
            gpu_loop: Some(l),
            us: s,
        });
    }
    // The host-centric loop is several times slower per round (docs/perf.md#ping-pong-gdr-pplat):
    // fewer rounds give the same confidence.
    let hc_rounds = (rounds / 4).max(100);
    let hc = host_centric(be.context(), warmup.min(200), hc_rounds, false)?;
    let graph = host_centric(be.context(), warmup.min(200), hc_rounds, true)?;
    let best = rows
        .iter()
        .filter(|r| r.gpu_loop == Some(REPORTED))
        .map(|r| r.us.median)
        .fold(f64::INFINITY, f64::min);
    let speedup = hc.median / best;
    rows.push(PplatRow {
        path: "host-centric: HtoD copy, launch, DtoH copy, sync".into(),
        persistent: false,
        gpu_loop: None,
        us: hc,
    });
    rows.push(PplatRow {
        path: "host-centric as one CUDA graph, sync".into(),
        persistent: false,
        gpu_loop: None,
        us: graph,
    });
    rows.push(PplatRow {
        path: FLOOR_ROW.into(),
        persistent: false,
        gpu_loop: None,
        us: bar_read_round_trip(be, warmup, rounds)?,
    });
    Ok(PplatReport {
        rows,
        speedup_vs_host_centric: speedup,
    })
}

pub fn print(r: &PplatReport) {
    let mut t = Table::new(&["path", "min us", "median us", "p99 us", "p99.9 us"]);
    for row in &r.rows {
        t.row(vec![
            row.path.clone(),
            format!("{:.2}", row.us.min),
            format!("{:.2}", row.us.median),
            format!("{:.2}", row.us.p99),
            format!("{:.2}", row.us.p999),
        ]);
    }
    t.print();
    println!("persistent GPU thread (best placement) is {:.1}x faster than the host-centric round trip (median)", r.speedup_vs_host_centric);
}

pub fn run(args: PplatArgs) -> CmdResult {
    // Checked before the GPU is opened: on a machine without one, a bad argument is still
    // reported as such. Each path keeps every round's time, and a timeout past the clock's
    // range panicked when added to the start of a wait.
    in_range("rounds", &[args.rounds], 1, MAX_ROUNDS)?;
    in_range("warmup", &[args.warmup], 0, MAX_WARMUP)?;
    in_range("timeout-ms", &[args.timeout_ms], 1, MAX_TIMEOUT_MS)?;
    let be = gpu::open(args.gpu)?;
    let r = measure(
        &be,
        args.warmup,
        args.rounds,
        Duration::from_millis(args.timeout_ms),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print(&r);
    }
    Ok(ExitCode::SUCCESS)
}
