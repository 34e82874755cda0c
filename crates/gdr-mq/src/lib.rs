//! gdr-mq: message queues between the host and persistent GPU workers (the Lynx design), on
//! gdr's mappings of GPU memory.
//!
//! A queue pair is two rings of fixed-size slots: RX carries requests to the GPU, TX carries
//! responses back. RX sits in GPU memory written by the CPU through the BAR1 mapping (as a
//! SmartNIC would write it), or in mapped host memory that the GPU polls; TX sits in mapped
//! host memory written by the GPU (or in GPU memory the CPU reads through the mapping). See
//! [`Placement`]. Persistent worker kernels ([`GpuWorkers`]) poll RX, run the application's
//! device code on each request and publish responses to TX; no kernel launch and no driver
//! call sits on the message path.
//!
//! Layout and memory ordering: [`layout`] and `docs/mq.md`. The host side ([`QueuePair`])
//! runs over any [`RingMemory`], so [`CpuWorkers`] (a CPU thread playing the GPU over plain
//! memory) exercises exactly the same host code without a GPU. [`HostCentricSlot`] is the
//! host-centric baseline the queues are measured against (copy in, launch, copy out, per
//! request).
//!
//! # The application hook
//!
//! A [`Handler`] is the device code, CUDA C compiled at run time with the device header
//! ([`DEVICE_HEADER`]), and it answers messages in one of two ways:
//!
//! - a per-lane handler ([`Handler::new`]): the source defines `__device__ unsigned int
//!   handle(const unsigned char *req, unsigned int req_len, unsigned char *resp, unsigned int
//!   resp_cap)`, and the library's worker kernel calls it, each lane of a worker warp for its
//!   own request (a warp per batch of up to 32);
//! - an application kernel ([`Handler::with_kernel`]): the source defines the persistent
//!   kernel itself, which receives and answers through the header's warp-level calls
//!   (`gdr_mq_worker_init`, `gdr_mq_recv`, `gdr_mq_send`, `gdr_mq_worker_exit`); the program
//!   then leaves the library's worker out and needs no `handle`. gdr-serve's block-wide worker
//!   is one.
//!
//! The device header's opening comment shows the application kernel's loop; `docs/mq.md`
//! gives the rules.
//!
//! # Example
//!
//! A queue in plain memory served by a CPU worker thread, which runs anywhere: one round
//! trip, then a batch behind one doorbell whose responses come back in order.
//!
//! ```
//! use gdr_mq::{CpuHandler, CpuWorkers, QueueConfig};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let upper: CpuHandler = Arc::new(|req: &[u8], resp: &mut [u8]| {
//!     resp[..req.len()].copy_from_slice(&req.to_ascii_uppercase());
//!     req.len()
//! });
//! let cfg = QueueConfig { slots: 8, max_msg: 64, ..Default::default() };
//! // One queue pair; its worker exits on stop, or after 10 s without a request.
//! let mut workers = CpuWorkers::spawn(&cfg, 1, Duration::from_secs(10), upper)?;
//! let q = workers.queue(0);
//! let mut resp = [0u8; 64];
//! let n = q.call(b"hello", &mut resp)?;
//! assert_eq!(&resp[..n], b"HELLO");
//!
//! // Up to `slots` requests in flight: the credits say how many more may be sent.
//! let sent = q.try_send_batch(&[&b"a"[..], b"b", b"c"])?;
//! assert_eq!((sent, q.credits()), (3, 5));
//! for want in [b"A", b"B", b"C"] {
//!     q.recv_with(|r| assert_eq!(r, want))?;
//! }
//! assert_eq!(q.stats().sent, 4);
//! workers.stop();
//! # Ok::<(), gdr_mq::MqError>(())
//! ```
//!
//! The same queue served by a persistent GPU worker ([`Handler::echo`], compiled by NVRTC at
//! run time). Without a usable GPU the example prints why and stops (and fails under
//! `GDR_REQUIRE_GPU=1`, as the GPU tests do).
//!
//! ```
//! use gdr_mq::{GpuConfig, GpuWorkers, Handler};
//! use std::time::Duration;
//!
//! let Some(ctx) = gdr_testing::gpu_context("gdr_mq crate example (doctest)") else {
//!     return Ok(());
//! };
//! let mut workers = GpuWorkers::launch(&ctx, &Handler::echo(), &GpuConfig::default())?;
//! let mut resp = [0u8; 16];
//! let n = workers.queue(0).call(b"ping", &mut resp)?;
//! assert_eq!(&resp[..n], b"ping");
//! workers.stop(Duration::from_secs(5))?;
//! # Ok::<(), gdr_mq::MqError>(())
//! ```

