//! The LeNet app run directly in one block (no queues, no network), for two things: its
//! answers must match the CPU reference (with the FC weights resident in shared memory, as in
//! the persistent worker, and read from global memory, as in the host-centric kernel), and it
//! prints where the block's time goes, phase by phase (clock64 at each of the app's barriers,
//! `GDR_SERVE_MARK` in lenet.cuh). The printout is a diagnostic, not a benchmark: the
//! server-side figures come from `gdr load` against `gdr serve` (scripts/serve-bench.sh).

use gdr::cuda::{
    memcpy_dtoh, memcpy_htod, synchronize_legacy_stream, DeviceBuffer, DeviceMemory, KernelArgs,
    LaunchConfig, Stream,
};
use gdr_serve::apps::CLUSTER_WARPS;
use gdr_serve::lenet;
use gdr_serve::App;
use gdr_testing::gpu_context;

/// Timed requests per configuration (after one warm-up).
const REPS: u32 = 300;
/// u64 marks per request: GDR_SERVE_MARK 0..=6 in the app, 15 after the block's barrier.
const MARKS: usize = 16;
const PHASES: [(&str, usize, usize); 7] = [
    ("image in", 0, 1),
    ("conv1", 1, 2),
    ("conv2", 2, 3),
    ("fc1", 3, 4),
    ("fc2", 4, 5),
    ("fc3", 5, 6),
    ("app total", 0, 6),
];

/// The harness kernel: the worker's block setup (shared constants, resident FC weights when
/// the launch has the dynamic shared memory), then `reps` + 1 requests through the app inlined
/// as in the worker's app warps (`gdr_serve_app_on`), each followed by a block barrier.
const HARNESS: &str = r#"
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS)
    gdr_lenet_phases(const unsigned char *req, unsigned char *resp, gdr_u64 *marks,
                     gdr_u32 reps) {
    __shared__ __align__(16) float smem[GDR_SERVE_GROUP_FLOATS];
    __shared__ __align__(16) float consts[GDR_SERVE_CONST_FLOATS];
    gdr_serve_block_consts(consts);
    gdr_serve_block_resident();
    const float *resident = gdr_serve_resident_at();
    gdr_u64 t0 = 0, c0 = 0;
    for (gdr_u32 r = 0; r <= reps; r++) {
        if (r == 1 && threadIdx.x == 0) {
            t0 = gdr_globaltimer_ns();
            c0 = clock64();
        }
        gdr_serve_mark_out = marks + 16u * r;
        __syncthreads();
        gdr_serve_app_on(threadIdx.x, blockDim.x, 1u, smem, consts, resident, req, 784u, resp,
                         48u);
        __syncthreads();
        if (threadIdx.x == 0) marks[16u * r + 15u] = clock64();
    }
    if (threadIdx.x == 0) {
        marks[16u * (reps + 1u)] = gdr_globaltimer_ns() - t0;
        marks[16u * (reps + 1u) + 1u] = clock64() - c0;
    }
}
"#;

const PREFIX: &str = "__device__ gdr_u64 *gdr_serve_mark_out;\n\
#define GDR_SERVE_MARK(k) do { if (g.rank == 0u) gdr_serve_mark_out[k] = clock64(); } while (0)\n";

/// Compiles a harness program (`src`), runs the app's one-time init (lenet's weights into
/// global memory) and lets `kernel` have the resident data's dynamic shared memory.
fn load_harness(
    ctx: &gdr::cuda::Context,
    name: &str,
    src: &str,
    kernel: &str,
) -> (gdr::cuda::Module, Stream) {
    // The harness kernel is an application kernel of its own: the program is mq's header and
    // `src`, with no per-lane `handle` (none is defined).
    let module = gdr_mq::Handler::new(name, src)
        .with_kernel(kernel)
        .load(ctx)
        .expect("harness compiles");
    let stream = Stream::new(ctx).unwrap();
    let init = module.function("gdr_serve_init").unwrap();
    // SAFETY: gdr_serve_init takes no parameters.
    unsafe {
        init.launch(&stream, LaunchConfig::linear(1, 512), &KernelArgs::new())
            .unwrap()
    };
    stream.synchronize().unwrap();
    module
        .function(kernel)
        .unwrap()
        .set_max_dynamic_shared((lenet::RESIDENT_FLOATS * 4) as u32)
        .unwrap();
    (module, stream)
}

