//! Persistent GPU workers: the handler compiled with the device header, one kernel launch
//! serving every queue of a set until told to stop.
//!
//! The kernel never returns on its own while requests keep coming, so the host side is built
//! to never wait on it blindly: every wait polls the stream (`cuStreamQuery`) and the status
//! words, a worker that traps surfaces as its CUDA error with the messages in flight, and a
//! set that cannot be stopped is leaked rather than freed under a running kernel (freeing
//! would block in the driver, and the kernel would fault).

use crate::error::{ExitReason, MqError};
use crate::layout::{self, QueueDesc, QueueStatus, WorkerState};
use crate::memory::{Region, RingMemory};
use crate::queue::{init_rings, QueuePair, QueueParts, WorkerLink};
use crate::{MemoryKind, QueueConfig, DEVICE_HEADER};
use gdr::bar::VulkanBackend;
use gdr::cuda::{
    Attribute, Context, DeviceBuffer, DeviceMemory, HostBuffer, KernelArgs, LaunchConfig, Module,
    Stream,
};
use std::mem::{offset_of, size_of};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKER_SOURCE: &str = include_str!("worker.cu");

/// The device code of a set of workers, written in CUDA C and compiled at run time (NVRTC):
/// one of the two hooks by which an application receives and answers messages.
///
/// - A per-lane handler ([`Handler::new`]): the source defines
///
///   ```c
///   __device__ unsigned int handle(const unsigned char *req, unsigned int req_len,
///                                  unsigned char *resp, unsigned int resp_cap);
///   ```
///
///   returning the response length, and the library's worker kernel (`worker.cu`,
///   [`WORKER_KERNEL`]) calls it: each lane of a worker warp for its own message; `req` and
///   `resp` are 16-byte aligned.
/// - An application kernel ([`Handler::with_kernel`]): the source defines the persistent
///   kernel that is launched, and that kernel receives and answers through the device
///   header's warp-level calls (`gdr_mq_worker_init`, `gdr_mq_recv`, `gdr_mq_send`,
///   `gdr_mq_worker_exit`). No `handle` is needed then.
///
/// Either source may use anything in `device.cuh` ([`DEVICE_HEADER`](crate::DEVICE_HEADER)).
#[derive(Clone, Debug)]
pub struct Handler {
    name: String,
    source: String,
    /// The application's kernel ([`Handler::with_kernel`]); `None`: the library's worker.
    kernel: Option<String>,
    retire_timeout: Option<Duration>,
}

/// The worker kernel `worker.cu` defines; [`Handler::with_kernel`] names another.
pub const WORKER_KERNEL: &str = "gdr_mq_worker";

impl Handler {
    /// A per-lane handler: `source` defines `handle`, which the library's worker kernel calls.
    /// `name` names the program in compile errors; `source` is spliced in after the header.
    pub fn new(name: &str, source: &str) -> Handler {
        Handler {
            name: name.into(),
            source: source.into(),
            kernel: None,
            retire_timeout: None,
        }
    }

    /// How long a worker of a queue with several workers waits for the batch before its own
    /// to be retired before it fails the queue (`ERR_STALLED`); 10 s unless set. Set it above
    /// the longest a handler may run.
    pub fn with_retire_timeout(mut self, timeout: Duration) -> Handler {
        self.retire_timeout = Some(timeout);
        self
    }

    /// The application-kernel hook: launches the kernel `kernel`, which the source defines,
    /// instead of the library's, and leaves `worker.cu` out of the program (the source need
    /// not define `handle`). The kernel must take `worker.cu`'s parameters — `(const
    /// gdr_mq_queue_desc *descs, gdr_u32 nqueues, gdr_u32 blocks_per_queue, gdr_u64
    /// idle_ns)`, one block per `blockIdx.x / blocks_per_queue` queue — and serve its queues
    /// through `gdr_mq_worker_init`, `gdr_mq_recv`, `gdr_mq_send` and `gdr_mq_worker_exit`, as
    /// `worker.cu` does (`device.cuh` shows the loop; `docs/mq.md` the rules). This is the
    /// hook for a worker that is not one request per lane (a block on one request, say), as
    /// gdr-serve's is.
    pub fn with_kernel(mut self, kernel: &str) -> Handler {
        self.kernel = Some(kernel.into());
        self
    }

    /// The name of the kernel launched for this handler.
    pub fn kernel(&self) -> &str {
        self.kernel.as_deref().unwrap_or(WORKER_KERNEL)
    }

