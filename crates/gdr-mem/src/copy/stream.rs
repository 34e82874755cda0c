//! x86-64 copy kernels: streaming (non-temporal) stores into a write-combined mapping, and
//! streaming loads out of one.
//!
//! Stores: the CPU sends a write-combining buffer to PCIe as one burst only when all 64 bytes of
//! the line were written; a partly written buffer leaves as several small writes. So the bulk is
//! written in whole, 64-byte aligned lines with non-temporal stores (from unaligned source loads),
//! the ragged ends with exact aligned stores ([`super::edges`]), and every kernel ends with
//! `sfence`, which drains the buffers: when it returns, the data is globally visible.
//!
//! Loads: a plain load from WC memory is an uncached PCIe read of just its own bytes, a full
//! round trip to the GPU each, one after another. `MOVNTDQA` instead fetches the whole 64-byte
//! line into a streaming-load buffer, and several such loads can be in flight. So every read of
//! the mapping is a streaming load of a whole aligned chunk (16, 32 or 64 bytes by ISA); the
//! ragged ends load the aligned chunk that holds them and copy out only the wanted bytes; the
//! bulk issues 256 bytes of loads per iteration before storing them. Kernels begin and end with
//! `lfence` because streaming loads are weakly ordered: without it a read here could pass an
//! earlier load (say, of a ready flag) or be passed by a later one.
//!
//! Each kernel is an `unsafe fn(dst, src, len)` compiled for its ISA with `#[target_feature]`;
//! [`super`] checks that the CPU has the feature before handing one out.

use core::arch::x86_64::*;
use core::cmp::min;
use core::ptr;

use super::edges::{copy_small, store_head, store_tail};

/// Copies fewer than 64 bytes into a mapping with baseline x86-64 stores (no dispatch needed),
/// then `sfence` when `FENCE`.
///
/// # Safety
/// `dst` valid for writes of `len` bytes, `src` for reads of `len` bytes; `len < 64`.
#[inline(always)]
pub(super) unsafe fn store_small<const FENCE: bool>(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(len < 64);
    // SAFETY: forwarded from the caller; with `len < 64` the head leaves `len < 64` and the
    // alignment state `store_tail` needs.
    unsafe {
        let (d, s, n) = store_head(dst, src, len);
        store_tail(d, s, n);
    }
    if FENCE {
        // SAFETY: `sfence` has no memory-safety preconditions; SSE is baseline on x86-64.
        unsafe { _mm_sfence() };
    }
}

/// Generates a store kernel around a one-line (64-byte) streaming store.
macro_rules! store_kernel {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $line:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the named feature; `dst` is valid for writes of `len` bytes and `src` for
        /// reads of `len` bytes, not overlapping.
        /// `FENCE`: end with `sfence` (the unfenced form leaves that to the caller).
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name<const FENCE: bool>(dst: *mut u8, src: *const u8, len: usize) {
            // SAFETY: every store below lies in [dst, dst+len) and every load in
            // [src, src+len): the head and tail are exact, and the bulk loops only run while a
            // whole line remains. `n >= 64` after the head implies the head completed, so `d`
            // is 64-byte aligned as the streaming stores require.
            unsafe {
                let (mut d, mut s, mut n) = store_head(dst, src, len);
                while n >= 256 {
                    $line(d, s);
                    $line(d.add(64), s.add(64));
                    $line(d.add(128), s.add(128));
                    $line(d.add(192), s.add(192));
                    d = d.add(256);
                    s = s.add(256);
                    n -= 256;
                }
                while n >= 64 {
                    $line(d, s);
                    d = d.add(64);
                    s = s.add(64);
                    n -= 64;
                }
                store_tail(d, s, n);
            }
            if FENCE {
                _mm_sfence();
            }
        }
    };
}

/// One 64-byte line: four 16-byte non-temporal stores.
///
/// # Safety
/// `d` 64-byte aligned and valid for 64 bytes of writes, `s` valid for 64 bytes of reads.
#[target_feature(enable = "sse2")]
#[inline]
unsafe fn line_sse2(d: *mut u8, s: *const u8) {
    // SAFETY: as the function's contract.
    unsafe {
        let a = _mm_loadu_si128(s.cast());
        let b = _mm_loadu_si128(s.add(16).cast());
        let c = _mm_loadu_si128(s.add(32).cast());
        let e = _mm_loadu_si128(s.add(48).cast());
        _mm_stream_si128(d.cast(), a);
        _mm_stream_si128(d.add(16).cast(), b);
        _mm_stream_si128(d.add(32).cast(), c);
        _mm_stream_si128(d.add(48).cast(), e);
    }
}

/// One 64-byte line: two 32-byte non-temporal stores.
///
/// # Safety
/// As [`line_sse2`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn line_avx2(d: *mut u8, s: *const u8) {
    // SAFETY: as the function's contract.
    unsafe {
        let a = _mm256_loadu_si256(s.cast());
        let b = _mm256_loadu_si256(s.add(32).cast());
        _mm256_stream_si256(d.cast(), a);
        _mm256_stream_si256(d.add(32).cast(), b);
    }
}

/// One 64-byte line: one 64-byte non-temporal store.
///
/// # Safety
/// As [`line_sse2`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn line_avx512(d: *mut u8, s: *const u8) {
    // SAFETY: as the function's contract.
    unsafe { _mm512_stream_si512(d.cast(), _mm512_loadu_si512(s.cast())) }
}

store_kernel!(
    /// Copies into a mapping with SSE2 non-temporal stores (`movntdq`).
    store_sse2,
    "sse2",
    line_sse2
);
store_kernel!(
    /// Copies into a mapping with AVX 32-byte non-temporal stores (`vmovntdq ymm`).
    store_avx2,
    "avx2",
    line_avx2
);
store_kernel!(
    /// Copies into a mapping with AVX-512 64-byte non-temporal stores (`vmovntdq zmm`), one
    /// instruction per write-combining line.
    store_avx512,
    "avx512f",
    line_avx512
);

