//! A stand-in for gdrcopy's `libgdrapi.so.2` on top of gdr: gdrcopy's C API names and
//! semantics (see `include/gdrapi.h`), with pinning through [`gdr::bar::Pinner`] and one
//! extension, `gdr_alloc_mapped`, for machines where only new memory can be mapped (Vulkan).
//!
//! Every entry point catches panics (none may unwind into C) and returns 0 or a positive
//! errno. Handles and `gdr_t` values are looked up in one process-wide table, so a stale or
//! made-up handle is answered with `EINVAL` instead of touching freed memory.

// The entry points are C functions whose pointer contracts are the header's; Rust callers are
// only this crate's tests. `c_ulong` is u64 here but not on every target, hence the casts.
#![allow(clippy::not_unsafe_ptr_arg_deref, clippy::unnecessary_cast)]

use gdr::bar::{MappedBuffer, PinBackend, Pinned, PinnedMapping, Pinner, VulkanBackend};
use gdr::cuda::{Context, DeviceMemory};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};

/// `gdr_mh_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrMh {
    pub h: c_ulong,
}

/// `gdr_info_v2_t`: 48 bytes; `flags` holds the two bit-fields (bit 0 `mapped`, bit 1
/// `wc_mapping`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV2 {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub flags: c_uint,
    pub mapping_type: c_uint,
}

pub const MAPPING_TYPE_NONE: c_uint = 0;
pub const MAPPING_TYPE_WC: c_uint = 1;
pub const ATTR_USE_PERSISTENT_MAPPING: c_int = 1;
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int = 2;
pub const PIN_FLAG_FORCE_PCIE: u32 = 1;
pub const API_MAJOR: c_int = 2;
pub const API_MINOR: c_int = 5;

/// One `gdr_open`.
struct Gdr {
    ctx: Context,
    pinner: Option<Pinner>,
    vulkan: Option<VulkanBackend>,
}

enum Kind {
    /// An existing range pinned. `map` borrows `pin` (boxed, so its address is stable) and is
    /// declared first so that it drops first.
    Pin {
        map: Option<PinnedMapping<'static>>,
        pin: Box<Pinned>,
    },
    /// Memory from `gdr_alloc_mapped`: mapped from birth; `mapped` tracks gdr_map/gdr_unmap.
    Alloc { buf: MappedBuffer, mapped: bool },
}

struct Handle {
    owner: usize,
    kind: Kind,
}

impl Handle {
    /// (GPU address of the first pinned byte, bytes pinned, CPU address of that byte).
    fn geometry(&self) -> (u64, u64, *mut u8) {
        match &self.kind {
            Kind::Pin { map, pin } => (
                pin.start(),
                pin.pinned_len(),
                map.as_ref().map_or(std::ptr::null_mut(), |m| m.base_ptr()),
            ),
            Kind::Alloc { buf, .. } => (buf.device_ptr(), buf.len() as u64, buf.host_ptr()),
        }
    }

    fn is_mapped(&self) -> bool {
        match &self.kind {
            Kind::Pin { map, .. } => map.is_some(),
            Kind::Alloc { mapped, .. } => *mapped,
        }
    }
}

#[derive(Default)]
struct State {
    gdrs: HashMap<usize, Gdr>,
    handles: HashMap<u64, Handle>,
    next: u64,
}

// SAFETY: every value in the table is Send except the CPU mapping pointers inside handles,
// which are only dereferenced by the copy functions with the table locked.
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut g = state();
    f(g.get_or_insert_with(State::default))
}

/// Runs an entry point, turning a panic into `EIO`.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(libc::EIO)
}

fn open_inner() -> Option<Gdr> {
    let ordinal = std::env::var("GDR_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let ctx = Context::on(ordinal).ok()?;
    let pinner = Pinner::new(&ctx, None).ok();
    let vulkan = VulkanBackend::new(&ctx).ok();
    if pinner.is_none() && vulkan.is_none() {
        return None;
    }
    Some(Gdr {
        ctx,
        pinner,
        vulkan,
    })
}

/// `gdr_open`.
#[no_mangle]
pub extern "C" fn gdr_open() -> *mut c_void {
    catch_unwind(|| {
        let Some(g) = open_inner() else {
            return std::ptr::null_mut();
        };
        // A token that is never handed out twice (not a freed allocation that malloc could
        // return again), so a stale gdr_t can never alias a newer one.
        with_state(|s| {
            s.next += 1;
            let token = (s.next as usize) << 4;
            s.gdrs.insert(token, g);
            token as *mut c_void
        })
    })
    .unwrap_or(std::ptr::null_mut())
}

/// `gdr_close`.
#[no_mangle]
pub extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    guard(|| {
        let (gone, doomed) = with_state(|s| {
            let gone = s.gdrs.remove(&(g as usize));
            let keys: Vec<u64> = s
                .handles
                .iter()
                .filter(|(_, h)| h.owner == g as usize)
                .map(|(&k, _)| k)
                .collect();
            let doomed: Vec<Handle> = keys
                .into_iter()
                .filter_map(|k| s.handles.remove(&k))
                .collect();
            (gone, doomed)
        });
        let Some(gdr) = gone else {
            return libc::EINVAL;
        };
        drop(doomed);
        drop(gdr);
        0
    })
}

