//! `gdr run`: runs a program with gdr's allocator (`libgdr_alloc.so`) preloaded, so that its
//! `cudaMalloc` / `cuMemAlloc` memory can be pinned and mapped through libgdrapi.

use super::CmdResult;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
#[command(
    about = "Run a program with gdr's allocator preloaded: its cudaMalloc/cuMemAlloc memory \
             becomes mappable (gdr_pin_buffer works on it)",
    long_about = "Runs CMD with libgdr_alloc.so in LD_PRELOAD. The program is not rebuilt: its \
                  cudaMalloc, cuMemAlloc and cuMemAllocPitch calls (through the CUDA runtime, \
                  static or shared, or the driver API) are served from gdr's pool of POSIX-fd \
                  cuMemCreate chunks, which libgdrapi's gdr_pin_buffer can pin and map on hosts \
                  without gdrdrv. Where a GPU cannot be served (no Vulkan, no CUDA VMM) its \
                  calls pass through and the allocator says why once. The GDR_ALLOC* \
                  variables of the environment apply (docs/alloc.md lists them); one line on \
                  stderr says what was set up.",
    after_help = "Examples:\n  gdr run -- ./copylat\n  gdr run --gpu 0 -- python3 train.py\n  \
                  gdr run --ucx -- mpirun -n 2 ./osu_latency -d cuda D D\n  \
                  GDR_ALLOC_LOG=2 gdr run -- ucx_perftest -t ucp_put_lat -m cuda"
)]
pub struct RunArgs {
    /// Serve only these CUDA ordinals (comma-separated, as the program numbers its GPUs);
    /// allocations on other GPUs pass through to the driver. Default: every GPU.
    #[arg(long, value_name = "N[,N...]", value_parser = parse_gpus)]
    gpu: Option<String>,
    /// The allocator library to preload. Default: $GDR_ALLOC_LIB, else libgdr_alloc.so (or
    /// cargo's libgdr_alloc_preload.so) next to this gdr binary or libgdr_alloc.so.0 in ../lib,
    /// else where the dynamic loader finds libgdr_alloc.so.0.
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// The allocator's messages: 0 none, 1 reasons and errors (default), 2 every call.
    #[arg(long, value_name = "LEVEL", value_parser = clap::value_parser!(u8).range(0..=2))]
    log: Option<u8>,
    /// Say nothing before running the program.
    #[arg(long, short)]
    quiet: bool,
    /// Also set UCX_RNDV_THRESH=auto,intra:8192, so that UCX sends CUDA buffers of up to 8 KiB
    /// within a host eagerly through gdr_copy instead of by rendezvous (docs/ucx.md); a
    /// variable already in the environment is kept.
    #[arg(long)]
    ucx: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

/// What `--ucx` sets (docs/ucx.md says why and what it gives). Within a
/// host, UCX sends a CUDA buffer eagerly only while gdrcopy's own cost figures for gdr_copy beat
/// its rendezvous estimate, which puts the switch near 1 KiB. Eager messages cost the read of
/// the bytes through BAR1, which wins one message at a time; a stream of them is held to the
/// BAR1 read rate, which a pipelined rendezvous beats from 8 KiB. So: eagerly below 8 KiB within
/// the host; between hosts UCX keeps its own choice.
const UCX_SETTINGS: &[(&str, &str)] = &[("UCX_RNDV_THRESH", "auto,intra:8192")];

fn parse_gpus(s: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let n: u32 = part
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: expected CUDA ordinals such as 0 or 0,1"))?;
        out.push(n.to_string());
    }
    Ok(out.join(","))
}

