//! Reading a sysfs tree rooted anywhere (the real `/sys`, a capture, a test fixture), and
//! optionally recording every entry read so that `capture` can write exactly those entries out.
//!
//! All paths handed in and out are relative to the root, so a tree read from a fixture behaves as
//! the real one would. Symlinks are resolved lexically (without following them on disk) because
//! sysfs links are relative and a captured tree may hold only part of what they point into.

use super::capture::KEEP_FILE;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};

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

pub(crate) struct Sysfs {
    root: PathBuf,
    log: Option<RefCell<BTreeMap<PathBuf, Recorded>>>,
}

impl Sysfs {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            log: None,
        }
    }

    /// A reader that remembers what it read, for `capture`.
    pub(crate) fn recording(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            log: Some(RefCell::new(BTreeMap::new())),
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn into_log(self) -> BTreeMap<PathBuf, Recorded> {
        self.log.map(RefCell::into_inner).unwrap_or_default()
    }

    fn record(&self, rel: &Path, entry: Recorded) {
        if let Some(log) = &self.log {
            log.borrow_mut().insert(rel.to_path_buf(), entry);
        }
    }

    /// The whole content of a file (sysfs attributes are small; `config` is at most 4 KiB).
    pub(crate) fn read(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let data = std::fs::read(self.root.join(rel))?;
        self.record(rel, Recorded::File(data.clone()));
        Ok(data)
    }

    /// A text attribute, trimmed of surrounding whitespace.
    pub(crate) fn read_text(&self, rel: &Path) -> io::Result<String> {
        let data = self.read(rel)?;
        Ok(String::from_utf8_lossy(&data).trim().to_string())
    }

    /// Names in a directory, sorted. The [`KEEP_FILE`] that captures and fixtures put into
    /// empty directories is left out: a real sysfs has none, and a capture must read back the
    /// same as its source.
    pub(crate) fn list(&self, rel: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.root.join(rel))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name != KEEP_FILE {
                names.push(name);
            }
        }
        names.sort();
        self.record(rel, Recorded::Dir);
        Ok(names)
    }

    /// Resolves the symlink at `rel` to a path relative to the root. Fails with `InvalidData`
    /// when the link points outside the root, and with the OS error when `rel` is no link.
    pub(crate) fn link(&self, rel: &Path) -> io::Result<PathBuf> {
        let raw = std::fs::read_link(self.root.join(rel))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let target = resolve_lexically(parent, &raw).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("link target {} leaves the sysfs root", raw.display()),
            )
        })?;
        let target_exists = self.exists(&target);
        self.record(
            rel,
            Recorded::Link {
                target: target.clone(),
                target_exists,
            },
        );
        Ok(target)
    }

    /// Whether `rel` exists (following symlinks).
    pub(crate) fn exists(&self, rel: &Path) -> bool {
        self.root.join(rel).exists()
    }
}

/// Joins a link target to the directory holding the link and folds `.`/`..` without touching the
/// disk. Absolute targets are taken relative to the sysfs root (`/sys/devices/..` → `devices/..`).
/// `None` when the result would climb above the root.
pub(crate) fn resolve_lexically(link_dir: &Path, target: &Path) -> Option<PathBuf> {
    let mut out: Vec<std::ffi::OsString> = Vec::new();
    let rest = if target.is_absolute() {
        target
            .strip_prefix("/sys")
            .or_else(|_| target.strip_prefix("/"))
            .ok()?
    } else {
        for c in link_dir.components() {
            if let Component::Normal(n) = c {
                out.push(n.to_os_string());
            }
        }
        target
    };
    for c in rest.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::ParentDir => {
                out.pop()?;
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(out.iter().collect())
}

/// The relative link text that leads from directory `from_dir` to `to` (both relative to the
/// same root): `../..` up to the common part, then down.
pub(crate) fn relative_target(from_dir: &Path, to: &Path) -> PathBuf {
    let a: Vec<_> = from_dir.components().collect();
    let b: Vec<_> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c.as_os_str());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_sysfs_style_links() {
        let got = resolve_lexically(
            Path::new("bus/pci/devices"),
            Path::new("../../../devices/pci0000:00/0000:00:01.0"),
        );
        assert_eq!(
            got.unwrap(),
            PathBuf::from("devices/pci0000:00/0000:00:01.0")
        );
        let abs = resolve_lexically(
            Path::new("class/net"),
            Path::new("/sys/devices/virtual/net/lo"),
        );
        assert_eq!(abs.unwrap(), PathBuf::from("devices/virtual/net/lo"));
        assert!(resolve_lexically(Path::new("class/net"), Path::new("../../../etc")).is_none());
    }

    #[test]
    fn relative_target_inverts_resolution() {
        let cases = [
            ("bus/pci/devices", "devices/pci0000:00/0000:00:01.0"),
            ("devices/pci0000:00/0000:00:01.0", "kernel/iommu_groups/3"),
            ("a/b", "a/b/c"),
            ("a/b/c", "a"),
        ];
        for (dir, to) in cases {
            let rel = relative_target(Path::new(dir), Path::new(to));
            assert_eq!(
                resolve_lexically(Path::new(dir), &rel).unwrap(),
                PathBuf::from(to)
            );
        }
    }
}
