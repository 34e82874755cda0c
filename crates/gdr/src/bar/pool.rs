//! Pins of memory that a pool in this process already maps: gdr's allocator.
//!
//! gdr's allocator (`libgdr_alloc.so`, the `gdr-alloc` crates) serves a program's `cudaMalloc`
//! from chunks of POSIX-fd `cuMemCreate` memory and keeps one CPU mapping per chunk. A pin of
//! its memory asks the allocator for that mapping instead of importing the allocation into
//! Vulkan again, so such a pin costs a lookup instead of an import
//! (docs/alloc.md#results).
//! The allocator is a separate shared library (preloaded into programs that are not rebuilt),
//! so it is reached through its C ABI (`gdr_alloc.h`), found at run time:
//! - in the process's global symbol scope (the library preloaded, or linked), or
//! - in a library named with [`use_library`] (a framework that loaded it privately).
//!
//! This module is the client side; the `gdr-alloc` crates implement the ABI with the types
//! defined here ([`PoolPinInfo`], the symbol names), so both sides share one definition.

use std::ffi::{c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

/// The version of the ABI this module speaks (`GDR_ALLOC_ABI_VERSION`).
pub const ABI_VERSION: c_int = 1;

/// `gdr_alloc_abi_version`: `int (void)`.
pub const SYM_ABI_VERSION: &CStr = c"gdr_alloc_abi_version";
/// `gdr_alloc_pin`: `int (uint64_t addr, size_t size, gdr_alloc_pin_t *out)`.
pub const SYM_PIN: &CStr = c"gdr_alloc_pin";
/// `gdr_alloc_unpin`: `int (uint64_t id)`.
pub const SYM_UNPIN: &CStr = c"gdr_alloc_unpin";
/// `gdr_alloc_pin_freed`: `int (uint64_t id, int *freed)`.
pub const SYM_PIN_FREED: &CStr = c"gdr_alloc_pin_freed";
/// `gdr_alloc_map`: `int (uint64_t id)`.
pub const SYM_MAP: &CStr = c"gdr_alloc_map";
/// `gdr_alloc_unmap`: `int (uint64_t id)`.
pub const SYM_UNMAP: &CStr = c"gdr_alloc_unmap";

/// `gdr_alloc_pin_t`: what a pin of pool memory gives (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PoolPinInfo {
    /// Token for unpin and the freed query.
    pub id: u64,
    /// Device address of the first byte of the chunk that holds the pinned range.
    pub base: u64,
    /// Bytes in that chunk.
    pub size: u64,
    /// CPU address of `base`: a write-combined mapping of the whole chunk.
    pub cpu: *mut c_void,
    /// CUDA device ordinal of the chunk.
    pub device: i32,
    /// Reserved for the ABI's growth; the allocator writes 0.
    pub reserved: u32,
}

impl Default for PoolPinInfo {
    fn default() -> Self {
        PoolPinInfo {
            id: 0,
            base: 0,
            size: 0,
            cpu: std::ptr::null_mut(),
            device: 0,
            reserved: 0,
        }
    }
}

type PinFn = unsafe extern "C" fn(u64, usize, *mut PoolPinInfo) -> c_int;
type UnpinFn = unsafe extern "C" fn(u64) -> c_int;
type FreedFn = unsafe extern "C" fn(u64, *mut c_int) -> c_int;
type VersionFn = unsafe extern "C" fn() -> c_int;

/// The allocator's entry points.
struct PoolApi {
    pin: PinFn,
    unpin: UnpinFn,
    freed: FreedFn,
    map: UnpinFn,
    unmap: UnpinFn,
    /// Keeps a library named by [`use_library`] loaded while the pointers live (for ever).
    _lib: Option<libloading::Library>,
}

/// Why a named pool library cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PoolLibraryError {
    /// `dlopen` failed.
    #[error("cannot load {path}: {reason}")]
    Load {
        /// The library's path, as given.
        path: String,
        /// The loader's error text.
        reason: String,
    },
    /// The library loaded but lacks one of the allocator's symbols.
    #[error("{path} is not gdr's allocator: it lacks {symbol}")]
    NotAllocator {
        /// The library's path, as given.
        path: String,
        /// The first missing symbol (`gdr_alloc_abi_version`, say).
        symbol: String,
    },
    /// `gdr_alloc_abi_version` answered another version than [`ABI_VERSION`].
    #[error("{path} speaks allocator ABI {found}, this gdr speaks {ABI_VERSION}")]
    Version {
        /// The library's path, as given.
        path: String,
        /// The version it speaks (-1 if it could not be read back).
        found: c_int,
    },
}