    /// Answers every request with its own bytes. The copy issues up to eight 16-byte loads
    /// before their stores: a load-store-load loop would wait out one memory round trip per
    /// 16 bytes (the compiler cannot hoist a load over a store that may alias it).
    pub fn echo() -> Handler {
        Handler::new(
            "echo",
            r#"
__device__ unsigned int handle(const unsigned char *req, unsigned int len,
                               unsigned char *resp, unsigned int cap) {
    const unsigned int n = len < cap ? len : cap;
    const uint4 *s = (const uint4 *)req;
    uint4 *d = (uint4 *)resp;
    const unsigned int words = n / 16u;
    for (unsigned int base = 0; base < words; base += 8u) {
        uint4 r[8];
#pragma unroll
        for (unsigned int k = 0; k < 8u; k++)
            if (base + k < words) r[k] = s[base + k];
#pragma unroll
        for (unsigned int k = 0; k < 8u; k++)
            if (base + k < words) d[base + k] = r[k];
    }
    // The tail: 8, then 4, then single bytes (a byte loop over up to 15 bytes was a
    // noticeable part of a lone message's round trip), behind
    // one test so whole units pay for one branch only.
    unsigned int i = words * 16u;
    if (i < n) {
        if (i + 8u <= n) {
            *(uint2 *)(resp + i) = *(const uint2 *)(req + i);
            i += 8u;
        }
        if (i + 4u <= n) {
            *(unsigned int *)(resp + i) = *(const unsigned int *)(req + i);
            i += 4u;
        }
        for (; i < n; i++) resp[i] = req[i];
    }
    return n;
}
"#,
        )
    }

    /// The whole NVRTC program: header, the source, and (for a per-lane handler) the
    /// library's worker kernels, which call `handle`.
    pub fn program(&self) -> String {
        let defines = self.retire_timeout.map_or(String::new(), |t| {
            format!(
                "#define GDR_MQ_RETIRE_TIMEOUT_NS {}ull\n",
                t.as_nanos().clamp(1, u64::MAX as u128)
            )
        });
        // An application kernel brings its own worker: worker.cu would only add kernels that
        // call a `handle` the source has no reason to define.
        let worker = match self.kernel {
            None => format!("\n#line 1 \"gdr-mq/worker.cu\"\n{WORKER_SOURCE}"),
            Some(_) => "\n".into(),
        };
        format!(
            "{defines}{DEVICE_HEADER}\n#line 1 \"{name}\"\n{src}{worker}",
            name = self.name.replace(['"', '\\', '\n'], "_"),
            src = self.source
        )
    }

    /// The program for workers of queues in one RX format: `gdr_mq_recv` then carries the
    /// code of that format only (`GDR_MQ_RX_FORMAT_ONLY`). A smaller kernel that compiles
    /// sooner, with the same round trip.
    pub fn program_for(&self, rx_words: bool) -> String {
        format!(
            "#define GDR_MQ_RX_FORMAT_ONLY {}\n{}",
            u8::from(rx_words),
            self.program()
        )
    }

    /// Compiles (cached per process) and loads the program on `ctx`'s device.
    pub fn load(&self, ctx: &Context) -> Result<Module, MqError> {
        Ok(Module::from_source(
            ctx,
            &format!("gdr_mq_{}.cu", self.name),
            &self.program(),
        )?)
    }

    /// As [`load`](Self::load), the program for queues in one RX format
    /// ([`program_for`](Self::program_for)).
    pub fn load_for(&self, ctx: &Context, rx_words: bool) -> Result<Module, MqError> {
        let format = if rx_words { "words" } else { "header" };
        Ok(Module::from_source(
            ctx,
            &format!("gdr_mq_{}_{format}.cu", self.name),
            &self.program_for(rx_words),
        )?)
    }
}

