//! The process-wide table behind every `gdr_t` and `gdr_mh_t`.
//!
//! A `gdr_t` is a token (never a pointer, never reused) and a `gdr_mh_t` a counter value, both
//! looked up here, so a stale or made-up value is answered with EINVAL instead of touching freed
//! memory. The table is one reader-writer lock ([`ReadMostly`]): copies take it shared (copies
//! on different handles run in parallel, and no unmap can pull a mapping from under one),
//! everything that changes it takes it exclusive for a lookup or an insert, and the slow work
//! (pinning, allocating, unpinning) runs unlocked. Its readers run no atomic read-modify-write
//! (the writers pay with a membarrier), so a copy's lookup costs a few plain loads and stores.
//!
//! Fork: a child inherits a copy of the table, but neither the GPU context nor (MADV_DONTFORK)
//! the mappings. A `pthread_atfork` child handler raises [`forked`], and every entry point checks
//! it before touching the lock (which another thread of the parent may have held at the fork).

use crate::log::{log, Level};
use crate::read_mostly::{ReadGuard, ReadMostly, WriteGuard};
use crate::GdrMh;
use gdr::bar::{MappedBuffer, PinBackend, Pinned, PinnedMapping, Pinner, VulkanBackend};
use gdr::cuda::{Context, DeviceMemory};
use gdr::GPU_PAGE_SIZE;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// One `gdr_open`.
pub(crate) struct Gdr {
    /// The context of the GPU `gdr_open` probed (device 0 or `GDR_CUDA_DEVICE`); also where
    /// `gdr_alloc_mapped` allocates.
    pub ctx: Context,
    /// The backend found on that GPU; pins on other GPUs use the same one.
    pub backend: Option<PinBackend>,
    /// One pinner per GPU ordinal, opened at the first pin of that GPU's memory (gdrcopy, too,
    /// pins through the GPU that owns the address); `None`: that GPU cannot pin.
    pub pinners: HashMap<usize, Option<Pinner>>,
    pub vulkan: Option<VulkanBackend>,
    /// Whether pins of memory that cannot be mapped become staged pins (the `ucx` module).
    pub stage: bool,
}

impl Gdr {
    /// The backend that pins here, or Vulkan when only `gdr_alloc_mapped` works.
    pub fn backend(&self) -> PinBackend {
        self.backend.unwrap_or(PinBackend::Vulkan)
    }

    /// The pinner of the probed GPU.
    pub fn first_pinner(&self) -> Option<&Pinner> {
        self.pinners.get(&self.ctx.device().ordinal())?.as_ref()
    }
}

pub(crate) enum Kind {
    /// An existing range pinned, and its mapping while gdr_map holds one. The mapping holds
    /// the pin too, so dropping them in any order unmaps before it unpins; `map` is declared
    /// first so that it drops first all the same.
    Pin {
        map: Option<PinnedMapping>,
        pin: Pinned,
    },
    /// Memory from `gdr_alloc_mapped`: mapped from birth; `mapped` tracks gdr_map/gdr_unmap.
    Alloc { buf: MappedBuffer, mapped: bool },
    /// A staged pin (see the `ucx` module): memory that cannot be mapped, whose copies run on
    /// the copy engine. `gdr_map` gives the addresses of `reserve`, which cannot be touched.
    /// `covered` are the allocations the pin's window held when it was made: a copy reaches
    /// only those, and only while each is still the same allocation.
    Staged {
        reserve: Option<Reservation>,
        covered: Vec<Covered>,
    },
}

/// One CUDA allocation under a staged pin, as it was when the pin was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Covered {
    pub base: u64,
    pub len: u64,
    /// Its `CU_POINTER_ATTRIBUTE_BUFFER_ID`, never reused in the process.
    pub buffer_id: u64,
}

impl Covered {
    /// The allocations that hold some byte of `[va, va + len)` now, skipping gaps a GPU page at
    /// a time (a staged pin's window is rounded out to GPU pages and may reach past the
    /// allocation it was asked for).
    pub fn scan(va: u64, len: u64) -> Vec<Covered> {
        let end = va.saturating_add(len);
        let mut out = Vec::new();
        let mut at = va;
        while at < end {
            let found = gdr::cuda::allocation_range(at)
                .ok()
                .zip(gdr::cuda::buffer_id(at).ok().flatten());
            match found {
                Some(((base, len), buffer_id)) if len > 0 => {
                    out.push(Covered {
                        base,
                        len,
                        buffer_id,
                    });
                    at = base + len;
                }
                _ => at = (at | (GPU_PAGE_SIZE - 1)) + 1,
            }
        }
        out
    }

