//! [`MappedMemory`]: a CPU mapping of memory that other agents (a GPU, a DMA engine) reach too.
//!
//! Such memory is never handed out as a Rust slice: a device may write it at any moment, and a
//! `&[u8]` over it would promise the compiler that nothing does. Every access is an explicit
//! copy or a volatile word access, bounds-checked against the mapping, and made with the
//! routine that suits how the CPU caches the mapping ([`Caching`]).
//!
//! In the spirit of vm-memory's `Bytes`: implementors say only where the mapping is, how long
//! it is and how it is cached (and vouch for that with an `unsafe impl`); the accesses are
//! provided methods, so a ring, a DMA engine or a test reaches every kind of memory the same
//! way.

use crate::copy;
use std::ptr;

/// How the CPU caches a mapping, which decides how to copy to and from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caching {
    /// Ordinary cached memory (host RAM, pinned or not): plain copies; x86 keeps stores in
    /// order, so publishing needs no more than a release fence.
    WriteBack,
    /// Write-combined memory (a GPU's BAR1 mapping): stores go out as non-temporal whole-line
    /// bursts and loads as streaming loads of whole aligned chunks ([`crate::copy`]); stores
    /// are weakly ordered, so publishing needs `sfence`.
    WriteCombined,
    /// Uncached device memory (another device's BAR mapped through VFIO): exact plain copies,
    /// which never touch a byte outside the range (a register read may have side effects).
    /// Uncached stores are strongly ordered.
    Uncached,
}

/// The largest piece [`MappedMemory::write_at_unfenced`] writes with ordinary stores on
/// write-combined memory; larger ones go through the stream kernel.
pub const SMALL_STAGE: usize = 256;

/// An access that does not fit the mapping; returned before any byte is read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// `[offset, offset + len)` does not lie inside the mapping's `size` bytes (or the end
    /// overflows `usize`).
    #[error("access of {len} bytes at offset {offset} is outside a {size}-byte mapping")]
    OutOfBounds {
        /// Byte offset of the access from the start of the mapping.
        offset: usize,
        /// Length of the access in bytes.
        len: usize,
        /// Size of the mapping in bytes ([`MappedMemory::size`]).
        size: usize,
    },
    /// A word access whose CPU address is not a multiple of the word's width (the check is on
    /// the address, so an offset that is aligned within a misaligned mapping is refused too).
    #[error("{width}-byte word access at offset {offset} is not {width}-byte aligned")]
    Misaligned {
        /// Byte offset of the word from the start of the mapping.
        offset: usize,
        /// Width of the word in bytes: 4 or 8.
        width: usize,
    },
}

/// `Ok` when `[offset, offset + len)` lies inside `size` bytes (without overflow).
///
/// # Errors
/// [`AccessError::OutOfBounds`] otherwise.
///
/// ```
/// use gdr_mem::{check_range, AccessError};
/// assert!(check_range(4000, 96, 4096).is_ok());
/// assert_eq!(
///     check_range(4000, 97, 4096),
///     Err(AccessError::OutOfBounds { offset: 4000, len: 97, size: 4096 })
/// );
/// assert!(check_range(usize::MAX, 2, 4096).is_err()); // the end would overflow
/// ```
#[inline]
pub fn check_range(offset: usize, len: usize, size: usize) -> Result<(), AccessError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(AccessError::OutOfBounds { offset, len, size }),
    }
}

/// A CPU mapping of memory that a GPU or another device may access concurrently.
///
/// # Safety
/// Implementors promise that
/// - `cpu_ptr()..cpu_ptr() + size()` is mapped readable and writable, at that same address, for
///   as long as the value lives (or, for a borrowing type, for as long as its borrow lasts);
/// - when [`caching`](Self::caching) is [`Caching::WriteCombined`], the whole aligned 64-byte
///   lines that overlap that range are mapped and readable without side effects (a
///   page-granular mapping always satisfies this): the streaming loads read whole lines;
/// - the bytes are not reached through a Rust reference (`&[u8]` / `&mut [u8]`) while they may
///   be accessed through this trait.
pub unsafe trait MappedMemory {
    /// CPU address of the first byte.
    fn cpu_ptr(&self) -> *mut u8;

