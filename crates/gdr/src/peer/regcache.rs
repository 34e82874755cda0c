//! A registration cache for memory handed to other devices, with lazy unpinning.
//!
//! Registering GPU memory for a third party (exporting a dma-buf, pinning it through gdrdrv,
//! registering an RDMA memory region) costs up to milliseconds, so GPUDirect RDMA users (UCX,
//! NCCL, MPI libraries) keep registrations after a transfer and reuse them. [`RegCache`] is that
//! cache, generic over what a registration is ([`Registrar`]).
//!
//! # Shape
//! - Requests are rounded out to the page size (64 KiB GPU pages by default: regions in one GPU
//!   page share a BAR mapping) and kept in an interval map of **non-overlapping** entries keyed by
//!   start, so a lookup is one predecessor probe in a `BTreeMap`.
//! - A request fully covered by an entry is a hit: the caller gets a [`RegHandle`] (a shared
//!   reference on the registration plus the caller's offset in it).
//! - A request that overlaps entries without being covered registers the **union** of the request
//!   and every overlapping entry; the overlapped entries are retired (removed from the map; their
//!   registrations live on until the last handle on them is dropped). If the union cannot be
//!   registered (it may span allocations the registrar refuses to join), the request alone is
//!   registered and still replaces the overlapped entries: the map stays non-overlapping and the
//!   newest registration wins. Adjacent (touching, not overlapping) entries are not merged.
//! - Lazy unpinning: entries stay after their handles are dropped. When a registration would
//!   exceed the byte budget (counting every live registration, cached or not, since that is what
//!   occupies BAR1) or the entry budget, the least recently used *unused* entries are evicted.
//!   An entry with a live handle is never evicted; the cache then goes over budget rather than
//!   fail. If the registrar reports that it ran out of space ([`Registrar::is_out_of_space`]),
//!   every unused entry is evicted and the registration is tried once more.
//! - Deregistration never runs under the cache's lock: retired entries are dropped after it is
//!   released (unpinning can take as long as pinning).
//!
//! # Invalidation
//! - [`RegCache::invalidate`] removes every entry overlapping a range; it is the hook an allocator
//!   calls when it frees memory.
//! - [`RegCache::acquire_checked`] asks the registrar for the allocation tag of the caller's
//!   address ([`Registrar::tag`], CUDA's `CU_POINTER_ATTRIBUTE_BUFFER_ID`). Each entry remembers
//!   the tags that were live in its range when it was registered; a tag the entry does not know
//!   means the memory was freed and reallocated (or belongs to an allocation registered through
//!   another address): the entry is retired and a fresh registration made, which keeps the tags
//!   of the entries it replaces so that two allocations sharing a GPU page converge on one entry.
//!   [`Tag::Freed`] retires the entry and fails the lookup. Tag checks cost a driver call, so plain
//!   [`RegCache::acquire`] skips them (the guide's advice: not on the latency-critical path).
//! - An invalidated registration held by a user stays valid for that user until dropped
//!   ([`RegHandle::is_invalidated`] tells), but is never returned by a lookup again.
//! - A registration made while an overlapping invalidation happened is returned to its caller
//!   but not cached (it may describe memory that was being freed).
//!
//! # Concurrency
//! The index is replicated: each read shard (by default one per CPU) holds its own copy of the
//! map behind its own `RwLock`, and threads are dealt out to shards, so concurrent hits do not
//! bounce one lock's cache line between cores. A hit takes its shard's read lock and touches only
//! atomics (its shard's hit counter, the entry's reference count and LRU stamp). Writers
//! (misses, evictions, invalidations) serialise on a mutex and update every replica with all
//! shard locks held, so every reader sees either the old or the new entry set. A miss takes the
//! writer locks twice, briefly, and registers with no lock held, so two threads missing on the
//! same range may both register; the later one replaces the earlier entry (both registrations
//! stay valid for their holders).
//!
//! One file (about 1,000 lines) on purpose: the invariants above (non-overlapping entries,
//! budgets counted over live registrations, no deregistration under the lock, the shard and
//! writer lock order) are upheld together by the lookup, the writer and eviction below; split
//! apart, each piece would have to restate them. Inside it, `RegCache`'s methods come in one
//! impl block per concern: making it and its state, the lookups (the hit path), removal (with
//! the writer), and the miss path.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockWriteGuard};

// The GPU page: NVIDIA GPUs map memory into BAR1 in 64 KiB pages. The same constant as the
// gdrdrv ABI's, both from the page module below every other.
pub use crate::page::GPU_PAGE_SIZE;