/// Where the allocator library is, or why it was not found.
fn find_library(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = given.or_else(|| std::env::var_os("GDR_ALLOC_LIB").map(PathBuf::from)) {
        return Ok(p);
    }
    let mut tried = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        for c in [
            dir.join("libgdr_alloc.so"),
            // The same library as `cargo build` leaves it in target/<profile>, under the
            // crate's Rust name (gdr-alloc-preload's Cargo.toml says why it differs).
            dir.join("libgdr_alloc_preload.so"),
            dir.join("../lib/libgdr_alloc.so.0"),
            dir.join("../lib/x86_64-linux-gnu/libgdr_alloc.so.0"),
        ] {
            if c.exists() {
                return c
                    .canonicalize()
                    .map_err(|e| format!("{}: {e}", c.display()));
            }
            tried.push(c.display().to_string());
        }
    }
    // Installed where the dynamic loader looks (scripts/install-capi.sh): ask the loader.
    // SAFETY: loading gdr's allocator runs no initialiser; RTLD_LOCAL keeps its symbols out of
    // this process's global scope.
    let h = unsafe {
        libc::dlopen(
            c"libgdr_alloc.so.0".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_LOCAL,
        )
    };
    if !h.is_null() {
        let path = loaded_path(h);
        // SAFETY: our own handle, not used after.
        unsafe { libc::dlclose(h) };
        if let Some(p) = path {
            return Ok(p);
        }
    }
    tried.push("libgdr_alloc.so.0 on the loader's path".into());
    Err(format!(
        "gdr's allocator library was not found (tried {}); install it with \
         scripts/install-capi.sh, or name it with --lib PATH or GDR_ALLOC_LIB",
        tried.join(", ")
    ))
}

/// The file a dlopen handle was loaded from.
fn loaded_path(h: *mut libc::c_void) -> Option<PathBuf> {
    // SAFETY: a live handle; the symbol name is NUL-terminated.
    let sym = unsafe { libc::dlsym(h, c"gdr_alloc_abi_version".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: Dl_info is plain C data (pointers and integers): all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; `info` is a live out-parameter.
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gave a NUL-terminated file name.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// Checks that `lib` is gdr's allocator (it exports `gdr_alloc_abi_version`).
fn check_library(lib: &Path) -> Result<(), String> {
    let c = std::ffi::CString::new(lib.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: the path has a NUL byte", lib.display()))?;
    // SAFETY: as in find_library: no initialiser runs, nothing becomes global.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a message of the failed dlopen (or null).
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "cannot be loaded".to_owned()
        } else {
            // SAFETY: a NUL-terminated message owned by the loader.
            unsafe { std::ffi::CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(why);
    }
    let ok = loaded_path(h).is_some();
    // SAFETY: our own handle, not used after.
    unsafe { libc::dlclose(h) };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is not gdr's allocator (it lacks gdr_alloc_abi_version)",
            lib.display()
        ))
    }
}

pub fn run(a: RunArgs) -> CmdResult {
    let lib = find_library(a.lib)?;
    // The loader would open a FIFO and wait for a writer forever.
    gdr::regular_file::check(&lib)?;
    // An absolute path: the program may change directory before it loads anything else.
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    check_library(&lib)?;
    let mut preload = lib.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let (program, args) = a.command.split_first().expect("clap requires CMD");
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env("LD_PRELOAD", &preload);
    if let Some(g) = &a.gpu {
        cmd.env("GDR_ALLOC_GPUS", g);
    }
    if let Some(l) = a.log {
        cmd.env("GDR_ALLOC_LOG", l.to_string());
    }
    let mut ucx_set = Vec::new();
    if a.ucx {
        for (name, value) in UCX_SETTINGS {
            if std::env::var_os(name).is_none() {
                cmd.env(name, value);
                ucx_set.push(format!("{name}={value}"));
            }
        }
    }
    if !a.quiet {
        let gpus = a
            .gpu
            .as_deref()
            .map(|g| format!("GPU {g}"))
            .or_else(|| {
                std::env::var("GDR_ALLOC_GPUS")
                    .ok()
                    .map(|g| format!("GPU {g}"))
            })
            .unwrap_or_else(|| "every GPU".into());
        let ucx = if ucx_set.is_empty() {
            String::new()
        } else {
            format!("; for UCX: {}", ucx_set.join(" "))
        };
        eprintln!(
            "gdr run: preloading {} (LD_PRELOAD): cudaMalloc/cuMemAlloc on {gpus} come from gdr's \
             allocator and can be pinned and mapped{ucx}; running {}",
            lib.display(),
            program.to_string_lossy()
        );
    }
    let e = cmd.exec();
    Err(format!("cannot run {}: {e}", program.to_string_lossy()).into())
}
