//! The GPU backends: persistent workers behind `gdr_mq` queues (one queue set per GPU, one
//! queue per network thread), and the host-centric baseline (copy in, launch, copy out,
//! synchronise, per request, over several streams).

use crate::apps::App;
use crate::exec::{Answer, AppFailure, Executor};
use crate::ServeError;
use gdr::cuda::{Context, KernelArgs, LaunchConfig, Module};
use gdr_mq::HostCentricSlot;
use gdr_mq::{GpuConfig, GpuWorkers, Placement, QueueConfig};
use std::time::Duration;

/// Shape of the GPU side.
#[derive(Clone, Debug)]
pub struct GpuShape {
    /// Slots per queue (power of two).
    pub slots: u32,
    /// Where each queue's RX and TX rings live (GPU memory behind BAR1, or host memory);
    /// the default, `Placement::LYNX`, puts the RX ring in GPU memory, which the network
    /// thread writes through BAR1, and the TX ring in host memory, which it polls.
    pub placement: Placement,
    /// Threads of one worker block = warps * 32 (a power of two up to 16 warps). 0: the
    /// app's default for the worker's cluster size ([`App::default_warps_for`]: 1 for a light
    /// app, 8 for a cluster worker, else 16).
    pub warps: u32,
    /// Blocks (SMs) per queue.
    pub blocks_per_queue: u32,
    /// Keep the app's resident data (lenet's FC weights) in each worker block's shared memory
    /// where the GPU has room for it; off: the workers read it from global memory.
    pub resident: bool,
    /// Workers time their stages (`clock64`, a little slower; [`worker_stages`]).
    pub profile: bool,
    /// RX slots in mq's word format (every word carries its seq; the worker's warp polls
    /// the slot itself, no doorbell): one block per queue only.
    pub rx_words: bool,
    /// Blocks of the thread-block cluster that serves each queue (1: one block; 2, 4 or 8:
    /// an app with a cluster form runs each request over that many SMs, Hopper and later,
    /// with its resident data split between them; replaces `blocks_per_queue`). 0: the
    /// default, [`auto_cluster`]: 8 where the app, the shape and the GPU allow it (4, then 1,
    /// when 8 do not fit at once), else 1.
    pub cluster: u32,
}

impl Default for GpuShape {
    fn default() -> Self {
        GpuShape {
            slots: 1024,
            placement: Placement::LYNX,
            warps: 0,
            blocks_per_queue: 1,
            resident: true,
            profile: false,
            rx_words: false,
            cluster: 0,
        }
    }
}

/// Static shared memory of a kernel is at most 48 KiB: the worker's, whatever the app.
const STATIC_SMEM_MAX: u32 = 48 * 1024;

/// Dynamic shared memory the workers of `app` get on `ctx`'s GPU: room for the app's resident
/// data when it has some, `shape.resident` asks for it, and a block may have that much on top
/// of the worker's static shared memory; else 0 (the app then reads the global copy).
pub fn resident_shared_mem(ctx: &Context, app: &App, shape: &GpuShape) -> Result<u32, ServeError> {
    let want = app.resident_bytes();
    if !shape.resident || want == 0 {
        return Ok(0);
    }
    let optin = ctx
        .device()
        .attribute(gdr::cuda::Attribute::MaxSharedMemoryPerBlockOptin)?;
    let optin = u32::try_from(optin).unwrap_or(0);
    Ok(if want + STATIC_SMEM_MAX <= optin {
        want
    } else {
        0
    })
}

/// Warps of `shape`'s worker blocks: [`GpuShape::warps`], or for 0 the app's default for the
/// shape's cluster size (1 where `cluster` is still 0, undecided: the one-block default).
pub(crate) fn block_warps(app: &App, shape: &GpuShape) -> u32 {
    if shape.warps != 0 {
        shape.warps
    } else {
        app.default_warps_for(shape.cluster.max(1))
    }
}