/// How many allocation tags an entry remembers; older ones are forgotten (which at worst costs a
/// needless re-registration).
const MAX_TAGS: usize = 16;

/// How many recent invalidations are remembered to decide whether a registration that raced with
/// them may be cached. Past that many, a racing registration is simply not cached.
const INVALIDATION_LOG: usize = 64;

/// Most read replicas of the index.
const MAX_READ_SHARDS: usize = 64;

/// What the registrar knows about the allocation at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The allocation's identity. It must be unique for the life of the process (never reused
    /// after a free), as CUDA's `CU_POINTER_ATTRIBUTE_BUFFER_ID` is.
    Id(u64),
    /// No allocation lives at the address any more.
    Freed,
    /// The registrar cannot tell (no tag support); entries are then trusted.
    Untracked,
}

/// What a registration is, and how to make and undo one.
///
/// Implementations: a CUDA dma-buf export (the registration owns the fd), a gdrdrv pin plus CPU
/// mapping, an RDMA memory region. All methods are called with no cache lock held.
pub trait Registrar: Send + Sync + 'static {
    /// One registration of a page-rounded range.
    type Reg: Send + Sync + 'static;
    /// Why a registration or a tag query failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Registers `[start, start + len)`; both are multiples of the cache's page size.
    fn register(&self, start: u64, len: u64) -> Result<Self::Reg, Self::Error>;

    /// Registers `[start, start + len)` for a caller who asked for `[addr, addr + size)` inside
    /// it. A registrar that cannot always register the whole page-rounded range (a CUDA export
    /// that must stay inside the caller's allocation) may register less, as long as the result
    /// covers the caller's range and [`covers`](Self::covers) tells what it covers. The default
    /// registers the whole range.
    fn register_around(
        &self,
        start: u64,
        len: u64,
        addr: u64,
        size: u64,
    ) -> Result<Self::Reg, Self::Error> {
        let _ = (addr, size);
        self.register(start, len)
    }

    /// Whether `reg` covers `[addr, addr + size)`. Asked on every hit, so it must be cheap; only
    /// registrars that may register less than asked (see
    /// [`register_around`](Self::register_around)) override it. A hit on an entry whose
    /// registration does not cover the request replaces the entry as if it were stale.
    fn covers(&self, reg: &Self::Reg, addr: u64, size: u64) -> bool {
        let _ = (reg, addr, size);
        true
    }

    /// The range `reg` really registered, when it can differ from the page-rounded range the
    /// cache asked for (an export fitted to its allocation, say). `None`: exactly that range.
    fn reg_range(&self, reg: &Self::Reg) -> Option<(u64, u64)> {
        let _ = reg;
        None
    }

    /// Undoes a registration once it is neither cached nor held. The default drops it, which is
    /// right when `Reg` releases itself on drop.
    fn deregister(&self, start: u64, len: u64, reg: Self::Reg) {
        let _ = (start, len);
        drop(reg);
    }

    /// The tag of the allocation at `addr` (see [`Tag`]). The default: [`Tag::Untracked`].
    fn tag(&self, addr: u64) -> Result<Tag, Self::Error> {
        let _ = addr;
        Ok(Tag::Untracked)
    }

    /// Whether `err` means the resource behind registrations (BAR1 space) is exhausted, so that
    /// evicting unused entries and trying again may succeed.
    fn is_out_of_space(&self, err: &Self::Error) -> bool {
        let _ = err;
        false
    }
}

/// Budgets and granularity of a [`RegCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Most bytes registered at once (every live registration counts, cached or held).
    pub max_bytes: u64,
    /// Most entries kept in the cache.
    pub max_entries: usize,
    /// Rounding granularity, a power of two; [`GPU_PAGE_SIZE`] unless changed.
    pub page_size: u64,
    /// Read replicas of the index (0: one per CPU, at most 64). Threads are dealt out to them so
    /// that concurrent hits do not contend on one lock; every miss, eviction and invalidation
    /// updates all of them.
    pub read_shards: usize,
}

impl CacheConfig {
    /// Budgets with the GPU page as granularity.
    pub fn new(max_bytes: u64, max_entries: usize) -> Self {
        Self {
            max_bytes,
            max_entries,
            page_size: GPU_PAGE_SIZE,
            read_shards: 0,
        }
    }

    /// The same budgets with another rounding granularity (4 KiB for host memory, say).
    pub fn with_page_size(self, page_size: u64) -> Self {
        Self { page_size, ..self }
    }

    /// The same with `n` read replicas of the index (0: one per CPU).
    pub fn with_read_shards(self, n: usize) -> Self {
        Self {
            read_shards: n,
            ..self
        }
    }
}

