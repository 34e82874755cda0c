//! The memory a ring lives in, as the host sees it, and the few ways the host touches it.
//!
//! A ring needs a CPU mapping ([`MappedMemory`]: address, length, and whether stores are
//! write-combined, when a store fence must drain them before a doorbell or owner word is
//! written) plus the GPU address of the same bytes. [`RingMemory`] adds that address, so the
//! same host code drives GPU memory mapped through BAR1 ([`MappedBuffer`]), mapped host memory
//! ([`HostBuffer`]), or plain memory ([`PlainMemory`]) where a CPU thread plays the GPU in
//! tests.
//!
//! [`Region`] is a window of such memory with the accesses the protocol uses: 32-bit
//! acquire loads and release stores of the owner/index words, byte copies for payloads, and
//! the publish fence. Words are accessed as atomics (plain `mov`s on x86, fine on WC memory);
//! payload bytes are copied (with the mapping's copy routine) only while the protocol gives
//! this side sole ownership of them. A region is itself [`MappedMemory`], so a ring's memory
//! can be handed on (to a DMA engine, a test) without `unsafe`.

use gdr::bar::MappedBuffer;
use gdr::cuda::{DeviceMemory, HostBuffer};
use gdr_mem::{check_range, store_fence, Caching, MappedMemory};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Memory that can hold a ring: a CPU mapping that a GPU reaches at [`gpu_addr`](Self::gpu_addr).
///
/// # Safety
/// As [`MappedMemory`], and: `cpu_ptr()` is aligned to 64, and if `gpu_addr()` is used by a
/// GPU, it addresses the same bytes.
pub unsafe trait RingMemory: MappedMemory + Send + Sync + 'static {
    /// GPU (CUDA device) address of the first byte; for plain memory, the CPU address.
    fn gpu_addr(&self) -> u64;
}

// SAFETY: the BAR mapping is MappedMemory (gdr/src/bar/backend/vulkan/buffer.rs) and device_ptr is the same memory;
// buffers for rings are allocated 64-byte aligned.
unsafe impl RingMemory for MappedBuffer {
    fn gpu_addr(&self) -> u64 {
        self.device_ptr()
    }
}

// SAFETY: device_ptr is the DEVICEMAP alias of the same page-aligned memory.
unsafe impl RingMemory for HostBuffer {
    fn gpu_addr(&self) -> u64 {
        self.device_ptr()
    }
}

/// Zeroed, 4 KiB-aligned ordinary memory, for rings shared between CPU threads (tests, and the
/// reference worker, [`CpuWorkers`](crate::CpuWorkers)). Fresh anonymous pages: zero without
/// being written, so a ring's memory is written once (by its setup), not twice.
pub struct PlainMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the value and unmapped only in its Drop, whichever thread
// that runs on; the raw pointer carries no thread affinity.
unsafe impl Send for PlainMemory {}
// SAFETY: a shared PlainMemory only hands out its pointer, size and caching; every access
// through that pointer goes through Region, whose shared words are atomics and whose byte
// copies the ring protocol makes exclusive, so sharing it adds no data race of its own.
unsafe impl Sync for PlainMemory {}

impl PlainMemory {
    /// `size` zeroed bytes (at least one page is reserved).
    pub fn new(size: usize) -> Result<PlainMemory, String> {
        let len = size
            .max(4096)
            .checked_next_multiple_of(4096)
            .ok_or_else(|| format!("cannot allocate {size} bytes"))?;
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "out of memory allocating {size} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(PlainMemory {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for PlainMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new, of this length, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: ptr is a live, owned, page-aligned mapping of len bytes, reached only
// through copies and atomics.
unsafe impl MappedMemory for PlainMemory {
    fn cpu_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.len
    }
    fn caching(&self) -> Caching {
        Caching::WriteBack
    }
}

// SAFETY: as above; the "GPU" of plain memory is a CPU thread, which uses the CPU address.
unsafe impl RingMemory for PlainMemory {
    fn gpu_addr(&self) -> u64 {
        self.ptr as u64
    }
}

/// A bounds-checked window `[offset, offset + len)` of ring memory, keeping the memory alive.
#[derive(Clone)]
pub struct Region {
    mem: Arc<dyn RingMemory>,
    base: *mut u8,
    len: usize,
    gpu: u64,
    caching: Caching,
}

// SAFETY: the pointer stays valid while `mem` (held, itself Send + Sync) lives, whichever
// thread holds the region; all concurrent access goes through atomics or through byte copies
// the ring protocol makes exclusive.
unsafe impl Send for Region {}
// SAFETY: the methods of a shared region touch the memory only through atomics (the owner and
// index words) or through byte copies of ranges the ring protocol gives one side at a time.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Region({:#x}+{}, {:?})",
            self.gpu, self.len, self.caching
        )
    }
}