mod cpu_worker;
mod error;
mod gpu_worker;
mod host_centric;
pub mod layout;
mod memory;
mod queue;

pub use cpu_worker::{CpuHandler, CpuIdle, CpuWorkers, PARK_AFTER};
pub use error::{ExitReason, InFlight, MqError};
pub use gpu_worker::{sm_count, GpuConfig, GpuWorkers, Handler, QueueOutcome, WORKER_KERNEL};
pub use host_centric::HostCentricSlot;
pub use memory::{PlainMemory, Region, RingMemory};
pub use queue::{QueuePair, QueueStats};

/// The CUDA header with the ring structs and the warp-level `gdr_mq_recv` / `gdr_mq_send`,
/// for building application kernels ([`Handler::with_kernel`]).
pub const DEVICE_HEADER: &str = include_str!("device.cuh");

use std::time::Duration;

/// Where a ring lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum MemoryKind {
    /// GPU memory with a CPU mapping through BAR1 (write-combined on the CPU side).
    Gpu,
    /// Page-locked host memory mapped into the GPU (the GPU reaches it over PCIe).
    Host,
}

/// Where the two rings of a queue pair live.
///
/// # Examples
///
/// ```
/// use gdr_mq::{MemoryKind, Placement};
///
/// assert_eq!(Placement::LYNX.name(), "rx-gpu/tx-host");
/// assert_eq!(Placement::parse("lynx"), Some(Placement::LYNX));
/// let crossed = Placement::parse("rx-host/tx-gpu").unwrap();
/// assert_eq!((crossed.rx, crossed.tx), (MemoryKind::Host, MemoryKind::Gpu));
/// assert!(Placement::ALL.iter().all(|p| Placement::parse(&p.name()) == Some(*p)));
/// assert_eq!(Placement::parse("nvme"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Placement {
    /// Requests: written by the host, polled by the GPU.
    pub rx: MemoryKind,
    /// Responses: written by the GPU, polled by the host.
    pub tx: MemoryKind,
}

impl Placement {
    /// Lynx: RX in GPU memory written through BAR1, TX in host memory.
    pub const LYNX: Placement = Placement {
        rx: MemoryKind::Gpu,
        tx: MemoryKind::Host,
    };
    /// Both rings in mapped host memory: the GPU polls over PCIe.
    pub const HOST: Placement = Placement {
        rx: MemoryKind::Host,
        tx: MemoryKind::Host,
    };
    /// Both rings in GPU memory: the CPU polls responses through BAR1 (slow reads).
    pub const GPU: Placement = Placement {
        rx: MemoryKind::Gpu,
        tx: MemoryKind::Gpu,
    };
    /// RX in host memory, TX in GPU memory.
    pub const CROSSED: Placement = Placement {
        rx: MemoryKind::Host,
        tx: MemoryKind::Gpu,
    };
    /// The four placements, Lynx first: what `gdr mq bench` measures by default and what
    /// [`parse`](Self::parse) accepts in the `rx-X/tx-Y` form.
    pub const ALL: [Placement; 4] = [Self::LYNX, Self::HOST, Self::GPU, Self::CROSSED];

    /// `rx-gpu/tx-host` style.
    pub fn name(&self) -> String {
        let k = |m: MemoryKind| match m {
            MemoryKind::Gpu => "gpu",
            MemoryKind::Host => "host",
        };
        format!("rx-{}/tx-{}", k(self.rx), k(self.tx))
    }

