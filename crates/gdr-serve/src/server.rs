//! The UDP server: network threads that receive in batches, dispatch each request's payload
//! to an executor (a GPU queue: the payload goes straight into an RX slot) while its control
//! part (reply address, request id, receive time) stays on the CPU, collect answers in
//! order and send them in batches.
//!
//! Accounting: every datagram is counted once as a request that was accepted, bad input
//! (dropped, or answered with an error code by flag), shed for want of room, or a stats
//! query (answered only by flag; otherwise bad input). Every accepted request is answered
//! exactly once (a response, an app failure, or — sockperf under-load mode — deliberately no
//! datagram), unless the server is stopped with requests still in flight after the drain
//! timeout (`abandoned`, counted).

use crate::apps::App;
use crate::exec::{Executor, Idle};
use crate::net::{self, Addr, RecvBatch, SendBatch};
use crate::wire::{self, Control, Framing, Parsed, Status};
use crate::ServeError;
use gdr::timing::{Histogram, LatencySummary};
use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a network thread with answers due watches its TX rings after an empty receive,
/// before the next receive system call (see the serve loop).
const TX_SPIN: Duration = Duration::from_micros(2);

/// A stealing thread's pause after a steal that found little (fewer than a quarter of a batch),
/// doubled after each such steal up to [`STEAL_PAUSE_MAX`], and dropped after a good one. At low
/// load the other sockets hold a datagram or two at most, which their owners take at once: a
/// thread that kept polling them would only contend with each owner for its socket, and add
/// latency. At peak an overloaded socket keeps a backlog, and its steals stay good.
const STEAL_PAUSE_MIN: Duration = Duration::from_micros(1);
/// The longest pause between a stealing thread's looks at the other sockets.
const STEAL_PAUSE_MAX: Duration = Duration::from_micros(256);

/// How long a network thread with nothing in flight polls before it backs off.
const IDLE_SPIN: Duration = Duration::from_millis(1);

/// A backed-off network thread's longest wait in `poll(2)`: how soon it sees `stop`.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How requests and responses are laid out.
    pub framing: Framing,
    /// Answer bad input with an error code (true) or drop it silently (false, the default);
    /// both counted. Even when true, a datagram shorter than the error reply gets none: the
    /// server never answers bad input with more bytes than it was sent.
    pub reply_errors: bool,
    /// Answer stats queries (false, the default: they count as bad input). The answer, the
    /// counters as JSON, is some 300 bytes for a 16-byte query: an amplifier for anyone who
    /// can forge a source address, so only where the clients are trusted.
    pub stats: bool,
    /// Datagrams per recvmmsg / sendmmsg.
    pub batch: usize,
    /// After stop, how long in-flight requests may take to finish (half a second by default,
    /// so that a stop by signal ends the run within a second; the rest is counted abandoned).
    pub drain_timeout: Duration,
    /// Socket buffer size asked for (both directions).
    pub socket_buffer: usize,
    /// What a network thread does when idle.
    pub idle: Idle,
    /// One socket for all network threads, or one each.
    pub sockets: Sockets,
}

/// How the network threads share the listening port (in JSON by the names `--sockets` takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sockets {
    /// One socket, which every network thread receives from and sends on: any thread takes
    /// any datagram, and the threads contend for the socket's queue.
    Shared,
    /// One socket a thread, all bound to the port with `SO_REUSEPORT`: the kernel sends each
    /// client address's datagrams to one of them, so the threads do not contend, but a thread
    /// serves only the clients that hash to it (few clients may leave threads idle). Another
    /// process of the same user could bind the port too and take a share of the datagrams.
    PerThread,
    /// One socket a thread, as [`PerThread`](Self::PerThread), and a thread that finds its
    /// own socket empty, with room in its executors, receives a batch from the others' sockets
    /// in turn: threads whose clients hash elsewhere help the busiest socket, contending for
    /// it only then. The replies go out on the thread's own socket (the same port).
    Stealing,
}

impl Sockets {
    /// The sharing a command line names: `shared`, `per-thread` or `stealing`; None for
    /// anything else.
    pub fn parse(s: &str) -> Option<Sockets> {
        match s {
            "shared" => Some(Sockets::Shared),
            "per-thread" => Some(Sockets::PerThread),
            "stealing" => Some(Sockets::Stealing),
            _ => None,
        }
    }

    /// The name [`parse`](Self::parse) takes.
    pub fn name(self) -> &'static str {
        match self {
            Sockets::Shared => "shared",
            Sockets::PerThread => "per-thread",
            Sockets::Stealing => "stealing",
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            framing: Framing::Gdr,
            reply_errors: false,
            stats: false,
            batch: 32,
            drain_timeout: Duration::from_millis(500),
            socket_buffer: 16 << 20,
            idle: Idle::Backoff,
            sockets: Sockets::Shared,
        }
    }
}