/// Why `shape.cluster` cannot be had with this app, the rest of the shape and the GPU; None
/// when it can (or is 1, no cluster).
fn cluster_refusal(
    ctx: &Context,
    app: &App,
    shape: &GpuShape,
) -> Result<Option<String>, ServeError> {
    let c = shape.cluster;
    if c <= 1 {
        return Ok(None);
    }
    Ok(if ![2, 4, 8].contains(&c) {
        Some(format!("a cluster of {c} blocks: use 2, 4 or 8"))
    } else if !app.has_cluster_form() {
        Some(format!(
            "app {} has no cluster form (only lenet has)",
            app.name()
        ))
    } else if app.work() != 1 {
        Some("a cluster runs each request once: not with --work".into())
    } else if shape.blocks_per_queue != 1 {
        Some("a cluster replaces blocks per queue: give one or the other".into())
    } else if block_warps(app, shape) < 2 {
        Some("a cluster's blocks need app warps besides warp 0 (at least 2 warps)".into())
    } else if app.slot_payload() > 1024 {
        Some(format!(
            "a cluster hands requests of up to 1024 bytes to its blocks; this app's are {}",
            app.slot_payload()
        ))
    } else if resident_shared_mem(ctx, app, shape)? == 0 {
        Some(
            "a cluster keeps the app's resident data in shared memory: not with --no-resident, \
             nor on a GPU without room for it"
                .into(),
        )
    } else {
        let (major, _) = ctx.device().compute_capability()?;
        (major < 9).then(|| {
            format!("thread-block clusters need compute capability 9.0 or later, this GPU has {major}.x")
        })
    })
}

/// The cluster sizes [`GpuShape::cluster`] 0 tries, in order: 8 blocks a request where the
/// app has a cluster form and the rest of the shape and the GPU allow one, then 4 (when the
/// GPU cannot hold that many clusters of 8 at once), then 1. The order is that of LeNet's
/// server-side latency, lowest over 8 SMs, then 4, then one (docs/serve.md, "Clusters", says
/// why).
pub fn auto_cluster(ctx: &Context, app: &App, shape: &GpuShape) -> Result<Vec<u32>, ServeError> {
    let mut sizes = Vec::new();
    for c in [8, 4] {
        let s = GpuShape {
            cluster: c,
            ..shape.clone()
        };
        if cluster_refusal(ctx, app, &s)?.is_none() {
            sizes.push(c);
        }
    }
    sizes.push(1);
    Ok(sizes)
}

/// Launches the persistent workers of `app` on `ctx`: `queues` queue pairs (with
/// [`GpuShape::cluster`] 0, in the first of [`auto_cluster`]'s sizes whose clusters all fit
/// on the GPU at once).
pub fn launch_workers(
    ctx: &Context,
    app: &App,
    queues: u32,
    shape: &GpuShape,
) -> Result<GpuWorkers, ServeError> {
    if shape.cluster != 0 {
        return launch_shape(ctx, app, queues, shape);
    }
    let mut sizes = auto_cluster(ctx, app, shape)?.into_iter().peekable();
    loop {
        let c = sizes.next().expect("auto_cluster ends with 1");
        let s = GpuShape {
            cluster: c,
            ..shape.clone()
        };
        match launch_shape(ctx, app, queues, &s) {
            Err(ServeError::Mq(e @ gdr_mq::MqError::ClustersDoNotFit { .. }))
                if sizes.peek().is_some() =>
            {
                eprintln!("gdr serve: {e}; trying a smaller cluster");
            }
            r => return r,
        }
    }
}

/// The queues of workers of this shape (its cluster size resolved).
fn queue_config(app: &App, shape: &GpuShape) -> QueueConfig {
    QueueConfig {
        slots: shape.slots,
        max_msg: app.slot_payload() as u32,
        placement: shape.placement,
        wait_timeout: Duration::from_secs(5),
        first_index: 0,
        rx_words: shape.rx_words,
        // A cluster's header-format requests are published by their slot's seq: its receiving
        // warp finds a lone one by its header and hands it to the cluster at once (kernels.cu).
        // Not for one-block workers: the cluster's gain is the hand-over to its other blocks
        // started early, and a one-block worker, with no such hand-over, gains less than the
        // store fence more a batch costs (docs/mq.md, "Slots their seq publishes").
        seq_publishes: shape.cluster > 1,
    }
}

