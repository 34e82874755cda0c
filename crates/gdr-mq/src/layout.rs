//! The ring layout shared by the host (this file) and the GPU (`device.cuh`).
//!
//! Every struct here has a C twin of the same name (with a `gdr_mq_` prefix) in `device.cuh`,
//! and that file carries a `static_assert` on each size and lists each field offset in
//! `GDR_MQ_OFFSETS`. A unit test reads both out of the header text and checks them against
//! `size_of`/`offset_of!` here; NVRTC checks the sizes when it compiles the worker and the
//! kernel `gdr_mq_layout_check` checks the offsets on the device: both sides are held to the
//! same numbers. The protocol itself (who writes what, which fence) is in `docs/mq.md`.

/// Bytes of a slot header; the payload starts right after it (16-byte aligned for vector
/// copies on the GPU).
pub const SLOT_HEADER_SIZE: usize = 16;
/// Slots are 16-byte aligned (the GPU's vector loads and stores) and packed, not padded to
/// 64-byte lines: consecutive requests then fill whole write-combining lines as a batch is
/// written, and a CPU thread sends and receives fewer lines per message. Padded to 64 bytes,
/// a 64-byte message's 80-byte slot left a partial line behind every request, which write
/// combining flushed on its own; packing shortened the CPU thread's sending, the limit of one
/// queue's rate.
pub const SLOT_ALIGN: usize = 16;
/// Bytes before the first RX slot: the doorbell line, padded so that slot writes and doorbell
/// writes never share a 128-byte (adjacent-line prefetch) pair.
pub const RX_CONTROL_SIZE: usize = 128;
/// Bytes of a [`QueueStatus`] record (one per queue, in mapped host memory).
pub const STATUS_SIZE: usize = 64;
/// Bytes of a [`WorkerState`] record (one per queue, in device memory).
pub const WORKER_STATE_SIZE: usize = 64;
/// Most messages one worker warp takes per batch (one per lane).
pub const WARP_BATCH: u32 = 32;
/// TX slots are arrays of 8-byte words `(data: u32, seq: u32)` (the low half is the data);
/// a word belongs to message `i` when its high half is `seq_of(i)`. Every word publishes
/// itself, so the worker needs no fence between the payload and an owner word. The first
/// [`TX_HEADER_WORDS`] words carry `len`, `tag` low, `tag` high and 0; then the payload, 4
/// bytes per word, in pairs of words (16-byte stores on the GPU).
pub const TX_WORD_SIZE: usize = 8;
/// Words before the payload in a TX slot.
pub const TX_HEADER_WORDS: usize = 4;

/// The header at the start of every RX slot. (TX slots use the word format instead: every
/// 8-byte word carries the sequence number, see [`tx_word`] and docs/mq.md.)
///
/// `seq` is the owner word: message index `i` (a wrapping u32) is present in its slot when
/// `seq == i + 1`; the doorbell publishes the slot and `seq` double-checks it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotHeader {
    /// The owner word: [`seq_of`]`(i)` = `i + 1` (wrapping) once the slot holds message `i`;
    /// before that it holds the previous lap's value. Written with the rest of the slot before
    /// the doorbell; the worker checks it after its acquire of the doorbell.
    pub seq: u32,
    /// Payload bytes.
    pub len: u32,
    /// Set by the host on a request; the worker copies it into the response.
    pub tag: u64,
}

/// The RX doorbell, first word of the RX control line. The GPU reads both halves with one
/// 64-bit acquire load, so a stop request costs the poll loop nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Doorbell {
    /// Producer index: messages `[.., prod)` are in their slots. Written by the host.
    pub prod: u32,
    /// Non-zero asks the workers of this queue to exit. Written by the host.
    pub stop: u32,
}

/// Per-queue status in mapped host memory: written by the GPU, read by the host (cheaply:
/// it is host memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStatus {
    /// Messages the workers have answered (retired in order).
    pub messages: u64,
    /// Batches retired.
    pub batches: u64,
    /// Consumer index, written back lazily: once per retired batch, in order.
    pub rx_cons: u32,
    /// One of the `STATE_*` values.
    pub state: u32,
    /// One of the `ERR_*` values (0 = none).
    pub error: u32,
    /// Detail for `error` (the message index concerned).
    pub error_arg: u32,
    /// With [`FLAG_PROFILE`]: lane 0's clock cycles summed per stage (recv, handler, TX
    /// copy, TX fence), written with the totals after each batch.
    pub profile: [u64; 4],
}