    /// Bytes mapped from [`cpu_ptr`](Self::cpu_ptr).
    fn size(&self) -> usize;

    /// How the CPU caches the mapping.
    fn caching(&self) -> Caching;

    /// Copies `dst.len()` bytes from `offset` into `dst`, with streaming loads on
    /// write-combined memory.
    ///
    /// # Errors
    /// [`AccessError::OutOfBounds`] when the range leaves the mapping; nothing is read then.
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), AccessError> {
        check_range(offset, dst.len(), self.size())?;
        // SAFETY: the range is inside the live mapping (trait contract, checked); `dst` is a
        // distinct Rust buffer. On write-combined memory the lines around the range are
        // readable (trait contract), as copy_from_mapping requires.
        unsafe {
            let src = self.cpu_ptr().add(offset);
            match self.caching() {
                Caching::WriteCombined => copy::copy_from_mapping(dst, src),
                Caching::WriteBack | Caching::Uncached => {
                    ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len())
                }
            }
        }
        Ok(())
    }

    /// Copies `src` to `offset`, writing exactly that range. On write-combined memory the bytes
    /// are globally visible when this returns (the store routine ends with a store fence).
    ///
    /// # Errors
    /// [`AccessError::OutOfBounds`] when the range leaves the mapping; nothing is written then.
    #[inline]
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        store_bytes(self, offset, src, Publish::Now)
    }

    /// [`write_at`](Self::write_at) without the closing store fence on write-combined memory:
    /// the bytes may wait in the CPU's write-combining buffers until the next
    /// [`publish`](Self::publish). For a writer that stages several pieces and publishes them
    /// with one fence (a ring's slots before its doorbell). Elsewhere the same as `write_at`.
    ///
    /// Pieces up to [`SMALL_STAGE`] bytes go out as ordinary stores, which the CPU combines
    /// like the stream stores (and which write only the range too): for a ring's 16-byte
    /// header and small messages, the stream kernel's dispatch and alignment steps cost
    /// measurably more than the stores themselves (docs/mq.md).
    #[inline]
    fn write_at_unfenced(&self, offset: usize, src: &[u8]) -> Result<(), AccessError> {
        store_bytes(self, offset, src, Publish::Later)
    }

    /// [`write_at`](Self::write_at) split over up to `threads` CPU threads (the caller
    /// included) on write-combined memory, where one thread's stores do not fill the link
    /// ([`copy::copy_to_mapping_parallel`]; a small copy runs on fewer threads than asked,
    /// [`copy::part_count`]). The bytes are globally visible when this returns: every part
    /// ends with its own store fence. With `threads` of 0 or 1, and on cached or uncached
    /// memory, it is `write_at` on the calling thread.
    ///
    /// # Errors
    /// [`AccessError::OutOfBounds`] when the range leaves the mapping; nothing is written then.
    fn write_parallel(&self, offset: usize, src: &[u8], threads: usize) -> Result<(), AccessError> {
        if threads <= 1 || self.caching() != Caching::WriteCombined {
            return self.write_at(offset, src);
        }
        check_range(offset, src.len(), self.size())?;
        // SAFETY: the range is inside the live mapping (trait contract, checked) and `src` is a
        // distinct Rust buffer; the parallel routine writes exactly the range.
        unsafe { copy::copy_to_mapping_parallel(self.cpu_ptr().add(offset), src, threads) };
        Ok(())
    }

    /// [`read_at`](Self::read_at) split over up to `threads` CPU threads (the caller included)
    /// on write-combined memory, where one thread's streaming loads leave the link idle
    /// ([`copy::copy_from_mapping_parallel`]). With `threads` of 0 or 1, and on cached or
    /// uncached memory (whose lines around the range need not be readable), it is `read_at`
    /// on the calling thread.
    ///
    /// # Errors
    /// [`AccessError::OutOfBounds`] when the range leaves the mapping; nothing is read and
    /// `dst` is untouched then.
    fn read_parallel(
        &self,
        offset: usize,
        dst: &mut [u8],
        threads: usize,
    ) -> Result<(), AccessError> {
        if threads <= 1 || self.caching() != Caching::WriteCombined {
            return self.read_at(offset, dst);
        }
        check_range(offset, dst.len(), self.size())?;
        // SAFETY: the range is inside the live mapping (trait contract, checked), and on
        // write-combined memory the aligned lines around it are readable (trait contract), as
        // the streaming loads need; `dst` is a distinct Rust buffer.
        unsafe { copy::copy_from_mapping_parallel(dst, self.cpu_ptr().add(offset), threads) };
        Ok(())
    }

    /// Volatile load of the aligned 32-bit word at `offset` (a flag, a register).
    ///
    /// # Errors
    /// [`AccessError::OutOfBounds`] outside the mapping, [`AccessError::Misaligned`] when the
    /// word's CPU address is not a multiple of 4 (of 8 for the 64-bit accessors).
    #[inline]
    fn load_u32(&self, offset: usize) -> Result<u32, AccessError> {
        load_word(self, offset)
    }

    /// Volatile store of the aligned 32-bit word at `offset`. On write-combined memory follow
    /// it with [`publish`](Self::publish) to push it out now.
    #[inline]
    fn store_u32(&self, offset: usize, value: u32) -> Result<(), AccessError> {
        store_word(self, offset, value)
    }

    /// Volatile load of the aligned 64-bit word at `offset`.
    #[inline]
    fn load_u64(&self, offset: usize) -> Result<u64, AccessError> {
        load_word(self, offset)
    }

    /// Volatile store of the aligned 64-bit word at `offset`.
    #[inline]
    fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        store_word(self, offset, value)
    }

    /// Reads native-endian 32-bit words from byte `offset` (which need not be aligned).
    fn read_u32s(&self, offset: usize, dst: &mut [u32]) -> Result<(), AccessError> {
        check_range(offset, dst.len().saturating_mul(4), self.size())?;
        let mut bytes = [0u8; 256];
        for (i, words) in dst.chunks_mut(bytes.len() / 4).enumerate() {
            let chunk = &mut bytes[..words.len() * 4];
            self.read_at(offset + i * 256, chunk)?;
            for (w, b) in words.iter_mut().zip(chunk.chunks_exact(4)) {
                *w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Ok(())
    }

    /// Writes native-endian 32-bit words at byte `offset` (which need not be aligned).
    fn write_u32s(&self, offset: usize, src: &[u32]) -> Result<(), AccessError> {
        check_range(offset, src.len().saturating_mul(4), self.size())?;
        let mut bytes = [0u8; 256];
        for (i, words) in src.chunks(bytes.len() / 4).enumerate() {
            let chunk = &mut bytes[..words.len() * 4];
            for (b, w) in chunk.chunks_exact_mut(4).zip(words) {
                b.copy_from_slice(&w.to_ne_bytes());
            }
            self.write_at(offset + i * 256, chunk)?;
        }
        Ok(())
    }

    /// Orders every earlier store to this memory before every later one, and pushes
    /// write-combined stores out of the CPU now: `sfence` on write-combined memory, a release
    /// fence elsewhere.
    #[inline]
    fn publish(&self) {
        match self.caching() {
            Caching::WriteCombined => crate::store_fence(),
            Caching::WriteBack | Caching::Uncached => {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release)
            }
        }
    }
}

