//! `gdr serve` and `gdr load` as a user runs them: exit codes, error lines and defaults,
//! through the built binary, on 127.0.0.1 only (the CPU mode: no GPU needed).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished `gdr` run left behind.
struct Run {
    code: Option<i32>,
    stderr: String,
}

/// Runs `gdr ARGS`, killed (and the test failed) if it runs past `limit`.
// The child is reaped by wait4 (for its own resource use), which clippy does not see.
#[allow(clippy::zombie_processes)]
fn gdr(args: &[&str], limit: Duration) -> Run {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdr"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdr runs");
    let pid = child.id() as libc::pid_t;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }),
    );
    let (status, _usage) = loop {
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
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stderr: readers.1.join().unwrap(),
    }
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
