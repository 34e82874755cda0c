//! The host side of the message queues with a CPU thread playing the GPU worker over plain
//! memory: layout, index arithmetic across the u32 wrap, credits and back-pressure, stop, the
//! idle watchdog and failure reporting. No GPU needed; these run everywhere.

use gdr_mq::{CpuHandler, CpuWorkers, ExitReason, MqError, QueueConfig};
use rand::{Rng, RngCore};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod mq_common;
use mq_common::{transform, Tracker};

fn transform_handler() -> CpuHandler {
    Arc::new(|req: &[u8], resp: &mut [u8]| {
        let t = transform(req);
        resp[..t.len()].copy_from_slice(&t);
        t.len()
    })
}

fn cfg(slots: u32, max_msg: u32) -> QueueConfig {
    QueueConfig {
        slots,
        max_msg,
        wait_timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

/// Pipelines `count` random messages through queue 0 (keeping the ring as full as credits
/// allow, in random batch sizes) and checks every response by id: in order, none lost, none
/// duplicated. Counts are taken relative to the queue's counters on entry, so earlier calls
/// on the same queue do not disturb them.
fn pump(w: &mut CpuWorkers, count: u64, max: usize) -> Result<(), String> {
    let q = w.queue(0);
    let before = q.stats();
    let mut rng = rand::thread_rng();
    let mut t = Tracker::new(1);
    let mut sent = 0u64;
    let mut buf = vec![0x5au8; max + 7];
    while t.answered() < count {
        if sent < count && q.credits() > 0 {
            let n = rng
                .gen_range(1..=40u64)
                .min(count - sent)
                .min(q.credits() as u64);
            let msgs: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = rng.gen_range(mq_common::ID_BYTES..=max);
                    t.request(&mut rng, len)
                })
                .collect();
            let k = q.try_send_batch(&msgs).map_err(|e| e.to_string())?;
            assert_eq!(k as u64, n, "credits said {n} would fit");
            sent += n;
        }
        while let Some(len) = q.try_recv(&mut buf).map_err(|e| e.to_string())? {
            t.check(&buf[..len])?;
        }
    }
    assert_eq!(t.outstanding(), 0);
    assert_eq!(q.in_flight(), 0);
    let s = q.stats();
    assert_eq!(
        (s.sent - before.sent, s.received - before.received),
        (count, count)
    );
    assert!(
        s.doorbells - before.doorbells < count,
        "no batching happened: {s:?}"
    );
    assert!(s.max_in_flight <= q.slots() as u64);
    Ok(())
}

#[test]
fn many_messages_wrap_the_ring_in_order() {
    let mut w = CpuWorkers::spawn(
        &cfg(16, 96),
        1,
        Duration::from_secs(30),
        transform_handler(),
    )
    .unwrap();
    pump(&mut w, 100_000, 96).unwrap();
    // The workers' lazily written consumer index has caught up with everything answered.
    let q = w.queue(0);
    assert_eq!(q.worker_consumed(), 100_000);
    assert_eq!(q.stats().worker_messages, 100_000);
}

#[test]
fn indices_cross_the_u32_wrap() {
    let mut c = cfg(8, 32);
    c.first_index = u32::MAX - 100;
    let mut w = CpuWorkers::spawn(&c, 1, Duration::from_secs(30), transform_handler()).unwrap();
    pump(&mut w, 5_000, 32).unwrap();
    assert_eq!(w.queue(0).worker_consumed(), 5_000);
}

#[test]
fn rx_words_many_messages_in_order_across_the_u32_wrap() {
    // Word-format RX: the worker finds requests by their words' seq (no doorbell). Crossing
    // the wrap also crosses the indices where the host restamps whole slots.
    in_order_across_the_wrap(|c| c.rx_words = true);
}

#[test]
fn seq_publishes_many_messages_in_order_across_the_u32_wrap() {
    // Header-format slots whose seq is stored after the payload (two fences a batch): the CPU
    // worker still goes by the doorbell, so this checks the host's staging of every byte.
    in_order_across_the_wrap(|c| c.seq_publishes = true);
}