/// A [`CacheConfig`] that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CacheConfigError {
    /// Rounding needs a power-of-two page.
    #[error("cache page size {0:#x} is not a power of two")]
    PageSize(u64),
}

/// Why a lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError<E: std::error::Error + 'static> {
    /// Zero-length requests have nothing to register.
    #[error("empty range at {addr:#x}")]
    Empty {
        /// The start of the range asked for.
        addr: u64,
    },
    /// The request, rounded out to pages, does not fit the 64-bit address space.
    #[error("range {addr:#x}+{len:#x} overflows the address space")]
    Overflow {
        /// The start of the range asked for.
        addr: u64,
        /// Its length in bytes, as asked.
        len: u64,
    },
    /// The registrar refused; nothing was cached.
    #[error("registering {start:#x}+{len:#x} failed: {source}")]
    Register {
        /// The start of the page-rounded range handed to the registrar.
        start: u64,
        /// That range's length in bytes.
        len: u64,
        /// The registrar's error.
        #[source]
        source: E,
    },
    /// The tag query of a checked lookup failed.
    #[error("allocation tag query at {addr:#x} failed: {source}")]
    Tag {
        /// The address whose allocation was asked about.
        addr: u64,
        /// The registrar's error.
        #[source]
        source: E,
    },
    /// A checked lookup found no allocation at the address (its entry, if any, is gone).
    #[error("no allocation at {addr:#x}: the memory was freed")]
    Freed {
        /// The address looked up.
        addr: u64,
    },
}

/// Counters of a [`RegCache`]; a snapshot, not taken atomically as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served by an existing entry.
    pub hits: u64,
    /// Lookups that had to register (including stale entries found by tag checks).
    pub misses: u64,
    /// Unused entries removed to stay within budget or to make room after an out-of-space error.
    pub evictions: u64,
    /// Entries removed by `invalidate`, by a freed tag, or as stale by a tag mismatch.
    pub invalidations: u64,
    /// Successful `register` calls.
    pub registrations: u64,
    /// Failed `register` calls (a retry after an out-of-space error counts again).
    pub registration_failures: u64,
    /// Registrations handed out without being cached (too large for the budget, or raced with an
    /// invalidation).
    pub uncached: u64,
    /// Entries in the cache now.
    pub entries: u64,
    /// Bytes covered by the cache's entries now.
    pub bytes_cached: u64,
    /// Registrations alive now (cached, or retired but still held by a user).
    pub live_registrations: u64,
    /// Bytes registered now (all live registrations).
    pub bytes_pinned: u64,
}

/// State shared by the cache and every entry (entries outlive the cache while held).
struct Core<R> {
    registrar: R,
    live_regs: AtomicU64,
    live_bytes: AtomicU64,
}

/// One registration. Dropped, it deregisters.
struct Entry<R: Registrar> {
    start: u64,
    len: u64,
    /// `Some` until `drop` hands it back to the registrar.
    reg: Option<R::Reg>,
    /// Allocation tags live in the range when it was registered (see the module docs).
    tags: Box<[u64]>,
    /// LRU stamp (see `RegCache::hit`).
    last_used: AtomicU64,
    invalidated: AtomicBool,
    core: Arc<Core<R>>,
}

