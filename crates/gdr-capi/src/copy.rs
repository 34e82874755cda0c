//! `gdr_copy_to_mapping` and `gdr_copy_from_mapping`, and the paths behind them.
//!
//! gdrcopy copies with the CPU through the mapping, on the calling thread. That is the fastest
//! way for small copies, but CPU loads from a BAR are slow (a few outstanding reads at a time),
//! and one thread's stores do not fill the link. So, as the Rust auto copier does
//! (`gdr::bar::auto`), each copy takes the path its direction and size class were measured
//! fastest on: the mapping on one thread, the mapping split over several threads, or the GPU's
//! copy engine. The decisions are the machine's cached calibration (written by any gdr program
//! that calibrates, e.g. `gdr copylat`), or [`Calibration::typical`] where there is none: a C
//! program never waits for a calibration.
//!
//! This is the default (`GDR_CAPI_COPY` unset, empty or `auto`). `GDR_CAPI_COPY=mapping` keeps
//! every copy on the calling thread's loads and stores through the mapping, as gdrcopy does.
//! Copies below the size where the copier would leave the one-thread mapping skip it
//! altogether (one comparison), so small copies cost what they cost on the mapping.
//!
//! What a copy means does not change with its path. When the call returns, the bytes are in
//! GPU memory (to) or in the caller's buffer (from). A copy-engine read first fences the
//! calling thread's earlier stores through the mapping, so it sees them (the fence drains the
//! write-combining buffers; the copy's launch reaches the GPU behind those writes, in PCIe
//! order). A copy-engine read into pageable memory of up to 1 MiB goes through gdr's
//! page-locked chunks (`gdr::cuda::read_into_host`), faster than the driver's pageable copy
//! there. The copy engine runs on a stream of gdr's own that does not wait for the legacy
//! default stream, so a persistent kernel on that stream cannot block a copy; the caller's
//! current CUDA context is put back before the call returns. When the copy engine fails, the
//! copy is done through the mapping and the failure is logged once.
//!
//! None of this is a copy path of the library's own: a handle's mapping is a
//! [`DeviceMapped`] ([`HandleMapping`]), copied by gdr's auto copier and its paths
//! (`gdr::bar::auto::write_on`), and the promises above that the Rust API does not make (the
//! stream, the fence, the context, the fallback) are options of gdr's one engine copy
//! ([`EngineCopy`]), set in [`Engine::copy`].

use crate::entry::guard;
use crate::log::{log, Level};
use crate::table::{self, Handle};
use crate::GdrMh;
use gdr::bar::auto::{AutoCopier, Calibration, Direction};
use gdr::bar::{DeviceMapped, EngineCopy, LazyStream, VulkanBackend};
use gdr::cuda::{Context, CudaError, DeviceRange};
use gdr::mem::{Caching, MappedMemory};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Checks that `[ptr, ptr + size)` lies in `mh`'s live mapping and runs `f` with the table
/// read-locked (so no unmap can race the copy, while copies on other handles go on), the
/// handle, and the offset of `ptr` in its mapping.
fn with_mapped_range(
    mh: GdrMh,
    ptr: *const u8,
    size: usize,
    f: impl FnOnce(&Handle, usize) -> c_int,
) -> c_int {
    let s = table::read();
    let Some(h) = s.as_ref().and_then(|s| s.handles.get(&(mh.h as u64))) else {
        return libc::EINVAL;
    };
    if !h.is_mapped() {
        return libc::EINVAL;
    }
    let (start, end) = (h.cpu as usize, h.cpu as usize + h.cpu_len);
    match (ptr as usize).checked_add(size) {
        Some(e) if ptr as usize >= start && e <= end => f(h, ptr as usize - start),
        _ => libc::EINVAL,
    }
}

