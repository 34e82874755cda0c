//! GPU tests (skipped without a GPU, fail under GDR_REQUIRE_GPU=1): LeNet answers through the
//! GPU-queue mode match the CPU reference for 10^5 images, echo comes back unchanged, and
//! both modes are measured in one run (server-side and end-to-end latency printed).

use gdr_serve::load::{self, LoadMode, LoadReport, Payload};
use gdr_serve::server::ServeReport;
use gdr_serve::{serve, App, LoadConfig, Mode, ServeOptions};
use gdr_testing::gpu_context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Serves `app` in `mode` on loopback while `body` runs; bounded: a server that is not ready
/// in 60 s or does not stop in 30 s fails the test.
fn with_gpu_server<R: Send>(
    app: &App,
    mode: Mode,
    threads: usize,
    body: impl FnOnce(SocketAddr, &AtomicBool) -> R + Send,
) -> (R, ServeReport) {
    let opts = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        mode,
        threads,
        ..Default::default()
    };
    with_gpu_server_opts(app, opts, body)
}

/// Runs `body` against a server; `body` gets its address and a flag that is set when the
/// server has stopped on its own (an error), which loads take as their stop flag: a load
/// against a dead server would otherwise wait out every request's timeout.
fn with_gpu_server_opts<R: Send>(
    app: &App,
    opts: ServeOptions,
    body: impl FnOnce(SocketAddr, &AtomicBool) -> R + Send,
) -> (R, ServeReport) {
    let stop = AtomicBool::new(false);
    let down = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let (o, st, dn) = (&opts, &stop, &down);
        let h = s.spawn(move || {
            let r = serve(app, o, st, &mut |a| {
                let _ = tx.send(a);
            });
            let _ = tx.send("0.0.0.0:0".parse().unwrap()); // unblocks a failed start
            dn.store(true, Ordering::Release);
            r
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server ready in 60 s");
        assert_ne!(
            addr.port(),
            0,
            "server failed to start: {:?}",
            h.join().unwrap().err()
        );
        let r = body(addr, &down);
        stop.store(true, Ordering::Release);
        let (dtx, drx) = mpsc::channel();
        let rep = s.spawn(move || {
            let rep = h.join();
            let _ = dtx.send(());
            rep
        });
        drx.recv_timeout(Duration::from_secs(30))
            .expect("server stopped within 30 s");
        (r, rep.join().unwrap().unwrap().unwrap())
    })
}

fn load(
    addr: SocketAddr,
    down: &AtomicBool,
    payload: Payload,
    outstanding: usize,
    requests: u64,
) -> LoadReport {
    load::run(
        &LoadConfig {
            target: addr,
            payload,
            mode: LoadMode::Closed { outstanding },
            duration: Duration::from_secs(120),
            requests: Some(requests),
            timeout: Duration::from_secs(2),
            verify: true,
            ..Default::default()
        },
        down,
    )
    .unwrap()
}

#[test]
fn lenet_on_the_gpu_queues_matches_the_cpu_reference_for_100k_images() {
    if gpu_context("lenet_on_the_gpu_queues_matches_the_cpu_reference_for_100k_images").is_none() {
        return;
    }
    let app = App::builtin("lenet", 1, 1024).unwrap();
    let (rep, srv) = with_gpu_server(&app, Mode::GpuQueue, 2, |addr, down| {
        load::run(
            &LoadConfig {
                target: addr,
                payload: Payload::Lenet {
                    seed: 1,
                    images: 100_000,
                },
                mode: LoadMode::Closed { outstanding: 32 },
                duration: Duration::from_secs(120),
                requests: Some(100_000),
                threads: 2,
                timeout: Duration::from_secs(2),
                verify: true,
                ..Default::default()
            },
            down,
        )
        .unwrap()
    });
    println!("gpu-queue lenet 10^5: {rep:?}");
    assert_eq!(rep.sent, 100_000);
    assert_eq!(
        (rep.ok, rep.verified, rep.verify_failed),
        (100_000, 100_000, 0)
    );
    assert_eq!(srv.counters.accepted, 100_000);
    assert_eq!(srv.counters.responses, 100_000);
}