/// [`launch_workers`] for one cluster size.
fn launch_shape(
    ctx: &Context,
    app: &App,
    queues: u32,
    shape: &GpuShape,
) -> Result<GpuWorkers, ServeError> {
    // The kernels are compiled for this block size (GDR_SERVE_MAX_THREADS), at most 512.
    let warps = block_warps(app, shape);
    if !warps.is_power_of_two() || warps > 16 {
        return Err(ServeError::Config(format!(
            "warps per block must be a power of two up to 16, got {warps}"
        )));
    }
    if let Some(why) = cluster_refusal(ctx, app, shape)? {
        return Err(ServeError::Config(why));
    }
    let clustered = shape.cluster > 1;
    let cfg = GpuConfig {
        queue: queue_config(app, shape),
        queues,
        blocks_per_queue: if clustered {
            shape.cluster
        } else {
            shape.blocks_per_queue
        },
        warps_per_block: warps,
        // A server stays up through idle hours; it stops the workers itself.
        idle_timeout: Duration::from_secs(7 * 24 * 3600),
        profile: shape.profile,
        shared_mem: resident_shared_mem(ctx, app, shape)?,
        // kernels.cu: warp 0 of each block receives and sends for the block.
        receiving_warps: 1,
        // A cluster's first block receives for all of them.
        receiving_blocks: if clustered { 1 } else { 0 },
    };
    let handler = app.worker_handler(shape.rx_words, shape.profile, shape.cluster, warps);
    let workers = GpuWorkers::launch(ctx, &handler, &cfg)?;
    if clustered {
        eprintln!(
            "gdr serve: {} runs each request over a cluster of {} SMs ({warps} warps a block)",
            app.name(),
            shape.cluster
        );
    }
    Ok(workers)
}

/// Where a GPU-queue worker's time goes, mean per batch (warp 0 of the queue's block, from
/// `clock64` at its stage boundaries; [`GpuShape::profile`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WorkerStages {
    /// Which queue: `LABEL/qN`, the label given to [`worker_stages`] and the queue's index.
    pub queue: String,
    /// Batches the worker received on that queue (the means are over these).
    pub batches: u64,
    /// Requests claimed -> in hand (header and first bytes read).
    pub recv_ns: f64,
    /// -> the app warps have them (shared-memory hand-over and block barrier).
    pub handoff_ns: f64,
    /// -> the app warps are done (the app and the block barrier after it).
    pub app_ns: f64,
    /// -> the responses' TX stores issued.
    pub send_ns: f64,
}

/// The stage times of every queue of `workers` (all zero unless they were launched with
/// [`GpuShape::profile`]). kernels.cu's mq loop ends stage 0 (recv) in its receive; stages 1
/// (hand-over) and 3 (app) end on the first app warp's clock when it has the batch and when
/// its share is done; `gdr_mq_send` ends 2 (the second block barrier and the TX stores).
pub fn worker_stages(
    ctx: &Context,
    label: &str,
    workers: &GpuWorkers,
) -> Result<Vec<WorkerStages>, ServeError> {
    let khz = ctx
        .device()
        .attribute(gdr::cuda::Attribute::ClockRateKhz)?
        .max(1) as f64;
    Ok(workers
        .queues()
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let (c, batches) = q.worker_profile();
            let per = |k: usize| c[k] as f64 / batches.max(1) as f64 / khz * 1e6;
            WorkerStages {
                queue: format!("{label}/q{i}"),
                batches,
                recv_ns: per(0),
                handoff_ns: per(1),
                app_ns: per(3),
                send_ns: per(2),
            }
        })
        .collect())
}

/// The host-centric baseline as an executor: every request is copied in, the app kernel is
/// launched (one block, the same block size and app code as the GPU-queue workers), the
/// answer copied out, and the stream waited on; `streams` requests may be in flight at once,
/// each on its own [`HostCentricSlot`] (gdr-mq's copy-in / launch / copy-out core).
pub struct HostCentricExec {
    ctx: Context,
    module: Module,
    slots: Vec<HostCentricSlot>,
    head: usize,
    busy: usize,
    threads: u32,
    label: String,
}

// SAFETY: every CUDA handle in here (context, module, streams, buffers) may be used from any
// thread once the context is bound, which every method does first.
unsafe impl Send for HostCentricExec {}

