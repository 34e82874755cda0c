//! The host-centric baseline the queues are measured against: for every request, copy it in,
//! launch a kernel that runs the handler, copy the response out, synchronise.
//!
//! [`HostCentricSlot`] is that copy-in / launch / copy-out core: gdr-bench's `HostCentric`
//! (the `gdr mq bench` baseline, one request at a time, plain or as a CUDA graph) runs on one,
//! and gdr-serve's host-centric executor keeps several in flight, one per stream.

use gdr::cuda::{
    Context, CudaError, DeviceBuffer, DeviceMemory, Function, HostBuffer, KernelArgs, LaunchConfig,
    Stream,
};

/// The buffers and stream of one request in flight: a pinned request buffer and its device
/// twin, a device output buffer (length word, then the response at
/// [`RESP_OFF`](Self::RESP_OFF)) and its pinned twin.
///
/// The kernel run on it takes `(const u8 *req, u32 len, u8 *out, u32 cap, u32 *out_len)`, as
/// mq's `gdr_mq_oneshot` and gdr-serve's `gdr_serve_oneshot` do.
pub struct HostCentricSlot {
    stream: Stream,
    req_dev: DeviceBuffer,
    out_dev: DeviceBuffer,
    req_host: HostBuffer,
    out_host: HostBuffer,
    resp_cap: usize,
}

impl HostCentricSlot {
    /// Offset of the response bytes in the device output buffer (the length word comes first).
    pub const RESP_OFF: usize = 16;

    /// A slot for requests up to `req_cap` bytes and responses up to `resp_cap`.
    pub fn new(
        ctx: &Context,
        req_cap: usize,
        resp_cap: usize,
    ) -> Result<HostCentricSlot, CudaError> {
        Ok(HostCentricSlot {
            stream: Stream::new(ctx)?,
            req_dev: DeviceBuffer::new(ctx, req_cap)?,
            out_dev: DeviceBuffer::new(ctx, Self::RESP_OFF + resp_cap)?,
            req_host: HostBuffer::new(ctx, req_cap)?,
            out_host: HostBuffer::new(ctx, Self::RESP_OFF + resp_cap)?,
            resp_cap,
        })
    }

    /// The slot's own stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Copies `req` into the pinned request buffer (at most its capacity; the caller checks,
    /// and calls this only while no enqueued work of the slot is running).
    pub fn load(&mut self, req: &[u8]) {
        self.req_host.as_mut_slice()[..req.len()].copy_from_slice(req);
    }

    /// Enqueues on `stream` the copy of the first `len` request bytes in, `kernel` on one block
    /// of `threads` threads, and the copy of the output buffer out.
    ///
    /// # Safety
    /// The copies read and write the slot's pinned buffers asynchronously: the slot must stay
    /// alive, and its buffers untouched, until the work (or a graph captured from it, each time
    /// it is launched) has finished on its stream.
    pub unsafe fn enqueue(
        &self,
        stream: &Stream,
        kernel: &Function<'_>,
        threads: u32,
        len: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: the pinned request buffer outlives the copy (the caller's contract).
        unsafe {
            stream.memcpy_htod_async(&self.req_dev, 0, &self.req_host.as_slice()[..len])?;
        }
        let (req, rlen, out, cap, olen): (u64, u32, u64, u32, u64) = (
            self.req_dev.device_ptr(),
            len as u32,
            self.out_dev.device_ptr() + Self::RESP_OFF as u64,
            self.resp_cap as u32,
            self.out_dev.device_ptr(),
        );
        let args = KernelArgs::new()
            .arg(&req)
            .arg(&rlen)
            .arg(&out)
            .arg(&cap)
            .arg(&olen);
        // SAFETY: parameters match the kernel's (const u8*, u32, u8*, u32, u32*) (the type's
        // contract); the device buffers are owned by self.
        unsafe { kernel.launch(stream, LaunchConfig::linear(1, threads), &args)? };
        // SAFETY: the destination is pinned, owned by self, written only by this copy, and read
        // only after the stream has finished (the caller's contract).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(
                self.out_host.host_ptr(),
                DeviceMemory::len(&self.out_host),
            );
            stream.memcpy_dtoh_async(dst, &self.out_dev, 0)?;
        }
        Ok(())
    }

    /// The response once the enqueued work has finished, or `Err(len)` when the kernel
    /// reported a length over the response capacity.
    pub fn response(&self) -> Result<&[u8], usize> {
        let out = self.out_host.as_slice();
        let n = u32::from_ne_bytes(out[..4].try_into().expect("4 bytes")) as usize;
        if n <= self.resp_cap {
            Ok(&out[Self::RESP_OFF..Self::RESP_OFF + n])
        } else {
            Err(n)
        }
    }
}
