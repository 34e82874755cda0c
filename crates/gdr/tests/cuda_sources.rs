//! Every CUDA C source in the crate compiles with NVRTC for Hopper (sm_90). Needs NVRTC but no
//! GPU: on a machine without NVRTC it prints `skipped` (and fails under GDR_REQUIRE_GPU=1).
//! `GDR_NVRTC` may point at a libnvrtc.so, e.g. from pip's nvidia-cuda-nvrtc wheel.

use gdr::cuda::nvrtc;
use gdr_testing::skip_or_fail;

#[test]
fn every_kernel_source_compiles_for_sm_90() {
    if let Err(e) = nvrtc::version() {
        skip_or_fail::<()>("every_kernel_source_compiles_for_sm_90", &e.to_string());
        return;
    }
    let sources = [
        ("mq device header", gdr::mq::DEVICE_HEADER.to_string()),
        ("mq echo worker", gdr::mq::Handler::echo().program()),
        (
            "mq echo worker, header RX only",
            gdr::mq::Handler::echo().program_for(false),
        ),
        (
            "mq echo worker, word RX only",
            gdr::mq::Handler::echo().program_for(true),
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