fn pin(g: *mut c_void, addr: c_ulong, size: usize, out: *mut GdrMh) -> c_int {
    if out.is_null() || size == 0 {
        return libc::EINVAL;
    }
    let pinner = with_state(|s| s.gdrs.get(&(g as usize)).map(|gd| gd.pinner.clone()));
    let pinner = match pinner {
        None => return libc::EINVAL,
        Some(None) => return libc::ENOTSUP,
        Some(Some(p)) => p,
    };
    let pinned = match pinner.pin(addr as u64, size as u64) {
        Ok(p) => Box::new(p),
        Err(gdr::bar::PinError::Cuda(_) | gdr::bar::PinError::Peer(_)) => return libc::EINVAL,
        Err(gdr::bar::PinError::NotExportable { .. }) => return libc::ENOTSUP,
        Err(_) => return libc::EIO,
    };
    // Pinning ran unlocked: `g` may have been closed meanwhile; then the pin is released here
    // instead of being left in the table with no owner.
    let h = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return Err(pinned);
        }
        s.next += 1;
        let h = s.next;
        s.handles.insert(
            h,
            Handle {
                owner: g as usize,
                kind: Kind::Pin {
                    map: None,
                    pin: pinned,
                },
            },
        );
        Ok(h)
    });
    let Ok(h) = h else {
        return libc::EINVAL;
    };
    // SAFETY: checked non-null; the caller passes a writable gdr_mh_t.
    unsafe { out.write(GdrMh { h: h as c_ulong }) };
    0
}

/// `gdr_pin_buffer`. The P2P token and VA space (for legacy UVA-less code) are ignored, as
/// gdrcopy's own dma-buf backend does.
#[no_mangle]
pub extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    handle: *mut GdrMh,
) -> c_int {
    guard(|| pin(g, addr, size, handle))
}

/// `gdr_pin_buffer_v2`: FORCE_PCIE is what every backend here does on a discrete GPU.
#[no_mangle]
pub extern "C" fn gdr_pin_buffer_v2(
    g: *mut c_void,
    addr: c_ulong,
    size: usize,
    flags: u32,
    handle: *mut GdrMh,
) -> c_int {
    guard(|| {
        if flags & !PIN_FLAG_FORCE_PCIE != 0 {
            return libc::EINVAL;
        }
        pin(g, addr, size, handle)
    })
}

/// Removes `mh` of `g` if `accept` says it is the right kind.
fn take_handle(g: *mut c_void, mh: GdrMh, accept: fn(&Kind) -> bool) -> c_int {
    let taken = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return Err(libc::EINVAL);
        }
        match s.handles.get(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize && accept(&h.kind) => {
                Ok(s.handles.remove(&(mh.h as u64)))
            }
            _ => Err(libc::EINVAL),
        }
    });
    match taken {
        Ok(h) => {
            drop(h); // unmaps, then unpins or frees, outside the lock
            0
        }
        Err(e) => e,
    }
}

/// `gdr_unpin_buffer` (a live mapping is torn down first).
#[no_mangle]
pub extern "C" fn gdr_unpin_buffer(g: *mut c_void, mh: GdrMh) -> c_int {
    guard(|| take_handle(g, mh, |k| matches!(k, Kind::Pin { .. })))
}

/// `gdr_free_mapped` (extension).
#[no_mangle]
pub extern "C" fn gdr_free_mapped(g: *mut c_void, mh: GdrMh) -> c_int {
    guard(|| take_handle(g, mh, |k| matches!(k, Kind::Alloc { .. })))
}

/// Runs `f` on handle `mh` of `g`.
fn with_handle(g: *mut c_void, mh: GdrMh, f: impl FnOnce(&mut Handle, &Gdr) -> c_int) -> c_int {
    with_state(|s| {
        let Some(gdr) = s.gdrs.get(&(g as usize)) else {
            return libc::EINVAL;
        };
        match s.handles.get_mut(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize => f(h, gdr),
            _ => libc::EINVAL,
        }
    })
}

