//! Shared by the CLI tests that run the binary.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `gdr` binary under test: cargo's, or `$GDR_BIN` (the GPU bundle's runner points it at
/// the bundled one, since cargo's path does not exist there).
pub fn gdr_bin() -> PathBuf {
    std::env::var_os("GDR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_gdr").into())
}

/// `gdr ARGS` started with no stdin and its stderr piped; stdout piped too, or thrown away
/// where `stdout` is false. The test reads, waits for and bounds it.
#[allow(dead_code)] // not every test binary that includes this module spawns the CLI this way
pub fn spawn_gdr(args: &[&str], stdout: bool) -> Child {
    Command::new(gdr_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(if stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdr runs")
}
