//! The memory behind every Python object of the package, shared through an `Arc`: a buffer,
//! each typed view of it, each DLPack capsule and tensor made from it and each NumPy view hold
//! one, so the memory and its CPU mapping go only when the last of them does, in whatever
//! order Python collects them. No mapping outlives its memory.

use gdr::bar::{MappedBuffer, PinnedMapping};
use gdr::cuda::DeviceMemory;
use gdr::mem::{check_range, AccessError, Caching, MappedMemory};
use pyo3::prelude::*;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One piece of CPU-mapped memory, and the Python object it belongs to when it is someone
/// else's (a pinned tensor).
pub(crate) struct Mem {
    /// Declared before `owner`: the mapping and the pin go before the owner is let go, so the
    /// owner's memory is never freed while it is mapped.
    backing: Backing,
    /// The object whose memory this is (a tensor or array that was pinned): kept alive while
    /// the mapping exists, so its allocator cannot free or reuse the memory under it.
    owner: Option<Py<PyAny>>,
    /// CUDA device ordinal; `None` for host memory.
    device: Option<usize>,
}

pub(crate) enum Backing {
    /// Memory gdr allocated (Vulkan, BAR1-mapped, imported into CUDA).
    Mapped(MappedBuffer),
    /// Someone else's GPU memory, pinned and mapped (the mapping holds its pin).
    Pinned(PinnedMapping),
    /// A range of memory gdr allocated (a tensor made from a gdr buffer, pinned): the buffer's
    /// own mapping, no pin needed.
    Within {
        parent: Arc<Mem>,
        offset: usize,
        len: usize,
    },
    /// Ordinary host memory with the same Python surface, for tests of the Python layer on a
    /// machine without a GPU (its DLPack device is the CPU).
    Host(HostMem),
}

/// Live `Mem` values: for the tests of lifetimes (`_gdr._live_memories`).
static LIVE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// How many pieces of memory are alive (buffers, pins, their ranges), for tests that check
/// that memory goes when, and only when, its last holder does.
pub(crate) fn live_count() -> usize {
    LIVE_COUNT.load(Ordering::SeqCst)
}

impl Mem {
    fn make(backing: Backing, owner: Option<Py<PyAny>>, device: Option<usize>) -> Arc<Mem> {
        LIVE_COUNT.fetch_add(1, Ordering::SeqCst);
        Arc::new(Mem {
            backing,
            owner,
            device,
        })
    }

    /// Memory gdr allocated, registered so that a later pin of a tensor inside it finds it.
    pub(crate) fn mapped(buf: MappedBuffer, device: usize) -> Arc<Mem> {
        let mem = Mem::make(Backing::Mapped(buf), None, Some(device));
        if let Some(start) = mem.device_ptr() {
            registry().insert(start, (mem.size(), Arc::downgrade(&mem)));
        }
        mem
    }

    pub(crate) fn pinned(map: PinnedMapping, owner: Option<Py<PyAny>>, device: usize) -> Arc<Mem> {
        Mem::make(Backing::Pinned(map), owner, Some(device))
    }

    /// `len` bytes at `offset` of `parent` (checked), held for `owner`.
    pub(crate) fn within(
        parent: Arc<Mem>,
        offset: usize,
        len: usize,
        owner: Option<Py<PyAny>>,
    ) -> Result<Arc<Mem>, AccessError> {
        check_range(offset, len, parent.size())?;
        let device = parent.device;
        Ok(Mem::make(
            Backing::Within {
                parent,
                offset,
                len,
            },
            owner,
            device,
        ))
    }

    pub(crate) fn host(len: usize) -> Arc<Mem> {
        Mem::make(Backing::Host(HostMem::new(len)), None, None)
    }

    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    pub(crate) fn owner(&self) -> Option<&Py<PyAny>> {
        self.owner.as_ref()
    }

    /// CUDA device ordinal; `None` for host memory.
    pub(crate) fn device(&self) -> Option<usize> {
        self.device
    }

