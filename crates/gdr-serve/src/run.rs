//! A whole server run in one call: the backends built for a mode, the network threads
//! started, stopped by a flag, drained, the workers stopped. Used by `gdr serve` and the GPU
//! tests.

use crate::apps::{App, AppKind};
use crate::exec::{cpu_workers, split_queues, Executor};
use crate::gpu::{launch_workers, worker_stages, GpuShape, HostCentricExec};
use crate::server::{ServeReport, Server, ServerConfig};
use crate::ServeError;
use gdr::cuda::Context;
use gdr_mq::layout::Geometry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where requests are executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Mode {
    /// Payloads straight into GPU queues, persistent GPU workers (the Lynx design).
    GpuQueue,
    /// Copy in, launch, copy out, synchronise, per request.
    HostCentric,
    /// CPU threads behind the same queues (no GPU; for tests and as a reference).
    Cpu,
}

impl Mode {
    /// The mode a command line names: `gpu-queue` (or `gpu`, `lynx`), `host-centric` (or
    /// `host`), `cpu`; None for anything else.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "gpu-queue" | "gpu" | "lynx" => Some(Mode::GpuQueue),
            "host-centric" | "host" => Some(Mode::HostCentric),
            "cpu" => Some(Mode::Cpu),
            _ => None,
        }
    }

    /// The mode's canonical command-line name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::GpuQueue => "gpu-queue",
            Mode::HostCentric => "host-centric",
            Mode::Cpu => "cpu",
        }
    }
}

/// Where a server listens unless told otherwise: loopback only, so that a server started to
/// try something is not open to the network.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9000";

/// Everything a whole server run ([`serve`]) needs besides the app; checked by
/// [`check`](Self::check) before anything is allocated.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The UDP address to bind ([`DEFAULT_LISTEN`] by default: loopback only).
    pub listen: SocketAddr,
    /// Where requests are executed.
    pub mode: Mode,
    /// GPU ordinals; requests go round robin over them (CPU mode: that many CPU queue sets).
    pub gpus: Vec<usize>,
    /// Network threads (CPU cores on the data path).
    pub threads: usize,
    /// The GPU side (queue slots, placement, worker blocks, clusters); CPU mode uses only its
    /// `slots`, host-centric mode only its `warps`.
    pub shape: GpuShape,
    /// Most requests in flight per queue (bounds queueing delay; the rest is shed).
    pub max_in_flight: usize,
    /// Host-centric: streams (requests in flight) per network thread and GPU.
    pub streams: usize,
    /// How the network threads behave (framing, batch, error replies, idling).
    pub server: ServerConfig,
    /// Serve for this long, counted from when the backends are ready (setup, such as
    /// compiling and launching GPU workers, is not serving time); None: until `stop`.
    pub duration: Option<Duration>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: DEFAULT_LISTEN.parse().expect("literal"),
            mode: Mode::GpuQueue,
            gpus: vec![0],
            threads: 1,
            shape: GpuShape::default(),
            max_in_flight: 256,
            streams: 4,
            server: ServerConfig::default(),
            duration: None,
        }
    }
}

impl ServeOptions {
    /// Every number within its bound (`limits.rs`: [`MAX_THREADS`](crate::limits::MAX_THREADS) and the
    /// rest), the buffers and (CPU mode) the queues within this machine's memory, and the app
    /// runnable in the mode: all before anything is allocated or announced ready.
    pub fn check(&self, app: &App) -> Result<(), ServeError> {
        use crate::limits::*;
        if self.threads == 0 || self.gpus.is_empty() || self.server.batch == 0 {
            return Err(ServeError::Config(
                "need at least one thread, one GPU (--gpus) and a --batch of at least 1".into(),
            ));
        }
        at_most(
            "threads",
            self.threads,
            MAX_THREADS,
            "network threads, one core each",
        )?;
        at_most(
            "batch",
            self.server.batch,
            MAX_BATCH,
            "the kernel sends and receives at most 1024 datagrams a call",
        )?;
        at_most(
            "gpus",
            self.gpus.len(),
            MAX_QUEUE_SETS,
            "entries; the largest nodes have 16 GPUs",
        )?;
        at_most("streams", self.streams, MAX_STREAMS, "per thread and GPU")?;
        at_most(
            "max-in-flight",
            self.max_in_flight,
            MAX_IN_FLIGHT,
            "per queue, which holds at most 2^24 requests",
        )?;
        if self.mode == Mode::Cpu && matches!(app.kind(), AppKind::User { .. }) {
            return Err(ServeError::Config(format!(
                "{}: a CUDA app (--app-file) runs only on a GPU; --mode cpu serves echo, lenet \
                 and vecadd",
                app.name()
            )));
        }
        // Receive buffers: one batch of the largest request per network thread.
        let cap = app.max_request() + self.server.framing.header_len() + 1;
        let mut need = thread_bytes(self.threads, self.server.batch, cap);
        let mut lower = "fewer --threads or a smaller --batch or --max-payload";
        if self.mode == Mode::Cpu {
            // One queue pair per network thread and queue set, in plain memory, each served
            // by a CPU worker thread.
            let g = Geometry::new(self.shape.slots, app.slot_payload() as u32)
                .map_err(|e| ServeError::Config(format!("--slots: {e}")))?;
            let pairs = (self.threads * self.gpus.len()) as u64;
            let per = (g.rx_bytes() + g.tx_bytes()) as u64 + thread_bytes(1, 0, 0);
            need = need.saturating_add(pairs.saturating_mul(per));
            lower =
                "fewer --threads or --gpus entries, or smaller --slots, --batch or --max-payload";
        }
        check_memory("the server's buffers and queues", need, lower)
    }
}

