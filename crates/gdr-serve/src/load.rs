//! The load generator behind `gdr load`: closed loop (N requests outstanding) or open loop (a
//! fixed send rate), over one or more client sockets; latency from send to answer in a
//! histogram; answers checked against the CPU reference on request.
//!
//! Every request is accounted for at the end: answered (ok, error code), lost (no answer
//! within the timeout), and the client socket's own kernel drops, so that with the server's
//! counters `sent = answered + lost` and `lost = server drops + client drops` can be checked.
//! Datagrams the kernel would not send are counted apart (`send_failed`, not in `sent`), and
//! so are the target's port-unreachable reports (`refused`); [`LoadReport::failure`] says
//! whether the run as a whole failed.

use crate::apps::{self, App};
use crate::lenet;
use crate::net::{self, RecvBatch, SendBatch};
use crate::wire::{self, Status};
use crate::ServeError;
use gdr::timing::{Histogram, LatencySummary};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the load generator paces its requests.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum LoadMode {
    /// Closed loop: a new request goes out as an answer comes back (or its request is lost).
    Closed {
        /// Requests kept outstanding per client thread (1 to
        /// [`MAX_OUTSTANDING`](crate::limits::MAX_OUTSTANDING)).
        outstanding: usize,
    },
    /// Open loop: requests go out on a schedule, whatever comes back.
    Open {
        /// Requests per second over all client threads (above 0, at most
        /// [`MAX_RATE`](crate::limits::MAX_RATE)).
        rate: f64,
    },
}

/// What to send.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum Payload {
    /// Requests for `echo`: bytes derived from the request id, so that the answer can be
    /// checked without keeping the request.
    Echo {
        /// Payload bytes per request.
        size: usize,
    },
    /// Requests for `lenet`: 28x28 images, cycled through by request id, with their reference
    /// logits for checking.
    Lenet {
        /// The weight seed the server's lenet runs with (the references are computed with
        /// it).
        seed: u32,
        /// Distinct images (at least 1, at most [`MAX_IMAGES`](crate::limits::MAX_IMAGES)).
        images: usize,
    },
    /// Requests for `vecadd`: `n` f32 pairs derived from the request id.
    Vecadd {
        /// Elements of each vector: the payload is `8 * n` bytes, the answer `4 * n`.
        n: usize,
    },
    /// Bytes derived from the request id to any app; answers are not checked.
    Raw {
        /// The app id the requests carry.
        app: u16,
        /// Payload bytes per request.
        size: usize,
    },
}

impl Payload {
    /// Bytes of one request datagram (header included).
    /// Saturates: a size near `usize::MAX` must not wrap to a small one and pass the check.
    pub fn request_bytes(&self) -> usize {
        wire::HEADER_LEN.saturating_add(match *self {
            Payload::Echo { size } | Payload::Raw { size, .. } => size,
            Payload::Vecadd { n } => n.saturating_mul(8),
            Payload::Lenet { .. } => lenet::IMAGE_BYTES,
        })
    }

    /// Refuses a payload whose request would not fit in one UDP datagram of at most `max`
    /// bytes, naming the largest that fits.
    fn check_fits(&self, max: usize) -> Result<(), ServeError> {
        let bytes = self.request_bytes();
        if bytes <= max {
            return Ok(());
        }
        let room = max - wire::HEADER_LEN;
        let largest = match self {
            Payload::Vecadd { .. } => format!("--n at most {}", room / 8),
            _ => format!("--size at most {room}"),
        };
        Err(ServeError::Config(format!(
            "a request of {bytes} bytes ({}-byte header and payload) does not fit in a UDP \
             datagram (at most {max} bytes): {largest}",
            wire::HEADER_LEN
        )))
    }
}

impl std::fmt::Display for LoadMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadMode::Closed { outstanding } => {
                write!(f, "closed loop, {outstanding} outstanding per thread")
            }
            LoadMode::Open { rate } => write!(f, "open loop, {rate} requests/s"),
        }
    }
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Echo { size } => write!(f, "echo of {size} B"),
            Payload::Lenet { seed, images } => {
                write!(f, "lenet, {images} distinct images (seed {seed})")
            }
            Payload::Vecadd { n } => write!(f, "vecadd of {n} pairs"),
            Payload::Raw { app, size } => write!(f, "{size} B to app {app}"),
        }
    }
}