/// Worker-private per-queue state in device memory (never touched by the host after launch).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerState {
    /// Next message index to claim (multi-warp queues).
    pub claim: u32,
    /// Next index to retire: batches retire in index order.
    pub retired: u32,
    /// Worker warps not yet exited; the last one out writes the final state.
    pub live: u32,
    /// Set when a worker of this queue failed; the others exit too.
    pub failed: u32,
    /// Queue totals kept by the retiring warp (multi-warp queues): messages answered.
    pub messages: u64,
    /// Batches retired, as `messages` (multi-warp queues).
    pub batches: u64,
    /// Padding to [`WORKER_STATE_SIZE`] bytes; zero, unused.
    pub _reserved: [u64; 4],
}

/// What the worker kernel is told about one queue (an array of these in device memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDesc {
    /// GPU address of the [`Doorbell`] (the RX control line).
    pub doorbell: u64,
    /// GPU address of RX slot 0.
    pub rx_slots: u64,
    /// GPU address of TX slot 0.
    pub tx_slots: u64,
    /// GPU address of this queue's [`QueueStatus`].
    pub status: u64,
    /// GPU address of this queue's [`WorkerState`].
    pub state: u64,
    /// GPU address of this queue's scratch (per worker lane: request and response buffers).
    pub scratch: u64,
    /// Slots per ring (a power of two).
    pub slots: u32,
    /// Bytes from one slot to the next.
    pub stride: u32,
    /// Payload capacity of a slot, for requests and responses alike.
    pub max_msg: u32,
    /// Index of the first message (lets tests start next to the u32 wrap).
    pub first_index: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Worker warps serving this queue.
    pub workers: u32,
    /// Bytes of scratch per lane (two buffers of the rounded-up capacity).
    pub scratch_per_lane: u32,
    /// Bytes from one TX slot to the next (the word format doubles the payload).
    pub tx_stride: u32,
}

/// `QueueDesc::flags`: the RX ring is in mapped host memory, so workers copy each request
/// into scratch with wide loads instead of letting the handler read it over PCIe.
pub const FLAG_RX_IN_HOST: u32 = 1;
/// `QueueDesc::flags`: workers time their stages with `clock64` into [`QueueStatus::profile`].
pub const FLAG_PROFILE: u32 = 2;
/// `QueueDesc::flags`: RX slots use the word format of TX (every 8-byte word carries its
/// message's seq, [`Geometry::with_rx_words`]); the worker polls the slots themselves instead
/// of the doorbell, so a request costs it one memory round trip instead of two.
pub const FLAG_RX_WORDS: u32 = 4;
/// `QueueDesc::flags`: RX slots in the header format are published by their own `seq`
/// ([`Geometry::with_seq_publishes`]): a single-warp GPU worker then polls slot `next`'s
/// header beside the doorbell and finds a lone request one memory round trip sooner.
pub const FLAG_SEQ_PUBLISHES: u32 = 8;

/// `QueueStatus::state`: the workers have not started yet (the zeroed status record). The host
/// treats it as running while the kernel or thread is alive.
pub const STATE_NOT_STARTED: u32 = 0;
/// `QueueStatus::state`: the first worker of the queue is up (written once at its start).
pub const STATE_RUNNING: u32 = 1;
/// `QueueStatus::state`: the workers left because the host set `Doorbell::stop`.
pub const STATE_STOPPED: u32 = 2;
/// `QueueStatus::state`: the workers left after their idle watchdog saw no request for the
/// idle timeout.
pub const STATE_IDLE_TIMEOUT: u32 = 3;
/// `QueueStatus::state`: a worker failed the queue; `error` and `error_arg` say why (written
/// before the state).
pub const STATE_FAILED: u32 = 4;

/// `QueueStatus::error`: no error (the zeroed status record).
pub const ERR_NONE: u32 = 0;
/// A slot below the doorbell did not carry the expected sequence word.
pub const ERR_BAD_SEQ: u32 = 1;
/// A request claimed a length above the slot capacity.
pub const ERR_BAD_LEN: u32 = 2;
/// The doorbell ran more than a ring ahead of the consumer.
pub const ERR_OVERRUN: u32 = 3;
/// A worker waited longer than the retire timeout for the batch before its own (another
/// worker's handler stalled); `arg` is the first message of the waiting batch.
pub const ERR_STALLED: u32 = 4;

