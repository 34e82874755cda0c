//! Placeholder until the stream-store/stream-load routines land (branch `copy`).

/// # Safety
/// `dst` must be valid for `src.len()` byte writes.
pub unsafe fn copy_to_mapping(dst: *mut u8, src: &[u8]) {
    // SAFETY: per the contract above.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// # Safety
/// `src` must be valid for `dst.len()` byte reads.
pub unsafe fn copy_from_mapping(dst: &mut [u8], src: *const u8) {
    // SAFETY: per the contract above.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
}

/// # Safety
/// As [`copy_to_mapping`].
pub unsafe fn copy_to_mapping_parallel(dst: *mut u8, src: &[u8], _threads: usize) {
    // SAFETY: per the contract above.
    unsafe { copy_to_mapping(dst, src) }
}

/// # Safety
/// As [`copy_from_mapping`].
pub unsafe fn copy_from_mapping_parallel(dst: &mut [u8], src: *const u8, _threads: usize) {
    // SAFETY: per the contract above.
    unsafe { copy_from_mapping(dst, src) }
}
pub mod auto;

/// Orders earlier stores (streaming or write-combined) before later ones.
#[inline]
pub fn store_fence() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
