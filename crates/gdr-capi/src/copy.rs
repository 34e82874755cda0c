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

use crate::entry::guard;
use crate::log::{log, Level};
use crate::table::{self, Handle};
use crate::GdrMh;
use gdr::bar::auto::{AutoCopier, Calibration, Direction, Path};
use gdr::bar::VulkanBackend;
use gdr::cuda::{Context, CudaError, CurrentContextGuard, DeviceMemory, Stream};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Checks that `[ptr, ptr + size)` lies in `mh`'s live mapping and runs `f` with the table
/// read-locked (so no unmap can race the copy, while copies on other handles go on).
fn with_mapped_range(
    mh: GdrMh,
    ptr: *const u8,
    size: usize,
    f: impl FnOnce(&Handle, u64) -> c_int,
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
        Some(e) if ptr as usize >= start && e <= end => {
            // The GPU address of `ptr`: the mapping starts at the window's first byte.
            f(h, h.window.va + (ptr as usize - start) as u64)
        }
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
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, addr| {
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
                        addr,
                        size,
                    )
                };
            }
            // SAFETY: the destination lies in the handle's live mapping of the GPU memory at
            // `addr` (checked, table locked).
            unsafe { to_mapping(&h.engine, map_d_ptr.cast(), addr, src) };
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
        with_mapped_range(mh, map_d_ptr.cast(), size, |h, addr| {
            if h.is_staged() {
                let covered = h.covered();
                // SAFETY: the caller passes `size` writable bytes at h_ptr (not NULL: checked).
                return unsafe {
                    staged(
                        &h.engine,
                        covered,
                        Direction::FromGpu,
                        h_ptr.cast(),
                        addr,
                        size,
                    )
                };
            }
            // SAFETY: the caller passes `size` writable bytes at h_ptr; the source lies in the
            // handle's live, page-granular mapping of the GPU memory at `addr` (checked, table
            // locked).
            unsafe {
                let dst = std::slice::from_raw_parts_mut(h_ptr.cast::<u8>(), size);
                from_mapping(&h.engine, dst, map_d_ptr.cast(), addr);
            }
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
    stream: OnceLock<Option<Stream>>,
}

impl Engine {
    /// The copy engine of memory on `ctx`'s GPU; nothing is created until it is used.
    pub(crate) fn new(ctx: Context) -> Engine {
        Engine {
            ctx,
            stream: OnceLock::new(),
        }
    }

    fn stream(&self) -> Result<&Stream, CudaError> {
        self.stream
            .get_or_init(|| match Stream::new(&self.ctx) {
                Ok(s) => Some(s),
                Err(e) => {
                    // Logged here, with its reason; later calls only fall back.
                    engine_failed(&e);
                    None
                }
            })
            .as_ref()
            .ok_or(CudaError::NoDevice)
    }

    /// Copies `len` bytes between host memory and GPU memory at `addr` with the copy engine,
    /// and waits for it.
    ///
    /// # Safety
    /// `host` is valid for `len` bytes: reads when `to_gpu`, else writes (and nothing else
    /// touches them until this returns).
    unsafe fn run(
        &self,
        to_gpu: bool,
        host: *mut u8,
        addr: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        // The caller's stores through the mapping are drained before the copy is launched.
        gdr::copy::store_fence();
        let _current = CurrentContextGuard::save()?;
        self.ctx.bind()?;
        let stream = self.stream()?;
        let range = DeviceRange { addr, len };
        if to_gpu {
            // SAFETY: `len` readable bytes at `host` (this function's contract); they stay
            // untouched until the synchronize below returns.
            let src = unsafe { std::slice::from_raw_parts(host, len) };
            // SAFETY: `src` outlives the copy (synchronized before returning).
            unsafe { stream.memcpy_htod_async(&range, 0, src)? };
        } else {
            // SAFETY: as above, `len` writable bytes at `host`, not read until the copy is done.
            let dst = unsafe { std::slice::from_raw_parts_mut(host, len) };
            // Through gdr's page-locked chunks where `dst` is pageable; done when it returns.
            return gdr::cuda::read_into_host(&self.ctx, dst, &range, 0, Some(stream));
        }
        stream.synchronize()
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
    // SAFETY: `host` holds `len` bytes as `run` needs them, by this function's contract.
    match unsafe { engine.run(dir == Direction::ToGpu, host, addr, len) } {
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

/// A range of device memory named by address, for the copy engine's calls.
struct DeviceRange {
    addr: u64,
    len: usize,
}

impl DeviceMemory for DeviceRange {
    fn device_ptr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
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

/// Copies `src` to the mapping at `dst`, which is GPU address `addr`, on the path chosen for its
/// size.
///
/// # Safety
/// `dst..dst + src.len()` lies in a live CPU mapping of the GPU memory at `addr..`, mapped for
/// writing, and stays mapped for the call.
pub(crate) unsafe fn to_mapping(engine: &Engine, dst: *mut u8, addr: u64, src: &[u8]) {
    let len = src.len();
    let copier = match chooser(Direction::ToGpu) {
        Some((copier, min)) if len >= min => copier,
        _ => {
            // SAFETY: the caller's contract.
            unsafe { gdr::copy::copy_to_mapping(dst, src) };
            return;
        }
    };
    let _ = copier.copy_with(Direction::ToGpu, len, |path| -> Result<(), ()> {
        match path {
            // SAFETY: the caller's contract.
            Path::Mapping { threads: 1 } => unsafe { gdr::copy::copy_to_mapping(dst, src) },
            // SAFETY: the caller's contract; every part is fenced before this returns.
            Path::Mapping { threads } => unsafe {
                gdr::copy::copy_to_mapping_parallel(dst, src, threads)
            },
            Path::CopyEngine => {
                // SAFETY: `src` is `len` readable bytes, and a copy to the GPU only reads them.
                if let Err(e) = unsafe { engine.run(true, src.as_ptr().cast_mut(), addr, len) } {
                    engine_failed(&e);
                    // SAFETY: the caller's contract.
                    unsafe { gdr::copy::copy_to_mapping(dst, src) };
                }
            }
        }
        Ok(())
    });
}

/// Copies from the mapping at `src`, which is GPU address `addr`, into `dst`, on the path chosen
/// for its size.
///
/// # Safety
/// `src..src + dst.len()` lies in a live, page-granular CPU mapping of the GPU memory at
/// `addr..`, and stays mapped for the call.
pub(crate) unsafe fn from_mapping(engine: &Engine, dst: &mut [u8], src: *const u8, addr: u64) {
    let len = dst.len();
    let copier = match chooser(Direction::FromGpu) {
        Some((copier, min)) if len >= min => copier,
        _ => {
            // SAFETY: the caller's contract.
            unsafe { gdr::copy::copy_from_mapping(dst, src) };
            return;
        }
    };
    let _ = copier.copy_with(Direction::FromGpu, len, |path| -> Result<(), ()> {
        match path {
            // SAFETY: the caller's contract.
            Path::Mapping { threads: 1 } => unsafe { gdr::copy::copy_from_mapping(dst, src) },
            // SAFETY: the caller's contract.
            Path::Mapping { threads } => unsafe {
                gdr::copy::copy_from_mapping_parallel(dst, src, threads)
            },
            Path::CopyEngine => {
                // SAFETY: `dst` is `len` bytes borrowed mutably for this call.
                if let Err(e) = unsafe { engine.run(false, dst.as_mut_ptr(), addr, len) } {
                    engine_failed(&e);
                    // SAFETY: the caller's contract.
                    unsafe { gdr::copy::copy_from_mapping(dst, src) };
                }
            }
        }
        Ok(())
    });
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

    #[test]
    fn a_device_range_is_its_address_and_length() {
        let r = DeviceRange {
            addr: 0x7f00_0000_1000,
            len: 12345,
        };
        assert_eq!((r.device_ptr(), r.len()), (0x7f00_0000_1000, 12345));
    }
}
