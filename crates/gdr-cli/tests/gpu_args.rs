//! The GPU commands' arguments, checked before the GPU is opened: on a machine without a GPU
//! (as where this test runs) a bad argument must be reported as a bad argument, in one line,
//! not as a missing driver. On a GPU host the same runs end at the same line.

use std::process::Output;
use std::time::{Duration, Instant};

mod common;

/// Runs `gdr ARGS`, failing the test past 20 s (a run that got past its checks on a GPU).
fn gdr(args: &[&str]) -> Output {
    let mut child = common::spawn_gdr(args, false);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "gdr {args:?} ran past 20 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Each `(args, what)` ends with exit 2 and one line naming `what`, with nothing of the GPU,
/// CUDA or its driver in it.
fn assert_refused_before_the_gpu(cases: &[(&[&str], &str)]) {
    for (args, what) in cases {
        let out = gdr(args);
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("gdr: error: ") && lines[0].contains(what),
            "{args:?}: {:?} does not name {what:?}",
            lines[0]
        );
        for gpu_word in ["libcuda", "driver", "CUDA", "Vulkan", "GPU", "device"] {
            assert!(
                !lines[0].contains(gpu_word),
                "{args:?}: {:?} talks of the GPU",
                lines[0]
            );
        }
    }
}

#[test]
fn copy_commands_check_sizes_threads_and_budgets_before_the_gpu() {
    assert_refused_before_the_gpu(&[
        (&["copybw", "--budget-ms", "0"], "--budget-ms 0"),
        (
            &["copybw", "--budget-ms", "18446744073709551615"],
            "--budget-ms 18446744073709551615: must be from 1 to 60000",
        ),
        (&["copybw", "--sizes", "4K,2048G"], "--sizes 2048G"),
        (
            &["copybw", "--sizes", "18446744073709551615"],
            "must be from 1 to 1024G",
        ),
        (&["copybw", "--threads", "1,100000"], "--threads 100000"),
        (&["storebw", "--sizes", "4096G"], "--sizes 4096G"),
        (&["storebw", "--budget-ms", "60001"], "--budget-ms 60001"),
        (&["copylat", "--budget-ms", "0"], "--budget-ms 0"),
        (
            &["copylat", "--budget-ms", "18446744073709551615"],
            "--budget-ms",
        ),
        (&["apiperf", "--iters", "0"], "--iters 0"),
        (
            &["apiperf", "--iters", "18446744073709551615"],
            "--iters 18446744073709551615",
        ),
    ]);
}

#[test]
fn pplat_checks_rounds_warmup_and_timeout_before_the_gpu() {
    assert_refused_before_the_gpu(&[
        (&["pplat", "--timeout-ms", "0"], "--timeout-ms 0"),
        (
            &["pplat", "--timeout-ms", "18446744073709551615"],
            "--timeout-ms 18446744073709551615: must be from 1 to 60000",
        ),
        (&["pplat", "--rounds", "4294967295"], "--rounds 4294967295"),
        (&["pplat", "--warmup", "4294967295"], "--warmup 4294967295"),
    ]);
}

#[test]
fn mq_bench_checks_every_count_and_size_before_the_gpu() {
    let mq = |extra: &'static [&'static str]| -> Vec<&'static str> {
        let mut a = vec!["mq", "bench"];
        a.extend_from_slice(extra);
        a
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (mq(&["--sizes", "64,0"]), "--sizes 0"),
        (mq(&["--sizes", "4294967295"]), "--sizes 4294967295"),
        (mq(&["--warps", "0"]), "--warps 0"),
        (mq(&["--warps", "33"]), "--warps 33: must be from 1 to 32"),
        (mq(&["--ms", "0"]), "--ms 0"),
        (mq(&["--ms", "18446744073709551615"]), "--ms"),
        (mq(&["--queues", "1,100000"]), "--queues 100000"),
        (mq(&["--batch", "4294967295"]), "--batch 4294967295"),
        (mq(&["--iters", "18446744073709551615"]), "--iters"),
        (mq(&["--rounds", "4294967295"]), "--rounds 4294967295"),
        (mq(&["--latency-size", "0"]), "--latency-size 0"),
    ];
    let cases: Vec<(&[&str], &str)> = cases.iter().map(|(a, w)| (&a[..], *w)).collect();
    assert_refused_before_the_gpu(&cases);
}