/// The ABI once found (never unset: a pool library stays loaded for the life of the process).
static API: OnceLock<PoolApi> = OnceLock::new();
/// Serialises the searches, so two threads do not both load a library.
static SEARCH: Mutex<()> = Mutex::new(());

/// Resolves the allocator's entry points with `sym`; `None` when one is missing or the version
/// differs.
fn resolve(sym: impl Fn(&CStr) -> *mut c_void) -> Result<PoolApi, String> {
    let get = |name: &CStr| {
        let p = sym(name);
        if p.is_null() {
            Err(name.to_string_lossy().into_owned())
        } else {
            Ok(p)
        }
    };
    let version = get(SYM_ABI_VERSION)?;
    // SAFETY: the symbols are gdr_alloc.h's, with these C signatures.
    unsafe {
        let version: VersionFn = std::mem::transmute::<*mut c_void, VersionFn>(version);
        let found = version();
        if found != ABI_VERSION {
            return Err(format!("ABI version {found}"));
        }
        Ok(PoolApi {
            pin: std::mem::transmute::<*mut c_void, PinFn>(get(SYM_PIN)?),
            unpin: std::mem::transmute::<*mut c_void, UnpinFn>(get(SYM_UNPIN)?),
            freed: std::mem::transmute::<*mut c_void, FreedFn>(get(SYM_PIN_FREED)?),
            map: std::mem::transmute::<*mut c_void, UnpinFn>(get(SYM_MAP)?),
            unmap: std::mem::transmute::<*mut c_void, UnpinFn>(get(SYM_UNMAP)?),
            _lib: None,
        })
    }
}

/// The allocator in the process's global scope, looked up again on each call until found (it
/// may be loaded later); `None` when there is none.
fn api() -> Option<&'static PoolApi> {
    if let Some(a) = API.get() {
        return Some(a);
    }
    let _one = SEARCH.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(a) = API.get() {
        return Some(a);
    }
    let found = resolve(|name| {
        // SAFETY: a lookup in the global scope; the name is NUL-terminated.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
    })
    .ok()?;
    Some(API.get_or_init(|| found))
}

