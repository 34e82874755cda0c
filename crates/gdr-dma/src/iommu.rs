//! The device's view of memory: an IOMMU address space. [`IommuSpace`] hands out IOVAs, maps
//! CPU memory at them through an [`IommuBackend`] (VFIO's type1 container, or [`crate::sim`] in
//! tests), and keeps the table of what is mapped so that a transfer naming an unmapped IOVA is
//! refused before any device sees it.
//!
//! Three ways to map memory, none of which lets the device be pointed at freed memory:
//! - [`IommuSpace::map_owned`] (safe) takes an `Arc` of any [`MappedMemory`] and keeps it: a BAR
//!   mapping of GPU memory, a ring region or a host buffer is handed over without `unsafe`. A
//!   leaked [`OwnedMapping`] leaks the memory with it, and an unmap the IOMMU refuses leaks the
//!   memory rather than free it under the device.
//! - [`IommuSpace::alloc_buffer`] (safe) allocates host memory that the [`DmaBuffer`] owns.
//! - [`IommuSpace::map`] borrows the memory and unmaps on drop. A leaked (`mem::forget`)
//!   [`Mapping`] would never unmap while the borrow ends, which is why it is `unsafe` with a
//!   no-leak contract; an unmap the IOMMU refuses aborts the process (the borrowed memory is
//!   about to be freed by its owner).
//!
//! Buffers must not outlive the VFIO session whose container they are mapped in: the unmap then
//! fails and the buffer is leaked.

use crate::error::{DmaError, Result};
use crate::iova::{IovaAllocator, IovaRange};
use crate::memory::{Caching, HostPages, MappedMemory};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// What actually programs the IOMMU.
pub trait IommuBackend: Send + Sync {
    /// The smallest mapping granule; addresses and lengths must be multiples of it.
    fn page_size(&self) -> u64;
    /// Makes CPU addresses `vaddr..vaddr+len` visible to devices at `iova`, readable and
    /// writable. The caller ([`IommuSpace`]) guarantees the CPU range stays mapped until
    /// [`IommuBackend::unmap`] is called for it.
    fn map(&self, vaddr: usize, iova: u64, len: u64) -> Result<()>;
    /// Removes a mapping made by `map` with the same `iova` and `len`.
    fn unmap(&self, iova: u64, len: u64) -> Result<()>;
}

struct Entry {
    len: u64,
    label: String,
}

struct State {
    alloc: IovaAllocator,
    maps: BTreeMap<u64, Entry>,
}

struct Inner {
    backend: Arc<dyn IommuBackend>,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the table consistent (every update is a single
        // insert/remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An IOMMU address space shared by one or more devices (one VFIO container).
///
/// # Examples
///
/// Memory someone else allocated (here host pages; GPU memory mapped through BAR1 the same
/// way) mapped for a device, which the space keeps alive until the mapping is dropped:
///
/// ```
/// use gdr_dma::{HostPages, IommuSpace, MappedMemory, SimIommu};
/// use std::sync::Arc;
///
/// let iommu = Arc::new(SimIommu::new(4096));
/// let space = IommuSpace::new(iommu.clone(), 1 << 20, 1 << 30)?;
/// let mem = Arc::new(HostPages::new(8192)?);
/// mem.write_at(100, b"host bytes")?;
/// let mapping = space.map_owned(mem.clone(), "host pages")?;
/// let mut seen = [0u8; 10];
/// iommu.read(mapping.iova() + 100, &mut seen).expect("mapped");
/// assert_eq!(&seen, b"host bytes");
/// assert_eq!(space.mappings().len(), 1);
/// let iova = mapping.iova();
/// drop(mapping);
/// assert!(space.mappings().is_empty());
/// assert!(iommu.read(iova, &mut seen).is_err(), "unmapped with the mapping");
/// # Ok::<(), gdr_dma::DmaError>(())
/// ```
#[derive(Clone)]
pub struct IommuSpace {
    inner: Arc<Inner>,
}

impl IommuSpace {
    /// A space whose IOVAs are allocated from `[base, limit)`.
    pub fn new(backend: Arc<dyn IommuBackend>, base: u64, limit: u64) -> Result<Self> {
        let page = backend.page_size();
        if !page.is_power_of_two() || !base.is_multiple_of(page) {
            return Err(DmaError::Misaligned {
                what: "IOVA window base",
                value: base,
                align: page,
            });
        }
        Ok(IommuSpace {
            inner: Arc::new(Inner {
                backend,
                state: Mutex::new(State {
                    alloc: IovaAllocator::new(base, limit)?,
                    maps: BTreeMap::new(),
                }),
            }),
        })
    }

    /// The IOMMU's mapping granule in bytes: mapped addresses and lengths are multiples of it.
    pub fn page_size(&self) -> u64 {
        self.inner.backend.page_size()
    }

    /// The backend, for callers that need to go around the checks (tests of the kernel's own
    /// refusals).
    pub fn backend(&self) -> &Arc<dyn IommuBackend> {
        &self.inner.backend
    }

    /// One past the highest IOVA this space hands out.
    pub fn limit(&self) -> u64 {
        self.inner.lock().alloc.limit()
    }

    /// Maps all of `mem`.
    ///
    /// # Safety
    /// The returned [`Mapping`] must be dropped, not leaked (`mem::forget`), before `mem` is
    /// freed: its borrow ends either way, but only the drop unmaps, and a device could reach
    /// the memory through a leaked mapping. (The IOMMU space cannot own borrowed memory, as
    /// [`DmaBuffer`] does for its own.)
    pub unsafe fn map<'m, M: MappedMemory + ?Sized>(
        &self,
        mem: &'m M,
        label: &str,
    ) -> Result<Mapping<'m>> {
        // SAFETY: `map_part` has the same contract as `map` (the Mapping is dropped, not leaked,
        // before `mem` is freed), and our caller upholds it for all of `mem`.
        unsafe { self.map_part(mem, 0, mem.size(), label) }
    }

