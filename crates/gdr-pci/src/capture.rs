//! Copying the part of a sysfs tree that `topo` reads into a small directory, so that a user can
//! attach their machine's topology to a bug report and anyone can read it back with
//! `gdr topo --sysfs DIR`.
//!
//! The capture is exactly what a read touched: the directories it listed, the attribute files
//! it read (with the bytes it got, `config` included, except that Device Serial Numbers in
//! config space are zeroed), and the symlinks it followed (written as
//! relative links, with a directory at the target when the target existed). Empty directories
//! get a [`KEEP_FILE`] so that the tree survives being committed to git.

use crate::config;
use crate::resolve::relative_target;
use crate::scan;
use crate::sysfs::{Recorded, Sysfs};
use crate::topology::{TopoError, Topology, Warning};
use std::path::{Path, PathBuf};

pub use crate::keep::{keep_empty_dirs, KEEP_FILE};

/// What a capture wrote.
#[derive(Debug, Clone)]
pub struct CaptureSummary {
    /// Directories the read listed, recreated in the capture.
    pub dirs: usize,
    /// Attribute files written, `config` files included.
    pub files: usize,
    /// Symlinks written (relative, as in sysfs).
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

/// Reads the tree under `source` (usually `/sys`) and writes what was read under `dest`, which
/// must be absent or empty.
///
/// # Examples
///
/// ```
/// use gdr_pci::capture::capture;
/// use gdr_pci::{TopoError, Topology};
/// use std::path::Path;
///
/// // A capture of a capture; `/sys` is captured the same way.
/// let source = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topo/workstation"));
/// let dest = tempfile::tempdir()?;
/// let summary = capture(source, dest.path())?;
/// assert!(summary.files > 0 && summary.links > 0);
/// // It reads back as the source did.
/// let back = Topology::read(dest.path())?;
/// assert_eq!(back.devices().len(), summary.topology.devices().len());
/// let (gpu, nic) = (back.find("gpu0")?.bdf, back.find("mlx5_0")?.bdf);
/// assert_eq!(back.path(gpu, nic)?.class, summary.topology.path(gpu, nic)?.class);
/// // A capture never writes over anything.
/// assert!(matches!(
///     capture(source, dest.path()),
///     Err(TopoError::CaptureDestinationNotEmpty(_))
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