/// The FC weights read from global memory (`--no-resident`, and any GPU without room for them
/// in shared memory) give the same answers, also with a repeated computation.
#[test]
fn lenet_with_its_weights_in_global_memory_matches_the_cpu_reference() {
    if gpu_context("lenet_with_its_weights_in_global_memory_matches_the_cpu_reference").is_none() {
        return;
    }
    let app = App::builtin("lenet", 3, 1024).unwrap();
    let mut opts = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        mode: Mode::GpuQueue,
        threads: 1,
        ..Default::default()
    };
    opts.shape.resident = false;
    let payload = Payload::Lenet {
        seed: 1,
        images: 20_000,
    };
    let (rep, srv) = with_gpu_server_opts(&app, opts, |addr, down| {
        load(addr, down, payload, 16, 20_000)
    });
    assert_eq!(
        (rep.ok, rep.verified, rep.verify_failed),
        (20_000, 20_000, 0)
    );
    assert_eq!(srv.counters.responses, 20_000);
}

#[test]
fn echo_through_the_gpu_queues_is_unchanged() {
    if gpu_context("echo_through_the_gpu_queues_is_unchanged").is_none() {
        return;
    }
    let app = App::builtin("echo", 1, 1024).unwrap();
    let (reps, _) = with_gpu_server(&app, Mode::GpuQueue, 1, |addr, down| {
        [0usize, 1, 15, 16, 17, 100, 1000, 1024]
            .map(|size| load(addr, down, Payload::Echo { size }, 8, 2000))
    });
    for r in reps {
        assert_eq!(
            (r.ok, r.verified, r.verify_failed),
            (2000, 2000, 0),
            "{r:?}"
        );
    }
}

/// Word-format RX (`--rx-format words`): lone requests and batches (1 and 16 outstanding),
/// every echo size up to the slot, and LeNet images against the CPU reference.
#[test]
fn word_format_rx_answers_echo_and_lenet_correctly() {
    if gpu_context("word_format_rx_answers_echo_and_lenet_correctly").is_none() {
        return;
    }
    for (app, payloads) in [
        (
            App::builtin("echo", 1, 1024).unwrap(),
            [0usize, 1, 15, 16, 17, 100, 239, 240, 241, 1000, 1024]
                .map(|size| Payload::Echo { size })
                .to_vec(),
        ),
        (
            App::builtin("lenet", 1, 1024).unwrap(),
            vec![Payload::Lenet {
                seed: 1,
                images: 4096,
            }],
        ),
    ] {
        let mut opts = ServeOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            mode: Mode::GpuQueue,
            threads: 1,
            ..Default::default()
        };
        opts.shape.rx_words = true;
        let (reps, srv) = with_gpu_server_opts(&app, opts, |addr, down| {
            let mut reps = Vec::new();
            for p in &payloads {
                for outstanding in [1, 16] {
                    reps.push((
                        p.clone(),
                        outstanding,
                        load(addr, down, p.clone(), outstanding, 2000),
                    ));
                }
            }
            reps
        });
        for (p, outstanding, r) in &reps {
            assert_eq!(
                (r.ok, r.verified, r.verify_failed),
                (2000, 2000, 0),
                "{p:?} with {outstanding} outstanding: {r:?}"
            );
        }
        assert_eq!(srv.counters.responses, 2000 * reps.len() as u64);
    }
}

#[test]
fn both_modes_measured_in_one_run_with_correct_answers() {
    if gpu_context("both_modes_measured_in_one_run_with_correct_answers").is_none() {
        return;
    }
    let app = App::builtin("lenet", 1, 1024).unwrap();
    let mut rows = Vec::new();
    for mode in [Mode::GpuQueue, Mode::HostCentric] {
        let (rep, srv) = with_gpu_server(&app, mode, 1, |addr, down| {
            load(
                addr,
                down,
                Payload::Lenet {
                    seed: 1,
                    images: 512,
                },
                1,
                5000,
            )
        });
        assert_eq!((rep.ok, rep.verify_failed), (5000, 0), "{mode:?}: {rep:?}");
        rows.push((mode, srv.server_time, rep.latency));
    }
    for (mode, server, e2e) in &rows {
        println!(
            "{:<13} server p50 {:7.2} us p99 {:7.2} us | end-to-end p50 {:7.2} us p99 {:7.2} us",
            mode.name(),
            server.p50_us,
            server.p99_us,
            e2e.p50_us,
            e2e.p99_us
        );
    }
    println!(
        "server-side p50 ratio host-centric / gpu-queue: {:.2}x",
        rows[1].1.p50_us / rows[0].1.p50_us
    );
}

