//! Files a user names (an option, an environment variable, a tree of sysfs files) are read only
//! when they are regular files: opening or reading a FIFO blocks until a writer comes, maybe
//! forever, and opening some devices does something. Every such read in the workspace goes
//! through here, so the check is made the same way everywhere: before the open, on a
//! non-blocking open (had the entry been swapped for a FIFO since, the open does not wait),
//! and again on the open file.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why a named file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegularFileError {
    /// The operating system refused (no such file, permission denied, ...).
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file named.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// Something other than a regular file (a FIFO, a device, a directory): not opened.
    #[error("{}: not a regular file (a {found}); not opened", .path.display())]
    NotRegular {
        /// The file named.
        path: PathBuf,
        /// What it is: "FIFO", "character device", "directory", ...
        found: &'static str,
    },
    /// Longer than the reader takes.
    #[error("{}: longer than {cap} bytes; not read", .path.display())]
    TooLong {
        /// The file named.
        path: PathBuf,
        /// The most bytes the reader takes.
        cap: u64,
    },
}

/// What kind of entry `m` describes, for messages.
pub(crate) fn kind_of(m: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

fn regular(path: &Path, m: &Metadata) -> Result<(), RegularFileError> {
    if m.is_file() {
        Ok(())
    } else {
        Err(RegularFileError::NotRegular {
            path: path.to_owned(),
            found: kind_of(m),
        })
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> RegularFileError + '_ {
    move |source| RegularFileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Whether `path` (links followed) is a regular file, without opening it: for a path handed
/// to something that opens it itself (the dynamic loader).
pub fn check(path: &Path) -> Result<(), RegularFileError> {
    regular(path, &std::fs::metadata(path).map_err(io_error(path))?)
}

/// [`check`] for what the dynamic loader is handed: a name without a `/` is searched for by
/// the loader in its own directories and not checked; a path that cannot be looked at is left
/// to the loader to report as it does (no such file, ...). A FIFO or a device is refused.
pub fn check_library(path: &Path) -> Result<(), RegularFileError> {
    if !path.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Ok(());
    }
    match check(path) {
        Err(RegularFileError::Io { .. }) => Ok(()),
        other => other,
    }
}

/// `path` opened for reading if it is a regular file (see the module's text).
pub fn open(path: &Path) -> Result<File, RegularFileError> {
    open_with(path, 0)
}

/// [`open`] with `flags` added to the open's (`O_NOFOLLOW` for a sysfs tree).
pub(crate) fn open_with(path: &Path, flags: i32) -> Result<File, RegularFileError> {
    if flags & libc::O_NOFOLLOW == 0 {
        check(path)?;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | flags)
        .open(path)
        .map_err(io_error(path))?;
    regular(path, &f.metadata().map_err(io_error(path))?)?;
    Ok(f)
}

/// The whole of `path` if it is a regular file of at most `cap` bytes; a longer one is
/// refused, not cut (never sized by the length the file claims).
pub fn read(path: &Path, cap: u64) -> Result<Vec<u8>, RegularFileError> {
    read_file(path, open(path)?, cap)
}

/// The rest of `f`, opened from `path` by [`open_with`], at most `cap` bytes.
pub(crate) fn read_file(path: &Path, f: File, cap: u64) -> Result<Vec<u8>, RegularFileError> {
    let mut data = Vec::new();
    f.take(cap.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(io_error(path))?;
    if data.len() as u64 > cap {
        return Err(RegularFileError::TooLong {
            path: path.to_owned(),
            cap,
        });
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read(&file, 4),
            Err(RegularFileError::TooLong { cap: 4, .. })
        ));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path in a directory of our own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for e in [
            read(&fifo, 10).unwrap_err(),
            check(&fifo).unwrap_err(),
            open(dir.path()).unwrap_err(),
        ] {
            assert!(matches!(e, RegularFileError::NotRegular { .. }), "{e}");
        }
        assert!(check(&fifo)
            .unwrap_err()
            .to_string()
            .ends_with("fifo: not a regular file (a FIFO); not opened"));
        assert!(matches!(
            check(&dir.path().join("none")),
            Err(RegularFileError::Io { .. })
        ));
        // For the loader: names are its to search, missing paths its to report; FIFOs refused.
        assert!(check_library(Path::new("libc.so.6")).is_ok());
        assert!(check_library(&dir.path().join("none")).is_ok());
        assert!(check_library(&fifo).is_err());
    }
}