/// 20,000 messages in order through one queue configured by `set`, from index 0 and from
/// just below the u32 wrap.
fn in_order_across_the_wrap(set: fn(&mut QueueConfig)) {
    for first in [0, u32::MAX - 100] {
        let mut c = cfg(16, 96);
        set(&mut c);
        c.first_index = first;
        let mut w = CpuWorkers::spawn(&c, 1, Duration::from_secs(30), transform_handler()).unwrap();
        pump(&mut w, 20_000, 96).unwrap();
        assert_eq!(w.queue(0).worker_consumed(), 20_000);
    }
}

#[test]
fn sizes_zero_to_capacity_and_oversize_rejected() {
    sizes_and_oversize(false);
}

#[test]
fn rx_words_sizes_zero_to_capacity_and_oversize_rejected() {
    sizes_and_oversize(true);
}

fn sizes_and_oversize(rx_words: bool) {
    let max = 200usize;
    let mut c = cfg(32, max as u32);
    c.rx_words = rx_words;
    let mut w = CpuWorkers::spawn(&c, 1, Duration::from_secs(30), transform_handler()).unwrap();
    let q = w.queue(0);
    let mut buf = vec![0u8; max];
    for len in [0, 1, 15, 16, 17, 47, 48, 49, 111, 112, 113, 199, 200] {
        let m = random(len);
        let n = q.call(&m, &mut buf).unwrap();
        assert_eq!(&buf[..n], &transform(&m)[..], "len {len}");
    }
    let before = q.stats();
    match q.send(&random(max + 1)) {
        Err(MqError::Oversize { len, max: m }) => assert_eq!((len, m), (max + 1, max)),
        r => panic!("oversize not rejected: {r:?}"),
    }
    let too_many = vec![random(10), random(max + 1)];
    assert!(matches!(
        q.try_send_batch(&too_many),
        Err(MqError::Oversize { .. })
    ));
    assert_eq!(
        q.stats().sent,
        before.sent,
        "a rejected batch sent something"
    );
    assert!(matches!(
        q.recv(&mut buf),
        Err(MqError::NothingInFlight { .. })
    ));
    // The queue still works after the rejections.
    let m = random(max);
    assert_eq!(q.call(&m, &mut buf).unwrap(), max);
    assert_eq!(&buf[..max], &transform(&m)[..]);
    // Then a pipelined stream on the same queue (the GPU test's sequence): the 14 calls above
    // stay in the queue's counters, the stream is counted from where it started.
    assert_eq!(q.stats().received, 14);
    pump(&mut w, 2_000, max).unwrap();
    assert_eq!(w.queue(0).stats().received, 2_014);
    assert_eq!(w.queue(0).stats().sent, 2_014);
}

/// The id check is what stands between "a response delivered twice" and a passing test: a
/// worker that answers one request with the previous request's answer must be caught, and
/// reported as a duplicate.
#[test]
fn a_replayed_response_is_reported_as_a_duplicate() {
    let last = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let (l, c) = (last.clone(), calls.clone());
    let h: CpuHandler = Arc::new(move |req: &[u8], resp: &mut [u8]| {
        let mut prev = l.lock().unwrap();
        // Request 500 gets the answer to request 499 again.
        let src = if c.fetch_add(1, Ordering::AcqRel) == 500 {
            prev.clone()
        } else {
            req.to_vec()
        };
        *prev = req.to_vec();
        let t = transform(&src);
        resp[..t.len()].copy_from_slice(&t);
        t.len()
    });
    let mut w = CpuWorkers::spawn(&cfg(16, 64), 1, Duration::from_secs(30), h).unwrap();
    let err = pump(&mut w, 2_000, 64).unwrap_err();
    assert!(err.contains("delivered twice"), "{err}");
    assert!(calls.load(Ordering::Acquire) > 500);
}