/// How many workers, where, and how patient.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// The shape of every queue pair of the set (slots, `max_msg`, placement, RX format,
    /// wait timeout, first index).
    pub queue: QueueConfig,
    /// Queue pairs in the set.
    pub queues: u32,
    /// Thread blocks per queue.
    pub blocks_per_queue: u32,
    /// Warps (workers) per block.
    pub warps_per_block: u32,
    /// A worker exits after this long without a new request (the watchdog for a host that
    /// went away without stopping it).
    pub idle_timeout: Duration,
    /// Workers sum their cycles per stage (see [`QueuePair::worker_profile`]); meant for
    /// one-worker queues, off by default (four more status writes per batch).
    pub profile: bool,
    /// Dynamic shared memory of each worker block, in bytes (for a kernel of one's own,
    /// [`Handler::with_kernel`]); above 48 KiB the kernel is allowed it first. 0 by default.
    /// The library's own worker kernel also has 4096 bytes of static shared memory per block
    /// (a lone message's request and response, for its first 8 warps).
    pub shared_mem: u32,
    /// Warps of each block that receive (call `gdr_mq_recv`); 0: every warp, as in the
    /// library's worker. A kernel of one's own in which one warp receives for its whole block
    /// ([`Handler::with_kernel`]) sets 1: a queue with one receiving warp claims without
    /// atomics and may use word-format RX. Every warp still calls `gdr_mq_worker_exit`.
    pub receiving_warps: u32,
    /// Blocks of each queue whose warps receive; 0: every block. A kernel of one's own whose
    /// queue is served by a thread-block cluster, with the receiving warp in its first block
    /// only, sets 1 (the others still call `gdr_mq_worker_exit`).
    pub receiving_blocks: u32,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            queue: QueueConfig::default(),
            queues: 1,
            blocks_per_queue: 1,
            warps_per_block: 1,
            idle_timeout: Duration::from_secs(10),
            profile: false,
            shared_mem: 0,
            receiving_warps: 0,
            receiving_blocks: 0,
        }
    }
}

struct GpuLink {
    ctx: Context,
    stream: Arc<Stream>,
}

impl WorkerLink for GpuLink {
    fn poll(&self) -> Result<bool, String> {
        self.ctx.bind().map_err(|e| e.to_string())?;
        match self.stream.query() {
            Ok(done) => Ok(!done),
            Err(e) => Err(format!("the worker kernel failed: {e}")),
        }
    }
}

/// What `stop` found for one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueueOutcome {
    /// Why the queue's workers left ([`ExitReason::Stopped`] after a clean stop); `Unknown
    /// { state: 0 }` when the status record gave no exit reason.
    pub reason: ExitReason,
    /// The queue's counters at the end.
    pub stats: crate::QueueStats,
}

/// Allocations the kernel uses; dropped only once it is known to have ended.
struct Resources {
    _rx: Arc<dyn RingMemory>,
    _tx: Arc<dyn RingMemory>,
    _status: Arc<dyn RingMemory>,
    _descs: DeviceBuffer,
    _states: DeviceBuffer,
    _scratch: DeviceBuffer,
    _staging: HostBuffer,
    _module: Module,
}

/// A set of queue pairs served by one persistent worker kernel.
pub struct GpuWorkers {
    queues: Vec<QueuePair>,
    link: Arc<GpuLink>,
    resources: Option<Resources>,
    ended: bool,
}

fn alloc(
    ctx: &Context,
    kind: MemoryKind,
    len: usize,
    bar: &mut Option<VulkanBackend>,
) -> Result<Arc<dyn RingMemory>, MqError> {
    Ok(match kind {
        MemoryKind::Host => Arc::new(HostBuffer::new(ctx, len)?),
        MemoryKind::Gpu => {
            if bar.is_none() {
                *bar = Some(VulkanBackend::new(ctx)?);
            }
            Arc::new(bar.as_ref().expect("just set").alloc(len, 4096)?)
        }
    })
}

fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is one of the repr(C) layout structs: plain integers, no padding bytes
    // (their sizes are asserted equal to the sum of their fields in layout.rs's twins).
    unsafe { std::slice::from_raw_parts((v as *const T).cast(), size_of::<T>()) }
}

