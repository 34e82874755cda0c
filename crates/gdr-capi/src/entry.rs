//! What every entry point shares: the guard that catches panics and refuses forked children,
//! and the write through a caller's out-pointer.

use crate::log::{log, Level};
use crate::table::forked;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an entry point: EINVAL in a forked child (see [`table`]), EIO for a panic.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> c_int) -> c_int {
    if forked() {
        log!(
            Level::Error,
            "{name}: called in a child process after fork(); the parent's gdr_t and handles \
             are not usable here"
        );
        return libc::EINVAL;
    }
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log!(Level::Error, "{name}: internal error (panic)");
        libc::EIO
    })
}

/// Writes `v` through a caller's out-pointer: 0, or EINVAL when it is null.
///
/// # Safety
/// `out` is NULL or valid for a write of a `T` (aligned, writable, not borrowed elsewhere):
/// the header's contract for every out-pointer, passed on by the entry point's caller.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-null, and writable by this function's contract.
    unsafe { out.write(v) };
    0
}
