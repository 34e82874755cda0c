//! The host end of one queue pair: requests out through the RX ring, responses back through
//! the TX ring.
//!
//! Credits: every request gets exactly one response in the TX slot with the same index, so a
//! request's RX slot is free again once its response has arrived, and that response's TX slot
//! is free once the host has read it. The host therefore keeps at most `slots` messages in
//! flight and needs no index from the GPU at all to know what it may reuse: credits =
//! `slots - (sent - received)`, all from its own counters. The workers' lazily written
//! consumer index only feeds statistics and error reports.

use crate::error::{ExitReason, InFlight, MqError};
use crate::layout::{self, Geometry, QueueStatus, SlotHeader, RX_CONTROL_SIZE, SLOT_HEADER_SIZE};
use crate::memory::Region;
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
    /// Requests were published or a stop asked for: a worker that sleeps until told (a parked
    /// CPU worker) looks again. Workers that poll memory (the GPU's) need nothing.
    fn wake(&self) {}
}

/// Counters of one queue pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Requests sent since the queue was made (written to their slots and published).
    pub sent: u64,
    /// Responses received (taken by the host, including one dropped as too long).
    pub received: u64,
    /// Doorbell writes: `sent / doorbells` is the batching achieved.
    pub doorbells: u64,
    /// Sends that found no credit (back-pressure events).
    pub full: u64,
    /// Most messages in flight at once.
    pub max_in_flight: u64,
    /// Messages the workers report having answered (`QueueStatus::messages`, written once per
    /// retired batch, so it may lag the responses already in TX).
    pub worker_messages: u64,
    /// Batches the workers report having retired (`QueueStatus::batches`):
    /// `worker_messages / worker_batches` is the workers' batch size.
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
///
/// # Examples
///
/// Over plain memory, served by a CPU thread (a GPU worker serves it the same way):
///
/// ```
/// use gdr_mq::{CpuHandler, CpuWorkers, MqError, QueueConfig};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// // The worker answers each request with its length, in one byte.
/// let len: CpuHandler = Arc::new(|req: &[u8], resp: &mut [u8]| {
///     resp[0] = req.len() as u8;
///     1
/// });
/// let cfg = QueueConfig { slots: 4, max_msg: 16, ..Default::default() };
/// let mut workers = CpuWorkers::spawn(&cfg, 1, Duration::from_secs(10), len)?;
/// let q = workers.queue(0);
/// for msg in [&b"a"[..], b"bb", b"ccc", b"dddd"] {
///     q.send(msg)?;
/// }
/// // Every slot holds a request or an unreceived response: no credit until a receive.
/// assert_eq!((q.in_flight(), q.credits()), (4, 0));
/// assert!(matches!(q.send(b"e"), Err(MqError::Full { slots: 4, .. })));
/// let mut resp = [0u8; 16];
/// for want in 1..=4 {
///     assert_eq!(q.recv(&mut resp)?, 1);
///     assert_eq!(resp[0], want, "in order");
/// }
/// // A request longer than a slot holds is refused before anything is written.
/// assert!(matches!(q.send(&[0; 17]), Err(MqError::Oversize { len: 17, max: 16 })));
/// workers.stop();
/// # Ok::<(), MqError>(())
/// ```
pub struct QueuePair {
    p: QueueParts,
    sent: u64,
    rung: u64,
    received: u64,
    doorbells: u64,
    full: u64,
    max_in_flight: u64,
    last_health: Instant,
    /// The decoded payload of the oldest response (TX words carry 4 payload bytes each, so
    /// responses are always decoded, never read in place); `max_msg` rounded up to 8 bytes.
    bounce: Vec<u8>,
    /// Raw TX words read in bulk from a BAR mapping before they are checked.
    raw: Vec<u8>,
    /// A request packed into RX words before one bulk write (`rx_words` geometry only).
    pack: Vec<u8>,
    /// `seq_publishes` geometry only: the slot offset and (seq, len) word of each request
    /// staged since the last doorbell, stored by `ring` once their payloads are fenced.
    staged: Vec<(usize, u64)>,
    /// Leading TX words of the oldest response already checked current and decoded (0: not
    /// even word 0). Once current, a word stays so until the host retires the slot, so a
    /// poll resumes where the last one stopped and never reads a word twice.
    checked: usize,
    /// `len` and `tag` of the oldest response, valid as far as `checked` reaches.
    cur_len: usize,
    cur_tag: u64,
    /// `(len, tag)` of the oldest response once all its words are current.
    ready: Option<(usize, u64)>,
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

/// Writes the initial ring contents: every RX slot's seq word and every TX word set to the
/// previous lap's seq for the message that will first use the slot, so nothing can look
/// published before it is.
pub(crate) fn init_rings(geo: &Geometry, rx: &Region, tx: &Region, first_index: u32) {
    rx.write(0, &[0u8; RX_CONTROL_SIZE]);
    rx.store_u32(DB_PROD, first_index);
    // One buffer for every slot's stamp, refilled in place: collecting a fresh one per slot
    // was most of the setup of a server with many CPU queues.
    let mut stamped = vec![0u8; geo.stride.max(geo.tx_stride) as usize];
    fn stamp_with(buf: &mut [u8], len: u32, stale: u32) -> &[u8] {
        let stamp = layout::tx_word(0, stale).to_ne_bytes();
        let buf = &mut buf[..len as usize];
        for w in buf.chunks_mut(stamp.len()) {
            w.copy_from_slice(&stamp[..w.len()]);
        }
        buf
    }
    for k in 0..geo.slots {
        let idx = first_index.wrapping_add(k);
        let stale = layout::seq_of(idx.wrapping_sub(geo.slots));
        // Every word of a word-format slot, not only the first: each word publishes itself.
        if geo.rx_words {
            rx.write_words(
                RX_CONTROL_SIZE + geo.slot_offset(idx),
                stamp_with(&mut stamped, geo.stride, stale),
            );
        } else {
            let h = header_bytes(&SlotHeader {
                seq: stale,
                len: 0,
                tag: 0,
            });
            rx.write(RX_CONTROL_SIZE + geo.slot_offset(idx), &h);
        }
        tx.write(
            geo.tx_slot_offset(idx),
            stamp_with(&mut stamped, geo.tx_stride, stale),
        );
    }
    rx.publish_fence();
    tx.publish_fence();
}

/// Packs a request into RX words (`rx_words` geometry): len, tag low, tag high, 0, then 4
/// payload bytes per word (the last zero-padded), each word `(data, seq)`; `words` in all
/// (more than the request needs pads with `(0, seq)`, which restamps the slot). Written in
/// place into a buffer sized once (a push per word was a large part of a big request's
/// send).
fn pack_words(out: &mut Vec<u8>, seq: u32, tag: u64, msg: &[u8], words: usize) {
    // Whole 16-byte units (the GPU checks both words of each), then any restamp padding.
    let have = layout::TX_HEADER_WORDS + msg.len().div_ceil(4);
    let total = words.max(have.next_multiple_of(2));
    out.clear();
    out.resize(total * layout::TX_WORD_SIZE, 0);
    let word = |d: u32| layout::tx_word(d, seq).to_ne_bytes();
    let (head, body) = out.split_at_mut(layout::TX_HEADER_WORDS * layout::TX_WORD_SIZE);
    let header = [msg.len() as u32, tag as u32, (tag >> 32) as u32, 0];
    for (w, d) in head.chunks_exact_mut(layout::TX_WORD_SIZE).zip(header) {
        w.copy_from_slice(&word(d));
    }
    let mut slots = body.chunks_exact_mut(layout::TX_WORD_SIZE);
    let mut quads = msg.chunks_exact(4);
    for (q, w) in (&mut quads).zip(&mut slots) {
        w.copy_from_slice(&word(u32::from_ne_bytes(q.try_into().expect("4 bytes"))));
    }
    let rest = quads.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 4];
        b[..rest.len()].copy_from_slice(rest);
        if let Some(w) = slots.next() {
            w.copy_from_slice(&word(u32::from_ne_bytes(b)));
        }
    }
    for w in slots {
        w.copy_from_slice(&word(0));
    }
}