impl GpuWorkers {
    /// Compiles `handler`, lays out `cfg.queues` queue pairs, and launches the workers.
    ///
    /// # Errors
    /// [`MqError::Config`] for a shape that cannot run (a zero count, more receiving warps or
    /// blocks than there are, word RX with several workers, over 32 warps a block or more than
    /// the kernel's registers allow, more worker blocks than SMs, blocks not whole clusters),
    /// [`MqError::ClustersDoNotFit`], [`MqError::Cuda`] (compiling, allocating, launching) and
    /// [`MqError::Bar`] (mapping GPU memory for a ring).
    pub fn launch(ctx: &Context, handler: &Handler, cfg: &GpuConfig) -> Result<Self, MqError> {
        let q = &cfg.queue;
        let geo = q.geometry()?;
        let nq = cfg.queues as usize;
        if nq == 0 || cfg.blocks_per_queue == 0 || cfg.warps_per_block == 0 {
            return Err(MqError::Config(
                "queues, blocks per queue and warps per block must be at least 1".into(),
            ));
        }
        if cfg.receiving_warps > cfg.warps_per_block {
            return Err(MqError::Config(format!(
                "{} receiving warps in a block of {} warps",
                cfg.receiving_warps, cfg.warps_per_block
            )));
        }
        // Warps that claim requests (QueueDesc::workers), and warps that leave (`live`).
        let receiving = match cfg.receiving_warps {
            0 => cfg.warps_per_block,
            r => r,
        };
        if cfg.receiving_blocks > cfg.blocks_per_queue {
            return Err(MqError::Config(format!(
                "{} receiving blocks of {} blocks per queue",
                cfg.receiving_blocks, cfg.blocks_per_queue
            )));
        }
        let receiving_blocks = match cfg.receiving_blocks {
            0 => cfg.blocks_per_queue,
            b => b,
        };
        let workers = receiving_blocks * receiving;
        let all_warps = cfg.blocks_per_queue * cfg.warps_per_block;
        if q.rx_words && workers > 1 {
            return Err(MqError::Config(format!(
                "RX words need one worker warp per queue (the warp polls the slots itself), \
                 got {workers}"
            )));
        }
        if cfg.warps_per_block > 32 {
            return Err(MqError::Config(format!(
                "at most 32 warps per block, got {}",
                cfg.warps_per_block
            )));
        }
        ctx.bind()?;
        // Every worker block must be resident at once: workers wait on each other (in-order
        // retire) and on the host, so a block that never gets an SM would stall its queue.
        let sms = ctx.device().attribute(Attribute::MultiprocessorCount)? as u64;
        let blocks = cfg.queues as u64 * cfg.blocks_per_queue as u64;
        if blocks > sms {
            return Err(MqError::Config(format!(
                "{blocks} worker blocks do not fit at once on the GPU's {sms} SMs; use fewer \
                 queues or blocks per queue"
            )));
        }
        // Everything that may synchronise with the device happens before the launch.
        let module = handler.load_for(ctx, q.rx_words)?;
        let stream = Arc::new(Stream::new(ctx)?);
        let rx_each = geo.rx_bytes().next_multiple_of(4096);
        let tx_each = geo.tx_bytes().next_multiple_of(4096);
        let mut bar = None;
        let rx_mem = alloc(ctx, q.placement.rx, rx_each * nq, &mut bar)?;
        let tx_mem = alloc(ctx, q.placement.tx, tx_each * nq, &mut bar)?;
        let status_mem: Arc<dyn RingMemory> =
            Arc::new(HostBuffer::new(ctx, layout::STATUS_SIZE * nq)?);
        let lane_scratch = geo.scratch_per_lane();
        let scratch_each = all_warps as usize * 32 * lane_scratch;
        let scratch = DeviceBuffer::new(ctx, scratch_each * nq)?;
        let descs = DeviceBuffer::new(ctx, size_of::<QueueDesc>() * nq)?;
        let states = DeviceBuffer::new(ctx, layout::WORKER_STATE_SIZE * nq)?;
        let desc_bytes = size_of::<QueueDesc>() * nq;
        let mut staging = HostBuffer::new(ctx, desc_bytes + layout::WORKER_STATE_SIZE * nq)?;

        let link = Arc::new(GpuLink {
            ctx: ctx.clone(),
            stream: stream.clone(),
        });
        let mut queues = Vec::with_capacity(nq);
        let status_all = Region::whole(status_mem.clone());
        for i in 0..nq {
            let rx = Region::new(rx_mem.clone(), i * rx_each, geo.rx_bytes())
                .expect("inside the allocation");
            let tx = Region::new(tx_mem.clone(), i * tx_each, geo.tx_bytes())
                .expect("inside the allocation");
            let status = status_all
                .sub(i * layout::STATUS_SIZE, layout::STATUS_SIZE)
                .expect("inside the allocation");
            init_rings(&geo, &rx, &tx, q.first_index);
            status.store_u32(offset_of!(QueueStatus, rx_cons), q.first_index);
            let flags = match q.placement.rx {
                MemoryKind::Host => layout::FLAG_RX_IN_HOST,
                MemoryKind::Gpu => 0,
            } | if cfg.profile { layout::FLAG_PROFILE } else { 0 }
                | if geo.rx_words {
                    layout::FLAG_RX_WORDS
                } else {
                    0
                }
                | if geo.seq_publishes {
                    layout::FLAG_SEQ_PUBLISHES
                } else {
                    0
                };
            let desc = QueueDesc {
                doorbell: rx.gpu_addr(),
                rx_slots: rx.gpu_addr() + layout::RX_CONTROL_SIZE as u64,
                tx_slots: tx.gpu_addr(),
                status: status.gpu_addr(),
                state: states.device_ptr() + (i * layout::WORKER_STATE_SIZE) as u64,
                scratch: scratch.device_ptr() + (i * scratch_each) as u64,
                slots: geo.slots,
                stride: geo.stride,
                max_msg: geo.max_msg,
                first_index: q.first_index,
                flags,
                workers,
                scratch_per_lane: lane_scratch as u32,
                tx_stride: geo.tx_stride,
            };
            let state = WorkerState {
                claim: q.first_index,
                retired: q.first_index,
                live: all_warps,
                ..Default::default()
            };
            let s = staging.as_mut_slice();
            let d = i * size_of::<QueueDesc>();
            s[d..d + size_of::<QueueDesc>()].copy_from_slice(as_bytes(&desc));
            let w = desc_bytes + i * layout::WORKER_STATE_SIZE;
            s[w..w + size_of::<WorkerState>()].copy_from_slice(as_bytes(&state));
            queues.push(QueuePair::new(QueueParts {
                id: i,
                geo,
                rx,
                tx,
                status,
                first_index: q.first_index,
                wait_timeout: q.wait_timeout,
                link: link.clone(),
            }));
        }
        // Write-combined ring initialisation must be out of the CPU before the kernel looks.
        gdr_mem::store_fence();
        // Stream-ordered uploads, then the launch on the same stream.
        // SAFETY: staging is pinned and kept alive in Resources until the kernel has ended;
        // the ranges fit both buffers.
        unsafe {
            stream.memcpy_htod_async(&descs, 0, &staging.as_slice()[..desc_bytes])?;
            stream.memcpy_htod_async(&states, 0, &staging.as_slice()[desc_bytes..])?;
        }
        let f = module.function(handler.kernel())?;
        let most = f.max_threads_per_block()?;
        if cfg.warps_per_block * 32 > most {
            return Err(MqError::Config(format!(
                "{} warps per block: kernel {} fits at most {} ({} threads, by its registers)",
                cfg.warps_per_block,
                handler.kernel(),
                most / 32,
                most
            )));
        }
        let (p_descs, p_nq, p_bpq, p_idle): (u64, u32, u32, u64) = (
            descs.device_ptr(),
            cfg.queues,
            cfg.blocks_per_queue,
            cfg.idle_timeout.as_nanos().min(u64::MAX as u128) as u64,
        );
        let args = KernelArgs::new()
            .arg(&p_descs)
            .arg(&p_nq)
            .arg(&p_bpq)
            .arg(&p_idle);
        if cfg.shared_mem > 48 * 1024 {
            f.set_max_dynamic_shared(cfg.shared_mem)?;
        }
        let launch = LaunchConfig {
            shared_mem: cfg.shared_mem,
            ..LaunchConfig::linear(blocks as u32, cfg.warps_per_block * 32)
        };
        // A kernel compiled for thread-block clusters: every cluster must be resident at once
        // (as every block must), and clusters are placed whole within one GPC of the GPU, so
        // fewer of them fit than SMs / width.
        let width = f.required_cluster_width()?;
        if width > 1 {
            if !(blocks as u32).is_multiple_of(width) {
                return Err(MqError::Config(format!(
                    "{blocks} worker blocks are not whole clusters of {width}"
                )));
            }
            let fit = f.max_active_clusters(&stream, launch)?;
            let clusters = blocks as u32 / width;
            if clusters > fit {
                return Err(MqError::ClustersDoNotFit {
                    clusters,
                    width,
                    fit,
                });
            }
        }
        // SAFETY: the parameters match gdr_mq_worker(const desc*, u32, u32, u64); every
        // buffer it reaches is held in Resources until the kernel is known to have ended.
        unsafe { f.launch(&stream, launch, &args) }?;
        Ok(GpuWorkers {
            queues,
            link,
            resources: Some(Resources {
                _rx: rx_mem,
                _tx: tx_mem,
                _status: status_mem,
                _descs: descs,
                _states: states,
                _scratch: scratch,
                _staging: staging,
                _module: module,
            }),
            ended: false,
        })
    }