macro_rules! counters {
    ($($(#[$m:meta])* $f:ident),* $(,)?) => {
        /// What the server saw and did, totals over all network threads.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct Counters { $($(#[$m])* pub $f: u64,)* }
        impl Counters {
            fn add(&mut self, o: &Counters) { $(self.$f += o.$f;)* }
            fn sub(&mut self, o: &Counters) { $(self.$f -= o.$f;)* }
        }
    };
}

counters! {
    /// Datagrams received.
    datagrams,
    /// Requests handed to an executor.
    accepted,
    /// Accepted requests whose answer (or app failure) came back.
    answered,
    /// Answers sent as datagrams.
    responses,
    /// Answers not sent because the client asked for none (sockperf under-load mode).
    no_reply,
    /// Answered with `app_failed`.
    app_failed,
    /// Bad input: datagrams of zero bytes (`Status::Empty`).
    empty,
    /// Bad input: shorter than the header, or a payload shorter than the app needs
    /// (`Status::Truncated`).
    truncated,
    /// Bad input: longer than the receive buffer or the app's largest request
    /// (`Status::Oversized`).
    oversized,
    /// Bad input: for an app this server does not run (`Status::UnknownApp`).
    unknown_app,
    /// Bad input: not our magic, version or kind, or a counters query to a server without
    /// stats (`Status::BadHeader`).
    bad_header,
    /// Bad input answered with its error code.
    bad_replied,
    /// Bad input dropped without a reply (error replies off, no reply wanted, or the reply
    /// would be longer than the datagram).
    bad_dropped,
    /// Requests dropped because every executor of the thread was full.
    shed,
    /// Datagrams the kernel dropped because the socket buffer was full (SO_RXQ_OVFL).
    kernel_drops,
    /// Datagrams that could not be sent.
    send_failed,
    /// Counters queries answered (with stats on; without, they count as `bad_header`).
    stats_queries,
    /// In flight when the drain timed out or their executor failed.
    abandoned,
    /// Datagrams a thread received from another thread's socket ([`Sockets::Stealing`]);
    /// also counted in `datagrams`.
    #[serde(default)]
    stolen,
}

impl Counters {
    /// Requests that never got an answer datagram although one was due: what a client
    /// sees as lost, from the server's side.
    pub fn dropped(&self) -> u64 {
        self.shed + self.kernel_drops + self.bad_dropped + self.send_failed + self.abandoned
    }

    fn count_bad(&mut self, s: Status) {
        match s {
            Status::Empty => self.empty += 1,
            Status::Truncated => self.truncated += 1,
            Status::Oversized => self.oversized += 1,
            Status::UnknownApp => self.unknown_app += 1,
            _ => self.bad_header += 1,
        }
    }
}

/// What a run of the server did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServeReport {
    /// The app's name.
    pub app: String,
    /// Network threads.
    pub threads: usize,
    /// Whether they shared one socket or had one each.
    pub sockets: Sockets,
    /// Every executor's name, thread by thread (`gpu0/q1`, `gpu0/hc1`, `cpu0/q1`, ...).
    pub executors: Vec<String>,
    /// From the start of `run::serve` to ready (binding, building the backends: compiling
    /// and launching GPU workers); 0 when the caller built them (`Server::run`).
    pub setup_s: f64,
    /// Serving, from the network threads' start to the end of the drain.
    pub elapsed_s: f64,
    /// What the server saw and did over the run.
    pub counters: Counters,
    /// Datagram received -> response handed to the socket, for answered requests.
    pub server_time: LatencySummary,
    /// The same time in three stages, to see where it goes.
    pub server_stages: StageSummary,
    /// The histogram `server_time` summarises (not serialised), for merging or plotting.
    #[serde(skip)]
    pub histogram: Histogram,
    /// GPU-queue mode with `GpuShape::profile`: where each queue's worker spends its time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_stages: Vec<crate::gpu::WorkerStages>,
}

/// Server time by stage, for answered requests.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StageSummary {
    /// Datagram received -> its executor took it (parse, dispatch, the copy into the queue).
    pub dispatch: LatencySummary,
    /// Taken -> its answer seen by the network thread (the GPU and the PCIe trips both ways).
    pub device: LatencySummary,
    /// Answer seen -> response handed to the socket (encoding, waiting for the batch).
    pub reply: LatencySummary,
}

/// A network thread's histograms: the whole server time and its stages.
#[derive(Default)]
struct Times {
    total: Histogram,
    dispatch: Histogram,
    device: Histogram,
    reply: Histogram,
}

impl Times {
    fn merge(&mut self, o: &Times) {
        self.total.merge(&o.total);
        self.dispatch.merge(&o.dispatch);
        self.device.merge(&o.device);
        self.reply.merge(&o.reply);
    }
}

struct Shared {
    counters: Mutex<Counters>,
    kernel_drops: AtomicU64,
}

/// A bound server socket.
///
/// # Examples
///
/// A server of `echo` on loopback, its executor a queue that a CPU thread serves in place of a
/// GPU worker, under a load run of 200 requests:
///
/// ```
/// use gdr_serve::exec::{cpu_workers, split_queues};
/// use gdr_serve::load::{self, Payload};
/// use gdr_serve::{App, LoadConfig, Server, ServerConfig};
/// use std::sync::atomic::{AtomicBool, Ordering};
///
/// let app = App::builtin("echo", 1, 1024)?;
/// let cfg = ServerConfig::default();
/// let server = Server::bind("127.0.0.1:0".parse().unwrap(), &cfg)?;
/// let mut workers = cpu_workers(&app, 1, 64, cfg.idle)?;
/// // One network thread, with one executor of at most 64 requests in flight.
/// let lanes = split_queues(vec![("cpu".into(), workers.queues_mut())], 1, 64)?;
/// let client = LoadConfig {
///     target: server.local_addr()?,
///     payload: Payload::Echo { size: 100 },
///     requests: Some(200),
///     verify: true,
///     server_stats: false,
///     ..Default::default()
/// };
/// let stop = AtomicBool::new(false);
/// let (sent, served) = std::thread::scope(|s| {
///     let serving = s.spawn(|| server.run(&cfg, &app, lanes, &stop));
///     let sent = load::run(&client, &AtomicBool::new(false));
///     stop.store(true, Ordering::Release);
///     (sent, serving.join().expect("the server thread"))
/// });
/// let (sent, served) = (sent?, served?);
/// assert_eq!((sent.ok, sent.verified, sent.lost), (200, 200, 0));
/// assert_eq!(served.counters.responses, 200);
/// # Ok::<(), gdr_serve::ServeError>(())
/// ```
pub struct Server {
    sock: UdpSocket,
    /// The buffer size and sharing the socket was made with, for the other threads' sockets.
    socket_buffer: usize,
    sockets: Sockets,
    shared: Shared,
}