/// Runs a phase harness kernel (`f(req, resp, marks, reps)`, REPS requests after a warm-up) on
/// `img` over `grid` blocks of `threads` threads with `dyn_smem` bytes of dynamic shared memory,
/// checks its answer against `want` (`label` in the message) and returns the `nmarks` u64
/// marks it wrote.
#[allow(clippy::too_many_arguments)]
fn run_harness(
    ctx: &gdr::cuda::Context,
    stream: &Stream,
    f: &gdr::cuda::Function,
    grid: u32,
    threads: u32,
    dyn_smem: u32,
    img: &[u8],
    want: &[f32; 10],
    nmarks: usize,
    label: &str,
) -> Vec<u64> {
    let req = DeviceBuffer::new(ctx, 784).unwrap();
    memcpy_htod(&req, 0, img).unwrap();
    let resp = DeviceBuffer::new(ctx, 48).unwrap();
    memcpy_htod(&resp, 0, &[0xa5u8; 48]).unwrap(); // poisoned: NaN logits

    // Both copies landed before the kernel, which runs on a non-blocking stream.
    synchronize_legacy_stream().unwrap();
    let marks = DeviceBuffer::new(ctx, nmarks * 8).unwrap();
    let (rq, rs, mk, reps): (u64, u64, u64, u32) = (
        req.device_ptr(),
        resp.device_ptr(),
        marks.device_ptr(),
        REPS,
    );
    let args = KernelArgs::new().arg(&rq).arg(&rs).arg(&mk).arg(&reps);
    let cfg = LaunchConfig {
        shared_mem: dyn_smem,
        ..LaunchConfig::linear(grid, threads)
    };
    // SAFETY: both harness kernels take (const u8*, u8*, u64*, u32); the buffers outlive the
    // synchronize below. A cluster kernel's shape is compiled in (grid is a multiple of it).
    unsafe { f.launch(stream, cfg, &args).unwrap() };
    stream.synchronize().unwrap();
    let mut out = [0u8; 48];
    memcpy_dtoh(&mut out, &resp, 0).unwrap();
    let got = lenet::parse_logits(&out[..40]).unwrap();
    assert!(
        lenet::logits_match(&got, want, 1e-5),
        "{label}: {got:?} vs {want:?}"
    );
    let mut raw = vec![0u8; nmarks * 8];
    memcpy_dtoh(&mut raw, &marks, 0).unwrap();
    raw.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn lenet_in_one_block_matches_the_reference_and_shows_its_phases() {
    let Some(ctx) = gpu_context("lenet_in_one_block_matches_the_reference_and_shows_its_phases")
    else {
        return;
    };
    let app = App::lenet(7, 1).unwrap();
    let src = format!("{PREFIX}{}{HARNESS}", app.device_source());
    let (module, stream) = load_harness(&ctx, "lenet_phases", &src, "gdr_lenet_phases");
    let f = module.function("gdr_lenet_phases").unwrap();
    let resident_bytes = (lenet::RESIDENT_FLOATS * 4) as u32;

    let w = app.lenet_weights().unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    for (label, dyn_smem) in [
        ("FC weights in shared memory (worker)", resident_bytes),
        ("FC weights in global memory (host-centric)", 0),
    ] {
        let img = lenet::image(seed, dyn_smem as u64);
        let want = lenet::forward(w, &img);
        let nmarks = MARKS * (REPS as usize + 2);
        let m = run_harness(
            &ctx, &stream, &f, 1, 512, dyn_smem, &img, &want, nmarks, label,
        );
        let tail = MARKS * (REPS as usize + 1);
        let (ns, cycles) = (m[tail] as f64, m[tail + 1] as f64);
        let ghz = cycles / ns;
        println!(
            "lenet_phases: {label}: {REPS} requests, SM clock {ghz:.3} GHz, {:.2} us each",
            ns / REPS as f64 / 1e3
        );
        let mut phases: Vec<(&str, usize, usize)> = PHASES.to_vec();
        phases.push(("request (app + barrier)", usize::MAX, 15));
        for (name, a, b) in phases {
            let mut d: Vec<u64> = (1..=REPS as usize)
                .map(|r| {
                    let row = &m[MARKS * r..MARKS * (r + 1)];
                    let start = if a == usize::MAX {
                        m[MARKS * (r - 1) + 15]
                    } else {
                        row[a]
                    };
                    row[b].saturating_sub(start)
                })
                .collect();
            d.sort_unstable();
            let med = d[d.len() / 2];
            let p99 = d[d.len() * 99 / 100];
            println!(
                "lenet_phases:   {name:<24} p50 {med:>6} cycles {:>7.0} ns   p99 {:>7.0} ns",
                med as f64 / ghz,
                p99 as f64 / ghz
            );
        }
    }
}

/// Marks of the cluster harness, per request and block: GDR_SERVE_CL_MARK 0..=11 in the app,
/// 12 when the block's app warps start the request (after the cluster barrier).
const CL_PHASES: [(&str, usize); 11] = [
    ("mbarriers armed", 1),
    ("conv1 stored", 2),
    ("p1 complete", 3),
    ("conv2 sums", 4),
    ("p2 stored", 5),
    ("p2 complete", 6),
    ("fc1 stored", 7),
    ("f1 complete", 8),
    ("fc2 stored", 9),
    ("f2 complete (block 0)", 10),
    ("fc3 done (block 0)", 11),
];

/// The cluster form's harness: every block of one cluster copies the request into its
/// hand-over buffer (where the worker's push leaves it), the cluster meets at a barrier, and
/// the app warps run GDR_SERVE_APP_CLUSTER as the worker's app loop does; `reps` + 1 times.
const CL_HARNESS: &str = r#"
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS) GDR_SERVE_CLUSTER_DIMS
    gdr_lenet_cl_phases(const unsigned char *req, unsigned char *resp, gdr_u64 *marks,
                        gdr_u32 reps) {
    if (threadIdx.x == 0) {
        gdr_serve_wsh.cap = 784u;
        gdr_cl_mark_out = marks;
    }
    gdr_serve_block_consts(gdr_serve_wconsts);
    gdr_serve_block_resident();
    const unsigned int rank = gdr_cl_rank();
    gdr_serve_cl_start();
    unsigned int parity = 0;
    gdr_u64 t0 = 0, c0 = 0;
    for (gdr_u32 r = 0; r <= reps; r++) {
        for (unsigned int i = threadIdx.x; i < 49u; i += blockDim.x)
            ((uint4 *)(gdr_serve_cl_req + 16))[i] = ((const uint4 *)req)[i];
        if (threadIdx.x == 0) gdr_cl_mark_row = r;
        if (r == 1 && rank == 0u && threadIdx.x == 32) {
            t0 = gdr_globaltimer_ns();
            c0 = clock64();
        }
        // Every block starts together, and none is still reading what the next stores.
        gdr_cl_sync_all();
        if (threadIdx.x >= 32u) {
            const gdr_serve_cluster c = {rank, threadIdx.x - 32u, blockDim.x - 32u, 1u, parity,
                                         gdr_serve_cl_mbar + 2, gdr_serve_wsmem,
                                         gdr_serve_wconsts, gdr_serve_resident_at()};
            if (c.t == 0u) gdr_cl_mark_out[(r * GDR_SERVE_CLUSTER + rank) * 16u + 12u] = clock64();
            GDR_SERVE_APP_CLUSTER(c, gdr_serve_cl_req + 16, 784u, resp, 48u);
        }
        __syncthreads();
        parity ^= 1u;
    }
    if (rank == 0u && threadIdx.x == 32) {
        gdr_u64 *tail = marks + 16u * GDR_SERVE_CLUSTER * (reps + 1u);
        tail[0] = gdr_globaltimer_ns() - t0;
        tail[1] = clock64() - c0;
    }
    gdr_cl_sync_all();
}
"#;

