//! Where a path inside a sysfs tree leads, found without ever leaving the tree.
//!
//! The kernel's own lookup would follow an absolute link, or a `..` past the top, out of a
//! capture and into the reading machine (`config -> /dev/zero`). So [`walk`] looks up one
//! component at a time with `lstat` and follows each symlink by hand: relative targets only,
//! never above the root, and at most [`MAX_LINK_HOPS`] links, with a repeated state reported
//! as a loop. Real sysfs links are all relative and inside `/sys`, and captures write their
//! links the same way (see [`relative_target`]), so neither loses anything by this.
//!
//! A tree that changes while it is read is not defended against: the threat is a hostile
//! capture on disk, not a process racing the reader.

use crate::limits::MAX_LINK_HOPS;
use crate::sysfs_error::SysfsError;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::Metadata;
use std::path::{Component, Path, PathBuf};

/// A path relative to the root with no symlink left in it, and what it is.
pub(crate) struct Resolved {
    pub(crate) path: PathBuf,
    pub(crate) meta: Metadata,
}

/// Looks up `rel` below `start` (a link-free path relative to `root`), following every symlink
/// on the way, the last component's too, inside the tree only.
pub(crate) fn walk(root: &Path, start: PathBuf, rel: &Path) -> Result<Resolved, SysfsError> {
    let mut done = start;
    // Components still to look up, the next one last.
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, rel);
    let mut meta = None;
    let mut hops = 0;
    // (link, what remains after it): meeting one twice means the walk goes round forever.
    let mut seen: HashSet<(PathBuf, Vec<OsString>)> = HashSet::new();
    // The links followed, with their targets and how much of `todo` lay below their
    // components, so that a `..` climbing out is blamed on the link it came from.
    let mut followed: Vec<(PathBuf, PathBuf, usize)> = Vec::new();
    while let Some(name) = todo.pop() {
        if name == ".." {
            if !done.pop() {
                let from = followed.iter().rev().find(|(.., base)| todo.len() >= *base);
                return Err(match from {
                    Some((link, target, _)) => SysfsError::LeavesRoot {
                        link: Some(link.clone()),
                        target: target.clone(),
                    },
                    None => SysfsError::LeavesRoot {
                        link: None,
                        target: rel.to_path_buf(),
                    },
                });
            }
            meta = None;
            continue;
        }
        done.push(&name);
        let at = root.join(&done);
        let m = std::fs::symlink_metadata(&at)?;
        if m.file_type().is_symlink() {
            if !seen.insert((done.clone(), todo.clone())) {
                return Err(SysfsError::LinkLoop(done));
            }
            hops += 1;
            if hops > MAX_LINK_HOPS {
                return Err(SysfsError::TooManyLinks);
            }
            let target = std::fs::read_link(&at)?;
            if target.is_absolute() {
                return Err(SysfsError::AbsoluteLink {
                    link: Some(done.clone()),
                    target,
                });
            }
            let base = todo.len();
            push_components(&mut todo, &target);
            followed.push((done.clone(), target, base));
            done.pop();
            meta = None;
            continue;
        }
        if !todo.is_empty() && !m.is_dir() {
            return Err(SysfsError::WrongType {
                expected: "directory",
                found: kind_of(&m),
            });
        }
        meta = Some(m);
    }
    let meta = match meta {
        Some(m) => m,
        // The root itself, or a directory reached by `..` or a link: follow, it is link-free.
        None => std::fs::metadata(root.join(&done))?,
    };
    Ok(Resolved { path: done, meta })
}

/// Puts the components of `p` onto `todo` so that the first one is popped first.
fn push_components(todo: &mut Vec<OsString>, p: &Path) {
    for c in p.components().rev() {
        match c {
            Component::Normal(n) => todo.push(n.to_os_string()),
            Component::ParentDir => todo.push("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

pub(crate) use crate::regular_file::kind_of;

/// Joins a relative link target to the directory holding the link and folds `.`/`..` without
/// touching the disk. `None` when the target is absolute or the result would climb above the
/// root.
pub(crate) fn resolve_lexically(link_dir: &Path, target: &Path) -> Option<PathBuf> {
    if target.is_absolute() {
        return None;
    }
    let mut out: Vec<std::ffi::OsString> = link_dir
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .collect();
    for c in target.components() {
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
        // Absolute targets are refused: sysfs and captures have none.
        let abs = resolve_lexically(
            Path::new("class/net"),
            Path::new("/sys/devices/virtual/net/lo"),
        );
        assert_eq!(abs, None);
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