impl Server {
    /// Binds a non-blocking UDP socket to `addr` (port 0: any free port, see
    /// [`local_addr`](Self::local_addr)) with `cfg.socket_buffer` asked for both ways and the
    /// kernel's drop counting on; [`ServeError::Io`] when the address cannot be bound. With
    /// [`Sockets::PerThread`] the socket is the first of the group that [`run`](Self::run)
    /// completes, one for each further network thread.
    pub fn bind(addr: SocketAddr, cfg: &ServerConfig) -> Result<Server, ServeError> {
        let sock = match cfg.sockets {
            Sockets::Shared => net::bind(addr, cfg.socket_buffer),
            Sockets::PerThread | Sockets::Stealing => net::bind_reuseport(addr, cfg.socket_buffer),
        }
        .map_err(|e| ServeError::Io(format!("cannot bind UDP {addr}"), e))?;
        Ok(Server {
            sock,
            socket_buffer: cfg.socket_buffer,
            sockets: cfg.sockets,
            shared: Shared {
                counters: Mutex::new(Counters::default()),
                kernel_drops: AtomicU64::new(0),
            },
        })
    }

    /// The address the socket is bound to (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.sock
            .local_addr()
            .map_err(|e| ServeError::Io("local address".into(), e))
    }

    /// Counters so far (published by the threads after every busy loop turn).
    pub fn counters(&self) -> Counters {
        snapshot(&self.shared)
    }

    /// Serves until `stop` is set, then drains. `lanes[t]` are network thread t's executors
    /// (one per GPU: requests go round robin over them).
    pub fn run<'a>(
        &self,
        cfg: &ServerConfig,
        app: &App,
        lanes: Vec<Vec<Box<dyn Executor + 'a>>>,
        stop: &AtomicBool,
    ) -> Result<ServeReport, ServeError> {
        if lanes.is_empty() || lanes.iter().any(|l| l.is_empty()) {
            return Err(ServeError::Config(
                "every network thread needs an executor".into(),
            ));
        }
        let names: Vec<String> = lanes.iter().flatten().map(|e| e.name()).collect();
        let threads = lanes.len();
        // The other threads' sockets, on the port the first one got; closed when `run` returns.
        let mut more = Vec::new();
        if self.sockets != Sockets::Shared {
            let addr = self.local_addr()?;
            for _ in 1..threads {
                more.push(
                    net::bind_reuseport(addr, self.socket_buffer)
                        .map_err(|e| ServeError::Io(format!("cannot bind UDP {addr} again"), e))?,
                );
            }
        }
        let fds: Vec<RawFd> = std::iter::once(&self.sock)
            .chain(&more)
            .map(|s| s.as_raw_fd())
            .collect();
        let own_socket = self.sockets != Sockets::Shared;
        // A stealing thread's others: the sockets after its own, in turn.
        let peers_of = |t: usize| -> Vec<RawFd> {
            if self.sockets != Sockets::Stealing {
                return Vec::new();
            }
            (1..fds.len()).map(|k| fds[(t + k) % fds.len()]).collect()
        };
        let start = Instant::now();
        let results: Vec<Result<Times, ServeError>> = std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .into_iter()
                .enumerate()
                .map(|(t, execs)| {
                    let shared = &self.shared;
                    let fd = fds[t % fds.len()];
                    let peers = peers_of(t);
                    std::thread::Builder::new()
                        .name(format!("serve-net-{t}"))
                        .spawn_scoped(s, move || {
                            let r = NetThread::new(fd, own_socket, cfg, app, execs, shared)
                                .stealing_from(peers)
                                .run(stop);
                            if r.is_err() {
                                // One thread failing stops the others (they drain).
                                stop.store(true, Ordering::Release);
                            }
                            r
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(ServeError::Backend("a network thread panicked".into()))
                    }),
                    Err(e) => Err(ServeError::Io("cannot start a network thread".into(), e)),
                })
                .collect()
        });
        let mut times = Times::default();
        for r in results {
            times.merge(&r?);
        }
        Ok(ServeReport {
            app: app.name().into(),
            threads,
            sockets: self.sockets,
            executors: names,
            setup_s: 0.0,
            elapsed_s: start.elapsed().as_secs_f64(),
            counters: snapshot(&self.shared),
            server_time: times.total.summary(),
            server_stages: StageSummary {
                dispatch: times.dispatch.summary(),
                device: times.device.summary(),
                reply: times.reply.summary(),
            },
            histogram: times.total,
            worker_stages: Vec::new(),
        })
    }
}

fn snapshot(sh: &Shared) -> Counters {
    let mut c = *sh.counters.lock().unwrap_or_else(|p| p.into_inner());
    c.kernel_drops = sh.kernel_drops.load(Ordering::Relaxed);
    c
}

