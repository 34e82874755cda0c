//! Rust-only access to the library's state, for gdr's own tools: not gdrcopy's API, not
//! exported to C, hidden from the docs, and free to change with the workspace.
//!
//! Its one user is `gdr copylat` / `gdr copybw` (gdr-bench's `capi_map` module, through
//! `CapiMapping::with_allocation`): with `--capi-memory allocated` they time Rust copies into
//! the very `gdr_alloc_mapped` buffer, through the very CPU mapping, that the C calls copy to,
//! so the Rust and C rows differ only in the call. No public API reaches the buffer behind a
//! handle, hence this door.

use crate::table::{self, Kind};
use crate::GdrMh;

/// Runs `f` on the buffer behind a `gdr_alloc_mapped` handle, whose CPU mapping is the one
/// the copies of `mh` go through (for gdr's benchmarks, which time Rust copies into the very
/// allocation the C calls copy to: two allocations can differ by tens of nanoseconds per
/// small write); `None` for a handle that is not a live allocation.
///
/// The table is read-locked while `f` runs, so `f` may copy (`gdr_copy_*`, a nested read)
/// but must not call the functions that change the table (`gdr_open`, pin, map, unmap, free,
/// `gdr_close`): they would wait for `f` to return. Where membarrier(2) is missing the lock is
/// std's `RwLock`, and a copy in `f` may then also wait for another thread's table change,
/// which waits for `f`: call it where no other thread changes the table.
pub fn with_allocation<R>(mh: GdrMh, f: impl FnOnce(&gdr::bar::MappedBuffer) -> R) -> Option<R> {
    let s = table::read();
    match &s.as_ref()?.handles.get(&(mh.h as u64))?.kind {
        Kind::Alloc { buf, .. } => Some(f(buf)),
        Kind::Pin { .. } | Kind::Staged { .. } => None,
    }
}
