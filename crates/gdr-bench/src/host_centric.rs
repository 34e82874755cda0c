//! The host-centric baseline the queues are measured against: for every request, copy it in,
//! launch a kernel that runs the same handler, copy the response out, synchronise. Also in a
//! CUDA-graph form (the three steps captured once and replayed).
//!
//! [`Slot`] (gdr-mq's [`HostCentricSlot`](gdr_mq::HostCentricSlot), re-exported here under
//! its old name) is the one copy-in / launch / copy-out core: [`HostCentric`] (the
//! `gdr mq bench` baseline, one request at a time, plain or as a graph) runs on one, and
//! gdr-serve's host-centric executor keeps several in flight, one per stream.

use gdr::cuda::{Context, CudaError, Graph, Module, Stream};
use gdr_mq::{Handler, MqError};

pub use gdr_mq::HostCentricSlot as Slot;

/// Offset of the response bytes in the device output buffer (the length word comes first).
pub const RESP_OFF: usize = Slot::RESP_OFF;

/// One request at a time through copy-launch-copy-sync.
pub struct HostCentric {
    max_msg: usize,
    module: Module,
    slot: Slot,
    graph: Option<(usize, Graph)>,
}

impl HostCentric {
    /// The baseline for `handler`, a per-lane handler ([`Handler::new`]): each request runs
    /// its `handle` in the library's one-shot kernel (`gdr_mq_oneshot`, which a program with
    /// an application kernel of its own does not carry).
    pub fn new(ctx: &Context, handler: &Handler, max_msg: usize) -> Result<Self, MqError> {
        let module = handler.load(ctx)?;
        Ok(HostCentric {
            max_msg,
            module,
            slot: Slot::new(ctx, max_msg.max(16), max_msg)?,
            graph: None,
        })
    }

    fn enqueue(&self, stream: &Stream, len: usize) -> Result<(), CudaError> {
        let f = self.module.function("gdr_mq_oneshot")?;
        // SAFETY: the slot is owned by self, which outlives every enqueued copy (round trips
        // synchronise before returning; the graph is dropped with self).
        unsafe { self.slot.enqueue(stream, &f, 32, len) }
    }

    fn finish(&mut self, resp: &mut [u8]) -> Result<usize, MqError> {
        self.slot.stream().synchronize()?;
        let out = self.slot.response().map_err(|n| MqError::ResponseTooLong {
            index: 0,
            len: n,
            max: self.max_msg,
        })?;
        let n = out.len();
        if n > resp.len() {
            return Err(MqError::BufferTooSmall {
                len: n,
                cap: resp.len(),
            });
        }
        resp[..n].copy_from_slice(out);
        Ok(n)
    }

    fn load_request(&mut self, req: &[u8]) -> Result<(), MqError> {
        if req.len() > self.max_msg {
            return Err(MqError::Oversize {
                len: req.len(),
                max: self.max_msg,
            });
        }
        self.slot.load(req);
        Ok(())
    }

    /// One request: copy in, launch, copy out, synchronise.
    pub fn round_trip(&mut self, req: &[u8], resp: &mut [u8]) -> Result<usize, MqError> {
        self.load_request(req)?;
        self.enqueue(self.slot.stream(), req.len())?;
        self.finish(resp)
    }

    /// The same three steps replayed from a CUDA graph (captured on first use per length).
    pub fn round_trip_graph(&mut self, req: &[u8], resp: &mut [u8]) -> Result<usize, MqError> {
        self.load_request(req)?;
        if self.graph.as_ref().map(|g| g.0) != Some(req.len()) {
            self.graph = None;
            let g = Graph::capture(self.slot.stream(), |st| self.enqueue(st, req.len()))?;
            self.graph = Some((req.len(), g));
        }
        self.graph
            .as_ref()
            .expect("captured above")
            .1
            .launch(self.slot.stream())?;
        self.finish(resp)
    }
}