/// LeNet over a thread-block cluster (`--cluster 2/4/8`): every answer matches the CPU
/// reference with lone requests and batches (1 and 16 outstanding), in both RX formats, at the
/// default block size for the shape and at 16 and 2 warps; the server-side p50 of each shape
/// is printed beside the one-block worker's. Shapes a cluster cannot have are refused with the
/// reason.
#[test]
fn lenet_over_a_cluster_matches_the_cpu_reference() {
    let name = "lenet_over_a_cluster_matches_the_cpu_reference";
    let Some(ctx) = gpu_context(name) else { return };
    let (major, _) = ctx.device().compute_capability().unwrap();
    if major < 9 {
        println!("skipped: no GPU with thread-block clusters: {name}");
        return;
    }
    let app = App::builtin("lenet", 1, 1024).unwrap();
    let payload = Payload::Lenet {
        seed: 1,
        images: 4096,
    };
    let mut p50 = Vec::new();
    // (cluster, rx_words, warps): warps 0 is the default for the shape (8 for a cluster);
    // 2 leaves a cluster block 32 app threads, fewer than any phase has work items.
    let shapes = [
        (1, false, 0),
        (2, false, 0),
        (4, false, 0),
        (4, true, 0),
        (8, false, 0),
        (8, true, 16),
        (8, false, 2),
    ];
    for (cluster, rx_words, warps) in shapes {
        let mut opts = ServeOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            mode: Mode::GpuQueue,
            threads: 1,
            ..Default::default()
        };
        opts.shape.cluster = cluster;
        opts.shape.rx_words = rx_words;
        opts.shape.warps = warps;
        let (reps, srv) = with_gpu_server_opts(&app, opts, |addr, down| {
            [16usize, 1].map(|outstanding| load(addr, down, payload.clone(), outstanding, 3000))
        });
        for r in &reps {
            assert_eq!(
                (r.ok, r.verified, r.verify_failed),
                (3000, 3000, 0),
                "cluster {cluster}, rx_words {rx_words}, warps {warps}: {r:?}"
            );
        }
        assert_eq!(srv.counters.responses, 6000);
        p50.push((cluster, rx_words, warps, srv.server_time.p50_us));
    }
    for (cluster, rx_words, warps, us) in p50 {
        println!(
            "cluster {cluster} rx_words {rx_words} warps {warps}: server-side p50 {us:.2} us \
             (both loads)"
        );
    }
    let refuse = |app: &App, f: &dyn Fn(&mut gdr_serve::gpu::GpuShape)| {
        let mut shape = gdr_serve::gpu::GpuShape::default();
        f(&mut shape);
        match gdr_serve::gpu::launch_workers(&ctx, app, 1, &shape) {
            Ok(_) => panic!("{:?} was launched", shape),
            Err(e) => e.to_string(),
        }
    };
    // 16 queues of 8-block clusters: 128 blocks, which the SM count allows; whether the
    // clusters fit at once depends on how the GPU's SMs are grouped (GPCs). Either they run
    // or the launch says why, never a queue that waits for an SM.
    let shape = gdr_serve::gpu::GpuShape {
        cluster: 8,
        ..Default::default()
    };
    match gdr_serve::gpu::launch_workers(&ctx, &app, 16, &shape) {
        Ok(w) => {
            println!("16 clusters of 8 fit at once");
            drop(w);
        }
        Err(e) => {
            let e = e.to_string();
            println!("16 clusters of 8: {e}");
            assert!(e.contains("do not fit at once"), "{e}");
        }
    }
    let e = refuse(&app, &|s| s.cluster = 3);
    assert!(e.contains("2, 4 or 8"), "{e}");
    let e = refuse(&App::builtin("echo", 1, 64).unwrap(), &|s| s.cluster = 4);
    assert!(e.contains("no cluster form"), "{e}");
    let e = refuse(&App::builtin("lenet", 2, 1024).unwrap(), &|s| s.cluster = 4);
    assert!(e.contains("--work"), "{e}");
    let e = refuse(&app, &|s| {
        s.cluster = 4;
        s.resident = false
    });
    assert!(e.contains("resident"), "{e}");
    let e = refuse(&app, &|s| {
        s.cluster = 4;
        s.blocks_per_queue = 2
    });
    assert!(e.contains("blocks per queue"), "{e}");
}
