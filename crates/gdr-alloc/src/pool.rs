//! The pool: a caching sub-allocator over driver chunks, with pins.
//!
//! Requests are rounded up to [`ALIGN`] and served from chunks of their class, as a caching
//! CUDA allocator does:
//! - small (up to [`SMALL_CLASS_MAX`]): one-granule chunks (2 MiB on current GPUs), shared;
//! - large, below [`LARGE_CLASS_MIN`]: [`LARGE_CHUNK`] chunks, shared;
//! - larger: a chunk of the request's size (rounded to the granularity); it is shared only
//!   once that request is freed.
//!
//! Freed memory goes back to its chunk and is reused; a chunk with nothing left in it is kept
//! (up to a cache limit) and given back to the driver on [`Pool::trim`], when the driver runs
//! out of memory (the allocation then retries once), or when the empty chunks kept exceed the
//! limit.
//!
//! A pin ([`Pool::pin`]) maps the chunk that holds the range, once per chunk (the mapping is
//! kept until the chunk goes back to the driver), so later pins of any memory in that chunk
//! cost a lookup. The chunk's mapping is made inaccessible (`PROT_NONE`) as soon as it exists,
//! and [`Pool::map`] / [`Pool::unmap`] open and close the 64 KiB pages around a pinned range,
//! counted per page: an address is usable exactly while some pin over it is mapped, as a
//! gdrcopy mapping is usable until `gdr_unmap` (the source may not support this: then the
//! whole chunk stays usable while it is mapped). While pinned, a chunk stays, and a block freed inside a pinned range is
//! quarantined: not handed out again until the last pin over it goes. A pin records the blocks
//! it overlapped when made; [`Pool::pin_freed`] says whether one of them was freed since (what
//! gdrcopy reports as the callback flag).
//!
//! The bookkeeping is here, the driver behind [`ChunkSource`]: tests run it over host memory.

use gdr::bar::RangeAlloc;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// Every block starts on this boundary and is a multiple of it (cudaMalloc's own alignment).
pub const ALIGN: usize = 512;
/// Blocks of at least this size start on a GPU page (64 KiB), so that a pin of the pages
/// around them holds as little of their neighbours as possible.
pub const LARGE_ALIGN: usize = 64 << 10;
/// Requests up to this size share one-granule chunks.
pub const SMALL_CLASS_MAX: usize = 1 << 20;
/// Requests above [`SMALL_CLASS_MAX`] and below [`LARGE_CLASS_MIN`] share chunks of this size.
pub const LARGE_CHUNK: usize = 20 << 20;
/// Requests of at least this size get a chunk of their own size.
pub const LARGE_CLASS_MIN: usize = 10 << 20;
/// The unit in which a chunk's mapping is opened and closed: the GPU page of a pin's window.
pub const VIEW_PAGE: u64 = 64 << 10;

/// Where chunks come from: the driver (`VmmSource`), or host memory in tests.
pub trait ChunkSource {
    /// One chunk's memory, given back to its owner on drop.
    type Chunk: Send + Sync;
    /// A CPU mapping of one chunk, unmapped on drop.
    type Mapping: Send;
    /// The allocation granularity of `device`: chunk sizes and alignments are multiples of it.
    fn granularity(&self, device: i32) -> Result<usize, SourceError>;
    /// A new chunk of `size` bytes (a multiple of the granularity) on `device`: its address and
    /// its owner.
    fn create(&self, device: i32, size: usize) -> Result<(u64, Self::Chunk), SourceError>;
    /// Maps `chunk` whole for the CPU: the CPU address of its first byte and the mapping.
    fn map(
        &self,
        device: i32,
        chunk: &Self::Chunk,
    ) -> Result<(*mut u8, Self::Mapping), SourceError>;
    /// Makes `[cpu, cpu + len)` of a mapping accessible or not; false when the mapping does not
    /// allow it (then the pool leaves it as it is). `mprotect` by default.
    fn protect(&self, cpu: *mut u8, len: usize, accessible: bool) -> bool {
        let prot = if accessible {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_NONE
        };
        // SAFETY: the range is a page-aligned part of a mapping this source made, which nothing
        // reaches while it is closed (the pool opens it before handing it to a mapping).
        unsafe { libc::mprotect(cpu.cast(), len, prot) == 0 }
    }
}

