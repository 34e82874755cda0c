//! Message queues on a real GPU: persistent workers running CUDA handlers. Skips without a
//! GPU (fails under GDR_REQUIRE_GPU=1). The tests take a process-wide lock: a persistent
//! kernel of one test must not run while another test frees memory (that would wait on it).

use gdr::cuda::Context;
use gdr_mq::{ExitReason, GpuConfig, GpuWorkers, Handler, MqError, Placement, QueueConfig};
use gdr_testing::{gpu_context, skip_or_fail};
use rand::{Rng, RngCore, SeedableRng};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod mq_common;
use mq_common::{transform, Tracker, TRANSFORM};

static GPU: Mutex<()> = Mutex::new(());

fn gpu(name: &str) -> Option<(Context, MutexGuard<'static, ()>)> {
    let guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    Some((gpu_context(name)?, guard))
}

/// Echo after busy-waiting the number of microseconds in the first 4 request bytes; a first
/// byte of 0xEE answers more than the capacity.
const SLOW: &str = r#"
__device__ unsigned int handle(const unsigned char *req, unsigned int len,
                               unsigned char *resp, unsigned int cap) {
    if (len >= 1 && req[0] == 0xEE) return cap + 1;
    const unsigned int us = len >= 4 ? *(const unsigned int *)req : 0u;
    const unsigned long long t0 = gdr_globaltimer_ns();
    while (gdr_globaltimer_ns() - t0 < us * 1000ull) { }
    for (unsigned int i = 0; i < len; i++) resp[i] = req[i];
    return len;
}
"#;

/// TRANSFORM under a kernel of the test's own (`Handler::with_kernel`: the program then has no
/// `worker.cu`, and the kernel calls its own `handle`) that hands `gdr_mq_send` a local-memory
/// response buffer: the send must fall back to each lane writing its own slot (other lanes
/// cannot read that buffer).
const OWN_KERNEL: &str = r#"
__device__ unsigned int handle(const unsigned char *req, unsigned int len,
                               unsigned char *resp, unsigned int cap) {
    if (len > cap) return cap + 1;
    const unsigned char k = (unsigned char)len;
    for (unsigned int i = 0; i < len; i++) resp[i] = req[len - 1 - i] ^ k;
    return len;
}

extern "C" __global__ void test_local_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
                                             gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * (blockDim.x / 32u) + threadIdx.x / 32u;
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, descs[q], warp);
    __align__(16) unsigned char out[256];
    gdr_u32 err = 0, arg = 0, reason;
    for (;;) {
        gdr_mq_batch b;
        reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
        if (reason) break;
        gdr_u32 n = 0;
        if (w.lane < b.n) n = handle(b.req, b.req_len, out, w.q.max_msg < 256u ? w.q.max_msg : 256u);
        gdr_mq_send(w, b, out, n);
    }
    gdr_mq_worker_exit(w, reason, err, arg);
}
"#;

fn launch(ctx: &Context, name: &str, h: &Handler, cfg: &GpuConfig) -> Option<GpuWorkers> {
    match GpuWorkers::launch(ctx, h, cfg) {
        Ok(w) => Some(w),
        // No BAR mapping (no Vulkan) is a missing capability, not a queue bug.
        Err(MqError::Bar(e)) => skip_or_fail(name, &e.to_string()),
        Err(e) => panic!("{name}: launch failed: {e}"),
    }
}

