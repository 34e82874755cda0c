//! The device file under the handle: the real `/dev/gdrdrv` ([`DevFile`]), or anything else
//! implementing [`DeviceFile`] (the tests' stand-in driver).

use super::GdrDrvError;
use std::ffi::{c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

/// The file operations the handle needs from the device: the real `/dev/gdrdrv` ([`DevFile`]),
/// or a stand-in for tests.
pub trait DeviceFile {
    /// Issues command `request` with `arg` as its parameter block; the command may read and write
    /// all of it. An error is the errno the driver returned.
    ///
    /// # Safety
    /// `request` must be a command that accesses at most `arg.len()` bytes at `arg`'s address
    /// (for the real driver: one of this module's commands with its own parameter type).
    unsafe fn ioctl(&self, request: u32, arg: &mut [u8]) -> io::Result<()>;

    /// Maps `len` bytes of the device, shared and read-write, at byte `offset`.
    fn mmap(&self, len: usize, offset: u64) -> io::Result<NonNull<u8>>;

    /// Unmaps what [`mmap`](Self::mmap) returned.
    ///
    /// # Safety
    /// `ptr` and `len` must be exactly a live mapping made by this file's `mmap`, and nothing may
    /// use that memory afterwards.
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()>;
}

/// An open device file (normally `/dev/gdrdrv`).
#[derive(Debug)]
pub struct DevFile {
    fd: OwnedFd,
}

impl DevFile {
    /// Opens `path` read-write, close-on-exec.
    pub fn open(path: &Path) -> Result<Self, GdrDrvError> {
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| GdrDrvError::Open {
            path: path.to_owned(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        // SAFETY: `cpath` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            let err = io::Error::last_os_error();
            let path = path.to_owned();
            return Err(match err.raw_os_error() {
                Some(libc::ENOENT) => GdrDrvError::NotLoaded { path },
                Some(libc::ENXIO) | Some(libc::ENODEV) => GdrDrvError::NoDriver { path },
                Some(libc::EACCES) | Some(libc::EPERM) => GdrDrvError::PermissionDenied { path },
                _ => GdrDrvError::Open { path, source: err },
            });
        }
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }
}

impl DeviceFile for DevFile {
    unsafe fn ioctl(&self, request: u32, arg: &mut [u8]) -> io::Result<()> {
        // SAFETY: the caller promises the command touches at most `arg.len()` bytes at `arg`,
        // which is a live, exclusively borrowed buffer for the duration of the call.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                request as libc::Ioctl,
                arg.as_mut_ptr().cast::<c_void>(),
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn mmap(&self, len: usize, offset: u64) -> io::Result<NonNull<u8>> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: a fresh shared mapping at an address the kernel picks (null hint, no
        // MAP_FIXED) cannot overlap memory Rust already uses.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()> {
        // SAFETY: the caller passes a live mapping of ours, unused from now on.
        if unsafe { libc::munmap(ptr.as_ptr().cast::<c_void>(), len) } < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