/// Bytes of a slot header's first word, `seq` and `len` (the worker reads both in one load).
const SEQ_LEN_BYTES: usize = 8;
const _: () = assert!(
    offset_of!(SlotHeader, seq) == 0
        && offset_of!(SlotHeader, len) == 4
        && offset_of!(SlotHeader, tag) == SEQ_LEN_BYTES
);

/// A slot header's first 8-byte word, `seq` then `len` in memory (SlotHeader's field order),
/// for one whole store.
fn seq_len_word(seq: u32, len: u32) -> u64 {
    let mut b = [0u8; SEQ_LEN_BYTES];
    b[..4].copy_from_slice(&seq.to_ne_bytes());
    b[4..].copy_from_slice(&len.to_ne_bytes());
    u64::from_ne_bytes(b)
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
        let bounce = vec![0; (p.geo.max_msg as usize).next_multiple_of(8)];
        QueuePair {
            p,
            sent: 0,
            rung: 0,
            received: 0,
            doorbells: 0,
            full: 0,
            max_in_flight: 0,
            last_health: Instant::now(),
            bounce,
            raw: Vec::new(),
            pack: Vec::new(),
            staged: Vec::new(),
            checked: 0,
            cur_len: 0,
            cur_tag: 0,
            ready: None,
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

    /// Sets the bound of the blocking calls from now on (initially
    /// [`QueueConfig::wait_timeout`](crate::QueueConfig::wait_timeout)).
    pub fn set_wait_timeout(&mut self, t: Duration) {
        self.p.wait_timeout = t;
    }

    /// The queue's counters now: the host's own, and the workers' totals read from the status
    /// record.
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
        if self.p.geo.rx_words {
            // A word that was not rewritten for 2^32 messages would carry a current seq again
            // (a request shorter than the slot leaves its tail alone): once per 2^31 messages
            // of each slot, the whole slot is written, its tail stamped with this seq, which
            // no message of the next 2^32 - 1 indexes carries (as `retire_slot` does for TX).
            let geo = self.p.geo;
            let words = if idx & 0x7fff_ffff < geo.slots {
                geo.stride as usize / layout::TX_WORD_SIZE
            } else {
                geo.rx_words_of(msg.len())
            };
            pack_words(&mut self.pack, layout::seq_of(idx), self.sent, msg, words);
            self.p.rx.write_words(off, &self.pack);
        } else if self.p.geo.seq_publishes {
            // The tag and the payload now; the (seq, len) word only in `ring`, after a fence:
            // a slot whose seq is current holds its whole request, so a worker may poll the
            // header itself instead of the doorbell (docs/mq.md, "Slots their seq publishes").
            self.p
                .rx
                .write(off + SEQ_LEN_BYTES, &self.sent.to_ne_bytes());
            self.p.rx.write(off + SLOT_HEADER_SIZE, msg);
            self.staged
                .push((off, seq_len_word(layout::seq_of(idx), msg.len() as u32)));
        } else {
            let h = header_bytes(&SlotHeader {
                seq: layout::seq_of(idx),
                len: msg.len() as u32,
                tag: self.sent,
            });
            self.p.rx.write(off, &h);
            self.p.rx.write(off + SLOT_HEADER_SIZE, msg);
        }
        self.sent += 1;
        self.max_in_flight = self.max_in_flight.max(self.sent - self.received);
    }

    /// Publishes every staged request with one doorbell write. In the word format the
    /// worker polls the slots themselves: the requests only need to leave the CPU's
    /// write-combining buffers, and no doorbell is written.
    fn ring(&mut self) {
        if self.rung == self.sent {
            return;
        }
        if !self.p.geo.rx_words {
            self.p.rx.publish_fence();
            if self.p.geo.seq_publishes {
                // Payloads and tags, fence, each slot's (seq, len) word, fence, doorbell: both
                // the slot's seq and the doorbell publish it.
                for &(off, word) in &self.staged {
                    self.p.rx.store_u64(off, word);
                }
                self.staged.clear();
                self.p.rx.publish_fence();
            }
            self.p.rx.store_u32(DB_PROD, self.index(self.sent));
        }
        self.p.rx.flush();
        self.p.link.wake();
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

    /// True when the response to the oldest outstanding request is complete: every TX word
    /// it occupies carries its seq. Words are checked and decoded into `bounce` in one pass,
    /// as far as they are current; the next call resumes at the first word that was not (a
    /// response still arriving is never re-read), and once `ready` is set nothing is read.
    fn response_ready(&mut self) -> bool {
        if self.ready.is_some() {
            return true;
        }
        if self.received == self.rung {
            return false;
        }
        let idx = self.index(self.received);
        let seq = layout::seq_of(idx);
        let off = self.p.geo.tx_slot_offset(idx);
        if self.checked == 0 {
            // Word 0 (len) first: it says how many words to check.
            let w0 = self.p.tx.load_u64(off);
            if (w0 >> 32) as u32 != seq {
                return false;
            }
            self.cur_len = w0 as u32 as usize;
            self.cur_tag = 0;
            self.checked = 1;
        }
        let n = self.p.geo.tx_words(self.cur_len);
        let from = self.checked;
        let (bounce, tag) = (&mut self.bounce, &mut self.cur_tag);
        // Checks word `k` (absolute) and decodes its data half.
        let mut take = |k: usize, w: u64| -> bool {
            if (w >> 32) as u32 != seq {
                return false;
            }
            let d = w as u32;
            if k >= layout::TX_HEADER_WORDS {
                let at = 4 * (k - layout::TX_HEADER_WORDS);
                bounce[at..at + 4].copy_from_slice(&d.to_ne_bytes());
            } else if k == 1 {
                *tag |= u64::from(d);
            } else if k == 2 {
                *tag |= u64::from(d) << 32;
            }
            true
        };
        let good = if self.p.tx.write_combined() {
            // Reads of a BAR mapping are uncached round trips: one bulk read (stream loads) of
            // the words not yet seen. Each aligned 8-byte word arrives whole (the GPU writes it
            // in one store and read_words never splits it) and is checked, so no fence orders
            // the reads.
            let raw = &mut self.raw;
            raw.resize((n - from) * layout::TX_WORD_SIZE, 0);
            self.p.tx.read_words(off + from * layout::TX_WORD_SIZE, raw);
            raw.chunks_exact(8)
                .enumerate()
                .take_while(|&(i, c)| {
                    take(from + i, u64::from_ne_bytes(c.try_into().expect("8 bytes")))
                })
                .count()
        } else {
            self.p
                .tx
                .scan_u64(off + from * layout::TX_WORD_SIZE, n - from, |i, w| {
                    take(from + i, w)
                })
        };
        self.checked = from + good;
        if self.checked < n {
            return false;
        }
        self.ready = Some((self.cur_len, self.cur_tag));
        true
    }

    /// Done with the TX slot of message `received` (the worker writes it again only for
    /// message received + slots, which cannot be sent before `received` advances).
    ///
    /// A word the worker has not rewritten for 2^32 messages would carry a current seq
    /// again; so once per 2^31 messages of each slot (when its index is below `slots` modulo
    /// 2^31) every word of the slot is stamped with this message's seq, which no message of
    /// the next 2^32 - 1 indexes carries.
    fn retire_slot(&mut self) {
        let idx = self.index(self.received);
        self.ready = None;
        self.checked = 0;
        if idx & 0x7fff_ffff < self.p.geo.slots {
            let off = self.p.geo.tx_slot_offset(idx);
            let stamp = layout::tx_word(0, layout::seq_of(idx)).to_ne_bytes();
            let slot: Vec<u8> = stamp
                .iter()
                .copied()
                .cycle()
                .take(self.p.geo.tx_stride as usize)
                .collect();
            self.p.tx.write(off, &slot);
            // On a BAR mapping these stores must land before the next request can make the
            // worker write this slot again.
            self.p.tx.publish_fence();
        }
        self.received += 1;
    }

    /// Takes the oldest response if it is there, handing its payload to `f`.
    fn take<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, MqError> {
        if !self.response_ready() {
            return Ok(None);
        }
        let (len, tag) = self.ready.expect("response_ready sets it");
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
            self.retire_slot();
            return Err(MqError::ResponseTooLong {
                index,
                len,
                max: self.max_msg(),
            });
        }
        let r = f(&self.bounce[..len]);
        self.retire_slot();
        Ok(Some(r))
    }

    /// Length of the oldest response if it has arrived.
    fn ready_len(&mut self) -> Option<usize> {
        if !self.response_ready() {
            return None;
        }
        self.ready.map(|(len, _)| len)
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

    /// Receives the oldest response if it has arrived, handing its bytes to `f` (the decoded
    /// payload, borrowed: no allocation).
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
        self.p.link.wake();
    }

    /// Spins until `ready`, checking the worker's health every `HEALTH_PERIOD` and giving up
    /// after the wait timeout.
    fn wait(
        &mut self,
        what: &'static str,
        mut ready: impl FnMut(&mut Self) -> Result<bool, MqError>,
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

#[cfg(test)]
mod tests;