fn config(placement: Placement, slots: u32, max_msg: u32) -> GpuConfig {
    GpuConfig {
        queue: QueueConfig {
            slots,
            max_msg,
            placement,
            wait_timeout: Duration::from_secs(10),
            first_index: 0,
            rx_words: false,
            seq_publishes: false,
        },
        idle_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// Pipelines `count` messages of random sizes through queue `qi`, checking each response by
/// the unique id its request carries: in order, none lost, none delivered twice. Counts are
/// relative to the queue's counters on entry (earlier calls on the queue stay out of them).
fn pump(w: &mut GpuWorkers, qi: usize, count: u64, max: usize, seed: u64) {
    let q = w.queue(qi);
    let before = q.stats();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut t = Tracker::new(seed << 8 | qi as u64);
    let mut sent = 0u64;
    let mut buf = vec![0u8; max];
    let check = |n: usize, buf: &[u8], t: &mut Tracker| {
        let got = t.answered();
        if let Err(e) = t.check(&buf[..n]) {
            panic!("queue {qi}, answer {got} of {count}: {e}");
        }
    };
    while t.answered() < count {
        let room = (q.credits() as u64).min(count - sent).min(64);
        if room > 0 {
            let msgs: Vec<Vec<u8>> = (0..room)
                .map(|_| {
                    let len = rng.gen_range(mq_common::ID_BYTES..=max);
                    t.request(&mut rng, len)
                })
                .collect();
            assert_eq!(q.try_send_batch(&msgs).unwrap() as u64, room);
            sent += room;
        }
        if room == 0 {
            // Ring full (or everything sent): wait for the oldest response.
            let n = q
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("queue {qi} answer {}: {e}", t.answered()));
            check(n, &buf, &mut t);
        }
        while let Some(n) = q
            .try_recv(&mut buf)
            .unwrap_or_else(|e| panic!("queue {qi} answer {}: {e}", t.answered()))
        {
            check(n, &buf, &mut t);
        }
    }
    assert_eq!(t.outstanding(), 0);
    assert_eq!(q.in_flight(), 0);
    let s = q.stats();
    assert_eq!(
        (s.sent - before.sent, s.received - before.received),
        (count, count)
    );
}

#[test]
fn a_million_messages_wrap_in_order() {
    let name = "a_million_messages_wrap_in_order";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("transform", TRANSFORM);
    // Both RX formats: header + doorbell, header slots their seq publishes (the worker polls
    // slot next's header beside the doorbell: lone messages by their header, batches by the
    // doorbell, which may lag), and words (the worker polls the slots).
    for (rx_words, seq_publishes) in [(false, false), (false, true), (true, false)] {
        let mut cfg = config(Placement::LYNX, 256, 128);
        cfg.queue.rx_words = rx_words;
        cfg.queue.seq_publishes = seq_publishes;
        // Cross the u32 index wrap early on, as well as thousands of ring wraps.
        cfg.queue.first_index = u32::MAX - 1000;
        let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
            return;
        };
        let t = Instant::now();
        pump(&mut w, 0, 1_000_000, 128, 1);
        let s = w.queue(0).stats();
        println!(
            "{name}: rx_words {rx_words} seq_publishes {seq_publishes}: {:?} {:?}",
            t.elapsed(),
            s
        );
        assert!(s.doorbells < s.sent, "no batching");
        let out = w.stop(Duration::from_secs(5)).unwrap();
        assert_eq!(out[0].reason, ExitReason::Stopped);
        assert_eq!(out[0].stats.worker_messages, 1_000_000);
        assert_eq!(w.queue(0).worker_consumed(), 1_000_000);
    }
}

/// Lone calls of every size around the boundaries (16-byte words, the 112 request bytes
/// that come with the header, the 256-byte lane-local response), then a random stream, on
/// every placement and both RX formats; max 256 takes the worker's lane-local response path
/// for lone messages, max 300 the global scratch.
#[test]
fn every_placement_carries_sizes_zero_to_capacity() {
    let name = "every_placement_carries_sizes_zero_to_capacity";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("transform", TRANSFORM);
    // (placement, rx_words, seq_publishes)
    let formats = Placement::ALL
        .into_iter()
        .flat_map(|p| [(p, false, false), (p, false, true), (p, true, false)]);
    for max in [256usize, 300] {
        for (p, rx_words, seq_publishes) in formats.clone() {
            let mut cfg = config(p, 64, max as u32);
            cfg.queue.rx_words = rx_words;
            cfg.queue.seq_publishes = seq_publishes;
            let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
                return;
            };
            let p_name = format!(
                "{}{}",
                p.name(),
                if rx_words {
                    " words"
                } else if seq_publishes {
                    " seq-publishes"
                } else {
                    ""
                }
            );
            let q = w.queue(0);
            let mut buf = vec![0xa5u8; max];
            let lens: Vec<usize> = [
                0usize, 1, 15, 16, 17, 100, 111, 112, 113, 127, 128, 129, 255, 256, 299, 300,
            ]
            .into_iter()
            .filter(|&l| l <= max)
            .collect();
            for &len in &lens {
                let mut m = vec![0u8; len];
                rand::thread_rng().fill_bytes(&mut m);
                buf.fill(0xa5);
                let n = q
                    .call(&m, &mut buf)
                    .unwrap_or_else(|e| panic!("{} max {max} len {len}: {e}", p_name));
                assert!(
                    buf[..n] == transform(&m)[..],
                    "{} max {max} len {len}",
                    p_name
                );
            }
            match q.send(&vec![1u8; max + 1]) {
                Err(MqError::Oversize { len, max: m }) => assert_eq!((len, m), (max + 1, max)),
                r => panic!("{}: oversize not rejected: {r:?}", p_name),
            }
            // The calls above, then the stream: the queue's totals are the sum.
            pump(&mut w, 0, 20_000, max, 2);
            let total = 20_000 + lens.len() as u64;
            let s = w.queue(0).stats();
            assert_eq!((s.sent, s.received), (total, total), "{}", p_name);
            let out = w.stop(Duration::from_secs(5)).unwrap();
            assert_eq!(out[0].reason, ExitReason::Stopped, "{}", p_name);
            assert_eq!(out[0].stats.worker_messages, total, "{}", p_name);
            println!("{name}: {} max {max} ok", p_name);
        }
    }
}