impl<R: Registrar> Entry<R> {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

impl<R: Registrar> Drop for Entry<R> {
    fn drop(&mut self) {
        if let Some(reg) = self.reg.take() {
            self.core.registrar.deregister(self.start, self.len, reg);
        }
        self.core.live_regs.fetch_sub(1, Ordering::Relaxed);
        self.core.live_bytes.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// A registration in use, and where the caller's range lies in it. Cloning is cheap (a reference
/// count); the registration is released when the last handle is dropped and the cache no longer
/// holds it.
pub struct RegHandle<R: Registrar> {
    entry: Arc<Entry<R>>,
    addr: u64,
    size: u64,
}

impl<R: Registrar> RegHandle<R> {
    /// The registration.
    pub fn reg(&self) -> &R::Reg {
        // The option is only emptied in `Entry::drop`, which cannot run while we hold the Arc.
        self.entry
            .reg
            .as_ref()
            .expect("an entry keeps its registration until dropped")
    }

    /// The caller's address minus the registration's start: where the caller's first byte is
    /// inside the registration (e.g. the offset into an exported dma-buf).
    pub fn offset(&self) -> u64 {
        self.addr - self.reg_start()
    }

    /// The caller's address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The caller's length.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Start of the registered (page-rounded) range.
    pub fn reg_start(&self) -> u64 {
        self.registered().0
    }

    /// Length of the registered range.
    pub fn reg_len(&self) -> u64 {
        self.registered().1
    }

    /// The range the registrar really registered (see [`Registrar::reg_range`]).
    fn registered(&self) -> (u64, u64) {
        self.entry
            .core
            .registrar
            .reg_range(self.reg())
            .unwrap_or((self.entry.start, self.entry.len))
    }

    /// Whether the registration was invalidated after this handle was taken: it stays usable by
    /// this holder, but the memory behind it may have been freed.
    pub fn is_invalidated(&self) -> bool {
        self.entry.invalidated.load(Ordering::Acquire)
    }

    /// Whether two handles share one registration.
    pub fn same_registration(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.entry, &other.entry)
    }
}

impl<R: Registrar> Clone for RegHandle<R> {
    fn clone(&self) -> Self {
        Self {
            entry: Arc::clone(&self.entry),
            addr: self.addr,
            size: self.size,
        }
    }
}

impl<R: Registrar> fmt::Debug for RegHandle<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegHandle")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("reg_start", &format_args!("{:#x}", self.entry.start))
            .field("reg_len", &self.entry.len)
            .field("invalidated", &self.is_invalidated())
            .finish()
    }
}

struct Slot<R: Registrar> {
    end: u64,
    entry: Arc<Entry<R>>,
}

/// Non-overlapping entries keyed by start.
type Map<R> = BTreeMap<u64, Slot<R>>;

fn covering<R: Registrar>(map: &Map<R>, start: u64, end: u64) -> Option<&Slot<R>> {
    map.range(..=start)
        .next_back()
        .map(|(_, slot)| slot)
        .filter(|slot| slot.end >= end)
}

/// One read replica of the index, on its own cache lines so that threads reading different
/// replicas do not bounce a line between cores. Its hit counter lives with it for the same reason.
#[repr(align(128))]
struct Shard<R: Registrar> {
    map: RwLock<Map<R>>,
    hits: AtomicU64,
}

/// Which replica the calling thread reads: threads are dealt out round-robin.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

/// What only writers touch; its mutex also serialises writers.
struct Meta {
    bytes: u64,
    /// Count of invalidations so far.
    epoch: u64,
    /// `(epoch after, start, end)` of the latest invalidations, oldest first.
    recent: VecDeque<(u64, u64, u64)>,
}

/// A writer's view: the writers' mutex and every replica write-locked (always in index order, and
/// readers take one lock only, so this cannot deadlock). All replicas hold the same entries.
struct Writer<'a, R: Registrar> {
    meta: MutexGuard<'a, Meta>,
    maps: Vec<RwLockWriteGuard<'a, Map<R>>>,
}

impl<R: Registrar> Writer<'_, R> {
    fn map(&self) -> &Map<R> {
        &self.maps[0]
    }

    /// Whether anything but the replicas holds the entry. Exact here: with every replica locked
    /// no new reference can be made except from an existing handle, which already counts.
    fn in_use(&self, entry: &Arc<Entry<R>>) -> bool {
        Arc::strong_count(entry) > self.maps.len()
    }

    /// Keys of the entries overlapping `[start, end)`, in order.
    fn overlapping(&self, start: u64, end: u64) -> Vec<u64> {
        let map = self.map();
        let mut keys = Vec::new();
        if let Some((&key, slot)) = map.range(..start).next_back() {
            if slot.end > start {
                keys.push(key);
            }
        }
        keys.extend(map.range(start..end).map(|(&key, _)| key));
        keys
    }

    /// Takes an entry out of every replica. The replicas' references but one are dropped here,
    /// which cannot deregister (the returned one is still alive); drop that one after unlocking.
    fn remove(&mut self, key: u64) -> Option<Arc<Entry<R>>> {
        let (first, rest) = self.maps.split_first_mut()?;
        let slot = first.remove(&key)?;
        for map in rest {
            map.remove(&key);
        }
        self.meta.bytes -= slot.entry.len;
        Some(slot.entry)
    }

    fn insert(&mut self, entry: Arc<Entry<R>>) {
        let (start, end) = (entry.start, entry.end());
        self.meta.bytes += entry.len;
        for map in &mut self.maps {
            map.insert(
                start,
                Slot {
                    end,
                    entry: Arc::clone(&entry),
                },
            );
        }
    }

    /// Whether an invalidation overlapping `[start, end)` happened after `epoch`.
    fn invalidated_since(&self, epoch: u64, start: u64, end: u64) -> bool {
        if self.meta.epoch == epoch {
            return false;
        }
        let oldest_logged = self.meta.recent.front().map_or(u64::MAX, |&(e, _, _)| e);
        if oldest_logged > epoch + 1 {
            return true; // the log no longer reaches back that far
        }
        self.meta
            .recent
            .iter()
            .any(|&(e, s, x)| e > epoch && s < end && start < x)
    }

    fn log_invalidation(&mut self, start: u64, end: u64) {
        self.meta.epoch += 1;
        let epoch = self.meta.epoch;
        if self.meta.recent.len() == INVALIDATION_LOG {
            self.meta.recent.pop_front();
        }
        self.meta.recent.push_back((epoch, start, end));
    }
}

