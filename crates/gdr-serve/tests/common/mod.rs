//! A server on loopback with the CPU backend, for the tests: bounded by a watchdog, stopped
//! by its flag when the test body returns.

#![allow(dead_code)]

use gdr_serve::exec::{cpu_workers, split_queues};
use gdr_serve::server::ServeReport;
use gdr_serve::{App, Server, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Aborts the test process if `f` runs past `limit` (a hung server must fail, not hang CI).
pub fn bounded<R>(limit: Duration, f: impl FnOnce() -> R) -> R {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if d.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("test exceeded {limit:?}: aborting");
        std::process::abort();
    });
    let r = f();
    done.store(true, Ordering::Release);
    r
}

/// Runs `body` against a CPU-backend server serving `app` on `threads` network threads
/// (each with `queues_per_thread` executors of at most `limit` in flight); returns the
/// body's result and the server's report after it stopped and drained.
pub fn with_server<R: Send>(
    app: &App,
    threads: usize,
    queues_per_thread: usize,
    limit: usize,
    cfg: ServerConfig,
    body: impl FnOnce(SocketAddr, &Server, &AtomicBool) -> R + Send,
) -> (R, ServeReport) {
    bounded(Duration::from_secs(120), || {
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let addr = server.local_addr().unwrap();
        let mut sets: Vec<_> = (0..queues_per_thread)
            .map(|_| cpu_workers(app, threads, 1024, cfg.idle).unwrap())
            .collect();
        let lanes = split_queues(
            sets.iter_mut()
                .enumerate()
                .map(|(i, w)| (format!("cpu{i}"), w.queues_mut()))
                .collect(),
            threads,
            limit,
        )
        .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| server.run(&cfg, app, lanes, &stop));
            let r = body(addr, &server, &stop);
            stop.store(true, Ordering::Release);
            let rep = h.join().unwrap().unwrap();
            (r, rep)
        })
    })
}

/// The defaults, with stats queries answered: the tests check the load generator's
/// accounting against the server's counters.
pub fn quick_cfg() -> ServerConfig {
    ServerConfig {
        stats: true,
        ..Default::default()
    }
}
