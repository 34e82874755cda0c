//! The store loops of the write-ceiling experiments: non-temporal stores of one width, of
//! whole or half 64-byte lines, from registers (no source read) or from a buffer (optionally
//! prefetched ahead). Each ends with `sfence`, so the stores have left the core's
//! write-combining buffers when it returns.
//!
//! They are experiment kernels, not gdr's copy routines (those are gdr-mem's `copy`): each
//! varies one thing the library's loop fixes, so that the variations can be timed beside it.

/// How wide each store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Width {
    /// `movntdq` (SSE2): four stores per line.
    B16,
    /// `vmovntdq ymm` (AVX): two stores per line.
    B32,
    /// `vmovntdq zmm` (AVX-512F): one store per line.
    B64,
}

impl Width {
    /// The width in bytes.
    pub fn bytes(self) -> usize {
        match self {
            Width::B16 => 16,
            Width::B32 => 32,
            Width::B64 => 64,
        }
    }

    /// Whether this CPU runs stores of this width.
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Width::B16 => std::arch::is_x86_feature_detected!("sse2"),
                Width::B32 => std::arch::is_x86_feature_detected!("avx"),
                Width::B64 => std::arch::is_x86_feature_detected!("avx512f"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }
}

/// The line size the stores are grouped by: the write-combining buffer's, and the largest
/// write a CPU core sends to a PCIe device in one transaction.
pub const LINE: usize = 64;

/// Fills `len` bytes at `dst` with `byte`, `width` bytes per store, whole lines or only the
/// first half of each line (`half`), then `sfence`. `len` is a multiple of [`LINE`].
///
/// # Safety
/// `dst..dst+len` is writable memory that nothing else accesses meanwhile, 64-byte aligned;
/// `width.is_available()`; `half` only with a width of at most 32.
pub unsafe fn fill(dst: *mut u8, len: usize, width: Width, half: bool, byte: u8) {
    debug_assert!(len.is_multiple_of(LINE) && (dst as usize).is_multiple_of(LINE));
    debug_assert!(!half || width != Width::B64);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, passed on; each arm runs only where its width is
    // available (the caller checked `is_available`).
    unsafe {
        match width {
            Width::B16 => x86::fill16(dst, len, half, byte),
            Width::B32 => x86::fill32(dst, len, half, byte),
            Width::B64 => x86::fill64(dst, len, byte),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, len, width, half, byte);
        unreachable!("no store kernel on this architecture");
    }
}

/// Where a software prefetch of the source puts the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Hint {
    /// `prefetcht0`: into L1 (and L2).
    T0,
    /// `prefetcht2`: into L2 only (on Intel cores T1 and T2 both mean L2).
    T2,
    /// `prefetchnta`: close to the core, marked to leave the caches first.
    Nta,
}

impl Hint {
    /// The instruction's suffix, as the case names print it.
    pub fn name(self) -> &'static str {
        match self {
            Hint::T0 => "t0",
            Hint::T2 => "t2",
            Hint::Nta => "nta",
        }
    }
}

/// How a buffer-source loop reads its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Reads {
    /// One line loaded, one line stored, in turn; a software prefetch `distance` bytes ahead
    /// (0: none) with `hint`.
    Prefetch {
        /// Bytes ahead of the line being copied.
        distance: usize,
        /// The prefetch instruction.
        hint: Hint,
    },
    /// 16 lines (1 KiB) loaded into registers, then 16 stores: the loads of a group are in
    /// flight together, and no store waits between them.
    Staged,
}