/// Why a source could not make or map a chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The driver has no memory for it.
    #[error("out of GPU memory")]
    OutOfMemory,
    /// Anything else, with the driver's code where there is one.
    #[error("{what}")]
    Failed {
        /// The `CUresult`, when the driver gave one.
        code: Option<i32>,
        /// What failed.
        what: String,
    },
}

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Size 0, or a size no chunk can hold.
    #[error("cannot allocate {0} bytes")]
    BadSize(u64),
    /// Out of memory, after giving empty chunks back and retrying.
    #[error("out of GPU memory for {0} bytes")]
    OutOfMemory(u64),
    /// The source failed otherwise.
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// An unknown pin id (or, for [`Pool::unmap`], a pin that is not mapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no pin {0}")]
pub struct PoolUnpinError(
    /// The pin id that was given.
    pub u64,
);

/// One allocation handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Its device address.
    pub addr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// CUDA device ordinal.
    pub device: i32,
    chunk: u64,
    reserved: usize,
    serial: u64,
}

/// What a pin gives: `gdr_alloc_pin_t` without the ABI's padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPinned {
    /// Token for [`Pool::unpin`] and [`Pool::pin_freed`].
    pub id: u64,
    /// Device address of the chunk's first byte.
    pub base: u64,
    /// Bytes in the chunk.
    pub size: u64,
    /// CPU address of `base`: the chunk's mapping. Where the source can protect pages, only
    /// the 64 KiB pages around a pin that is mapped ([`Pool::map`]) are accessible.
    pub cpu: *mut u8,
    /// CUDA device ordinal.
    pub device: i32,
}

/// Why a pin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinFailure {
    /// Not pool memory (ENOENT).
    #[error("not memory of this pool")]
    NotPool,
    /// Size 0, or the range leaves the chunk that holds its first byte (EINVAL).
    #[error("the range {addr:#x}+{size} leaves its chunk {base:#x}+{chunk}")]
    OutsideChunk {
        /// First byte asked for.
        addr: u64,
        /// Bytes asked for.
        size: u64,
        /// The chunk's first byte.
        base: u64,
        /// The chunk's size.
        chunk: u64,
    },
    /// The chunk could not be mapped.
    #[error("cannot map the chunk: {0}")]
    Map(SourceError),
}

impl PinFailure {
    /// The errno of `gdr_alloc_pin` for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            PinFailure::NotPool => libc::ENOENT,
            PinFailure::OutsideChunk { .. } => libc::EINVAL,
            PinFailure::Map(SourceError::OutOfMemory) => libc::ENOMEM,
            PinFailure::Map(_) => libc::ENOTSUP,
        }
    }
}

/// Counters (`gdr_alloc_stats_t`, same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Allocations handed out and not freed.
    pub live_allocations: u64,
    /// Bytes they asked for.
    pub live_bytes: u64,
    /// Bytes in chunks held from the driver.
    pub reserved_bytes: u64,
    /// Chunks held.
    pub chunks: u64,
    /// Chunks with a CPU mapping.
    pub mapped_chunks: u64,
    /// Live pins.
    pub pins: u64,
    /// Bytes freed while pinned, waiting for the unpin.
    pub quarantined_bytes: u64,
    /// Allocations served since start.
    pub allocations: u64,
    /// Allocation calls passed to the driver (counted by the caller, see
    /// [`Pool::count_passed_through`]).
    pub passed_through: u64,
    /// Chunks given back to the driver.
    pub chunks_released: u64,
}

struct Quarantined {
    addr: u64,
    off: usize,
    len: usize,
    /// Pins still over it.
    holds: u32,
}

/// A chunk's CPU mapping.
struct Mapped<M> {
    cpu: usize,
    /// Whether pages can be opened and closed (the source's `protect` works on it).
    guarded: bool,
    _mapping: M,
}

struct Chunk<C, M> {
    device: i32,
    size: usize,
    small: bool,
    ranges: RangeAlloc,
    owner: Arc<C>,
    /// The CPU mapping, made at the first pin and kept until the chunk goes.
    mapping: Arc<Mutex<Option<Mapped<M>>>>,
    /// Per 64 KiB page of a guarded mapping: how many mapped pins open it (empty until the
    /// first map).
    views: Vec<u32>,
    /// Live pins on this chunk.
    pins: Vec<u64>,
    /// Pins being set up (mapping outside the lock): the chunk must stay.
    pinning: u32,
    quarantine: Vec<Quarantined>,
}