impl Region {
    /// The window `[offset, offset + len)` of `mem`, or None if it does not fit or is not
    /// 16-byte aligned.
    pub fn new(mem: Arc<dyn RingMemory>, offset: usize, len: usize) -> Option<Region> {
        if !offset.is_multiple_of(16) || offset.checked_add(len)? > mem.size() {
            return None;
        }
        // SAFETY: offset + len is inside the allocation (checked).
        let base = unsafe { mem.cpu_ptr().add(offset) };
        Some(Region {
            gpu: mem.gpu_addr() + offset as u64,
            caching: mem.caching(),
            base,
            len,
            mem,
        })
    }

    /// A whole memory as one region.
    pub fn whole(mem: Arc<dyn RingMemory>) -> Region {
        let len = mem.size();
        Self::new(mem, 0, len).expect("the whole memory fits")
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a window of no bytes (every access to it panics).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// GPU address of the window's first byte.
    pub fn gpu_addr(&self) -> u64 {
        self.gpu
    }

    /// True when the CPU's stores to this memory are write-combined (a BAR mapping of GPU
    /// memory): they may leave the CPU out of order and late, so publishing needs
    /// [`publish_fence`](Self::publish_fence) and [`flush`](Self::flush), and reads are
    /// uncached round trips over PCIe.
    pub fn write_combined(&self) -> bool {
        self.caching == Caching::WriteCombined
    }

    /// The sub-window `[offset, offset + len)` of this one.
    pub fn sub(&self, offset: usize, len: usize) -> Option<Region> {
        if !offset.is_multiple_of(16) || offset.checked_add(len)? > self.len {
            return None;
        }
        Some(Region {
            mem: self.mem.clone(),
            // SAFETY: inside the window (checked).
            base: unsafe { self.base.add(offset) },
            len,
            gpu: self.gpu + offset as u64,
            caching: self.caching,
        })
    }

    #[inline]
    fn at(&self, off: usize, n: usize) -> *mut u8 {
        if let Err(e) = check_range(off, n, self.len) {
            panic!("ring access: {e}");
        }
        // SAFETY: checked to be inside the window.
        unsafe { self.base.add(off) }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4), "unaligned ring word at {off}");
        // SAFETY: in bounds (at), 4-aligned (the region base is 16-aligned), valid while
        // self holds the memory; shared words are only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.at(off, 4).cast()) }
    }

    /// Acquire load of the 32-bit word at `off` (an owner word or an index).
    pub fn load_u32(&self, off: usize) -> u32 {
        self.word(off).load(Ordering::Acquire)
    }

    /// Relaxed load of an aligned 64-bit word at `off`: counters, and the TX words, each of
    /// which carries its own sequence number (so no ordering with other loads is needed).
    pub fn load_u64(&self, off: usize) -> u64 {
        assert!(off.is_multiple_of(8), "unaligned ring word at {off}");
        // SAFETY: in bounds (at), 8-aligned (asserted, on the 16-aligned region base), valid
        // while self holds the memory; shared words are only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.at(off, 8).cast()) }.load(Ordering::Relaxed)
    }

    /// Relaxed loads of the `count` 8-byte words from `off`, in order, each handed to `f`
    /// with its position until `f` returns false; returns how many `f` accepted. One bounds
    /// check for the whole run, so a response's words cost a load and a compare each (the
    /// TX words are self-checking: no load needs ordering against another).
    #[inline]
    pub fn scan_u64(
        &self,
        off: usize,
        count: usize,
        mut f: impl FnMut(usize, u64) -> bool,
    ) -> usize {
        assert!(off.is_multiple_of(8), "unaligned ring word at {off}");
        let bytes = count.checked_mul(8).expect("word count overflows");
        let p = self.at(off, bytes).cast::<u64>();
        for k in 0..count {
            // SAFETY: word k is inside the checked run, 8-aligned (the region base is
            // 16-aligned), valid while self holds the memory; shared words are only ever
            // accessed atomically.
            let w = unsafe { AtomicU64::from_ptr(p.add(k)) }.load(Ordering::Relaxed);
            if !f(k, w) {
                return k;
            }
        }
        count
    }

    /// Release store of the 32-bit word at `off`. On write-combined memory call
    /// [`publish_fence`](Self::publish_fence) before (to order the payload) and
    /// [`flush`](Self::flush) after (to push the word out now).
    pub fn store_u32(&self, off: usize, v: u32) {
        self.word(off).store(v, Ordering::Release)
    }

    /// Plain 64-bit store (statistics written by the CPU worker).
    pub fn store_u64(&self, off: usize, v: u64) {
        assert!(off.is_multiple_of(8), "unaligned ring word at {off}");
        // SAFETY: in bounds (at), 8-aligned (asserted, on the 16-aligned region base), valid
        // while self holds the memory; shared words are only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.at(off, 8).cast()) }.store(v, Ordering::Release)
    }

    /// Copies `src` to `off` unfenced ([`MappedMemory::write_at_unfenced`]): the caller
    /// publishes with [`publish_fence`](Self::publish_fence) before the store that hands the
    /// bytes over, one fence for every piece staged (a fence per piece made the fence, not the
    /// stores, the cost of a small message: docs/mq.md, "Placements"). The caller must own
    /// those bytes under the ring protocol: the other side reads them only after a later
    /// release store it acquires.
    ///
    /// # Panics
    /// When the bytes are outside the region (a protocol bug, not an input error).
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) {
        if let Err(e) = self.write_at_unfenced(off, src) {
            panic!("ring write: {e}");
        }
    }

    /// Writes whole aligned 8-byte words (`off` and `src.len()` multiples of 8) that the other
    /// side may be reading at the same time: each word lands whole, never torn, so a word that
    /// carries its own seq is either old or new. Write-combined (BAR) memory goes through the
    /// stream-store routine (whole aligned 16- and 64-byte stores, then `sfence`); ordinary
    /// memory through relaxed 8-byte atomic stores.
    pub fn write_words(&self, off: usize, src: &[u8]) {
        assert!(
            off.is_multiple_of(8) && src.len().is_multiple_of(8),
            "write_words needs whole aligned words"
        );
        if self.write_combined() {
            // The mapping's own routine (write_at: whole aligned stores, then the fence).
            if let Err(e) = self.write_at(off, src) {
                panic!("ring access: {e}");
            }
        } else {
            let dst = self.at(off, src.len());
            for (i, chunk) in src.chunks_exact(8).enumerate() {
                let w = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
                // SAFETY: in bounds and 8-aligned (checked above and by `at`); words the
                // other side may read are only ever accessed atomically.
                unsafe { AtomicU64::from_ptr(dst.add(i * 8).cast()) }.store(w, Ordering::Relaxed);
            }
        }
    }

    /// Copies `dst.len()` bytes from `off` with the mapping's copy routine
    /// ([`MappedMemory::read_at`]). The caller must own those bytes under the protocol: the
    /// other side published them before the acquire that let the caller here, and does not
    /// rewrite them until the caller hands the slot back.
    ///
    /// # Panics
    /// When the bytes are outside the region.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        if let Err(e) = self.read_at(off, dst) {
            panic!("ring read: {e}");
        }
    }

    /// Reads whole aligned 8-byte words at `off` (a multiple of 8) into `dst` (a multiple of 8
    /// long) while the other side may still be writing them: no word is ever split between two
    /// reads, so each arrives either old or new, never torn. Write-combined (BAR) memory goes
    /// through the stream-load routine, which reads only whole aligned chunks; ordinary memory
    /// through 8-byte volatile loads.
    pub fn read_words(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.is_multiple_of(8) && dst.len().is_multiple_of(8),
            "read_words needs whole aligned words"
        );
        if self.write_combined() {
            // The mapping's own routine (read_at: streaming loads of whole aligned chunks).
            if let Err(e) = self.read_at(off, dst) {
                panic!("ring access: {e}");
            }
        } else {
            let src = self.at(off, dst.len());
            for (i, chunk) in dst.chunks_exact_mut(8).enumerate() {
                // SAFETY: in bounds and 8-aligned (checked above and by `at`).
                let w = unsafe { std::ptr::read_volatile(src.add(i * 8).cast::<u64>()) };
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
        }
    }

    /// Orders every earlier store to this region before every later one. Write-combined
    /// stores are weakly ordered, so this is `sfence` there; on ordinary memory a release
    /// fence (x86 keeps stores in order anyway).
    pub fn publish_fence(&self) {
        if self.write_combined() {
            store_fence();
        } else {
            std::sync::atomic::fence(Ordering::Release);
        }
    }

    /// Pushes write-combined stores out of the CPU now rather than whenever the line fills.
    pub fn flush(&self) {
        if self.write_combined() {
            store_fence();
        }
    }
}

