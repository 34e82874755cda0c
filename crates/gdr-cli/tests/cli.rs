//! The `gdr` binary as a user runs it, on any machine: what `info` reports, and the `--json`
//! forms of `check` and `dma`, including where there is no GPU and no DMA device.
//!
//! The binary is cargo's, or `$GDR_BIN` (the GPU bundle's runner points it at the bundled one).

use std::process::{Command, Output};

mod common;

fn gdr(args: &[&str]) -> Output {
    let bin = common::gdr_bin();
    Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.to_string_lossy()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{}\nstderr:\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// A PCI address no machine has (domain ffff), so the DMA commands cannot open it.
const NO_SUCH_DEVICE: &str = "ffff:ff:1f.7";

/// A failure as the CLI promises it: exit 2 and one line on stderr.
fn assert_one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("gdr: error: "), "{err}");
    err
}

#[test]
fn info_reports_every_library_and_pinning_backend() {
    let out = gdr(&["info"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for head in [
        "CUDA driver:",
        "NVIDIA driver:",
        "NVRTC:",
        "Vulkan loader:",
        "gdrdrv:",
    ] {
        assert!(t.lines().any(|l| l.starts_with(head)), "no {head}\n{t}");
    }
    // Each pinning backend either works (its row says yes) or is in "Missing:" with a reason.
    for b in ["gdrdrv", "dmabuf", "vulkan"] {
        let works = t.lines().any(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(&format!("pin-{b}")) && w.next() == Some("yes")
        });
        let missing = t.lines().any(|l| {
            l.trim_start()
                .strip_prefix(&format!("- pinning backend {b}"))
                .is_some_and(|rest| rest.contains(": ") && rest.len() > 10)
        });
        assert!(
            works || missing,
            "pinning backend {b} neither works nor is missing:\n{t}"
        );
    }
}

#[test]
fn info_json_carries_the_libraries_and_the_missing_list() {
    let out = gdr(&["info", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j = json(&out);
    let missing: Vec<&str> = j["missing"]
        .as_array()
        .expect("missing is a list")
        .iter()
        .map(|m| m.as_str().expect("missing holds strings"))
        .collect();
    // (found, why not, whether why-not must be in the missing list: gdrdrv's is only when
    // there is no GPU to probe the gdrdrv backend on, which gives its own reason otherwise).
    for (have, why, listed) in [
        ("cuda_driver", "cuda_error", true),
        ("nvml_driver", "nvml_error", true),
        ("nvrtc", "nvrtc_error", true),
        ("vulkan_loader", "vulkan_loader_error", true),
        ("gdrdrv", "gdrdrv_error", false),
    ] {
        assert!(
            j[have].is_string() || j[why].is_string(),
            "neither {have} nor {why}: {j:#}"
        );
        if let (Some(reason), true) = (j[why].as_str(), listed) {
            assert!(
                missing.iter().any(|m| m.contains(reason)),
                "{why} not in missing: {j:#}"
            );
        }
    }
}

#[test]
fn check_json_is_one_object_with_a_verdict() {
    let out = gdr(&["check", "--json"]);
    let j = json(&out);
    assert!(j["info"]["missing"].is_array(), "{j:#}");
    assert!(
        j["verdict"].as_str().is_some_and(|v| !v.is_empty()),
        "{j:#}"
    );
    let usable = j["mapping_usable"].as_bool().expect("mapping_usable");
    if usable {
        assert!(
            j["sanity"]["passed"].as_u64().is_some_and(|n| n > 0),
            "{j:#}"
        );
    } else {
        assert!(j["sanity"].is_null() && j["latency"].is_null(), "{j:#}");
        let verdict = j["verdict"].as_str().unwrap_or_default();
        if j["info"]["cuda_loaded"] == false {
            // No NVIDIA driver (a build machine): nothing to check, says so and succeeds.
            assert!(out.status.success(), "{j:#}");
            assert!(verdict.starts_with("No usable GPU mapping"), "{verdict}");
        } else if !out.status.success() {
            // A driver but no backend: fails, with the reason.
            assert_eq!(out.status.code(), Some(1), "{j:#}");
            assert!(
                verdict.starts_with("gdr cannot map GPU memory here: "),
                "{verdict}"
            );
        }
    }
}

/// Runs `gdr ARGS` with `env` added: a container marker and an ICD file that does not exist,
/// as in a container started without the `graphics` driver capability.
fn gdr_without_icd(args: &[&str]) -> Output {
    let bin = common::gdr_bin();
    Command::new(&bin)
        .args(args)
        .env("container", "podman")
        .env("VK_DRIVER_FILES", "/nonexistent/nvidia_icd.json")
        .env_remove("VK_ICD_FILENAMES")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.to_string_lossy()))
}

#[test]
fn check_in_a_container_without_the_icd_names_the_capability_and_fails_on_a_gpu() {
    let out = gdr_without_icd(&["check", "--json"]);
    let j = json(&out);
    assert_eq!(j["info"]["container"], "container=podman", "{j:#}");
    if j["info"]["vulkan_loader"].is_string() {
        // What a container without `graphics` sees: the capability and the variable, in the
        // ICD's line and in the missing list.
        let icd = j["info"]["vulkan_icd_error"]
            .as_str()
            .expect("vulkan_icd_error");
        assert!(
            icd.starts_with("no NVIDIA Vulkan driver (ICD) found: ")
                && icd.contains("this is a container (container=podman)")
                && icd.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics")
                && icd.contains("VK_DRIVER_FILES"),
            "{icd}"
        );
        let listed = j["info"]["missing"].as_array().is_some_and(|m| {
            m.iter()
                .any(|l| l.as_str().is_some_and(|l| l.contains(icd)))
        });
        assert!(listed, "{j:#}");
    } else {
        // No loader here: it is the loader that is named missing.
        assert!(j["info"]["vulkan_loader_error"].is_string(), "{j:#}");
    }
    let gpu_here = j["info"]["gpus"].as_array().is_some_and(|g| !g.is_empty());
    let pins = j["info"]["gpus"][0]["backends"]
        .as_array()
        .is_some_and(|b| {
            b.iter()
                .any(|b| b["name"] == "pin-auto" && b["usable"] == true)
        });
    if gpu_here && !pins {
        // A GPU but no mapping backend: exit 1, the verdict giving the ICD's reason.
        assert_eq!(out.status.code(), Some(1), "{j:#}");
        let verdict = j["verdict"].as_str().unwrap_or_default();
        assert!(
            verdict.starts_with("gdr cannot map GPU memory here: no NVIDIA Vulkan driver")
                && verdict.contains("NVIDIA_DRIVER_CAPABILITIES"),
            "{verdict}"
        );
    } else if j["info"]["cuda_loaded"] == false {
        assert!(out.status.success(), "{j:#}");
    }
    // The text form: the same exit status, and the container said.
    let text_out = gdr_without_icd(&["check"]);
    assert_eq!(text_out.status.code(), out.status.code());
    let t = text(&text_out.stdout);
    assert!(t.contains("Container:    yes (container=podman)"), "{t}");
}

#[test]
fn dma_info_json_without_the_device_says_why_and_fails() {
    let out = gdr(&["dma", "info", "--json", "--device", NO_SUCH_DEVICE]);
    let j = json(&out);
    assert_eq!(j["found"], false, "{j:#}");
    assert_eq!(j["device"], NO_SUCH_DEVICE, "{j:#}");
    let why = j["error"].as_str().expect("error");
    assert!(j["vfio"].as_str().is_some_and(|v| !v.is_empty()), "{j:#}");
    let err = assert_one_line_error(&out);
    assert!(
        err.contains(why),
        "stderr {err:?} is not the JSON's error {why:?}"
    );
}

#[test]
fn dma_info_json_on_this_machine_is_valid_either_way() {
    // Whatever DMA device this machine has or lacks: one JSON object, and success iff found.
    let out = gdr(&["dma", "info", "--json"]);
    let j = json(&out);
    let found = j["found"].as_bool().expect("found");
    assert_eq!(found, out.status.success(), "{j:#}");
    if !found {
        assert_one_line_error(&out);
        assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{j:#}");
    } else {
        assert!(
            j["engine"].is_string() && j["device_memory"].is_u64(),
            "{j:#}"
        );
    }
}

#[test]
fn dma_timing_json_without_the_device_fails_in_one_line() {
    for dir in ["h2c", "c2h"] {
        let out = gdr(&["dma", dir, "--json", "--device", NO_SUCH_DEVICE]);
        assert_one_line_error(&out);
        assert!(out.stdout.is_empty(), "{dir}: {}", text(&out.stdout));
    }
}

#[test]
fn dma_leds_value_is_explained_and_checked() {
    let out = gdr(&["dma", "leds", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    let value = help
        .lines()
        .find(|l| l.trim_start().starts_with("<VALUE>"))
        .unwrap_or_else(|| panic!("no <VALUE> line:\n{help}"));
    assert!(value.contains("bit mask"), "{help}");
    // Out of range is refused before any device is touched.
    let out = gdr(&["dma", "leds", "8", "--device", NO_SUCH_DEVICE]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("0..=7"), "{}", text(&out.stderr));
}

/// A stand-in for libgdr_alloc.so (it only needs to export `gdr_alloc_abi_version` for
/// `gdr run` to accept it), built into `dir`.
fn stub_allocator(dir: &std::path::Path) -> std::path::PathBuf {
    stub_allocator_named(dir, "libgdr_alloc.so")
}

/// The stand-in of [`stub_allocator`] under the file name `name`.
fn stub_allocator_named(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let src = dir.join("stub.c");
    std::fs::write(&src, "int gdr_alloc_abi_version(void) { return 1; }\n").unwrap();
    let lib = dir.join(name);
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(out.status.success(), "{}", text(&out.stderr));
    lib
}

#[test]
fn run_preloads_the_allocator_and_passes_the_switches() {
    let dir = tempfile::tempdir().unwrap();
    let lib = stub_allocator(dir.path());
    // A preload the caller had already: kept, after the allocator.
    let earlier = dir.path().join("earlier.so");
    std::fs::copy(&lib, &earlier).unwrap();
    let out = Command::new(common::gdr_bin())
        .args(["run", "--gpu", "1, 0", "--log", "2", "--lib"])
        .arg(&lib)
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$LD_PRELOAD|$GDR_ALLOC_GPUS|$GDR_ALLOC_LOG|$1\"",
            "-",
            "-x",
        ])
        .env("LD_PRELOAD", &earlier)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lib = lib.canonicalize().unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        format!("{}:{}|1,0|2|-x", lib.display(), earlier.display()),
        "the allocator first, the caller's preloads kept, the switches set, the arguments intact"
    );
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("gdr run: preloading ") && err.contains("GPU 1,0"),
        "{err}"
    );
    // --quiet says nothing; the program's exit status is the command's.
    let out = Command::new(common::gdr_bin())
        .args(["run", "-q", "--lib"])
        .arg(&lib)
        .args(["--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stderr), "");
}

/// Without --lib or GDR_ALLOC_LIB, `gdr run` takes the library next to its own binary: the
/// installed name first, then the name `cargo build` gives it in target/<profile>.
#[test]
fn run_finds_the_library_next_to_its_binary_under_either_name() {
    let dir = tempfile::tempdir().unwrap();
    let gdr_copy = dir.path().join("gdr");
    if std::fs::hard_link(common::gdr_bin(), &gdr_copy).is_err() {
        std::fs::copy(common::gdr_bin(), &gdr_copy).unwrap();
    }
    let preloaded = || {
        let out = Command::new(&gdr_copy)
            .args(["run", "-q", "--", "sh", "-c", "echo \"$LD_PRELOAD\""])
            .env_remove("GDR_ALLOC_LIB")
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    let cargo_name = stub_allocator_named(dir.path(), "libgdr_alloc_preload.so");
    assert_eq!(
        preloaded(),
        cargo_name.canonicalize().unwrap().display().to_string()
    );
    let installed_name = stub_allocator_named(dir.path(), "libgdr_alloc.so");
    assert_eq!(
        preloaded(),
        installed_name.canonicalize().unwrap().display().to_string()
    );
}

#[test]
fn run_refuses_what_it_cannot_do_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // Not a shared object; a shared object that is not the allocator; no such program.
    let not_elf = dir.path().join("x.so");
    std::fs::write(&not_elf, "not a library").unwrap();
    let out = gdr(&["run", "--lib", not_elf.to_str().unwrap(), "--", "true"]);
    assert_one_line_error(&out);
    let other = dir.path().join("other.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-x", "c", "-o"])
        .arg(&other)
        .arg("/dev/null")
        .status()
        .unwrap();
    assert!(status.success());
    let err = assert_one_line_error(&gdr(&[
        "run",
        "--lib",
        other.to_str().unwrap(),
        "--",
        "true",
    ]));
    assert!(err.contains("not gdr's allocator"), "{err}");
    let lib = stub_allocator(dir.path());
    let err = assert_one_line_error(&gdr(&[
        "run",
        "-q",
        "--lib",
        lib.to_str().unwrap(),
        "--",
        "/nonexistent/program",
    ]));
    assert!(err.contains("cannot run /nonexistent/program"), "{err}");
    let err = assert_one_line_error(&gdr(&["run", "--lib", "/nonexistent.so", "--", "true"]));
    assert!(err.contains("/nonexistent.so"), "{err}");
    // Usage errors are clap's (exit 2): no command, a bad GPU list.
    assert_eq!(gdr(&["run"]).status.code(), Some(2));
    assert_eq!(
        gdr(&["run", "--gpu", "x", "--", "true"]).status.code(),
        Some(2)
    );
}
