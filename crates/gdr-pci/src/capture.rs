//! Copying the part of a sysfs tree that `topo` reads into a small directory, so that a user can
//! attach their machine's topology to a bug report and anyone can read it back with
//! `gdr topo --sysfs DIR`.
//!
//! The capture is exactly what a read touched: the directories it listed, the attribute files
//! it read (with the bytes it got, `config` included, except that Device Serial Numbers in
//! config space are zeroed), and the symlinks it followed (written as
//! relative links, with a directory at the target when the target existed). Empty directories
//! get a [`KEEP_FILE`] so that the tree survives being committed to git.

use super::resolve::relative_target;
use super::sysfs::{Recorded, Sysfs};
use super::{config, scan, TopoError, Topology, Warning};
use std::path::{Path, PathBuf};

/// What a capture wrote.
#[derive(Debug, Clone)]
pub struct CaptureSummary {
    pub dirs: usize,
    pub files: usize,
    pub links: usize,
    /// Bytes of file content written.
    pub bytes: u64,
    /// `config` files whose Device Serial Number capability was zeroed.
    pub serials_scrubbed: usize,
    /// What could not be read while capturing (the capture is partial there, like the answer).
    pub warnings: Vec<Warning>,
    /// The topology as read from the source during the capture.
    pub topology: Topology,
}

/// The file at the top of a capture that says where it came from; the reader ignores it.
pub const CAPTURE_NOTE: &str = "gdr-capture.txt";

/// An empty file put into every otherwise empty directory of a capture or fixture: git keeps no
/// empty directories, and without them links such as `class/infiniband/mlx5_0` would dangle in
/// a checkout. The reader ignores it.
pub const KEEP_FILE: &str = ".keep";

/// Puts a [`KEEP_FILE`] into every empty directory under `root` (symlinks are not followed).
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

/// Reads the tree under `source` (usually `/sys`) and writes what was read under `dest`, which
/// must be absent or empty.
pub fn capture(source: &Path, dest: &Path) -> Result<CaptureSummary, TopoError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TopoError::CaptureIo { path, source }
    };
    if dest.exists() {
        let mut entries = std::fs::read_dir(dest).map_err(io_err(dest))?;
        if entries.next().is_some() {
            return Err(TopoError::CaptureDestinationNotEmpty(dest.to_path_buf()));
        }
    }
    let fs = Sysfs::recording(source);
    let topology = scan::scan(&fs)?;
    let log = fs.into_log();

    std::fs::create_dir_all(dest).map_err(io_err(dest))?;
    let (mut dirs, mut files, mut links, mut bytes, mut scrubbed) = (0, 0, 0, 0u64, 0);
    let mut link_targets: Vec<PathBuf> = Vec::new();
    for (rel, entry) in &log {
        let at = dest.join(rel);
        let parent = at.parent().unwrap_or(dest);
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        match entry {
            Recorded::Dir => {
                std::fs::create_dir_all(&at).map_err(io_err(&at))?;
                dirs += 1;
            }
            Recorded::File(data) => {
                let mut data = data.clone();
                if rel.file_name().is_some_and(|n| n == "config") {
                    scrubbed += usize::from(config::scrub_serial_number(&mut data));
                }
                std::fs::write(&at, &data).map_err(io_err(&at))?;
                files += 1;
                bytes += data.len() as u64;
            }
            Recorded::Link {
                target,
                target_exists,
            } => {
                let text = relative_target(rel.parent().unwrap_or(Path::new("")), target);
                std::os::unix::fs::symlink(&text, &at).map_err(io_err(&at))?;
                links += 1;
                if *target_exists {
                    link_targets.push(target.clone());
                }
            }
        }
    }
    // Links that resolved on the source resolve in the capture too.
    for t in link_targets {
        let at = dest.join(&t);
        if std::fs::symlink_metadata(&at).is_err() {
            std::fs::create_dir_all(&at).map_err(io_err(&at))?;
        }
    }
    let note = format!(
        "sysfs entries read by gdr {} topo from {}\n\
         read back with: gdr topo --sysfs <this directory>\n\
         {dirs} directories, {files} files ({bytes} bytes), {links} links\n",
        env!("CARGO_PKG_VERSION"),
        source.display()
    );
    keep_empty_dirs(dest).map_err(io_err(dest))?;
    let note_path = dest.join(CAPTURE_NOTE);
    std::fs::write(&note_path, note).map_err(io_err(&note_path))?;
    Ok(CaptureSummary {
        dirs,
        files,
        links,
        bytes,
        serials_scrubbed: scrubbed,
        warnings: topology.warnings().to_vec(),
        topology,
    })
}
