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

/// The Vulkan backend on `ctx`, or a skip (a failure under GDR_REQUIRE_GPU=1) naming why not.
fn backend(name: &str, ctx: &Context) -> Option<gdr::bar::VulkanBackend> {
    match gdr::bar::VulkanBackend::new(ctx) {
        Ok(be) => Some(be),
        Err(e) => skip_or_fail(name, &e.to_string()),
    }
}

#[test]
fn every_gpu_loop_answers_every_round_and_the_floor_is_timed() {
    use gdr_bench::pingpong::{bar_read_round_trip, ping_pong, GpuLoop, PingPongPlacement};
    let name = "every_gpu_loop_answers_every_round_and_the_floor_is_timed";
    let Some((ctx, _g)) = gpu(name) else { return };
    let Some(be) = backend(name, &ctx) else {
        return;
    };
    let loops = [
        GpuLoop::LEAN,
        GpuLoop::TIMER_EACH_POLL_FENCED,
        // Out-of-range knobs are clamped: a timer read every poll, one poller, one load; 32
        // pollers; 8 loads a poll.
        GpuLoop {
            timer_every: 0,
            fence: false,
            pollers: 0,
            loads: 0,
            blocks: true,
        },
        GpuLoop {
            loads: 4,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
        GpuLoop {
            loads: 100,
            ..GpuLoop::LEAN
        },
        GpuLoop {
            pollers: 4,
            ..GpuLoop::LEAN
        },
        GpuLoop {
            pollers: 64,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
        // Pollers in separate blocks, each with its own flag and answer: every copy of the flag
        // written, every round answered.
        GpuLoop {
            pollers: 4,
            blocks: true,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
        GpuLoop {
            pollers: 64,
            blocks: true,
            ..GpuLoop::LEAN
        },
    ];
    for l in loops {
        for p in PingPongPlacement::ALL {
            // ping_pong checks every answer against its round and fails on a wrong one.
            let s = ping_pong(&be, p, l, 20, 300, Duration::from_secs(2))
                .unwrap_or_else(|e| panic!("{p} [{l}]: {e}"));
            assert_eq!(s.n, 300);
            assert!(s.min > 0.0 && s.min <= s.median, "{p} [{l}]: {s:?}");
        }
    }
    let floor = bar_read_round_trip(&be, 10, 200).unwrap();
    assert_eq!(floor.n, 200);
    assert!(floor.min > 0.0 && floor.median < 1000.0, "{floor:?}");
}

#[test]
fn write_ceiling_cases_land_their_bytes_in_gpu_memory() {
    use gdr::cuda::memcpy_dtoh;
    use gdr_bench::write_ceiling::{self, Case, CeilingConfig, Order, Source, Target, Width};
    let name = "write_ceiling_cases_land_their_bytes_in_gpu_memory";
    let Some((ctx, _g)) = gpu(name) else { return };
    let Some(be) = backend(name, &ctx) else {
        return;
    };
    let size = 1 << 20;
    let buf = be.alloc(size, 4096).unwrap();
    // Every case once, copy engines included.
    let cfg = CeilingConfig {
        sizes: vec![size / 2, size],
        cases: write_ceiling::cases(&[1, 3]),
        budget: Duration::from_millis(10),
        samples: 9,
    };
    let (rows, skipped) = write_ceiling::measure(Some(&ctx), &buf, &cfg).unwrap();
    assert!(
        skipped.iter().all(|s| !s.case.contains("copy engine")),
        "{skipped:?}"
    );
    assert!(rows.iter().all(|r| r.gbps > 0.0 && r.gbps.is_finite()));
    // Then a store case alone over poisoned memory: its pattern, and only there.
    let case = Case::Stores {
        width: Width::B32,
        half_lines: true,
        source: Source::Registers,
        order: Order::PagesDescending,
        threads: 3,
        target: Target::Gpu,
    };
    if case.unavailable().is_some() {
        eprintln!("{name}: the half-line case does not run on this CPU; bytes not checked");
        return;
    }
    let mut poison = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut poison);
    gdr::cuda::memcpy_htod(&buf, 0, &poison).unwrap();
    // Landed before the CPU's stores through the mapping, which it must not overwrite.
    gdr::cuda::synchronize_legacy_stream().unwrap();
    let cfg = CeilingConfig {
        sizes: vec![size / 2],
        cases: vec![case],
        ..cfg
    };
    write_ceiling::measure(Some(&ctx), &buf, &cfg).unwrap();
    let mut back = vec![0u8; size];
    memcpy_dtoh(&mut back, &buf, 0).unwrap();
    for (i, (&b, &p)) in back.iter().zip(&poison).enumerate() {
        let written = i < size / 2 && i % 64 < 32;
        assert_eq!(b, if written { 0xA5 } else { p }, "byte {i}");
    }
}