/// Largest UDP payload to `t`: 65535 less the UDP header and, over IPv4, the IP header.
fn max_datagram(t: SocketAddr) -> usize {
    match t {
        SocketAddr::V4(_) => wire::MAX_DATAGRAM,
        SocketAddr::V6(_) => 65535 - 8,
    }
}

/// What a load run sends, where and how ([`run`]); checked by
/// [`check`](Self::check) before anything is allocated.
///
/// # Examples
///
/// ```
/// use gdr_serve::load::Payload;
/// use gdr_serve::{LoadConfig, ServeError};
///
/// let cfg = LoadConfig { payload: Payload::Echo { size: 1000 }, threads: 2, ..Default::default() };
/// assert!(cfg.check().is_ok());
/// assert_eq!(cfg.payload.request_bytes(), gdr_serve::wire::HEADER_LEN + 1000);
/// // A request must fit in one UDP datagram: refused before anything is sent.
/// let huge = LoadConfig { payload: Payload::Echo { size: 70_000 }, ..cfg.clone() };
/// assert!(matches!(huge.check(), Err(ServeError::Config(why)) if why.contains("does not fit")));
/// assert!(LoadConfig { threads: 0, ..cfg }.check().is_err());
/// ```
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The server's address (IPv4 or IPv6).
    pub target: SocketAddr,
    /// What each request carries.
    pub payload: Payload,
    /// Closed or open loop.
    pub mode: LoadMode,
    /// Sending stops after this long, or after `requests` in total, whichever is first.
    pub duration: Duration,
    /// Requests to send in all, shared out over the threads; None: as many as `duration`
    /// allows.
    pub requests: Option<u64>,
    /// Client threads (each its own socket).
    pub threads: usize,
    /// A request unanswered for this long is lost.
    pub timeout: Duration,
    /// Check answers (echo bytes, vecadd sums, lenet logits within 1e-4).
    pub verify: bool,
    /// Datagrams per sendmmsg / recvmmsg.
    pub batch: usize,
    /// Ask the server for its counters before and after.
    pub server_stats: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            target: "127.0.0.1:9000".parse().expect("literal"),
            payload: Payload::Echo { size: 64 },
            mode: LoadMode::Closed { outstanding: 1 },
            duration: Duration::from_secs(5),
            requests: None,
            threads: 1,
            timeout: Duration::from_secs(1),
            verify: false,
            batch: 32,
            server_stats: true,
        }
    }
}

/// What a load run did: every request accounted for (`sent = answered + lost` once the run
/// has waited out its timeout), latency, throughput and, when asked, the server's counters.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LoadReport {
    /// The configuration's mode (None only in a default-built report).
    pub mode: Option<LoadMode>,
    /// The configuration's payload (None only in a default-built report).
    pub payload: Option<Payload>,
    /// Client threads.
    pub threads: usize,
    /// Seconds from the start of sending to the last thread's end (its drain included).
    pub elapsed_s: f64,
    /// Datagrams the kernel took.
    pub sent: u64,
    /// Datagrams the kernel would not send (an error, or its buffer full for 50 ms); not in
    /// `sent`.
    pub send_failed: u64,
    /// The last error of a failed send.
    pub send_error: Option<String>,
    /// ICMP port-unreachable reports for sent datagrams: the target port was closed.
    pub refused: u64,
    /// Answers with status ok.
    pub ok: u64,
    /// Answers with an error status, by name.
    pub errors: BTreeMap<String, u64>,
    /// No answer within the timeout.
    pub lost: u64,
    /// Answers for requests already counted lost, or not ours.
    pub stray: u64,
    /// Datagrams the client's own sockets dropped (buffer full).
    pub client_drops: u64,
    /// Ok answers checked and right (with `verify`).
    pub verified: u64,
    /// Ok answers checked and wrong (with `verify`): the run fails.
    pub verify_failed: u64,
    /// Ok answers per second over the sending period.
    pub throughput_rps: f64,
    /// Send to answer, over every answered request (ok or error status), in microseconds.
    pub latency: LatencySummary,
    /// Whether the server was asked for its counters.
    pub server_stats: bool,
    /// The server's counters, after minus before (when it answered the queries: a server
    /// answers them only with `--stats`).
    pub server: Option<crate::server::Counters>,
}

impl LoadReport {
    /// Requests answered, with ok or with an error status.
    pub fn answered(&self) -> u64 {
        self.ok + self.errors.values().sum::<u64>()
    }

