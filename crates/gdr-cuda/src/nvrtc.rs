//! NVRTC, loaded at run time: compiles gdr's CUDA C (kept in `.cu`/`.cuh` files in the crate)
//! for the device's own architecture, once per process.

use super::Device;
use crate::dylib::{self, api_table, LibrarySpec, LoadError};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Errors from NVRTC.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NvrtcError {
    /// NVRTC is not installed ([`LoadError::NotInstalled`]) or too old
    /// ([`LoadError::MissingSymbol`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An NVRTC call other than the compile itself failed, or the source could not be passed
    /// to it (it contains a NUL byte).
    #[error("{call} failed: {text}")]
    Call {
        /// The entry point, e.g. `nvrtcCreateProgram`.
        call: &'static str,
        /// NVRTC's description of the error (`nvrtcGetErrorString`), or why the call was not
        /// made.
        text: String,
    },
    /// The compiler rejected the program (`nvrtcCompileProgram`).
    #[error("compiling {name} for sm_{arch} failed:\n{log}")]
    Compile {
        /// The program's name, as given to [`compile`].
        name: String,
        /// The target's number, e.g. `90` for `sm_90`.
        arch: String,
        /// NVRTC's program log: the errors and warnings, with line numbers.
        log: String,
    },
}

type Prog = *mut c_void;
type Res = c_int;

api_table! {
    struct Api {
        version = "nvrtcVersion"(*mut c_int, *mut c_int) -> Res;
        error_string = "nvrtcGetErrorString"(Res) -> *const c_char;
        create = "nvrtcCreateProgram"(
            *mut Prog,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> Res;
        compile = "nvrtcCompileProgram"(Prog, c_int, *const *const c_char) -> Res;
        log_size = "nvrtcGetProgramLogSize"(Prog, *mut usize) -> Res;
        log = "nvrtcGetProgramLog"(Prog, *mut c_char) -> Res;
        cubin_size = "nvrtcGetCUBINSize"(Prog, *mut usize) -> Res;
        cubin = "nvrtcGetCUBIN"(Prog, *mut c_char) -> Res;
        destroy = "nvrtcDestroyProgram"(*mut Prog) -> Res;
    }
}

/// NVRTC as [`dylib`] names it in errors.
static LIBNVRTC: LibrarySpec = LibrarySpec {
    what: "NVRTC (libnvrtc.so)",
    install: "install the CUDA toolkit's NVRTC (e.g. cuda-nvrtc-13-0, or pip's \
              nvidia-cuda-nvrtc) or set GDR_NVRTC to its path",
    update: "it is too old",
};

static API: OnceLock<Result<Api, NvrtcError>> = OnceLock::new();

/// Where NVRTC is looked for: `GDR_NVRTC` alone when it is set (a path the user chose that
/// cannot be used is an error to report, not a reason to take another NVRTC), else the usual
/// names and CUDA's directories.
fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("GDR_NVRTC") {
        out.push(p);
        return out;
    }
    let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
    let mut dirs = vec![];
    if let Ok(h) = std::env::var("CUDA_HOME") {
        dirs.push(format!("{h}/lib64"));
    }
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
        ]
        .map(String::from),
    );
    for n in names {
        out.push(n.to_string());
        for d in &dirs {
            out.push(format!("{d}/{n}"));
        }
    }
    out
}

fn load() -> Result<Api, NvrtcError> {
    let lib = dylib::open(&LIBNVRTC, &candidates())?;
    // SAFETY: the library is NVRTC; its symbols have the nvrtc.h signatures the table states.
    Ok(unsafe { Api::resolve(lib) }?)
}

fn api() -> Result<&'static Api, NvrtcError> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

impl Api {
    fn check(&self, call: &'static str, rc: Res) -> Result<(), NvrtcError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: returns a pointer to a static string.
        let text = unsafe { CStr::from_ptr((self.error_string)(rc)) }
            .to_string_lossy()
            .into_owned();
        Err(NvrtcError::Call { call, text })
    }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    let a = api()?;
    let (mut maj, mut min) = (0, 0);
    // SAFETY: out-pointers to live locals.
    a.check("nvrtcVersion", unsafe { (a.version)(&mut maj, &mut min) })?;
    Ok((maj, min))
}

