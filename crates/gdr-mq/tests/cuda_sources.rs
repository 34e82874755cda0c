//! Every CUDA C source in the crate compiles with NVRTC for Hopper (sm_90). Needs NVRTC but no
//! GPU: on a machine without NVRTC it prints `skipped` (and fails under GDR_REQUIRE_GPU=1).
//! `GDR_NVRTC` may point at a libnvrtc.so, e.g. from pip's nvidia-cuda-nvrtc wheel.

use gdr::cuda::nvrtc;
use gdr_testing::skip_or_fail;

/// An application kernel as the device header's opening comment shows it (the hook of
/// `Handler::with_kernel`): it receives and answers through the header's calls and defines no
/// `handle`, which its program must then not need.
const APP_KERNEL: &str = r#"
extern "C" __global__ void app_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
                                      gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * (blockDim.x / 32u)
                         + threadIdx.x / 32u;
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, descs[q], warp);
    gdr_u32 err = 0, arg = 0, reason;
    for (;;) {
        gdr_mq_batch b;
        reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
        if (reason) break;
        gdr_u32 len = 0;
        if (w.lane < b.n) {
            len = b.req_len < w.q.max_msg ? b.req_len : w.q.max_msg;
            for (gdr_u32 i = 0; i < len; i++) w.resp_scratch[i] = b.req[i] ^ 0x5a;
        }
        gdr_mq_send(w, b, w.resp_scratch, len);
    }
    gdr_mq_worker_exit(w, reason, err, arg);
}
"#;

#[test]
fn every_kernel_source_compiles_for_sm_90() {
    if let Err(e) = nvrtc::version() {
        skip_or_fail::<()>("every_kernel_source_compiles_for_sm_90", &e.to_string());
        return;
    }
    let sources = [
        ("mq device header", gdr_mq::DEVICE_HEADER.to_string()),
        (
            "mq application kernel",
            gdr_mq::Handler::new("app_kernel", APP_KERNEL)
                .with_kernel("app_worker")
                .program(),
        ),
        ("mq echo worker", gdr_mq::Handler::echo().program()),
        (
            "mq echo worker, header RX only",
            gdr_mq::Handler::echo().program_for(false),
        ),
        (
            "mq echo worker, word RX only",
            gdr_mq::Handler::echo().program_for(true),
        ),
    ];
    for (name, src) in sources {
        match nvrtc::compile(name, &src, "90") {
            Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "{name}: not an ELF cubin"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

#[test]
fn a_broken_source_reports_its_log() {
    if nvrtc::version().is_err() {
        return; // reported by the test above
    }
    let err = nvrtc::compile(
        "broken.cu",
        "__global__ void k() { undefined_thing(); }",
        "90",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("broken.cu") && err.contains("undefined_thing"),
        "{err}"
    );
}