/// Whether anything holds a removed entry besides the one reference of the remover and, for
/// `stale`, the miss that rejected it.
fn held_by_others<R: Registrar>(entry: &Arc<Entry<R>>, stale: Option<&Arc<Entry<R>>>) -> bool {
    let ours = 1 + usize::from(stale.is_some_and(|s| Arc::ptr_eq(s, entry)));
    Arc::strong_count(entry) > ours
}

/// The registration cache; see the module documentation.
pub struct RegCache<R: Registrar> {
    /// Read replicas of the index (see `CacheConfig::read_shards`).
    shards: Box<[Shard<R>]>,
    meta: Mutex<Meta>,
    core: Arc<Core<R>>,
    config: CacheConfig,
    /// LRU clock: advanced by 2 on every miss; hits stamp it plus one (see `hit`).
    clock: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    registrations: AtomicU64,
    registration_failures: AtomicU64,
    uncached: AtomicU64,
}

/// What a miss decided under the lock: the range to register and what to remember.
struct Plan {
    start: u64,
    end: u64,
    tags: Vec<u64>,
    epoch: u64,
}

// Making the cache and reading its state.
impl<R: Registrar> RegCache<R> {
    /// A cache over `registrar` with the given budgets.
    pub fn new(registrar: R, config: CacheConfig) -> Result<Self, CacheConfigError> {
        if !config.page_size.is_power_of_two() {
            return Err(CacheConfigError::PageSize(config.page_size));
        }
        let shards = match config.read_shards {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .min(MAX_READ_SHARDS);
        let shards = (0..shards)
            .map(|_| Shard {
                map: RwLock::new(BTreeMap::new()),
                hits: AtomicU64::new(0),
            })
            .collect();
        Ok(Self {
            shards,
            meta: Mutex::new(Meta {
                bytes: 0,
                epoch: 0,
                recent: VecDeque::with_capacity(INVALIDATION_LOG),
            }),
            core: Arc::new(Core {
                registrar,
                live_regs: AtomicU64::new(0),
                live_bytes: AtomicU64::new(0),
            }),
            config,
            clock: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            registration_failures: AtomicU64::new(0),
            uncached: AtomicU64::new(0),
        })
    }

    /// The registrar the cache registers through.
    pub fn registrar(&self) -> &R {
        &self.core.registrar
    }

    /// The budgets the cache was made with.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        let (entries, bytes_cached) = {
            let meta = self.meta.lock().unwrap_or_else(PoisonError::into_inner);
            let map = self.shards[0]
                .map
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            (map.len() as u64, meta.bytes)
        };
        CacheStats {
            hits: self
                .shards
                .iter()
                .map(|s| s.hits.load(Ordering::Relaxed))
                .sum(),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            registrations: self.registrations.load(Ordering::Relaxed),
            registration_failures: self.registration_failures.load(Ordering::Relaxed),
            uncached: self.uncached.load(Ordering::Relaxed),
            entries,
            bytes_cached,
            live_registrations: self.core.live_regs.load(Ordering::Relaxed),
            bytes_pinned: self.core.live_bytes.load(Ordering::Relaxed),
        }
    }
}

// Lookups: the hit path, which takes one shard's read lock and touches only atomics.
impl<R: Registrar> RegCache<R> {
    /// A registration covering `[addr, addr + len)`, from the cache or fresh. No tag check: the
    /// caller vouches that the memory was not freed since it was registered (or relies on the
    /// allocator calling [`invalidate`](Self::invalidate)).
    pub fn acquire(&self, addr: u64, len: u64) -> Result<RegHandle<R>, CacheError<R::Error>> {
        let (start, end) = self.round(addr, len)?;
        let shard = self.shard();
        if let Some(entry) = Self::lookup(shard, start, end) {
            if self.entry_covers(&entry, addr, len) {
                return Ok(self.hit(shard, entry, addr, len));
            }
            return self.miss(addr, len, start, end, false, None, Some(entry));
        }
        self.miss(addr, len, start, end, false, None, None)
    }

