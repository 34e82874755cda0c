//! Execution backends: what runs a request once the server has accepted it.
//!
//! The server only needs "take these payloads, hand back their answers in order", so every
//! backend is an [`Executor`]: the GPU-queue path ([`QueueExec`] over a `gdr_mq` queue pair
//! served by persistent GPU workers), the host-centric baseline (`gpu::HostCentricExec`), and
//! a CPU backend for tests ([`QueueExec`] over a queue pair served by `gdr_mq::CpuWorkers`
//! running the app's CPU version: the very same host code as the GPU path, with a CPU thread
//! playing the GPU).

use crate::apps::App;
use crate::ServeError;
use gdr_mq::{CpuHandler, CpuIdle, CpuWorkers, MqError, QueueConfig, QueuePair};
use std::sync::Arc;
use std::time::Duration;

/// The answer to one request: its bytes, or the app failed on it.
pub type Answer<'a> = Result<&'a [u8], AppFailure>;

/// The app could not answer (its response did not fit, or it has no CPU version).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppFailure;

/// Runs requests; answers come back in submission order.
pub trait Executor: Send {
    /// A short name for reports.
    fn name(&self) -> String;
    /// How many more requests may be submitted now.
    fn room(&self) -> usize;
    /// Submits requests (at most `room()`); returns how many were taken.
    fn submit(&mut self, payloads: &[&[u8]]) -> Result<usize, ServeError>;
    /// Hands up to `max` finished answers, oldest first, to `done`; returns how many.
    fn poll(&mut self, max: usize, done: &mut dyn FnMut(Answer<'_>)) -> Result<usize, ServeError>;
    /// Requests submitted and not yet answered.
    fn in_flight(&self) -> usize;
}

/// A `gdr_mq` queue pair as an executor: the payload goes straight into an RX slot (through
/// BAR1 into GPU memory in the Lynx placement), the answer is read from the TX slot.
pub struct QueueExec<'q> {
    q: &'q mut QueuePair,
    limit: usize,
    label: String,
}

impl<'q> QueueExec<'q> {
    /// At most `limit` requests in flight (and never more than the ring's slots): the bound
    /// on queueing delay for what is served.
    pub fn new(q: &'q mut QueuePair, limit: usize, label: String) -> QueueExec<'q> {
        QueueExec { q, limit, label }
    }
}

impl Executor for QueueExec<'_> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn room(&self) -> usize {
        let used = self.q.in_flight() as usize;
        (self.q.credits() as usize).min(self.limit.saturating_sub(used))
    }

    fn submit(&mut self, payloads: &[&[u8]]) -> Result<usize, ServeError> {
        if payloads.is_empty() {
            return Ok(0);
        }
        Ok(self.q.try_send_batch(payloads)?)
    }

    fn poll(&mut self, max: usize, done: &mut dyn FnMut(Answer<'_>)) -> Result<usize, ServeError> {
        let mut n = 0;
        while n < max && self.q.in_flight() > 0 {
            match self.q.try_recv_with(|b| done(Ok(b))) {
                Ok(Some(())) => n += 1,
                Ok(None) => break,
                // Consumed: that one request failed, the queue goes on.
                Err(MqError::ResponseTooLong { .. }) => {
                    done(Err(AppFailure));
                    n += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.q.in_flight() as usize
    }
}

/// What a network thread does with nothing received and nothing in flight, and how the CPU
/// backend's workers wait ([`cpu_workers`]). Here, below the server, so that the backends do
/// not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Idle {
    /// Keep polling the socket: the lowest latency, one core per network thread at 100 %.
    Spin,
    /// Poll for a millisecond, then block in `poll(2)` on the socket until a datagram comes
    /// (or 10 ms pass, to look at the stop flag): a datagram wakes the thread at once, an
    /// idle server costs next to nothing. The CPU mode's workers park too (see
    /// [`cpu_workers`]).
    Backoff,
}

impl Idle {
    /// The idle policy a command line names: `spin` or `backoff`; None for anything else.
    pub fn parse(s: &str) -> Option<Idle> {
        match s {
            "spin" => Some(Idle::Spin),
            "backoff" => Some(Idle::Backoff),
            _ => None,
        }
    }
}

/// The longest an idle CPU worker of a backing-off server stays parked without a look at its
/// queue. A request or a stop wakes it at once (the queue unparks it), so this only bounds
/// how often a parked worker wakes for nothing: a server with a thousand of them on two cores
/// must not spend the cores waking them.
pub const CPU_PARK: Duration = Duration::from_millis(100);

/// The CPU backend: `queues` queue pairs in plain memory, each served by a CPU thread running
/// the app's CPU version, idle as `idle` says (`Backoff`: parked after 1 ms of quiet until a
/// request comes, see [`CPU_PARK`]; `Spin`: gdr_mq's polling, 50 us naps after 1 ms). Take
/// executors from it with [`QueueExec`].
pub fn cpu_workers(
    app: &App,
    queues: usize,
    slots: u32,
    idle: Idle,
) -> Result<CpuWorkers, ServeError> {
    let cfg = QueueConfig {
        slots,
        max_msg: app.slot_payload() as u32,
        wait_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let a = app.clone();
    let cap = app.slot_payload();
    let handler: CpuHandler = Arc::new(move |req: &[u8], resp: &mut [u8]| {
        // A length above the buffer is how a failure reaches the host (ResponseTooLong).
        a.run_cpu(req, resp).unwrap_or(cap + 1)
    });
    // Workers of a server never time out on their own: the server stops them.
    let wait = match idle {
        Idle::Spin => CpuIdle::Poll,
        Idle::Backoff => CpuIdle::Park(CPU_PARK),
    };
    Ok(CpuWorkers::spawn_waiting(
        &cfg,
        queues,
        Duration::from_secs(24 * 3600),
        wait,
        handler,
    )?)
}

/// Splits each backend's queues among `threads` network threads: thread t gets queue t of
/// every backend (one queue set per GPU), as executors limited to `limit` in flight.
pub fn split_queues<'q>(
    sets: Vec<(String, &'q mut [QueuePair])>,
    threads: usize,
    limit: usize,
) -> Result<Vec<Vec<Box<dyn Executor + 'q>>>, ServeError> {
    let mut per_thread: Vec<Vec<Box<dyn Executor + 'q>>> =
        (0..threads).map(|_| Vec::new()).collect();
    for (label, queues) in sets {
        if queues.len() < threads {
            return Err(ServeError::Config(format!(
                "{label}: {} queues for {threads} threads",
                queues.len()
            )));
        }
        for (t, q) in queues.iter_mut().take(threads).enumerate() {
            per_thread[t].push(Box::new(QueueExec::new(q, limit, format!("{label}/q{t}"))));
        }
    }
    Ok(per_thread)
}