#[test]
fn small_receive_buffer_leaves_the_response_queued() {
    let mut w =
        CpuWorkers::spawn(&cfg(4, 64), 1, Duration::from_secs(30), transform_handler()).unwrap();
    let q = w.queue(0);
    let m = random(40);
    q.send(&m).unwrap();
    let mut small = [0u8; 10];
    let err = loop {
        match q.try_recv(&mut small) {
            Ok(None) => continue,
            Ok(Some(n)) => panic!("{n} bytes into a 10-byte buffer"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, MqError::BufferTooSmall { len: 40, cap: 10 }),
        "{err}"
    );
    let mut big = [0u8; 64];
    assert_eq!(q.recv(&mut big).unwrap(), 40);
    assert_eq!(&big[..40], &transform(&m)[..]);
}

#[test]
fn handler_answering_too_much_is_an_error_for_that_message_only() {
    let h: CpuHandler = Arc::new(|req: &[u8], resp: &mut [u8]| {
        if req.first() == Some(&0xff) {
            resp.len() + 5
        } else {
            resp[..req.len()].copy_from_slice(req);
            req.len()
        }
    });
    let mut w = CpuWorkers::spawn(&cfg(4, 64), 1, Duration::from_secs(30), h).unwrap();
    let q = w.queue(0);
    q.send(&[0xff, 1, 2]).unwrap();
    q.send(&[7, 8, 9]).unwrap();
    let mut buf = [0u8; 64];
    match q.recv(&mut buf) {
        Err(MqError::ResponseTooLong {
            index: 0,
            len: 69,
            max: 64,
        }) => {}
        r => panic!("expected ResponseTooLong, got {r:?}"),
    }
    assert_eq!(q.recv(&mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], &[7, 8, 9]);
}

#[test]
fn slow_handler_exerts_back_pressure() {
    let gate = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let (g, s) = (gate.clone(), seen.clone());
    let h: CpuHandler = Arc::new(move |req: &[u8], resp: &mut [u8]| {
        while !g.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(200));
        }
        s.fetch_add(1, Ordering::AcqRel);
        resp[..req.len()].copy_from_slice(req);
        req.len()
    });
    let slots = 8u32;
    let mut w = CpuWorkers::spawn(&cfg(slots, 16), 1, Duration::from_secs(30), h).unwrap();
    let q = w.queue(0);
    for i in 0..slots {
        assert!(q.try_send(&[i as u8]).unwrap(), "slot {i} refused");
    }
    assert_eq!(q.credits(), 0);
    // Full: further sends are refused, however long we wait, and counted.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(20) {
        assert!(!q.try_send(&[99]).unwrap());
    }
    assert!(matches!(q.send(&[99]), Err(MqError::Full { slots: 8, .. })));
    assert!(q.stats().full > 0);
    assert_eq!(seen.load(Ordering::Acquire), 0);
    // A response not yet there: recv with a short timeout times out and says what is pending.
    q.set_wait_timeout(Duration::from_millis(30));
    let mut buf = [0u8; 16];
    match q.recv(&mut buf) {
        Err(MqError::Timeout { in_flight, .. }) => {
            assert_eq!(
                (in_flight.sent, in_flight.received, in_flight.answered),
                (8, 0, 0)
            )
        }
        r => panic!("expected a timeout, got {r:?}"),
    }
    q.set_wait_timeout(Duration::from_secs(10));
    gate.store(true, Ordering::Release);
    // Receiving one frees exactly one credit.
    assert_eq!(q.recv(&mut buf).unwrap(), 1);
    assert_eq!(buf[0], 0);
    assert_eq!(q.credits(), 1);
    assert!(q.try_send(&[100]).unwrap());
    assert_eq!(q.credits(), 0);
    let mut order = vec![];
    while q.in_flight() > 0 {
        q.recv(&mut buf).unwrap();
        order.push(buf[0]);
    }
    assert_eq!(order, vec![1, 2, 3, 4, 5, 6, 7, 100]);
}

#[test]
fn many_queues_at_once() {
    let queues = 6;
    let mut w = CpuWorkers::spawn(
        &cfg(32, 128),
        queues,
        Duration::from_secs(30),
        transform_handler(),
    )
    .unwrap();
    std::thread::scope(|s| {
        for q in w.queues_mut() {
            s.spawn(move || {
                let mut rng = rand::thread_rng();
                let mut buf = vec![0u8; 128];
                let mut t = Tracker::new(q.id() as u64);
                let total = 3_000;
                let mut sent = 0;
                while t.answered() < total {
                    while sent < total && q.credits() > 0 {
                        let len = rng.gen_range(8..=128);
                        let m = t.request(&mut rng, len);
                        assert!(q.try_send(&m).unwrap());
                        sent += 1;
                    }
                    let n = q.recv(&mut buf).unwrap();
                    if let Err(e) = t.check(&buf[..n]) {
                        panic!("queue {}: {e}", q.id());
                    }
                }
            });
        }
    });
    for q in w.queues_mut() {
        assert_eq!(q.stats().received, 3_000);
    }
}