/// Compiles `source` to a cubin for `sm_{arch}` (e.g. "90"). No caching.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, NvrtcError> {
    let a = api()?;
    let csrc = CString::new(source).map_err(|_| NvrtcError::Call {
        call: "nvrtcCreateProgram",
        text: "source contains a NUL byte".into(),
    })?;
    let cname = CString::new(name).unwrap_or_default();
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: strings are NUL-terminated and alive; no headers passed.
    a.check("nvrtcCreateProgram", unsafe {
        (a.create)(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let opts: Vec<CString> = [
        format!("--gpu-architecture=sm_{arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
    .into_iter()
    .map(|s| CString::new(s).expect("no NUL"))
    .collect();
    let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: prog is live; options are alive for the call.
    let rc = unsafe { (a.compile)(prog, optp.len() as c_int, optp.as_ptr()) };
    let result = if rc != 0 {
        let mut n = 0usize;
        // SAFETY: prog is live; the log buffer has the size NVRTC reported.
        let log = unsafe {
            (a.log_size)(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            (a.log)(prog, buf.as_mut_ptr().cast());
            String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .to_string()
        };
        Err(NvrtcError::Compile {
            name: name.into(),
            arch: arch.into(),
            log,
        })
    } else {
        let mut n = 0usize;
        // SAFETY: prog is live and compiled.
        a.check("nvrtcGetCUBINSize", unsafe { (a.cubin_size)(prog, &mut n) })
            .and_then(|_| {
                let mut buf = vec![0u8; n];
                // SAFETY: buf has the size NVRTC reported.
                a.check("nvrtcGetCUBIN", unsafe {
                    (a.cubin)(prog, buf.as_mut_ptr().cast())
                })
                .map(|_| buf)
            })
    };
    // SAFETY: prog is live and not used after this.
    unsafe { (a.destroy)(&mut prog) };
    result
}

type CacheKey = (String, u64, String);
static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Vec<u8>>>>> = OnceLock::new();

/// Under `GDR_NVRTC_DUMP=DIR`, writes each program compiled as `DIR/<name>.sm_<arch>.cu` and
/// its cubin beside it (`cuobjdump -sass` reads it): to see the code a kernel became. A
/// failed write is reported on stderr and changes nothing else.
fn dump(name: &str, source: &str, arch: &str, cubin: &[u8]) {
    let Some(dir) = std::env::var_os("GDR_NVRTC_DUMP") else {
        return;
    };
    if let Err(e) = dump_to(std::path::Path::new(&dir), name, source, arch, cubin) {
        eprintln!(
            "GDR_NVRTC_DUMP: cannot write into {}: {e}",
            dir.to_string_lossy()
        );
    }
}

/// Writes `<name>.sm_<arch>.cu` and `.cubin` into `dir` (created if missing); characters of
/// `name` other than ASCII letters, digits, `_` and `-` become `_`.
fn dump_to(
    dir: &std::path::Path,
    name: &str,
    source: &str,
    arch: &str,
    cubin: &[u8],
) -> std::io::Result<()> {
    let stem: String = name
        .trim_end_matches(".cu")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = |ext: &str| dir.join(format!("{stem}.sm_{arch}.{ext}"));
    std::fs::create_dir_all(dir)?;
    std::fs::write(path("cu"), source)?;
    std::fs::write(path("cubin"), cubin)
}

/// Compiles for `device`'s architecture, caching the cubin per process by (name, source, arch).
pub fn compile_for(
    device: Device,
    name: &str,
    source: &str,
) -> Result<Arc<Vec<u8>>, super::CudaError> {
    use std::hash::{Hash, Hasher};
    let (maj, min) = device.compute_capability()?;
    let arch = format!("{maj}{min}");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let key = (name.to_string(), h.finish(), arch.clone());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().expect("nvrtc cache poisoned").get(&key) {
        return Ok(c.clone());
    }
    let cubin = Arc::new(compile(name, source, &arch)?);
    dump(name, source, &arch, &cubin);
    cache
        .lock()
        .expect("nvrtc cache poisoned")
        .insert(key, cubin.clone());
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::dump_to;

    #[test]
    fn a_dump_writes_the_source_and_cubin_under_a_safe_name() {
        let dir = std::env::temp_dir().join(format!("gdr-nvrtc-dump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cubin: Vec<u8> = (0..=255u8).collect();
        dump_to(&dir, "gdr mq/echo.cu", "kernel text", "90", &cubin).unwrap();
        let src = std::fs::read_to_string(dir.join("gdr_mq_echo.sm_90.cu")).unwrap();
        assert_eq!(src, "kernel text");
        assert_eq!(
            std::fs::read(dir.join("gdr_mq_echo.sm_90.cubin")).unwrap(),
            cubin
        );
        // A directory that cannot be made (a file is in the way) is an error, not a panic.
        let file = dir.join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        assert!(dump_to(&file, "k", "s", "90", &cubin).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