/// gdrcopy's `gdr_copy_to_mapping`: copies `size` bytes from host memory at `h_ptr` to
/// `map_d_ptr`, an address inside handle `mh`'s live mapping, with whole-line write-combining
/// stores; the bytes are visible to the GPU when the call returns (a store fence ends it).
/// `h_ptr` must hold `size` readable bytes. No ordering against GPU work already running is
/// promised (see the GPUDirect RDMA guide).
///
/// 0, or EINVAL when `mh` is unknown or not mapped, `[map_d_ptr, map_d_ptr + size)` is not
/// inside its mapping, or (for a `size` above 0) a pointer is NULL. `size` 0 copies nothing
/// but still checks the handle.
///
/// # Safety
/// For a `size` above 0, `h_ptr` is NULL (refused) or valid for reads of `size` bytes. Any
/// `map_d_ptr` is safe: it is checked against the handle's live mapping (and the table's lock
/// keeps that mapping for the copy) before a byte is written.
#[no_mangle]
pub unsafe extern "C" fn gdr_copy_to_mapping(
    mh: GdrMh,
    map_d_ptr: *mut c_void,
    h_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard("gdr_copy_to_mapping", || {
        if size == 0 {
            // Nothing to copy, but a made-up or unmapped handle is still EINVAL (gdrapi.h).
            return with_mapped_range(mh, map_d_ptr.cast(), 0, |_, _| 0);
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, offset| {
            // SAFETY: the caller passes `size` readable bytes at h_ptr.
            let src = unsafe { std::slice::from_raw_parts(h_ptr.cast::<u8>(), size) };
            if h.is_staged() {
                // SAFETY: `src` is `size` readable bytes, and a copy to the GPU only reads them.
                return unsafe {
                    staged(
                        &h.engine,
                        h.covered(),
                        Direction::ToGpu,
                        src.as_ptr().cast_mut(),
                        h.window.va + offset as u64,
                        size,
                    )
                };
            }
            to_mapping(&HandleMapping(h), offset, src);
            0
        })
    })
}

/// gdrcopy's `gdr_copy_from_mapping`: copies `size` bytes from `map_d_ptr`, an address inside
/// handle `mh`'s live mapping, to host memory at `h_ptr`, with streaming loads of whole
/// aligned chunks (plain loads from write-combined memory are uncached round trips each).
/// `h_ptr` must hold `size` writable bytes.
///
/// 0, or EINVAL as [`gdr_copy_to_mapping`].
///
/// # Safety
/// For a `size` above 0, `h_ptr` is NULL (refused) or valid for writes of `size` bytes, and
/// nothing else reads or writes them during the call. Any `map_d_ptr` is safe: it is checked
/// against the handle's live mapping before a byte is read.
#[no_mangle]
pub unsafe extern "C" fn gdr_copy_from_mapping(
    mh: GdrMh,
    h_ptr: *mut c_void,
    map_d_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard("gdr_copy_from_mapping", || {
        if size == 0 {
            // Nothing to copy, but a made-up or unmapped handle is still EINVAL (gdrapi.h).
            return with_mapped_range(mh, map_d_ptr.cast(), 0, |_, _| 0);
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, offset| {
            if h.is_staged() {
                let covered = h.covered();
                // SAFETY: the caller passes `size` writable bytes at h_ptr (not NULL: checked).
                return unsafe {
                    staged(
                        &h.engine,
                        covered,
                        Direction::FromGpu,
                        h_ptr.cast(),
                        h.window.va + offset as u64,
                        size,
                    )
                };
            }
            // SAFETY: the caller passes `size` writable bytes at h_ptr, which nothing else
            // touches during the call.
            let dst = unsafe { std::slice::from_raw_parts_mut(h_ptr.cast::<u8>(), size) };
            from_mapping(&HandleMapping(h), offset, dst);
            0
        })
    })
}

/// How the copies of this process choose their path.
enum Policy {
    /// Every copy on the calling thread, through the mapping (gdrcopy's behaviour).
    Mapping,
    /// Per size class, from a calibration.
    Auto {
        copier: AutoCopier,
        /// Copies to the GPU smaller than this stay on the one-thread mapping without asking
        /// the copier, so an 8-byte copy pays one comparison.
        min_to: usize,
        /// The same for copies from the GPU.
        min_from: usize,
    },
}

static POLICY: OnceLock<Policy> = OnceLock::new();

/// Set once the copy engine failed somewhere, so the failure is logged once.
static ENGINE_FAILED: AtomicBool = AtomicBool::new(false);

/// `GDR_CAPI_COPY` as given: `Ok(true)` for `auto` (also unset or empty), `Ok(false)` for
/// `mapping`, `Err` with the value otherwise.
fn parse_choice(v: Option<&str>) -> Result<bool, &str> {
    match v.map(str::trim) {
        None | Some("" | "auto") => Ok(true),
        Some("mapping") => Ok(false),
        Some(other) => Err(other),
    }
}