/// When stored bytes must be visible: on return, or at the caller's next publish.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Publish {
    Now,
    Later,
}

/// Copies `src` to `offset` of `mem` with the routine its caching calls for.
#[inline]
fn store_bytes(
    mem: &(impl MappedMemory + ?Sized),
    offset: usize,
    src: &[u8],
    publish: Publish,
) -> Result<(), AccessError> {
    check_range(offset, src.len(), mem.size())?;
    // SAFETY: the range is inside the live mapping (trait contract, checked) and `src` is a
    // distinct Rust buffer; every routine here writes exactly the range.
    unsafe {
        let dst = mem.cpu_ptr().add(offset);
        match (mem.caching(), publish) {
            (Caching::WriteCombined, Publish::Now) => copy::copy_to_mapping(dst, src),
            (Caching::WriteCombined, Publish::Later) if src.len() > SMALL_STAGE => {
                copy::copy_to_mapping_unfenced(dst, src)
            }
            _ => ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()),
        }
    }
    Ok(())
}

/// Volatile load of the aligned word `T` (u32 or u64) at `offset` of `mem`.
#[inline]
fn load_word<T: Copy>(mem: &(impl MappedMemory + ?Sized), offset: usize) -> Result<T, AccessError> {
    let p = word_ptr::<T>(mem, offset)?;
    // SAFETY: in bounds and aligned (word_ptr), inside the live mapping (trait contract).
    Ok(unsafe { ptr::read_volatile(p) })
}

