//! The entry points that describe rather than act: a handle's info (v1 and v2), attributes,
//! the mapping-type names and the library and driver versions.

use crate::abi::*;
use crate::entry::{guard, put};
use crate::log::{log, Level};
use crate::table;
use gdr::bar::PinBackend;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `gdr_info_v2_t`: 48 bytes; `flags` holds the two bit-fields (bit 0 `mapped`, bit 1
/// `wc_mapping`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV2 {
    /// GPU virtual address of the first byte the handle covers: the pinned address rounded
    /// down to `page_size`, within the pinned allocation (what `gdr_map`'s CPU address maps).
    pub va: u64,
    /// Bytes covered from `va`: the pinned range rounded out to `page_size`, clamped to what
    /// the backend pinned; the most `gdr_map` may map.
    pub mapped_size: u64,
    /// The granule of `va` and `mapped_size` in bytes: 64 KiB (gdrcopy's `GPU_PAGE_SIZE`),
    /// the host page size on the dma-buf backend.
    pub page_size: u32,
    /// Deprecated by gdrcopy; always 0.
    pub tm_cycles: u64,
    /// Deprecated by gdrcopy; always 0.
    pub cycles_per_ms: u32,
    /// Bit 0 `mapped`, bit 1 `wc_mapping`: both set while a `gdr_map` mapping is live (every
    /// mapping is write-combined), both clear otherwise. A mapped staged pin (see `gdr_open`)
    /// sets `mapped` only: it has addresses but no CPU access.
    pub flags: c_uint,
    /// A `GDR_MAPPING_TYPE_*` value: [`MAPPING_TYPE_WC`] while mapped, [`MAPPING_TYPE_NONE`]
    /// otherwise and for a staged pin.
    pub mapping_type: c_uint,
}

/// gdrcopy's v1 `gdr_info_t` (what the exported symbol `gdr_get_info` fills): the v2 struct
/// without `mapping_type`, 40 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV1 {
    /// As [`GdrInfoV2::va`].
    pub va: u64,
    /// As [`GdrInfoV2::mapped_size`].
    pub mapped_size: u64,
    /// As [`GdrInfoV2::page_size`].
    pub page_size: u32,
    /// Deprecated by gdrcopy; always 0.
    pub tm_cycles: u64,
    /// Deprecated by gdrcopy; always 0.
    pub cycles_per_ms: u32,
    /// As [`GdrInfoV2::flags`].
    pub flags: c_uint,
}

/// The v2 info of handle `mh` of `g`.
fn info_of(g: *mut c_void, mh: GdrMh) -> Result<GdrInfoV2, c_int> {
    let s = table::read();
    let s = s.as_ref().ok_or(libc::EINVAL)?;
    if !s.gdrs.contains_key(&(g as usize)) {
        return Err(libc::EINVAL);
    }
    let h = s
        .handles
        .get(&(mh.h as u64))
        .filter(|h| h.owner == g as usize)
        .ok_or(libc::EINVAL)?;
    let mapped = h.is_mapped();
    // A staged pin is mapped (gdr_map gave it addresses) but not write-combined: its copies
    // run on the copy engine, and no CPU access reaches the memory.
    let wc = mapped && !h.is_staged();
    Ok(GdrInfoV2 {
        va: h.window.va,
        mapped_size: h.window.len,
        page_size: h.window.page,
        tm_cycles: 0,
        cycles_per_ms: 0,
        flags: c_uint::from(mapped) | (c_uint::from(wc) << 1),
        mapping_type: if wc {
            MAPPING_TYPE_WC
        } else {
            MAPPING_TYPE_NONE
        },
    })
}

/// gdrcopy's `gdr_get_info_v2`: fills `*info` with handle `mh`'s range and mapping state
/// ([`GdrInfoV2`]).
///
/// 0, or EINVAL when `info` is NULL, `g` is not open or `mh` is not a handle of `g`.
///
/// # Safety
/// `info` is NULL or valid for a write of a [`GdrInfoV2`].
#[no_mangle]
pub unsafe extern "C" fn gdr_get_info_v2(g: *mut c_void, mh: GdrMh, info: *mut GdrInfoV2) -> c_int {
    guard("gdr_get_info_v2", || {
        if info.is_null() {
            return libc::EINVAL;
        }
        match info_of(g, mh) {
            // SAFETY: `info` is not NULL, and writable by this function's contract.
            Ok(i) => unsafe { put(info, i) },
            Err(e) => e,
        }
    })
}