/// Word-format RX in GPU memory with one worker warp: the worker answers a lone request of
/// up to 224 bytes (30 units) in its lone-message loop (gdr_mq_lone_words) when max_msg fits
/// its shared buffers (256), and hands batches, longer requests and larger queues to the
/// general path. Every length through both (max 256: the loop up to 224, the general path
/// past it; max 300: the general path only), lone calls between batches (the loop hands the
/// queue over and takes it back), a lone response over capacity, and the stop flag seen while
/// the loop is idle.
#[test]
fn word_format_lone_messages_every_length() {
    let name = "word_format_lone_messages_every_length";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("transform", TRANSFORM);
    let mut rng = rand::thread_rng();
    for max in [224usize, 256, 300] {
        let mut cfg = config(Placement::LYNX, 64, max as u32);
        cfg.queue.rx_words = true;
        let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
            return;
        };
        let q = w.queue(0);
        let mut buf = vec![0u8; max + 16];
        let mut calls = 0u64;
        for len in 0..=max {
            let mut m = vec![0u8; len];
            rng.fill_bytes(&mut m);
            buf.fill(0xa5);
            let n = q
                .call(&m, &mut buf)
                .unwrap_or_else(|e| panic!("max {max} len {len}: {e}"));
            assert_eq!(n, len, "max {max}");
            assert!(buf[..n] == transform(&m)[..], "max {max} len {len}");
            assert!(
                buf[n..].iter().all(|&b| b == 0xa5),
                "max {max} len {len}: wrote past"
            );
            calls += 1;
        }
        for round in 0..200 {
            let batch: Vec<Vec<u8>> = (0..1 + round % 9)
                .map(|_| {
                    let mut m = vec![0u8; rng.gen_range(0..=max)];
                    rng.fill_bytes(&mut m);
                    m
                })
                .collect();
            assert_eq!(q.try_send_batch(&batch).unwrap(), batch.len());
            for m in &batch {
                buf.fill(0xa5);
                let n = q.recv(&mut buf).unwrap();
                assert!(buf[..n] == transform(m)[..], "max {max} round {round}");
            }
            let mut m = vec![0u8; rng.gen_range(0..=max)];
            rng.fill_bytes(&mut m);
            let n = q.call(&m, &mut buf).unwrap();
            assert!(
                buf[..n] == transform(&m)[..],
                "max {max} round {round}: lone call"
            );
            calls += batch.len() as u64 + 1;
        }
        // Idle in the loop for a while: the stop flag still ends it.
        std::thread::sleep(Duration::from_millis(50));
        let out = w.stop(Duration::from_secs(5)).unwrap();
        assert_eq!(out[0].reason, ExitReason::Stopped, "max {max}");
        assert_eq!(out[0].stats.worker_messages, calls, "max {max}");
    }
    // A lone response over capacity is an error for that message only.
    let mut cfg = config(Placement::LYNX, 16, 32);
    cfg.queue.rx_words = true;
    let Some(mut w) = launch(&ctx, name, &Handler::new("slow", SLOW), &cfg) else {
        return;
    };
    let q = w.queue(0);
    let mut buf = [0u8; 32];
    match q.call(&[0xEE, 0, 0, 0], &mut buf) {
        Err(MqError::ResponseTooLong {
            len: 33, max: 32, ..
        }) => {}
        r => panic!("expected ResponseTooLong, got {r:?}"),
    }
    assert_eq!(q.call(&slow_msg(0, 7), &mut buf).unwrap(), 5);
    assert_eq!(buf[4], 7);
    w.stop(Duration::from_secs(5)).unwrap();
}

