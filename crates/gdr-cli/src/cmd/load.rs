//! `gdr load`: a load generator for `gdr serve`: closed loop (N outstanding) or open loop (a
//! rate); throughput, loss and latency percentiles; answers checked on request.

use super::CmdResult;
use gdr_serve::load::{self, LoadMode, LoadReport, Payload};
use gdr_serve::LoadConfig;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when the run succeeded; 1 when it ran but failed: no \
request was answered, a send failed (the kernel refused a datagram, or the target reported \
its port closed), or an answer was wrong under --verify; 2 on bad arguments or an error that \
stopped the run. Lost requests alone (no answer within --timeout-ms) do not fail a run: an \
overloaded server sheds them by design."
)]
pub struct LoadArgs {
    /// Server address
    #[arg(long, default_value = "127.0.0.1:9000")]
    target: std::net::SocketAddr,
    /// What to send: echo, lenet, vecadd, or raw (bytes to --app-id, unchecked)
    #[arg(long, default_value = "echo")]
    app: String,
    /// App id for --app raw
    #[arg(long, default_value_t = gdr_serve::apps::ID_USER)]
    app_id: u16,
    /// Payload bytes (echo, raw); header and payload must fit in one UDP datagram (at most
    /// 65491 over IPv4)
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// f32 pairs per vecadd request (at most 8186: one UDP datagram)
    #[arg(long, default_value_t = 64)]
    n: usize,
    /// Distinct lenet images (at most 1048576)
    #[arg(long, default_value_t = 256)]
    images: usize,
    /// LeNet weight seed (must match the server's for --verify)
    #[arg(long, default_value_t = gdr_serve::apps::DEFAULT_SEED)]
    seed: u32,
    /// Closed loop: requests outstanding per thread (at most 65536)
    #[arg(long, default_value_t = 1)]
    outstanding: usize,
    /// Open loop: requests per second in total, more than 0 and at most 1e9; the first is
    /// sent at once (overrides --outstanding)
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds of sending, more than 0 and at most a day, counted from the start of the
    /// first thread; then the run waits up to --timeout-ms for the last answers
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many requests in total (at least 1)
    #[arg(long)]
    requests: Option<u64>,
    /// Client threads (one socket each; at most 1024, and their buffers within half the free
    /// memory). With more threads than cores, a thread that has nothing to read sleeps on its
    /// socket (until an answer, its next due request, or 10 ms) instead of spinning
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A request unanswered this long is lost (ms, 1 to 60000)
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Check every answer (echo bytes, vecadd sums, lenet logits against the CPU reference)
    #[arg(long)]
    verify: bool,
    /// Datagrams per sendmmsg/recvmmsg (at most 1024, the kernel's limit per call)
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Do not ask the server for its counters (a server answers them only with --stats)
    #[arg(long)]
    no_server_stats: bool,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

pub fn run(a: LoadArgs) -> CmdResult {
    let payload = match a.app.as_str() {
        "echo" => Payload::Echo { size: a.size },
        "lenet" => Payload::Lenet {
            seed: a.seed,
            images: a.images.max(1),
        },
        "vecadd" => Payload::Vecadd { n: a.n.max(1) },
        "raw" => Payload::Raw {
            app: a.app_id,
            size: a.size,
        },
        other => return Err(format!("unknown app {other:?} (echo, lenet, vecadd, raw)").into()),
    };
    let duration = super::positive_seconds("duration", a.duration)?;
    let cfg = LoadConfig {
        target: a.target,
        payload,
        mode: match a.rate {
            Some(rate) => LoadMode::Open { rate },
            None => LoadMode::Closed {
                outstanding: a.outstanding,
            },
        },
        duration,
        requests: a.requests,
        threads: a.threads,
        timeout: Duration::from_millis(a.timeout_ms),
        verify: a.verify,
        batch: a.batch,
        server_stats: !a.no_server_stats,
    };
    let stop = gdr_serve::signal::stop_flag();
    let r = load::run(&cfg, stop)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    Ok(match r.failure() {
        Some(why) => {
            eprintln!("gdr load: FAILED: {why}");
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    })
}

fn print_report(r: &LoadReport) {
    println!(
        "gdr load: {}, {}, {} thread(s), {:.2} s",
        r.mode.expect("set by run"),
        r.payload.as_ref().expect("set by run"),
        r.threads,
        r.elapsed_s
    );
    let errors = if r.errors.is_empty() {
        "0".to_string()
    } else {
        let each: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!("{} ({})", r.errors.values().sum::<u64>(), each.join(", "))
    };
    println!(
        "  sent {}  ok {}  errors {errors}  lost {}  stray {}  client drops {}",
        r.sent, r.ok, r.lost, r.stray, r.client_drops
    );
    if r.send_failed + r.refused > 0 {
        println!(
            "  send failed {} ({})  port unreachable reports {}",
            r.send_failed,
            r.send_error.as_deref().unwrap_or("-"),
            r.refused
        );
    }
    if r.verified + r.verify_failed > 0 {
        println!("  verified {}  WRONG {}", r.verified, r.verify_failed);
    }
    let l = &r.latency;
    if r.answered() == 0 {
        println!("  no request was answered: no throughput or latency to report");
    } else {
        println!(
            "  throughput {:.0} req/s   latency us: p50 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}",
            r.throughput_rps, l.p50_us, l.p99_us, l.p999_us, l.max_us
        );
    }
    if r.server.is_none() && r.server_stats {
        println!("  server: no counters (a server answers them only with --stats)");
    }
    if let Some(s) = &r.server {
        println!(
            "  server: accepted {}  responses {}  shed {}  kernel drops {}  bad {}  (dropped total {})",
            s.accepted,
            s.responses,
            s.shed,
            s.kernel_drops,
            s.bad_replied + s.bad_dropped,
            s.dropped()
        );
    }
}