/// Outgoing datagrams with the receive time of the request each answers and the time its
/// answer was seen.
struct Outbox {
    fd: RawFd,
    tx: SendBatch,
    t0: Vec<Option<(Instant, Instant)>>,
    times: Times,
    answers_sent: u64,
    other_sent: u64,
    failed: u64,
}

impl Outbox {
    fn push(&mut self, to: &Addr, t0: Option<(Instant, Instant)>) -> &mut Vec<u8> {
        if self.tx.is_full() {
            self.flush();
        }
        self.t0[self.tx.len()] = t0;
        self.tx.push(Some(to))
    }

    fn flush(&mut self) {
        if self.tx.is_empty() {
            return;
        }
        // "Handed to the socket": the moment the batch goes to sendmmsg.
        let now = Instant::now();
        let n = self.tx.len();
        let mut answers = 0;
        for t in &mut self.t0[..n] {
            if let Some((t0, seen)) = t.take() {
                self.times
                    .total
                    .record(now.duration_since(t0).as_nanos() as u64);
                self.times
                    .reply
                    .record(now.duration_since(seen).as_nanos() as u64);
                answers += 1;
            }
        }
        let (_sent, failed) = self.tx.flush(self.fd, Duration::from_millis(2));
        // Failures cannot be told apart by kind; count them, and the rest as sent.
        self.failed += failed as u64;
        let ok = (n - failed) as u64;
        let ans_ok = (answers as u64).min(ok);
        self.answers_sent += ans_ok;
        self.other_sent += ok - ans_ok;
    }
}

struct Pending {
    control: Control,
    /// Datagram received.
    t0: Instant,
    /// Taken by the executor.
    taken: Instant,
    addr: Addr,
}

/// One executor of a network thread and what the thread keeps about it.
struct Lane<'a> {
    exec: Box<dyn Executor + 'a>,
    /// It failed: it answers nothing more and takes no new requests.
    dead: bool,
    /// Requests it took (or is being offered in this batch), oldest first.
    pending: VecDeque<Pending>,
    /// Indices in the receive batch of the requests picked for it in this batch.
    staged: Vec<usize>,
}

struct NetThread<'s, 'a> {
    fd: RawFd,
    /// Whether `fd` is this thread's alone ([`Sockets::PerThread`]): its kernel drop counter
    /// is then this thread's to add to the total, rather than one every thread sees.
    own_socket: bool,
    /// The socket's kernel drop counter when last seen (it counts from the socket's start).
    drops_seen: u32,
    /// The other threads' sockets, which this one receives from when its own is empty
    /// ([`Sockets::Stealing`]; empty otherwise).
    peers: Vec<RawFd>,
    /// The peer to try first next time: the one after the last one taken from.
    next_peer: usize,
    /// The current pause between steals ([`STEAL_PAUSE_MIN`]); zero after a good steal.
    steal_pause: Duration,
    /// No steal before this moment.
    steal_after: Option<Instant>,
    cfg: &'s ServerConfig,
    app: &'s App,
    lanes: Vec<Lane<'a>>,
    /// The payloads of one submit, kept empty between batches so that its allocation is
    /// reused (see [`recycle`]).
    payloads: Vec<&'static [u8]>,
    shared: &'s Shared,
    c: Counters,
    published: Counters,
    out: Outbox,
    rr: usize,
}

impl<'s, 'a> NetThread<'s, 'a> {
    fn new(
        fd: RawFd,
        own_socket: bool,
        cfg: &'s ServerConfig,
        app: &'s App,
        execs: Vec<Box<dyn Executor + 'a>>,
        shared: &'s Shared,
    ) -> Self {
        let batch = cfg.batch.max(1);
        NetThread {
            fd,
            own_socket,
            drops_seen: 0,
            peers: Vec::new(),
            next_peer: 0,
            steal_pause: Duration::ZERO,
            steal_after: None,
            cfg,
            app,
            lanes: execs
                .into_iter()
                .map(|exec| Lane {
                    exec,
                    dead: false,
                    pending: VecDeque::new(),
                    staged: Vec::with_capacity(batch),
                })
                .collect(),
            payloads: Vec::with_capacity(batch),
            shared,
            c: Counters::default(),
            published: Counters::default(),
            out: Outbox {
                fd,
                tx: SendBatch::new(batch),
                t0: vec![None; batch],
                times: Times::default(),
                answers_sent: 0,
                other_sent: 0,
                failed: 0,
            },
            rr: 0,
        }
    }

    fn stealing_from(mut self, peers: Vec<RawFd>) -> Self {
        self.peers = peers;
        self
    }

