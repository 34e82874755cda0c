//! A CPU thread playing the GPU worker, over plain memory.
//!
//! This is the reference implementation of the device side of the protocol (what
//! `device.cuh` does per warp, done here per thread): it lets the host side — layout, index
//! arithmetic across the u32 wrap, credits, doorbells, stop, the idle watchdog, failure
//! reporting — be tested on any machine, and documents the protocol in Rust.

use crate::error::MqError;
use crate::layout::{self, Geometry, QueueStatus, RX_CONTROL_SIZE};
use crate::memory::{PlainMemory, Region, RingMemory};
use crate::queue::{init_rings, QueuePair, QueueParts, WorkerLink};
use crate::QueueConfig;
use std::mem::offset_of;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A request handler for CPU workers: `(request, response buffer of max_msg bytes) ->
/// response length`. A length above the buffer is reported to the host as an error.
pub type CpuHandler = Arc<dyn Fn(&[u8], &mut [u8]) -> usize + Send + Sync>;

#[derive(Default)]
struct CpuLink {
    live: AtomicUsize,
    failure: Mutex<Option<String>>,
}

impl CpuLink {
    fn poll(&self) -> Result<bool, String> {
        if let Some(f) = self
            .failure
            .lock()
            .map_err(|_| "worker link poisoned")?
            .as_ref()
        {
            return Err(f.clone());
        }
        Ok(self.live.load(Ordering::Acquire) > 0)
    }
}

/// One queue's view of its worker: the set's health, and how to wake the worker when it is
/// parked ([`CpuIdle::Park`]).
struct QueueLink {
    set: Arc<CpuLink>,
    /// The worker is parked, or about to park: a publish must unpark it.
    parked: AtomicBool,
    /// The worker thread, set once it is spawned (before the queue is handed out).
    thread: OnceLock<std::thread::Thread>,
}

impl WorkerLink for QueueLink {
    fn poll(&self) -> Result<bool, String> {
        self.set.poll()
    }

    fn wake(&self) {
        // Pairs with the worker's fence between raising `parked` and its last look at the
        // ring: either that look sees what was just published, or this load sees `parked`
        // (and an unpark before the park is kept as a token, so it is not lost).
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

/// How a CPU worker with no request waits for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuIdle {
    /// Yield for the first millisecond, then nap 50 us between looks at the ring: a request
    /// after a pause waits about 50 us more at most, and an idle worker keeps using a
    /// noticeable share of a core (docs/serve.md, "CPU-mode workers").
    Poll,
    /// Yield for the first [`PARK_AFTER`], then park the thread until the host publishes a
    /// request or asks it to stop (the queue wakes it), or this long passes (to notice an
    /// idle timeout): an idle worker costs nothing, however many there are, and a request
    /// after a quiet spell waits one thread wake-up more.
    Park(Duration),
}

/// How long a [`CpuIdle::Park`] worker polls before it parks.
pub const PARK_AFTER: Duration = Duration::from_millis(1);

/// A set of queue pairs each served by one CPU thread.
///
/// # Examples
///
/// ```
/// use gdr_mq::{CpuHandler, CpuWorkers, QueueConfig};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// // Each worker answers with the request reversed.
/// let reverse: CpuHandler = Arc::new(|req: &[u8], resp: &mut [u8]| {
///     for (o, i) in resp.iter_mut().zip(req.iter().rev()) {
///         *o = *i;
///     }
///     req.len()
/// });
/// let cfg = QueueConfig { slots: 4, max_msg: 32, ..Default::default() };
/// // Two queue pairs, a thread each; a worker exits on stop or after 10 s without a request.
/// let mut workers = CpuWorkers::spawn(&cfg, 2, Duration::from_secs(10), reverse)?;
/// let mut resp = [0u8; 32];
/// for (i, q) in workers.queues_mut().iter_mut().enumerate() {
///     assert_eq!(q.id(), i);
///     let n = q.call(b"gdr", &mut resp)?;
///     assert_eq!(&resp[..n], b"rdg");
/// }
/// workers.stop();
/// # Ok::<(), gdr_mq::MqError>(())
/// ```
pub struct CpuWorkers {
    queues: Vec<QueuePair>,
    threads: Vec<JoinHandle<()>>,
}

struct Ring {
    geo: Geometry,
    rx: Region,
    tx: Region,
    status: Region,
    first: u32,
    idle: Duration,
    wait: CpuIdle,
    link: Arc<QueueLink>,
}

impl CpuWorkers {
    /// Starts `queues` queue pairs shaped by `cfg` (its placement is ignored: all plain
    /// memory), one worker thread each, running `handler`. A worker exits when asked to stop
    /// or after `idle` without a request; while idle it polls ([`CpuIdle::Poll`]).
    pub fn spawn(
        cfg: &QueueConfig,
        queues: usize,
        idle: Duration,
        handler: CpuHandler,
    ) -> Result<CpuWorkers, MqError> {
        Self::spawn_waiting(cfg, queues, idle, CpuIdle::Poll, handler)
    }

