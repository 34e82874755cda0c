//! libgdr_alloc.so preloaded into a C program over a stand-in libcuda (`tests/c/fake_libcuda.c`)
//! with no GPU behind it: every road to the driver's allocation calls (by symbol, `dlsym` on
//! libcuda's handle, `cuGetProcAddress`) must reach the preloaded entry points, every call must
//! pass through unchanged, and the reason must be said once. Runs anywhere with a C compiler;
//! the same program is the CI check that "without a GPU the allocator is a clean pass-through".

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tempfile::TempDir;

/// The library that this `cargo test` built (next to the test binary, under the crate's Rust
/// name: `libgdr_alloc_preload.so`, which installs as libgdr_alloc.so), or `$GDR_ALLOC_LIB`.
fn library() -> PathBuf {
    if let Some(p) = std::env::var_os("GDR_ALLOC_LIB") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a folder");
    [
        deps.join("libgdr_alloc_preload.so"),
        deps.join("../libgdr_alloc_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("no libgdr_alloc_preload.so next to {}", exe.display()))
}

fn cc(args: &[&str], what: &str) {
    let out = Command::new("cc")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cc (for {what}): {e}"));
    assert!(
        out.status.success(),
        "building {what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The fake libcuda.so.1 and the test program, built into a fresh folder.
fn build() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("gdr-alloc-")
        .tempdir()
        .unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let d = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    let s = |f: &str| src.join(f).to_str().unwrap().to_owned();
    cc(
        &[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            &d("libcuda.so.1"),
            &s("fake_libcuda.c"),
        ],
        "the fake libcuda",
    );
    cc(
        &[
            "-Wall",
            "-Werror",
            "-o",
            &d("passthrough"),
            &s("passthrough.c"),
            "-ldl",
        ],
        "passthrough.c",
    );
    dir
}

fn run(dir: &TempDir, mode: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(dir.path().join("passthrough"));
    c.arg(mode)
        .env("LD_PRELOAD", library())
        .env("LD_LIBRARY_PATH", dir.path())
        .env_remove("GDR_ALLOC")
        .env_remove("GDR_ALLOC_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run passthrough");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    println!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn gdr_alloc_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("gdr_alloc:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn without_a_gpu_every_call_passes_through_and_the_reason_is_said_once() {
    let dir = build();
    let out = run(&dir, "on", &[]);
    assert!(out.status.success(), "a check failed (see above)");
    let lines = gdr_alloc_lines(&out);
    assert_eq!(lines.len(), 1, "one line, said once: {lines:?}");
    assert!(
        lines[0].contains("GPU 0: passing allocations through to the driver"),
        "{lines:?}"
    );
}

#[test]
fn switched_off_it_changes_nothing_and_says_nothing() {
    let dir = build();
    let out = run(&dir, "off", &[("GDR_ALLOC", "off")]);
    assert!(out.status.success(), "a check failed (see above)");
    assert_eq!(gdr_alloc_lines(&out), Vec::<String>::new());
}

#[test]
fn a_bad_setting_is_named_once_and_everything_passes_through() {
    let dir = build();
    let out = run(&dir, "off", &[("GDR_ALLOC_MAX_SIZE", "lots")]);
    assert!(out.status.success(), "a check failed (see above)");
    let lines = gdr_alloc_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("GDR_ALLOC_MAX_SIZE=\"lots\"") && lines[0].contains("passing every"),
        "{lines:?}"
    );
}

/// The library hands out memory and, through libgdrapi, mappings of it; a client that loads it
/// with dlopen (PyTorch's and CuPy's pluggable allocators do) and dlclose()s it must not unmap
/// the code that frees them: it is linked with `-z nodelete` and stays loaded.
#[test]
fn a_dlclose_leaves_the_library_loaded() {
    let dir = tempfile::Builder::new()
        .prefix("gdr-alloc-unload-")
        .tempdir()
        .unwrap();
    let exe = dir.path().join("stays_loaded");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/stays_loaded.c");
    cc(
        &[
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            exe.to_str().unwrap(),
            src.to_str().unwrap(),
            "-ldl",
        ],
        "stays_loaded.c",
    );
    let out = Command::new(&exe)
        .arg(library())
        .arg("gdr_alloc_abi_version")
        .env_remove("GDR_ALLOC_LOG")
        .output()
        .expect("run stays_loaded");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("stayed loaded after dlclose"), "{text}");
}

/// `cargo build` names the file after the crate (`libgdr_alloc_preload.so`), but programs and
/// the loader know it by its soname, which must stay the installed library's:
/// `libgdr_alloc.so.0`.
#[test]
fn the_library_keeps_its_public_soname() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(library())
        .output()
        .expect("run readelf (binutils, which the C compiler needs too)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let sonames: Vec<&str> = text.lines().filter(|l| l.contains("(SONAME)")).collect();
    assert_eq!(sonames.len(), 1, "{text}");
    assert!(
        sonames[0].ends_with("Library soname: [libgdr_alloc.so.0]"),
        "{}",
        sonames[0]
    );
}