// SAFETY: the window lies inside `mem` (checked when made), which the region keeps alive; the
// region is 16-byte aligned inside a page-granular or 4 KiB-aligned mapping, so the lines around
// it are readable when the memory is write-combined.
unsafe impl MappedMemory for Region {
    #[inline]
    fn cpu_ptr(&self) -> *mut u8 {
        self.base
    }
    #[inline]
    fn size(&self) -> usize {
        self.len
    }
    #[inline]
    fn caching(&self) -> Caching {
        self.caching
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_memory_is_zeroed_and_aligned() {
        let m = PlainMemory::new(10_000).unwrap();
        assert_eq!(m.cpu_ptr() as usize % 4096, 0);
        assert_eq!(m.caching(), Caching::WriteBack);
        assert!(m.size() >= 10_000);
        // SAFETY: valid for size() bytes.
        let s = unsafe { std::slice::from_raw_parts(m.cpu_ptr(), m.size()) };
        assert!(s.iter().all(|&b| b == 0));
    }

    #[test]
    fn regions_are_bounds_checked_and_alias() {
        let mem: Arc<dyn RingMemory> = Arc::new(PlainMemory::new(4096).unwrap());
        let r = Region::whole(mem.clone());
        assert!(
            Region::new(mem.clone(), 8, 16).is_none(),
            "unaligned accepted"
        );
        assert!(
            Region::new(mem.clone(), 4096, 1).is_none(),
            "past the end accepted"
        );
        assert!(Region::new(mem.clone(), usize::MAX - 15, 32).is_none());
        let sub = r.sub(256, 512).unwrap();
        assert_eq!(sub.gpu_addr(), r.gpu_addr() + 256);
        assert!(sub.sub(512, 1).is_none());
        let data: Vec<u8> = (0..100u8).collect();
        sub.write(10, &data);
        let mut back = [0u8; 100];
        r.read(266, &mut back);
        assert_eq!(&back[..], &data[..]);
        sub.store_u32(64, 0xdead_beef);
        assert_eq!(r.load_u32(320), 0xdead_beef);
        sub.store_u64(72, 7 << 40);
        assert_eq!(r.load_u64(328), 7 << 40);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_window_access_panics_instead_of_corrupting() {
        let mem: Arc<dyn RingMemory> = Arc::new(PlainMemory::new(4096).unwrap());
        let r = Region::whole(mem).sub(0, 64).unwrap();
        r.write(60, &[0u8; 8]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_window_read_panics() {
        let mem: Arc<dyn RingMemory> = Arc::new(PlainMemory::new(4096).unwrap());
        let r = Region::whole(mem).sub(64, 64).unwrap();
        r.read(1, &mut [0u8; 64]);
    }
}