    /// With its own socket empty: receives one batch from the first of the other sockets that
    /// has datagrams, the others in turn, and dispatches it. At most as many datagrams as its
    /// executors have room for, so that a thread never takes work it would shed (the rest stays
    /// for the socket's owner), and not during a pause ([`STEAL_PAUSE_MIN`]). A peer's kernel
    /// drop counter is its owner's to count. Returns the datagrams taken.
    fn steal(&mut self, rx: &mut RecvBatch) -> Result<usize, ServeError> {
        if self.peers.is_empty() || self.steal_after.is_some_and(|t| Instant::now() < t) {
            return Ok(0);
        }
        let room: usize = self
            .lanes
            .iter()
            .filter(|l| !l.dead)
            .map(|l| l.exec.room())
            .sum();
        if room == 0 {
            return Ok(0);
        }
        let np = self.peers.len();
        let mut taken = 0;
        for k in 0..np {
            let i = (self.next_peer + k) % np;
            let n = rx
                .recv_at_most(self.peers[i], room)
                .map_err(|e| ServeError::Io("recvmmsg".into(), e))?;
            if n > 0 {
                self.next_peer = (i + 1) % np;
                self.c.stolen += n as u64;
                self.dispatch(rx, n)?;
                taken = n;
                break;
            }
        }
        if taken >= (self.cfg.batch / 4).max(1) {
            self.steal_pause = Duration::ZERO;
            self.steal_after = None;
        } else {
            self.steal_pause = (self.steal_pause * 2).clamp(STEAL_PAUSE_MIN, STEAL_PAUSE_MAX);
            self.steal_after = Some(Instant::now() + self.steal_pause);
        }
        Ok(taken)
    }

    /// How much of a steal pause is left at `now`; None when none is running.
    fn pause_left(&self, now: Instant) -> Option<Duration> {
        self.steal_after.filter(|&t| t > now).map(|t| t - now)
    }

