//! The host end of one queue pair: requests out through the RX ring, responses back through
//! the TX ring.
//!
//! Credits: every request gets exactly one response in the TX slot with the same index, so a
//! request's RX slot is free again once its response has arrived, and that response's TX slot
//! is free once the host has read it. The host therefore keeps at most `slots` messages in
//! flight and needs no index from the GPU at all to know what it may reuse: credits =
//! `slots - (sent - received)`, all from its own counters. The workers' lazily written
//! consumer index only feeds statistics and error reports.

use super::error::{ExitReason, InFlight, MqError};
use super::layout::{self, Geometry, QueueStatus, SlotHeader, RX_CONTROL_SIZE, SLOT_HEADER_SIZE};
use super::memory::Region;
use std::mem::offset_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Doorbell word offsets in the RX control line.
const DB_PROD: usize = offset_of!(layout::Doorbell, prod);
const DB_STOP: usize = offset_of!(layout::Doorbell, stop);
/// How often a waiting host looks at the worker's health (status word, stream query).
const HEALTH_PERIOD: Duration = Duration::from_micros(100);

/// Whatever runs the device side of a set of queues, as the host can observe it.
pub(crate) trait WorkerLink: Send + Sync {
    /// Ok(true) while running, Ok(false) once ended, Err(cause) if it failed (a CUDA error
    /// from the stream, a panicked thread).
    fn poll(&self) -> Result<bool, String>;
}

/// Counters of one queue pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    pub sent: u64,
    pub received: u64,
    /// Doorbell writes: `sent / doorbells` is the batching achieved.
    pub doorbells: u64,
    /// Sends that found no credit (back-pressure events).
    pub full: u64,
    /// Most messages in flight at once.
    pub max_in_flight: u64,
    /// Messages and batches the workers report having answered.
    pub worker_messages: u64,
    pub worker_batches: u64,
}

/// Everything a queue pair is made of; built by the worker launchers.
pub(crate) struct QueueParts {
    pub id: usize,
    pub geo: Geometry,
    /// The RX control line followed by the slots.
    pub rx: Region,
    pub tx: Region,
    /// This queue's [`QueueStatus`].
    pub status: Region,
    pub first_index: u32,
    pub wait_timeout: Duration,
    pub link: Arc<dyn WorkerLink>,
}

/// One queue pair. `send` requests, `recv` their responses (in order).
pub struct QueuePair {
    p: QueueParts,
    sent: u64,
    rung: u64,
    received: u64,
    doorbells: u64,
    full: u64,
    max_in_flight: u64,
    last_health: Instant,
    bounce: Vec<u8>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("id", &self.p.id)
            .field("geometry", &self.p.geo)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish()
    }
}

/// Writes the initial ring contents: every slot's seq word set to the previous lap's value
/// for the message that will first use it, so no slot can look published before it is.
pub(crate) fn init_rings(geo: &Geometry, rx: &Region, tx: &Region, first_index: u32) {
    rx.write(0, &[0u8; RX_CONTROL_SIZE]);
    rx.store_u32(DB_PROD, first_index);
    for k in 0..geo.slots {
        let idx = first_index.wrapping_add(k);
        let stale = layout::seq_of(idx.wrapping_sub(geo.slots));
        let h = header_bytes(&SlotHeader {
            seq: stale,
            len: 0,
            tag: 0,
        });
        rx.write(RX_CONTROL_SIZE + geo.slot_offset(idx), &h);
        tx.write(geo.slot_offset(idx), &h);
    }
    rx.publish_fence();
    tx.publish_fence();
}

fn header_bytes(h: &SlotHeader) -> [u8; SLOT_HEADER_SIZE] {
    let mut b = [0u8; SLOT_HEADER_SIZE];
    b[0..4].copy_from_slice(&h.seq.to_ne_bytes());
    b[4..8].copy_from_slice(&h.len.to_ne_bytes());
    b[8..16].copy_from_slice(&h.tag.to_ne_bytes());
    b
}

impl QueuePair {
    pub(crate) fn new(p: QueueParts) -> QueuePair {
        QueuePair {
            p,
            sent: 0,
            rung: 0,
            received: 0,
            doorbells: 0,
            full: 0,
            max_in_flight: 0,
            last_health: Instant::now(),
            bounce: Vec::new(),
        }
    }

