//! UCX, the one client of this library for which a refused pin is fatal.
//!
//! UCX's `gdr_copy` memory domain registers every CUDA buffer a program hands UCP, and UCP fails
//! the whole registration (and with it the send, or `ucp_mem_map`) when one memory domain fails:
//! there is no switch that makes it skip the domain (`ucp_memh_register_internal`,
//! src/ucp/core/ucp_mm.c, UCX 1.22). With gdrdrv every `cudaMalloc` buffer pins, so that never
//! happens. Here only memory of gdr's allocator (and other POSIX-fd `cuMemCreate` memory) can be
//! mapped, so a program's plain `cudaMalloc` buffer would abort it. What UCX does accept is a
//! `gdr_open` that fails: it then leaves `gdr_copy` out (`uct_gdr_copy_query_md_resources`) and
//! runs as it runs without gdrcopy. And UCX's `gdr_copy` touches a mapping only through
//! `gdr_copy_to_mapping` / `gdr_copy_from_mapping`, never by loads and stores of its own
//! (src/uct/cuda/gdr_copy/gdr_copy_ep.c), so a pin whose copies go through the copy engine
//! serves it as well as a mapped one.
//!
//! Hence, in a process that has UCX's `gdr_copy` module loaded (the default, `GDR_CAPI_UCX`
//! unset or `auto`):
//! - without gdr's allocator, `gdr_open` fails with a log line: UCX runs exactly as it would
//!   without gdr;
//! - with the allocator (`gdr run`), memory that cannot be mapped (stream-ordered or managed
//!   memory, allocations the allocator passed through) gets a *staged pin*: `gdr_map` hands out
//!   an address range that is reserved but inaccessible, and the copies through it run on the
//!   copy engine. UCX keeps `gdr_copy` for the allocator's memory and does not abort on the
//!   rest.
//!
//! `GDR_CAPI_UCX=staged` stages unmappable memory in every process (UCX or not) and opens
//! without the allocator; `GDR_CAPI_UCX=off` treats UCX as any other client (a refused pin is
//! an error). A process without UCX is not affected by `auto`.

use crate::log::{log, Level};
use std::sync::OnceLock;

/// `GDR_CAPI_UCX`, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Special treatment only where UCX's `gdr_copy` module is loaded (the default).
    Auto,
    /// Stage unmappable memory everywhere, and open without the allocator.
    Staged,
    /// No special treatment: a refused pin is an error, as for any client.
    Off,
}

/// What `gdr_open` does in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Open; `stage`: pins of memory that cannot be mapped become staged pins.
    Open { stage: bool },
    /// Fail, with the reason (logged).
    Refuse(&'static str),
}

/// The soname UCX's `gdr_copy` module carries (`libuct_cuda_gdrcopy.so.0`), looked up among the
/// objects already loaded.
const UCX_GDRCOPY_MODULE: &std::ffi::CStr = c"libuct_cuda_gdrcopy.so.0";

/// Parses `GDR_CAPI_UCX`: `Err` with the value when it is not a choice.
pub(crate) fn parse_mode(v: Option<&str>) -> Result<Mode, &str> {
    match v.map(str::trim) {
        None | Some("" | "auto") => Ok(Mode::Auto),
        Some("staged") => Ok(Mode::Staged),
        Some("off") => Ok(Mode::Off),
        Some(other) => Err(other),
    }
}

/// The process's mode, read once; a value that is not a choice is said once and `auto` used.
pub(crate) fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let v = std::env::var("GDR_CAPI_UCX").ok();
        parse_mode(v.as_deref()).unwrap_or_else(|other| {
            log!(
                Level::Error,
                "GDR_CAPI_UCX={other:?} is not a choice (auto, staged, off); using auto"
            );
            Mode::Auto
        })
    })
}

/// Whether UCX's `gdr_copy` module is loaded in this process (it is, whenever UCX is the one
/// calling `gdr_open`: the module links this library). Loads nothing.
pub(crate) fn gdrcopy_module_loaded() -> bool {
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only looks among the objects already loaded
    // (by file name or soname) and loads nothing.
    let h = unsafe {
        libc::dlopen(
            UCX_GDRCOPY_MODULE.as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return false;
    }
    // SAFETY: balances the reference the lookup took; the module stays loaded (UCX holds it).
    unsafe { libc::dlclose(h) };
    true
}

/// What `gdr_open` does, given the mode, whether UCX's module is loaded and whether gdr's
/// allocator is in the process.
pub(crate) fn decide(mode: Mode, ucx: bool, allocator: bool) -> Decision {
    match (mode, ucx, allocator) {
        (Mode::Off, _, _) | (Mode::Auto, false, _) => Decision::Open { stage: false },
        (Mode::Staged, _, _) | (Mode::Auto, true, true) => Decision::Open { stage: true },
        (Mode::Auto, true, false) => Decision::Refuse(
            "UCX's gdr_copy module loaded this library, but gdr's allocator is not in this \
             process, so UCX's plain cudaMalloc buffers could not be pinned and UCX would fail \
             them; gdr_copy is left out and UCX runs as without gdrcopy. Run the program under \
             `gdr run` (or preload libgdr_alloc.so) to give UCX gdr_copy",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_takes_three_choices() {
        assert_eq!(parse_mode(None), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some(" ")), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some("auto")), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some("staged")), Ok(Mode::Staged));
        assert_eq!(parse_mode(Some(" off\n")), Ok(Mode::Off));
        assert_eq!(parse_mode(Some("on")), Err("on"));
    }

    #[test]
    fn ucx_without_the_allocator_is_refused_and_with_it_staged() {
        assert!(matches!(
            decide(Mode::Auto, true, false),
            Decision::Refuse(_)
        ));
        assert_eq!(
            decide(Mode::Auto, true, true),
            Decision::Open { stage: true }
        );
        // Other clients are untouched by auto.
        assert_eq!(
            decide(Mode::Auto, false, false),
            Decision::Open { stage: false }
        );
        assert_eq!(
            decide(Mode::Auto, false, true),
            Decision::Open { stage: false }
        );
        // The explicit choices.
        for (ucx, alloc) in [(false, false), (true, false), (true, true)] {
            assert_eq!(
                decide(Mode::Staged, ucx, alloc),
                Decision::Open { stage: true }
            );
            assert_eq!(
                decide(Mode::Off, ucx, alloc),
                Decision::Open { stage: false }
            );
        }
    }

    #[test]
    fn a_test_binary_has_no_ucx_module_loaded() {
        assert!(!gdrcopy_module_loaded());
    }
}