    /// The CUDA device address of the first byte; `None` for host memory.
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match &self.backing {
            Backing::Mapped(b) => Some(b.device_ptr()),
            Backing::Pinned(p) => Some(p.pinned().addr()),
            Backing::Within { parent, offset, .. } => {
                parent.device_ptr().map(|p| p + *offset as u64)
            }
            Backing::Host(_) => None,
        }
    }

    /// The gdr buffer this memory lies in and where, for the auto copier (which copies into
    /// gdr's own buffers only).
    pub(crate) fn mapped_buffer(&self) -> Option<(&MappedBuffer, usize)> {
        match &self.backing {
            Backing::Mapped(b) => Some((b, 0)),
            Backing::Within { parent, offset, .. } => {
                parent.mapped_buffer().map(|(b, o)| (b, o + offset))
            }
            Backing::Pinned(_) | Backing::Host(_) => None,
        }
    }

    /// What kind of memory this is, for `repr` and `Pin.backend`.
    pub(crate) fn kind(&self) -> &'static str {
        match &self.backing {
            Backing::Mapped(_) => "vulkan",
            Backing::Pinned(p) => p.pinned().backend().name(),
            Backing::Within { .. } => "buffer",
            Backing::Host(_) => "host",
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        LIVE_COUNT.fetch_sub(1, Ordering::SeqCst);
        // Unregistered before the fields drop: the buffer's range is freed (and may be handed
        // out again, and registered, by another thread) only after this.
        if matches!(self.backing, Backing::Mapped(_)) {
            if let Some(start) = self.device_ptr() {
                let mut reg = registry();
                if reg.get(&start).is_some_and(|(_, w)| w.strong_count() == 0) {
                    reg.remove(&start);
                }
            }
        }
    }
}

// SAFETY: every backing keeps its mapping alive while it lives: a MappedBuffer holds its block,
// a PinnedMapping the pin under it, `Within` an Arc of its parent (and the range was checked
// against it), HostMem its allocation. The mappings are page-granular (Vulkan, dma-buf, gdrdrv)
// or, for HostMem, whole 64-byte lines, so the lines around any range are readable. No Rust
// reference to the bytes is handed out: Python reaches them through these copies, or through
// raw addresses (NumPy, DLPack) whose holders keep the Arc.
unsafe impl MappedMemory for Mem {
    #[inline]
    fn cpu_ptr(&self) -> *mut u8 {
        match &self.backing {
            Backing::Mapped(b) => b.cpu_ptr(),
            Backing::Pinned(p) => p.cpu_ptr(),
            // Within the parent's range (checked at construction).
            Backing::Within { parent, offset, .. } => parent.cpu_ptr().wrapping_add(*offset),
            Backing::Host(h) => h.ptr.as_ptr(),
        }
    }

    #[inline]
    fn size(&self) -> usize {
        match &self.backing {
            Backing::Mapped(b) => MappedMemory::size(b),
            Backing::Pinned(p) => p.len(),
            Backing::Within { len, .. } => *len,
            Backing::Host(h) => h.len,
        }
    }

    #[inline]
    fn caching(&self) -> Caching {
        match &self.backing {
            Backing::Host(_) => Caching::WriteBack,
            _ => Caching::WriteCombined,
        }
    }
}

/// Live gdr buffers by device address, so that pinning a tensor made from one (DLPack or
/// `__cuda_array_interface__`) maps it through the buffer's own mapping.
fn registry() -> std::sync::MutexGuard<'static, BTreeMap<u64, (usize, Weak<Mem>)>> {
    static LIVE: Mutex<BTreeMap<u64, (usize, Weak<Mem>)>> = Mutex::new(BTreeMap::new());
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live gdr buffer that holds `[addr, addr + len)`, and the offset of `addr` in it.
pub(crate) fn find_buffer(addr: u64, len: usize) -> Option<(Arc<Mem>, usize)> {
    let reg = registry();
    let (&start, (size, weak)) = reg.range(..=addr).next_back()?;
    let off = (addr - start) as usize;
    check_range(off, len, *size).ok()?;
    Some((weak.upgrade()?, off))
}

/// Page-aligned host memory, zeroed, a whole number of 64-byte lines.
pub(crate) struct HostMem {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: plain owned memory, reached only through raw-pointer copies.
unsafe impl Send for HostMem {}
// SAFETY: as above.
unsafe impl Sync for HostMem {}

impl HostMem {
    fn new(len: usize) -> HostMem {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(64), 4096)
            .expect("a host test buffer's size fits a Layout");
        // SAFETY: the layout's size is non-zero.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HostMem { ptr, len, layout }
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
