//! The marker file that keeps empty directories of a capture or fixture alive in git. Writers
//! ([`capture`](crate::capture), [`fixture`](crate::fixture)) put it in; the reader
//! ([`Sysfs::list`](crate::Sysfs::list)) leaves it out, so a tree reads back the same as its
//! source.

use std::path::Path;

/// An empty file put into every otherwise empty directory of a capture or fixture: git keeps no
/// empty directories, and without them links such as `class/infiniband/mlx5_0` would dangle in
/// a checkout. The reader ignores it.
pub const KEEP_FILE: &str = ".keep";

/// Puts a [`KEEP_FILE`] into every empty directory under `root` (symlinks are not followed).
/// Returns how many it wrote.
///
/// # Errors
/// The first I/O error met while listing a directory or writing a marker.
pub fn keep_empty_dirs(root: &Path) -> std::io::Result<usize> {
    let mut added = 0;
    let mut empty = true;
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        empty = false;
        if entry.file_type()?.is_dir() {
            added += keep_empty_dirs(&entry.path())?;
        }
    }
    if empty {
        std::fs::write(root.join(KEEP_FILE), "")?;
        added += 1;
    }
    Ok(added)
}