/// `gdr_get_callback_flag`: whether the memory was freed while pinned.
#[no_mangle]
pub extern "C" fn gdr_get_callback_flag(g: *mut c_void, mh: GdrMh, flag: *mut c_int) -> c_int {
    guard(|| {
        if flag.is_null() {
            return libc::EINVAL;
        }
        with_handle(g, mh, |h, _| {
            let fired = match &h.kind {
                Kind::Pin { pin, .. } => match pin.callback_fired() {
                    Ok(f) => f,
                    Err(_) => return libc::EIO,
                },
                Kind::Alloc { .. } => false,
            };
            // SAFETY: checked non-null; the caller passes a writable int.
            unsafe { flag.write(c_int::from(fired)) };
            0
        })
    })
}

/// `gdr_get_info_v2`.
#[no_mangle]
pub extern "C" fn gdr_get_info_v2(g: *mut c_void, mh: GdrMh, info: *mut GdrInfoV2) -> c_int {
    guard(|| {
        if info.is_null() {
            return libc::EINVAL;
        }
        with_handle(g, mh, |h, _| {
            let (va, len, _) = h.geometry();
            let page_size = match &h.kind {
                Kind::Pin { pin, .. } if pin.backend() == PinBackend::DmaBuf => {
                    gdr::peer::dmabuf::host_page_size() as u32
                }
                _ => 1 << 16,
            };
            let mapped = h.is_mapped();
            let out = GdrInfoV2 {
                va,
                mapped_size: len,
                page_size,
                tm_cycles: 0,
                cycles_per_ms: 0,
                flags: c_uint::from(mapped) | (c_uint::from(mapped) << 1),
                mapping_type: if mapped {
                    MAPPING_TYPE_WC
                } else {
                    MAPPING_TYPE_NONE
                },
            };
            // SAFETY: checked non-null; the caller passes a writable gdr_info_v2_t.
            unsafe { info.write(out) };
            0
        })
    })
}

fn map(g: *mut c_void, mh: GdrMh, va: *mut *mut c_void, size: usize, flags: u32) -> c_int {
    if va.is_null() || size == 0 || !matches!(flags, MAPPING_TYPE_NONE | MAPPING_TYPE_WC) {
        return libc::EINVAL;
    }
    with_handle(g, mh, |h, _| {
        let (_, len, _) = h.geometry();
        if size as u64 > len {
            return libc::EINVAL;
        }
        if h.is_mapped() {
            return libc::EBUSY;
        }
        match &mut h.kind {
            Kind::Pin { map, pin } => {
                let p: &Pinned = pin;
                // SAFETY: the Box keeps the pin at a fixed address until the handle drops, and
                // the handle drops `map` before `pin` (field order; gdr_unmap clears it first).
                let p: &'static Pinned = unsafe { &*(p as *const Pinned) };
                match p.map() {
                    Ok(m) => *map = Some(m),
                    Err(_) => return libc::EIO,
                }
            }
            Kind::Alloc { mapped, .. } => *mapped = true,
        }
        let (_, _, host) = h.geometry();
        // SAFETY: checked non-null; the caller passes a writable void *.
        unsafe { va.write(host.cast()) };
        0
    })
}

/// `gdr_map`.
#[no_mangle]
pub extern "C" fn gdr_map(g: *mut c_void, mh: GdrMh, va: *mut *mut c_void, size: usize) -> c_int {
    guard(|| map(g, mh, va, size, MAPPING_TYPE_NONE))
}

