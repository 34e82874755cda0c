//! Builds the C programs in `tests/c/` against the libgdrapi that this `cargo test` built, the
//! way a C user would (the public header, `-lgdrapi`, `-Wall -Wextra -Werror`), and runs them.
//!
//! - `api_names.c`: every name of gdrcopy 2.6's API, as C99 and as C++11; runs fully without a
//!   GPU.
//! - `gdrapi_test.c` and `semantics.c`: the API's behaviour on a GPU. Without one they say they
//!   skipped, and the test reports the skip as every GPU test does (`gdr_testing`); with
//!   `GDR_REQUIRE_GPU=1` they must pass.
//!
//! The library is the cdylib cargo builds next to this test (`target/<profile>/deps/`), or
//! `$GDRAPI_LIB`. A missing compiler or library fails the test: nothing here skips silently.
//! `scripts/capi-check.sh` builds the same programs against an installed library through
//! pkg-config (scripts/test.sh does, and the GPU bundle runner).

use std::path::{Path, PathBuf};
use std::process::Command;
use tempfile::TempDir;

fn library() -> PathBuf {
    if let Some(p) = std::env::var_os("GDRAPI_LIB") {
        return p.into();
    }
    // target/<profile>/deps/c_programs-<hash>: cargo builds the cdylib into the same folder
    // before integration tests (and copies it one level up only for `cargo build`).
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a folder");
    [deps.join("libgdrapi.so"), deps.join("../libgdrapi.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libgdrapi.so not found next to {} (set GDRAPI_LIB)",
                exe.display()
            )
        })
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh folder (removed when dropped) holding the library (links) under its file, soname
/// and link names, like an install.
fn staged_library() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("gdrapi-c-")
        .tempdir()
        .unwrap();
    let lib = library();
    for name in ["libgdrapi.so.2.6.0", "libgdrapi.so.2", "libgdrapi.so"] {
        std::os::unix::fs::symlink(&lib, dir.path().join(name)).unwrap();
    }
    dir
}

/// Compiles `tests/c/<src>` with `compiler` (gcc as C99, g++ as C++11) into a staging folder of
/// its own; the program is valid while the folder lives.
fn build(src: &str, cxx: bool) -> (TempDir, PathBuf) {
    build_linked(src, cxx, true)
}

/// [`build`], linked with `-lgdrapi` or, for a program that loads the library itself, not.
fn build_linked(src: &str, cxx: bool, link_gdrapi: bool) -> (TempDir, PathBuf) {
    let staged = staged_library();
    let dir = staged.path();
    let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
    let exe = dir.join(format!("{stem}{}", if cxx { "-cxx11" } else { "-c99" }));
    let (cc, std) = if cxx {
        ("g++", "-std=c++11")
    } else {
        ("gcc", "-std=c99")
    };
    let mut cmd = Command::new(cc);
    cmd.arg(std);
    if cxx {
        cmd.args(["-x", "c++"]);
    }
    let out = cmd
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests/c").join(src))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(dir)
        .args(if link_gdrapi {
            &["-lgdrapi", "-ldl"][..]
        } else {
            &["-ldl"][..]
        })
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {cc} ({e}): the C tests need gcc and g++ (Debian: build-essential)")
        });
    assert!(
        out.status.success(),
        "{cc} {src} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (staged, exe)
}

/// Runs `exe`; its stdout and stderr, after checking the exit status.
fn run(exe: &Path) -> String {
    run_with(exe, &[], &[])
}

/// Runs `exe` with `args` and the environment variables `env` added.
fn run_with(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run C test program");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "{} failed:\n{text}", exe.display());
    text
}

#[test]
fn api_names_c99() {
    let (_dir, exe) = build("api_names.c", false);
    let text = run(&exe);
    assert!(text.contains("api_names: all checks passed"), "{text}");
}

#[test]
fn api_names_cxx11() {
    let (_dir, exe) = build("api_names.c", true);
    let text = run(&exe);
    assert!(text.contains("api_names: all checks passed"), "{text}");
}

/// A GPU program run by test `test`: passes, or (no GPU, not required) says it skipped.
fn gpu_program(test: &str, src: &str, passed: &str) {
    gpu_program_with(test, src, &[], &[], passed)
}

/// [`gpu_program`] with arguments and environment variables.
fn gpu_program_with(test: &str, src: &str, args: &[&str], env: &[(&str, &str)], passed: &str) {
    let (_dir, exe) = build(src, false);
    let text = run_with(&exe, args, env);
    // Both programs skip with `<program>: skipped: <why>` (under GDR_REQUIRE_GPU=1 they exit
    // non-zero instead, which `run` has already failed on).
    if let Some(line) = text.lines().find(|l| l.contains(": skipped: ")) {
        gdr_testing::skip_or_fail::<()>(test, &format!("{src}: {line}"));
        return;
    }
    assert!(text.contains(passed), "{text}");
}

/// A client that dlclose()s the library while it holds a handle, an allocation and a mapping:
/// the library stays loaded (it is linked with `-z nodelete`), and the mapping and the handle
/// keep working. Without a GPU only the first half is checked.
#[test]
fn unloading_the_library_keeps_its_mappings() {
    let (dir, exe) = build_linked("unload.c", false, false);
    let lib = dir.path().join("libgdrapi.so.2");
    let text = run_with(&exe, &[lib.to_str().unwrap()], &[]);
    if let Some(line) = text.lines().find(|l| l.contains(": skipped: ")) {
        assert!(text.contains("stayed loaded"), "{text}");
        gdr_testing::skip_or_fail::<()>("unloading_the_library_keeps_its_mappings", line);
        return;
    }
    assert!(text.contains("unload: all checks passed"), "{text}");
}

#[test]
fn gdrapi_test_program() {
    gpu_program(
        "gdrapi_test_program",
        "gdrapi_test.c",
        "gdrapi_test: all checks passed",
    );
}

#[test]
fn semantics_program() {
    gpu_program("semantics_program", "semantics.c", " 0 failed");
}

/// The benchmark of a copy call's own cost runs to its end (few rounds; its figures are read
/// from the bundle's run).
#[test]
fn copy_overhead_program() {
    gpu_program_with(
        "copy_overhead_program",
        "copy_overhead.c",
        &["21"],
        &[],
        "copy_overhead: 1 passed, 0 failed",
    );
}

/// The copy paths again on gdrcopy's path (`GDR_CAPI_COPY=mapping`: every copy on the calling
/// thread's loads and stores); the program above ran them on the default, the path chosen per
/// size (several threads, the copy engine). One contract for both.
#[test]
fn semantics_copies_on_the_mapping_only() {
    gpu_program_with(
        "semantics_copies_on_the_mapping_only",
        "semantics.c",
        &["copy_paths"],
        &[("GDR_CAPI_COPY", "mapping")],
        "1 passed, 0 failed",
    );
}