#[test]
fn stop_mid_stream_reports_what_was_in_flight() {
    let release = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicBool::new(false));
    let (r, e) = (release.clone(), entered.clone());
    let h: CpuHandler = Arc::new(move |req: &[u8], resp: &mut [u8]| {
        // Answers the first ten at once, then stalls until released.
        if req[0] >= 10 {
            e.store(true, Ordering::Release);
            while !r.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        resp[0] = req[0];
        1
    });
    let mut w = CpuWorkers::spawn(&cfg(64, 8), 1, Duration::from_secs(30), h).unwrap();
    let q = w.queue(0);
    let mut buf = [0u8; 8];
    for i in 0..10u8 {
        q.send(&[i]).unwrap();
    }
    for i in 0..10u8 {
        assert_eq!(q.recv(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], i);
    }
    // 40 more: the worker takes a batch of up to 32 and blocks in the handler on the first.
    for i in 10..50u8 {
        q.send(&[i]).unwrap();
    }
    while !entered.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    q.request_stop();
    release.store(true, Ordering::Release);
    // It finishes the batch it holds, then sees the stop flag and leaves: the rest are lost
    // and reported.
    let mut received = 10;
    let err = loop {
        match q.recv(&mut buf) {
            Ok(_) => {
                assert_eq!(buf[0] as u64, received);
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
            assert_eq!(in_flight.sent, 50);
            assert_eq!(in_flight.received, received);
            assert!(
                in_flight.pending() > 0 && in_flight.pending() < 40,
                "{in_flight}"
            );
            assert_eq!(in_flight.answered, received);
        }
        e => panic!("expected a stopped worker, got {e}"),
    }
}

#[test]
fn idle_watchdog_ends_the_worker_and_the_host_hears_of_it() {
    let mut w = CpuWorkers::spawn(
        &cfg(8, 8),
        1,
        Duration::from_millis(50),
        transform_handler(),
    )
    .unwrap();
    let q = w.queue(0);
    let mut buf = [0u8; 8];
    assert_eq!(q.call(&[1, 2], &mut buf).unwrap(), 2);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    q.send(&[3]).unwrap();
    match q.recv(&mut buf) {
        Err(MqError::WorkerExited {
            reason: ExitReason::IdleTimeout,
            in_flight,
            ..
        }) => assert_eq!((in_flight.sent, in_flight.received), (2, 1)),
        r => panic!("expected the idle watchdog, got {r:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "noticed too late");
}

#[test]
fn a_crashing_worker_is_reported_not_waited_for() {
    let h: CpuHandler = Arc::new(|req: &[u8], resp: &mut [u8]| {
        if req == b"trap" {
            panic!("handler trapped");
        }
        resp[..req.len()].copy_from_slice(req);
        req.len()
    });
    let mut w = CpuWorkers::spawn(&cfg(16, 16), 1, Duration::from_secs(30), h).unwrap();
    let q = w.queue(0);
    let mut buf = [0u8; 16];
    assert_eq!(q.call(b"fine", &mut buf).unwrap(), 4);
    q.send(b"ok-1").unwrap();
    q.send(b"trap").unwrap();
    q.send(b"ok-2").unwrap();
    let t = Instant::now();
    assert_eq!(
        q.recv(&mut buf).unwrap(),
        4,
        "the message before the trap is answered"
    );
    // The trap kills the batch holding it: nothing more arrives, and the failure is reported
    // with the messages in flight well before the 30 s wait timeout.
    match q.recv(&mut buf) {
        Err(MqError::WorkerFailed {
            cause, in_flight, ..
        }) => {
            assert!(cause.contains("handler trapped"), "{cause}");
            assert_eq!((in_flight.sent, in_flight.received), (4, 2));
        }
        r => panic!("expected a failed worker, got {r:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2));
    // Later calls keep reporting it instead of hanging.
    assert!(matches!(
        q.recv(&mut buf),
        Err(MqError::WorkerFailed { .. })
    ));
}

#[test]
fn bad_configurations_are_errors() {
    for (slots, max) in [(0, 64), (3, 64), (1 << 25, 64), (8, (1 << 24) + 1)] {
        match CpuWorkers::spawn(
            &cfg(slots, max),
            1,
            Duration::from_secs(1),
            transform_handler(),
        ) {
            Err(MqError::Config(_)) => {}
            Err(e) => panic!("{slots}/{max}: wrong error {e}"),
            Ok(_) => panic!("{slots}/{max} accepted"),
        }
    }
}
