//! Reading a sysfs tree rooted anywhere (the real `/sys`, a capture, a test fixture), and
//! optionally recording every entry read so that `capture` can write exactly those entries out.
//! This is the one sysfs reader of the workspace: the topology scan walks the tree with it, and
//! [`Sysfs::device`] answers what one function is and who drives it.
//!
//! All paths handed in and out are relative to the root, so a tree read from a fixture behaves as
//! the real one would. A capture is untrusted input, so every read is bounded (see
//! [`limits`](super::limits)): paths are looked up inside the tree only ([`resolve`]), only
//! regular files are opened, and never by more than a cap.

use crate::keep::KEEP_FILE;
use crate::limits::{MAX_DIR_ENTRIES, MAX_TOTAL_BYTES};
use crate::regular_file::{self, RegularFileError};
use crate::resolve::{self, kind_of, resolve_lexically, Resolved};
use crate::sysfs_error::SysfsError;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

/// One entry that a read touched, as `capture` needs to recreate it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recorded {
    Dir,
    File(Vec<u8>),
    /// A symlink: the target, resolved to a path relative to the root, and whether it existed.
    Link {
        target: PathBuf,
        target_exists: bool,
    },
}

/// A sysfs tree rooted at a directory (`/sys` by [`Default`]), read within the bounds of
/// [`limits`](crate::limits). Paths handed in and out are relative to the root.
///
/// A reader caches where directories lead and counts the bytes it read; a clone is a fresh
/// reader of the same root. It is not `Sync`: each thread reads through its own.
///
/// # Examples
///
/// ```
/// use gdr_pci::{Sysfs, SysfsError};
/// use std::path::Path;
///
/// // A captured tree (a workstation's) reads as `/sys` would.
/// let sys = Sysfs::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/topo/workstation"));
/// let gpu = Path::new("bus/pci/devices/0000:01:00.0");
/// assert_eq!(sys.read_text(&gpu.join("vendor"), 64)?, "0x10de");
/// assert_eq!(sys.list(Path::new("bus/pci/devices"))?.len(), 8);
/// // A file longer than the cap is refused, not cut.
/// assert!(matches!(sys.read(&gpu.join("vendor"), 2), Err(SysfsError::TooLong { cap: 2 })));
/// # Ok::<(), SysfsError>(())
/// ```
pub struct Sysfs {
    root: PathBuf,
    log: Option<RefCell<BTreeMap<PathBuf, Recorded>>>,
    /// Directories looked up already, to where they lead: the attributes of one device share
    /// their directory, which would otherwise be walked once per attribute.
    dirs: RefCell<HashMap<PathBuf, PathBuf>>,
    bytes_read: Cell<u64>,
    /// Entries that were read only in part, with why; the scan turns them into warnings.
    notes: RefCell<Vec<(PathBuf, String)>>,
}

impl Default for Sysfs {
    /// The live system's `/sys`.
    fn default() -> Self {
        Self::new("/sys")
    }
}

impl Clone for Sysfs {
    /// A fresh reader of the same root: nothing cached, nothing read yet, not recording.
    fn clone(&self) -> Self {
        Self::new(&self.root)
    }
}

impl fmt::Debug for Sysfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sysfs").field("root", &self.root).finish()
    }
}

