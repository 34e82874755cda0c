//! `gdr serve` and `gdr load` as a user runs them: exit codes, error lines and defaults,
//! through the built binary, on 127.0.0.1 only (the CPU mode: no GPU needed).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// What a finished `gdr` run left behind.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    wall: Duration,
    /// User + system CPU time of the process (its threads included).
    cpu: Duration,
}

/// Runs `gdr ARGS`, killed (and the test failed) if it runs past `limit`.
// The child is reaped by wait4 (for its own resource use), which clippy does not see.
#[allow(clippy::zombie_processes)]
fn gdr(args: &[&str], limit: Duration) -> Run {
    let start = Instant::now();
    let mut child = common::spawn_gdr(args, true);
    let pid = child.id() as libc::pid_t;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }),
    );
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data, written by wait4 for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: pid is our unreaped child; pointers to live locals. wait4 (not Child::wait)
        // gives this one child's resource use, whatever else the test process runs.
        let rc = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(rc >= 0, "wait4: {}", std::io::Error::last_os_error());
        if rc == pid {
            break (status, usage);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gdr {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: readers.0.join().unwrap(),
        stderr: readers.1.join().unwrap(),
        wall: start.elapsed(),
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    }
}

/// `gdr serve` in the CPU mode on a free loopback port, then `extra`.
fn cpu_serve<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["serve", "--mode", "cpu", "--listen", "127.0.0.1:0"];
    v.extend_from_slice(extra);
    v
}

/// The run failed with exit code 2 and one `gdr: error:` line that mentions `what`.
fn assert_one_error_line(r: &Run, what: &str) {
    assert_eq!(r.code, Some(2), "stderr: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{:?}", r.stderr);
    assert!(
        lines[0].starts_with("gdr: error: ") && lines[0].contains(what),
        "{:?}",
        lines[0]
    );
}

#[test]
fn durations_a_duration_cannot_hold_are_refused_in_one_line() {
    for d in ["1e20", "nan", "inf", "-1", "86401"] {
        let arg = format!("--duration={d}");
        let r = gdr(
            &["load", "--target", "127.0.0.1:9", "--no-server-stats", &arg],
            Duration::from_secs(20),
        );
        assert_one_error_line(&r, "--duration");
        let r = gdr(
            &["serve", "--mode", "cpu", "--listen", "127.0.0.1:0", &arg],
            Duration::from_secs(20),
        );
        assert_one_error_line(&r, "--duration");
    }
}