    /// The queue pairs, queue `i` at index `i` (the worker blocks `i * blocks_per_queue ..`
    /// serve it).
    pub fn queues(&self) -> &[QueuePair] {
        &self.queues
    }

    /// The queue pairs, mutably (to drive several from their own threads).
    pub fn queues_mut(&mut self) -> &mut [QueuePair] {
        &mut self.queues
    }

    /// Queue pair `i`.
    ///
    /// # Panics
    /// When `i` is not below [`GpuConfig::queues`].
    pub fn queue(&mut self, i: usize) -> &mut QueuePair {
        &mut self.queues[i]
    }

    /// Ok(true) while the kernel runs, Ok(false) once it has ended, Err with its CUDA error if
    /// it failed.
    pub fn running(&self) -> Result<bool, MqError> {
        self.link.poll().map_err(|cause| MqError::WorkerFailed {
            queue: 0,
            cause,
            in_flight: Default::default(),
        })
    }

    /// Asks every worker to stop and waits (at most `timeout`) for the kernel to end; then
    /// reports why each queue's workers left and its counters.
    ///
    /// # Errors
    /// [`MqError::Timeout`] when the kernel still runs after `timeout` (a handler that never
    /// returns; dropping the set then leaks its memory rather than free it under the kernel),
    /// [`MqError::WorkerFailed`] when the kernel failed.
    pub fn stop(&mut self, timeout: Duration) -> Result<Vec<QueueOutcome>, MqError> {
        for q in &self.queues {
            q.request_stop();
        }
        let start = Instant::now();
        loop {
            match self.link.poll() {
                Ok(false) => break,
                Ok(true) if start.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                Ok(true) => {
                    let q = &self.queues[0];
                    return Err(MqError::Timeout {
                        what: "the worker kernel to stop (a handler that never returns?)",
                        waited: start.elapsed(),
                        in_flight: q.in_flight_report(),
                    });
                }
                Err(cause) => {
                    // The kernel is gone (with its context): nothing runs on our memory now.
                    self.ended = true;
                    return Err(MqError::WorkerFailed {
                        queue: 0,
                        cause,
                        in_flight: self.queues[0].in_flight_report(),
                    });
                }
            }
        }
        self.ended = true;
        Ok(self
            .queues
            .iter()
            .map(|q| QueueOutcome {
                reason: match q.health() {
                    Err(MqError::WorkerExited { reason, .. }) => reason,
                    _ => ExitReason::Unknown { state: 0 },
                },
                stats: q.stats(),
            })
            .collect())
    }
}