    /// Whether `[addr, addr + len)` lies in one of `covered` and that allocation is still there
    /// (the same BUFFER_ID): memory freed since, and whatever was allocated in its place, is
    /// not reached.
    pub fn allows(covered: &[Covered], addr: u64, len: usize) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        covered.iter().any(|c| {
            addr >= c.base
                && end <= c.base + c.len
                && gdr::cuda::buffer_id(addr).ok().flatten() == Some(c.buffer_id)
        })
    }

    /// Whether any of `covered` was freed (or replaced) since the pin was made.
    pub fn any_freed(covered: &[Covered]) -> bool {
        covered
            .iter()
            .any(|c| gdr::cuda::buffer_id(c.base).ok().flatten() != Some(c.buffer_id))
    }
}

/// An inaccessible (`PROT_NONE`) address range that stands in for the CPU mapping of a staged
/// pin: its addresses are the mapping's, so the copies can tell where they are, and a load or
/// store through it faults instead of reaching other memory. Unmapped on drop.
pub(crate) struct Reservation {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the range is owned by this value alone and never accessed through it.
unsafe impl Send for Reservation {}
// SAFETY: as above; shared references only read the address.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `len` bytes (a multiple of the host page).
    pub fn new(len: usize) -> std::io::Result<Reservation> {
        // SAFETY: an anonymous PROT_NONE mapping at an address the kernel picks: touches no
        // existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Reservation {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The first address of the range.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range this value mapped and owns; nothing refers to it any more (the
        // handle's cpu pointer is cleared before the reservation is dropped).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// What `gdr_get_info` reports and `gdr_map` maps: the range asked for, rounded out to `page`
/// and clamped to what the backend pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub va: u64,
    pub len: u64,
    pub page: u32,
}

impl Window {
    /// `[addr, addr + size)` rounded out to `page`, inside `[start, start + pinned)`.
    pub fn new(addr: u64, size: u64, page: u32, start: u64, pinned: u64) -> Window {
        let p = u64::from(page);
        let lo = (addr & !(p - 1)).max(start);
        let hi = (addr + size).next_multiple_of(p).min(start + pinned);
        Window {
            va: lo,
            len: hi.saturating_sub(lo),
            page,
        }
    }
}

pub(crate) struct Handle {
    pub owner: usize,
    /// The copy engine of the GPU the memory is on, for copies off the mapping.
    pub engine: crate::copy::Engine,
    pub kind: Kind,
    pub window: Window,
    /// CPU address of `window.va` while mapped (else null), and the bytes from there that the
    /// caller mapped and may copy.
    pub cpu: *mut u8,
    pub cpu_len: usize,
}

impl Handle {
    /// A handle of `kind`, a pin or an allocation, whose window comes from its memory (a
    /// staged pin is made by [`Handle::staged`]).
    pub fn new(owner: usize, kind: Kind, ctx: Context) -> Handle {
        Handle::with_window(owner, kind, ctx, None)
    }

    /// A staged pin of `window` (the pinned range rounded out to GPU pages).
    pub fn staged(owner: usize, ctx: Context, window: Window, covered: Vec<Covered>) -> Handle {
        let kind = Kind::Staged {
            reserve: None,
            covered,
        };
        Handle::with_window(owner, kind, ctx, Some(window))
    }

    /// A handle of `kind`; `staged` is the window of a staged pin, `None` for the others.
    fn with_window(owner: usize, kind: Kind, ctx: Context, staged: Option<Window>) -> Handle {
        let window = match &kind {
            Kind::Pin { pin, .. } => {
                let page = if pin.backend() == PinBackend::DmaBuf {
                    gdr::host_page_size() as u32
                } else {
                    GPU_PAGE_SIZE as u32
                };
                Window::new(pin.addr(), pin.size(), page, pin.start(), pin.pinned_len())
            }
            Kind::Alloc { buf, .. } => Window {
                va: buf.device_ptr(),
                len: buf.len() as u64,
                page: GPU_PAGE_SIZE as u32,
            },
            Kind::Staged { .. } => staged.expect("a staged pin comes with its window"),
        };
        Handle {
            owner,
            engine: crate::copy::Engine::new(ctx),
            kind,
            window,
            cpu: std::ptr::null_mut(),
            cpu_len: 0,
        }
    }

    pub fn is_mapped(&self) -> bool {
        !self.cpu.is_null()
    }

    /// Whether the copies of this handle run on the copy engine (a staged pin).
    pub fn is_staged(&self) -> bool {
        matches!(self.kind, Kind::Staged { .. })
    }