    /// A backed-off thread's wait: until a datagram comes to its socket or, for a stealing
    /// thread, to one of its peers' sockets, or [`IDLE_POLL`] passes. A peer's datagram that
    /// comes during a steal pause is one this thread may not take yet, and its owner usually
    /// takes it at once; waking for it again and again would spin through `poll(2)` until the
    /// pause ran out. So the thread then waits for its own socket alone until the pause ends.
    /// Waits never stop at a pause's end by themselves: an idle thread, whose every look at its
    /// peers finds nothing and starts a pause, still sleeps [`IDLE_POLL`] at a time.
    fn wait_idle(&self) {
        if self.peers.is_empty() {
            net::wait_readable(self.fd, IDLE_POLL.as_millis() as i32);
            return;
        }
        let mut fds = Vec::with_capacity(1 + self.peers.len());
        fds.push(self.fd);
        fds.extend_from_slice(&self.peers);
        let ready = net::wait_readable_any(&fds, IDLE_POLL);
        let peer_only = !ready[0] && ready[1..].iter().any(|&r| r);
        if peer_only {
            if let Some(left) = self.pause_left(Instant::now()) {
                net::wait_readable_any(&[self.fd], left.min(IDLE_POLL));
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.lanes.iter().map(|l| l.pending.len()).sum()
    }

    /// Takes the socket's kernel drop counter `d` into the total: one socket for every thread
    /// counts once (the highest any thread saw), a thread's own socket adds what is new.
    fn count_kernel_drops(&mut self, d: u32) {
        let k = &self.shared.kernel_drops;
        if self.own_socket {
            let new = d.wrapping_sub(self.drops_seen);
            self.drops_seen = d;
            k.fetch_add(u64::from(new), Ordering::Relaxed);
        } else {
            k.fetch_max(u64::from(d), Ordering::Relaxed);
        }
    }

    fn publish(&mut self) {
        self.c.responses = self.out.answers_sent;
        self.c.send_failed = self.out.failed;
        if self.c == self.published {
            return;
        }
        let mut delta = self.c;
        delta.sub(&self.published);
        self.shared
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&delta);
        self.published = self.c;
    }

    fn run(mut self, stop: &AtomicBool) -> Result<Times, ServeError> {
        // One extra byte: a datagram that fills it is longer than any request may be.
        let cap = self.app.max_request() + self.cfg.framing.header_len() + 1;
        let mut rx = RecvBatch::new(self.cfg.batch, cap);
        let mut drain_deadline: Option<Instant> = None;
        let mut idle_since: Option<Instant> = None;
        let result = loop {
            let stopping = stop.load(Ordering::Acquire);
            if stopping {
                let now = Instant::now();
                let d = *drain_deadline.get_or_insert(now + self.cfg.drain_timeout);
                let left = self.in_flight();
                if left == 0 {
                    break Ok(());
                }
                if now > d {
                    self.c.abandoned += left as u64;
                    break Ok(());
                }
            }
            let mut work = 0;
            let mut received = 0;
            if !stopping {
                match rx.recv(self.fd) {
                    Ok(n) if n > 0 => {
                        work += n;
                        received = n;
                        // Before dispatch: a stats query in this batch must see the drops
                        // its own datagram reports.
                        if let Some(d) = rx.kernel_drops() {
                            self.count_kernel_drops(d);
                        }
                        self.dispatch(&rx, n)?;
                    }
                    Ok(_) => match self.steal(&mut rx) {
                        Ok(n) => {
                            work += n;
                            received = n;
                        }
                        Err(e) => break Err(e),
                    },
                    Err(e) => break Err(ServeError::Io("recvmmsg".into(), e)),
                }
            }
            // The socket was empty and answers are due: watch the TX rings (plain memory
            // reads) for a while before the next receive system call, so an answer is not
            // held back by a syscall's worth of time at low load.
            let spin_until =
                (received == 0 && self.in_flight() > 0).then(|| Instant::now() + TX_SPIN);
            let collected = loop {
                match self.collect() {
                    Ok(0) if spin_until.is_some_and(|t| Instant::now() < t) => {
                        std::hint::spin_loop()
                    }
                    other => break other,
                }
            };
            match collected {
                Ok(n) => work += n,
                Err(e) => break Err(e),
            }
            self.out.flush();
            if work > 0 {
                self.publish();
                idle_since = None;
            } else if self.in_flight() == 0 && !stopping && self.cfg.idle == Idle::Backoff {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > IDLE_SPIN {
                    self.publish();
                    self.wait_idle();
                }
            } else {
                std::hint::spin_loop();
            }
        };
        self.out.flush();
        self.publish();
        result.map(|_| self.out.times)
    }

    /// Counts bad input of `len` bytes and answers it with its code when that is on, asked
    /// for, and no larger than what came in.
    fn reply_bad(&mut self, status: Status, control: Option<Control>, addr: &Addr, len: usize) {
        self.c.count_bad(status);
        let wants = control.as_ref().is_none_or(|c| c.wants_reply());
        // An error to a datagram with no header to answer in goes out in gdr's framing,
        // which a sockperf client would read as a sockperf header: none is sent.
        let speakable = control.is_some() || self.cfg.framing == Framing::Gdr;
        let reply_len = match control {
            Some(Control::Sockperf { header, .. }) => header.len(),
            _ => wire::HEADER_LEN,
        };
        // No reply larger than the datagram: forged small datagrams must not buy bigger
        // ones sent to their victim.
        if !self.cfg.reply_errors || !wants || !speakable || reply_len > len {
            self.c.bad_dropped += 1;
            return;
        }
        self.c.bad_replied += 1;
        let b = self.out.push(addr, None);
        match control {
            Some(c) => wire::encode_response_header(b, &c, status),
            None => wire::anonymous_error(b, status),
        }
    }

    /// Sorts one received batch: requests to executors, the rest answered or counted.
    fn dispatch(&mut self, rx: &RecvBatch, n: usize) -> Result<(), ServeError> {
        let t0 = Instant::now();
        let framing = self.cfg.framing;
        let app_id = self.app.id();
        for i in 0..n {
            self.c.datagrams += 1;
            let (d, trunc) = rx.datagram(i);
            match wire::parse(framing, d, trunc, |a| a == app_id) {
                Parsed::Stats { id } if !self.cfg.stats => {
                    // Not a kind this server serves.
                    let control = Some(Control::Gdr { app: 0, id });
                    self.reply_bad(Status::BadHeader, control, rx.addr(i), d.len());
                }
                Parsed::Stats { id } => {
                    self.c.stats_queries += 1;
                    self.publish();
                    let json = serde_json::to_vec(&snapshot(self.shared)).unwrap_or_default();
                    let b = self.out.push(rx.addr(i), None);
                    wire::encode_response_header(b, &Control::Gdr { app: 0, id }, Status::Ok);
                    b.extend_from_slice(&json);
                }
                Parsed::Bad { status, control } => {
                    self.reply_bad(status, control, rx.addr(i), d.len())
                }
                Parsed::Request { control, payload } => {
                    if let Err(status) = self.app.check(payload.len()) {
                        self.reply_bad(status, Some(control), rx.addr(i), d.len());
                        continue;
                    }
                    let ne = self.lanes.len();
                    let pick = (0..ne).map(|k| (self.rr + k) % ne).find(|&e| {
                        let l = &self.lanes[e];
                        !l.dead && l.exec.room() > l.staged.len()
                    });
                    match pick {
                        None => self.c.shed += 1,
                        Some(e) => {
                            let l = &mut self.lanes[e];
                            l.staged.push(i);
                            l.pending.push_back(Pending {
                                control,
                                t0,
                                taken: t0,
                                addr: *rx.addr(i),
                            });
                            self.rr = e + 1;
                        }
                    }
                }
            }
        }
        let hdr = framing.header_len();
        let mut payloads = recycle(std::mem::take(&mut self.payloads));
        for e in 0..self.lanes.len() {
            if self.lanes[e].staged.is_empty() {
                continue;
            }
            payloads.clear();
            payloads.extend(
                self.lanes[e]
                    .staged
                    .iter()
                    .map(|&i| &rx.datagram(i).0[hdr..]),
            );
            let took = match self.lanes[e].exec.submit(&payloads) {
                Ok(t) => t,
                Err(err) => {
                    // It answers its whole queue, this batch's requests included, with
                    // `app_failed` (counted abandoned): nothing is left to account for here.
                    self.fail_executor(e, &err);
                    self.lanes[e].staged.clear();
                    continue;
                }
            };
            let extra = payloads.len() - took;
            let taken = Instant::now();
            let l = &mut self.lanes[e];
            let queued = l.pending.len();
            for p in l.pending.range_mut(queued - payloads.len()..queued - extra) {
                p.taken = taken;
                self.out
                    .times
                    .dispatch
                    .record(taken.duration_since(p.t0).as_nanos() as u64);
            }
            // Not taken after all: shed, newest first (they were queued last).
            for _ in 0..extra {
                if l.pending.pop_back().is_some() {
                    self.c.shed += 1;
                }
            }
            self.c.accepted += took as u64;
            l.staged.clear();
        }
        self.payloads = recycle(payloads);
        Ok(())
    }

    /// An executor that failed answers nothing more: its in-flight requests get `app_failed`
    /// replies (counted abandoned) and it takes no new ones.
    fn fail_executor(&mut self, e: usize, err: &ServeError) {
        let l = &mut self.lanes[e];
        eprintln!("gdr-serve: executor {} failed: {err}", l.exec.name());
        l.dead = true;
        while let Some(p) = l.pending.pop_front() {
            self.c.abandoned += 1;
            if p.control.wants_reply() {
                let b = self.out.push(&p.addr, None);
                wire::encode_response_header(b, &p.control, Status::AppFailed);
            }
        }
    }

    /// Takes finished answers from every executor and queues their datagrams.
    fn collect(&mut self) -> Result<usize, ServeError> {
        let mut total = 0;
        for e in 0..self.lanes.len() {
            let l = &mut self.lanes[e];
            if l.dead || l.pending.is_empty() {
                continue;
            }
            let (pending, out, c) = (&mut l.pending, &mut self.out, &mut self.c);
            let mut seen: Option<Instant> = None;
            let r = l.exec.poll(self.cfg.batch, &mut |ans| {
                let Some(p) = pending.pop_front() else {
                    return;
                };
                let now = *seen.get_or_insert_with(Instant::now);
                out.times
                    .device
                    .record(now.duration_since(p.taken).as_nanos() as u64);
                c.answered += 1;
                let status = if ans.is_ok() {
                    Status::Ok
                } else {
                    Status::AppFailed
                };
                if ans.is_err() {
                    c.app_failed += 1;
                }
                if !p.control.wants_reply() {
                    c.no_reply += 1;
                    return;
                }
                let b = out.push(&p.addr, Some((p.t0, now)));
                wire::encode_response_header(b, &p.control, status);
                if let Ok(bytes) = ans {
                    b.extend_from_slice(bytes);
                }
            });
            match r {
                Ok(n) => total += n,
                Err(err) => self.fail_executor(e, &err),
            }
        }
        if self.lanes.iter().all(|l| l.dead) {
            return Err(ServeError::Backend(
                "every executor of a network thread failed".into(),
            ));
        }
        Ok(total)
    }
}

/// An empty vector of references of another lifetime, on the same allocation: `v` is cleared
/// first, so no reference of the old lifetime is left and the mapping closure never runs; the
/// standard library collects a `Vec`'s own `into_iter().map(..)` in place when the element
/// layouts match, as they do here (the tests check the allocation is kept). How the network
/// thread keeps one payload list across batches whose datagrams live in a receive buffer it
/// refills in between.
fn recycle<'b>(mut v: Vec<&'_ [u8]>) -> Vec<&'b [u8]> {
    v.clear();
    v.into_iter()
        .map(|_| -> &'b [u8] { unreachable!() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{cpu_workers, split_queues};

    fn echo_request(id: u64) -> Vec<u8> {
        let mut d = Vec::new();
        let payload: Vec<u8> = (0..100).map(|i| (id as u8).wrapping_mul(31) ^ i).collect();
        wire::encode_request(
            &mut d,
            App::builtin("echo", 1, 1024).unwrap().id(),
            id,
            &payload,
        );
        d
    }

    /// The default batch, which the rigs' threads receive with.
    const BATCH: usize = 32;

    /// A non-blocking UDP socket on a free loopback port.
    fn loopback() -> UdpSocket {
        net::bind("127.0.0.1:0".parse().unwrap(), 1 << 16).unwrap()
    }

    /// What a network thread borrows: the echo app, the default configuration, one CPU queue
    /// and the shared totals.
    struct Rig {
        app: App,
        cfg: ServerConfig,
        workers: gdr_mq::CpuWorkers,
        shared: Shared,
    }

    impl Rig {
        fn new() -> Rig {
            let app = App::builtin("echo", 1, 1024).unwrap();
            let workers = cpu_workers(&app, 1, 64, Idle::Spin).unwrap();
            let cfg = ServerConfig::default();
            assert_eq!(cfg.batch, BATCH);
            Rig {
                app,
                cfg,
                workers,
                shared: Shared {
                    counters: Mutex::new(Counters::default()),
                    kernel_drops: AtomicU64::new(0),
                },
            }
        }

        /// A thread on `own` that steals from `peers`, its executor taking at most `limit`
        /// requests in flight.
        fn thread(
            &mut self,
            own: &UdpSocket,
            peers: &[&UdpSocket],
            limit: usize,
        ) -> NetThread<'_, '_> {
            let queues = vec![("cpu".into(), self.workers.queues_mut())];
            let lane = split_queues(queues, 1, limit).unwrap().remove(0);
            NetThread::new(
                own.as_raw_fd(),
                true,
                &self.cfg,
                &self.app,
                lane,
                &self.shared,
            )
            .stealing_from(peers.iter().map(|p| p.as_raw_fd()).collect())
        }
    }

    #[test]
    fn a_stealing_thread_serves_another_sockets_datagrams_and_answers_from_its_own() {
        let (own, peer) = (loopback(), loopback());
        // A blocking client: it waits for the answers (10 s at most).
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let to_peer = peer.local_addr().unwrap();
        let mut rig = Rig::new();
        // At most 5 in flight, and none collected until the end: 7 wait, 5 are taken (none
        // shed), and then there is no room to steal.
        let mut t = rig.thread(&own, &[&peer], 5);
        let mut rx = RecvBatch::new(BATCH, 2048);
        for id in 1..=7 {
            client.send_to(&echo_request(id), to_peer).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut taken = 0;
        while taken < 5 {
            assert!(Instant::now() < deadline, "stole {taken} of 5");
            taken += t.steal(&mut rx).unwrap();
        }
        assert_eq!(
            (t.c.stolen, t.c.datagrams, t.c.accepted, t.c.shed),
            (5, 5, 5, 0)
        );
        // Full: the other two stay in the peer's socket for its owner.
        t.steal_after = None;
        assert_eq!(t.steal(&mut rx).unwrap(), 0);
        assert_eq!(t.c.stolen, 5);
        assert_eq!(rx.recv(peer.as_raw_fd()).unwrap(), 2, "left for the owner");
        // The five taken are answered on the thread's own socket, bytes intact.
        while t.out.answers_sent < 5 {
            assert!(Instant::now() < deadline, "answered {}", t.out.answers_sent);
            t.collect().unwrap();
            t.out.flush();
        }
        let own_addr = own.local_addr().unwrap();
        let mut buf = [0u8; 2048];
        let mut ids = Vec::new();
        for _ in 0..5 {
            let (n, from) = client.recv_from(&mut buf).unwrap();
            assert_eq!(from, own_addr);
            let r = wire::decode_response(&buf[..n]).unwrap();
            assert_eq!(r.status, Status::Ok);
            assert_eq!(r.payload, &echo_request(r.id)[wire::HEADER_LEN..]);
            ids.push(r.id);
        }
        ids.sort_unstable();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_thread_that_finds_little_to_steal_pauses_longer_until_a_good_steal() {
        let good = BATCH / 4;
        let (own, peer, client) = (loopback(), loopback(), loopback());
        let to_peer = peer.local_addr().unwrap();
        let mut rig = Rig::new();
        let mut t = rig.thread(&own, &[&peer], 64);
        let mut rx = RecvBatch::new(BATCH, 2048);
        // Nothing to take: each look doubles the pause, up to the longest.
        let mut want = STEAL_PAUSE_MIN;
        for _ in 0..12 {
            while t.steal_after.is_some_and(|a| Instant::now() < a) {
                std::hint::spin_loop();
            }
            assert_eq!(t.steal(&mut rx).unwrap(), 0);
            assert_eq!(t.steal_pause, want);
            want = (want * 2).min(STEAL_PAUSE_MAX);
        }
        assert_eq!(t.steal_pause, STEAL_PAUSE_MAX);
        let send = |n: u64, first: u64| {
            for id in first..first + n {
                client.send_to(&echo_request(id), to_peer).unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // During a pause nothing is taken, however much waits.
        send(good as u64, 1);
        t.steal_after = Some(Instant::now() + Duration::from_secs(3600));
        assert_eq!(t.steal(&mut rx).unwrap(), 0);
        assert_eq!(t.c.stolen, 0);
        // After it, a quarter of a batch is a good steal: no more pause.
        t.steal_after = Some(Instant::now());
        assert_eq!(t.steal(&mut rx).unwrap(), good);
        assert_eq!((t.steal_pause, t.steal_after), (Duration::ZERO, None));
        // One datagram fewer is little: the pause starts again from the shortest.
        send(good as u64 - 1, 100);
        assert_eq!(t.steal(&mut rx).unwrap(), good - 1);
        assert_eq!(t.steal_pause, STEAL_PAUSE_MIN);
        assert_eq!(t.c.stolen, 2 * good as u64 - 1);
    }

    #[test]
    fn a_backed_off_thread_sleeps_through_a_peers_datagram_during_a_steal_pause() {
        let (own, peer, client) = (loopback(), loopback(), loopback());
        let mut rig = Rig::new();
        let mut t = rig.thread(&own, &[&peer], 64);
        let now = Instant::now();
        assert_eq!(t.pause_left(now), None);
        t.steal_after = Some(now + Duration::from_micros(200));
        assert_eq!(t.pause_left(now), Some(Duration::from_micros(200)));
        assert_eq!(t.pause_left(now + Duration::from_secs(1)), None);
        // How long a wait lasts with a pause of `pause` ms, and what `send_to` received.
        let wait = |t: &mut NetThread, send_to: Option<&UdpSocket>, id: u64, pause: u64| {
            if let Some(to) = send_to {
                client
                    .send_to(&echo_request(id), to.local_addr().unwrap())
                    .unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
            t.steal_after = Some(Instant::now() + Duration::from_millis(pause));
            let t0 = Instant::now();
            t.wait_idle();
            t0.elapsed()
        };
        // Nothing comes: the wait is the whole idle poll, not cut short by a pause's end.
        let waited = wait(&mut t, None, 0, 1);
        assert!(waited >= IDLE_POLL - Duration::from_millis(1), "{waited:?}");
        // A datagram on the peer, which its owner has not taken: the thread sleeps the pause
        // out rather than wake for it over and over.
        let waited = wait(&mut t, Some(&peer), 1, 8);
        assert!(waited >= Duration::from_millis(7), "{waited:?}");
        // Its own socket still wakes it during a pause.
        let waited = wait(&mut t, Some(&own), 2, 5000);
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }

    #[test]
    fn a_thread_without_peers_steals_nothing() {
        let own = loopback();
        let mut rig = Rig::new();
        let mut t = rig.thread(&own, &[], 8);
        let mut rx = RecvBatch::new(BATCH, 2048);
        assert_eq!(t.steal(&mut rx).unwrap(), 0);
        assert_eq!(t.c, Counters::default());
    }

    #[test]
    fn recycling_keeps_the_allocation_and_empties_the_vector() {
        let data = [1u8, 2, 3];
        let mut v: Vec<&[u8]> = Vec::with_capacity(32);
        v.push(&data[..1]);
        v.push(&data[1..]);
        let (ptr, cap) = (v.as_ptr() as usize, v.capacity());
        let w: Vec<&'static [u8]> = recycle(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, cap));
    }
}