    /// Parses `lynx`, `host`, `gpu`, `crossed` or the `rx-X/tx-Y` form.
    pub fn parse(s: &str) -> Option<Placement> {
        match s {
            "lynx" => Some(Self::LYNX),
            "host" => Some(Self::HOST),
            "gpu" => Some(Self::GPU),
            "crossed" => Some(Self::CROSSED),
            _ => Self::ALL.into_iter().find(|p| p.name() == s),
        }
    }
}

/// The shape of each queue pair.
///
/// # Examples
///
/// ```
/// use gdr_mq::{MqError, QueueConfig};
///
/// let cfg = QueueConfig { slots: 64, max_msg: 256, ..Default::default() };
/// let g = cfg.geometry()?;
/// assert_eq!((g.slots, g.max_msg, g.rx_words), (64, 256, false));
/// // The word format lays RX out as TX is.
/// let words = QueueConfig { rx_words: true, ..cfg.clone() }.geometry()?;
/// assert_eq!(words.stride, words.tx_stride);
/// let bad = QueueConfig { slots: 1000, ..cfg };
/// assert!(matches!(bad.geometry(), Err(MqError::Config(why)) if why.contains("power of two")));
/// # Ok::<(), MqError>(())
/// ```
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Slots per ring, a power of two in `2..=2^24`: the most messages in flight at once.
    pub slots: u32,
    /// Largest request or response payload in bytes, at most 2^24 (16 MiB); a slot holds
    /// its header and this many bytes.
    pub max_msg: u32,
    /// Where the RX and TX rings live ([`GpuWorkers`]); [`CpuWorkers`] ignores it (all its
    /// rings are plain memory). [`Placement::LYNX`] by default.
    pub placement: Placement,
    /// Bound on every blocking host call ([`QueuePair::recv`], [`QueuePair::call`]): past it
    /// they return [`MqError::Timeout`]. 5 s by default.
    pub wait_timeout: Duration,
    /// Index of the first message (a wrapping u32; slot `i & (slots - 1)` carries message
    /// `i`). 0 by default; tests start near the u32 wrap.
    pub first_index: u32,
    /// RX slots in the word format (every 8-byte word carries its seq, as TX does): the
    /// worker polls the slots, not the doorbell, which saves it a memory round trip per
    /// request (the latency case) but doubles the bytes a request takes. For queues served by
    /// one worker warp (GPU workers refuse it with more).
    pub rx_words: bool,
    /// Header-format RX slots that their own `seq` publishes (the host stores each slot's
    /// header word after its payload, one store fence more a batch): a GPU worker warp that
    /// serves the queue alone, with RX in GPU memory, finds a lone request by polling its
    /// slot's header beside the doorbell, one memory round trip sooner, and a caller of
    /// `gdr_mq_recv_header_hook` may hand it on before reading the slot. A batch still costs
    /// one doorbell read more. Off by default; ignored with `rx_words`.
    pub seq_publishes: bool,
}

impl QueueConfig {
    /// The ring sizes this configuration asks for.
    ///
    /// # Errors
    /// [`MqError::Config`] when `slots` or `max_msg` is out of range (see the fields) or a
    /// ring would exceed 16 GiB.
    pub fn geometry(&self) -> Result<layout::Geometry, MqError> {
        let g = layout::Geometry::new(self.slots, self.max_msg).map_err(MqError::Config)?;
        let g = if self.rx_words { g.with_rx_words() } else { g };
        Ok(if self.seq_publishes {
            g.with_seq_publishes()
        } else {
            g
        })
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            slots: 1024,
            max_msg: 1024,
            placement: Placement::LYNX,
            wait_timeout: Duration::from_secs(5),
            first_index: 0,
            rx_words: false,
            seq_publishes: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_names_round_trip() {
        for p in Placement::ALL {
            assert_eq!(Placement::parse(&p.name()), Some(p));
        }
        assert_eq!(Placement::parse("lynx"), Some(Placement::LYNX));
        assert_eq!(Placement::parse("rx-gpu/tx-host"), Some(Placement::LYNX));
        assert_eq!(Placement::parse("nvme"), None);
    }
}
