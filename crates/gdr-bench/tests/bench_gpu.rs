//! gdr-bench's GPU paths: the host-centric baseline and a short `gdr mq bench` on a real GPU,
//! and the ping-pong source compiled with NVRTC. Skips without a GPU (or NVRTC), fails instead
//! under GDR_REQUIRE_GPU=1. The GPU tests take a process-wide lock: a persistent kernel of one
//! test must not run while another test frees memory (that would wait on it).

use gdr::cuda::{nvrtc, Context};
use gdr_bench::host_centric::HostCentric;
use gdr_mq::{Handler, MqError, Placement};
use gdr_testing::{gpu_context, skip_or_fail};
use rand::RngCore;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

#[path = "../../gdr-mq/tests/mq_common/mod.rs"]
mod mq_common;
use mq_common::{transform, TRANSFORM};

static GPU: Mutex<()> = Mutex::new(());

fn gpu(name: &str) -> Option<(Context, MutexGuard<'static, ()>)> {
    let guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    Some((gpu_context(name)?, guard))
}

#[test]
fn host_centric_baseline_runs_the_same_handler() {
    let name = "host_centric_baseline_runs_the_same_handler";
    let Some((ctx, _g)) = gpu(name) else { return };
    let mut h = HostCentric::new(&ctx, &Handler::new("transform", TRANSFORM), 256).unwrap();
    let mut buf = vec![0u8; 256];
    for len in [0usize, 1, 64, 255, 256] {
        let mut m = vec![0u8; len];
        rand::thread_rng().fill_bytes(&mut m);
        let n = h.round_trip(&m, &mut buf).unwrap();
        assert!(buf[..n] == transform(&m)[..], "len {len}");
        buf.fill(0);
        let n = h.round_trip_graph(&m, &mut buf).unwrap();
        assert!(buf[..n] == transform(&m)[..], "graph len {len}");
    }
    assert!(matches!(
        h.round_trip(&[0u8; 257], &mut buf),
        Err(MqError::Oversize { .. })
    ));
}

#[test]
fn quick_bench_meets_its_own_sanity() {
    let name = "quick_bench_meets_its_own_sanity";
    let Some((ctx, _g)) = gpu(name) else { return };
    let mut bc = gdr_bench::mq::BenchConfig::quick();
    bc.latency_iters = 500;
    bc.sizes = vec![64];
    bc.queues = vec![1];
    bc.duration = Duration::from_millis(100);
    let r = match gdr_bench::mq::run(&ctx, &bc) {
        Ok(r) => r,
        Err(MqError::Bar(e)) => {
            skip_or_fail::<()>(name, &e.to_string());
            return;
        }
        Err(e) => panic!("{e}"),
    };
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r.latency.len(), 2 * Placement::ALL.len() + 2);
    assert!(r.latency.iter().any(|l| l.path == "rx-gpu/tx-host words"));
    assert!(r
        .latency
        .iter()
        .all(|l| l.p50_us > 0.0 && l.p50_us <= l.p99_us));
    assert!(r.throughput.iter().all(|t| t.messages > 0));
}

#[test]
fn pingpong_source_compiles_for_sm_90() {
    let name = "pingpong_source_compiles_for_sm_90";
    if let Err(e) = nvrtc::version() {
        skip_or_fail::<()>(name, &e.to_string());
        return;
    }
    match nvrtc::compile("pingpong.cu", gdr_bench::pingpong::SOURCE, "90") {
        Ok(cubin) => assert!(
            cubin.starts_with(b"\x7fELF"),
            "pingpong.cu: not an ELF cubin"
        ),
        Err(e) => panic!("pingpong.cu: {e}"),
    }
}