    /// Index of this queue in its set.
    pub fn id(&self) -> usize {
        self.p.id
    }

    /// Largest message (request or response) in bytes.
    pub fn max_msg(&self) -> usize {
        self.p.geo.max_msg as usize
    }

    /// Slots per ring: the most messages that can be in flight.
    pub fn slots(&self) -> u32 {
        self.p.geo.slots
    }

    /// Messages that may be sent before a response must be received.
    pub fn credits(&self) -> u32 {
        self.p.geo.slots - (self.sent - self.received) as u32
    }

    /// Messages sent and not yet received.
    pub fn in_flight(&self) -> u64 {
        self.sent - self.received
    }

    /// The timeout of the blocking calls.
    pub fn wait_timeout(&self) -> Duration {
        self.p.wait_timeout
    }

    pub fn set_wait_timeout(&mut self, t: Duration) {
        self.p.wait_timeout = t;
    }

    pub fn stats(&self) -> QueueStats {
        QueueStats {
            sent: self.sent,
            received: self.received,
            doorbells: self.doorbells,
            full: self.full,
            max_in_flight: self.max_in_flight,
            worker_messages: self.p.status.load_u64(offset_of!(QueueStatus, messages)),
            worker_batches: self.p.status.load_u64(offset_of!(QueueStatus, batches)),
        }
    }

    /// With [`GpuConfig::profile`](super::GpuConfig::profile): the worker's clock cycles
    /// summed per stage — `[recv, handler, tx copy, tx fence]` — and the batches they cover.
    pub fn worker_profile(&self) -> ([u64; 4], u64) {
        let base = offset_of!(QueueStatus, profile);
        let c = std::array::from_fn(|k| self.p.status.load_u64(base + 8 * k));
        (c, self.p.status.load_u64(offset_of!(QueueStatus, batches)))
    }

    /// Where this queue's messages are now.
    pub fn in_flight_report(&self) -> InFlight {
        InFlight {
            sent: self.sent,
            answered: self.p.status.load_u64(offset_of!(QueueStatus, messages)),
            received: self.received,
        }
    }

    /// The workers' consumer index, minus the first index: requests they have answered
    /// (written back lazily, once per batch).
    pub fn worker_consumed(&self) -> u32 {
        self.p
            .status
            .load_u32(offset_of!(QueueStatus, rx_cons))
            .wrapping_sub(self.p.first_index)
    }

    fn index(&self, count: u64) -> u32 {
        self.p.first_index.wrapping_add(count as u32)
    }

    /// Writes one request into its RX slot (owner word included); not yet published.
    fn stage(&mut self, msg: &[u8]) {
        let idx = self.index(self.sent);
        let off = RX_CONTROL_SIZE + self.p.geo.slot_offset(idx);
        let h = header_bytes(&SlotHeader {
            seq: layout::seq_of(idx),
            len: msg.len() as u32,
            tag: self.sent,
        });
        self.p.rx.write(off, &h);
        self.p.rx.write(off + SLOT_HEADER_SIZE, msg);
        self.sent += 1;
        self.max_in_flight = self.max_in_flight.max(self.sent - self.received);
    }

    /// Publishes every staged request with one doorbell write.
    fn ring(&mut self) {
        if self.rung == self.sent {
            return;
        }
        self.p.rx.publish_fence();
        self.p.rx.store_u32(DB_PROD, self.index(self.sent));
        self.p.rx.flush();
        self.rung = self.sent;
        self.doorbells += 1;
    }

    fn check_len(&self, len: usize) -> Result<(), MqError> {
        if len > self.max_msg() {
            return Err(MqError::Oversize {
                len,
                max: self.max_msg(),
            });
        }
        Ok(())
    }

