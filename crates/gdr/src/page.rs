//! Page sizes and the fork rule every CPU mapping of GPU memory follows. The bottom of gdr: it
//! needs nothing else of the crate, so the mapping backends, the pin layer and the registration
//! cache all take these from here instead of from one another.

/// GPU page shift: pins (gdrdrv's, and the registration cache's rounding) work in GPU pages.
pub const GPU_PAGE_SHIFT: u32 = 16;
/// GPU page size in bytes: NVIDIA GPUs map memory into BAR1 in 64 KiB pages.
pub const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;

/// The host page size (4096 when the system will not say or says something that is not a
/// power of two).
pub fn host_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// Marks a fresh CPU mapping of GPU memory MADV_DONTFORK, so a forked child does not inherit
/// it: the child's copy would outlive the parent's control of the memory (the parent may unpin
/// or free it while the child still writes). A child that touches the address faults instead.
/// Best effort: a kernel that refuses leaves the mapping as it was.
pub(crate) fn keep_from_fork(ptr: *mut u8, len: usize) {
    let page = host_page_size() as usize;
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize).saturating_add(len).next_multiple_of(page);
    // SAFETY: madvise only changes the fork behaviour of our own mapping's pages.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTFORK) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_are_powers_of_two() {
        assert!(host_page_size().is_power_of_two());
        assert!(host_page_size() >= 4096);
        assert_eq!(GPU_PAGE_SIZE, 65536);
    }
}
