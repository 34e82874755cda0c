//! Builds `tests/c/gdrapi_test.c` with gcc against the built libgdrapi.so and runs it. Without
//! a GPU the program skips (exit 0); with `GDR_REQUIRE_GPU=1` it must pass for real. The
//! library is found next to this test's target directory (`target/<profile>/libgdrapi.so`) or
//! at `$GDRAPI_LIB`; gcc must be installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GDRAPI_LIB") {
        return Some(p.into());
    }
    // target/<profile>/deps/c_program-<hash> -> target/<profile>/libgdrapi.so
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    // In a bundle (scripts/bundle.sh): tests/c_program and capi/libgdrapi.so.
    [
        profile.join("libgdrapi.so"),
        profile.join("capi/libgdrapi.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

#[test]
fn c_test_program_passes() {
    let Some(lib) = library() else {
        // Cargo builds the cdylib before integration tests; only a bundle without it lands here.
        assert!(
            std::env::var("GDR_REQUIRE_GPU").as_deref() != Ok("1"),
            "libgdrapi.so not found (set GDRAPI_LIB)"
        );
        println!("c_test_program_passes: skipped: libgdrapi.so not found");
        return;
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !crate_dir.join("tests/c/gdrapi_test.c").exists() {
        // A bundle carries the program prebuilt (capi/gdrapi_test), which run.sh runs.
        println!("c_test_program_passes: skipped: no source tree here; run capi/gdrapi_test");
        return;
    }
    let dir = std::env::temp_dir().join(format!("gdrapi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The library's soname is libgdrapi.so.2, which is what the program will ask for.
    std::fs::copy(&lib, dir.join("libgdrapi.so")).unwrap();
    std::fs::copy(&lib, dir.join("libgdrapi.so.2")).unwrap();
    let exe = dir.join("gdrapi_test");
    let gcc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/gdrapi_test.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&dir)
        .args(["-lgdrapi", "-ldl"])
        .output();
    let gcc = match gcc {
        Ok(o) => o,
        Err(e) => {
            println!("c_test_program_passes: skipped: no gcc ({e})");
            return;
        }
    };
    assert!(
        gcc.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    println!("{out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success(), "gdrapi_test failed:\n{out}\n{err}");
    assert!(
        out.contains("all checks passed") || out.contains("skipped"),
        "{out}"
    );
}
