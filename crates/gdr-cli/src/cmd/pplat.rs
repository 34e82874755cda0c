//! `gdr pplat`: CPU <-> GPU ping-pong with a persistent GPU thread, beside the host-centric
//! round trip (copy in, launch, copy out, synchronize; and as a CUDA graph), measured by
//! `gdr_bench::pplat`.

use super::gpu::{self, GpuArg};
use super::table::Table;
use super::{in_range, CmdResult};
use gdr_bench::pplat::{measure, PplatReport};
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
