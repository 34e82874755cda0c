//! Gate for tests that need a GPU.
//!
//! Without a usable GPU a GPU test prints `skipped: no GPU (<why>)` and passes, so `cargo test`
//! works anywhere; with `GDR_REQUIRE_GPU=1` (the bundle runner on GPU hosts) it fails instead,
//! so a broken driver setup cannot pass for a skipped test.

use crate::cuda::{Context, Device};

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

/// Prints the skip line, or panics under `GDR_REQUIRE_GPU=1`.
pub fn skip_or_fail<T>(name: &str, why: &str) -> Option<T> {
    if gpu_required() {
        panic!("{name}: GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
    }
    println!("{name}: skipped: no GPU ({why})");
    None
}

/// The topology fixtures: `$GDR_TOPO_FIXTURES` (set by the bundle runner, which carries them),
/// else the source tree's `crates/gdr/tests/fixtures/topo`.
pub fn topo_fixtures() -> std::path::PathBuf {
    std::env::var_os("GDR_TOPO_FIXTURES")
        .map(Into::into)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/topo")
        })
}
