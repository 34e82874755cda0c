//! The LeNet app run directly in one block (no queues, no network), for two things: its
//! answers must match the CPU reference (with the FC weights resident in shared memory, as in
//! the persistent worker, and read from global memory, as in the host-centric kernel), and it
//! prints where the block's time goes, phase by phase (clock64 at each of the app's barriers,
//! `GDR_SERVE_MARK` in lenet.cuh). The printout is a diagnostic, not a benchmark: the
//! server-side figures come from `gdr load` against `gdr serve` (scripts/serve-bench.sh).

use gdr::cuda::{memcpy_dtoh, memcpy_htod, DeviceBuffer, DeviceMemory, LaunchConfig, Stream};
use gdr_serve::{lenet, App};
use gdr_testing::gpu_context;
use std::ffi::c_void;

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

#[test]
fn lenet_in_one_block_matches_the_reference_and_shows_its_phases() {
    let Some(ctx) = gpu_context("lenet_in_one_block_matches_the_reference_and_shows_its_phases")
    else {
        return;
    };
    let app = App::lenet(7, 1).unwrap();
    let src = format!("{PREFIX}{}{HARNESS}", app.device_source());
    let module = gdr::mq::Handler::new("lenet_phases", &src)
        .load(&ctx)
        .expect("harness compiles");
    let stream = Stream::new(&ctx).unwrap();
    let init = module.function("gdr_serve_init").unwrap();
    // SAFETY: gdr_serve_init takes no parameters.
    unsafe {
        init.launch(&stream, LaunchConfig::linear(1, 512), &mut [])
            .unwrap()
    };
    stream.synchronize().unwrap();
    let f = module.function("gdr_lenet_phases").unwrap();
    let resident_bytes = (lenet::RESIDENT_FLOATS * 4) as u32;
    f.set_max_dynamic_shared(resident_bytes).unwrap();

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
        let req = DeviceBuffer::new(&ctx, 784).unwrap();
        memcpy_htod(&req, 0, &img).unwrap();
        let resp = DeviceBuffer::new(&ctx, 48).unwrap();
        memcpy_htod(&resp, 0, &[0xa5u8; 48]).unwrap(); // poisoned: NaN logits
        let nmarks = MARKS * (REPS as usize + 2);
        let marks = DeviceBuffer::new(&ctx, nmarks * 8).unwrap();
        let (mut rq, mut rs, mut mk, mut reps) = (
            req.device_ptr(),
            resp.device_ptr(),
            marks.device_ptr(),
            REPS,
        );
        let mut params = [
            &mut rq as *mut u64 as *mut c_void,
            &mut rs as *mut u64 as *mut c_void,
            &mut mk as *mut u64 as *mut c_void,
            &mut reps as *mut u32 as *mut c_void,
        ];
        let cfg = LaunchConfig {
            shared_mem: dyn_smem,
            ..LaunchConfig::linear(1, 512)
        };
        // SAFETY: parameters match gdr_lenet_phases(const u8*, u8*, u64*, u32); the buffers
        // outlive the synchronize below.
        unsafe { f.launch(&stream, cfg, &mut params).unwrap() };
        stream.synchronize().unwrap();
        let mut out = [0u8; 48];
        memcpy_dtoh(&mut out, &resp, 0).unwrap();
        let got = lenet::parse_logits(&out[..40]).unwrap();
        assert!(
            lenet::logits_match(&got, &want, 1e-5),
            "{label}: {got:?} vs {want:?}"
        );
        let mut raw = vec![0u8; nmarks * 8];
        memcpy_dtoh(&mut raw, &marks, 0).unwrap();
        let m: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
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