    /// Like [`acquire`](Self::acquire), but first checks the allocation tag at `addr` against the
    /// entry's (one registrar `tag` call): a reallocated range is registered afresh, a freed one
    /// is dropped and reported as [`CacheError::Freed`].
    pub fn acquire_checked(
        &self,
        addr: u64,
        len: u64,
    ) -> Result<RegHandle<R>, CacheError<R::Error>> {
        let (start, end) = self.round(addr, len)?;
        let shard = self.shard();
        let Some(entry) = Self::lookup(shard, start, end) else {
            return self.miss(addr, len, start, end, true, None, None);
        };
        if !self.entry_covers(&entry, addr, len) {
            return self.miss(addr, len, start, end, true, None, Some(entry));
        }
        match self.core.registrar.tag(addr) {
            Err(source) => Err(CacheError::Tag { addr, source }),
            Ok(Tag::Freed) => {
                self.retire(&entry);
                Err(CacheError::Freed { addr })
            }
            Ok(Tag::Untracked) => Ok(self.hit(shard, entry, addr, len)),
            Ok(Tag::Id(id)) if entry.tags.contains(&id) => Ok(self.hit(shard, entry, addr, len)),
            Ok(Tag::Id(id)) => self.miss(addr, len, start, end, true, Some(id), Some(entry)),
        }
    }

    fn shard(&self) -> &Shard<R> {
        &self.shards[shard_index() % self.shards.len()]
    }

    fn round(&self, addr: u64, len: u64) -> Result<(u64, u64), CacheError<R::Error>> {
        if len == 0 {
            return Err(CacheError::Empty { addr });
        }
        let mask = self.config.page_size - 1;
        let end = addr
            .checked_add(len)
            .and_then(|end| end.checked_add(mask))
            .ok_or(CacheError::Overflow { addr, len })?;
        Ok((addr & !mask, end & !mask))
    }

    fn entry_covers(&self, entry: &Entry<R>, addr: u64, size: u64) -> bool {
        entry
            .reg
            .as_ref()
            .is_some_and(|reg| self.core.registrar.covers(reg, addr, size))
    }

    fn lookup(shard: &Shard<R>, start: u64, end: u64) -> Option<Arc<Entry<R>>> {
        let map = shard.map.read().unwrap_or_else(PoisonError::into_inner);
        covering(&map, start, end).map(|slot| Arc::clone(&slot.entry))
    }

    fn hit(&self, shard: &Shard<R>, entry: Arc<Entry<R>>, addr: u64, size: u64) -> RegHandle<R> {
        shard.hits.fetch_add(1, Ordering::Relaxed);
        // LRU granularity is one miss: entries hit since the latest miss rank after the entry that
        // miss created (odd stamp above its even one) and tie among themselves. Evictions only
        // happen at misses, so finer order would buy little, and reading a clock that only misses
        // write keeps the line shared between cores.
        let stamp = self.clock.load(Ordering::Relaxed) + 1;
        if entry.last_used.load(Ordering::Relaxed) != stamp {
            entry.last_used.store(stamp, Ordering::Relaxed);
        }
        RegHandle { entry, addr, size }
    }
}

// Removal: invalidation, eviction of unused entries, and the writer every change goes
// through (all shard locks, in order, under the meta mutex).
impl<R: Registrar> RegCache<R> {
    /// Removes every entry overlapping `[start, start + len)` (the allocator's free hook).
    /// Registrations still held stay valid for their holders. Returns how many entries went.
    pub fn invalidate(&self, start: u64, len: u64) -> usize {
        if len == 0 {
            return 0;
        }
        let end = start.saturating_add(len);
        let mut gone = Vec::new();
        {
            let mut w = self.writer();
            w.log_invalidation(start, end);
            for key in w.overlapping(start, end) {
                if let Some(entry) = w.remove(key) {
                    entry.invalidated.store(true, Ordering::Release);
                    gone.push(entry);
                }
            }
        }
        self.invalidations
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        gone.len()
    }

    /// Evicts every entry nobody holds; returns how many.
    pub fn evict_unused(&self) -> usize {
        let mut gone = Vec::new();
        {
            let mut w = self.writer();
            let keys: Vec<u64> = w
                .map()
                .iter()
                .filter(|(_, slot)| !w.in_use(&slot.entry))
                .map(|(&key, _)| key)
                .collect();
            for key in keys {
                gone.extend(w.remove(key));
            }
        }
        self.evictions
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        gone.len()
    }