    /// As [`spawn`](Self::spawn), with `wait` saying how an idle worker waits.
    ///
    /// # Errors
    /// [`MqError::Config`] when `cfg`'s shape is out of range
    /// ([`QueueConfig::geometry`]), or when ring memory or a worker thread cannot be had.
    pub fn spawn_waiting(
        cfg: &QueueConfig,
        queues: usize,
        idle: Duration,
        wait: CpuIdle,
        handler: CpuHandler,
    ) -> Result<CpuWorkers, MqError> {
        let geo = cfg.geometry()?;
        let link = Arc::new(CpuLink::default());
        let mut out = CpuWorkers {
            queues: Vec::new(),
            threads: Vec::new(),
        };
        for id in 0..queues {
            let mem = |n| -> Result<Arc<dyn RingMemory>, MqError> {
                Ok(Arc::new(PlainMemory::new(n).map_err(MqError::Config)?))
            };
            let rx = Region::whole(mem(geo.rx_bytes())?);
            let tx = Region::whole(mem(geo.tx_bytes())?);
            let status = Region::whole(mem(layout::STATUS_SIZE)?);
            init_rings(&geo, &rx, &tx, cfg.first_index);
            status.store_u32(offset_of!(QueueStatus, rx_cons), cfg.first_index);
            let qlink = Arc::new(QueueLink {
                set: link.clone(),
                parked: AtomicBool::new(false),
                thread: OnceLock::new(),
            });
            let ring = Ring {
                geo,
                rx: rx.clone(),
                tx: tx.clone(),
                status: status.clone(),
                first: cfg.first_index,
                idle,
                wait,
                link: qlink.clone(),
            };
            link.live.fetch_add(1, Ordering::AcqRel);
            let (h, l) = (handler.clone(), link.clone());
            let t = std::thread::Builder::new()
                .name(format!("mq-cpu-worker-{id}"))
                .spawn(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        serve(&ring, &*h)
                    }));
                    if let Err(p) = r {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        if let Ok(mut f) = l.failure.lock() {
                            f.get_or_insert(format!("worker thread {id} panicked: {msg}"));
                        }
                    }
                    l.live.fetch_sub(1, Ordering::AcqRel);
                })
                .map_err(|e| MqError::Config(format!("cannot start a worker thread: {e}")))?;
            let _ = qlink.thread.set(t.thread().clone());
            out.threads.push(t);
            out.queues.push(QueuePair::new(QueueParts {
                id,
                geo,
                rx,
                tx,
                status,
                first_index: cfg.first_index,
                wait_timeout: cfg.wait_timeout,
                link: qlink,
            }));
        }
        Ok(out)
    }

    /// The queue pairs, queue `i` at index `i` (to drive several from their own threads).
    pub fn queues_mut(&mut self) -> &mut [QueuePair] {
        &mut self.queues
    }

    /// Queue pair `i`.
    ///
    /// # Panics
    /// When `i` is not below the number of queues spawned.
    pub fn queue(&mut self, i: usize) -> &mut QueuePair {
        &mut self.queues[i]
    }

    /// Asks every worker to stop and joins them.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        for q in &self.queues {
            q.request_stop();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for CpuWorkers {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

const DB_PROD: usize = offset_of!(layout::Doorbell, prod);
const DB_STOP: usize = offset_of!(layout::Doorbell, stop);

fn set_state(r: &Ring, state: u32, error: u32, arg: u32) {
    if error != 0 {
        r.status.store_u32(offset_of!(QueueStatus, error_arg), arg);
        r.status.store_u32(offset_of!(QueueStatus, error), error);
    }
    r.status.store_u32(offset_of!(QueueStatus, state), state);
}

/// The worker loop: the same steps as `gdr_mq_recv` + handler + `gdr_mq_send`.
fn serve(r: &Ring, handler: &(dyn Fn(&[u8], &mut [u8]) -> usize + Send + Sync)) {
    let geo = r.geo;
    let max = geo.max_msg as usize;
    let mut req = vec![0u8; max];
    // Whole 8-byte pairs, as the TX words carry them.
    let mut resp = vec![0u8; max.next_multiple_of(8)];
    let mut next = r.first;
    let (mut messages, mut batches) = (0u64, 0u64);
    let mut last_prod = r.first;
    let mut last_activity = Instant::now();
    let mut spins = 0u32;
    // Parked (CpuIdle::Park, quiet for PARK_AFTER): one look at the ring per wake-up, not 64.
    let mut parked = false;
    set_state(r, layout::STATE_RUNNING, 0, 0);
    loop {
        if r.rx.load_u32(DB_STOP) != 0 {
            return set_state(r, layout::STATE_STOPPED, 0, 0);
        }
        let (avail, prod) = if geo.rx_words {
            // No doorbell: the requests present are the run of slots from `next` whose word 0
            // carries its message's seq.
            let most = geo.slots.min(layout::WARP_BATCH);
            let n = (0..most)
                .take_while(|&j| {
                    let idx = next.wrapping_add(j);
                    let w0 = r.rx.load_u64(RX_CONTROL_SIZE + geo.slot_offset(idx));
                    (w0 >> 32) as u32 == layout::seq_of(idx)
                })
                .count() as u32;
            if n > 0 {
                last_activity = Instant::now();
            }
            (n, next.wrapping_add(n))
        } else {
            // Acquire: the slots below `prod` are complete.
            let prod = r.rx.load_u32(DB_PROD);
            if prod != last_prod {
                last_prod = prod;
                last_activity = Instant::now();
            }
            (prod.wrapping_sub(next), prod)
        };
        if avail == 0 {
            spins = spins.wrapping_add(1);
            if parked || spins.is_multiple_of(64) {
                let idle = last_activity.elapsed();
                if idle > r.idle {
                    return set_state(r, layout::STATE_IDLE_TIMEOUT, 0, 0);
                }
                match r.wait {
                    CpuIdle::Park(nap) if idle > PARK_AFTER => {
                        parked = true;
                        park(r, nap, next);
                    }
                    _ if idle > Duration::from_millis(1) => {
                        std::thread::sleep(Duration::from_micros(50))
                    }
                    _ => std::thread::yield_now(),
                }
            }
            std::hint::spin_loop();
            continue;
        }
        parked = false;
        if avail > geo.slots {
            return set_state(r, layout::STATE_FAILED, layout::ERR_OVERRUN, prod);
        }
        let n = avail.min(layout::WARP_BATCH);
        for j in 0..n {
            let idx = next.wrapping_add(j);
            let (len, tag) = if geo.rx_words {
                match read_words(r, idx, &mut req) {
                    Ok(v) => v,
                    Err(e) => return set_state(r, layout::STATE_FAILED, e, idx),
                }
            } else {
                let off = RX_CONTROL_SIZE + geo.slot_offset(idx);
                if r.rx.load_u32(off) != layout::seq_of(idx) {
                    return set_state(r, layout::STATE_FAILED, layout::ERR_BAD_SEQ, idx);
                }
                let mut h = [0u8; 12];
                r.rx.read(off + 4, &mut h);
                let len = u32::from_ne_bytes(h[0..4].try_into().expect("4 bytes")) as usize;
                if len > max {
                    return set_state(r, layout::STATE_FAILED, layout::ERR_BAD_LEN, idx);
                }
                r.rx.read(off + layout::SLOT_HEADER_SIZE, &mut req[..len]);
                (
                    len,
                    u64::from_ne_bytes(h[4..12].try_into().expect("8 bytes")),
                )
            };
            let out = handler(&req[..len], &mut resp[..max]);
            // TX: every 8-byte word carries this message's seq next to 4 bytes of data, so
            // no word needs ordering against another (the host checks each). Any order works;
            // write the payload first and word 0 (len) last, the reverse of what helps the
            // host, to keep the host's per-word checks honest under test.
            let seq = layout::seq_of(idx);
            let toff = geo.tx_slot_offset(idx);
            let word = |k: usize, data: u32| {
                r.tx.store_u64(toff + k * layout::TX_WORD_SIZE, layout::tx_word(data, seq))
            };
            let copy = out.min(max);
            let pairs = copy.div_ceil(8);
            for (k, chunk) in resp[..pairs * 8].chunks_exact(4).enumerate().rev() {
                let data = u32::from_ne_bytes(chunk.try_into().expect("4 bytes"));
                word(layout::TX_HEADER_WORDS + k, data);
            }
            word(3, 0);
            word(2, (tag >> 32) as u32);
            word(1, tag as u32);
            word(0, out.min(u32::MAX as usize) as u32);
        }
        next = next.wrapping_add(n);
        messages += n as u64;
        batches += 1;
        r.status
            .store_u64(offset_of!(QueueStatus, messages), messages);
        r.status
            .store_u64(offset_of!(QueueStatus, batches), batches);
        r.status.store_u32(offset_of!(QueueStatus, rx_cons), next);
    }
}

/// Parks the worker until the queue wakes it (a publish or a stop) or `nap` passes, unless a
/// request at `next` or a stop is already there.
fn park(r: &Ring, nap: Duration, next: u32) {
    r.link.parked.store(true, Ordering::Relaxed);
    // Pairs with the fence in QueueLink::wake: see there.
    fence(Ordering::SeqCst);
    let waiting = r.rx.load_u32(DB_STOP) != 0
        || if r.geo.rx_words {
            let w0 = r.rx.load_u64(RX_CONTROL_SIZE + r.geo.slot_offset(next));
            (w0 >> 32) as u32 == layout::seq_of(next)
        } else {
            r.rx.load_u32(DB_PROD) != next
        };
    if !waiting {
        std::thread::park_timeout(nap);
    }
    r.link.parked.store(false, Ordering::Relaxed);
}

/// Reads request `idx` from its word-format RX slot into `req`: `(len, tag)`, or an `ERR_*`.
/// Word 0 was seen current; every other word may still be on its way (each is checked for
/// the message's seq and waited for, up to a second, as the GPU worker waits).
fn read_words(r: &Ring, idx: u32, req: &mut [u8]) -> Result<(usize, u64), u32> {
    let geo = r.geo;
    let seq = layout::seq_of(idx);
    let off = RX_CONTROL_SIZE + geo.slot_offset(idx);
    let deadline = Instant::now() + Duration::from_secs(1);
    let word = |k: usize| -> Result<u32, u32> {
        loop {
            let w = r.rx.load_u64(off + k * layout::TX_WORD_SIZE);
            if (w >> 32) as u32 == seq {
                return Ok(w as u32);
            }
            if Instant::now() > deadline {
                return Err(layout::ERR_BAD_SEQ);
            }
            std::hint::spin_loop();
        }
    };
    let len = word(0)? as usize;
    if len > geo.max_msg as usize {
        return Err(layout::ERR_BAD_LEN);
    }
    let tag = u64::from(word(1)?) | (u64::from(word(2)?) << 32);
    word(3)?;
    for (k, chunk) in req[..len].chunks_mut(4).enumerate() {
        let d = word(layout::TX_HEADER_WORDS + k)?.to_ne_bytes();
        chunk.copy_from_slice(&d[..chunk.len()]);
    }
    Ok((len, tag))
}