/// `gdr_map_v2`: `flags` is the wanted mapping type (NONE or WC; both give WC here).
#[no_mangle]
pub extern "C" fn gdr_map_v2(
    g: *mut c_void,
    mh: GdrMh,
    va: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> c_int {
    guard(|| map(g, mh, va, size, flags))
}

/// `gdr_unmap`: `va` must be what gdr_map gave.
#[no_mangle]
pub extern "C" fn gdr_unmap(g: *mut c_void, mh: GdrMh, va: *mut c_void, size: usize) -> c_int {
    guard(|| {
        with_handle(g, mh, |h, _| {
            let (_, len, host) = h.geometry();
            if !h.is_mapped() || va.cast::<u8>() != host || size == 0 || size as u64 > len {
                return libc::EINVAL;
            }
            match &mut h.kind {
                Kind::Pin { map, .. } => *map = None,
                Kind::Alloc { mapped, .. } => *mapped = false,
            }
            0
        })
    })
}

/// Checks that `[ptr, ptr + size)` lies in `mh`'s live mapping and runs `f` with the table
/// locked (so no unmap can race the copy).
fn with_mapped_range(mh: GdrMh, ptr: *const u8, size: usize, f: impl FnOnce()) -> c_int {
    with_state(|s| {
        let Some(h) = s.handles.get(&(mh.h as u64)) else {
            return libc::EINVAL;
        };
        if !h.is_mapped() {
            return libc::EINVAL;
        }
        let (_, len, host) = h.geometry();
        let (start, end) = (host as usize, host as usize + len as usize);
        match (ptr as usize).checked_add(size) {
            Some(e) if ptr as usize >= start && e <= end => {
                f();
                0
            }
            _ => libc::EINVAL,
        }
    })
}

/// `gdr_copy_to_mapping`.
#[no_mangle]
pub extern "C" fn gdr_copy_to_mapping(
    mh: GdrMh,
    map_d_ptr: *mut c_void,
    h_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard(|| {
        if size == 0 {
            return 0;
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, || {
            // SAFETY: the caller passes `size` readable bytes at h_ptr; the destination lies in
            // the handle's live mapping (checked, table locked).
            unsafe {
                let src = std::slice::from_raw_parts(h_ptr.cast::<u8>(), size);
                gdr::copy::copy_to_mapping(map_d_ptr.cast(), src);
            }
        })
    })
}

/// `gdr_copy_from_mapping`.
#[no_mangle]
pub extern "C" fn gdr_copy_from_mapping(
    mh: GdrMh,
    h_ptr: *mut c_void,
    map_d_ptr: *const c_void,
    size: usize,
) -> c_int {
    guard(|| {
        if size == 0 {
            return 0;
        }
        if h_ptr.is_null() || map_d_ptr.is_null() {
            return libc::EINVAL;
        }
        with_mapped_range(mh, map_d_ptr.cast(), size, || {
            // SAFETY: the caller passes `size` writable bytes at h_ptr; the source lies in the
            // handle's live, page-granular mapping (checked, table locked).
            unsafe {
                let dst = std::slice::from_raw_parts_mut(h_ptr.cast::<u8>(), size);
                gdr::copy::copy_from_mapping(dst, map_d_ptr.cast());
            }
        })
    })
}

/// `gdr_get_attribute`.
#[no_mangle]
pub extern "C" fn gdr_get_attribute(g: *mut c_void, attr: c_int, v: *mut c_int) -> c_int {
    guard(|| {
        if v.is_null() {
            return libc::EINVAL;
        }
        let value = with_state(|s| {
            let gdr = s.gdrs.get(&(g as usize))?;
            let drv = gdr.pinner.as_ref().and_then(|p| p.gdrdrv());
            Some(match (attr, drv) {
                (ATTR_USE_PERSISTENT_MAPPING | ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, Some(d)) => d
                    .get_attr(gdr::bar::gdrdrv::Attr(attr as u32))
                    .map(|x| x as c_int)
                    .map_err(|_| libc::EIO),
                // dma-buf and Vulkan pins keep the memory until unpinned: persistent.
                (ATTR_USE_PERSISTENT_MAPPING, None) => Ok(1),
                (ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, None) => Ok(0),
                _ => Err(libc::EINVAL),
            })
        });
        match value {
            None => libc::EINVAL,
            Some(Err(e)) => e,
            Some(Ok(x)) => {
                // SAFETY: checked non-null.
                unsafe { v.write(x) };
                0
            }
        }
    })
}

/// `gdr_runtime_get_version`: the API level this library implements.
#[no_mangle]
pub extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
    let _ = catch_unwind(|| {
        // SAFETY: each pointer is written only when non-null.
        unsafe {
            if !major.is_null() {
                major.write(API_MAJOR);
            }
            if !minor.is_null() {
                minor.write(API_MINOR);
            }
        }
    });
}

/// `gdr_driver_get_version`: gdrdrv's version, or 0.0 when no kernel driver is in use.
#[no_mangle]
pub extern "C" fn gdr_driver_get_version(
    g: *mut c_void,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    guard(|| {
        if major.is_null() || minor.is_null() {
            return libc::EINVAL;
        }
        let v = with_state(|s| {
            let gdr = s.gdrs.get(&(g as usize))?;
            Some(
                gdr.pinner
                    .as_ref()
                    .and_then(|p| p.gdrdrv())
                    .map_or((0, 0), |d| {
                        let v = d.version().driver;
                        (v.major() as c_int, v.minor() as c_int)
                    }),
            )
        });
        let Some((a, b)) = v else {
            return libc::EINVAL;
        };
        // SAFETY: both checked non-null.
        unsafe {
            major.write(a);
            minor.write(b);
        }
        0
    })
}