    /// Takes `entry` out of the cache (if it is still there) because its memory was freed.
    fn retire(&self, entry: &Arc<Entry<R>>) {
        let gone = {
            let mut w = self.writer();
            let present = w
                .map()
                .get(&entry.start)
                .is_some_and(|slot| Arc::ptr_eq(&slot.entry, entry));
            w.log_invalidation(entry.start, entry.end());
            if present {
                w.remove(entry.start)
            } else {
                None
            }
        };
        if gone.is_some() {
            entry.invalidated.store(true, Ordering::Release);
            self.invalidations.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn writer(&self) -> Writer<'_, R> {
        // Maps and meta are consistent between statements; a panic elsewhere (in a registrar
        // callback on another thread, say) leaves nothing half-done, so poisoning is ignored.
        let meta = self.meta.lock().unwrap_or_else(PoisonError::into_inner);
        let maps = self
            .shards
            .iter()
            .map(|s| s.map.write().unwrap_or_else(PoisonError::into_inner))
            .collect();
        Writer { meta, maps }
    }
}

// The miss path: plan under the lock, register with no lock held, cache the result if no
// overlapping invalidation raced with it, and make room within the budgets.
impl<R: Registrar> RegCache<R> {
    /// Registers a range for a lookup that found no usable entry. `stale` is an entry a checked
    /// lookup rejected (`tag` is the tag it saw); it is replaced like an overlapping entry.
    #[allow(clippy::too_many_arguments)]
    fn miss(
        &self,
        addr: u64,
        len: u64,
        start: u64,
        end: u64,
        checked: bool,
        tag: Option<u64>,
        stale: Option<Arc<Entry<R>>>,
    ) -> Result<RegHandle<R>, CacheError<R::Error>> {
        // The tag of the caller's allocation, remembered so later checked lookups can validate.
        // Plain lookups do not fail on tag trouble: the entry is then untagged, which a checked
        // lookup treats as stale.
        let tag = match tag {
            Some(id) => Some(id),
            None => match self.core.registrar.tag(addr) {
                Ok(Tag::Id(id)) => Some(id),
                Ok(Tag::Untracked) => None,
                Ok(Tag::Freed) if checked => return Err(CacheError::Freed { addr }),
                Err(source) if checked => return Err(CacheError::Tag { addr, source }),
                Ok(Tag::Freed) | Err(_) => None,
            },
        };
        let untracked = checked && tag.is_none();

        let mut doomed = Vec::new();
        let plan = {
            let mut w = self.writer();
            if let Some(slot) = covering(w.map(), start, end) {
                // Another thread registered it meanwhile.
                let is_stale = stale.as_ref().is_some_and(|s| Arc::ptr_eq(s, &slot.entry));
                let valid =
                    (!checked || untracked || tag.is_some_and(|t| slot.entry.tags.contains(&t)))
                        && self.entry_covers(&slot.entry, addr, len);
                if !is_stale && valid {
                    let entry = Arc::clone(&slot.entry);
                    drop(w);
                    return Ok(self.hit(self.shard(), entry, addr, len));
                }
            }
            self.misses.fetch_add(1, Ordering::Relaxed);
            let overlapped = w.overlapping(start, end);
            let mut plan = Plan {
                start,
                end,
                tags: tag.into_iter().collect(),
                epoch: w.meta.epoch,
            };
            let mut leaving_bytes = 0;
            for &key in &overlapped {
                let slot = &w.map()[&key];
                plan.start = plan.start.min(key);
                plan.end = plan.end.max(slot.end);
                for &t in slot.entry.tags.iter() {
                    if !plan.tags.contains(&t) && plan.tags.len() < MAX_TAGS {
                        plan.tags.push(t);
                    }
                }
                let ours = w.maps.len()
                    + usize::from(stale.as_ref().is_some_and(|s| Arc::ptr_eq(s, &slot.entry)));
                if Arc::strong_count(&slot.entry) == ours {
                    leaving_bytes += slot.entry.len;
                }
            }
            let entries_after = w.map().len() - overlapped.len() + 1;
            self.make_room(
                &mut w,
                &mut doomed,
                plan.end - plan.start,
                leaving_bytes,
                entries_after,
                &overlapped,
            );
            plan
        };
        drop(doomed); // deregister evictions before registering more

        let (reg, start, end) = match self.register(plan.start, plan.end, addr, len) {
            Ok(reg) => (reg, plan.start, plan.end),
            Err(_) if (plan.start, plan.end) != (start, end) => {
                (self.register(start, end, addr, len)?, start, end)
            }
            Err(err) => return Err(err),
        };
        let len_reg = end - start;
        self.core.live_regs.fetch_add(1, Ordering::Relaxed);
        self.core.live_bytes.fetch_add(len_reg, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            start,
            len: len_reg,
            reg: Some(reg),
            tags: plan.tags.into_boxed_slice(),
            last_used: AtomicU64::new(self.clock.fetch_add(2, Ordering::Relaxed) + 2),
            invalidated: AtomicBool::new(false),
            core: Arc::clone(&self.core),
        });
        let handle = RegHandle {
            entry: Arc::clone(&entry),
            addr,
            size: len,
        };