#[test]
fn a_kernel_of_the_handlers_own_serves_the_queues() {
    let name = "a_kernel_of_the_handlers_own_serves_the_queues";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("own_kernel", OWN_KERNEL).with_kernel("test_local_worker");
    assert_eq!(h.kernel(), "test_local_worker");
    let mut cfg = config(Placement::LYNX, 128, 200);
    cfg.warps_per_block = 2;
    let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
        return;
    };
    pump(&mut w, 0, 50_000, 200, 5);
    let out = w.stop(Duration::from_secs(5)).unwrap();
    assert_eq!(out[0].reason, ExitReason::Stopped);
    assert_eq!(out[0].stats.worker_messages, 50_000);
    let missing = Handler::new("transform", TRANSFORM).with_kernel("no_such_kernel");
    assert!(GpuWorkers::launch(&ctx, &missing, &config(Placement::LYNX, 8, 64)).is_err());
}

#[test]
fn many_queues_and_workers_at_once() {
    let name = "many_queues_and_workers_at_once";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("transform", TRANSFORM);
    for p in [Placement::LYNX, Placement::HOST] {
        let mut cfg = config(p, 128, 96);
        cfg.queues = 8;
        cfg.blocks_per_queue = 2;
        cfg.warps_per_block = 2;
        let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
            return;
        };
        let queues = w.queues_mut();
        std::thread::scope(|s| {
            for (i, q) in queues.iter_mut().enumerate() {
                let ctx = ctx.clone();
                s.spawn(move || {
                    ctx.bind().unwrap();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                    let mut t = Tracker::new(i as u64);
                    let mut buf = vec![0u8; 96];
                    let mut sent = 0;
                    while t.answered() < 50_000 {
                        while sent < 50_000 && q.credits() > 0 {
                            let len = rng.gen_range(8..=96);
                            let m = t.request(&mut rng, len);
                            assert!(q.try_send(&m).unwrap());
                            sent += 1;
                        }
                        let n = q.recv(&mut buf).unwrap();
                        if let Err(e) = t.check(&buf[..n]) {
                            panic!("queue {i}: {e}");
                        }
                    }
                });
            }
        });
        let out = w.stop(Duration::from_secs(5)).unwrap();
        for (i, o) in out.iter().enumerate() {
            assert_eq!(o.reason, ExitReason::Stopped, "queue {i}");
            assert_eq!(o.stats.worker_messages, 50_000, "queue {i}");
        }
    }
}

fn slow_msg(us: u32, tag: u8) -> Vec<u8> {
    let mut m = us.to_ne_bytes().to_vec();
    m.push(tag);
    m
}

#[test]
fn slow_handler_exerts_back_pressure() {
    let name = "slow_handler_exerts_back_pressure";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("slow", SLOW);
    let Some(mut w) = launch(&ctx, name, &h, &config(Placement::LYNX, 16, 32)) else {
        return;
    };
    let q = w.queue(0);
    let t = Instant::now();
    for i in 0..16u8 {
        assert!(q.try_send(&slow_msg(2_000, i)).unwrap(), "slot {i}");
    }
    assert!(
        !q.try_send(&slow_msg(0, 99)).unwrap(),
        "a full ring took more"
    );
    assert!(matches!(
        q.send(&slow_msg(0, 99)),
        Err(MqError::Full { .. })
    ));
    let mut buf = [0u8; 32];
    let mut tags = vec![];
    for i in 16..48u8 {
        let n = q.recv(&mut buf).unwrap();
        assert_eq!(n, 5);
        tags.push(buf[4]);
        assert!(
            q.try_send(&slow_msg(2_000, i)).unwrap(),
            "a credit came back"
        );
    }
    while q.in_flight() > 0 {
        q.recv(&mut buf).unwrap();
        tags.push(buf[4]);
    }
    assert_eq!(tags, (0..48).collect::<Vec<u8>>());
    // 48 messages of 2 ms on one warp (up to 16 at a time in parallel lanes): at least 6 ms.
    assert!(t.elapsed() >= Duration::from_millis(6), "{:?}", t.elapsed());
    assert!(q.stats().full >= 2);
    // A handler answering more than the capacity is an error for that message only.
    q.send(&[0xEE, 0, 0, 0]).unwrap();
    q.send(&slow_msg(0, 7)).unwrap();
    assert!(matches!(
        q.recv(&mut buf),
        Err(MqError::ResponseTooLong {
            len: 33,
            max: 32,
            ..
        })
    ));
    assert_eq!(q.recv(&mut buf).unwrap(), 5);
    assert_eq!(buf[4], 7);
}

