//! The registration cache over CUDA dma-buf exports: [`DmaBufRegistrar`], its default budget
//! from free BAR1, and [`Tracked`], memory that drops its cache entries when it is freed.

use super::regcache::{CacheConfig, RegCache, Registrar, Tag};
use crate::bar::dmabuf::{DmaBuf, PeerError};
use crate::cuda::{buffer_id, Context, DeviceMemory};
use crate::page::GPU_PAGE_SIZE;
use std::sync::Arc;

/// Registers CUDA ranges as dma-buf exports. Tags are CUDA's BUFFER_IDs.
pub struct DmaBufRegistrar {
    ctx: Context,
}

impl DmaBufRegistrar {
    /// A registrar that exports ranges of memory in `ctx` (made current before each export
    /// and BUFFER_ID query).
    pub fn new(ctx: &Context) -> Self {
        Self { ctx: ctx.clone() }
    }

    /// The CUDA context the exported memory lives in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Registrar for DmaBufRegistrar {
    type Reg = DmaBuf;
    type Error = PeerError;

    fn register(&self, start: u64, len: u64) -> Result<DmaBuf, PeerError> {
        DmaBuf::export(&self.ctx, start, len)
    }

    fn register_around(
        &self,
        start: u64,
        len: u64,
        addr: u64,
        size: u64,
    ) -> Result<DmaBuf, PeerError> {
        DmaBuf::export_within(&self.ctx, start, len, addr, size)
    }

    fn covers(&self, reg: &DmaBuf, addr: u64, size: u64) -> bool {
        reg.covers(addr, size)
    }

    fn reg_range(&self, reg: &DmaBuf) -> Option<(u64, u64)> {
        Some((reg.start(), reg.len()))
    }

    fn tag(&self, addr: u64) -> Result<Tag, PeerError> {
        self.ctx.bind()?;
        Ok(match buffer_id(addr)? {
            Some(id) => Tag::Id(id),
            None => Tag::Freed,
        })
    }

    fn is_out_of_space(&self, err: &PeerError) -> bool {
        err.is_out_of_memory()
    }
}

/// Bytes the default budget keeps when NVML cannot tell free BAR1.
pub const FALLBACK_BUDGET: u64 = 256 << 20;
/// Default entry budget.
pub const DEFAULT_MAX_ENTRIES: usize = 4096;

/// The default byte budget for `ctx`'s GPU: half of the BAR1 space free now (other users and
/// CPU mappings need the rest), or [`FALLBACK_BUDGET`] when NVML does not say.
pub fn default_budget(ctx: &Context) -> u64 {
    let Ok(bus) = ctx.device().pci_bus_id() else {
        return FALLBACK_BUDGET;
    };
    let gpus = crate::nvml::gpus().unwrap_or_default();
    budget_from_bar1(
        gpus.iter()
            .find(|g| g.bus_id.eq_ignore_ascii_case(&bus))
            .and_then(|g| Some((g.bar1_total?, g.bar1_used?))),
    )
}

/// Half the free BAR1, at least one GPU page; the fallback when unknown.
pub fn budget_from_bar1(bar1: Option<(u64, u64)>) -> u64 {
    match bar1 {
        Some((total, used)) => (total.saturating_sub(used) / 2).max(GPU_PAGE_SIZE),
        None => FALLBACK_BUDGET,
    }
}

/// A dma-buf registration cache for `ctx` with the default budgets.
pub fn dmabuf_cache(ctx: &Context) -> RegCache<DmaBufRegistrar> {
    let config = CacheConfig::new(default_budget(ctx), DEFAULT_MAX_ENTRIES);
    RegCache::new(DmaBufRegistrar::new(ctx), config).expect("the GPU page is a power of two")
}

/// Something that drops cached registrations of a range: the free hook of [`Tracked`].
pub trait Invalidate: Send + Sync {
    /// Drops every cached registration that overlaps `[start, start + len)` (device addresses):
    /// later lookups of the range register afresh. Called just before the memory is freed.
    fn invalidate_range(&self, start: u64, len: u64);
}

impl<R: Registrar> Invalidate for RegCache<R> {
    fn invalidate_range(&self, start: u64, len: u64) {
        self.invalidate(start, len);
    }
}

/// Device memory whose cache entries are invalidated when it is freed: wrap what gdr allocates
/// (a `DeviceBuffer`, a `MappedBuffer`, a `VmmBuffer`) and drop the wrapper instead of the
/// memory. The entries go before the memory does, so no lookup can return a registration of
/// freed memory.
pub struct Tracked<M: DeviceMemory> {
    mem: Option<M>,
    caches: Vec<Arc<dyn Invalidate>>,
}

impl<M: DeviceMemory> Tracked<M> {
    /// Wraps `mem`, whose range is invalidated in `cache` when the wrapper drops.
    pub fn new(mem: M, cache: Arc<dyn Invalidate>) -> Self {
        Self {
            mem: Some(mem),
            caches: vec![cache],
        }
    }

    /// Also invalidate `cache` on free.
    pub fn and(mut self, cache: Arc<dyn Invalidate>) -> Self {
        self.caches.push(cache);
        self
    }

    /// The memory wrapped (also reachable through `Deref`).
    pub fn get(&self) -> &M {
        self.mem.as_ref().expect("present until drop")
    }
}

impl<M: DeviceMemory> std::ops::Deref for Tracked<M> {
    type Target = M;
    fn deref(&self) -> &M {
        self.get()
    }
}

impl<M: DeviceMemory> DeviceMemory for Tracked<M> {
    fn device_ptr(&self) -> u64 {
        self.get().device_ptr()
    }
    fn len(&self) -> usize {
        self.get().len()
    }
}

impl<M: DeviceMemory> Drop for Tracked<M> {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            let (start, len) = (mem.device_ptr(), mem.len().max(1) as u64);
            for c in &self.caches {
                c.invalidate_range(start, len);
            }
            drop(mem);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn budget_is_half_the_free_bar1() {
        assert_eq!(budget_from_bar1(Some((128 << 30, 2 << 30))), 63 << 30);
        assert_eq!(budget_from_bar1(Some((256 << 20, 256 << 20))), 1 << 16);
        assert_eq!(budget_from_bar1(None), FALLBACK_BUDGET);
    }

    struct Fake {
        ptr: u64,
        len: usize,
        freed: Arc<Mutex<Vec<&'static str>>>,
    }
    impl DeviceMemory for Fake {
        fn device_ptr(&self) -> u64 {
            self.ptr
        }
        fn len(&self) -> usize {
            self.len
        }
    }
    impl Drop for Fake {
        fn drop(&mut self) {
            self.freed.lock().unwrap().push("freed");
        }
    }
    struct Log(Arc<Mutex<Vec<&'static str>>>, Mutex<Vec<(u64, u64)>>);
    impl Invalidate for Log {
        fn invalidate_range(&self, start: u64, len: u64) {
            self.0.lock().unwrap().push("invalidated");
            self.1.lock().unwrap().push((start, len));
        }
    }

    #[test]
    fn tracked_invalidates_before_freeing() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::new(Log(events.clone(), Mutex::new(Vec::new())));
        let t = Tracked::new(
            Fake {
                ptr: 0x7000_0000,
                len: 300,
                freed: events.clone(),
            },
            log.clone(),
        );
        assert_eq!(t.device_ptr(), 0x7000_0000);
        assert!(events.lock().unwrap().is_empty());
        drop(t);
        assert_eq!(*events.lock().unwrap(), ["invalidated", "freed"]);
        assert_eq!(*log.1.lock().unwrap(), [(0x7000_0000, 300)]);
    }
}