impl<C, M> Chunk<C, M> {
    fn is_idle(&self) -> bool {
        self.ranges.is_empty() && self.pins.is_empty() && self.pinning == 0
    }
    fn free_bytes(&self) -> usize {
        self.size - self.ranges.used()
    }
}

struct PinRecord {
    chunk: u64,
    start: u64,
    end: u64,
    /// Serials of the blocks the range overlapped when pinned.
    serials: Vec<u64>,
    freed: bool,
    /// Blocks freed under this pin (their addresses), held in quarantine.
    holds: Vec<u64>,
    /// Maps of this pin not yet unmapped.
    maps: u32,
}

struct State<C, M> {
    chunks: BTreeMap<u64, Chunk<C, M>>,
    blocks: BTreeMap<u64, Block>,
    pins: HashMap<u64, PinRecord>,
    granularity: HashMap<i32, usize>,
    next_serial: u64,
    next_pin: u64,
    stats: Stats,
}

/// A caching sub-allocator over chunks of `S`. Thread safe.
pub struct Pool<S: ChunkSource> {
    source: S,
    cache_limit: u64,
    state: Mutex<State<S::Chunk, S::Mapping>>,
}

/// Chunks taken out of the pool, dropped (released to the driver) after the lock is let go.
type Released<C, M> = Vec<Chunk<C, M>>;

impl<S: ChunkSource> Pool<S> {
    /// An empty pool over `source` that keeps at most `cache_limit` bytes of empty chunks.
    pub fn new(source: S, cache_limit: u64) -> Self {
        Pool {
            source,
            cache_limit,
            state: Mutex::new(State {
                chunks: BTreeMap::new(),
                blocks: BTreeMap::new(),
                pins: HashMap::new(),
                granularity: HashMap::new(),
                next_serial: 0,
                next_pin: 0,
                stats: Stats::default(),
            }),
        }
    }

    /// The source (for its own queries).
    pub fn source(&self) -> &S {
        &self.source
    }

