//! `gdr mq`: message queues between the host and persistent GPU workers.

use super::{in_range, CmdResult};
use gdr::cuda::Context;
use gdr_bench::mq::{self as bench, BenchConfig, BenchReport};
use gdr_mq::Placement;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MqArgs {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Round-trip latency per ring placement, throughput over 1..N queues with batching, and
    /// the host-centric copy-launch-copy baseline, in one run
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// GPU ordinal
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Short run (under ~15 s)
    #[arg(long)]
    quick: bool,
    /// Print JSON instead of tables
    #[arg(long)]
    json: bool,
    /// Placements for the latency test (lynx, host, gpu, crossed or rx-X/tx-Y), comma-separated
    #[arg(long, value_delimiter = ',')]
    placements: Option<Vec<String>>,
    /// RX formats for the latency test: header (slot header + doorbell), words (every word
    /// carries its seq; the worker polls the slots), or both
    #[arg(long, value_enum, default_value_t = RxFormats::Both)]
    rx_format: RxFormats,
    /// Placements for the throughput test, comma-separated
    #[arg(long, value_delimiter = ',')]
    throughput_placements: Option<Vec<String>>,
    /// Queue counts for the throughput test, comma-separated (each from 1 to 1024; counts over
    /// the GPU's SM count are left out)
    #[arg(long, value_delimiter = ',')]
    queues: Option<Vec<u32>>,
    /// Message sizes in bytes for the throughput test, comma-separated (each from 1 to 1048576)
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<u32>>,
    /// Messages per doorbell, from 1 to 1024 (a ring's slots)
    #[arg(long)]
    batch: Option<u32>,
    /// Worker warps per queue in the throughput test, from 1 to 32 (header format; words has
    /// one)
    #[arg(long)]
    warps: Option<u32>,
    /// RX format of the throughput test: header (claimed by doorbell, --warps workers per
    /// queue) or words (one worker warp per queue polls the slots)
    #[arg(long, value_enum, default_value_t = RxFormat::Header)]
    throughput_rx_format: RxFormat,
    /// Round trips per latency point, from 1 to 10000000
    #[arg(long)]
    iters: Option<usize>,
    /// Bytes of the latency test's message, from 1 to 4096 (default 64)
    #[arg(long)]
    latency_size: Option<u32>,
    /// Milliseconds per throughput point, from 1 to 60000
    #[arg(long)]
    ms: Option<u64>,
    /// Runs of each throughput point, from 1 to 100; the median is shown, with the lowest and
    /// highest (default 3, 1 with --quick)
    #[arg(long)]
    rounds: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum RxFormat {
    Header,
    Words,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RxFormats {
    Header,
    Words,
    Both,
}

fn placements(v: &[String]) -> Result<Vec<Placement>, String> {
    v.iter()
        .map(|s| {
            Placement::parse(s).ok_or_else(|| {
                format!("unknown placement {s:?} (lynx, host, gpu, crossed or rx-X/tx-Y)")
            })
        })
        .collect()
}

pub fn run(args: MqArgs) -> CmdResult {
    match args.cmd {
        Cmd::Bench(a) => run_bench(a),
    }
}

fn run_bench(a: BenchArgs) -> CmdResult {
    let mut bc = if a.quick {
        BenchConfig::quick()
    } else {
        BenchConfig::full()
    };
    bc.rx_formats = match a.rx_format {
        RxFormats::Header => vec![false],
        RxFormats::Words => vec![true],
        RxFormats::Both => vec![false, true],
    };
    if let Some(p) = &a.placements {
        bc.placements = placements(p)?;
    }
    if let Some(p) = &a.throughput_placements {
        bc.throughput_placements = placements(p)?;
    }
    // Every number is checked here, before the GPU is opened: on a machine without one, a bad
    // argument is still reported as such. 0 warps and 0 ms became 1 silently.
    if let Some(q) = a.queues {
        in_range("queues", &q, 1, 1024)?;
        bc.queues = q;
    }
    if let Some(s) = a.sizes {
        in_range("sizes", &s, 1, 1 << 20)?;
        bc.sizes = s;
    }
    if let Some(b) = a.batch {
        // A doorbell cannot carry more messages than the ring has slots.
        in_range("batch", &[b], 1, bc.slots)?;
        bc.batch = b;
    }
    if let Some(w) = a.warps {
        // A queue's workers are one block: at most 1024 threads.
        in_range("warps", &[w], 1, 32)?;
        bc.warps_per_queue = w;
    }
    bc.throughput_rx_words = a.throughput_rx_format == RxFormat::Words;
    if let Some(r) = a.rounds {
        in_range("rounds", &[r], 1, 100)?;
        bc.throughput_rounds = r;
    }
    if let Some(i) = a.iters {
        // Every round trip's time is kept.
        in_range("iters", &[i], 1, 10_000_000)?;
        bc.latency_iters = i;
    }
    if let Some(size) = a.latency_size {
        in_range("latency-size", &[size], 1, 4096)?;
        bc.latency_size = size;
    }
    if let Some(ms) = a.ms {
        in_range("ms", &[ms], 1, super::MAX_BUDGET_MS)?;
        bc.duration = Duration::from_millis(ms);
    }
    let ctx = Context::on(a.gpu)?;
    let report = bench::run(&ctx, &bc)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_tables(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_tables(r: &BenchReport) {
    println!("gdr mq bench on {}", r.device);
    println!();
    println!("round trip, one message at a time");
    println!(
        "{:<22} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "path", "bytes", "iters", "p50 us", "p99 us", "p999 us", "mean us", "send us"
    );
    for l in &r.latency {
        let send = l
            .host_send_p50_us
            .map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<22} {:>6} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9}",
            l.path, l.size, l.iters, l.p50_us, l.p99_us, l.p999_us, l.mean_us, send
        );
    }
    println!("(send us: median time in `send`, packing and writing the request out)");
    println!(
        "best queue placement {} at p50 {:.2} us: {:.1}x lower than copy-launch-copy, {:.1}x \
         lower than its CUDA graph",
        r.best_placement, r.best_p50_us, r.speedup_vs_host_centric, r.speedup_vs_graph
    );
    println!();
    println!("worker time per message (clock64 at the rated clock, separate profiled run)");
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9}",
        "path", "recv ns", "handler", "tx copy", "tx fence"
    );
    for l in &r.latency {
        if let Some(g) = &l.gpu_stages {
            println!(
                "{:<22} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
                l.path, g.recv_ns, g.handler_ns, g.tx_copy_ns, g.tx_fence_ns
            );
        }
    }
    println!();
    println!("throughput, batched doorbells, one CPU thread per queue");
    println!(
        "{:<16} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>15} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "placement",
        "rx",
        "bytes",
        "queues",
        "batch",
        "warps",
        "Mmsg/s",
        "(low..high)",
        "GB/s",
        "msg/bell",
        "cpu send",
        "cpu recv",
        "ring full"
    );
    for t in &r.throughput {
        println!(
            "{:<16} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8.2} {:>15} {:>8.2} {:>9.1} {:>8.0}% {:>8.0}% {:>8.0}%",
            t.placement,
            t.rx_format,
            t.size,
            t.queues,
            t.batch,
            t.warps_per_queue,
            t.msgs_per_s / 1e6,
            format!(
                "({:.2}..{:.2})",
                t.msgs_per_s_min / 1e6,
                t.msgs_per_s_max / 1e6
            ),
            t.gbytes_per_s,
            t.per_doorbell,
            100.0 * t.host_send_share,
            100.0 * t.host_recv_share,
            100.0 * t.ring_full_share
        );
    }
}