/// Builds the backends, serves until `stop` (or for `o.duration` once ready), drains and
/// tears down. `on_ready` gets the bound address once requests can be served. The report's
/// `setup_s` is the time from this call to ready; its `elapsed_s` the serving time after.
pub fn serve(
    app: &App,
    o: &ServeOptions,
    stop: &AtomicBool,
    on_ready: &mut dyn FnMut(SocketAddr),
) -> Result<ServeReport, ServeError> {
    o.check(app)?;
    let t_setup = Instant::now();
    let mut setup_s = 0.0;
    let mut on_ready = |addr| {
        setup_s = t_setup.elapsed().as_secs_f64();
        on_ready(addr)
    };
    let server = Server::bind(o.listen, &o.server)?;
    let addr = server.local_addr()?;
    let report = serve_on(&server, addr, app, o, stop, &mut on_ready);
    report.map(|mut r| {
        r.setup_s = setup_s;
        r
    })
}

fn serve_on(
    server: &Server,
    addr: SocketAddr,
    app: &App,
    o: &ServeOptions,
    stop: &AtomicBool,
    on_ready: &mut dyn FnMut(SocketAddr),
) -> Result<ServeReport, ServeError> {
    match o.mode {
        Mode::GpuQueue => {
            let mut sets = Vec::new();
            let mut ctxs = Vec::new();
            for &g in &o.gpus {
                let ctx = Context::on(g)?;
                if app.resident_bytes() > 0 {
                    let smem = crate::gpu::resident_shared_mem(&ctx, app, &o.shape)?;
                    eprintln!(
                        "gdr serve: GPU {g}: {} resident data ({} B) in {} memory",
                        app.name(),
                        app.resident_bytes(),
                        if smem > 0 { "shared" } else { "global" }
                    );
                }
                sets.push((g, launch_workers(&ctx, app, o.threads as u32, &o.shape)?));
                ctxs.push(ctx);
            }
            let lanes = split_queues(
                sets.iter_mut()
                    .map(|(g, w)| (format!("gpu{g}"), w.queues_mut()))
                    .collect(),
                o.threads,
                o.max_in_flight,
            )?;
            on_ready(addr);
            let mut report = run_for(server, o, app, lanes, stop);
            if let (Ok(r), true) = (&mut report, o.shape.profile) {
                for ((g, w), ctx) in sets.iter().zip(&ctxs) {
                    match worker_stages(ctx, &format!("gpu{g}"), w) {
                        Ok(s) => r.worker_stages.extend(s),
                        Err(e) => eprintln!("gdr-serve: worker stages of GPU {g}: {e}"),
                    }
                }
            }
            for (g, w) in &mut sets {
                if let Err(e) = w.stop(Duration::from_secs(5)) {
                    eprintln!("gdr-serve: stopping the workers on GPU {g}: {e}");
                }
            }
            report
        }
        Mode::HostCentric => {
            let mut lanes: Vec<Vec<Box<dyn Executor>>> = Vec::new();
            let ctxs = o
                .gpus
                .iter()
                .map(|&g| Context::on(g))
                .collect::<Result<Vec<_>, _>>()?;
            for t in 0..o.threads {
                let mut l: Vec<Box<dyn Executor>> = Vec::new();
                for (ctx, g) in ctxs.iter().zip(&o.gpus) {
                    l.push(Box::new(HostCentricExec::new(
                        ctx,
                        app,
                        o.streams,
                        // Host-centric launches are one block a request: the one-block default.
                        if o.shape.warps == 0 {
                            app.default_warps()
                        } else {
                            o.shape.warps
                        },
                        format!("gpu{g}/hc{t}"),
                    )?));
                }
                lanes.push(l);
            }
            on_ready(addr);
            run_for(server, o, app, lanes, stop)
        }
        Mode::Cpu => {
            let mut sets = (0..o.gpus.len())
                .map(|_| cpu_workers(app, o.threads, o.shape.slots, o.server.idle))
                .collect::<Result<Vec<_>, _>>()?;
            let lanes = split_queues(
                sets.iter_mut()
                    .enumerate()
                    .map(|(i, w)| (format!("cpu{i}"), w.queues_mut()))
                    .collect(),
                o.threads,
                o.max_in_flight,
            )?;
            on_ready(addr);
            run_for(server, o, app, lanes, stop)
        }
    }
}

/// Runs the server until `stop`, or for `o.duration` from now (the backends are ready).
fn run_for<'a>(
    server: &Server,
    o: &ServeOptions,
    app: &App,
    lanes: Vec<Vec<Box<dyn Executor + 'a>>>,
    stop: &AtomicBool,
) -> Result<ServeReport, ServeError> {
    let Some(d) = o.duration else {
        return server.run(&o.server, app, lanes, stop);
    };
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while !done.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
                let left = d.saturating_sub(start.elapsed());
                if left.is_zero() {
                    stop.store(true, Ordering::Release);
                    break;
                }
                // Short naps: a server that stops early (signal, failure) is not held up.
                std::thread::sleep(left.min(Duration::from_millis(10)));
            }
        });
        let r = server.run(&o.server, app, lanes, stop);
        done.store(true, Ordering::Release);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_server_listens_on_loopback_only() {
        let o = ServeOptions::default();
        assert!(o.listen.ip().is_loopback(), "{}", o.listen);
        assert!(!o.server.stats && !o.server.reply_errors);
    }
}
