//! Why an entry of a sysfs tree was not read ([`SysfsError`]): shared by the path lookup
//! ([`resolve`](crate::resolve)) and the reader ([`Sysfs`](crate::Sysfs)), below both.

use crate::limits::{MAX_LINK_HOPS, MAX_TOTAL_BYTES};
use std::io;
use std::path::{Path, PathBuf};

/// Why an entry of a sysfs tree was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysfsError {
    /// The operating system refused (no such file, permission denied, ...).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The entry is of another kind than the read needs (a FIFO where a file was expected, a
    /// file where a directory was); it was not opened.
    #[error("not a {expected} (a {found}); not opened")]
    WrongType {
        /// What the read needed: "regular file", "directory".
        expected: &'static str,
        /// What the entry is: "character device", "FIFO", ...
        found: &'static str,
    },
    /// A file holds more than the read's cap, more than sysfs ever holds there.
    #[error("longer than {cap} bytes, more than sysfs holds there; not read")]
    TooLong {
        /// The cap in bytes.
        cap: usize,
    },
    /// [`Sysfs::link`](crate::Sysfs::link) was asked about an entry that is no symlink.
    #[error("not a symlink")]
    NotALink,
    /// Following links came back to a link already followed with the same path left to walk.
    #[error("symlink loop at {}", .0.display())]
    LinkLoop(PathBuf),
    /// More than [`MAX_LINK_HOPS`] links on one lookup.
    #[error("more than {MAX_LINK_HOPS} symlinks to follow")]
    TooManyLinks,
    /// A link with an absolute target: sysfs and captures hold relative links only, and
    /// following one would leave the tree.
    #[error("absolute link to {} refused{} (sysfs and captures hold relative links only)",
            .target.display(), at(.link))]
    AbsoluteLink {
        /// The offending link where it is not the entry asked for itself.
        link: Option<PathBuf>,
        /// The link's target as written.
        target: PathBuf,
    },
    /// A `..` (in the path asked for, or in a link target) climbs above the root.
    #[error("link target {}{} leaves the sysfs root; not followed", .target.display(), at(.link))]
    LeavesRoot {
        /// The link whose target climbs out, where it is not the entry asked for itself.
        link: Option<PathBuf>,
        /// The target (or path) that climbs out.
        target: PathBuf,
    },
    /// The reader has read [`MAX_TOTAL_BYTES`] from the tree; nothing more is read.
    #[error("{MAX_TOTAL_BYTES} bytes read from the tree already; not read")]
    BudgetSpent,
}

fn at(link: &Option<PathBuf>) -> String {
    link.as_ref()
        .map(|l| format!(" at {}", l.display()))
        .unwrap_or_default()
}

impl SysfsError {
    /// Names the link at fault only where it is not `rel`, the entry the warning is about.
    pub(crate) fn blame(self, rel: &Path) -> Self {
        match self {
            SysfsError::AbsoluteLink { link, target } => SysfsError::AbsoluteLink {
                link: link.filter(|l| l != rel),
                target,
            },
            SysfsError::LeavesRoot { link, target } => SysfsError::LeavesRoot {
                link: link.filter(|l| l != rel),
                target,
            },
            e => e,
        }
    }

    /// The entry is simply absent (no such file), which is normal for optional attributes.
    pub fn is_not_found(&self) -> bool {
        matches!(self, SysfsError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}
