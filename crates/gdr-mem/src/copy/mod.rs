//! Copy routines for CPU mappings of GPU memory (BAR1, mapped write-combined).
//!
//! Such memory punishes ordinary `memcpy`: stores reach the GPU fast only as whole 64-byte
//! write-combining bursts, and loads are uncached PCIe reads, each a full round trip to the GPU
//! (docs/perf.md, "CPU <-> GPU copies"). The routines here therefore
//! - write with aligned non-temporal stores of whole lines, the ragged ends with exact naturally
//!   aligned stores, and end with `sfence` so the data is globally visible on return;
//! - read with streaming loads (`movntdqa`) of whole aligned chunks, several lines in flight,
//!   copying out only the wanted bytes, with `lfence` on both sides.
//!
//! The kernel is picked at run time from the CPU's features ([`Isa`]), once per process; the
//! `_with` variants take an explicit ISA for tests and benchmarks. [`parallel`] splits large
//! copies over a small persistent worker pool. On other architectures only [`Isa::Portable`]
//! exists (volatile word accesses and a full fence).
//!
//! The routines are raw (`unsafe`, pointer on the mapping side); the safe, bounds-checked access
//! is [`crate::MappedMemory`], whose write-combined implementors go through them.
//!
//! # The mapping-side contract
//! - Writes touch exactly [dst, dst+len): never a byte outside, not even rewritten with its own
//!   value, so neighbouring flags and messages are safe.
//! - Reads may touch any byte of the aligned 64-byte lines that overlap [src, src+len) (and
//!   nothing else): reading a whole line costs no more than reading one byte of it. Mappings are
//!   page-granular, so those lines are always readable when the range itself is mapped.

mod edges;
mod isa;
pub mod parallel;
mod portable;
#[cfg(target_arch = "x86_64")]
mod stream;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

pub use isa::{Isa, ISA_ENV};
pub use parallel::{
    copy_from_mapping_parallel, copy_from_mapping_parallel_with, copy_to_mapping_parallel,
    copy_to_mapping_parallel_with, part_count, PARALLEL_MAX_THREADS, PARALLEL_MIN_PART,
};

/// Errors of the copy routines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// An explicit ISA was asked for that this CPU does not have.
    #[error("this CPU does not support the {0} copy routines")]
    Unsupported(Isa),
    /// A name that is no ISA (from [`ISA_ENV`] or a command line).
    #[error("unknown instruction set {0:?} (expected portable, sse2, sse4.1, avx2 or avx512)")]
    UnknownIsa(String),
}

/// A copy kernel: `(dst, src, len)`; which side is the mapping depends on the direction.
pub(crate) type Kernel = unsafe fn(*mut u8, *const u8, usize);

/// The store kernel of an ISA, without checking that the CPU has it.
fn store_kernel(isa: Isa) -> Kernel {
    store_kernel_fenced::<true>(isa)
}

/// The store kernel of an ISA, ending with a store fence or (`FENCE = false`) not.
fn store_kernel_fenced<const FENCE: bool>(isa: Isa) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            Isa::Portable => portable::store::<FENCE>,
            Isa::Sse2 | Isa::Sse41 => stream::store_sse2::<FENCE>,
            Isa::Avx2 => stream::store_avx2::<FENCE>,
            Isa::Avx512 => stream::store_avx512::<FENCE>,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        portable::store::<FENCE>
    }
}

/// The load kernel of an ISA, without checking that the CPU has it.
fn load_kernel(isa: Isa) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            Isa::Portable => portable::load,
            Isa::Sse2 => stream::load_sse2,
            Isa::Sse41 => stream::load_sse41,
            Isa::Avx2 => stream::load_avx2,
            Isa::Avx512 => stream::load_avx512,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        portable::load
    }
}

/// The kernel the plain [`copy_to_mapping`] uses for 64 bytes and more, chosen once.
fn default_store() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| store_kernel(Isa::detected_store()))
}

/// The kernel [`copy_to_mapping_unfenced`] uses for 64 bytes and more, chosen once.
fn default_store_unfenced() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| store_kernel_fenced::<false>(Isa::detected_store()))
}

/// The kernel the plain [`copy_from_mapping`] uses, chosen once.
fn default_load() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| load_kernel(Isa::detected_load()))
}