/// Uses the allocator library at `path` (for a process that loaded it privately, e.g. through
/// a framework's pluggable-allocator hook, so that its symbols are not global). A no-op when an
/// allocator was found already.
pub fn use_library(path: &std::path::Path) -> Result<(), PoolLibraryError> {
    let _one = SEARCH.lock().unwrap_or_else(|p| p.into_inner());
    if API.get().is_some() {
        return Ok(());
    }
    let shown = path.display().to_string();
    // The loader would open a FIFO and wait for a writer forever.
    crate::regular_file::check_library(path).map_err(|e| PoolLibraryError::Load {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    // SAFETY: loading gdr's allocator runs no initialiser with preconditions (it has none).
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| PoolLibraryError::Load {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let mut api = resolve(|name| {
        // SAFETY: a lookup of a NUL-terminated name in a library we hold.
        unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
            .map(|s| *s)
            .unwrap_or(std::ptr::null_mut())
    })
    .map_err(|what| match what.strip_prefix("ABI version ") {
        Some(v) => PoolLibraryError::Version {
            path: shown.clone(),
            found: v.parse().unwrap_or(-1),
        },
        None => PoolLibraryError::NotAllocator {
            path: shown.clone(),
            symbol: what,
        },
    })?;
    api._lib = Some(lib);
    let _ = API.set(api);
    Ok(())
}

/// Whether an allocator is reachable from this process.
pub fn is_present() -> bool {
    api().is_some()
}

/// Why the allocator refused a pin of its own memory.
#[derive(Debug, thiserror::Error)]
#[error("gdr's allocator refused to pin {addr:#x}+{size}: {}", describe(*errno))]
pub struct PoolPinError {
    /// The range's start: the address asked to pin, or for a failed map, unmap or freed
    /// query, the pinned chunk's base.
    pub addr: u64,
    /// The range's length in bytes (the chunk's size for a failed map, unmap or freed query).
    pub size: u64,
    /// EINVAL (the range leaves its chunk), ENOTSUP (the chunk cannot be mapped here), ENOMEM,
    /// EIO.
    pub errno: i32,
}

fn describe(errno: i32) -> String {
    match errno {
        libc::EINVAL => "the range leaves the allocator chunk that holds its first byte".into(),
        libc::ENOTSUP => "the allocator cannot map that chunk on this host".into(),
        libc::ENOMEM => "out of memory while mapping the chunk".into(),
        e => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

/// A pin of allocator memory: the chunk stays allocated and mapped until drop (unpin).
pub struct PoolPin {
    info: PoolPinInfo,
    api: &'static PoolApi,
}

// SAFETY: the CPU pointer is the allocator's mapping, reached only through the copy routines;
// the ABI is thread safe.
unsafe impl Send for PoolPin {}
// SAFETY: as above; through `&PoolPin` the pin info is only read, and the ABI's calls (map,
// unmap, the freed query) are made thread safe by the allocator.
unsafe impl Sync for PoolPin {}

impl PoolPin {
    /// Device address of the first byte of the chunk.
    pub fn base(&self) -> u64 {
        self.info.base
    }
    /// Bytes in the chunk.
    pub fn size(&self) -> u64 {
        self.info.size
    }
    /// CPU address of [`base`](Self::base): usable over the pinned range between
    /// [`map`](Self::map) and [`unmap`](Self::unmap).
    pub fn cpu(&self) -> *mut u8 {
        self.info.cpu.cast()
    }

    /// Opens the pinned range in the chunk's mapping (the allocator keeps it inaccessible
    /// otherwise).
    pub fn map(&self) -> Result<(), PoolPinError> {
        self.call(self.api.map)
    }

    /// Closes what [`map`](Self::map) opened (pages that no other mapped pin covers).
    pub fn unmap(&self) -> Result<(), PoolPinError> {
        self.call(self.api.unmap)
    }

    fn call(&self, f: UnpinFn) -> Result<(), PoolPinError> {
        // SAFETY: our own pin id.
        match unsafe { f(self.info.id) } {
            0 => Ok(()),
            errno => Err(PoolPinError {
                addr: self.info.base,
                size: self.info.size,
                errno,
            }),
        }
    }
    /// Whether an allocation the pinned range held when pinned was freed since.
    pub fn freed(&self) -> Result<bool, PoolPinError> {
        let mut f: c_int = 0;
        // SAFETY: our own pin id; out-pointer to a live local.
        match unsafe { (self.api.freed)(self.info.id, &mut f) } {
            0 => Ok(f != 0),
            errno => Err(PoolPinError {
                addr: self.info.base,
                size: self.info.size,
                errno,
            }),
        }
    }
}

impl Drop for PoolPin {
    fn drop(&mut self) {
        // SAFETY: our own pin id, unpinned once.
        unsafe { (self.api.unpin)(self.info.id) };
    }
}

impl std::fmt::Debug for PoolPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPin")
            .field("id", &self.info.id)
            .field("base", &format_args!("{:#x}", self.info.base))
            .field("size", &self.info.size)
            .finish()
    }
}

/// Pins `[addr, addr + size)` through the allocator: `Ok(None)` when there is no allocator or
/// the range is not its memory.
pub fn pin(addr: u64, size: u64) -> Result<Option<PoolPin>, PoolPinError> {
    let Some(api) = api() else {
        return Ok(None);
    };
    let mut info = PoolPinInfo::default();
    let len = usize::try_from(size).unwrap_or(usize::MAX);
    // SAFETY: out-pointer to a live local of the ABI's layout.
    match unsafe { (api.pin)(addr, len, &mut info) } {
        0 => Ok(Some(PoolPin { info, api })),
        libc::ENOENT => Ok(None),
        errno => Err(PoolPinError { addr, size, errno }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_info_matches_gdr_alloc_h() {
        assert_eq!(std::mem::size_of::<PoolPinInfo>(), 40);
        assert_eq!(std::mem::offset_of!(PoolPinInfo, cpu), 24);
        assert_eq!(std::mem::offset_of!(PoolPinInfo, device), 32);
    }

    #[test]
    fn without_an_allocator_nothing_is_pool_memory() {
        // No gdr_alloc_* symbols in a test binary.
        assert!(!is_present());
        assert!(pin(0x7000_0000_0000, 4096).unwrap().is_none());
    }

    #[test]
    fn a_library_that_is_not_the_allocator_is_refused() {
        let e = use_library(std::path::Path::new("libc.so.6")).unwrap_err();
        assert!(
            matches!(&e, PoolLibraryError::NotAllocator { symbol, .. } if symbol == "gdr_alloc_abi_version"),
            "{e}"
        );
        let e = use_library(std::path::Path::new("/nonexistent/libgdr_alloc.so")).unwrap_err();
        assert!(matches!(e, PoolLibraryError::Load { .. }), "{e}");
    }
}