#[test]
fn stop_mid_stream() {
    let name = "stop_mid_stream";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("slow", SLOW);
    for p in [Placement::LYNX, Placement::HOST] {
        let Some(mut w) = launch(&ctx, name, &h, &config(p, 256, 32)) else {
            return;
        };
        let q = w.queue(0);
        // 200 messages of 1 ms each, taken 32 at a time: ~7 ms of work.
        for i in 0..200u32 {
            q.send(&slow_msg(1_000, i as u8)).unwrap();
        }
        let mut buf = [0u8; 32];
        q.recv(&mut buf).unwrap();
        q.request_stop();
        let mut received = 1u64;
        let err = loop {
            match q.recv(&mut buf) {
                Ok(_) => {
                    assert_eq!(buf[4], received as u8);
                    received += 1;
                }
                Err(e) => break e,
            }
        };
        match err {
            MqError::WorkerExited {
                reason: ExitReason::Stopped,
                in_flight,
                ..
            } => {
                assert_eq!(in_flight.sent, 200);
                assert_eq!(in_flight.received, received);
                assert_eq!(in_flight.answered, received);
                assert!(received < 200, "{}: stop did not stop anything", p.name());
            }
            e => panic!("{}: expected a stopped worker, got {e}", p.name()),
        }
        let out = w.stop(Duration::from_secs(5)).unwrap();
        assert_eq!(out[0].reason, ExitReason::Stopped);
    }
}

