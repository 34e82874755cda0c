//! `gdr serve`: the accelerator-centric UDP server (or its host-centric baseline). Runs until
//! SIGINT/SIGTERM or `--duration`, drains in-flight requests, prints totals.

use super::CmdResult;
use gdr_mq::Placement;
use gdr_serve::exec::Idle;
use gdr_serve::gpu::GpuShape;
use gdr_serve::server::{ServeReport, Sockets};
use gdr_serve::wire::Framing;
use gdr_serve::{serve, App, Mode, ServeOptions, ServerConfig};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// App: echo, lenet, vecadd (or --app-file)
    #[arg(long, default_value = "echo")]
    app: String,
    /// A user app: CUDA C defining gdr_serve_app (see docs/serve.md); a regular file of at
    /// most 1 MiB; GPU modes only
    #[arg(long)]
    app_file: Option<std::path::PathBuf>,
    /// Wire id of the user app
    #[arg(long, default_value_t = gdr_serve::apps::ID_USER)]
    app_id: u16,
    /// Largest request payload for echo, vecadd and user apps (bytes, at most 65491: one UDP
    /// datagram)
    #[arg(long, default_value_t = 1024)]
    max_payload: usize,
    /// Repeat each request's computation N times (a heavier app, same answers)
    #[arg(long, default_value_t = 1)]
    work: u32,
    /// LeNet weight seed
    #[arg(long, default_value_t = gdr_serve::apps::DEFAULT_SEED)]
    seed: u32,
    /// gpu-queue (persistent GPU workers), host-centric (copy-launch-copy-sync), or cpu
    #[arg(long, default_value = "gpu-queue")]
    mode: String,
    /// Address to listen on (the default is loopback only; 0.0.0.0:PORT for every interface)
    #[arg(long, default_value = gdr_serve::run::DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// GPU ordinals sharing the load (round robin), comma-separated, at most 64 (--mode cpu:
    /// no GPU is used; each entry is one more CPU queue set)
    #[arg(long, value_delimiter = ',', default_value = "0")]
    gpus: Vec<usize>,
    /// Network threads (CPU cores on the data path; at most 1024). Each polls its own socket
    /// with a receive batch of --batch times the largest request; past the cores they only
    /// take turns. In --mode cpu each also gets, per --gpus entry, a CPU worker thread and a
    /// queue pair in host memory (see --slots), written in full at setup: with the defaults
    /// about 3 MiB a thread, some 3 GiB for 1024. The memory check refuses more than half
    /// of what is free
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Datagrams per recvmmsg/sendmmsg (at most 1024, the kernel's limit per call)
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Slots per queue (a power of two): the most requests a queue holds. A queue pair takes
    /// about 3 x slots x the app's largest message (request or response, echo's is
    /// --max-payload) bytes: 3 MiB with the defaults. There is one per network thread and
    /// GPU, in GPU memory (host memory for --placement host), or in --mode cpu one per thread
    /// and --gpus entry in host memory
    #[arg(long, default_value_t = 1024)]
    slots: u32,
    /// Most requests in flight per queue, 1 to 16777216 (a queue holds no more than --slots
    /// anyway); beyond it requests are shed (counted)
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// Warps per worker block (power of two up to 16) [default: 1 for echo and vecadd, whose
    /// one warp receives, runs the app and sends; 8 for lenet over a cluster; 16 for lenet in
    /// one block and for user apps]
    #[arg(long)]
    warps: Option<u32>,
    /// Worker blocks (SMs) per queue
    #[arg(long, default_value_t = 1)]
    blocks_per_queue: u32,
    /// Blocks (SMs) of the thread-block cluster that serves each queue, each request run over
    /// all of them: 1, or 2, 4 or 8 for lenet on Hopper and later GPUs (replaces
    /// --blocks-per-queue) [default: 8 for lenet where the GPU and the other options allow,
    /// 4 when 8 do not fit, else 1]
    #[arg(long)]
    cluster: Option<u32>,
    /// Workers read the app's resident data (lenet's FC weights) from global memory instead
    /// of keeping it in shared memory
    #[arg(long)]
    no_resident: bool,
    /// GPU-queue workers time their stages (clock64; a little slower) and the totals show
    /// the mean per batch: receive, hand-over to the app warps, app, send
    #[arg(long)]
    profile: bool,
    /// RX slot format: header (a doorbell, then the slot) or words (every 8-byte word carries
    /// its seq and the worker polls the slot: one round trip; one block per queue)
    /// [default: words for echo and vecadd with one block per queue, else header]
    #[arg(long)]
    rx_format: Option<String>,
    /// Queue placement: lynx, host, gpu, crossed
    #[arg(long, default_value = "lynx")]
    placement: String,
    /// Host-centric: requests in flight (streams) per thread and GPU (at most 1024)
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Wire framing: gdr, or sockperf (sockperf's 14-byte header in front, returned)
    #[arg(long, default_value = "gdr")]
    framing: String,
    /// Answer bad input with an error code (by default it is dropped silently; counted
    /// either way). A datagram shorter than the 16-byte error reply still gets none
    #[arg(long)]
    reply_bad: bool,
    /// Drop bad input silently: the default (kept so that older command lines still run)
    #[arg(long, hide = true, conflicts_with = "reply_bad")]
    drop_bad: bool,
    /// Answer stats queries with the server's counters (JSON, about 300 bytes for a 16-byte
    /// query: an 18x amplifier, so only where clients are trusted); `gdr load` uses them to
    /// account for drops. Without it a stats query is bad input
    #[arg(long)]
    stats: bool,
    /// When idle: spin (network threads poll the socket without pause, one core each at
    /// 100 %: the lowest latency) or backoff (after 1 ms, network threads block in poll(2)
    /// until a datagram comes, and the CPU mode's workers nap 1 ms after 10 ms of quiet)
    #[arg(long, default_value = "backoff")]
    idle: String,
    /// How the network threads share the port: shared (one socket, any thread takes any
    /// datagram), per-thread (one socket each with SO_REUSEPORT: no contention for the
    /// socket; the kernel gives each client address to one thread, so a few clients may not
    /// keep every thread busy) or stealing (one socket each, and a thread whose socket is
    /// empty takes at most what it has room for from the others': the busiest socket gets help
    /// at peak load; a thread that finds little pauses between such looks)
    #[arg(long, default_value = "shared")]
    sockets: String,
    /// The same as --idle spin (kept so that older command lines still run)
    #[arg(long, hide = true)]
    busy_poll: bool,
    /// Serve for this many seconds once ready (setup not counted), at most a day (default:
    /// until SIGINT or SIGTERM)
    #[arg(long)]
    duration: Option<f64>,
    /// Print the totals as JSON
    #[arg(long)]
    json: bool,
}

pub fn run(a: ServeArgs) -> CmdResult {
    let duration = a
        .duration
        .map(|s| super::seconds("duration", s))
        .transpose()?;
    let app = match &a.app_file {
        Some(p) => {
            let src = App::read_source(p)?;
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            App::user(&name, src, a.app_id, a.work, a.max_payload)?
        }
        None if a.app == "lenet" => App::lenet(a.seed, a.work)?,
        None => App::builtin(&a.app, a.work, a.max_payload)?,
    };
    let mode = Mode::parse(&a.mode)
        .ok_or_else(|| format!("unknown mode {:?} (gpu-queue, host-centric, cpu)", a.mode))?;
    let placement = Placement::parse(&a.placement).ok_or_else(|| {
        format!(
            "unknown placement {:?} (lynx, host, gpu, crossed)",
            a.placement
        )
    })?;
    let framing = Framing::parse(&a.framing)
        .ok_or_else(|| format!("unknown framing {:?} (gdr, sockperf)", a.framing))?;
    let idle = match Idle::parse(&a.idle) {
        Some(_) if a.busy_poll => Idle::Spin,
        Some(i) => i,
        None => return Err(format!("unknown idle policy {:?} (spin, backoff)", a.idle).into()),
    };
    let sockets = Sockets::parse(&a.sockets).ok_or_else(|| {
        format!(
            "unknown socket sharing {:?} (shared, per-thread, stealing)",
            a.sockets
        )
    })?;
    if a.batch == 0 || a.max_in_flight == 0 || a.streams == 0 {
        return Err("--batch, --max-in-flight and --streams must be at least 1".into());
    }
    if mode == Mode::Cpu {
        // Options of the GPU workers mean nothing here: refused, not ignored.
        let given = [
            ("--warps", a.warps.is_some()),
            ("--cluster", a.cluster.is_some()),
            ("--rx-format", a.rx_format.is_some()),
            ("--blocks-per-queue", a.blocks_per_queue != 1),
            ("--profile", a.profile),
            ("--no-resident", a.no_resident),
        ];
        if let Some((name, _)) = given.iter().find(|(_, g)| *g) {
            return Err(format!(
                "{name} shapes the GPU workers; --mode cpu runs none (leave it out, or use \
                 --mode gpu-queue)"
            )
            .into());
        }
    }
    let opts = ServeOptions {
        listen: a.listen,
        mode,
        gpus: a.gpus.clone(),
        threads: a.threads,
        shape: GpuShape {
            slots: a.slots,
            placement,
            // 0: the app's default for the cluster size the workers get (GpuShape::warps).
            warps: a.warps.unwrap_or(0),
            blocks_per_queue: a.blocks_per_queue,
            resident: !a.no_resident,
            profile: a.profile,
            cluster: a.cluster.unwrap_or(0),
            rx_words: match a.rx_format.as_deref() {
                None => app.default_rx_words() && a.blocks_per_queue == 1,
                Some("header") => false,
                Some("words") => true,
                Some(f) => return Err(format!("unknown RX format {f:?} (header, words)").into()),
            },
        },
        max_in_flight: a.max_in_flight,
        streams: a.streams,
        duration,
        server: ServerConfig {
            framing,
            reply_errors: a.reply_bad && !a.drop_bad,
            stats: a.stats,
            batch: a.batch,
            idle,
            sockets,
            ..Default::default()
        },
    };
    // Until ready a signal ends the process at once: setup (compiling, launching workers,
    // allocating queues) has nothing to drain and does not look at a flag.
    let stop = gdr_serve::signal::stop_flag_after_setup();
    // The CPU mode runs CPU queue sets (one per --gpus entry) and uses no GPU.
    let gpus: &[usize] = if mode == Mode::Cpu { &[] } else { &a.gpus };
    let r = serve(&app, &opts, stop, &mut |addr| {
        gdr_serve::signal::stop_when_ready();
        let on = if mode == Mode::Cpu {
            format!("no GPU ({} CPU queue set(s))", opts.gpus.len())
        } else {
            format!("GPU(s) {gpus:?}")
        };
        eprintln!(
            "gdr serve: ready on {addr}: app {} (id {}, work {}), mode {}, {} thread(s) \
             ({} sockets), {on}",
            app.name(),
            app.id(),
            app.work(),
            mode.name(),
            opts.threads,
            sockets.name(),
        );
    });
    stop.store(true, Ordering::Release);
    let report = r?;
    if a.json {
        let v = serde_json::json!({
            "mode": mode.name(),
            "gpus": gpus,
            "threads": a.threads,
            "work": a.work,
            "report": report,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_totals(mode, &report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_totals(mode: Mode, r: &ServeReport) {
    let c = &r.counters;
    println!(
        "gdr serve: {} in {} mode, {} thread(s) ({} sockets), served {:.1} s after {:.1} s of \
         setup",
        r.app,
        mode.name(),
        r.threads,
        r.sockets.name(),
        r.elapsed_s,
        r.setup_s
    );
    println!(
        "  datagrams {}  accepted {}  answered {}  responses {}  app failed {}  no reply asked {}",
        c.datagrams, c.accepted, c.answered, c.responses, c.app_failed, c.no_reply
    );
    println!(
        "  bad input {} (empty {}, truncated {}, oversized {}, unknown app {}, bad header {}): \
         answered {}, dropped {}",
        c.empty + c.truncated + c.oversized + c.unknown_app + c.bad_header,
        c.empty,
        c.truncated,
        c.oversized,
        c.unknown_app,
        c.bad_header,
        c.bad_replied,
        c.bad_dropped
    );
    println!(
        "  shed {}  kernel drops {}  send failed {}  abandoned {}  stats queries {}{}",
        c.shed,
        c.kernel_drops,
        c.send_failed,
        c.abandoned,
        c.stats_queries,
        if r.sockets == Sockets::Stealing {
            format!("  taken from other threads' sockets {}", c.stolen)
        } else {
            String::new()
        }
    );
    let t = &r.server_time;
    println!(
        "  server time (received -> handed to socket) us: p50 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}  ({} answers)",
        t.p50_us, t.p99_us, t.p999_us, t.max_us, t.count
    );
    let st = &r.server_stages;
    println!(
        "  stages p50 us: dispatch {:.2}  device {:.2}  reply {:.2}",
        st.dispatch.p50_us, st.device.p50_us, st.reply.p50_us
    );
    for w in &r.worker_stages {
        println!(
            "  worker {} ns per batch ({} batches): recv {:.0}  hand-over {:.0}  app {:.0}  send {:.0}",
            w.queue, w.batches, w.recv_ns, w.handoff_ns, w.app_ns, w.send_ns
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ServeArgs,
    }

    #[test]
    fn defaults_expose_nothing_beyond_loopback_and_answer_only_requests() {
        let a = Cli::try_parse_from(["serve"]).unwrap().a;
        assert!(a.listen.ip().is_loopback(), "{}", a.listen);
        assert!(!a.stats && !a.reply_bad);
        let a = Cli::try_parse_from(["serve", "--stats", "--reply-bad"])
            .unwrap()
            .a;
        assert!(a.stats && a.reply_bad);
        assert!(Cli::try_parse_from(["serve", "--reply-bad", "--drop-bad"]).is_err());
    }
}