impl Drop for GpuWorkers {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.stop(Duration::from_secs(5));
        }
        if !self.ended {
            // Still running: freeing now would block in the driver and pull memory from under
            // the kernel. Leak it; the driver reclaims it with the process.
            std::mem::forget(self.resources.take());
            std::mem::forget(std::mem::take(&mut self.queues));
        }
    }
}

/// Number of SMs, for sizing worker sets.
pub fn sm_count(ctx: &Context) -> Result<u32, MqError> {
    Ok(ctx.device().attribute(Attribute::MultiprocessorCount)? as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A per-lane handler's program carries the library's worker (which calls `handle`); an
    /// application kernel's carries the header and its own source only.
    #[test]
    fn only_a_per_lane_handler_brings_the_library_worker() {
        let lane = Handler::echo();
        assert_eq!(lane.kernel(), WORKER_KERNEL);
        let p = lane.program();
        assert!(p.starts_with(DEVICE_HEADER));
        assert!(p.contains("#line 1 \"gdr-mq/worker.cu\"\n") && p.ends_with(WORKER_SOURCE));
        let src = "extern \"C\" __global__ void app_worker() {}\n";
        let app = Handler::new("app", src).with_kernel("app_worker");
        assert_eq!(app.kernel(), "app_worker");
        let p = app.program_for(true);
        assert!(p.starts_with("#define GDR_MQ_RX_FORMAT_ONLY 1\n"));
        assert!(p.contains(DEVICE_HEADER) && p.contains(src));
        assert!(!p.contains("gdr-mq/worker.cu") && !p.contains("void gdr_mq_worker("));
    }
}