    /// Maps `len` bytes of `mem` starting at byte `offset`; both must be page multiples.
    ///
    /// # Safety
    /// As [`map`](Self::map).
    pub unsafe fn map_part<'m, M: MappedMemory + ?Sized>(
        &self,
        mem: &'m M,
        offset: usize,
        len: usize,
        label: &str,
    ) -> Result<Mapping<'m>> {
        let core = self.map_core(mem, offset, len, label)?;
        Ok(Mapping {
            core,
            _mem: PhantomData,
        })
    }

    /// Maps all of `mem` and keeps it alive until the mapping is dropped, so no device can reach
    /// it once freed: safe for any memory the caller can share, e.g. GPU memory mapped through
    /// BAR1 (`Arc<gdr::bar::MappedBuffer>`), a ring region, or a host buffer.
    pub fn map_owned<M: MappedMemory + ?Sized + 'static>(
        &self,
        mem: Arc<M>,
        label: &str,
    ) -> Result<OwnedMapping<M>> {
        let core = self.map_core(&*mem, 0, mem.size(), label)?;
        Ok(OwnedMapping {
            core,
            mem: Some(mem),
        })
    }

    /// Checks `offset..offset+len` against `mem` and maps it.
    fn map_core<M: MappedMemory + ?Sized>(
        &self,
        mem: &M,
        offset: usize,
        len: usize,
        label: &str,
    ) -> Result<MapCore> {
        if offset.checked_add(len).is_none_or(|e| e > mem.size()) {
            return Err(DmaError::Oversize {
                what: "mapping past the end of the memory",
                len: (offset as u64).saturating_add(len as u64),
                limit: mem.size() as u64,
            });
        }
        let ptr = mem.cpu_ptr().wrapping_add(offset);
        self.map_raw(ptr as usize, len as u64, label)
    }

    /// Allocates a zeroed host buffer of `len` bytes and maps it; the result owns both.
    pub fn alloc_buffer(&self, len: usize, label: &str) -> Result<DmaBuffer> {
        let buf = HostPages::new(len)?;
        let core = self.map_raw(buf.cpu_ptr() as usize, buf.size() as u64, label)?;
        Ok(DmaBuffer {
            core,
            buf: Some(buf),
        })
    }

    fn map_raw(&self, vaddr: usize, len: u64, label: &str) -> Result<MapCore> {
        let page = self.page_size();
        if !(vaddr as u64).is_multiple_of(page) {
            return Err(DmaError::Misaligned {
                what: "CPU address of an IOMMU mapping",
                value: vaddr as u64,
                align: page,
            });
        }
        if len == 0 || !len.is_multiple_of(page) {
            return Err(DmaError::Misaligned {
                what: "length of an IOMMU mapping",
                value: len,
                align: page,
            });
        }
        let mut st = self.inner.lock();
        // Large mappings get large alignment so the IOMMU can use big pages.
        let align = if len >= 2 << 20 { 2 << 20 } else { page };
        let iova = st.alloc.alloc(len, align)?;
        if let Err(e) = self.inner.backend.map(vaddr, iova, len) {
            st.alloc.free(iova);
            return Err(e);
        }
        st.maps.insert(
            iova,
            Entry {
                len,
                label: label.to_string(),
            },
        );
        Ok(MapCore {
            inner: self.inner.clone(),
            iova,
            len,
            vaddr,
            live: true,
        })
    }

    /// Succeeds when all of `r` lies inside one live mapping.
    pub fn check(&self, r: IovaRange) -> Result<()> {
        let st = self.inner.lock();
        let hit = st
            .maps
            .range(..=r.iova)
            .next_back()
            .is_some_and(|(&iova, e)| IovaRange::new(iova, e.len).contains(&r));
        if hit && r.len > 0 {
            Ok(())
        } else {
            Err(DmaError::Unmapped {
                iova: r.iova,
                len: r.len,
            })
        }
    }

    /// The live mappings, lowest IOVA first, with their labels.
    pub fn mappings(&self) -> Vec<(IovaRange, String)> {
        self.inner
            .lock()
            .maps
            .iter()
            .map(|(&iova, e)| (IovaRange::new(iova, e.len), e.label.clone()))
            .collect()
    }
}