    fn lock(&self) -> MutexGuard<'_, State<S::Chunk, S::Mapping>> {
        // A panic while locked (a bug) must not make every later CUDA call of the program fail.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn granularity(&self, device: i32) -> Result<usize, SourceError> {
        if let Some(&g) = self.lock().granularity.get(&device) {
            return Ok(g);
        }
        let g = self.source.granularity(device)?.max(ALIGN);
        self.lock().granularity.insert(device, g);
        Ok(g)
    }

    /// Allocates `size` bytes on `device`.
    pub fn alloc(&self, device: i32, size: u64) -> Result<u64, AllocError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&n| n > 0)
            .and_then(|n| n.checked_next_multiple_of(ALIGN))
            .ok_or(AllocError::BadSize(size))?;
        let align = if len >= LARGE_ALIGN {
            LARGE_ALIGN
        } else {
            ALIGN
        };
        let small = len <= SMALL_CLASS_MAX;
        if let Some(addr) = self.lock().place(device, small, len, align, size) {
            return Ok(addr);
        }
        let gran = self.granularity(device)?;
        let chunk_size = if small {
            gran
        } else if len < LARGE_CLASS_MIN {
            LARGE_CHUNK
        } else {
            len
        }
        .checked_next_multiple_of(gran)
        .ok_or(AllocError::BadSize(size))?;
        let (base, owner) = match self.source.create(device, chunk_size) {
            Ok(c) => c,
            Err(SourceError::OutOfMemory) => {
                // Give the empty chunks of this GPU back and try once more.
                if self.trim(Some(device)) == 0 {
                    return Err(AllocError::OutOfMemory(size));
                }
                match self.source.create(device, chunk_size) {
                    Ok(c) => c,
                    Err(SourceError::OutOfMemory) => return Err(AllocError::OutOfMemory(size)),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let mut st = self.lock();
        st.chunks.insert(
            base,
            Chunk {
                device,
                size: chunk_size,
                small,
                ranges: RangeAlloc::new(chunk_size),
                owner: Arc::new(owner),
                mapping: Arc::new(Mutex::new(None)),
                views: Vec::new(),
                pins: Vec::new(),
                pinning: 0,
                quarantine: Vec::new(),
            },
        );
        st.stats.chunks += 1;
        st.stats.reserved_bytes += chunk_size as u64;
        let off = st
            .chunks
            .get_mut(&base)
            .and_then(|c| c.ranges.alloc(len, align))
            .expect("a new chunk holds the request it was sized for");
        Ok(st.record(base, off, len, size, device))
    }

    /// Frees the block at `addr`; `None` when the pool did not hand it out.
    pub fn free(&self, addr: u64) -> Option<Block> {
        let (block, released) = {
            let mut st = self.lock();
            let block = st.blocks.remove(&addr)?;
            st.stats.live_allocations -= 1;
            st.stats.live_bytes -= block.size;
            let State {
                chunks,
                pins,
                stats,
                ..
            } = &mut *st;
            let chunk = chunks
                .get_mut(&block.chunk)
                .expect("a block's chunk is held");
            let off = (block.addr - block.chunk) as usize;
            let end = block.addr + block.reserved as u64;
            let mut holds = 0;
            for id in &chunk.pins {
                let p = pins.get_mut(id).expect("a chunk's pins are recorded");
                if p.start < end && block.addr < p.end {
                    p.freed |= p.serials.contains(&block.serial);
                    p.holds.push(block.addr);
                    holds += 1;
                }
            }
            if holds > 0 {
                chunk.quarantine.push(Quarantined {
                    addr: block.addr,
                    off,
                    len: block.reserved,
                    holds,
                });
                stats.quarantined_bytes += block.reserved as u64;
            } else {
                chunk.ranges.free(off, block.reserved);
            }
            let released = st.over_cache(self.cache_limit, block.chunk);
            (block, released)
        };
        drop(released);
        Some(block)
    }

    /// The live block that holds `addr` (at or after its start, before its end).
    pub fn block_at(&self, addr: u64) -> Option<Block> {
        let st = self.lock();
        let (_, b) = st.blocks.range(..=addr).next_back()?;
        (addr < b.addr + b.size.max(1)).then_some(*b)
    }

    /// Whether `addr` lies in one of the pool's chunks.
    pub fn owns(&self, addr: u64) -> bool {
        self.lock().chunk_at(addr).is_some()
    }

    /// The chunk that holds `addr`, as `(base, bytes)`: the one `cuMemCreate` allocation, mapped
    /// at its own address range, that the driver knows the address by. Blocks of several
    /// allocations share it, as the blocks of a caching allocator share its segments.
    pub fn chunk_range(&self, addr: u64) -> Option<(u64, u64)> {
        let st = self.lock();
        let base = st.chunk_at(addr)?;
        Some((base, st.chunks[&base].size as u64))
    }

    /// Pins `[addr, addr + size)`: maps its chunk if that was never done, and keeps the chunk
    /// (and memory freed in the range) until [`unpin`](Self::unpin).
    pub fn pin(&self, addr: u64, size: u64) -> Result<PoolPinned, PinFailure> {
        let (base, device, owner, slot, chunk_size) = {
            let mut st = self.lock();
            let base = st.chunk_at(addr).ok_or(PinFailure::NotPool)?;
            let c = st.chunks.get_mut(&base).expect("found just now");
            let end = addr.checked_add(size);
            if size == 0 || end.is_none_or(|e| e > base + c.size as u64) {
                return Err(PinFailure::OutsideChunk {
                    addr,
                    size,
                    base,
                    chunk: c.size as u64,
                });
            }
            c.pinning += 1;
            (base, c.device, c.owner.clone(), c.mapping.clone(), c.size)
        };
        // Mapping a chunk is slow (a Vulkan import): done outside the pool's lock, once per
        // chunk (the slot's own lock makes racing pins wait for one mapping). A new mapping is
        // closed at once: maps open the pages they use.
        let mapped = {
            let mut m = slot.lock().unwrap_or_else(|p| p.into_inner());
            match &*m {
                Some(mapped) => Ok((mapped.cpu, false)),
                None => self.source.map(device, &owner).map(|(cpu, mapping)| {
                    let guarded = self.source.protect(cpu, chunk_size, false);
                    *m = Some(Mapped {
                        cpu: cpu as usize,
                        guarded,
                        _mapping: mapping,
                    });
                    (cpu as usize, true)
                }),
            }
        };
        let mut st = self.lock();
        let c = st
            .chunks
            .get_mut(&base)
            .expect("a chunk being pinned stays");
        c.pinning -= 1;
        let (cpu, new) = mapped.map_err(PinFailure::Map)?;
        let chunk_size = c.size as u64;
        st.next_pin += 1;
        let id = st.next_pin;
        let end = addr + size;
        let serials = st
            .blocks
            .range(..end)
            .rev()
            .take_while(|(_, b)| b.addr + b.reserved as u64 > addr)
            .map(|(_, b)| b.serial)
            .collect();
        st.pins.insert(
            id,
            PinRecord {
                chunk: base,
                start: addr,
                end,
                serials,
                freed: false,
                holds: Vec::new(),
                maps: 0,
            },
        );
        st.chunks.get_mut(&base).expect("held").pins.push(id);
        st.stats.pins += 1;
        if new {
            st.stats.mapped_chunks += 1;
        }
        Ok(PoolPinned {
            id,
            base,
            size: chunk_size,
            cpu: cpu as *mut u8,
            device,
        })
    }

    /// Ends pin `id`: memory freed under it (and under no other pin) can be handed out again.
    pub fn unpin(&self, id: u64) -> Result<(), PoolUnpinError> {
        let released = {
            let mut st = self.lock();
            let p = st.pins.remove(&id).ok_or(PoolUnpinError(id))?;
            st.stats.pins -= 1;
            let State { chunks, stats, .. } = &mut *st;
            let c = chunks.get_mut(&p.chunk).expect("a pinned chunk is held");
            for _ in 0..p.maps {
                self.view(c, &p, false);
            }
            c.pins.retain(|&x| x != id);
            for addr in p.holds {
                let i = c
                    .quarantine
                    .iter()
                    .position(|q| q.addr == addr)
                    .expect("a held block is quarantined");
                c.quarantine[i].holds -= 1;
                if c.quarantine[i].holds == 0 {
                    let q = c.quarantine.swap_remove(i);
                    c.ranges.free(q.off, q.len);
                    stats.quarantined_bytes -= q.len as u64;
                }
            }
            st.over_cache(self.cache_limit, p.chunk)
        };
        drop(released);
        Ok(())
    }

    /// Opens the 64 KiB pages around pin `id`'s range in its chunk's mapping (counted: they
    /// stay open while any mapped pin covers them).
    pub fn map(&self, id: u64) -> Result<(), PoolUnpinError> {
        let mut st = self.lock();
        let State { chunks, pins, .. } = &mut *st;
        let p = pins.get_mut(&id).ok_or(PoolUnpinError(id))?;
        let c = chunks.get_mut(&p.chunk).expect("a pinned chunk is held");
        p.maps += 1;
        self.view(c, p, true);
        Ok(())
    }

    /// Undoes one [`map`](Self::map) of pin `id`: its pages close when no other mapped pin
    /// covers them.
    pub fn unmap(&self, id: u64) -> Result<(), PoolUnpinError> {
        let mut st = self.lock();
        let State { chunks, pins, .. } = &mut *st;
        let p = pins
            .get_mut(&id)
            .filter(|p| p.maps > 0)
            .ok_or(PoolUnpinError(id))?;
        let c = chunks.get_mut(&p.chunk).expect("a pinned chunk is held");
        p.maps -= 1;
        self.view(c, p, false);
        Ok(())
    }

    /// Counts pin `p`'s pages open (`open`) or closed in chunk `c`, and changes the protection
    /// of the pages whose count leaves or reaches 0.
    fn view(&self, c: &mut Chunk<S::Chunk, S::Mapping>, p: &PinRecord, open: bool) {
        let (cpu, guarded) = match &*c.mapping.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(m) => (m.cpu, m.guarded),
            None => return,
        };
        if !guarded {
            return;
        }
        if c.views.is_empty() {
            c.views = vec![0; (c.size as u64).div_ceil(VIEW_PAGE) as usize];
        }
        let first = ((p.start - p.chunk) / VIEW_PAGE) as usize;
        let last = ((p.end - p.chunk).div_ceil(VIEW_PAGE) as usize).min(c.views.len());
        let mut run: Option<usize> = None;
        let flush = |from: usize, to: usize| {
            let off = from as u64 * VIEW_PAGE;
            let len = ((to - from) as u64 * VIEW_PAGE).min(c.size as u64 - off) as usize;
            self.source
                .protect((cpu + off as usize) as *mut u8, len, open);
        };
        for i in first..last {
            let n = &mut c.views[i];
            let flips = if open {
                *n += 1;
                *n == 1
            } else {
                *n -= 1;
                *n == 0
            };
            match (flips, run) {
                (true, None) => run = Some(i),
                (false, Some(r)) => {
                    flush(r, i);
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(r) = run {
            flush(r, last);
        }
    }

    /// Whether a block that pin `id` overlapped when made has been freed since; `None` for an
    /// unknown id.
    pub fn pin_freed(&self, id: u64) -> Option<bool> {
        self.lock().pins.get(&id).map(|p| p.freed)
    }

    /// Gives every idle chunk (nothing allocated, not pinned) of `device` (or of every device)
    /// back to the driver; the bytes released.
    pub fn trim(&self, device: Option<i32>) -> u64 {
        self.release_idle(|c| device.is_none_or(|d| d == c.device))
    }

    /// Gives back the idle chunks that were never mapped: what can be released while the
    /// process exits. The mapping of a mapped chunk is the Vulkan driver's, which tears itself
    /// down at exit before late exit handlers run; such chunks go with the process.
    pub fn trim_unmapped(&self) -> u64 {
        self.release_idle(|c| {
            c.mapping
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
        })
    }

    fn release_idle(&self, keep: impl Fn(&Chunk<S::Chunk, S::Mapping>) -> bool) -> u64 {
        let released: Released<S::Chunk, S::Mapping> = {
            let mut st = self.lock();
            let idle: Vec<u64> = st
                .chunks
                .iter()
                .filter(|(_, c)| c.is_idle() && keep(c))
                .map(|(&b, _)| b)
                .collect();
            idle.into_iter().filter_map(|b| st.take_chunk(b)).collect()
        };
        let bytes = released.iter().map(|c| c.size as u64).sum();
        drop(released);
        bytes
    }

    /// Counts an allocation call passed to the driver (for [`Stats::passed_through`]).
    pub fn count_passed_through(&self) {
        self.lock().stats.passed_through += 1;
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.lock().stats
    }
}

impl<C, M> State<C, M> {
    fn chunk_at(&self, addr: u64) -> Option<u64> {
        let (&base, c) = self.chunks.range(..=addr).next_back()?;
        (addr < base + c.size as u64).then_some(base)
    }

    /// A block of `len` bytes in an existing chunk of the class, if one has room.
    fn place(
        &mut self,
        device: i32,
        small: bool,
        len: usize,
        align: usize,
        size: u64,
    ) -> Option<u64> {
        let (base, off) = self.chunks.iter_mut().find_map(|(&base, c)| {
            if c.device != device || c.small != small || c.free_bytes() < len {
                return None;
            }
            c.ranges.alloc(len, align).map(|off| (base, off))
        })?;
        Some(self.record(base, off, len, size, device))
    }

    fn record(&mut self, chunk: u64, off: usize, len: usize, size: u64, device: i32) -> u64 {
        self.next_serial += 1;
        let addr = chunk + off as u64;
        debug_assert!(
            self.blocks
                .range(..addr + len as u64)
                .next_back()
                .is_none_or(|(_, b)| b.addr + b.reserved as u64 <= addr),
            "a new block overlaps a live one"
        );
        self.blocks.insert(
            addr,
            Block {
                addr,
                size,
                device,
                chunk,
                reserved: len,
                serial: self.next_serial,
            },
        );
        self.stats.live_allocations += 1;
        self.stats.live_bytes += size;
        self.stats.allocations += 1;
        addr
    }

    /// Removes chunk `base` from the pool, for the caller to drop after unlocking.
    fn take_chunk(&mut self, base: u64) -> Option<Chunk<C, M>> {
        let c = self.chunks.remove(&base)?;
        self.stats.chunks -= 1;
        self.stats.reserved_bytes -= c.size as u64;
        self.stats.chunks_released += 1;
        if c.mapping
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            self.stats.mapped_chunks -= 1;
        }
        Some(c)
    }

    /// When chunk `base` just became idle and the idle chunks exceed `limit` bytes, takes it
    /// out (to be released).
    fn over_cache(&mut self, limit: u64, base: u64) -> Released<C, M> {
        if !self.chunks.get(&base).is_some_and(|c| c.is_idle()) {
            return Vec::new();
        }
        let idle: u64 = self
            .chunks
            .values()
            .filter(|c| c.is_idle())
            .map(|c| c.size as u64)
            .sum();
        if idle > limit {
            self.take_chunk(base).into_iter().collect()
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests;