/// A worker does not wait forever for another worker's batch to retire: past the retire
/// timeout it fails the queue with ERR_STALLED instead of holding every later batch.
#[test]
fn a_stalled_batch_fails_the_queue_after_the_retire_timeout() {
    let name = "a_stalled_batch_fails_the_queue_after_the_retire_timeout";
    let Some((ctx, _g)) = gpu(name) else { return };
    let h = Handler::new("slow_stall", SLOW).with_retire_timeout(Duration::from_millis(20));
    let mut cfg = config(Placement::LYNX, 16, 32);
    cfg.warps_per_block = 2;
    let Some(mut w) = launch(&ctx, name, &h, &cfg) else {
        return;
    };
    let q = w.queue(0);
    // One warp takes a 300 ms request; the other takes the next one, answers it at once and
    // waits for the first batch to retire.
    q.send(&slow_msg(300_000, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    q.send(&slow_msg(0, 1)).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 32];
    let mut err = None;
    while err.is_none() && q.in_flight() > 0 {
        err = q.recv(&mut buf).err();
    }
    while err.is_none() && t.elapsed() < Duration::from_secs(3) {
        err = q.health().err();
        std::thread::sleep(Duration::from_millis(5));
    }
    match err {
        Some(MqError::WorkerExited {
            reason: ExitReason::Protocol { error, arg },
            ..
        }) => {
            assert_eq!(error, gdr_mq::layout::ERR_STALLED);
            assert_eq!(arg, 1, "the waiting batch starts at message 1");
        }
        e => panic!("expected the stalled-retire failure, got {e:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    println!("{name}: queue failed after {:?}", t.elapsed());
}

#[test]
fn idle_watchdog_ends_workers() {
    let name = "idle_watchdog_ends_workers";
    let Some((ctx, _g)) = gpu(name) else { return };
    // Both RX formats: the word format's worker waits in its lone-message loop.
    for rx_words in [false, true] {
        let mut cfg = config(Placement::LYNX, 16, 32);
        cfg.queue.rx_words = rx_words;
        cfg.idle_timeout = Duration::from_millis(100);
        let Some(mut w) = launch(&ctx, name, &Handler::echo(), &cfg) else {
            return;
        };
        let mut buf = [0u8; 32];
        assert_eq!(w.queue(0).call(b"hello", &mut buf).unwrap(), 5);
        std::thread::sleep(Duration::from_millis(600));
        assert!(
            !w.running().unwrap(),
            "rx_words {rx_words}: the kernel outlived its watchdog"
        );
        let q = w.queue(0);
        q.send(b"late").unwrap();
        match q.recv(&mut buf) {
            Err(MqError::WorkerExited {
                reason: ExitReason::IdleTimeout,
                ..
            }) => {}
            r => panic!("rx_words {rx_words}: expected the idle watchdog, got {r:?}"),
        }
    }
}

#[test]
fn bad_configurations_are_errors() {
    let name = "bad_configurations_are_errors";
    let Some((ctx, _g)) = gpu(name) else { return };
    let mut cfg = config(Placement::HOST, 16, 32);
    cfg.queues = 100_000;
    assert!(matches!(
        GpuWorkers::launch(&ctx, &Handler::echo(), &cfg),
        Err(MqError::Config(_))
    ));
    let cfg = config(Placement::HOST, 12, 32);
    assert!(matches!(
        GpuWorkers::launch(&ctx, &Handler::echo(), &cfg),
        Err(MqError::Config(_))
    ));
    // Word-format RX is polled by one warp per queue.
    let mut cfg = config(Placement::LYNX, 16, 32);
    cfg.queue.rx_words = true;
    cfg.warps_per_block = 2;
    match GpuWorkers::launch(&ctx, &Handler::echo(), &cfg) {
        Err(MqError::Config(m)) => assert!(m.contains("one worker warp"), "{m}"),
        r => panic!("rx_words with 2 warps: {:?}", r.err()),
    }
    // More receiving warps than the block has.
    let mut cfg = config(Placement::LYNX, 16, 32);
    cfg.receiving_warps = 2;
    match GpuWorkers::launch(&ctx, &Handler::echo(), &cfg) {
        Err(MqError::Config(m)) => assert!(m.contains("receiving warps"), "{m}"),
        r => panic!("2 receiving warps of 1: {:?}", r.err()),
    }
    // A block larger than the worker kernel's registers allow is refused before the launch.
    let mut cfg = config(Placement::LYNX, 16, 32);
    cfg.warps_per_block = 32;
    match GpuWorkers::launch(&ctx, &Handler::echo(), &cfg) {
        Err(MqError::Config(m)) => assert!(m.contains("by its registers"), "{m}"),
        r => panic!("32 warps of the library worker: {:?}", r.err()),
    }
    let err = GpuWorkers::launch(
        &ctx,
        &Handler::new("broken", "this is not cuda"),
        &config(Placement::HOST, 16, 32),
    );
    match err {
        Err(MqError::Cuda(e)) => assert!(e.to_string().contains("broken"), "{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a broken handler compiled"),
    }
}

#[test]
fn device_compiler_sees_the_host_layout() {
    use gdr::cuda::{DeviceBuffer, DeviceMemory, KernelArgs, LaunchConfig, Module, Stream};
    let Some((ctx, _guard)) = gpu("device_compiler_sees_the_host_layout") else {
        return;
    };
    let module = Module::from_source(&ctx, "gdr_mq_layout.cu", gdr_mq::DEVICE_HEADER).unwrap();
    let f = module.function("gdr_mq_layout_check").unwrap();
    let out = DeviceBuffer::new(&ctx, 4).unwrap();
    gdr::cuda::memcpy_htod(&out, 0, &u32::MAX.to_le_bytes()).unwrap();
    // The kernel runs on a non-blocking stream: the poison must land before it writes.
    gdr::cuda::synchronize_legacy_stream().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let p: u64 = out.device_ptr();
    let args = KernelArgs::new().arg(&p);
    // SAFETY: gdr_mq_layout_check takes one pointer to a u32, which `out` is.
    unsafe { f.launch(&stream, LaunchConfig::linear(1, 32), &args) }.unwrap();
    stream.synchronize().unwrap();
    let mut b = [0u8; 4];
    gdr::cuda::memcpy_dtoh(&mut b, &out, 0).unwrap();
    assert_eq!(
        u32::from_le_bytes(b),
        0,
        "fields whose device offset differs from GDR_MQ_OFFSETS"
    );
}

/// The test handlers compile into full worker programs (no GPU needed, only NVRTC; skipped
/// without it) in bounded time. The bound is loose: NVRTC versions and hosts differ several
/// times over for these programs (both RX formats and the lone-message loop in one
/// program).
#[test]
fn test_handlers_compile_with_nvrtc() {
    let name = "test_handlers_compile_with_nvrtc";
    if let Err(e) = gdr::cuda::nvrtc::version() {
        skip_or_fail::<()>(name, &e.to_string());
        return;
    }
    for h in [
        Handler::new("transform", TRANSFORM),
        Handler::new("slow", SLOW),
        Handler::new("slow_stall", SLOW).with_retire_timeout(Duration::from_millis(20)),
        Handler::new("own_kernel", OWN_KERNEL),
        Handler::new("own_kernel", OWN_KERNEL).with_kernel("test_local_worker"),
        Handler::echo(),
    ] {
        let t = Instant::now();
        let cubin = gdr::cuda::nvrtc::compile("mq test handler", &h.program(), "90")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cubin.starts_with(b"\x7fELF"));
        assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    }
}
