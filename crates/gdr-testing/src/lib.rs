//! gdr-testing: the gate for tests that need a GPU, shared by the tests of the gdr crates above gdr-cuda
//! (a dev-dependency only; it is no part of the library).
//!
//! Without a usable GPU a GPU test prints `skipped: no GPU: <test name>` (and why on the next
//! line) and passes, so `cargo test` works anywhere; with `GDR_REQUIRE_GPU=1` (the bundle runner
//! on GPU hosts) it fails instead, so a broken driver setup cannot pass for a skipped test.
//!
//! cargo counts a skipped test as passed and hides its output, so each skip is also appended to
//! the file that `GDR_SKIP_LOG` names: scripts/test.sh counts those lines and reports them apart
//! from the tests that ran.
//!
//! # Example
//!
//! A GPU test starts with the gate and returns when it answers `None`:
//!
//! ```
//! use gdr::cuda::{memcpy_dtoh, memcpy_htod, DeviceBuffer};
//!
//! fn a_device_buffer_keeps_what_is_written() {
//!     let Some(ctx) = gdr_testing::gpu_context("a_device_buffer_keeps_what_is_written") else {
//!         return; // printed and logged as skipped (or panicked under GDR_REQUIRE_GPU=1)
//!     };
//!     let buf = DeviceBuffer::new(&ctx, 64).unwrap();
//!     memcpy_htod(&buf, 0, &[7; 64]).unwrap();
//!     let mut back = [0u8; 64];
//!     memcpy_dtoh(&mut back, &buf, 0).unwrap();
//!     assert_eq!(back, [7; 64]);
//! }
//!
//! a_device_buffer_keeps_what_is_written();
//! assert_eq!(gdr_testing::skip_line("t"), "skipped: no GPU: t");
//! ```

use gdr::cuda::{Context, Device};
use std::io::Write;

/// The environment variable naming the file that gets one `skipped: no GPU: <test name>` line
/// per skipped test.
pub const SKIP_LOG_ENV: &str = "GDR_SKIP_LOG";

/// True when `GDR_REQUIRE_GPU=1`.
pub fn gpu_required() -> bool {
    std::env::var("GDR_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// A context on GPU 0 for test `name`, or `None` after printing why the test is skipped.
///
/// # Panics
/// When no GPU is usable and `GDR_REQUIRE_GPU=1`.
pub fn gpu_context(name: &str) -> Option<Context> {
    match Device::get(0).and_then(Context::new) {
        Ok(ctx) => Some(ctx),
        Err(e) => skip_or_fail(name, &e.to_string()),
    }
}

/// Prints and records the skip of test `name` (its function's name), or panics under
/// `GDR_REQUIRE_GPU=1`.
///
/// # Panics
/// Under `GDR_REQUIRE_GPU=1`, and when `GDR_SKIP_LOG` is set but cannot be appended to (a skip
/// that cannot be counted must not pass unseen).
pub fn skip_or_fail<T>(name: &str, why: &str) -> Option<T> {
    if gpu_required() {
        panic!("{name}: GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
    }
    println!("{}", skip_line(name));
    println!("  why: {why}");
    record_skip(name);
    None
}

/// The uniform line of a skipped test, as printed and as logged.
pub fn skip_line(name: &str) -> String {
    format!("skipped: no GPU: {name}")
}

/// Appends [`skip_line`] to the file `GDR_SKIP_LOG` names, if it is set.
///
/// # Panics
/// When the file cannot be opened or written.
pub fn record_skip(name: &str) {
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    if let Err(e) = append_skip(std::path::Path::new(&path), name) {
        panic!(
            "{name}: cannot record the skip in {SKIP_LOG_ENV}={}: {e}",
            std::path::Path::new(&path).display()
        );
    }
}

/// Appends [`skip_line`] for `name` to `path`.
pub fn append_skip(path: &std::path::Path, name: &str) -> std::io::Result<()> {
    let line = format!("{}\n", skip_line(name));
    // One write of one short line to an O_APPEND file: lines from tests running in parallel
    // threads and processes land whole, never interleaved.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_from_parallel_threads_land_as_whole_lines() {
        let path = std::env::temp_dir().join(format!("gdr-skip-log-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        append_skip(&path, &format!("thread_{t}_test_{i}")).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 800);
        lines.sort_unstable();
        lines.dedup();
        assert_eq!(lines.len(), 800, "a line was torn or doubled");
        assert!(lines
            .iter()
            .all(|l| l.starts_with("skipped: no GPU: thread_")));
    }
}