/// Generates a load kernel around an aligned chunk load of `$w` bytes returning `$vec`.
macro_rules! load_kernel {
    (
        $(#[$doc:meta])* $name:ident, $feature:literal, $w:literal, $vec:ty,
        load = $load:ident, store = $store:ident, zero = $zero:ident
    ) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the named feature; `dst` is valid for writes of `len` bytes; every
        /// aligned 64-byte line that overlaps [src, src+len) is readable; no overlap.
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name(dst: *mut u8, src: *const u8, len: usize) {
            const W: usize = $w;
            const K: usize = 256 / W;
            if len == 0 {
                return;
            }
            _mm_lfence();
            // SAFETY: every load is of a W-aligned chunk overlapping [src, src+len), hence
            // inside the readable lines the caller promised (W divides 64); every store to
            // `dst` stays inside [dst, dst+len) because the counts below never exceed `n`.
            unsafe {
                let off = (src as usize) & (W - 1);
                let mut s = src.sub(off);
                let mut d = dst;
                let mut n = len;
                let mut chunk = [0u8; W];
                if off != 0 || n < W {
                    $store(chunk.as_mut_ptr(), $load(s));
                    let take = min(W - off, n);
                    copy_small(d, chunk.as_ptr().add(off), take);
                    d = d.add(take);
                    s = s.add(W);
                    n -= take;
                }
                while n >= 256 {
                    let mut v: [$vec; K] = [$zero(); K];
                    for (i, slot) in v.iter_mut().enumerate() {
                        *slot = $load(s.add(i * W));
                    }
                    for (i, x) in v.iter().enumerate() {
                        $store(d.add(i * W), *x);
                    }
                    d = d.add(256);
                    s = s.add(256);
                    n -= 256;
                }
                while n >= W {
                    $store(d, $load(s));
                    d = d.add(W);
                    s = s.add(W);
                    n -= W;
                }
                if n > 0 {
                    $store(chunk.as_mut_ptr(), $load(s));
                    copy_small(d, chunk.as_ptr(), n);
                }
            }
            _mm_lfence();
        }
    };
}

/// A plain aligned 16-byte load (the baseline the streaming loads are measured against).
///
/// # Safety
/// `p` is 16-byte aligned and readable for 16 bytes.
#[target_feature(enable = "sse2")]
#[inline]
unsafe fn load_plain16(p: *const u8) -> __m128i {
    // SAFETY: as the function's contract; volatile so each load happens exactly once.
    unsafe { ptr::read_volatile(p.cast::<__m128i>()) }
}

/// A 16-byte streaming load (`movntdqa`).
///
/// # Safety
/// As [`load_plain16`].
#[target_feature(enable = "sse4.1")]
#[inline]
unsafe fn load_stream16(p: *const u8) -> __m128i {
    // SAFETY: as the function's contract.
    unsafe { _mm_stream_load_si128(p.cast()) }
}

/// A 32-byte streaming load (`vmovntdqa ymm`).
///
/// # Safety
/// `p` is 32-byte aligned and readable for 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_stream32(p: *const u8) -> __m256i {
    // SAFETY: as the function's contract.
    unsafe { _mm256_stream_load_si256(p.cast()) }
}

/// A 64-byte streaming load (`vmovntdqa zmm`).
///
/// # Safety
/// `p` is 64-byte aligned and readable for 64 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_stream64(p: *const u8) -> __m512i {
    // SAFETY: as the function's contract.
    unsafe { _mm512_stream_load_si512(p.cast()) }
}

/// Unaligned 16-byte store into ordinary memory.
///
/// # Safety
/// `p` writable for 16 bytes.
#[target_feature(enable = "sse2")]
#[inline]
unsafe fn store16(p: *mut u8, v: __m128i) {
    // SAFETY: as the function's contract.
    unsafe { _mm_storeu_si128(p.cast(), v) }
}

/// Unaligned 32-byte store into ordinary memory.
///
/// # Safety
/// `p` writable for 32 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store32(p: *mut u8, v: __m256i) {
    // SAFETY: as the function's contract.
    unsafe { _mm256_storeu_si256(p.cast(), v) }
}

/// Unaligned 64-byte store into ordinary memory.
///
/// # Safety
/// `p` writable for 64 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store64(p: *mut u8, v: __m512i) {
    // SAFETY: as the function's contract.
    unsafe { _mm512_storeu_si512(p.cast(), v) }
}

load_kernel!(
    /// Copies out of a mapping with plain aligned 16-byte loads: each is its own uncached read.
    /// Kept as the baseline that shows what streaming loads buy.
    load_sse2,
    "sse2",
    16,
    __m128i,
    load = load_plain16,
    store = store16,
    zero = _mm_setzero_si128
);
load_kernel!(
    /// Copies out of a mapping with SSE4.1 16-byte streaming loads.
    load_sse41,
    "sse4.1",
    16,
    __m128i,
    load = load_stream16,
    store = store16,
    zero = _mm_setzero_si128
);
load_kernel!(
    /// Copies out of a mapping with AVX2 32-byte streaming loads.
    load_avx2,
    "avx2",
    32,
    __m256i,
    load = load_stream32,
    store = store32,
    zero = _mm256_setzero_si256
);
load_kernel!(
    /// Copies out of a mapping with AVX-512 64-byte streaming loads, one per line.
    load_avx512,
    "avx512f",
    64,
    __m512i,
    load = load_stream64,
    store = store64,
    zero = _mm512_setzero_si512
);
