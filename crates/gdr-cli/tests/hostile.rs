//! The `gdr` binary against what a hostile or broken machine gives it: a libcuda that reports
//! a negative device count, and an output that cannot be written. Each must end in at most one
//! clear line, never a panic, a backtrace or an allocation until abort.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `gdr ARGS` with stdout to `stdout` and `env` set, failing the test past `limit`.
fn gdr(args: &[&str], stdout: Stdio, env: &[(&str, &Path)], limit: Duration) -> Output {
    let mut cmd = Command::new(common::gdr_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("gdr runs");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("gdr {args:?} ran past {limit:?}: {}", text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A libcuda.so.1 in `dir` that has every entry point gdr loads, each returning success without
/// doing anything, except `cuDeviceGetCount`, which reports -5 devices. The names come from
/// gdr's own table of the driver API (compiled in: the tests run where the source is not).
fn negative_count_libcuda(dir: &Path) {
    const SYS: &str = include_str!("../../gdr-cuda/src/sys.rs");
    let mut names: Vec<&str> = SYS
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|n| n.starts_with("cu") && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.contains(&"cuDeviceGetCount"), "{names:?}");
    let mut c = String::from("static const char *msg = \"fake\";\n");
    for n in names {
        c.push_str(&match n {
            "cuDeviceGetCount" => "int cuDeviceGetCount(int *n) { *n = -5; return 0; }\n".into(),
            "cuGetErrorName" | "cuGetErrorString" => {
                format!("int {n}(int rc, const char **s) {{ *s = msg; return 0; }}\n")
            }
            _ => format!("int {n}() {{ return 0; }}\n"),
        });
    }
    let src = dir.join("fake_cuda.c");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-w", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .output()
        .expect("cc");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `n as usize` on cuDeviceGetCount's -5 made `gdr info` and `gdr check` allocate until they
/// aborted; the count is now checked and the answer says what the driver reported.
#[test]
fn a_driver_reporting_minus_five_devices_is_named_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    negative_count_libcuda(dir.path());
    let env = [("LD_LIBRARY_PATH", dir.path())];
    for args in [&["info"][..], &["info", "--json"], &["check"]] {
        let out = gdr(args, Stdio::piped(), &env, Duration::from_secs(30));
        let all = text(&out.stdout) + &text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {all}");
        assert!(
            all.contains("cuDeviceGetCount reported -5, which no working driver reports"),
            "{args:?}: {all}"
        );
        assert!(!all.contains("panicked"), "{all}");
    }
}

/// A write to stdout that fails (`> /dev/full`) ends every command with one line and exit 2;
/// `gdr info > /dev/full` panicked with a backtrace (exit 101), `gdr --help` said nothing.
#[test]
fn a_full_output_is_one_line_and_exit_2_for_every_command() {
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full here");
        return;
    }
    let fixture = std::env::var_os("GDR_TOPO_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../gdr-pci/tests/fixtures/topo")
        })
        .join("two-socket");
    let fixture = fixture.to_str().unwrap();
    for args in [
        &["info"][..],
        &["info", "--json"],
        &["check"],
        &["check", "--json"],
        &["topo", "--sysfs", fixture],
        &["topo", "--sysfs", fixture, "--json"],
        &["--help"],
        &["topo", "--help"],
        &["--version"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = gdr(args, full.into(), &[], Duration::from_secs(30));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.ends_with(
                "gdr: error: cannot write the output: No space left on device (os error 28)\n"
            ),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `gdr help --help` is help, not a usage error (it exited 2).
#[test]
fn help_about_help_is_help() {
    for args in [&["help", "--help"][..], &["help", "topo", "-h"]] {
        let out = gdr(args, Stdio::piped(), &[], Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("Usage: gdr"),
            "{}",
            text(&out.stdout)
        );
    }
}

/// `gdr info` and `gdr check` said each missing library's reason twice (its status line and the
/// Missing list); now once, in the Missing list.
#[test]
fn each_reason_is_printed_once() {
    let json = gdr(
        &["info", "--json"],
        Stdio::piped(),
        &[],
        Duration::from_secs(30),
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let reasons: Vec<String> = [
        "cuda_error",
        "nvml_error",
        "nvrtc_error",
        "vulkan_loader_error",
        "gdrdrv_error",
    ]
    .iter()
    .filter_map(|k| v[k].as_str().map(String::from))
    .filter(|r| !r.is_empty())
    .collect();
    for cmd in ["info", "check"] {
        let out = gdr(&[cmd], Stdio::piped(), &[], Duration::from_secs(60));
        let t = text(&out.stdout);
        for r in &reasons {
            assert!(
                t.matches(r.as_str()).count() <= 1,
                "{cmd}: {r:?} more than once:\n{t}"
            );
        }
    }
}

/// A FIFO named by an option or a variable is refused, not opened: the loader (`--lib`,
/// `GDR_ALLOC_LIB`, `GDR_NVRTC`) and the reader of `--app-file` would wait for a writer
/// forever. One shared check (`gdr::regular_file`) for every such path.
#[test]
fn a_fifo_named_by_an_option_or_a_variable_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path in a directory of our own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = fifo.to_str().unwrap();
    let limit = Duration::from_secs(30);
    let said = |out: &Output| text(&out.stdout) + &text(&out.stderr);
    let refused = "fifo: not a regular file (a FIFO); not opened";
    for (args, env) in [
        (&["run", "--lib", f, "--", "true"][..], &[][..]),
        (
            &["run", "--", "true"],
            &[("GDR_ALLOC_LIB", fifo.as_path())][..],
        ),
        (
            &["serve", "--app-file", f, "--listen", "127.0.0.1:0"],
            &[][..],
        ),
    ] {
        let out = gdr(args, Stdio::piped(), env, limit);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
        assert!(said(&out).contains(refused), "{args:?}: {}", said(&out));
    }
    // `gdr info` goes on without NVRTC and says why.
    let out = gdr(
        &["info"],
        Stdio::piped(),
        &[("GDR_NVRTC", fifo.as_path())],
        limit,
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(said(&out).contains(refused), "{}", said(&out));
}