/// Copies `len` bytes from `src` to `dst` with 64-byte loads and non-temporal stores, reading
/// the source as `reads` says, then `sfence`.
///
/// # Safety
/// `dst..dst+len` is writable and `src..src+len` readable, neither accessed by anyone else
/// meanwhile; `dst` 64-byte aligned; `len` a multiple of [`LINE`] (of 1 KiB for
/// [`Reads::Staged`]); `Width::B64.is_available()`.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize, reads: Reads) {
    debug_assert!(len.is_multiple_of(LINE) && (dst as usize).is_multiple_of(LINE));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract, passed on.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_NTA, _MM_HINT_T0, _MM_HINT_T2};
        match reads {
            Reads::Prefetch {
                distance,
                hint: Hint::T0,
            } => x86::copy64::<{ _MM_HINT_T0 }>(dst, src, len, distance),
            Reads::Prefetch {
                distance,
                hint: Hint::T2,
            } => x86::copy64::<{ _MM_HINT_T2 }>(dst, src, len, distance),
            Reads::Prefetch {
                distance,
                hint: Hint::Nta,
            } => x86::copy64::<{ _MM_HINT_NTA }>(dst, src, len, distance),
            Reads::Staged => x86::copy64_staged(dst, src, len),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, src, len, reads);
        unreachable!("no store kernel on this architecture");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::LINE;
    use std::arch::x86_64::*;

    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn fill16(dst: *mut u8, len: usize, half: bool, byte: u8) {
        let v = _mm_set1_epi8(byte as i8);
        let per_line = if half { 2 } else { 4 };
        let mut off = 0;
        while off < len {
            for k in 0..per_line {
                // SAFETY: off + 16k + 16 <= off + 64 <= len, inside the caller's region, and
                // 16-byte aligned (dst is 64-byte aligned).
                unsafe { _mm_stream_si128(dst.add(off + 16 * k).cast(), v) };
            }
            off += LINE;
        }
        _mm_sfence();
    }

    #[target_feature(enable = "avx")]
    pub(super) unsafe fn fill32(dst: *mut u8, len: usize, half: bool, byte: u8) {
        let v = _mm256_set1_epi8(byte as i8);
        let per_line = if half { 1 } else { 2 };
        let mut off = 0;
        while off < len {
            for k in 0..per_line {
                // SAFETY: inside the caller's region, 32-byte aligned (as fill16).
                unsafe { _mm256_stream_si256(dst.add(off + 32 * k).cast(), v) };
            }
            off += LINE;
        }
        _mm_sfence();
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fill64(dst: *mut u8, len: usize, byte: u8) {
        let v = _mm512_set1_epi8(byte as i8);
        let mut off = 0;
        while off < len {
            // SAFETY: one whole aligned line inside the caller's region.
            unsafe { _mm512_stream_si512(dst.add(off).cast(), v) };
            off += LINE;
        }
        _mm_sfence();
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy64<const HINT: i32>(
        dst: *mut u8,
        src: *const u8,
        len: usize,
        prefetch: usize,
    ) {
        let mut off = 0;
        while off < len {
            if prefetch != 0 {
                // A prefetch never faults, so one past the source's end is harmless; the
                // address is formed with wrapping arithmetic, never dereferenced.
                _mm_prefetch::<HINT>(src.wrapping_add(off + prefetch).cast());
            }
            // SAFETY: off + 64 <= len: one line of the caller's readable source (unaligned
            // load) and of its aligned, writable destination.
            unsafe {
                let v = _mm512_loadu_si512(src.add(off).cast());
                _mm512_stream_si512(dst.add(off).cast(), v);
            }
            off += LINE;
        }
        _mm_sfence();
    }

    /// Lines per group of [`copy64_staged`]: 16 of the 32 zmm registers.
    const GROUP: usize = 16;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy64_staged(dst: *mut u8, src: *const u8, len: usize) {
        let mut off = 0;
        while off < len {
            // SAFETY: off + GROUP * 64 <= len (len is a multiple of 1 KiB): lines of the
            // caller's readable source.
            let v: [__m512i; GROUP] = std::array::from_fn(|k| unsafe {
                _mm512_loadu_si512(src.add(off + k * LINE).cast())
            });
            for (k, v) in v.into_iter().enumerate() {
                // SAFETY: the same lines of the caller's aligned, writable destination.
                unsafe { _mm512_stream_si512(dst.add(off + k * LINE).cast(), v) };
            }
            off += GROUP * LINE;
        }
        _mm_sfence();
    }
}
