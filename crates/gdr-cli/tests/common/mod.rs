//! Shared by the CLI tests that run the binary.

use std::path::PathBuf;

/// The `gdr` binary under test: cargo's, or `$GDR_BIN` (the GPU bundle's runner points it at
/// the bundled one, since cargo's path does not exist there).
pub fn gdr_bin() -> PathBuf {
    std::env::var_os("GDR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_gdr").into())
}