/// `gdr_alloc_mapped` (extension): GPU memory with a CPU mapping, through Vulkan.
#[no_mangle]
pub extern "C" fn gdr_alloc_mapped(
    g: *mut c_void,
    size: usize,
    dptr: *mut c_ulong,
    handle: *mut GdrMh,
) -> c_int {
    guard(|| {
        if dptr.is_null() || handle.is_null() || size == 0 {
            return libc::EINVAL;
        }
        let be = with_state(|s| s.gdrs.get(&(g as usize)).map(|gd| gd.vulkan.clone()));
        let be = match be {
            None => return libc::EINVAL,
            Some(None) => return libc::ENOTSUP,
            Some(Some(be)) => be,
        };
        let buf = match be.alloc(size, 1 << 16) {
            Ok(b) => b,
            Err(gdr::bar::BarError::OutOfMemory { .. }) => return libc::ENOMEM,
            Err(gdr::bar::BarError::BadLayout(_)) => return libc::EINVAL,
            Err(_) => return libc::EIO,
        };
        let addr = buf.device_ptr();
        // As in pin: `g` may have been closed while allocating.
        let h = with_state(|s| {
            if !s.gdrs.contains_key(&(g as usize)) {
                return Err(buf);
            }
            s.next += 1;
            let h = s.next;
            s.handles.insert(
                h,
                Handle {
                    owner: g as usize,
                    kind: Kind::Alloc { buf, mapped: false },
                },
            );
            Ok(h)
        });
        let Ok(h) = h else {
            return libc::EINVAL;
        };
        // SAFETY: both checked non-null; the caller passes writable outputs.
        unsafe {
            dptr.write(addr as c_ulong);
            handle.write(GdrMh { h: h as c_ulong });
        }
        0
    })
}

/// The CUDA context a `gdr_t` uses (for tests and for callers mixing this API with gdr's Rust
/// one); `None` for a closed or unknown `g`.
pub fn context_of(g: *mut c_void) -> Option<Context> {
    with_state(|s| s.gdrs.get(&(g as usize)).map(|gd| gd.ctx.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_layout_matches_the_header() {
        assert_eq!(std::mem::size_of::<GdrInfoV2>(), 48);
        assert_eq!(std::mem::offset_of!(GdrInfoV2, tm_cycles), 24);
        assert_eq!(std::mem::offset_of!(GdrInfoV2, cycles_per_ms), 32);
        assert_eq!(std::mem::offset_of!(GdrInfoV2, flags), 36);
        assert_eq!(std::mem::offset_of!(GdrInfoV2, mapping_type), 40);
        assert_eq!(std::mem::size_of::<GdrMh>(), 8);
    }

    #[test]
    fn bad_handles_and_gdrs_are_refused() {
        let bogus = 0x1234usize as *mut c_void;
        let mh = GdrMh { h: 77 };
        assert_eq!(gdr_close(bogus), libc::EINVAL);
        assert_eq!(gdr_unpin_buffer(bogus, mh), libc::EINVAL);
        assert_eq!(gdr_free_mapped(bogus, mh), libc::EINVAL);
        let mut out = GdrMh { h: 0 };
        assert_eq!(
            gdr_pin_buffer(bogus, 0x1000, 4096, 0, 0, &mut out),
            libc::EINVAL
        );
        assert_eq!(
            gdr_pin_buffer_v2(bogus, 0x1000, 4096, 8, &mut out),
            libc::EINVAL
        );
        let mut info = GdrInfoV2::default();
        assert_eq!(gdr_get_info_v2(bogus, mh, &mut info), libc::EINVAL);
        let mut va = std::ptr::null_mut();
        assert_eq!(gdr_map(bogus, mh, &mut va, 4096), libc::EINVAL);
        assert_eq!(gdr_unmap(bogus, mh, va, 4096), libc::EINVAL);
        let buf = [0u8; 8];
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_copy_to_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 8),
            libc::EINVAL
        );
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 8),
            libc::EINVAL
        );
        let mut v = 0;
        assert_eq!(gdr_get_attribute(bogus, 1, &mut v), libc::EINVAL);
        let (mut a, mut b) = (0, 0);
        assert_eq!(gdr_driver_get_version(bogus, &mut a, &mut b), libc::EINVAL);
        gdr_runtime_get_version(&mut a, &mut b);
        assert_eq!((a, b), (2, 5));
        let mut d: c_ulong = 0;
        assert_eq!(gdr_alloc_mapped(bogus, 64, &mut d, &mut out), libc::EINVAL);
        assert_eq!(
            gdr_alloc_mapped(bogus, 64, std::ptr::null_mut(), &mut out),
            libc::EINVAL
        );
    }
}