    /// Why the run failed, if it did: no request answered, a send failed, the target
    /// reported its port closed, or (with `verify`) a wrong answer. Lost requests alone are
    /// no failure: an overloaded server sheds them by design.
    pub fn failure(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.answered() == 0 {
            why.push(format!("no request was answered ({} sent)", self.sent));
        }
        if self.send_failed > 0 {
            why.push(format!(
                "{} send(s) failed ({})",
                self.send_failed,
                self.send_error.as_deref().unwrap_or("no error given")
            ));
        }
        if self.refused > 0 {
            why.push(format!(
                "the target reported its port closed {} time(s) (ICMP port unreachable)",
                self.refused
            ));
        }
        if self.verify_failed > 0 {
            why.push(format!("{} wrong answer(s)", self.verify_failed));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// Request bytes and the expected answer, by request number.
struct Generator {
    payload: Payload,
    app: u16,
    /// lenet: images and their logits.
    images: Vec<([u8; lenet::IMAGE_BYTES], [f32; lenet::CLASSES])>,
}

fn fill(seed: u64, out: &mut Vec<u8>, n: usize) {
    let base = lenet::hash(seed as u32, (seed >> 32) as u32);
    for i in 0..n.div_ceil(4) {
        out.extend_from_slice(&lenet::hash(base, i as u32).to_le_bytes());
    }
    out.truncate(out.len() - (n.div_ceil(4) * 4 - n));
}

impl Generator {
    fn new(p: &Payload, verify: bool) -> Generator {
        let (app, images) = match *p {
            Payload::Echo { .. } => (apps::ID_ECHO, Vec::new()),
            Payload::Vecadd { .. } => (apps::ID_VECADD, Vec::new()),
            Payload::Raw { app, .. } => (app, Vec::new()),
            Payload::Lenet { seed, images } => {
                let w = lenet::weights(seed);
                let n = images.max(1) as u64;
                // References for many images: on every core.
                let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as u64;
                let chunk = n.div_ceil(cores);
                let imgs = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..cores)
                        .map(|c| {
                            let w = &w;
                            s.spawn(move || {
                                (c * chunk..((c + 1) * chunk).min(n))
                                    .map(|k| {
                                        let img = lenet::image(seed, k);
                                        let l = if verify {
                                            lenet::forward(w, &img)
                                        } else {
                                            [0.0; 10]
                                        };
                                        (img, l)
                                    })
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .flat_map(|h| h.join().expect("reference thread"))
                        .collect()
                });
                (apps::ID_LENET, imgs)
            }
        };
        Generator {
            payload: p.clone(),
            app,
            images,
        }
    }

    /// The request datagram for request `id`.
    fn request(&self, id: u64, out: &mut Vec<u8>) {
        let mut body = Vec::new();
        match self.payload {
            Payload::Echo { size } | Payload::Raw { size, .. } => fill(id, &mut body, size),
            Payload::Vecadd { n } => {
                for i in 0..2 * n as u64 {
                    let v = (lenet::hash(id as u32, i as u32) % 2000) as f32 / 8.0 - 125.0;
                    body.extend_from_slice(&v.to_le_bytes());
                }
            }
            Payload::Lenet { .. } => {
                body.extend_from_slice(&self.images[(id % self.images.len() as u64) as usize].0)
            }
        }
        wire::encode_request(out, self.app, id, &body);
    }

    /// Whether `answer` is right for request `id`.
    fn check(&self, id: u64, answer: &[u8]) -> bool {
        match self.payload {
            Payload::Echo { size } => {
                let mut want = Vec::new();
                fill(id, &mut want, size);
                answer == &want[..]
            }
            Payload::Vecadd { n } => {
                let mut req = Vec::new();
                self.request(id, &mut req);
                let app = App::builtin("vecadd", 1, 65000).expect("built-in");
                let mut want = vec![0u8; n * 4];
                app.run_cpu(&req[wire::HEADER_LEN..], &mut want) == Some(n * 4)
                    && answer == &want[..]
            }
            Payload::Lenet { .. } => {
                let want = &self.images[(id % self.images.len() as u64) as usize].1;
                lenet::parse_logits(answer).is_some_and(|got| lenet::logits_match(&got, want, 1e-4))
            }
            Payload::Raw { .. } => true,
        }
    }
}

#[derive(Default)]
struct ThreadResult {
    sent: u64,
    send_failed: u64,
    send_error: Option<String>,
    refused: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    lost: u64,
    stray: u64,
    client_drops: u64,
    verified: u64,
    verify_failed: u64,
    hist: Histogram,
    send_elapsed: Duration,
}

/// Asks the server at `target` for its counters (None if it does not answer in time).
pub fn server_counters(target: SocketAddr, wait: Duration) -> Option<crate::server::Counters> {
    counters_unless(target, wait, &AtomicBool::new(false))
}

/// [`server_counters`], given up as soon as `stop` is set.
fn counters_unless(
    target: SocketAddr,
    wait: Duration,
    stop: &AtomicBool,
) -> Option<crate::server::Counters> {
    let s = net::bind(unspecified_for(target), 1 << 16).ok()?;
    s.connect(target).ok()?;
    let id = 0x5747_u64 << 48 | std::process::id() as u64;
    let start = Instant::now();
    let mut buf = vec![0u8; 65536];
    let mut last_send = None::<Instant>;
    while start.elapsed() < wait && !stop.load(Ordering::Relaxed) {
        if last_send.is_none_or(|t| t.elapsed() > Duration::from_millis(100)) {
            let _ = s.send(&wire::encode_stats_query(id));
            last_send = Some(Instant::now());
        }
        match s.recv(&mut buf) {
            Ok(n) => {
                if let Some(r) = wire::decode_response(&buf[..n]) {
                    if r.id == id && r.status == Status::Ok {
                        return serde_json::from_slice(r.payload).ok();
                    }
                }
            }
            // Nothing listens there (ICMP port unreachable): no counters will come.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return None,
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    None
}

fn unspecified_for(t: SocketAddr) -> SocketAddr {
    match t {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    }
}

fn diff(
    after: crate::server::Counters,
    before: crate::server::Counters,
) -> crate::server::Counters {
    let a = serde_json::to_value(after).expect("plain struct");
    let b = serde_json::to_value(before).expect("plain struct");
    let mut out = serde_json::Map::new();
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, v) in a {
            let d = v
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(b.get(k).and_then(|x| x.as_u64()).unwrap_or(0));
            out.insert(k.clone(), d.into());
        }
    }
    serde_json::from_value(out.into()).unwrap_or_default()
}

impl LoadConfig {
    /// Every number within its bound (`limits.rs`: [`MAX_RATE`](crate::limits::MAX_RATE) and the rest)
    /// and the buffers within memory, before anything is allocated.
    pub fn check(&self) -> Result<(), ServeError> {
        use crate::limits::*;
        if self.threads == 0 || self.batch == 0 {
            return Err(ServeError::Config(
                "--threads and --batch must be at least 1".into(),
            ));
        }
        at_most(
            "threads",
            self.threads,
            MAX_THREADS,
            "one socket and one polling thread each",
        )?;
        at_most(
            "batch",
            self.batch,
            MAX_BATCH,
            "the kernel sends and receives at most 1024 datagrams a call",
        )?;
        match self.mode {
            LoadMode::Closed { outstanding: 0 } => {
                return Err(ServeError::Config(
                    "--outstanding must be at least 1".into(),
                ))
            }
            LoadMode::Closed { outstanding } => at_most(
                "outstanding",
                outstanding,
                MAX_OUTSTANDING,
                "per thread; a server queue holds far fewer",
            )?,
            LoadMode::Open { rate } => {
                if !(rate > 0.0 && rate <= MAX_RATE) {
                    return Err(ServeError::Config(format!(
                        "--rate {rate}: must be more than 0 and at most {MAX_RATE:e} requests per \
                         second"
                    )));
                }
            }
        }
        if self.requests == Some(0) {
            return Err(ServeError::Config(
                "--requests 0: nothing to send (leave it out for no limit)".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(ServeError::Config(
                "--timeout-ms 0: every request would be lost at once; at least 1".into(),
            ));
        }
        if self.timeout > std::time::Duration::from_millis(MAX_TIMEOUT_MS) {
            return Err(ServeError::Config(format!(
                "--timeout-ms {}: at most {MAX_TIMEOUT_MS} (a minute)",
                self.timeout.as_millis()
            )));
        }
        if let Payload::Lenet { images, .. } = self.payload {
            at_most(
                "images",
                images,
                MAX_IMAGES,
                "distinct images; more change nothing",
            )?;
        }
        // An oversized request would fail every send (EMSGSIZE), not measure anything.
        self.payload.check_fits(max_datagram(self.target))?;
        let images = match self.payload {
            Payload::Lenet { images, .. } => images as u64 * 1024,
            _ => 0,
        };
        check_memory(
            "the client threads' buffers",
            thread_bytes(self.threads, self.batch, RECV_BUF).saturating_add(images),
            "fewer --threads or a smaller --batch",
        )
    }
}

/// Bytes of one client receive buffer: the largest UDP datagram, so that no answer is cut.
const RECV_BUF: usize = 65536;

/// After a stop (SIGINT), how long the client threads wait at most for the answers still due
/// (never longer than the timeout), and the server for its counters: together well within a
/// second, so that a signal ends a run at once whatever the thread count.
const STOP_GRACE: Duration = Duration::from_millis(100);

/// Runs the load; `stop` ends sending early (SIGINT).
pub fn run(cfg: &LoadConfig, stop: &AtomicBool) -> Result<LoadReport, ServeError> {
    cfg.check()?;
    let before = if cfg.server_stats {
        counters_unless(cfg.target, Duration::from_millis(500), stop)
    } else {
        None
    };
    let gen = Arc::new(Generator::new(&cfg.payload, cfg.verify));
    // One clock for every thread: a thread that starts late (a thousand of them on two cores
    // take a while) still stops sending when the run's duration is up.
    let start = Instant::now();
    let results: Vec<Result<ThreadResult, ServeError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.threads)
            // A stop while the threads start (a thousand take a while on a busy machine)
            // starts no more of them: those not started have sent nothing.
            .take_while(|_| !stop.load(Ordering::Relaxed))
            .map(|t| {
                let gen = gen.clone();
                std::thread::Builder::new()
                    .name(format!("load-{t}"))
                    .spawn_scoped(s, move || client_thread(cfg, &gen, t, start, stop))
                    .inspect_err(|_| {
                        // The threads started so far stop sending; they still drain.
                        stop.store(true, Ordering::Relaxed)
                    })
            })
            .collect();
        hs.into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(ServeError::Backend("load thread panicked".into()))),
                Err(e) => Err(ServeError::Io(
                    format!("cannot start {} client threads", cfg.threads),
                    e,
                )),
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut rep = LoadReport {
        mode: Some(cfg.mode),
        payload: Some(cfg.payload.clone()),
        threads: cfg.threads,
        server_stats: cfg.server_stats,
        elapsed_s: elapsed.as_secs_f64(),
        ..Default::default()
    };
    let mut hist = Histogram::new();
    let mut send_time = Duration::ZERO;
    for r in results {
        let r = r?;
        rep.sent += r.sent;
        rep.send_failed += r.send_failed;
        rep.refused += r.refused;
        if r.send_error.is_some() {
            rep.send_error = r.send_error;
        }
        rep.ok += r.ok;
        for (k, v) in r.errors {
            *rep.errors.entry(k).or_default() += v;
        }
        rep.lost += r.lost;
        rep.stray += r.stray;
        rep.client_drops += r.client_drops;
        rep.verified += r.verified;
        rep.verify_failed += r.verify_failed;
        hist.merge(&r.hist);
        send_time = send_time.max(r.send_elapsed);
    }
    rep.latency = hist.summary();
    rep.throughput_rps = rep.ok as f64 / send_time.as_secs_f64().max(1e-9);
    if let Some(b) = before {
        let wait = if stop.load(Ordering::Relaxed) {
            STOP_GRACE
        } else {
            Duration::from_millis(500)
        };
        rep.server = server_counters(cfg.target, wait).map(|a| diff(a, b));
    }
    Ok(rep)
}

fn client_thread(
    cfg: &LoadConfig,
    gen: &Generator,
    t: usize,
    start: Instant,
    stop: &AtomicBool,
) -> Result<ThreadResult, ServeError> {
    let sock = net::bind(unspecified_for(cfg.target), 8 << 20)
        .map_err(|e| ServeError::Io("client socket".into(), e))?;
    sock.connect(cfg.target)
        .map_err(|e| ServeError::Io(format!("connect {}", cfg.target), e))?;
    let fd = sock.as_raw_fd();
    let mut tx = SendBatch::new(cfg.batch);
    let mut rx = RecvBatch::new(cfg.batch, RECV_BUF);
    let mut out = ThreadResult::default();
    let mut outstanding: HashMap<u64, Instant> = HashMap::new();
    // Every batch sent, oldest first, as (first sequence number, count, send time): requests
    // expire from its front, each looked at once, instead of a sweep over every outstanding
    // request (65536 a thread at most) every few milliseconds, which a thousand threads could
    // not keep up with.
    let mut batches: VecDeque<(u64, u64, Instant)> = VecDeque::new();
    // Set when stopped: past it, what is still outstanding is lost.
    let mut give_up: Option<Instant> = None;
    let mut next_seq = 0u64;
    let id_base = (t as u64) << 48;
    // Requests are shared out over threads: thread t sends numbers t, t + T, ...
    let quota = cfg
        .requests
        .map(|r| r / cfg.threads as u64 + u64::from((t as u64) < r % cfg.threads as u64));
    let per_thread_rate = match cfg.mode {
        LoadMode::Open { rate } => rate / cfg.threads as f64,
        _ => 0.0,
    };
    let oversubscribed = std::thread::available_parallelism().is_ok_and(|n| cfg.threads > n.get());
    let mut sending = true;
    let mut send_end = start;
    let mut reqbuf = Vec::new();
    loop {
        let now = Instant::now();
        let stopped = stop.load(Ordering::Relaxed);
        if sending
            && (now.duration_since(start) >= cfg.duration
                || quota.is_some_and(|q| next_seq >= q)
                || stopped)
        {
            sending = false;
            send_end = now;
        }
        if stopped && give_up.is_none() {
            give_up = Some(now + cfg.timeout.min(STOP_GRACE));
        }
        if give_up.is_some_and(|g| now >= g) {
            out.lost += outstanding.len() as u64;
            outstanding.clear();
        }
        if !sending && outstanding.is_empty() {
            break;
        }
        // Send.
        let mut sent_now = false;
        // Set when a whole batch failed to go (a refused or unreachable target): the thread
        // then waits before it tries again instead of spinning on the error.
        let mut none_went = false;
        if sending {
            let want = match cfg.mode {
                LoadMode::Closed { outstanding: n } => n.saturating_sub(outstanding.len()),
                LoadMode::Open { .. } => {
                    // The k-th request of all is due at k / rate, the first at once (a rate
                    // below one per second over a short run still sends); thread t sends
                    // numbers t, t + T, ...
                    let phase = t as f64 / cfg.threads as f64;
                    let elapsed = now.duration_since(start).as_secs_f64();
                    let due = (elapsed * per_thread_rate + 1.0 - phase).max(0.0) as u64;
                    let due = due.saturating_sub(next_seq);
                    (due.min(usize::MAX as u64) as usize)
                        .min(crate::limits::MAX_UNANSWERED.saturating_sub(outstanding.len()))
                }
            };
            let want = want.min(cfg.batch);
            let want = match quota {
                Some(q) => want.min((q - next_seq) as usize),
                None => want,
            };
            if want > 0 {
                sent_now = true;
                let t_send = Instant::now();
                for _ in 0..want {
                    let id = id_base | next_seq;
                    next_seq += 1;
                    gen.request(id, &mut reqbuf);
                    tx.push(None).extend_from_slice(&reqbuf);
                    outstanding.insert(id, t_send);
                }
                let (sent, failed) = tx.flush(fd, Duration::from_millis(50));
                out.sent += sent as u64;
                out.send_failed += failed as u64;
                none_went = sent == 0 && failed > 0;
                if let Some(e) = tx.last_error() {
                    out.send_error = Some(e.to_string());
                }
                // Not sent: not outstanding either. Datagram i of this batch carried the id
                // pushed i-th, i.e. sequence number next_seq - want + i.
                let first = next_seq - want as u64;
                for &i in tx.failed() {
                    outstanding.remove(&(id_base | (first + i as u64)));
                }
                batches.push_back((first, want as u64, t_send));
            }
        }
        // Receive.
        let n = rx
            .recv(fd)
            .map_err(|e| ServeError::Io("client recvmmsg".into(), e))?;
        if n > 0 {
            let now = Instant::now();
            for i in 0..n {
                let (d, _) = rx.datagram(i);
                let Some(r) = wire::decode_response(d) else {
                    out.stray += 1;
                    continue;
                };
                let Some(t0) = outstanding.remove(&r.id) else {
                    out.stray += 1;
                    continue;
                };
                out.hist.record(now.duration_since(t0).as_nanos() as u64);
                if r.status == Status::Ok {
                    out.ok += 1;
                    if cfg.verify {
                        if gen.check(r.id, r.payload) {
                            out.verified += 1;
                        } else {
                            out.verify_failed += 1;
                        }
                    }
                } else {
                    *out.errors.entry(r.status.name().into()).or_default() += 1;
                }
            }
        }
        if let Some(d) = rx.kernel_drops() {
            out.client_drops = d as u64;
        }
        out.refused = rx.refused();
        // Expire: the batches sent a timeout ago or earlier.
        while let Some(&(first, count, t0)) = batches.front() {
            if now.duration_since(t0) < cfg.timeout {
                break;
            }
            for seq in first..first + count {
                if outstanding.remove(&(id_base | seq)).is_some() {
                    out.lost += 1;
                }
            }
            batches.pop_front();
        }
        // Closed loop with every slot taken, more threads than cores: nothing can be sent
        // until an answer comes or a request expires. (A thread with a core to itself spins
        // instead, so that it sees an answer without a wake-up's delay.)
        let window_full = oversubscribed
            && matches!(cfg.mode, LoadMode::Closed { outstanding: w } if outstanding.len() >= w);
        if n == 0 && (!sending || window_full) {
            // Waiting for answers: until one comes, or the next thing is due (the oldest
            // batch's expiry, or the give-up after a stop), so that a thousand waiting threads
            // sleep instead of waking every few milliseconds: woken that often, they alone keep
            // a small machine's cores busy, and a stop then waits for hundreds of runnable
            // threads. At most 100 ms, so that a stop during the wait is seen soon.
            let next_expiry = batches.front().map(|&(_, _, t0)| t0 + cfg.timeout);
            let due = match (next_expiry, give_up) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let ms = due.map_or(100, |d| {
                d.saturating_duration_since(Instant::now())
                    .as_millis()
                    .clamp(1, 100) as i32
            });
            net::wait_readable(fd, ms);
        } else if n == 0 && none_went {
            // Nothing could be sent: retrying at once would only spin on the error (and with
            // a thousand threads keep every core busy, so that a stop waits for each of them
            // to be scheduled). A retry every 10 ms is enough to see the target come back.
            net::wait_readable(fd, 10);
        } else if n == 0 && oversubscribed {
            // More threads than cores: a thread that spun here would only take turns from the
            // others, and with hundreds of them runnable a stop would wait for every one to be
            // scheduled again. It sleeps until an answer comes, or its next request is due
            // (open loop), or at most 10 ms.
            let ms = match cfg.mode {
                LoadMode::Closed { .. } => 10,
                LoadMode::Open { .. } => {
                    // Request next_seq of this thread is due once elapsed * rate + 1 - phase
                    // reaches next_seq + 1 (the formula of `want` above).
                    let phase = t as f64 / cfg.threads as f64;
                    let due_s = (next_seq as f64 + phase) / per_thread_rate.max(1e-9);
                    let left = due_s - Instant::now().duration_since(start).as_secs_f64();
                    (left * 1e3).clamp(0.0, 10.0) as i32
                }
            };
            net::wait_readable(fd, ms);
        } else if n == 0 && !sent_now {
            // Nothing came and nothing was due: let the other threads run. Alone on a core
            // this returns at once; with more threads than cores (up to 1024) it keeps a
            // short run short instead of spinning every thread through its time slice.
            std::thread::yield_now();
        }
    }
    out.send_elapsed = send_end.duration_since(start);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_requests_check_against_themselves_and_fail_when_poisoned() {
        for p in [
            Payload::Echo { size: 61 },
            Payload::Vecadd { n: 9 },
            Payload::Lenet { seed: 3, images: 4 },
        ] {
            let g = Generator::new(&p, true);
            let mut req = Vec::new();
            g.request(77, &mut req);
            let app = match p {
                Payload::Echo { .. } => App::builtin("echo", 1, 1024).unwrap(),
                Payload::Vecadd { .. } => App::builtin("vecadd", 1, 1024).unwrap(),
                _ => App::lenet(3, 1).unwrap(),
            };
            let mut resp = vec![0u8; 1024];
            let n = app.run_cpu(&req[wire::HEADER_LEN..], &mut resp).unwrap();
            assert!(g.check(77, &resp[..n]), "{p:?}");
            resp[n - 1] ^= 0x40;
            assert!(!g.check(77, &resp[..n]), "{p:?} poisoned");
            assert!(!g.check(78, &resp[..n]) || matches!(p, Payload::Lenet { .. }));
        }
    }
}