/// The environment switch, as read: `true` for `auto`; a value that is not a choice is said
/// once, and the default (auto) is used.
fn auto_from_env() -> bool {
    let v = std::env::var("GDR_CAPI_COPY").ok();
    parse_choice(v.as_deref()).unwrap_or_else(|other| {
        log!(
            Level::Error,
            "GDR_CAPI_COPY={other:?} is not a choice (auto, mapping); using auto"
        );
        true
    })
}

/// Chooses the process's copy policy, once (the first `gdr_open` that gets here): the cached
/// calibration of the machine `vulkan` is on, else the typical decisions.
pub(crate) fn init(vulkan: Option<&VulkanBackend>) {
    POLICY.get_or_init(|| {
        if !auto_from_env() {
            log!(
                Level::Info,
                "copies: through the mapping on the calling thread (GDR_CAPI_COPY=mapping; unset, \
                 the path is chosen per size)"
            );
            return Policy::Mapping;
        }
        let cached = vulkan.and_then(|be| match AutoCopier::cached(be) {
            Ok(c) => c,
            Err(e) => {
                log!(Level::Info, "copies: no cached calibration readable: {e}");
                None
            }
        });
        // Taken only where this log shows it: a program that links libgdrapi (the gdr CLI, for
        // its C API column) says the note itself otherwise.
        if crate::log::enabled(Level::Warn) {
            if let Some(note) = gdr::bar::auto::take_cache_note() {
                log!(Level::Warn, "copies: {note}");
            }
        }
        let copier = match cached {
            Some(c) => {
                log!(Level::Info, "copies: paths from this machine's calibration");
                c
            }
            None => {
                log!(
                    Level::Info,
                    "copies: no calibration cached for this machine, typical paths (`gdr \
                     copylat --recalibrate --min-size 1 --max-size 1` measures one)"
                );
                AutoCopier::fixed(Calibration::typical())
            }
        };
        Policy::Auto {
            min_to: copier.smallest_off_one_thread(Direction::ToGpu),
            min_from: copier.smallest_off_one_thread(Direction::FromGpu),
            copier,
        }
    });
}

/// What a handle needs for copies off the mapping: the context of the GPU its memory is on, and
/// (made at its first copy-engine copy) a stream there.
pub(crate) struct Engine {
    ctx: Context,
    stream: LazyStream,
}

impl Engine {
    /// The copy engine of memory on `ctx`'s GPU; nothing is created until it is used.
    pub(crate) fn new(ctx: Context) -> Engine {
        Engine {
            ctx,
            stream: LazyStream::new(),
        }
    }

    /// How this library's copy-engine copies run: on the handle's own stream, after a fence of
    /// the caller's stores through mappings, with the caller's context put back, and through
    /// the mapping when the engine fails (where there is one; logged once).
    fn copy(&self) -> EngineCopy<'_> {
        EngineCopy::new(&self.ctx)
            .on_stream(&self.stream)
            .fencing_stores_first()
            .restoring_context()
            .falling_back(engine_failed)
    }
}

/// A handle's live CPU mapping, as gdr copies it: the caller's mapped bytes from the window's
/// first byte, write-combined, on the handle's copy engine. Made only under the table's read
/// lock, for a mapped handle that is not staged (a staged pin's addresses are a reservation
/// that cannot be touched).
struct HandleMapping<'a>(&'a Handle);

// SAFETY: `cpu..cpu + cpu_len` is the handle's live mapping (gdr_map made it; gdr_unmap, which
// takes the table's write lock, cannot run while this borrow of a handle under the read lock
// lives). The mapping is page-granular, so the lines around any range are readable, and the
// library hands out no Rust reference to its bytes.
unsafe impl MappedMemory for HandleMapping<'_> {
    #[inline]
    fn cpu_ptr(&self) -> *mut u8 {
        self.0.cpu
    }
    #[inline]
    fn size(&self) -> usize {
        self.0.cpu_len
    }
    #[inline]
    fn caching(&self) -> Caching {
        Caching::WriteCombined
    }
}

impl DeviceMapped for HandleMapping<'_> {
    /// The mapping starts at the window's first byte.
    #[inline]
    fn device_addr(&self) -> u64 {
        self.0.window.va
    }
    fn engine(&self) -> EngineCopy<'_> {
        self.0.engine.copy()
    }
}