/// Sizes of one queue's rings, derived from the slot count and payload capacity.
///
/// # Examples
///
/// ```
/// use gdr_mq::layout::{Geometry, RX_CONTROL_SIZE, SLOT_HEADER_SIZE};
///
/// let g = Geometry::new(8, 100)?;
/// assert_eq!(g.stride, 128, "a 16-byte header and 100 bytes, in 16-byte units");
/// assert_eq!(SLOT_HEADER_SIZE, 16);
/// assert_eq!(g.rx_bytes(), RX_CONTROL_SIZE + 8 * 128);
/// // Message indexes wrap onto the slots, across the u32 wrap too.
/// assert_eq!(g.slot_offset(9), g.slot_offset(1));
/// assert_eq!(g.slot_offset(u32::MAX), 7 * 128);
/// assert!(Geometry::new(6, 100).is_err(), "not a power of two");
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Slots per ring, a power of two in `2..=2^24` (indexes map to slots by a mask).
    pub slots: u32,
    /// Payload capacity of a slot in bytes, for requests and responses alike (at most 2^24).
    pub max_msg: u32,
    /// RX slot stride: header and raw payload, or the word format's size with `rx_words`.
    pub stride: u32,
    /// TX slot stride: [`TX_HEADER_WORDS`] words, then 8 payload bytes per 16.
    pub tx_stride: u32,
    /// RX slots in the word format ([`FLAG_RX_WORDS`]).
    pub rx_words: bool,
    /// Header-format RX slots whose `seq` publishes them ([`FLAG_SEQ_PUBLISHES`]).
    pub seq_publishes: bool,
}

/// Bytes of a slot in the word format: [`TX_HEADER_WORDS`] words, then 8 payload bytes per
/// 16 (whole 16-byte units).
fn word_stride(max_msg: u32) -> usize {
    (TX_HEADER_WORDS * TX_WORD_SIZE + 2 * (max_msg as usize).next_multiple_of(8))
        .next_multiple_of(SLOT_ALIGN)
}

impl Geometry {
    /// Checks the request and derives the stride. `slots` must be a power of two (index
    /// arithmetic is a mask and stays right across the u32 wrap).
    ///
    /// # Errors
    /// The reason, as text, when `slots` is not a power of two in `2..=2^24`, `max_msg` is
    /// above 2^24, or a ring would exceed 2^34 bytes (16 GiB).
    pub fn new(slots: u32, max_msg: u32) -> Result<Geometry, String> {
        if slots < 2 || !slots.is_power_of_two() || slots > (1 << 24) {
            return Err(format!(
                "slots must be a power of two in 2..=2^24, got {slots}"
            ));
        }
        if max_msg > (1 << 24) {
            return Err(format!("max_msg must be at most 16 MiB, got {max_msg}"));
        }
        let stride = (SLOT_HEADER_SIZE + max_msg as usize).next_multiple_of(SLOT_ALIGN);
        let tx_stride = word_stride(max_msg);
        let g = Geometry {
            slots,
            max_msg,
            stride: stride as u32,
            tx_stride: tx_stride as u32,
            rx_words: false,
            seq_publishes: false,
        };
        if g.tx_bytes() > (1usize << 34) {
            return Err(format!(
                "a ring of {slots} slots of {stride} bytes is too large"
            ));
        }
        Ok(g)
    }

    /// The same rings with RX slots in the word format: a request is laid out as a response
    /// is in TX (words `(data, seq)`: len, tag low, tag high, 0, then 4 payload bytes per word).
    pub fn with_rx_words(self) -> Geometry {
        Geometry {
            stride: self.tx_stride,
            rx_words: true,
            ..self
        }
    }

    /// The same rings with header-format RX slots that their `seq` publishes: the host
    /// stores a slot's (seq, len) word after its tag and payload, with a store fence between
    /// (then the doorbell, after another), so a worker that sees the current seq may read the
    /// slot without the doorbell. One fence more a batch. No effect in the word format, where
    /// every word publishes itself.
    pub fn with_seq_publishes(self) -> Geometry {
        Geometry {
            seq_publishes: !self.rx_words,
            ..self
        }
    }

    /// RX words (header included) a request of `len` bytes occupies in the word format.
    pub fn rx_words_of(&self, len: usize) -> usize {
        TX_HEADER_WORDS + 2 * len.div_ceil(8)
    }

    /// Byte offset of the RX slot holding message `index` (from slot 0).
    pub fn slot_offset(&self, index: u32) -> usize {
        (index & (self.slots - 1)) as usize * self.stride as usize
    }

    /// Byte offset of the TX slot holding the response to message `index` (from slot 0).
    pub fn tx_slot_offset(&self, index: u32) -> usize {
        (index & (self.slots - 1)) as usize * self.tx_stride as usize
    }

