//! `gdr topo` as a user runs it: on trees built at run time, the hints it prints and how it
//! deals with a hostile capture (warnings on stderr, the rest on stdout, done quickly).

use gdr::topo::fixture::{FixtureFunction, TreeBuilder};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

mod common;

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

/// Runs `gdr topo ARGS`, killing it and failing the test when it takes longer than `limit`.
fn gdr_topo(args: &[&str], limit: Duration) -> Run {
    let mut child = Command::new(common::gdr_bin())
        .arg("topo")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("gdr topo {args:?} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
    }
}

/// A root port with, optionally, one endpoint that is no GPU peer (a SATA controller), in a
/// directory removed when dropped.
fn tree(name: &str, with_endpoint: bool) -> (TempDir, Option<PathBuf>) {
    let root = tempfile::Builder::new()
        .prefix(&format!("topo-cli-{name}-"))
        .tempdir()
        .unwrap();
    let mut t = TreeBuilder::create(root.path()).unwrap();
    let hb = t.host_bridge("pci0000:00").unwrap();
    let rp = t
        .add(
            &hb,
            FixtureFunction::new("0000:00:01.0", 0x8086, 0x352a, 0x060400),
        )
        .unwrap();
    let dev = with_endpoint.then(|| {
        t.add(
            &rp,
            FixtureFunction::new("0000:01:00.0", 0x8086, 0xa352, 0x010601),
        )
        .unwrap()
    });
    (root, dev)
}

#[test]
fn the_all_hint_is_for_those_without_all() {
    let (root, _) = tree("bridges-only", false);
    let dir = root.path().to_str().unwrap();
    let with_all = gdr_topo(&["--all", "--sysfs", dir], Duration::from_secs(10));
    assert!(with_all.success, "{}", with_all.stderr);
    assert!(
        with_all.stdout.contains("no devices to show"),
        "{}",
        with_all.stdout
    );
    assert!(
        !with_all.stdout.contains("--all"),
        "suggests the flag it was given: {}",
        with_all.stdout
    );

    let (root, _) = tree("sata-only", true);
    let dir = root.path().to_str().unwrap();
    let default = gdr_topo(&["--sysfs", dir], Duration::from_secs(10));
    assert!(
        default.stdout.contains("--all shows every endpoint"),
        "{}",
        default.stdout
    );
    let all = gdr_topo(&["--all", "--sysfs", dir], Duration::from_secs(10));
    assert!(all.stdout.contains("DEV0"), "{}", all.stdout);
}

#[test]
fn a_hostile_capture_gives_warnings_and_the_rest() {
    let (root, dev) = tree("hostile", true);
    let dev = root.path().join(dev.unwrap());
    let fifo = dev.join("numa_node");
    std::fs::remove_file(&fifo).unwrap();
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::fs::remove_file(dev.join("config")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dev.join("config")).unwrap();
    let run = gdr_topo(
        &["--all", "--sysfs", root.path().to_str().unwrap()],
        Duration::from_secs(5),
    );
    assert!(run.success, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("0000:01:00.0/numa_node: unreadable: not a regular file (a FIFO)"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("absolute link to /dev/zero refused"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.lines().all(|l| l.starts_with("gdr: warning: ")),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("DEV0"), "{}", run.stdout);
}

/// `--all` judges every pair in text as in JSON: on a tree of one GPU, two NICs and an NVMe
/// drive the text listed the 3 pairs with the GPU, the JSON all 6.
#[test]
fn all_judges_every_pair_in_text_as_in_json() {
    let root = tempfile::Builder::new()
        .prefix("topo-cli-all-pairs-")
        .tempdir()
        .unwrap();
    let mut t = TreeBuilder::create(root.path()).unwrap();
    let hb = t.host_bridge("pci0000:00").unwrap();
    let devices = [
        (1, 0x10de, 0x2330, 0x030200),
        (2, 0x15b3, 0x1021, 0x020000),
        (3, 0x15b3, 0x1021, 0x020000),
        (4, 0x144d, 0xa80a, 0x010802),
    ];
    for (i, vendor, device, class) in devices {
        let rp = t
            .add(
                &hb,
                FixtureFunction::new(&format!("0000:00:0{i}.0"), 0x8086, 0x352a, 0x060400),
            )
            .unwrap();
        t.add(
            &rp,
            FixtureFunction::new(&format!("0000:0{i}:00.0"), vendor, device, class),
        )
        .unwrap();
    }
    let dir = root.path().to_str().unwrap();
    let json = gdr_topo(
        &["--all", "--json", "--sysfs", dir],
        Duration::from_secs(10),
    );
    assert!(json.success, "{}", json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["pairs"].as_array().unwrap().len(), 6, "{}", json.stdout);
    let text = gdr_topo(&["--all", "--sysfs", dir], Duration::from_secs(10));
    assert!(text.success, "{}", text.stderr);
    let verdicts = text
        .stdout
        .split("Peer-to-peer verdicts:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", text.stdout));
    let lines = verdicts.lines().take_while(|l| l.starts_with("  ")).count();
    assert_eq!(lines, 6, "{}", text.stdout);
    // The default view keeps to the pairs with the GPU.
    let gpu = gdr_topo(&["--sysfs", dir], Duration::from_secs(10));
    let verdicts = gpu.stdout.split("Peer-to-peer verdicts:\n").nth(1).unwrap();
    assert_eq!(
        verdicts.lines().take_while(|l| l.starts_with("  ")).count(),
        3,
        "{}",
        gpu.stdout
    );
}