/// Copies `src` into a CPU mapping of device memory at `dst`, with the best stores this CPU has,
/// and makes the data globally visible (`sfence`) before returning.
///
/// Fewer than 64 bytes take a dispatch-free path of naturally aligned stores (an aligned 8-byte
/// copy is one 8-byte store and `sfence`); larger copies stream whole 64-byte lines.
///
/// # Examples
///
/// ```
/// use gdr_mem::copy::copy_to_mapping;
///
/// #[repr(align(64))]
/// struct Lines([u8; 512]);
/// let mut mapping = Lines([0xee; 512]);
/// let src: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
/// // SAFETY: [5, 305) of `mapping` is writable and apart from `src`.
/// unsafe { copy_to_mapping(mapping.0.as_mut_ptr().add(5), &src) };
/// assert_eq!(mapping.0[5..305], src[..]);
/// // The bytes around the range are untouched.
/// assert!(mapping.0[..5].iter().chain(&mapping.0[305..]).all(|&b| b == 0xee));
/// ```
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes (any alignment; nothing outside
/// [dst, dst+len) is written) and must not overlap `src`. Other CPU threads writing the same bytes
/// concurrently get no ordering between their writes and ours.
pub unsafe fn copy_to_mapping(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { store_to_mapping::<true>(dst, src) }
}

/// [`copy_to_mapping`] with (`FENCE`) or without the closing store fence.
///
/// # Safety
/// As [`copy_to_mapping`].
#[inline(always)]
unsafe fn store_to_mapping<const FENCE: bool>(dst: *mut u8, src: &[u8]) {
    let len = src.len();
    #[cfg(target_arch = "x86_64")]
    if len < 64 {
        // SAFETY: the caller's contract; `len < 64` as `store_small` requires.
        unsafe { stream::store_small::<FENCE>(dst, src.as_ptr(), len) };
        return;
    }
    let kernel = if FENCE {
        default_store()
    } else {
        default_store_unfenced()
    };
    // SAFETY: the caller's contract; the default kernel is one the CPU has.
    unsafe { kernel(dst, src.as_ptr(), len) }
}

/// [`copy_to_mapping`] without the closing `sfence`: the stores may wait in the CPU's
/// write-combining buffers, unordered against later stores, until the caller's next
/// [`store_fence`]. For a writer that stages several pieces (a ring's slots) and publishes them
/// with one fence before its doorbell; a fence per piece drains the write-combining buffers
/// each time and costs a ring most of its message rate (docs/mq.md).
///
/// # Safety
/// As [`copy_to_mapping`]; and nothing may rely on the bytes being visible before the caller's
/// next store fence.
pub unsafe fn copy_to_mapping_unfenced(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { store_to_mapping::<false>(dst, src) }
}

/// Copies from a CPU mapping of device memory at `src` into `dst`, with the best streaming loads
/// this CPU has. Ordered with `lfence` against loads before and after it.
///
/// # Safety
/// Every aligned 64-byte line that overlaps [src, src+dst.len()) must be readable (true whenever
/// the range is inside a page-granular mapping); the range must not overlap `dst`. With an empty
/// `dst` nothing is read.
pub unsafe fn copy_from_mapping(dst: &mut [u8], src: *const u8) {
    // SAFETY: the caller's contract; the default kernel is one the CPU has.
    unsafe { default_load()(dst.as_mut_ptr(), src, dst.len()) }
}

/// [`copy_to_mapping`] with an explicit ISA.
///
/// # Errors
/// [`CopyError::Unsupported`] when this CPU lacks `isa`; nothing is written then.
///
/// # Safety
/// As [`copy_to_mapping`].
pub unsafe fn copy_to_mapping_with(isa: Isa, dst: *mut u8, src: &[u8]) -> Result<(), CopyError> {
    let kernel = store_kernel(isa.require()?);
    // SAFETY: the caller's contract; `require` checked that the CPU runs this kernel.
    unsafe { kernel(dst, src.as_ptr(), src.len()) };
    Ok(())
}

/// [`copy_from_mapping`] with an explicit ISA.
///
/// # Errors
/// [`CopyError::Unsupported`] when this CPU lacks `isa`; nothing is read then.
///
/// # Safety
/// As [`copy_from_mapping`].
pub unsafe fn copy_from_mapping_with(
    isa: Isa,
    dst: &mut [u8],
    src: *const u8,
) -> Result<(), CopyError> {
    let kernel = load_kernel(isa.require()?);
    // SAFETY: the caller's contract; `require` checked that the CPU runs this kernel.
    unsafe { kernel(dst.as_mut_ptr(), src, dst.len()) };
    Ok(())
}

/// Makes all earlier stores, including write-combined and non-temporal ones, globally visible
/// before any later store (`sfence`; a full fence elsewhere). The copy routines already end with
/// one; this is for callers that wrote to a mapping by other means.
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no memory-safety preconditions (SSE is baseline on x86-64).
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