    /// TX words a response of `len` bytes occupies (header included; `len` is cut at
    /// `max_msg`, as the worker cuts the payload).
    pub fn tx_words(&self, len: usize) -> usize {
        TX_HEADER_WORDS + 2 * len.min(self.max_msg as usize).div_ceil(8)
    }

    /// Bytes of the RX region: control line plus slots.
    pub fn rx_bytes(&self) -> usize {
        RX_CONTROL_SIZE + self.slots as usize * self.stride as usize
    }

    /// Bytes of the TX region: slots only.
    pub fn tx_bytes(&self) -> usize {
        self.slots as usize * self.tx_stride as usize
    }

    /// Scratch bytes per worker lane: a request and a response buffer, each as large as a
    /// slot's payload area (`stride - 16`, at least `max_msg`, a multiple of 16), because the
    /// request copy reads whole 16-byte words up to the first 128 bytes of the slot. (With
    /// `rx_words` the stride is about twice the payload, so this is more than needed.)
    pub fn scratch_per_lane(&self) -> usize {
        2 * (self.stride as usize - SLOT_HEADER_SIZE)
    }
}

/// The sequence word that marks message `index` as present.
pub fn seq_of(index: u32) -> u32 {
    index.wrapping_add(1)
}

/// One TX word: `data` in the low half, the owner `seq` in the high half.
pub fn tx_word(data: u32, seq: u32) -> u64 {
    (u64::from(seq) << 32) | u64::from(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `(struct, field or "sizeof", value)` from the header's sizeof static_asserts and its
    /// GDR_MQ_OFFSETS list.
    fn header_facts() -> Vec<(String, String, usize)> {
        let src = crate::DEVICE_HEADER;
        let mut out = Vec::new();
        for line in src.lines() {
            let l = line.trim();
            if let Some(rest) = l.strip_prefix("X(gdr_mq_") {
                // x, field, N) \\
                let rest = rest.trim_end_matches('\\').trim().trim_end_matches(')');
                let mut parts = rest.split(',').map(str::trim);
                let ty = format!("gdr_mq_{}", parts.next().unwrap());
                let field = parts.next().unwrap().to_string();
                let n: usize = parts.next().unwrap().parse().unwrap();
                out.push((ty, field, n));
            } else if let Some(rest) = l.strip_prefix("static_assert(sizeof(") {
                let (ty, rest) = rest.split_once(')').unwrap();
                let n = rest.trim().trim_start_matches("==").trim();
                let n: usize = n.split(',').next().unwrap().trim().parse().unwrap();
                out.push((ty.trim().into(), "sizeof".into(), n));
            }
        }
        out
    }

    fn rust_fact(ty: &str, field: &str) -> Option<usize> {
        macro_rules! facts {
            ($($cty:literal => $rty:ty { $($f:ident),* }),* $(,)?) => {
                match (ty, field) {
                    $(
                        ($cty, "sizeof") => Some(size_of::<$rty>()),
                        $( ($cty, stringify!($f)) => Some(offset_of!($rty, $f)), )*
                    )*
                    _ => None,
                }
            };
        }
        facts! {
            "gdr_mq_slot_header" => SlotHeader { seq, len, tag },
            "gdr_mq_doorbell" => Doorbell { prod, stop },
            "gdr_mq_status" => QueueStatus {
                messages, batches, rx_cons, state, error, error_arg, profile
            },
            "gdr_mq_worker_state" => WorkerState { claim, retired, live, failed, messages, batches },
            "gdr_mq_queue_desc" => QueueDesc {
                doorbell, rx_slots, tx_slots, status, state, scratch, slots, stride, max_msg,
                first_index, flags, workers, scratch_per_lane, tx_stride
            },
        }
    }

    #[test]
    fn header_and_rust_layouts_agree() {
        let facts = header_facts();
        // Every field of every shared struct is asserted in the header.
        assert_eq!(facts.len(), 4 + 3 + 8 + 7 + 15, "{facts:?}");
        for (ty, field, n) in facts {
            let ours = rust_fact(&ty, &field)
                .unwrap_or_else(|| panic!("header asserts unknown {ty}.{field}"));
            assert_eq!(ours, n, "{ty}.{field}: Rust {ours}, header {n}");
        }
    }

    #[test]
    fn header_constants_match() {
        let src = crate::DEVICE_HEADER;
        let want = [
            ("GDR_MQ_SLOT_HEADER_SIZE", SLOT_HEADER_SIZE as u32),
            ("GDR_MQ_WARP_BATCH", WARP_BATCH),
            ("GDR_MQ_TX_HEADER_WORDS", TX_HEADER_WORDS as u32),
            ("GDR_MQ_FLAG_RX_IN_HOST", FLAG_RX_IN_HOST),
            ("GDR_MQ_FLAG_PROFILE", FLAG_PROFILE),
            ("GDR_MQ_FLAG_RX_WORDS", FLAG_RX_WORDS),
            ("GDR_MQ_FLAG_SEQ_PUBLISHES", FLAG_SEQ_PUBLISHES),
            ("GDR_MQ_STATE_RUNNING", STATE_RUNNING),
            ("GDR_MQ_STATE_STOPPED", STATE_STOPPED),
            ("GDR_MQ_STATE_IDLE_TIMEOUT", STATE_IDLE_TIMEOUT),
            ("GDR_MQ_STATE_FAILED", STATE_FAILED),
            ("GDR_MQ_ERR_BAD_SEQ", ERR_BAD_SEQ),
            ("GDR_MQ_ERR_BAD_LEN", ERR_BAD_LEN),
            ("GDR_MQ_ERR_OVERRUN", ERR_OVERRUN),
            ("GDR_MQ_ERR_STALLED", ERR_STALLED),
        ];
        for (name, v) in want {
            let line = src
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not defined in device.cuh"));
            let got: u32 = line
                .split_whitespace()
                .nth(2)
                .unwrap()
                .trim_end_matches('u')
                .parse()
                .unwrap();
            assert_eq!(got, v, "{name}");
        }
    }

    #[test]
    fn geometry_rounds_and_rejects() {
        let g = Geometry::new(1024, 64).unwrap();
        // RX: the 16-byte header, then the payload, in 16-byte units, packed.
        assert_eq!(g.stride, 80);
        assert_eq!(g.rx_bytes(), 128 + 1024 * 80);
        assert_eq!(Geometry::new(8, 48).unwrap().stride, 64);
        assert_eq!(Geometry::new(8, 49).unwrap().stride, 80);
        assert_eq!(Geometry::new(8, 0).unwrap().stride, 16);
        assert_eq!(Geometry::new(8, 1024).unwrap().stride, 1040);
        // TX: 32 header bytes, then 16 bytes per 8 payload bytes.
        assert_eq!(g.tx_stride, 160);
        assert_eq!(Geometry::new(8, 0).unwrap().tx_stride, 32);
        assert_eq!(Geometry::new(8, 1).unwrap().tx_stride, 48);
        assert_eq!(Geometry::new(8, 17).unwrap().tx_stride, 80);
        assert_eq!(Geometry::new(8, 1024).unwrap().tx_stride, 2080);
        assert_eq!(g.tx_words(0), 4);
        assert_eq!(g.tx_words(1), 6);
        assert_eq!(g.tx_words(64), 20);
        assert_eq!(g.tx_words(1000), 20);
        assert_eq!(g.tx_bytes(), 1024 * 160);
        assert!(Geometry::new(1000, 64).is_err());
        assert!(Geometry::new(1, 64).is_err());
        assert!(Geometry::new(0, 64).is_err());
        assert!(Geometry::new(1 << 25, 64).is_err());
        assert!(Geometry::new(8, (1 << 24) + 1).is_err());
        assert!(Geometry::new(1 << 24, 1 << 20).is_err());
        // The word format: RX slots as large as TX slots.
        let w = g.with_rx_words();
        assert!(w.rx_words && !g.rx_words);
        assert_eq!(w.stride, 160);
        assert_eq!(w.rx_bytes(), 128 + 1024 * 160);
        assert_eq!(w.slot_offset(3), 3 * 160);
        assert_eq!(w.rx_words_of(0), 4);
        assert_eq!(w.rx_words_of(9), 8);
        assert_eq!(w.rx_words_of(64), 20);
    }

    #[test]
    fn slot_offsets_wrap_with_the_index() {
        let g = Geometry::new(8, 64).unwrap();
        assert_eq!(g.slot_offset(0), 0);
        assert_eq!(g.slot_offset(7), 7 * 80);
        assert_eq!(g.slot_offset(8), 0);
        assert_eq!(g.slot_offset(u32::MAX), 7 * 80);
        assert_eq!(g.slot_offset(u32::MAX.wrapping_add(1)), 0);
        assert_eq!(g.tx_slot_offset(7), 7 * 160);
        assert_eq!(g.tx_slot_offset(8), 0);
        assert_eq!(tx_word(7, 9), (9 << 32) | 7);
        assert_eq!(seq_of(u32::MAX), 0);
        assert_eq!(seq_of(5), 6);
    }
}