/// Volatile store of the aligned word `T` (u32 or u64) at `offset` of `mem`.
#[inline]
fn store_word<T: Copy>(
    mem: &(impl MappedMemory + ?Sized),
    offset: usize,
    value: T,
) -> Result<(), AccessError> {
    let p = word_ptr::<T>(mem, offset)?;
    // SAFETY: as in load_word.
    unsafe { ptr::write_volatile(p, value) };
    Ok(())
}

/// The pointer to the aligned `T` word at `offset` of `mem`, checked.
#[inline]
fn word_ptr<T>(mem: &(impl MappedMemory + ?Sized), offset: usize) -> Result<*mut T, AccessError> {
    let width = std::mem::size_of::<T>();
    check_range(offset, width, mem.size())?;
    let p = mem.cpu_ptr().wrapping_add(offset);
    if !(p as usize).is_multiple_of(width) {
        return Err(AccessError::Misaligned { offset, width });
    }
    Ok(p.cast())
}

// SAFETY: forwarding; a reference lives no longer than what it borrows.
unsafe impl<M: MappedMemory + ?Sized> MappedMemory for &M {
    fn cpu_ptr(&self) -> *mut u8 {
        (**self).cpu_ptr()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn caching(&self) -> Caching {
        (**self).caching()
    }
}

// SAFETY: forwarding; the Arc keeps the memory alive.
unsafe impl<M: MappedMemory + ?Sized> MappedMemory for std::sync::Arc<M> {
    fn cpu_ptr(&self) -> *mut u8 {
        (**self).cpu_ptr()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn caching(&self) -> Caching {
        (**self).caching()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    /// A page of ordinary memory, under each caching kind (the write-combined routines are
    /// correct, only slower, on write-back memory).
    #[repr(C, align(4096))]
    struct Aligned([u64; 512]);

    struct Page {
        buf: Box<Aligned>,
        caching: Caching,
    }

    // SAFETY: the boxed page is owned, never moves while boxed, and is only reached through
    // cpu_ptr (no reference to it is handed out); being one aligned page, it is whole lines.
    unsafe impl MappedMemory for Page {
        fn cpu_ptr(&self) -> *mut u8 {
            self.buf.0.as_ptr() as *mut u8
        }
        fn size(&self) -> usize {
            4096
        }
        fn caching(&self) -> Caching {
            self.caching
        }
    }

    fn page(caching: Caching) -> Page {
        Page {
            buf: Box::new(Aligned([0x5a5a_5a5a_5a5a_5a5a; 512])),
            caching,
        }
    }

    #[test]
    fn bytes_round_trip_under_each_caching() {
        let mut rng = rand::thread_rng();
        for caching in [
            Caching::WriteBack,
            Caching::WriteCombined,
            Caching::Uncached,
        ] {
            let m = page(caching);
            for (off, len) in [
                (64, 300),
                (70, 257),
                (64, 1),
                (65, 63),
                (66, 62),
                (100, 1000),
                (101, 1001),
                (128, 3840),
                (4031, 1),
            ] {
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                if len % 2 == 0 {
                    m.write_at(off, &data).unwrap();
                } else {
                    m.write_at_unfenced(off, &data).unwrap();
                    m.publish();
                }
                let mut back = vec![0xa5u8; len];
                m.read_at(off, &mut back).unwrap();
                assert_eq!(back, data, "{caching:?} at {off}+{len}");
                // The bytes on either side are untouched.
                let mut edge = [0u8; 1];
                m.read_at(off - 1, &mut edge).unwrap();
                assert_eq!(edge[0], 0x5a, "{caching:?} byte before {off}");
                if off + len < 4096 {
                    m.read_at(off + len, &mut edge).unwrap();
                    assert_eq!(edge[0], 0x5a, "{caching:?} byte after {off}+{len}");
                }
                m.write_at(off, &vec![0x5a; len]).unwrap();
            }
        }
    }

    /// Page-aligned ordinary memory of any size, under a chosen caching kind: large enough
    /// for the parallel routines to split a copy over several threads.
    struct Block {
        ptr: *mut u8,
        layout: std::alloc::Layout,
        caching: Caching,
    }

    impl Block {
        fn new(len: usize, caching: Caching) -> Block {
            let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: the layout's size is not zero (every caller asks for pages).
            let ptr = unsafe { std::alloc::alloc(layout) };
            assert!(!ptr.is_null(), "allocation of {len} bytes");
            // SAFETY: `len` writable bytes just allocated.
            unsafe { ptr.write_bytes(0x5a, len) };
            Block {
                ptr,
                layout,
                caching,
            }
        }

        /// Every byte, read on one thread with the plain routine.
        fn contents(&self) -> Vec<u8> {
            let mut all = vec![0u8; self.size()];
            self.read_at(0, &mut all).unwrap();
            all
        }
    }

    impl Drop for Block {
        fn drop(&mut self) {
            // SAFETY: allocated in new with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr, self.layout) }
        }
    }

    // SAFETY: the allocation is owned, never moves, is a whole number of aligned pages (so
    // whole lines) and is only reached through cpu_ptr.
    unsafe impl MappedMemory for Block {
        fn cpu_ptr(&self) -> *mut u8 {
            self.ptr
        }
        fn size(&self) -> usize {
            self.layout.size()
        }
        fn caching(&self) -> Caching {
            self.caching
        }
    }

    const KINDS: [Caching; 3] = [
        Caching::WriteBack,
        Caching::WriteCombined,
        Caching::Uncached,
    ];

    #[test]
    fn parallel_copies_round_trip_at_odd_offsets_and_lengths() {
        let mut rng = rand::thread_rng();
        let size = (1 << 20) + 8192;
        for caching in KINDS {
            let m = Block::new(size, caching);
            // (offset, length, threads): split over several threads (lengths past twice
            // crate::copy::PARALLEL_MIN_PART), cut into fewer parts than asked, run alone
            // (small, or 0 and 1 threads), and reaching the mapping's last byte.
            for (off, len, threads) in [
                (3, 100_001, 4),
                (4097, (64 << 10) + 5, 2),
                (0, 1 << 20, 8),
                (1, (1 << 20) + 8191, 3),
                (65, 33, 4),
                (127, 40_000, 0),
                (4095, 40_000, 1),
                (size - 70_001, 70_001, 7),
            ] {
                let mut data = vec![0u8; len];
                rng.fill_bytes(&mut data);
                m.write_parallel(off, &data, threads).unwrap();
                let mut back = vec![0xa5u8; len];
                m.read_parallel(off, &mut back, threads).unwrap();
                assert!(back == data, "{caching:?} {off}+{len} on {threads}");
                // Written exactly the range: one thread's plain read sees the data in place
                // and the fill on both sides.
                let all = m.contents();
                assert!(
                    all[off..off + len] == data,
                    "{caching:?} {off}+{len} in place"
                );
                assert!(
                    all[..off]
                        .iter()
                        .chain(&all[off + len..])
                        .all(|&b| b == 0x5a),
                    "{caching:?} {off}+{len} on {threads}: a byte outside the range changed"
                );
                m.write_at(off, &vec![0x5a; len]).unwrap();
            }
        }
    }

    #[test]
    fn parallel_and_one_thread_copies_agree() {
        let mut rng = rand::thread_rng();
        let m = Block::new(1 << 20, Caching::WriteCombined);
        let mut data = vec![0u8; 300_007];
        rng.fill_bytes(&mut data);
        m.write_parallel(13, &data, 4).unwrap();
        let mut one = vec![0u8; data.len()];
        m.read_at(13, &mut one).unwrap();
        assert!(one == data, "a parallel write read on one thread");
        rng.fill_bytes(&mut data);
        m.write_at(29, &data).unwrap();
        let mut many = vec![0u8; data.len()];
        m.read_parallel(29, &mut many, 4).unwrap();
        assert!(many == data, "a one-thread write read in parallel");
    }

    #[test]
    fn parallel_copies_out_of_range_touch_nothing() {
        for caching in KINDS {
            let m = Block::new(256 << 10, caching);
            let size = m.size();
            for (off, len) in [(size - 40_000, 40_001), (1, size), (usize::MAX, 2)] {
                let want = AccessError::OutOfBounds {
                    offset: off,
                    len,
                    size,
                };
                let src = vec![1u8; len];
                assert_eq!(m.write_parallel(off, &src, 4), Err(want.clone()));
                let mut dst = vec![0xa5u8; len];
                assert_eq!(m.read_parallel(off, &mut dst, 4), Err(want));
                assert!(
                    dst.iter().all(|&b| b == 0xa5),
                    "{caching:?}: a refused read wrote"
                );
            }
            assert!(
                m.contents().iter().all(|&b| b == 0x5a),
                "{caching:?}: a refused write wrote"
            );
        }
    }

    #[test]
    fn out_of_range_is_refused_without_touching_memory() {
        let m = page(Caching::WriteBack);
        assert!(m.write_at_unfenced(4000, &[1u8; 97]).is_err());
        let err = m.write_at(4000, &[1u8; 97]).unwrap_err();
        assert_eq!(
            err,
            AccessError::OutOfBounds {
                offset: 4000,
                len: 97,
                size: 4096
            }
        );
        assert!(err.to_string().contains("outside a 4096-byte mapping"));
        assert!(m.read_at(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(m.load_u64(4092).is_err());
        assert!(m.store_u32(4096, 1).is_err());
        assert!(m.write_u32s(4092, &[1, 2]).is_err());
        let mut back = [0u8; 4096];
        m.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a), "a refused access wrote");
    }

    #[test]
    fn words_are_aligned_and_volatile() {
        let m = page(Caching::WriteCombined);
        m.store_u32(128, 0xdead_beef).unwrap();
        m.store_u64(136, 7 << 40).unwrap();
        m.publish();
        assert_eq!(m.load_u32(128).unwrap(), 0xdead_beef);
        assert_eq!(m.load_u64(136).unwrap(), 7 << 40);
        assert_eq!(
            m.load_u32(130).unwrap_err(),
            AccessError::Misaligned {
                offset: 130,
                width: 4
            }
        );
        assert!(matches!(
            m.store_u64(132, 0),
            Err(AccessError::Misaligned { width: 8, .. })
        ));
    }

    #[test]
    fn u32_slices_cross_chunk_boundaries() {
        let m = page(Caching::WriteBack);
        let mut rng = rand::thread_rng();
        let words: Vec<u32> = (0..300).map(|_| rng.next_u32()).collect();
        m.write_u32s(66, &words).unwrap();
        let mut back = vec![0u32; 300];
        m.read_u32s(66, &mut back).unwrap();
        assert_eq!(back, words);
        // Through the forwarding impls for Arc and references.
        fn last_word(m: impl MappedMemory) -> u32 {
            let mut one = [0u32; 1];
            m.read_u32s(66 + 299 * 4, &mut one).unwrap();
            one[0]
        }
        let arc = std::sync::Arc::new(m);
        assert_eq!(last_word(arc.clone()), words[299]);
        assert_eq!(last_word(&*arc), words[299]);
    }
}