/// `gdr_get_info`: gdrcopy's v1 call, still exported for binaries and `dlsym` users (NCCL);
/// fills the 40-byte v1 struct only ([`GdrInfoV1`]; in C source the name means
/// `gdr_get_info_v2`). Errors as [`gdr_get_info_v2`].
///
/// # Safety
/// `info` is NULL or valid for a write of a [`GdrInfoV1`] (40 bytes: a C caller that passes
/// the v2 struct is safe too).
#[no_mangle]
pub unsafe extern "C" fn gdr_get_info(g: *mut c_void, mh: GdrMh, info: *mut GdrInfoV1) -> c_int {
    guard("gdr_get_info", || {
        if info.is_null() {
            return libc::EINVAL;
        }
        match info_of(g, mh) {
            // SAFETY: `info` is not NULL, and writable by this function's contract.
            Ok(i) => unsafe {
                put(
                    info,
                    GdrInfoV1 {
                        va: i.va,
                        mapped_size: i.mapped_size,
                        page_size: i.page_size,
                        tm_cycles: i.tm_cycles,
                        cycles_per_ms: i.cycles_per_ms,
                        flags: i.flags,
                    },
                )
            },
            Err(e) => e,
        }
    })
}

/// gdrcopy's `gdr_get_attribute`: writes the value of attribute `attr` of `g` to `*v`
/// ([`ATTR_USE_PERSISTENT_MAPPING`], [`ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE`],
/// [`ATTR_USING_DMA_BUF_MMAP`] and gdr's [`ATTR_GDR_BACKEND`]).
///
/// 0, or EINVAL when `v` is NULL, `g` is not open or `attr` is none of those, or EIO when
/// gdrdrv's own answer cannot be had.
///
/// # Safety
/// `v` is NULL or valid for a write of a `c_int`.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_attribute(g: *mut c_void, attr: c_int, v: *mut c_int) -> c_int {
    guard("gdr_get_attribute", || {
        if v.is_null() {
            return libc::EINVAL;
        }
        let value = {
            let s = table::read();
            let Some(gdr) = s.as_ref().and_then(|s| s.gdrs.get(&(g as usize))) else {
                return libc::EINVAL;
            };
            let backend = gdr.backend();
            let drv = gdr.first_pinner().and_then(|p| p.gdrdrv());
            match (attr, drv) {
                (ATTR_USE_PERSISTENT_MAPPING | ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, Some(d)) => d
                    .get_attr(gdr::bar::GdrDrvAttr(attr as u32))
                    .map(|x| x as c_int)
                    .map_err(|e| {
                        log!(Level::Error, "gdr_get_attribute({attr}): {e}");
                        libc::EIO
                    }),
                // dma-buf and Vulkan pins hold the memory until unpinned, and every mapping of
                // a discrete GPU on this host is BAR1 over PCIe.
                (ATTR_USE_PERSISTENT_MAPPING | ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, None) => Ok(1),
                (ATTR_USING_DMA_BUF_MMAP, _) => Ok(c_int::from(backend == PinBackend::DmaBuf)),
                (ATTR_GDR_BACKEND, _) => Ok(backend_code(backend)),
                _ => {
                    log!(Level::Debug, "gdr_get_attribute: unknown attribute {attr}");
                    Err(libc::EINVAL)
                }
            }
        };
        match value {
            // SAFETY: `v` is not NULL, and writable by this function's contract.
            Ok(x) => unsafe { put(v, x) },
            Err(e) => e,
        }
    })
}