impl Sysfs {
    /// A reader of the tree at `root` (`/sys` on a live system, a capture or a fixture else).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            log: None,
            dirs: RefCell::default(),
            bytes_read: Cell::new(0),
            notes: RefCell::default(),
        }
    }

    /// A reader that remembers what it read, for `capture`.
    pub(crate) fn recording(root: &Path) -> Self {
        Self {
            log: Some(RefCell::new(BTreeMap::new())),
            ..Self::new(root)
        }
    }

    /// The directory the tree is read from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn into_log(self) -> BTreeMap<PathBuf, Recorded> {
        self.log.map(RefCell::into_inner).unwrap_or_default()
    }

    /// What was read only in part so far, with why.
    pub(crate) fn take_notes(&self) -> Vec<(PathBuf, String)> {
        self.notes.take()
    }

    fn record(&self, rel: &Path, entry: Recorded) {
        if let Some(log) = &self.log {
            log.borrow_mut().insert(rel.to_path_buf(), entry);
        }
    }

    /// Where `rel` leads inside the tree (the last component's link followed too).
    fn resolve(&self, rel: &Path) -> Result<Resolved, SysfsError> {
        match (rel.parent(), rel.file_name()) {
            (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
                let dir = self.dir_of(parent)?;
                resolve::walk(&self.root, dir, Path::new(name))
            }
            _ => resolve::walk(&self.root, PathBuf::new(), rel),
        }
    }

    /// Where the directory `rel` leads inside the tree; fails when it is no directory.
    pub fn resolve_dir(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        self.dir_of(rel).map_err(|e| e.blame(rel))
    }

    fn dir_of(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        if let Some(p) = self.dirs.borrow().get(rel) {
            return Ok(p.clone());
        }
        let r = self.resolve(rel)?;
        if !r.meta.is_dir() {
            return Err(SysfsError::WrongType {
                expected: "directory",
                found: kind_of(&r.meta),
            });
        }
        self.dirs
            .borrow_mut()
            .insert(rel.to_path_buf(), r.path.clone());
        Ok(r.path)
    }

    /// The content of a regular file, at most `cap` bytes: a longer one is refused, not cut,
    /// since sysfs never holds more there. FIFOs, devices and sockets are not even opened
    /// (opening some devices does something); the open is non-blocking and does not follow a
    /// link in case the entry changed since it was looked at.
    pub fn read(&self, rel: &Path, cap: usize) -> Result<Vec<u8>, SysfsError> {
        let r = self.resolve(rel).map_err(|e| e.blame(rel))?;
        let regular = |m: &std::fs::Metadata| {
            if m.is_file() {
                Ok(())
            } else {
                Err(SysfsError::WrongType {
                    expected: "regular file",
                    found: kind_of(m),
                })
            }
        };
        regular(&r.meta)?;
        if self.bytes_read.get() >= MAX_TOTAL_BYTES {
            return Err(SysfsError::BudgetSpent);
        }
        let path = self.root.join(&r.path);
        let from = |e: RegularFileError| match e {
            RegularFileError::NotRegular { found, .. } => SysfsError::WrongType {
                expected: "regular file",
                found,
            },
            RegularFileError::TooLong { .. } => SysfsError::TooLong { cap },
            RegularFileError::Io { source, .. } => SysfsError::Io(source),
        };
        // Not following a link: the entry may have changed since it was looked at. Never
        // sized by the file's claimed length: sysfs says 4096 for every attribute, and a
        // sparse file may claim anything.
        let file = regular_file::open_with(&path, libc::O_NOFOLLOW).map_err(from)?;
        let data = regular_file::read_file(&path, file, cap as u64).map_err(from)?;
        self.bytes_read
            .set(self.bytes_read.get() + data.len() as u64);
        self.record(rel, Recorded::File(data.clone()));
        Ok(data)
    }

    /// A text attribute, trimmed of surrounding whitespace.
    pub fn read_text(&self, rel: &Path, cap: usize) -> Result<String, SysfsError> {
        let data = self.read(rel, cap)?;
        Ok(String::from_utf8_lossy(&data).trim().to_string())
    }

    /// Names in a directory, sorted; at most [`MAX_DIR_ENTRIES`] of them (a note says when
    /// there were more). The [`KEEP_FILE`] that captures and fixtures put into empty
    /// directories is left out: a real sysfs has none, and a capture must read back the same as
    /// its source.
    pub fn list(&self, rel: &Path) -> Result<Vec<String>, SysfsError> {
        let dir = self.resolve_dir(rel)?;
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.root.join(dir))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name == KEEP_FILE {
                continue;
            }
            if names.len() == MAX_DIR_ENTRIES {
                self.notes.borrow_mut().push((
                    rel.to_path_buf(),
                    format!("more than {MAX_DIR_ENTRIES} entries; read {MAX_DIR_ENTRIES} of them"),
                ));
                break;
            }
            names.push(name);
        }
        names.sort();
        self.record(rel, Recorded::Dir);
        Ok(names)
    }

    /// The target of the symlink at `rel`, as a path relative to the root (not looked up
    /// further: the target may be absent). Fails with [`SysfsError::NotALink`] when `rel` is
    /// something else, and when the target is absolute or climbs above the root.
    pub fn link(&self, rel: &Path) -> Result<PathBuf, SysfsError> {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(SysfsError::NotALink);
        };
        let dir = self.dir_of(parent).map_err(|e| e.blame(rel))?;
        let at = self.root.join(&dir).join(name);
        if !std::fs::symlink_metadata(&at)?.file_type().is_symlink() {
            return Err(SysfsError::NotALink);
        }
        let raw = std::fs::read_link(&at)?;
        if raw.is_absolute() {
            return Err(SysfsError::AbsoluteLink {
                link: None,
                target: raw,
            });
        }
        let target = resolve_lexically(&dir, &raw).ok_or(SysfsError::LeavesRoot {
            link: None,
            target: raw,
        })?;
        let target_exists = self.resolve(&target).is_ok();
        self.record(
            rel,
            Recorded::Link {
                target: target.clone(),
                target_exists,
            },
        );
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn character_devices_are_not_opened() {
        let fs = Sysfs::new("/dev");
        let err = fs.read(Path::new("zero"), 16).unwrap_err();
        assert!(
            matches!(
                err,
                SysfsError::WrongType {
                    found: "character device",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn dot_dot_after_a_link_climbs_from_where_the_link_leads() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/x"), "deep\n").unwrap();
        std::fs::write(root.join("x"), "top\n").unwrap();
        std::os::unix::fs::symlink("a/b", root.join("l")).unwrap();
        let fs = Sysfs::new(root);
        // As the kernel resolves it: `l/..` is `a`, not the root.
        assert_eq!(fs.read_text(Path::new("l/../x"), 16).unwrap(), "deep");
        assert_eq!(fs.resolve_dir(Path::new("l")).unwrap(), Path::new("a/b"));
        // Climbing out is blamed on the path asked for, or on the link that does it.
        let err = fs.read(Path::new("l/../../../x"), 16).unwrap_err();
        assert_eq!(
            err.to_string(),
            "link target l/../../.. leaves the sysfs root; not followed"
        );
        std::os::unix::fs::symlink("../../..", root.join("a/b/up")).unwrap();
        let err = fs.read(Path::new("l/up/x"), 16).unwrap_err();
        assert_eq!(
            err.to_string(),
            "link target ../../.. at a/b/up leaves the sysfs root; not followed"
        );
    }

    /// A scratch tree with a file `f` and a directory `d` holding `x`: tests must not depend
    /// on where they run from (the bundle runs them on hosts without the source tree).
    fn file_and_dir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), "some bytes\n").unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/x"), "").unwrap();
        tmp
    }

    #[test]
    fn reads_stop_when_the_budget_is_spent() {
        let tmp = file_and_dir();
        let fs = Sysfs::new(tmp.path());
        assert_eq!(fs.read(Path::new("f"), 1 << 16).unwrap(), b"some bytes\n");
        fs.bytes_read.set(MAX_TOTAL_BYTES);
        assert!(matches!(
            fs.read(Path::new("f"), 1 << 16),
            Err(SysfsError::BudgetSpent)
        ));
    }

    #[test]
    fn directories_are_not_read_as_files() {
        let tmp = file_and_dir();
        let fs = Sysfs::new(tmp.path());
        let err = fs.read(Path::new("d"), 16).unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a regular file (a directory); not opened"
        );
        assert_eq!(fs.list(Path::new("d")).unwrap(), vec!["x".to_string()]);
        assert!(matches!(
            fs.list(Path::new("f")),
            Err(SysfsError::WrongType {
                expected: "directory",
                ..
            })
        ));
    }
}