    /// Sends one request if a credit is free: Ok(false) when the ring is full.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, MqError> {
        self.check_len(msg.len())?;
        if self.credits() == 0 {
            self.full += 1;
            self.health_if_due()?;
            return Ok(false);
        }
        self.stage(msg);
        self.ring();
        Ok(true)
    }

    /// Sends one request. With no credit free (every slot holds a request or an unreceived
    /// response) this is [`MqError::Full`]: receive first. Use [`try_send`](Self::try_send)
    /// to treat a full ring as a normal outcome.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), MqError> {
        if self.try_send(msg)? {
            Ok(())
        } else {
            Err(MqError::Full {
                queue: self.p.id,
                slots: self.p.geo.slots,
            })
        }
    }

    /// One round trip: sends `req` and waits for its response into `resp`. Any responses
    /// still outstanding are received (and dropped) first.
    pub fn call(&mut self, req: &[u8], resp: &mut [u8]) -> Result<usize, MqError> {
        while self.in_flight() > 0 {
            self.recv_with(|_| ())?;
        }
        self.send(req)?;
        self.recv(resp)
    }

    /// Sends as many of `msgs` as there are credits for, behind one doorbell. Returns how many
    /// were sent; checks every length first and sends nothing if one is too long.
    pub fn try_send_batch<M: AsRef<[u8]>>(&mut self, msgs: &[M]) -> Result<usize, MqError> {
        for m in msgs {
            self.check_len(m.as_ref().len())?;
        }
        let n = msgs.len().min(self.credits() as usize);
        if n < msgs.len() {
            self.full += 1;
        }
        for m in &msgs[..n] {
            self.stage(m.as_ref());
        }
        self.ring();
        if n == 0 && !msgs.is_empty() {
            self.health_if_due()?;
        }
        Ok(n)
    }

    /// True when the response to the oldest outstanding request has been published. After
    /// `true`, the rest of the slot may be read (the load fence keeps those reads after the
    /// owner word's on a write-combined BAR mapping).
    fn response_ready(&self) -> bool {
        if self.received == self.rung {
            return false;
        }
        let idx = self.index(self.received);
        let ready = self.p.tx.load_u32(self.p.geo.slot_offset(idx)) == layout::seq_of(idx);
        if ready {
            self.p.tx.acquire_fence();
        }
        ready
    }

    /// Takes the oldest response if it is there, handing its payload to `f`.
    fn take<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, MqError> {
        if !self.response_ready() {
            return Ok(None);
        }
        let idx = self.index(self.received);
        let off = self.p.geo.slot_offset(idx);
        let mut h = [0u8; 12];
        self.p.tx.read(off + 4, &mut h);
        let len = u32::from_ne_bytes(h[0..4].try_into().expect("4 bytes")) as usize;
        let tag = u64::from_ne_bytes(h[4..12].try_into().expect("8 bytes"));
        if tag != self.received {
            return Err(MqError::Protocol {
                queue: self.p.id,
                what: format!(
                    "response in slot of message {} carries the tag of message {tag}",
                    self.received
                ),
            });
        }
        let index = self.received;
        if len > self.max_msg() {
            self.received += 1;
            return Err(MqError::ResponseTooLong {
                index,
                len,
                max: self.max_msg(),
            });
        }
        let r = if self.p.tx.write_combined() {
            // CPU reads of a BAR mapping are slow and uncached: read once into a bounce buffer.
            let mut b = std::mem::take(&mut self.bounce);
            b.resize(len, 0);
            self.p.tx.read(off + SLOT_HEADER_SIZE, &mut b);
            let r = f(&b);
            self.bounce = b;
            r
        } else {
            // SAFETY: the slot holds the response to message `received`; the worker writes this
            // slot again only for message received + slots, which cannot be sent before
            // `received` advances (below, after the slice is gone).
            f(unsafe { self.p.tx.slice(off + SLOT_HEADER_SIZE, len) })
        };
        self.received += 1;
        Ok(Some(r))
    }

    /// Length of the oldest response if it has arrived.
    fn ready_len(&self) -> Option<usize> {
        if !self.response_ready() {
            return None;
        }
        let off = self.p.geo.slot_offset(self.index(self.received));
        let mut b = [0u8; 4];
        self.p.tx.read(off + 4, &mut b);
        Some(u32::from_ne_bytes(b) as usize)
    }

    fn copy_into(&mut self, buf: &mut [u8]) -> Result<usize, MqError> {
        if let Some(len) = self.ready_len() {
            if len <= self.max_msg() && len > buf.len() {
                // Left in place: the caller can retry with a larger buffer.
                return Err(MqError::BufferTooSmall {
                    len,
                    cap: buf.len(),
                });
            }
        }
        Ok(self
            .take(|b| {
                buf[..b.len()].copy_from_slice(b);
                b.len()
            })?
            .unwrap_or(0))
    }

    /// Receives the oldest response into `buf` if it has arrived: Ok(None) otherwise. A
    /// response longer than `buf` is an error and stays queued.
    pub fn try_recv(&mut self, buf: &mut [u8]) -> Result<Option<usize>, MqError> {
        if self.response_ready() {
            return self.copy_into(buf).map(Some);
        }
        if self.received < self.sent {
            self.health_if_due()?;
        }
        Ok(None)
    }

    /// Receives the oldest response if it has arrived, handing its bytes to `f` (no copy when
    /// the TX ring is in host memory).
    pub fn try_recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, MqError> {
        match self.take(f)? {
            Some(r) => Ok(Some(r)),
            None => {
                if self.received < self.sent {
                    self.health_if_due()?;
                }
                Ok(None)
            }
        }
    }

    /// Receives the oldest response into `buf`, waiting for it (bounded by the wait timeout).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize, MqError> {
        self.wait_response()?;
        self.copy_into(buf)
    }

    fn wait_response(&mut self) -> Result<(), MqError> {
        if self.received == self.sent {
            return Err(MqError::NothingInFlight { queue: self.p.id });
        }
        self.wait("a response", |q| Ok(q.response_ready()))
    }

    /// Receives the oldest response, waiting for it, and hands its bytes to `f`.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R, MqError> {
        self.wait_response()?;
        Ok(self.take(f)?.expect("the response was ready"))
    }

    /// Asks this queue's workers to exit after their current batch.
    pub fn request_stop(&self) {
        self.p.rx.store_u32(DB_STOP, 1);
        self.p.rx.flush();
    }

    /// Spins until `ready`, checking the worker's health every `HEALTH_PERIOD` and giving up
    /// after the wait timeout.
    fn wait(
        &mut self,
        what: &'static str,
        mut ready: impl FnMut(&Self) -> Result<bool, MqError>,
    ) -> Result<(), MqError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if ready(self)? {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(32) {
                let now = Instant::now();
                if now.duration_since(self.last_health) >= HEALTH_PERIOD {
                    self.last_health = now;
                    if let Err(e) = self.health() {
                        // The worker may have answered just before it went away.
                        return if ready(self)? { Ok(()) } else { Err(e) };
                    }
                }
                let waited = now.duration_since(start);
                if waited > self.p.wait_timeout {
                    return Err(MqError::Timeout {
                        what,
                        waited,
                        in_flight: self.in_flight_report(),
                    });
                }
                if waited > Duration::from_millis(1) {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
    }

    fn health_if_due(&mut self) -> Result<(), MqError> {
        let now = Instant::now();
        if now.duration_since(self.last_health) < HEALTH_PERIOD {
            return Ok(());
        }
        self.last_health = now;
        self.health()
    }

    /// Err if this queue's workers are gone: failed (a CUDA error, a panicked thread), or
    /// exited (stopped, idle watchdog, protocol error).
    pub fn health(&self) -> Result<(), MqError> {
        let alive = self.p.link.poll().map_err(|cause| MqError::WorkerFailed {
            queue: self.p.id,
            cause,
            in_flight: self.in_flight_report(),
        })?;
        let st = &self.p.status;
        let state = st.load_u32(offset_of!(QueueStatus, state));
        let reason = match state {
            layout::STATE_RUNNING | layout::STATE_NOT_STARTED if alive => return Ok(()),
            layout::STATE_STOPPED => ExitReason::Stopped,
            layout::STATE_IDLE_TIMEOUT => ExitReason::IdleTimeout,
            layout::STATE_FAILED => ExitReason::Protocol {
                error: st.load_u32(offset_of!(QueueStatus, error)),
                arg: st.load_u32(offset_of!(QueueStatus, error_arg)),
            },
            state => ExitReason::Unknown { state },
        };
        Err(MqError::WorkerExited {
            queue: self.p.id,
            reason,
            in_flight: self.in_flight_report(),
        })
    }
}
