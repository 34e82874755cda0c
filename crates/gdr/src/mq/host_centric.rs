//! The host-centric baseline the queues are measured against: for every request, copy it in,
//! launch a kernel that runs the same handler, copy the response out, synchronise. Also in a
//! CUDA-graph form (the three steps captured once and replayed).

use super::error::MqError;
use super::gpu_worker::Handler;
use crate::cuda::{
    Context, DeviceBuffer, DeviceMemory, Graph, HostBuffer, LaunchConfig, Module, Stream,
};
use std::ffi::c_void;

/// Offset of the response bytes in the device output buffer (the length word comes first).
const RESP_OFF: usize = 16;

/// One request at a time through copy-launch-copy-sync.
pub struct HostCentric {
    max_msg: usize,
    stream: Stream,
    module: Module,
    req_dev: DeviceBuffer,
    out_dev: DeviceBuffer,
    req_host: HostBuffer,
    out_host: HostBuffer,
    graph: Option<(usize, Graph)>,
}

impl HostCentric {
    pub fn new(ctx: &Context, handler: &Handler, max_msg: usize) -> Result<Self, MqError> {
        let module = handler.load(ctx)?;
        Ok(HostCentric {
            max_msg,
            stream: Stream::new(ctx)?,
            module,
            req_dev: DeviceBuffer::new(ctx, max_msg.max(16))?,
            out_dev: DeviceBuffer::new(ctx, RESP_OFF + max_msg)?,
            req_host: HostBuffer::new(ctx, max_msg.max(16))?,
            out_host: HostBuffer::new(ctx, RESP_OFF + max_msg)?,
            graph: None,
        })
    }

    fn enqueue(&self, stream: &Stream, len: usize) -> Result<(), MqError> {
        let f = self.module.function("gdr_mq_oneshot")?;
        // SAFETY: both host buffers are pinned and owned by self, which outlives every
        // enqueued copy (round trips synchronise before returning; the graph is dropped
        // with self).
        unsafe {
            stream.memcpy_htod_async(&self.req_dev, 0, &self.req_host.as_slice()[..len])?;
        }
        let (mut req, mut rlen, mut out, mut cap, mut olen) = (
            self.req_dev.device_ptr(),
            len as u32,
            self.out_dev.device_ptr() + RESP_OFF as u64,
            self.max_msg as u32,
            self.out_dev.device_ptr(),
        );
        let mut params = [
            &mut req as *mut u64 as *mut c_void,
            &mut rlen as *mut u32 as *mut c_void,
            &mut out as *mut u64 as *mut c_void,
            &mut cap as *mut u32 as *mut c_void,
            &mut olen as *mut u64 as *mut c_void,
        ];
        // SAFETY: parameters match gdr_mq_oneshot(const u8*, u32, u8*, u32, u32*); the
        // buffers are owned by self.
        unsafe { f.launch(stream, LaunchConfig::linear(1, 32), &mut params)? };
        // SAFETY: as above; the destination is pinned, owned by self, written only by this
        // copy, and read only after the stream is synchronised.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(
                self.out_host.host_ptr(),
                DeviceMemory::len(&self.out_host),
            );
            stream.memcpy_dtoh_async(dst, &self.out_dev, 0)?;
        }
        Ok(())
    }

    fn finish(&mut self, resp: &mut [u8]) -> Result<usize, MqError> {
        self.stream.synchronize()?;
        let out = self.out_host.as_slice();
        let n = u32::from_ne_bytes(out[..4].try_into().expect("4 bytes")) as usize;
        if n > self.max_msg {
            return Err(MqError::ResponseTooLong {
                index: 0,
                len: n,
                max: self.max_msg,
            });
        }
        if n > resp.len() {
            return Err(MqError::BufferTooSmall {
                len: n,
                cap: resp.len(),
            });
        }
        resp[..n].copy_from_slice(&out[RESP_OFF..RESP_OFF + n]);
        Ok(n)
    }

    fn load_request(&mut self, req: &[u8]) -> Result<(), MqError> {
        if req.len() > self.max_msg {
            return Err(MqError::Oversize {
                len: req.len(),
                max: self.max_msg,
            });
        }
        self.req_host.as_mut_slice()[..req.len()].copy_from_slice(req);
        Ok(())
    }

    /// One request: copy in, launch, copy out, synchronise.
    pub fn round_trip(&mut self, req: &[u8], resp: &mut [u8]) -> Result<usize, MqError> {
        self.load_request(req)?;
        self.enqueue(&self.stream, req.len())?;
        self.finish(resp)
    }

    /// The same three steps replayed from a CUDA graph (captured on first use per length).
    pub fn round_trip_graph(&mut self, req: &[u8], resp: &mut [u8]) -> Result<usize, MqError> {
        self.load_request(req)?;
        if self.graph.as_ref().map(|g| g.0) != Some(req.len()) {
            self.graph = None;
            let g = Graph::capture(&self.stream, |st| {
                self.enqueue(st, req.len()).map_err(|e| match e {
                    MqError::Cuda(c) => c,
                    other => crate::cuda::CudaError::Driver {
                        call: "graph capture",
                        code: -1,
                        name: "gdr".into(),
                        text: other.to_string(),
                    },
                })
            })?;
            self.graph = Some((req.len(), g));
        }
        self.graph
            .as_ref()
            .expect("captured above")
            .1
            .launch(&self.stream)?;
        self.finish(resp)
    }
}
