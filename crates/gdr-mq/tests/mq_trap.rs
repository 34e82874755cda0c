//! A handler that traps kills the worker kernel (and the CUDA context with it): the host must
//! report the CUDA error with the messages in flight, promptly, and never hang. Alone in its
//! own test binary because the trap leaves this process's context unusable.

use gdr_mq::{GpuConfig, GpuWorkers, Handler, MqError, Placement, QueueConfig};
use gdr_testing::{gpu_context, skip_or_fail};
use std::time::{Duration, Instant};

const TRAP: &str = r#"
__device__ unsigned int handle(const unsigned char *req, unsigned int len,
                               unsigned char *resp, unsigned int cap) {
    if (len == 4 && req[0] == 't' && req[1] == 'r' && req[2] == 'a' && req[3] == 'p') __trap();
    for (unsigned int i = 0; i < len; i++) resp[i] = req[i];
    return len;
}
"#;

#[test]
fn a_trapping_handler_is_reported_not_waited_for() {
    let name = "a_trapping_handler_is_reported_not_waited_for";
    let Some(ctx) = gpu_context(name) else { return };
    let cfg = GpuConfig {
        queue: QueueConfig {
            slots: 64,
            max_msg: 64,
            placement: Placement::LYNX,
            wait_timeout: Duration::from_secs(30),
            first_index: 0,
            rx_words: false,
            seq_publishes: false,
        },
        ..Default::default()
    };
    let mut w = match GpuWorkers::launch(&ctx, &Handler::new("trap", TRAP), &cfg) {
        Ok(w) => w,
        Err(MqError::Bar(e)) => {
            skip_or_fail::<()>(name, &e.to_string());
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let q = w.queue(0);
    let mut buf = [0u8; 64];
    assert_eq!(q.call(b"fine", &mut buf).unwrap(), 4);
    for m in [&b"one"[..], b"trap", b"two", b"three"] {
        q.send(m).unwrap();
    }
    let t = Instant::now();
    // The trap takes down the batch it is in; whatever arrives before the error is in order.
    let err = loop {
        match q.recv(&mut buf) {
            Ok(n) => assert_eq!(&buf[..n], b"one"),
            Err(e) => break e,
        }
    };
    match &err {
        MqError::WorkerFailed {
            cause, in_flight, ..
        } => {
            assert!(
                cause.contains("CUDA") || cause.contains("cuStreamQuery"),
                "{cause}"
            );
            assert_eq!(in_flight.sent, 5);
            assert!(in_flight.pending() >= 3, "{in_flight}");
        }
        e => panic!("expected the CUDA failure, got {e}"),
    }
    println!("{name}: reported after {:?}: {err}", t.elapsed());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    // Stopping a dead set returns at once with the failure too.
    let t = Instant::now();
    assert!(matches!(
        w.stop(Duration::from_secs(5)),
        Err(MqError::WorkerFailed { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(1));
}