/// The part of a mapping that undoes it.
struct MapCore {
    inner: Arc<Inner>,
    iova: u64,
    len: u64,
    vaddr: usize,
    live: bool,
}

impl MapCore {
    /// Unmaps; returns false if the IOMMU refused, in which case the IOVA stays reserved and the
    /// caller must keep the memory alive (a device may still reach it).
    fn release(&mut self) -> bool {
        if !self.live {
            return true;
        }
        self.live = false;
        let mut st = self.inner.lock();
        st.maps.remove(&self.iova);
        if self.inner.backend.unmap(self.iova, self.len).is_ok() {
            st.alloc.free(self.iova);
            true
        } else {
            false
        }
    }
}

impl Drop for MapCore {
    fn drop(&mut self) {
        self.release();
    }
}

/// The IOVA, length and range of a mapping type that holds a [`MapCore`] in `core`.
macro_rules! iova_accessors {
    (impl $($head:tt)*) => {
        impl $($head)* {
            /// The device's addresses of the memory.
            pub fn range(&self) -> IovaRange {
                IovaRange::new(self.core.iova, self.core.len)
            }
            /// The device's address of the first byte.
            pub fn iova(&self) -> u64 {
                self.core.iova
            }
            /// Bytes mapped (whole pages).
            pub fn len(&self) -> u64 {
                self.core.len
            }
            /// Whether no bytes are mapped (never so for a live mapping; for `len`'s sake).
            pub fn is_empty(&self) -> bool {
                self.core.len == 0
            }
        }
    };
}

/// Borrowed memory mapped for DMA; unmapped on drop.
pub struct Mapping<'m> {
    core: MapCore,
    _mem: PhantomData<&'m ()>,
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        if !self.core.release() {
            // The memory is borrowed: its owner will free it when we return, while a device can
            // still reach it through the IOMMU. Nothing safe is left to do.
            eprintln!(
                "gdr-dma: the IOMMU refused to unmap IOVA {:#x} (+{:#x}) of borrowed memory; aborting",
                self.core.iova, self.core.len
            );
            std::process::abort();
        }
    }
}

iova_accessors!(impl Mapping<'_>);

/// Shared memory mapped for DMA, kept alive by the mapping; unmapped on drop, then the `Arc` is
/// released. Should the IOMMU refuse to unmap, the `Arc` is leaked, so the memory can never be
/// freed under a device that may still reach it.
pub struct OwnedMapping<M: ?Sized> {
    core: MapCore,
    mem: Option<Arc<M>>,
}

iova_accessors!(impl<M: ?Sized> OwnedMapping<M>);

impl<M: ?Sized> OwnedMapping<M> {
    /// The memory mapped.
    pub fn memory(&self) -> &Arc<M> {
        self.mem.as_ref().expect("taken only in drop")
    }
}

impl<M: ?Sized> Drop for OwnedMapping<M> {
    fn drop(&mut self) {
        if !self.core.release() {
            std::mem::forget(self.mem.take());
        }
    }
}

/// A host buffer that owns its DMA mapping. Dropping it unmaps first, then frees the memory
/// (or leaks it, should the IOMMU refuse to unmap, so that no device can reach freed memory).
pub struct DmaBuffer {
    core: MapCore,
    buf: Option<HostPages>,
}

iova_accessors!(impl DmaBuffer);

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        if !self.core.release() {
            std::mem::forget(self.buf.take());
        }
    }
}

// SAFETY: the host buffer lives as long as the DmaBuffer (it is only taken out in drop).
unsafe impl MappedMemory for DmaBuffer {
    fn cpu_ptr(&self) -> *mut u8 {
        self.core.vaddr as *mut u8
    }
    fn size(&self) -> usize {
        self.core.len as usize
    }
    fn caching(&self) -> Caching {
        Caching::WriteBack
    }
}
