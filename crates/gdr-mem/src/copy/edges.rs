//! Exact, naturally aligned stores for the unaligned head and the short tail of a copy into a
//! mapping, and an exact small copy into ordinary memory.
//!
//! Why natural alignment: a store that is aligned to its own size never straddles a 64-byte
//! write-combining line or a PCIe dword boundary in a way that splits it, so an aligned 8-byte
//! store of a flag reaches the GPU as one piece. Why exactness: bytes next to the copied range
//! may belong to someone else (another flag, another message); we never rewrite them, not even
//! with the value they already hold.
//!
//! The head walks pieces of 1, 2, 4, 8, 16 and 32 bytes upwards, taking piece `k` when the
//! destination address has bit `k` set and at least `k` bytes remain. It ends in one of two
//! states:
//! - every piece was taken as needed: the destination is 64-byte aligned; or
//! - some piece `j` was needed but fewer than `j` bytes remain: the destination is aligned to `j`
//!   (all lower bits were cleared by earlier pieces) and the length is below `j`; every later
//!   piece is skipped, as it is even larger.
//!
//! Either way the destination is aligned to some power of two `A` and fewer than `A` bytes remain
//! (or any number remain, 64-aligned, for the bulk loop). The tail then stores the set bits of the
//! remaining length from the largest down: the piece of size `p` lands at the start plus a sum of
//! larger powers of two (multiples of `2p`), so it is aligned to `p` as well.

use core::ptr;

/// One naturally aligned store of `size_of::<T>()` bytes read from anywhere.
///
/// # Safety
/// `dst` is valid for a write of `T` and aligned to `align_of::<T>()`; `src` is valid for a read of
/// `size_of::<T>()` bytes (any alignment).
#[inline(always)]
unsafe fn put<T: Copy>(dst: *mut u8, src: *const u8) {
    // SAFETY: the caller guarantees both ranges; volatile keeps the compiler from splitting,
    // merging or widening the store, which matters on device memory.
    unsafe { ptr::write_volatile(dst.cast::<T>(), ptr::read_unaligned(src.cast::<T>())) }
}

/// A 16-byte aligned store: one SSE2 store on x86-64 (baseline there), two 8-byte stores elsewhere.
///
/// # Safety
/// As [`put`], with `dst` 16-byte aligned.
#[inline(always)]
unsafe fn put16(dst: *mut u8, src: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller; `__m128i` is 16 bytes with 16-byte alignment.
    unsafe {
        put::<core::arch::x86_64::__m128i>(dst, src)
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller; 16-byte alignment implies 8-byte alignment of both halves.
    unsafe {
        put::<u64>(dst, src);
        put::<u64>(dst.add(8), src.add(8));
    }
}

/// Stores the head of a copy: afterwards `dst` is 64-byte aligned, or the remaining length is
/// smaller than the next alignment step (see the module notes). Returns the advanced pointers and
/// the remaining length.
///
/// # Safety
/// `dst` is valid for writes of `len` bytes, `src` for reads of `len` bytes.
#[inline(always)]
pub(super) unsafe fn store_head(
    mut dst: *mut u8,
    mut src: *const u8,
    mut len: usize,
) -> (*mut u8, *const u8, usize) {
    macro_rules! piece {
        ($k:expr, $store:expr) => {
            if len >= $k && (dst as usize) & $k != 0 {
                $store;
                dst = dst.wrapping_add($k);
                src = src.wrapping_add($k);
                len -= $k;
            }
        };
    }
    // SAFETY: (all pieces) each piece lies inside the caller's ranges (`len >= k`) and `dst` is
    // aligned to `k` because every smaller set bit was cleared by an earlier piece.
    unsafe {
        piece!(1, put::<u8>(dst, src));
        piece!(2, put::<u16>(dst, src));
        piece!(4, put::<u32>(dst, src));
        piece!(8, put::<u64>(dst, src));
        piece!(16, put16(dst, src));
        piece!(32, {
            put16(dst, src);
            put16(dst.add(16), src.add(16));
        });
    }
    (dst, src, len)
}

/// Stores the tail of a copy: `len < 64`, and `dst` is aligned to a power of two larger than
/// `len` (the state [`store_head`] or the 64-byte bulk loop leaves).
///
/// # Safety
/// `dst` is valid for writes of `len` bytes, `src` for reads of `len` bytes, and the alignment
/// state above holds.
#[inline(always)]
pub(super) unsafe fn store_tail(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len < 64);
    let mut at = 0;
    // SAFETY: (all pieces) the pieces are the set bits of `len`, so they tile [0, len) exactly;
    // each is aligned to its size by the module's argument.
    unsafe {
        if len & 32 != 0 {
            put16(dst, src);
            put16(dst.add(16), src.add(16));
            at = 32;
        }
        if len & 16 != 0 {
            put16(dst.add(at), src.add(at));
            at += 16;
        }
        if len & 8 != 0 {
            put::<u64>(dst.add(at), src.add(at));
            at += 8;
        }
        if len & 4 != 0 {
            put::<u32>(dst.add(at), src.add(at));
            at += 4;
        }
        if len & 2 != 0 {
            put::<u16>(dst.add(at), src.add(at));
            at += 2;
        }
        if len & 1 != 0 {
            put::<u8>(dst.add(at), src.add(at));
        }
    }
}

/// Copies `len < 64` bytes between ordinary memory exactly, in fixed-size pieces (no call into
/// `memcpy` for a handful of bytes).
///
/// # Safety
/// `dst` valid for writes of `len` bytes, `src` for reads of `len` bytes, not overlapping.
#[inline(always)]
pub(super) unsafe fn copy_small(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len < 64);
    let mut at = 0;
    macro_rules! piece {
        ($k:expr) => {
            if len & $k != 0 {
                // SAFETY: the pieces are the set bits of `len`, tiling [0, len) exactly.
                unsafe { ptr::copy_nonoverlapping(src.add(at), dst.add(at), $k) };
                at += $k;
            }
        };
    }
    piece!(32);
    piece!(16);
    piece!(8);
    piece!(4);
    piece!(2);
    piece!(1);
    let _ = at;
}