    /// The allocations a staged pin covers (empty for the other kinds).
    pub fn covered(&self) -> &[Covered] {
        match &self.kind {
            Kind::Staged { covered, .. } => covered,
            _ => &[],
        }
    }
}

/// Hashes a handle value as itself, mixed once. Handles are counter values handed out by
/// [`State::fresh`], never chosen by a caller, so no flooding to defend against; every copy
/// looks its handle up, and SipHash is a noticeable share of an 8-byte copy.
#[derive(Default)]
pub(crate) struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        // Fibonacci mixing: consecutive counters land in different buckets' high bits, which
        // hashbrown uses for its control bytes.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The handle map: handle value -> handle.
pub(crate) type Handles = HashMap<u64, Handle, std::hash::BuildHasherDefault<HandleHasher>>;

#[derive(Default)]
pub(crate) struct State {
    pub gdrs: HashMap<usize, Gdr>,
    pub handles: Handles,
    next: u64,
}

impl State {
    /// A value never handed out before (tokens and handles share the counter).
    pub fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

// SAFETY: every value in the table is Send except the CPU mapping pointers inside handles,
// which are only dereferenced by the copy functions while the table is read-locked.
unsafe impl Send for State {}
// SAFETY: as above; shared access only reads the pointers.
unsafe impl Sync for State {}

static STATE: ReadMostly<Option<State>> = ReadMostly::new(None);
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Registers the fork handler and turns on the table's fast reads (once, at the first
/// `gdr_open`).
pub(crate) fn watch_fork() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a child handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(mark_forked)) };
        if !STATE.enable_fast_reads() {
            log!(
                Level::Info,
                "handle lookups take the table's lock (membarrier(2) is not available here)"
            );
        }
    });
}

/// Whether this process is a child forked after `gdr_open`: then nothing of the table is usable.
pub(crate) fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

pub(crate) fn read() -> ReadGuard<'static, Option<State>> {
    STATE.read()
}

pub(crate) fn write() -> WriteGuard<'static, Option<State>> {
    STATE.write()
}

/// Runs `f` on the table, exclusively.
pub(crate) fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut g = write();
    f(g.get_or_insert_with(State::default))
}

/// Adds `entry` to the table as a new handle of `g`. Pinning and allocating run unlocked, so `g`
/// may have been closed meanwhile: then `entry` is released here (unlocked) and `None` returned.
pub(crate) fn insert(g: *mut c_void, entry: Handle) -> Option<u64> {
    let mut entry = Some(entry);
    let h = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return None;
        }
        let h = s.fresh();
        s.handles.insert(h, entry.take()?);
        Some(h)
    });
    drop(entry);
    h
}

/// Removes `mh` of `g` if `accept` says it is the right kind, and drops it unlocked.
pub(crate) fn take_handle(g: *mut c_void, mh: GdrMh, accept: fn(&Kind) -> bool) -> c_int {
    let _current = gdr::cuda::CurrentContextGuard::save().ok();
    let taken = with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return None;
        }
        match s.handles.get(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize && accept(&h.kind) => s.handles.remove(&(mh.h as u64)),
            _ => None,
        }
    });
    match taken {
        Some(h) => {
            drop(h); // unmaps, then unpins or frees, outside the lock
            0
        }
        None => libc::EINVAL,
    }
}

/// Runs `f` on handle `mh` of `g`, the table locked exclusively.
pub(crate) fn with_handle(
    g: *mut c_void,
    mh: GdrMh,
    f: impl FnOnce(&mut Handle) -> c_int,
) -> c_int {
    with_state(|s| {
        if !s.gdrs.contains_key(&(g as usize)) {
            return libc::EINVAL;
        }
        match s.handles.get_mut(&(mh.h as u64)) {
            Some(h) if h.owner == g as usize => f(h),
            _ => libc::EINVAL,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_rounds_out_to_the_page_and_stays_inside_the_pin() {
        const P: u32 = 1 << 16;
        // An unaligned byte inside a 2 MiB allocation: one GPU page around it.
        let w = Window::new(0x20_0000 + 70_000, 1, P, 0x20_0000, 2 << 20);
        assert_eq!((w.va, w.len), (0x20_0000 + 65536, 65536));
        // A range crossing a page boundary covers both pages.
        let w = Window::new(0x20_0000 + 65535, 2, P, 0x20_0000, 2 << 20);
        assert_eq!((w.va, w.len), (0x20_0000, 2 * 65536));
        // Clamped to what was pinned (a dma-buf export rounded to host pages).
        let w = Window::new(0x1000 + 10, 100, P, 0x1000, 0x1000);
        assert_eq!((w.va, w.len), (0x1000, 0x1000));
    }

    #[test]
    fn handle_hashes_spread_counters_and_the_map_finds_each() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let b = BuildHasherDefault::<HandleHasher>::default();
        // Consecutive counters differ in the top 7 bits hashbrown keys its control bytes on.
        let tops: std::collections::HashSet<u64> =
            (1..=64u64).map(|h| b.hash_one(h) >> 57).collect();
        assert!(tops.len() > 32, "{} distinct of 64", tops.len());
        // A map of that hasher behaves as a map: every key back, absent ones absent.
        let mut m: HashMap<u64, u64, BuildHasherDefault<HandleHasher>> = HashMap::default();
        for h in 1..=10_000u64 {
            m.insert(h, h * 3);
        }
        assert!((1..=10_000u64).all(|h| m.get(&h) == Some(&(h * 3))));
        assert!(!m.contains_key(&0) && !m.contains_key(&10_001));
        // Byte-wise writes (not used for u64 keys) still hash deterministically.
        assert_eq!(b.hash_one("abc"), b.hash_one("abc"));
        assert_ne!(b.hash_one("abc"), b.hash_one("abd"));
    }
}