        let mut doomed = Vec::new();
        let mut cached = false;
        if len_reg <= self.config.max_bytes && self.config.max_entries > 0 {
            let mut w = self.writer();
            if !w.invalidated_since(plan.epoch, start, end) {
                let mut stale_gone = 0;
                for key in w.overlapping(start, end) {
                    if let Some(old) = w.remove(key) {
                        // The entry a checked lookup rejected may describe freed memory.
                        if stale.as_ref().is_some_and(|s| Arc::ptr_eq(s, &old)) {
                            old.invalidated.store(true, Ordering::Release);
                            stale_gone += 1;
                        }
                        doomed.push(old);
                    }
                }
                self.invalidations.fetch_add(stale_gone, Ordering::Relaxed);
                w.insert(entry);
                let leaving = doomed
                    .iter()
                    .filter(|e| !held_by_others(e, stale.as_ref()))
                    .map(|e| e.len)
                    .sum();
                let entries_after = w.map().len();
                self.make_room(&mut w, &mut doomed, 0, leaving, entries_after, &[start]);
                cached = true;
            }
        }
        if !cached {
            self.uncached.fetch_add(1, Ordering::Relaxed);
        }
        drop(stale);
        drop(doomed);
        Ok(handle)
    }

    /// One registration, with one retry after evicting everything unused if the registrar says
    /// it ran out of space.
    fn register(
        &self,
        start: u64,
        end: u64,
        addr: u64,
        size: u64,
    ) -> Result<R::Reg, CacheError<R::Error>> {
        let registrar = &self.core.registrar;
        let len = end - start;
        let mut result = registrar.register_around(start, len, addr, size);
        if let Err(err) = &result {
            self.registration_failures.fetch_add(1, Ordering::Relaxed);
            if registrar.is_out_of_space(err) && self.evict_unused() > 0 {
                result = registrar.register_around(start, len, addr, size);
                if result.is_err() {
                    self.registration_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match result {
            Ok(reg) => {
                self.registrations.fetch_add(1, Ordering::Relaxed);
                Ok(reg)
            }
            Err(source) => Err(CacheError::Register { start, len, source }),
        }
    }

    /// Evicts least recently used unused entries (never those in `keep`) until `incoming` more
    /// bytes fit the byte budget, given that `leaving` bytes are about to be deregistered, and
    /// until at most `entries_after` minus evictions fit the entry budget. Evicted entries go to
    /// `doomed`, to be dropped once the locks are released.
    fn make_room(
        &self,
        w: &mut Writer<'_, R>,
        doomed: &mut Vec<Arc<Entry<R>>>,
        incoming: u64,
        leaving: u64,
        mut entries_after: usize,
        keep: &[u64],
    ) {
        let mut bytes =
            (self.core.live_bytes.load(Ordering::Relaxed) + incoming).saturating_sub(leaving);
        let over = |bytes: u64, entries: usize| {
            bytes > self.config.max_bytes || entries > self.config.max_entries
        };
        if !over(bytes, entries_after) {
            return;
        }
        // Oldest first, ties by address: a heap of the unused entries costs O(n) to build and
        // O(log n) per eviction (usually one), paid only on misses that need room, next to a
        // registration that costs far more.
        let mut candidates: BinaryHeap<Reverse<(u64, u64)>> = w
            .map()
            .iter()
            .filter(|(key, slot)| !keep.contains(key) && !w.in_use(&slot.entry))
            .map(|(&key, slot)| Reverse((slot.entry.last_used.load(Ordering::Relaxed), key)))
            .collect();
        let mut evicted = 0;
        while let Some(Reverse((_, key))) = candidates.pop() {
            if !over(bytes, entries_after) {
                break;
            }
            if let Some(entry) = w.remove(key) {
                bytes = bytes.saturating_sub(entry.len);
                entries_after = entries_after.saturating_sub(1);
                doomed.push(entry);
                evicted += 1;
            }
        }
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
    }
}

impl<R: Registrar> fmt::Debug for RegCache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}