/// A copy of `len` bytes between host memory at `host` and the GPU memory at `addr` of a
/// staged pin that covers `covered`, on the copy engine: 0; EINVAL (logged) when the range is
/// not in one of `covered` or that allocation was freed since the pin (the copy engine would
/// reach whatever took its place); EIO (logged) when the copy engine fails, for there is no
/// mapping to fall back on.
///
/// # Safety
/// `host` is valid for `len` bytes, reads for [`Direction::ToGpu`], writes otherwise (and then
/// nothing else touches them during the call).
pub(crate) unsafe fn staged(
    engine: &Engine,
    covered: &[crate::table::Covered],
    dir: Direction,
    host: *mut u8,
    addr: u64,
    len: usize,
) -> std::ffi::c_int {
    let way = if dir == Direction::ToGpu {
        "to"
    } else {
        "from"
    };
    if !crate::table::Covered::allows(covered, addr, len) {
        log!(
            Level::Error,
            "copy of {len} bytes {way} GPU memory at {addr:#x} (a staged pin): not an allocation \
             the pin covered, or freed since it was pinned"
        );
        return libc::EINVAL;
    }
    let range = DeviceRange { addr, len };
    let copied = if dir == Direction::ToGpu {
        // SAFETY: `len` readable bytes at `host` (this function's contract), only read.
        let src = unsafe { std::slice::from_raw_parts(host, len) };
        engine.copy().write(&range, 0, src)
    } else {
        // SAFETY: `len` writable bytes at `host` that nothing else touches during the call
        // (this function's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(host, len) };
        engine.copy().read(&range, 0, dst)
    };
    match copied {
        Ok(()) => 0,
        Err(e) => {
            log!(
                Level::Error,
                "copy of {len} bytes {way} GPU memory at {addr:#x} (a staged pin): {e}"
            );
            libc::EIO
        }
    }
}

fn engine_failed(e: &CudaError) {
    if !ENGINE_FAILED.swap(true, Ordering::Relaxed) {
        log!(
            Level::Warn,
            "copies: the copy engine failed ({e}); this copy and later ones that fail go \
             through the mapping"
        );
    }
}

/// The copier and its one-thread threshold for `dir`, unless copies stay on the mapping.
#[inline]
fn chooser(dir: Direction) -> Option<(&'static AutoCopier, usize)> {
    match POLICY.get()? {
        Policy::Mapping => None,
        Policy::Auto {
            copier,
            min_to,
            min_from,
        } => Some((
            copier,
            match dir {
                Direction::ToGpu => *min_to,
                Direction::FromGpu => *min_from,
            },
        )),
    }
}

/// Copies `src` to `offset` of a handle's mapping on the path chosen for its size. Nothing is
/// left to fail: the caller checked the range, and where the copy engine fails the copy goes
/// through the mapping ([`Engine::copy`]).
fn to_mapping(map: &HandleMapping<'_>, offset: usize, src: &[u8]) {
    match chooser(Direction::ToGpu) {
        Some((copier, min)) if src.len() >= min => {
            let _ = copier.write(map, offset, src);
        }
        _ => {
            let _ = map.write_at(offset, src);
        }
    }
}

/// Copies `dst.len()` bytes at `offset` of a handle's mapping into `dst` on the path chosen for
/// its size; nothing is left to fail, as in [`to_mapping`].
fn from_mapping(map: &HandleMapping<'_>, offset: usize, dst: &mut [u8]) {
    match chooser(Direction::FromGpu) {
        Some((copier, min)) if dst.len() >= min => {
            let _ = copier.read(map, offset, dst);
        }
        _ => {
            let _ = map.read_at(offset, dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_takes_auto_and_mapping_only() {
        assert_eq!(parse_choice(None), Ok(true));
        assert_eq!(parse_choice(Some("")), Ok(true));
        assert_eq!(parse_choice(Some(" auto ")), Ok(true));
        assert_eq!(parse_choice(Some("mapping")), Ok(false));
        assert_eq!(parse_choice(Some(" mapping\n")), Ok(false));
        assert_eq!(parse_choice(Some("Mapping")), Err("Mapping"));
        assert_eq!(parse_choice(Some("cuda")), Err("cuda"));
    }
}
