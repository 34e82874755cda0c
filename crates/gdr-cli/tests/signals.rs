//! `gdr serve` and `gdr load` stopped by SIGINT or SIGTERM, and held to `--duration`, with a
//! thousand threads on whatever machine runs the tests (the CPU mode, 127.0.0.1 only: no GPU).
//! Each run is bounded: a process still running past its limit is killed and the test fails.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

/// One of these runs at a time: each takes a thousand threads and hundreds of MiB.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A `gdr` child whose stderr lines arrive on a channel as they are written.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: std::thread::JoinHandle<String>,
}

fn start(args: &[&str]) -> Running {
    let mut child = common::spawn_gdr(args, true);
    let (tx, lines) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    Running {
        child,
        lines,
        stdout,
    }
}

impl Running {
    /// Waits for a stderr line containing `what`; fails the test (killing the child) past
    /// `limit`.
    fn wait_for_line(&mut self, what: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(_) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("no {what:?} line within {limit:?}");
                }
            }
        }
    }

    fn signal(&self, sig: libc::c_int) -> Instant {
        // SAFETY: kill(2) on our own child's pid, which it keeps until we reap it.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
        Instant::now()
    }

    /// Waits for the exit: its status, how long since `since`, stdout, and the stderr lines
    /// not read yet. Past `limit` the child is killed and the test fails.
    fn finish(mut self, since: Instant, limit: Duration) -> (ExitStatus, Duration, String, String) {
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let took = since.elapsed();
                let rest: Vec<String> = self.lines.try_iter().collect();
                return (st, took, self.stdout.join().unwrap(), rest.join("\n"));
            }
            if since.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("still running {limit:?} after the signal or start");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What "within a second" allows: the second the issue asks for, and nothing more.
const SECOND: Duration = Duration::from_secs(1);

/// The bound for `gdr load` with 1024 sending threads: the second of the goal. A stop waits
/// for each thread to be scheduled once more, so the threads must not keep the cores busy
/// while they wait (they sleep until an answer, an expiry or at most 100 ms), and a stop during
/// their start starts no more of them.
const LOAD_STOP_BOUND: Duration = SECOND;

fn serve_args(threads: &str, slots: &str) -> Vec<String> {
    [
        "serve",
        "--mode",
        "cpu",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        threads,
        "--slots",
        slots,
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A signal during setup ended the run only once setup was over, which with a thousand
/// threads on two cores was minutes later. Now it ends the process as the signal's default
/// would: there is nothing to drain yet.
#[test]
fn a_signal_during_setup_ends_serve_within_a_second() {
    use std::os::unix::process::ExitStatusExt;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let r = start(&strs(&serve_args("1024", "128")));
        // Well before a thousand queue pairs and two thousand threads are set up.
        std::thread::sleep(Duration::from_millis(150));
        let t = r.signal(sig);
        let (st, took, _, err) = r.finish(t, Duration::from_secs(30));
        assert!(
            took <= SECOND,
            "signal {sig}: ended {took:?} after it; {err}"
        );
        // Ended by the signal itself, or (had setup been over already) as a stop.
        assert!(
            st.signal() == Some(sig) || st.code() == Some(0),
            "signal {sig}: {st:?}; {err}"
        );
    }
}

/// Serving with a thousand network threads and CPU workers: a signal drains and prints the
/// totals within a second (it took minutes: a thousand workers napping 1 ms each kept two
/// cores busy), and a second signal is not needed.
#[test]
fn a_signal_while_serving_ends_serve_within_a_second_with_its_totals() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut r = start(&strs(&serve_args("1024", "64")));
        r.wait_for_line("gdr serve: ready on", Duration::from_secs(60));
        // Serving for a moment first: every thread started and idle.
        std::thread::sleep(Duration::from_millis(500));
        let t = r.signal(sig);
        let (st, took, out, err) = r.finish(t, Duration::from_secs(30));
        assert_eq!(st.code(), Some(0), "signal {sig}: {err}");
        assert!(
            took <= SECOND,
            "signal {sig}: ended {took:?} after it; {err}"
        );
        assert!(
            out.contains("1024 thread(s) (shared sockets), served"),
            "{out}"
        );
    }
}

/// `--duration 1` with a thousand threads served for about a second (it served for minutes).
#[test]
fn serve_duration_holds_with_a_thousand_threads() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut args = serve_args("1024", "64");
    args.extend(["--duration", "1", "--json"].map(String::from));
    let mut r = start(&strs(&args));
    r.wait_for_line("gdr serve: ready on", Duration::from_secs(60));
    let ready = Instant::now();
    let (st, took, out, err) = r.finish(ready, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
    let served = v["report"]["elapsed_s"].as_f64().unwrap();
    // Within 10 % or a second of the duration, from ready to the end of the process too.
    assert!((served - 1.0).abs() <= 1.0, "served {served} s");
    assert!(took <= Duration::from_secs(2), "ended {took:?} after ready");
}

fn load_args(target: &str, duration: &str) -> Vec<String> {
    [
        "load",
        "--target",
        target,
        "--threads",
        "1024",
        "--outstanding",
        "65536",
        "--duration",
        duration,
        "--no-server-stats",
    ]
    .map(String::from)
    .to_vec()
}

/// A port that nothing listens on, on loopback (bound, then closed).
fn closed_port() -> String {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().to_string()
}

/// `gdr load --threads 1024 --outstanding 65536 --duration 1` ran 13 s and more: every thread
/// counted its second from its own start and swept all its outstanding requests every 10 ms.
/// Now it sends for the duration and waits --timeout-ms for the last answers.
#[test]
fn load_duration_holds_with_a_thousand_threads() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut args = load_args(&closed_port(), "1");
    args.extend(["--timeout-ms", "100"].map(String::from));
    let r = start(&strs(&args));
    let (st, took, out, err) = r.finish(Instant::now(), Duration::from_secs(60));
    // Nothing answered: exit 1, after the duration and the timeout, within a second more.
    assert_eq!(st.code(), Some(1), "{out}{err}");
    assert!(took <= Duration::from_millis(2100), "took {took:?}: {out}");
}

/// SIGINT or SIGTERM in the middle of a long load run ends it within a second, with its
/// report: the answers still due are waited for briefly, not for the whole --timeout-ms.
#[test]
fn a_signal_ends_load_within_a_second_with_its_report() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut args = load_args(&closed_port(), "60");
        args.extend(["--timeout-ms", "60000"].map(String::from));
        let r = start(&strs(&args));
        std::thread::sleep(Duration::from_millis(1500));
        let t = r.signal(sig);
        let (st, took, out, err) = r.finish(t, Duration::from_secs(60));
        assert!(
            took <= LOAD_STOP_BOUND,
            "signal {sig}: ended {took:?} after it; {err}"
        );
        assert_eq!(st.code(), Some(1), "signal {sig}: {err}");
        assert!(out.contains("1024 thread(s)"), "{out}");
    }
}