/// gdrcopy's `gdr_get_mapping_type_string`: writes to `*pstr` a static NUL-terminated name of
/// `mapping_type` ("None", "Write Combining", "Caching", "Device").
///
/// 0, or EINVAL for any other value or a NULL `pstr`.
///
/// # Examples
///
/// ```
/// use gdrapi::{gdr_get_mapping_type_string, MAPPING_TYPE_WC};
/// use std::ffi::{c_char, CStr};
///
/// let mut name: *const c_char = std::ptr::null();
/// // SAFETY: `name` is a live pointer to write to.
/// assert_eq!(unsafe { gdr_get_mapping_type_string(MAPPING_TYPE_WC, &mut name) }, 0);
/// // SAFETY: the call wrote a static NUL-terminated name.
/// assert_eq!(unsafe { CStr::from_ptr(name) }, c"Write Combining");
/// // SAFETY: as above; nothing is written for a type that does not exist.
/// assert_eq!(unsafe { gdr_get_mapping_type_string(9, &mut name) }, libc::EINVAL);
/// ```
///
/// # Safety
/// `pstr` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_mapping_type_string(
    mapping_type: c_uint,
    pstr: *mut *const c_char,
) -> c_int {
    guard("gdr_get_mapping_type_string", || {
        let name: &'static std::ffi::CStr = match mapping_type {
            MAPPING_TYPE_NONE => c"None",
            MAPPING_TYPE_WC => c"Write Combining",
            MAPPING_TYPE_CACHING => c"Caching",
            MAPPING_TYPE_DEVICE => c"Device",
            _ => return libc::EINVAL,
        };
        // SAFETY: `pstr` is NULL (refused) or writable by this function's contract.
        unsafe { put(pstr, name.as_ptr()) }
    })
}

/// gdrcopy's `gdr_runtime_get_version`: writes the API level this library implements,
/// [`API_MAJOR`].[`API_MINOR`] (2.6), to `*major` and `*minor`; a NULL pointer is skipped.
/// Cannot fail, and works without a GPU or a `gdr_t`.
///
/// # Examples
///
/// ```
/// use gdrapi::{gdr_runtime_get_version, API_MAJOR, API_MINOR};
///
/// let (mut major, mut minor) = (0, 0);
/// // SAFETY: both point to live `c_int`s.
/// unsafe { gdr_runtime_get_version(&mut major, &mut minor) };
/// assert_eq!((major, minor), (2, 6));
/// assert_eq!((major, minor), (API_MAJOR, API_MINOR));
/// ```
///
/// # Safety
/// `major` and `minor` are each NULL or valid for a write of a `c_int`.
#[no_mangle]
pub unsafe extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
    // SAFETY: each is NULL (skipped) or writable by this function's contract.
    let _ = unsafe { put(major, API_MAJOR) };
    // SAFETY: as above.
    let _ = unsafe { put(minor, API_MINOR) };
}

/// gdrcopy's `gdr_driver_get_version`: writes gdrdrv's version to `*major` and `*minor`, or
/// [`USER_SPACE_DRIVER_VERSION`] on the backends without a kernel module (so that version
/// gates such as NCCL's accept a backend that works).
///
/// 0, or EINVAL when a pointer is NULL or `g` is not open.
///
/// # Safety
/// `major` and `minor` are each NULL or valid for a write of a `c_int`.
#[no_mangle]
pub unsafe extern "C" fn gdr_driver_get_version(
    g: *mut c_void,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    guard("gdr_driver_get_version", || {
        if major.is_null() || minor.is_null() {
            return libc::EINVAL;
        }
        let v = table::read().as_ref().and_then(|s| {
            let gdr = s.gdrs.get(&(g as usize))?;
            Some(gdr.first_pinner().and_then(|p| p.gdrdrv()).map_or(
                USER_SPACE_DRIVER_VERSION,
                |d| {
                    let v = d.version().driver;
                    (v.major() as c_int, v.minor() as c_int)
                },
            ))
        });
        let Some((a, b)) = v else {
            return libc::EINVAL;
        };
        // SAFETY: both are non-NULL (checked above) and writable by this function's contract.
        unsafe {
            put(major, a);
            put(minor, b)
        }
    })
}