impl HostCentricExec {
    /// Loads `app`'s module on `ctx`, makes `streams` (at least 1) request slots, each a
    /// stream with device and pinned host buffers for the app's largest request and response,
    /// and runs the app's one-time setup (`gdr_serve_init`: LeNet's weights) with blocks of
    /// `warps` warps, the block size every request is then launched with. `label` names the
    /// executor in reports.
    pub fn new(
        ctx: &Context,
        app: &App,
        streams: usize,
        warps: u32,
        label: String,
    ) -> Result<Self, ServeError> {
        ctx.bind()?;
        let module = app.handler().load(ctx)?;
        let req_cap = app.max_request().next_multiple_of(16).max(16);
        let resp_cap = app.max_response().next_multiple_of(16).max(16);
        let mut slots = Vec::new();
        for _ in 0..streams.max(1) {
            slots.push(HostCentricSlot::new(ctx, req_cap, resp_cap)?);
        }
        // One-time app setup (LeNet weights) in this module.
        let init = module.function("gdr_serve_init")?;
        // SAFETY: gdr_serve_init takes no parameters.
        unsafe {
            init.launch(
                slots[0].stream(),
                LaunchConfig::linear(1, warps * 32),
                &KernelArgs::new(),
            )?
        };
        slots[0].stream().synchronize()?;
        Ok(HostCentricExec {
            ctx: ctx.clone(),
            module,
            slots,
            head: 0,
            busy: 0,
            threads: warps * 32,
            label,
        })
    }

    fn enqueue(&mut self, i: usize, payload: &[u8]) -> Result<(), ServeError> {
        let s = &mut self.slots[i];
        s.load(payload);
        let f = self.module.function("gdr_serve_oneshot")?;
        // SAFETY: gdr_serve_oneshot takes (const u8*, u32, u8*, u32, u32*); the slot's pinned
        // buffers are not touched again until its stream has been seen idle (poll), and are
        // kept alive by self until drop, which synchronises each stream first.
        unsafe { s.enqueue(s.stream(), &f, self.threads, payload.len())? };
        Ok(())
    }
}

impl Executor for HostCentricExec {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn room(&self) -> usize {
        self.slots.len() - self.busy
    }

    fn submit(&mut self, payloads: &[&[u8]]) -> Result<usize, ServeError> {
        self.ctx.bind()?;
        let mut n = 0;
        for p in payloads {
            if self.busy == self.slots.len() {
                break;
            }
            let i = (self.head + self.busy) % self.slots.len();
            self.enqueue(i, p)?;
            self.busy += 1;
            n += 1;
        }
        Ok(n)
    }

    fn poll(&mut self, max: usize, done: &mut dyn FnMut(Answer<'_>)) -> Result<usize, ServeError> {
        if self.busy == 0 {
            return Ok(0);
        }
        self.ctx.bind()?;
        let mut n = 0;
        while n < max && self.busy > 0 {
            let s = &self.slots[self.head];
            if !s.stream().query()? {
                break;
            }
            match s.response() {
                Ok(resp) => done(Ok(resp)),
                Err(_) => done(Err(AppFailure)),
            }
            self.head = (self.head + 1) % self.slots.len();
            self.busy -= 1;
            n += 1;
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.busy
    }
}

impl Drop for HostCentricExec {
    fn drop(&mut self) {
        // The copies target our pinned buffers: let them finish before the buffers go.
        if self.ctx.bind().is_ok() {
            for s in &self.slots {
                let _ = s.stream().synchronize();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cluster_queues_are_published_by_their_seq() {
        let app = App::builtin("lenet", 1, 1024).unwrap();
        for (cluster, want) in [(1, false), (2, true), (4, true), (8, true)] {
            let shape = GpuShape {
                cluster,
                ..Default::default()
            };
            let q = queue_config(&app, &shape);
            assert_eq!(q.seq_publishes, want, "cluster {cluster}");
            assert_eq!(
                q.geometry().unwrap().seq_publishes,
                want,
                "cluster {cluster}"
            );
            assert_eq!(q.max_msg as usize, app.slot_payload());
        }
        // The word format publishes every word itself: the option does not apply.
        let words = GpuShape {
            cluster: 8,
            rx_words: true,
            ..Default::default()
        };
        let g = queue_config(&app, &words).geometry().unwrap();
        assert!(g.rx_words && !g.seq_publishes);
    }
}
