//! Copy kernels for any architecture: volatile, naturally aligned word accesses and a full fence.
//!
//! They keep the same contracts as the streaming kernels (exact stores, reads only of the aligned
//! words inside the lines that overlap the range), so callers need not care which one runs; they
//! are just slower on write-combined memory, since nothing forces whole-line bursts and each word
//! read is its own uncached round trip. On x86-64 they also serve as the baseline in benchmarks.

use core::cmp::min;
use core::ptr;
use core::sync::atomic::{fence, Ordering};

use super::edges::{copy_small, store_head, store_tail};

/// Copies `len` bytes into a mapping with aligned volatile stores, then a full fence when
/// `FENCE`.
///
/// # Safety
/// `dst` valid for writes of `len` bytes, `src` for reads of `len` bytes, not overlapping.
pub(super) unsafe fn store<const FENCE: bool>(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the head and tail are exact; the bulk loop runs only while a whole 64-byte line
    // remains, and `n >= 64` after the head means `d` is 64-byte (so 8-byte) aligned.
    unsafe {
        let (mut d, mut s, mut n) = store_head(dst, src, len);
        while n >= 64 {
            for i in 0..8 {
                let word = ptr::read_unaligned(s.add(8 * i).cast::<u64>());
                ptr::write_volatile(d.add(8 * i).cast::<u64>(), word);
            }
            d = d.add(64);
            s = s.add(64);
            n -= 64;
        }
        store_tail(d, s, n);
    }
    if FENCE {
        fence(Ordering::SeqCst);
    }
}

/// Copies `len` bytes out of a mapping with aligned volatile 8-byte loads, fenced on both sides.
///
/// # Safety
/// `dst` valid for writes of `len` bytes; the aligned 64-byte lines overlapping [src, src+len)
/// are readable; no overlap.
pub(super) unsafe fn load(dst: *mut u8, src: *const u8, len: usize) {
    const W: usize = 8;
    if len == 0 {
        return;
    }
    fence(Ordering::SeqCst);
    // SAFETY: each load is an aligned word overlapping [src, src+len), inside the readable lines;
    // each store to `dst` stays inside [dst, dst+len).
    unsafe {
        let off = (src as usize) & (W - 1);
        let mut s = src.sub(off).cast::<u64>();
        let mut d = dst;
        let mut n = len;
        if off != 0 || n < W {
            let word = ptr::read_volatile(s).to_ne_bytes();
            let take = min(W - off, n);
            copy_small(d, word.as_ptr().add(off), take);
            d = d.add(take);
            s = s.add(1);
            n -= take;
        }
        while n >= W {
            ptr::write_unaligned(d.cast::<u64>(), ptr::read_volatile(s));
            d = d.add(W);
            s = s.add(1);
            n -= W;
        }
        if n > 0 {
            let word = ptr::read_volatile(s).to_ne_bytes();
            copy_small(d, word.as_ptr(), n);
        }
    }
    fence(Ordering::SeqCst);
}