const CL_PREFIX: &str = "__shared__ gdr_u64 *gdr_cl_mark_out;\n\
__shared__ unsigned int gdr_cl_mark_row;\n\
#define GDR_SERVE_CL_MARK(k) do { if (c.t == 0u) gdr_cl_mark_out[(gdr_cl_mark_row * GDR_SERVE_CLUSTER + c.rank) * 16u + (k)] = clock64(); } while (0)\n";

#[test]
fn lenet_over_a_cluster_in_one_launch_matches_the_reference_and_shows_its_phases() {
    let name = "lenet_over_a_cluster_in_one_launch_matches_the_reference_and_shows_its_phases";
    let Some(ctx) = gpu_context(name) else { return };
    let (major, _) = ctx.device().compute_capability().unwrap();
    if major < 9 {
        println!("skipped: no GPU with thread-block clusters: {name}");
        return;
    }
    let app = App::lenet(7, 1).unwrap();
    const C: usize = 8;
    let src = format!(
        "{CL_PREFIX}{}{CL_HARNESS}",
        app.device_source_for(false, false, C as u32, CLUSTER_WARPS)
    );
    let (module, stream) = load_harness(&ctx, "lenet_cl_phases", &src, "gdr_lenet_cl_phases");
    let f = module.function("gdr_lenet_cl_phases").unwrap();
    let resident_bytes = (lenet::RESIDENT_FLOATS * 4) as u32;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let img = lenet::image(seed, 3);
    let want = lenet::forward(app.lenet_weights().unwrap(), &img);
    let row = MARKS * C;
    let nmarks = row * (REPS as usize + 1) + 2;
    let m = run_harness(
        &ctx,
        &stream,
        &f,
        C as u32,
        CLUSTER_WARPS * 32,
        resident_bytes,
        &img,
        &want,
        nmarks,
        "cluster of 8",
    );
    let tail = row * (REPS as usize + 1);
    let ghz = m[tail + 1] as f64 / m[tail] as f64;
    println!(
        "lenet_cl_phases: cluster of {C}, {CLUSTER_WARPS} warps a block, {REPS} requests, SM \
         clock {ghz:.3} GHz, {:.2} us each (with a cluster barrier)",
        m[tail] as f64 / REPS as f64 / 1e3
    );
    // Each block's marks from its own start (clock64 is per SM): block 0's, and the latest
    // block's, p50 over the requests.
    let p50 = |mut d: Vec<u64>| {
        d.sort_unstable();
        d[d.len() / 2] as f64 / ghz
    };
    for (phase, k) in CL_PHASES {
        let since = |r: usize, b: usize| {
            let at = &m[row * r + MARKS * b..row * r + MARKS * (b + 1)];
            at[k].saturating_sub(at[12])
        };
        let block0 = p50((1..=REPS as usize).map(|r| since(r, 0)).collect());
        let latest = if k >= 10 {
            block0
        } else {
            p50((1..=REPS as usize)
                .map(|r| (0..C).map(|b| since(r, b)).max().unwrap())
                .collect())
        };
        println!("lenet_cl_phases:   {phase:<24} block 0 {block0:>7.0} ns   latest block {latest:>7.0} ns");
    }
}
