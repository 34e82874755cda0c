//! `scripts/lanes.sh` (the bundle's `lanes.sh`) over a stand-in `run.sh` that records how it
//! was started: which GPU, which parts, in which order, on which CPUs, installed once, and what
//! happens when a step fails or no time is left. The script is compiled in, so the test runs the
//! same from any directory and on a GPU host's bundle.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use tempfile::TempDir;

const LANES: &str = include_str!("../../../scripts/lanes.sh");

/// A stand-in run.sh: records its environment in OUTDIR/env.txt, fails when a part is named
/// `fail`, sleeps when one is named `slow`.
const FAKE_RUN: &str = r#"#!/usr/bin/env bash
mkdir -p "$1"
aff=$(taskset -pc $$ 2>/dev/null | sed 's/.*: //')
echo "ONLY=[$ONLY] CVD=[${CUDA_VISIBLE_DEVICES:-}] GPU=[${GPU_INDEX:-}] INST=[${GDR_RUN_INSTALLED:-}] ORDER=[${CUDA_DEVICE_ORDER:-}] AFF=[$aff]" > "$1/env.txt"
echo "started $(date +%s%N) $ONLY" >> "$(dirname "$1")/order.log"
[[ " $ONLY " == *" slow "* ]] && sleep 3
echo "ran [$ONLY]"
[[ " $ONLY " == *" fail "* ]] && exit 1
exit 0
"#;

fn bundle() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("lanes.sh", LANES), ("run.sh", FAKE_RUN)] {
        let p = dir.path().join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

fn lanes(b: &Path, out: &Path, limit: &str, lanes: &[&str]) -> Output {
    Command::new("bash")
        .arg(b.join("lanes.sh"))
        .arg(out)
        .args(lanes)
        .env("LIMIT", limit)
        .env_remove("GDR_RUN_INSTALLED")
        .output()
        .unwrap()
}

fn env_of(out: &Path, tag: &str) -> String {
    fs::read_to_string(out.join(tag).join("env.txt"))
        .unwrap_or_else(|e| panic!("{tag}: no env.txt ({e})"))
}

#[test]
fn each_lane_gets_its_gpu_and_each_group_its_steps_in_order() {
    let b = bundle();
    let out = b.path().join("out");
    let r = lanes(
        b.path(),
        &out,
        "120",
        &["@0:tests alloc;ucx", "faults|sleep:1;python serve"],
    );
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{stdout}");
    assert!(stdout.contains("every step exited 0"), "{stdout}");
    // Installed once, before any step, with no part named.
    let install = env_of(&out, "install");
    assert!(
        install.contains("ONLY=[none]") && install.contains("INST=[]"),
        "{install}"
    );
    let l0 = env_of(&out, "L0G0S0");
    assert!(l0.contains("ONLY=[tests alloc]"), "{l0}");
    assert!(l0.contains("CVD=[0]") && l0.contains("GPU=[0]") && l0.contains("INST=[1]"));
    assert!(
        l0.contains("ORDER=[PCI_BUS_ID]") && l0.contains("AFF=[0]"),
        "{l0}"
    );
    assert!(env_of(&out, "L0G0S1").contains("ONLY=[ucx] CVD=[0]"));
    assert!(env_of(&out, "L1G0S0").contains("ONLY=[faults] CVD=[1] GPU=[1]"));
    // The sleep is step 0 of group 1 and leaves no folder; the next step is step 1.
    assert!(!out.join("L1G1S0").exists());
    assert!(env_of(&out, "L1G1S1").contains("ONLY=[python serve] CVD=[1]"));
    // Within a group, one step after another.
    let order = fs::read_to_string(out.join("order.log")).unwrap();
    let pos = |p: &str| {
        order
            .find(p)
            .unwrap_or_else(|| panic!("{p} not run: {order}"))
    };
    assert!(pos(" tests alloc") < pos(" ucx"), "{order}");
    let summary = fs::read_to_string(out.join("summary.txt")).unwrap();
    for tag in ["L0G0S0", "L0G0S1", "L1G0S0", "L1G1S1"] {
        assert!(summary.contains(&format!("== {tag}\n")), "{tag}: {summary}");
    }
    assert!(summary.contains("rc=0 step=[ucx] cpus=[0]"), "{summary}");
}

#[test]
fn a_failed_step_fails_the_run_and_the_others_still_run() {
    let b = bundle();
    let out = b.path().join("out");
    let r = lanes(b.path(), &out, "120", &["fail;tests", "alloc"]);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert_eq!(r.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("a step failed or was skipped"), "{stdout}");
    let summary = fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(summary.contains("rc=1 step=[fail]"), "{summary}");
    assert!(summary.contains("rc=0 step=[tests]"), "{summary}");
    assert!(summary.contains("rc=0 step=[alloc]"), "{summary}");
}

#[test]
fn a_step_without_time_left_is_skipped_and_said() {
    let b = bundle();
    let out = b.path().join("out");
    // 22 s: the first step starts; after its 3 s, fewer than 20 s are left for the second.
    let r = lanes(b.path(), &out, "22", &["slow;tests"]);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert_eq!(r.status.code(), Some(1), "{stdout}");
    let second = fs::read_to_string(out.join("L0G0S1.txt")).unwrap();
    assert!(
        second.starts_with("skipped: ") && second.contains("step=[tests]"),
        "{second}"
    );
    assert!(!out.join("L0G0S1").exists(), "the skipped step ran");
}

#[test]
fn bad_usage_is_refused_before_anything_runs() {
    let b = bundle();
    let out = b.path().join("out");
    let r = lanes(b.path(), &out, "120", &[]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stdout).contains("usage: lanes.sh"));
    let r = lanes(b.path(), &out, "ten", &["tests"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&r.stdout).contains("LIMIT must be a number"));
    assert!(
        !out.join("install").exists(),
        "installed despite the bad LIMIT"
    );
}