#[test]
fn serve_duration_is_serving_time_after_setup_and_the_cpu_mode_names_no_gpu() {
    // Eight network threads and eight CPU workers on a small machine: setup takes a while.
    let r = gdr(
        &cpu_serve(&["--threads", "8", "--duration", "0.5", "--json"]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON totals");
    let served = v["report"]["elapsed_s"].as_f64().expect("elapsed_s");
    let setup = v["report"]["setup_s"].as_f64().expect("setup_s reported");
    assert!(served >= 0.5, "served {served} s of the 0.5 asked for");
    assert!(served < 5.0, "served {served} s");
    assert!(
        r.wall.as_secs_f64() >= setup + 0.5,
        "wall {:?}, setup {setup} s",
        r.wall
    );
    assert_eq!(v["gpus"], serde_json::json!([]));
    assert!(
        r.stderr.contains("no GPU") && !r.stderr.contains("GPU(s)"),
        "{}",
        r.stderr
    );
}

#[test]
fn socket_sharing_is_named_in_the_totals_and_a_bad_name_is_refused() {
    let r = gdr(
        &cpu_serve(&[
            "--threads",
            "2",
            "--sockets=per-thread",
            "--duration=0.2",
            "--json",
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON totals");
    assert_eq!(v["report"]["sockets"], "per-thread");
    assert!(r.stderr.contains("(per-thread sockets)"), "{}", r.stderr);
    let r = gdr(
        &cpu_serve(&["--threads", "2", "--sockets", "stealing", "--duration=0.2"]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(r.stderr.contains("(stealing sockets)"), "{}", r.stderr);
    assert!(
        r.stdout.contains("(stealing sockets), served")
            && r.stdout.contains("taken from other threads' sockets 0"),
        "{}",
        r.stdout
    );
    let r = gdr(&cpu_serve(&["--sockets", "many"]), Duration::from_secs(20));
    assert_one_error_line(&r, "shared, per-thread, stealing");
}

#[test]
fn load_fails_with_status_1_when_nothing_is_answered() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let r = gdr(
        &[
            "load",
            "--target",
            &port.to_string(),
            "--duration",
            "0.3",
            "--timeout-ms",
            "100",
            "--no-server-stats",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(
        r.code,
        Some(1),
        "stdout: {}\nstderr: {}",
        r.stdout,
        r.stderr
    );
    assert!(
        r.stderr
            .contains("gdr load: FAILED: no request was answered"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stdout.contains("p50"),
        "no latency without answers: {}",
        r.stdout
    );
}

#[test]
fn load_refuses_a_request_larger_than_a_datagram() {
    let r = gdr(
        &["load", "--target", "127.0.0.1:9", "--size", "65492"],
        Duration::from_secs(20),
    );
    assert_one_error_line(&r, "--size at most 65491");
    let r = gdr(
        &[
            "load",
            "--target",
            "127.0.0.1:9",
            "--app",
            "vecadd",
            "--n",
            "100000",
        ],
        Duration::from_secs(20),
    );
    assert_one_error_line(&r, "--n at most 8186");
}

#[test]
fn an_idle_cpu_mode_server_uses_little_cpu() {
    // Two seconds of serving nothing. Polling with naps took some 25 % of a core (0.5 s of
    // CPU here); backing off takes a few percent. The bound leaves room for start-up and a
    // busy machine.
    let r = gdr(&cpu_serve(&["--duration", "2"]), Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(
        r.cpu < Duration::from_millis(200),
        "idle server used {:?} of CPU in {:?}",
        r.cpu,
        r.wall
    );
}

/// Numbers that size buffers are refused in one line before anything is allocated: before,
/// `--size 18446744073709551615` wrapped and grew to 23.5 GB, `--batch 100000` aborted
/// after asking for 6.55 GB, `--threads 5000` panicked, and `serve --batch 100000` printed
/// "ready" and then aborted.
#[test]
fn numbers_past_their_bounds_are_refused_in_one_line() {
    let t = Duration::from_secs(20);
    let load = |extra: &[&str]| {
        let mut a = vec!["load", "--target", "127.0.0.1:9", "--no-server-stats"];
        a.extend_from_slice(extra);
        gdr(&a, t)
    };
    for (args, what) in [
        (
            &["--size", "18446744073709551615"][..],
            "--size at most 65491",
        ),
        (
            &["--app", "raw", "--size", "18446744073709551600"],
            "--size at most 65491",
        ),
        (
            &["--app", "vecadd", "--n", "18446744073709551615"],
            "--n at most 8186",
        ),
        (&["--batch", "100000"], "--batch 100000: at most 1024"),
        (&["--batch", "10000000"], "--batch 10000000: at most 1024"),
        (&["--threads", "5000"], "--threads 5000: at most 1024"),
        (&["--threads", "10000"], "--threads 10000: at most 1024"),
        (&["--outstanding", "1000000"], "at most 65536"),
        (&["--timeout-ms", "18446744073709551615"], "at most 60000"),
        (
            &["--app", "lenet", "--images", "100000000"],
            "--images 100000000: at most 1048576",
        ),
        (&["--rate", "1e300"], "--rate"),
        (&["--duration=-1"], "more than 0"),
        (&["--duration", "0"], "more than 0"),
        // Refused up front: 0 ms became 1 ms, and 0 requests ran, then failed.
        (&["--timeout-ms", "0"], "--timeout-ms 0"),
        (&["--requests", "0"], "--requests 0: nothing to send"),
    ] {
        let r = load(args);
        assert_one_error_line(&r, what);
        assert!(
            r.wall < Duration::from_secs(5),
            "{args:?} took {:?}",
            r.wall
        );
    }
    let serve = |extra: &[&str]| {
        let mut a = vec![
            "serve",
            "--mode",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--duration",
            "0.5",
        ];
        a.extend_from_slice(extra);
        gdr(&a, t)
    };
    for (args, what) in [
        (
            &["--batch", "100000", "--max-payload", "65491"][..],
            "--batch 100000: at most 1024",
        ),
        (&["--batch", "1000000"], "--batch 1000000: at most 1024"),
        (&["--threads", "100000"], "--threads 100000: at most 1024"),
        (&["--max-payload", "65492"], "65492"),
        (
            &["--gpus", &vec!["0"; 65].join(",")],
            "--gpus 65: at most 64",
        ),
        // Each within its bound, together past any machine's memory: 16 GiB rings per queue
        // pair, 1024 pairs.
        (
            &[
                "--threads",
                "1024",
                "--slots",
                "131072",
                "--max-payload",
                "65491",
            ],
            "would take",
        ),
        // GPU-only options mean nothing to the CPU mode.
        (&["--warps", "4"], "--warps"),
        (&["--cluster", "2"], "--cluster"),
        (&["--rx-format", "words"], "--rx-format"),
        (&["--profile"], "--profile"),
        (
            &["--max-in-flight", "18446744073709551615"],
            "--max-in-flight 18446744073709551615: at most 16777216",
        ),
    ] {
        let r = serve(args);
        assert_one_error_line(&r, what);
        assert!(!r.stderr.contains("ready"), "{args:?}: {}", r.stderr);
    }
}

/// `--app-file` reads a regular file of at most 1 MiB: /dev/zero read until memory ran out and
/// a FIFO blocked forever. A CUDA app in the CPU mode is refused at start, not answered with
/// an error status for every request after "ready".
#[test]
fn app_files_that_never_end_or_need_a_gpu_are_refused_at_start() {
    let t = Duration::from_secs(20);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("app.cu");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = dir.path().join("big.cu");
    std::fs::write(&big, vec![b' '; (1 << 20) + 1]).unwrap();
    let user = dir.path().join("user.cu");
    std::fs::write(
        &user,
        "__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, const unsigned char \
         *req, unsigned int len, unsigned char *resp, unsigned int cap) { return 0; }\n",
    )
    .unwrap();
    for (file, mode, what) in [
        ("/dev/zero", "gpu-queue", "not a regular file"),
        (fifo.to_str().unwrap(), "gpu-queue", "not a regular file"),
        (
            big.to_str().unwrap(),
            "gpu-queue",
            "longer than 1048576 bytes",
        ),
        (
            dir.path().to_str().unwrap(),
            "gpu-queue",
            "not a regular file",
        ),
        (user.to_str().unwrap(), "cpu", "runs only on a GPU"),
    ] {
        let r = gdr(
            &[
                "serve",
                "--mode",
                mode,
                "--listen",
                "127.0.0.1:0",
                "--app-file",
                file,
            ],
            t,
        );
        assert_one_error_line(&r, what);
        assert!(!r.stderr.contains("ready"), "{}", r.stderr);
        assert!(r.wall < Duration::from_secs(5), "{file}: {:?}", r.wall);
    }
}

/// `gdr load` reports in words (before: `Closed { outstanding: 1 }`, `Echo { size: 64 }`), and
/// `--rate 0.5 --duration 1` sends its first request at once instead of nothing.
#[test]
fn load_reports_in_words_and_a_slow_rate_still_sends() {
    let mut server = Command::new(common::gdr_bin())
        .args([
            "serve",
            "--mode",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--duration",
            "20",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdr serve runs");
    let mut err = std::io::BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    // `gdr serve: ready on 127.0.0.1:PORT: app echo ...`
    let addr = line
        .split("ready on ")
        .nth(1)
        .and_then(|r| r.split(": ").next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let r = gdr(
        &[
            "load",
            "--target",
            &addr,
            "--no-server-stats",
            "--duration",
            "0.3",
        ],
        Duration::from_secs(20),
    );
    let r2 = gdr(
        &[
            "load",
            "--target",
            &addr,
            "--no-server-stats",
            "--rate",
            "0.5",
            "--duration",
            "1",
        ],
        Duration::from_secs(20),
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.starts_with(
            "gdr load: closed loop, 1 outstanding per thread, echo of 64 B, 1 thread(s)"
        ),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("errors 0 "), "{}", r.stdout);
    assert!(!r.stdout.contains('{'), "{}", r.stdout);
    assert_eq!(r2.code, Some(0), "{}{}", r2.stdout, r2.stderr);
    assert!(r2.stdout.contains("sent 1  ok 1 "), "{}", r2.stdout);
}
