//! The gdrdrv kernel driver (gdrcopy's `/dev/gdrdrv`): its ioctl ABI, and a safe handle on it.
//!
//! gdrdrv pins a range of CUDA memory for BAR1 access (`nvidia_p2p_get_pages` in the kernel) and
//! lets the process `mmap` the pinned range through the device file. This module speaks the
//! driver's binary interface as gdrcopy 2.x defines it, so that an installed gdrdrv works without
//! libgdrapi.
//!
//! # The ABI
//! Every command is `_IOWR(0xDA, nr, T)` and passes a pointer to a parameter block that the
//! kernel copies in and out whole. Quirk: the size field of every command number except
//! `PIN_BUFFER` encodes `sizeof(pointer)` (8 on 64-bit), because the C header names a pointer
//! type there; the driver compares command numbers exactly, so they must be reproduced bit for
//! bit, while the block passed must still be the full structure.
//!
//! The mmap offset of a pinned range is its handle shifted left by the host page shift; the driver
//! allows one mapping per handle, of at most the pinned (64 KiB-rounded) size, and only from the
//! process that opened the device (after `fork`, the child gets `EACCES`).
//!
//! # What is verified
//! Command numbers and layouts are unit-tested against hand-computed values; the handle is tested
//! against a fake driver (`tests/gdrdrv.rs`) that decodes command numbers and parameter bytes as
//! the kernel does, and against real non-gdrdrv files for its error paths. It has not been run
//! against a real gdrdrv: neither the development machine nor the H100 machine can load it.

use std::ffi::{c_void, CString};
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the driver's device node lives.
pub const DEVICE_PATH: &str = "/dev/gdrdrv";
/// The driver's ioctl type byte.
pub const IOCTL_MAGIC: u8 = 0xDA;
/// GPU page: pins are rounded out to it.
pub const GPU_PAGE_SHIFT: u32 = 16;
/// GPU page size in bytes.
pub const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;
/// The user-space API version this module speaks (major << 16 | minor): gdrcopy 2.5's, the first
/// with `PIN_BUFFER_V2` and `REQ_MAPPING_TYPE`. The driver names the oldest it accepts.
pub const API_VERSION: u32 = (2 << 16) | 5;

// `_IOC` field layout. PowerPC, MIPS and SPARC use 3 direction bits and 13 size bits.
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc64"
))]
mod ioc_layout {
    pub const SIZE_BITS: u32 = 13;
    pub const WRITE: u32 = 4;
    pub const READ: u32 = 2;
}
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc64"
)))]
mod ioc_layout {
    pub const SIZE_BITS: u32 = 14;
    pub const WRITE: u32 = 1;
    pub const READ: u32 = 2;
}

const IOC_NR_SHIFT: u32 = 0;
const IOC_TYPE_SHIFT: u32 = 8;
const IOC_SIZE_SHIFT: u32 = 16;
const IOC_DIR_SHIFT: u32 = IOC_SIZE_SHIFT + ioc_layout::SIZE_BITS;

/// `_IOC(dir, type, nr, size)`: a Linux ioctl command number. The size is truncated to the size
/// field, as the C macro does.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    let size = (size as u32) & ((1 << ioc_layout::SIZE_BITS) - 1);
    (dir << IOC_DIR_SHIFT)
        | (size << IOC_SIZE_SHIFT)
        | ((ty as u32) << IOC_TYPE_SHIFT)
        | ((nr as u32) << IOC_NR_SHIFT)
}

/// `_IOWR(type, nr, size)`: read and write.
pub const fn iowr(ty: u8, nr: u8, size: usize) -> u32 {
    ioc(ioc_layout::READ | ioc_layout::WRITE, ty, nr, size)
}

/// What the C header's pointer-typed commands encode as their size.
const POINTER_SIZE: usize = std::mem::size_of::<*mut c_void>();

/// Command 1: pin a range (v1: with a P2P token and VA space, both 0 for CUDA memory). The only
/// command whose number encodes its real structure size (40).
pub const PIN_BUFFER: u32 = iowr(IOCTL_MAGIC, 1, std::mem::size_of::<PinBufferParams>());
/// Command 2: unpin.
pub const UNPIN_BUFFER: u32 = iowr(IOCTL_MAGIC, 2, POINTER_SIZE);
/// Command 3: whether the NVIDIA free callback fired for a pin.
pub const GET_CB_FLAG: u32 = iowr(IOCTL_MAGIC, 3, POINTER_SIZE);
/// Command 4: pin information, v1 layout.
pub const GET_INFO: u32 = iowr(IOCTL_MAGIC, 4, POINTER_SIZE);
/// Command 5: pin information with the mapping type (driver 2.4+).
pub const GET_INFO_V2: u32 = iowr(IOCTL_MAGIC, 5, POINTER_SIZE);
/// Command 6: a driver attribute (driver 2.4+).
pub const GET_ATTR: u32 = iowr(IOCTL_MAGIC, 6, POINTER_SIZE);
/// Command 7: pin with flags (driver 2.5+).
pub const PIN_BUFFER_V2: u32 = iowr(IOCTL_MAGIC, 7, POINTER_SIZE);
/// Command 8: ask for a CPU mapping type before `mmap` (driver 2.5+).
pub const REQ_MAPPING_TYPE: u32 = iowr(IOCTL_MAGIC, 8, POINTER_SIZE);
/// Command 255: driver version and the oldest API version it accepts.
pub const GET_VERSION: u32 = iowr(IOCTL_MAGIC, 255, POINTER_SIZE);

/// `PIN_BUFFER` parameters (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinBufferParams {
    pub addr: u64,
    pub size: u64,
    pub p2p_token: u64,
    pub va_space: u32,
    /// C's implicit padding, made explicit so every byte sent is defined.
    pub _pad: u32,
    /// Out.
    pub handle: u64,
}

/// `UNPIN_BUFFER` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpinBufferParams {
    pub handle: u64,
}

/// `GET_CB_FLAG` parameters (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetCbFlagParams {
    pub handle: u64,
    /// Out.
    pub flag: u32,
    pub _pad: u32,
}

/// `GET_INFO` parameters, v1 (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetInfoParams {
    pub handle: u64,
    /// Out from here on.
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tsc_khz: u32,
    pub tm_cycles: u64,
    pub mapped: u32,
    pub wc_mapping: u32,
}

/// `GET_INFO_V2` parameters (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetInfoV2Params {
    pub handle: u64,
    /// Out from here on.
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tsc_khz: u32,
    pub tm_cycles: u64,
    pub mapping_type: u32,
    pub _pad: u32,
}

/// `GET_ATTR` parameters (8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetAttrParams {
    pub attr: u32,
    /// Out.
    pub val: u32,
}

/// `PIN_BUFFER_V2` parameters (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinBufferV2Params {
    pub addr: u64,
    pub size: u64,
    pub flags: u32,
    pub pad: u32,
    /// Out.
    pub handle: u64,
}

/// `REQ_MAPPING_TYPE` parameters (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqMappingTypeParams {
    pub handle: u64,
    pub mapping_type: u32,
    pub _pad: u32,
}

/// `GET_VERSION` parameters (8 bytes, all out).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetVersionParams {
    pub driver_version: u32,
    pub minimum_api_version: u32,
}

/// A parameter block: plain integers with every padding byte spelled out as a field, so that
/// viewing it as bytes reads only initialised memory.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integer fields without implicit padding.
unsafe trait Params: Copy {
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: by the trait's contract `Self` is plain integers with no padding, so all
        // `size_of::<Self>()` bytes are initialised, and any byte pattern written through the
        // slice is a valid `Self`. The slice borrows `self` mutably, so nothing aliases it.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self as *mut Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }
}

// SAFETY (all impls below): repr(C), u32/u64 fields only, sizes asserted below to equal the sum
// of the fields, so there is no implicit padding.
unsafe impl Params for PinBufferParams {}
unsafe impl Params for UnpinBufferParams {}
unsafe impl Params for GetCbFlagParams {}
unsafe impl Params for GetInfoParams {}
unsafe impl Params for GetInfoV2Params {}
unsafe impl Params for GetAttrParams {}
unsafe impl Params for PinBufferV2Params {}
unsafe impl Params for ReqMappingTypeParams {}
unsafe impl Params for GetVersionParams {}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<PinBufferParams>() == 3 * 8 + 2 * 4 + 8);
    assert!(size_of::<UnpinBufferParams>() == 8);
    assert!(size_of::<GetCbFlagParams>() == 8 + 2 * 4);
    assert!(size_of::<GetInfoParams>() == 3 * 8 + 2 * 4 + 8 + 2 * 4);
    assert!(size_of::<GetInfoV2Params>() == 3 * 8 + 2 * 4 + 8 + 2 * 4);
    assert!(size_of::<GetAttrParams>() == 2 * 4);
    assert!(size_of::<PinBufferV2Params>() == 2 * 8 + 2 * 4 + 8);
    assert!(size_of::<ReqMappingTypeParams>() == 8 + 2 * 4);
    assert!(size_of::<GetVersionParams>() == 2 * 4);
};

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

/// What went wrong with gdrdrv.
#[derive(Debug, thiserror::Error)]
pub enum GdrDrvError {
    #[error(
        "no {}: the gdrdrv kernel module is not loaded (gdrcopy's insmod.sh or \
         `modprobe gdrdrv` loads it; in a container, pass the device in)",
        path.display()
    )]
    NotLoaded { path: PathBuf },
    #[error("{} exists but no driver answers behind it: the gdrdrv module was unloaded", path.display())]
    NoDriver { path: PathBuf },
    #[error(
        "permission denied opening {}: the device node must be readable and writable by this \
         user (gdrcopy's insmod.sh creates it 0666; containers need it passed in)",
        path.display()
    )]
    PermissionDenied { path: PathBuf },
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the device does not understand {op} (ENOTTY): not gdrdrv, or a gdrdrv too old for it"
    )]
    Unsupported { op: &'static str },
    #[error("gdrdrv refused {op}: the device was opened by another process (fork?)")]
    NotOwner { op: &'static str },
    #[error("gdrdrv {op} failed: {source}")]
    Ioctl {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "gdrdrv {driver} requires API version {required} or newer; this library speaks {ours}"
    )]
    ApiTooOld {
        driver: Version,
        required: Version,
        ours: Version,
    },
    #[error("nothing to {op}: size 0")]
    EmptyRange { op: &'static str },
    #[error("a mapping of {size} bytes does not fit the address space")]
    SizeOverflow { size: usize },
    #[error("handle {handle:#x} does not fit an mmap offset")]
    HandleOutOfRange { handle: u64 },
    #[error("mapping {len} bytes of handle {handle:#x} failed: {source}")]
    Map {
        handle: u64,
        len: usize,
        #[source]
        source: io::Error,
    },
    #[error("gdrdrv answered mapping type {0}, which this library does not know")]
    UnknownMappingType(u32),
}

impl GdrDrvError {
    fn from_ioctl(op: &'static str, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOTTY) => Self::Unsupported { op },
            Some(libc::EACCES) => Self::NotOwner { op },
            _ => Self::Ioctl { op, source },
        }
    }

    fn is_unsupported(&self) -> bool {
        matches!(self, Self::Unsupported { .. })
    }
}

/// A `major << 16 | minor` version as gdrdrv encodes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u32);

impl Version {
    pub fn major(self) -> u32 {
        self.0 >> 16
    }
    pub fn minor(self) -> u32 {
        self.0 & 0xffff
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// The driver's version and the oldest API version it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverVersion {
    pub driver: Version,
    pub minimum_api: Version,
}

/// A pinned range's driver handle (also its mmap page offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// `PIN_BUFFER_V2` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PinFlags(pub u32);

impl PinFlags {
    pub const NONE: Self = Self(0);
    /// Map through BAR1 even on coherent (C2C) platforms.
    pub const FORCE_PCIE: Self = Self(1);
}

/// How the CPU maps the pinned memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MappingType {
    /// Not mapped (or: let the driver choose, in a request).
    None = 0,
    /// Write-combined: fast stores, slow loads; the usual type on PCIe.
    WriteCombined = 1,
    /// Cached: coherent platforms.
    Caching = 2,
    /// Device memory: uncached, strictly ordered.
    Device = 3,
}

impl MappingType {
    fn from_raw(raw: u32) -> Result<Self, GdrDrvError> {
        Ok(match raw {
            0 => Self::None,
            1 => Self::WriteCombined,
            2 => Self::Caching,
            3 => Self::Device,
            other => return Err(GdrDrvError::UnknownMappingType(other)),
        })
    }
}

/// A driver attribute for [`GdrDrv::get_attr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attr(pub u32);

impl Attr {
    /// Non-zero if the driver pins with `nvidia_p2p_get_pages_persistent` (no free callback).
    pub const USE_PERSISTENT_MAPPING: Self = Self(1);
    /// Non-zero if the driver and the GPU driver support [`PinFlags::FORCE_PCIE`].
    pub const SUPPORT_PIN_FLAG_FORCE_PCIE: Self = Self(2);
}

/// What the driver says about a pinned range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinInfo {
    /// GPU virtual address where the pinned (GPU-page-rounded) range starts; a caller's offset
    /// in the mapping is its address minus this.
    pub va: u64,
    /// Bytes pinned (a multiple of the GPU page).
    pub mapped_size: u64,
    /// GPU page size the driver used.
    pub page_size: u32,
    /// TSC frequency and the cycles the pin took, as the driver measured them.
    pub tsc_khz: u32,
    pub tm_cycles: u64,
    /// Current CPU mapping type (`None` when not mapped).
    pub mapping_type: MappingType,
}

/// An open gdrdrv: pins CUDA memory and maps it for the CPU.
///
/// The driver serves only the process that opened it; share a `GdrDrv` between threads freely
/// (it is `Sync` when the file is), but do not use it in a forked child.
pub struct GdrDrv<F: DeviceFile = DevFile> {
    file: F,
    version: DriverVersion,
    page_shift: u32,
    /// Set once the driver answered `ENOTTY` to `PIN_BUFFER_V2` (older than 2.5).
    pin_v1_only: AtomicBool,
    /// Set once the driver answered `ENOTTY` to `GET_INFO_V2` (older than 2.4).
    info_v1_only: AtomicBool,
}

impl<F: DeviceFile> fmt::Debug for GdrDrv<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GdrDrv")
            .field("version", &self.version)
            .field("host_page_size", &self.host_page_size())
            .finish_non_exhaustive()
    }
}

impl GdrDrv<DevFile> {
    /// Opens [`DEVICE_PATH`].
    pub fn open() -> Result<Self, GdrDrvError> {
        Self::open_path(Path::new(DEVICE_PATH))
    }

    /// Opens the driver at another path (a device node inside a container, say).
    pub fn open_path(path: &Path) -> Result<Self, GdrDrvError> {
        Self::with_file(DevFile::open(path)?)
    }
}

impl<F: DeviceFile> GdrDrv<F> {
    /// Wraps an open device file: asks its version and checks it accepts this API.
    pub fn with_file(file: F) -> Result<Self, GdrDrvError> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = u64::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let mut drv = Self {
            file,
            version: DriverVersion {
                driver: Version(0),
                minimum_api: Version(0),
            },
            page_shift: page.trailing_zeros(),
            pin_v1_only: AtomicBool::new(false),
            info_v1_only: AtomicBool::new(false),
        };
        drv.version = drv.get_version()?;
        if drv.version.minimum_api > Version(API_VERSION) {
            return Err(GdrDrvError::ApiTooOld {
                driver: drv.version.driver,
                required: drv.version.minimum_api,
                ours: Version(API_VERSION),
            });
        }
        Ok(drv)
    }

    /// The version read when the driver was opened.
    pub fn version(&self) -> DriverVersion {
        self.version
    }

    /// The device file.
    pub fn file(&self) -> &F {
        &self.file
    }

    /// Host page size: mappings are rounded up to it.
    pub fn host_page_size(&self) -> usize {
        1 << self.page_shift
    }

    fn call<P: Params>(
        &self,
        op: &'static str,
        request: u32,
        params: &mut P,
    ) -> Result<(), GdrDrvError> {
        // SAFETY: every caller pairs a command with its own parameter type, which is the whole
        // block that command reads and writes.
        unsafe { self.file.ioctl(request, params.as_bytes_mut()) }
            .map_err(|e| GdrDrvError::from_ioctl(op, e))
    }

    /// Asks the driver's version (`GET_VERSION`).
    pub fn get_version(&self) -> Result<DriverVersion, GdrDrvError> {
        let mut p = GetVersionParams::default();
        self.call("GET_VERSION", GET_VERSION, &mut p)?;
        Ok(DriverVersion {
            driver: Version(p.driver_version),
            minimum_api: Version(p.minimum_api_version),
        })
    }

    /// Pins `[addr, addr + size)` of CUDA memory (rounded out to GPU pages by the driver).
    /// Uses `PIN_BUFFER_V2`, falling back to `PIN_BUFFER` on drivers older than 2.5 when no flag
    /// is asked for. The handle must be given back with [`unpin`](Self::unpin) (or use
    /// [`pin`](Self::pin), which does it on drop).
    pub fn pin_buffer(&self, addr: u64, size: u64, flags: PinFlags) -> Result<Handle, GdrDrvError> {
        if size == 0 {
            return Err(GdrDrvError::EmptyRange { op: "pin" });
        }
        if !self.pin_v1_only.load(Ordering::Relaxed) {
            let mut p = PinBufferV2Params {
                addr,
                size,
                flags: flags.0,
                ..Default::default()
            };
            match self.call("PIN_BUFFER_V2", PIN_BUFFER_V2, &mut p) {
                Ok(()) => return Ok(Handle(p.handle)),
                Err(e) if e.is_unsupported() && flags == PinFlags::NONE => {
                    self.pin_v1_only.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        } else if flags != PinFlags::NONE {
            return Err(GdrDrvError::Unsupported {
                op: "PIN_BUFFER_V2",
            });
        }
        self.pin_buffer_v1(addr, size, 0, 0)
    }

    /// `PIN_BUFFER` as is (token and VA space are 0 for memory from the CUDA driver API).
    pub fn pin_buffer_v1(
        &self,
        addr: u64,
        size: u64,
        p2p_token: u64,
        va_space: u32,
    ) -> Result<Handle, GdrDrvError> {
        if size == 0 {
            return Err(GdrDrvError::EmptyRange { op: "pin" });
        }
        let mut p = PinBufferParams {
            addr,
            size,
            p2p_token,
            va_space,
            ..Default::default()
        };
        self.call("PIN_BUFFER", PIN_BUFFER, &mut p)?;
        Ok(Handle(p.handle))
    }

    /// Unpins (`UNPIN_BUFFER`). A mapping of the handle still alive is torn down by the driver;
    /// touching it afterwards faults.
    pub fn unpin(&self, handle: Handle) -> Result<(), GdrDrvError> {
        let mut p = UnpinBufferParams { handle: handle.0 };
        self.call("UNPIN_BUFFER", UNPIN_BUFFER, &mut p)
    }

    /// Whether the NVIDIA free callback fired for the pin, i.e. the memory was freed (or its
    /// context destroyed) while pinned (`GET_CB_FLAG`).
    pub fn get_callback_flag(&self, handle: Handle) -> Result<bool, GdrDrvError> {
        let mut p = GetCbFlagParams {
            handle: handle.0,
            ..Default::default()
        };
        self.call("GET_CB_FLAG", GET_CB_FLAG, &mut p)?;
        Ok(p.flag != 0)
    }

    /// What the driver knows of a pin (`GET_INFO_V2`, or `GET_INFO` on drivers before 2.4).
    pub fn get_info(&self, handle: Handle) -> Result<PinInfo, GdrDrvError> {
        if !self.info_v1_only.load(Ordering::Relaxed) {
            let mut p = GetInfoV2Params {
                handle: handle.0,
                ..Default::default()
            };
            match self.call("GET_INFO_V2", GET_INFO_V2, &mut p) {
                Ok(()) => {
                    return Ok(PinInfo {
                        va: p.va,
                        mapped_size: p.mapped_size,
                        page_size: p.page_size,
                        tsc_khz: p.tsc_khz,
                        tm_cycles: p.tm_cycles,
                        mapping_type: MappingType::from_raw(p.mapping_type)?,
                    })
                }
                Err(e) if e.is_unsupported() => self.info_v1_only.store(true, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        let mut p = GetInfoParams {
            handle: handle.0,
            ..Default::default()
        };
        self.call("GET_INFO", GET_INFO, &mut p)?;
        let mapping_type = match (p.mapped != 0, p.wc_mapping != 0) {
            (false, _) => MappingType::None,
            (true, true) => MappingType::WriteCombined,
            // v1 drivers only distinguish WC from cached.
            (true, false) => MappingType::Caching,
        };
        Ok(PinInfo {
            va: p.va,
            mapped_size: p.mapped_size,
            page_size: p.page_size,
            tsc_khz: p.tsc_khz,
            tm_cycles: p.tm_cycles,
            mapping_type,
        })
    }

    /// A driver attribute (`GET_ATTR`, driver 2.4+).
    pub fn get_attr(&self, attr: Attr) -> Result<u32, GdrDrvError> {
        let mut p = GetAttrParams {
            attr: attr.0,
            val: 0,
        };
        self.call("GET_ATTR", GET_ATTR, &mut p)?;
        Ok(p.val)
    }

    /// Asks for a mapping type for the next `mmap` of the handle (`REQ_MAPPING_TYPE`, driver
    /// 2.5+); `MappingType::None` lets the driver choose.
    pub fn req_mapping_type(&self, handle: Handle, ty: MappingType) -> Result<(), GdrDrvError> {
        let mut p = ReqMappingTypeParams {
            handle: handle.0,
            mapping_type: ty as u32,
            _pad: 0,
        };
        self.call("REQ_MAPPING_TYPE", REQ_MAPPING_TYPE, &mut p)
    }

    /// Maps `size` bytes of a pinned range for the CPU (rounded up to the host page). The mapping
    /// borrows the driver, so it cannot outlive it; it is unmapped on drop. Prefer
    /// [`Pinned::map`], which also ties it to the pin.
    ///
    /// # Safety
    /// `handle` must stay pinned until the mapping is dropped: the mapping borrows only the
    /// driver, and after an unpin it would point at GPU memory that may be reused.
    pub unsafe fn map(
        &self,
        handle: Handle,
        size: usize,
    ) -> Result<BarMapping<'_, F>, GdrDrvError> {
        if size == 0 {
            return Err(GdrDrvError::EmptyRange { op: "map" });
        }
        let offset = handle
            .0
            .checked_mul(1 << self.page_shift)
            .filter(|&o| o <= i64::MAX as u64)
            .ok_or(GdrDrvError::HandleOutOfRange { handle: handle.0 })?;
        let len = size
            .checked_next_multiple_of(self.host_page_size())
            .ok_or(GdrDrvError::SizeOverflow { size })?;
        let ptr = self
            .file
            .mmap(len, offset)
            .map_err(|source| GdrDrvError::Map {
                handle: handle.0,
                len,
                source,
            })?;
        Ok(BarMapping {
            drv: self,
            ptr,
            len,
            size,
            handle,
            _not_sync: PhantomData,
        })
    }

    /// Pins and returns a guard that unpins on drop; mappings made from it borrow it.
    pub fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<Pinned<'_, F>, GdrDrvError> {
        let handle = self.pin_buffer(addr, size, flags)?;
        Ok(Pinned {
            drv: self,
            handle,
            size,
        })
    }
}

/// A pinned range that unpins itself when dropped.
pub struct Pinned<'d, F: DeviceFile = DevFile> {
    drv: &'d GdrDrv<F>,
    handle: Handle,
    size: u64,
}

impl<'d, F: DeviceFile> Pinned<'d, F> {
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The size asked for when pinning.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn info(&self) -> Result<PinInfo, GdrDrvError> {
        self.drv.get_info(self.handle)
    }

    pub fn callback_fired(&self) -> Result<bool, GdrDrvError> {
        self.drv.get_callback_flag(self.handle)
    }

    /// Maps the pin for the CPU; the mapping borrows the pin, so it cannot outlive it.
    pub fn map(&self, size: usize) -> Result<BarMapping<'_, F>, GdrDrvError> {
        // SAFETY: the mapping borrows this pin, which unpins only when dropped or consumed.
        unsafe { self.drv.map(self.handle, size) }
    }

    /// Unpins now, reporting failure (dropping unpins and ignores it).
    pub fn unpin(self) -> Result<(), GdrDrvError> {
        let this = std::mem::ManuallyDrop::new(self);
        this.drv.unpin(this.handle)
    }
}

impl<F: DeviceFile> Drop for Pinned<'_, F> {
    fn drop(&mut self) {
        // Nothing to do about a failure here; `unpin` reports it to those who ask.
        let _ = self.drv.unpin(self.handle);
    }
}

impl<F: DeviceFile> fmt::Debug for Pinned<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned")
            .field("handle", &self.handle)
            .field("size", &self.size)
            .finish()
    }
}

/// A CPU mapping of pinned GPU memory through BAR1. Unmapped on drop.
///
/// The memory is device memory (typically write-combined): access it with volatile or
/// streaming accesses through [`as_ptr`](Self::as_ptr), never as an ordinary Rust slice.
///
/// A mapping made from a [`Pinned`] cannot outlive the pin (nor any mapping the driver):
/// ```compile_fail
/// use gdr::bar::gdrdrv::{BarMapping, GdrDrv, PinFlags};
/// fn leak(drv: &GdrDrv) -> BarMapping<'_> {
///     let pinned = drv.pin(0x7f00_0000_0000, 1, PinFlags::NONE).unwrap();
///     pinned.map(1).unwrap() // error: `pinned` is unpinned at the end of this function
/// }
/// ```
/// while the same use inside the pin's scope compiles:
/// ```no_run
/// use gdr::bar::gdrdrv::{GdrDrv, PinFlags};
/// fn fine(drv: &GdrDrv) -> usize {
///     let pinned = drv.pin(0x7f00_0000_0000, 1, PinFlags::NONE).unwrap();
///     let mapping = pinned.map(1).unwrap();
///     mapping.mapped_len()
/// }
/// ```
pub struct BarMapping<'a, F: DeviceFile = DevFile> {
    drv: &'a GdrDrv<F>,
    ptr: NonNull<u8>,
    len: usize,
    size: usize,
    handle: Handle,
    /// Copies through the pointer from several threads need the caller's own synchronisation.
    _not_sync: PhantomData<*mut u8>,
}

// SAFETY: the mapping is an address range of this process; nothing in it is tied to the thread
// that made it (gdrdrv checks the process, not the thread), and unmapping from another thread is
// fine. It is not Sync: concurrent access through the raw pointer is the caller's business.
unsafe impl<F: DeviceFile + Sync> Send for BarMapping<'_, F> {}

impl<F: DeviceFile> BarMapping<'_, F> {
    /// Start of the mapping: the first byte of the pinned (GPU-page-rounded) range.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes mapped (rounded up to the host page).
    pub fn mapped_len(&self) -> usize {
        self.len
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
}

impl<F: DeviceFile> Drop for BarMapping<'_, F> {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping `map` made, and this guard is its only owner.
        let _ = unsafe { self.drv.file.munmap(self.ptr, self.len) };
    }
}

impl<F: DeviceFile> fmt::Debug for BarMapping<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BarMapping")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("mapped_len", &self.len)
            .field("handle", &self.handle)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn command_numbers_match_hand_computed_values() {
        // dir 3 (read|write) << 30 | size << 16 | 0xDA << 8 | nr
        assert_eq!(PIN_BUFFER, 0xC028_DA01); // size 40: the whole struct
        assert_eq!(UNPIN_BUFFER, 0xC008_DA02); // size 8: a pointer
        assert_eq!(GET_CB_FLAG, 0xC008_DA03);
        assert_eq!(GET_INFO, 0xC008_DA04);
        assert_eq!(GET_INFO_V2, 0xC008_DA05);
        assert_eq!(GET_ATTR, 0xC008_DA06);
        assert_eq!(PIN_BUFFER_V2, 0xC008_DA07);
        assert_eq!(REQ_MAPPING_TYPE, 0xC008_DA08);
        assert_eq!(GET_VERSION, 0xC008_DAFF);
    }

    #[test]
    fn ioc_encodes_each_field() {
        assert_eq!(ioc(0, 0, 0, 0), 0);
        assert_eq!(ioc(1, 0, 0, 0), 0x4000_0000);
        assert_eq!(ioc(2, 0, 0, 0), 0x8000_0000);
        assert_eq!(ioc(0, 0xAB, 0, 0), 0xAB00);
        assert_eq!(ioc(0, 0, 0x7F, 0), 0x7F);
        assert_eq!(ioc(0, 0, 0, 0x3FFF), 0x3FFF_0000);
        // Sizes wider than the field are truncated, as the C macro's users see.
        assert_eq!(ioc(0, 0, 0, 0x4001), 0x0001_0000);
        // A well-known number from <linux/fs.h>: BLKGETSIZE64 = _IOR(0x12, 114, size_t).
        assert_eq!(ioc(2, 0x12, 114, 8), 0x8008_1272);
    }

    #[test]
    fn struct_sizes() {
        assert_eq!(size_of::<PinBufferParams>(), 40);
        assert_eq!(size_of::<UnpinBufferParams>(), 8);
        assert_eq!(size_of::<GetCbFlagParams>(), 16);
        assert_eq!(size_of::<GetInfoParams>(), 48);
        assert_eq!(size_of::<GetInfoV2Params>(), 48);
        assert_eq!(size_of::<GetAttrParams>(), 8);
        assert_eq!(size_of::<PinBufferV2Params>(), 32);
        assert_eq!(size_of::<ReqMappingTypeParams>(), 16);
        assert_eq!(size_of::<GetVersionParams>(), 8);
    }

    #[test]
    fn field_offsets() {
        assert_eq!(offset_of!(PinBufferParams, addr), 0);
        assert_eq!(offset_of!(PinBufferParams, size), 8);
        assert_eq!(offset_of!(PinBufferParams, p2p_token), 16);
        assert_eq!(offset_of!(PinBufferParams, va_space), 24);
        assert_eq!(offset_of!(PinBufferParams, handle), 32);

        assert_eq!(offset_of!(UnpinBufferParams, handle), 0);

        assert_eq!(offset_of!(GetCbFlagParams, handle), 0);
        assert_eq!(offset_of!(GetCbFlagParams, flag), 8);

        assert_eq!(offset_of!(GetInfoParams, handle), 0);
        assert_eq!(offset_of!(GetInfoParams, va), 8);
        assert_eq!(offset_of!(GetInfoParams, mapped_size), 16);
        assert_eq!(offset_of!(GetInfoParams, page_size), 24);
        assert_eq!(offset_of!(GetInfoParams, tsc_khz), 28);
        assert_eq!(offset_of!(GetInfoParams, tm_cycles), 32);
        assert_eq!(offset_of!(GetInfoParams, mapped), 40);
        assert_eq!(offset_of!(GetInfoParams, wc_mapping), 44);

        assert_eq!(offset_of!(GetInfoV2Params, handle), 0);
        assert_eq!(offset_of!(GetInfoV2Params, va), 8);
        assert_eq!(offset_of!(GetInfoV2Params, mapped_size), 16);
        assert_eq!(offset_of!(GetInfoV2Params, page_size), 24);
        assert_eq!(offset_of!(GetInfoV2Params, tsc_khz), 28);
        assert_eq!(offset_of!(GetInfoV2Params, tm_cycles), 32);
        assert_eq!(offset_of!(GetInfoV2Params, mapping_type), 40);

        assert_eq!(offset_of!(GetAttrParams, attr), 0);
        assert_eq!(offset_of!(GetAttrParams, val), 4);

        assert_eq!(offset_of!(PinBufferV2Params, addr), 0);
        assert_eq!(offset_of!(PinBufferV2Params, size), 8);
        assert_eq!(offset_of!(PinBufferV2Params, flags), 16);
        assert_eq!(offset_of!(PinBufferV2Params, pad), 20);
        assert_eq!(offset_of!(PinBufferV2Params, handle), 24);

        assert_eq!(offset_of!(ReqMappingTypeParams, handle), 0);
        assert_eq!(offset_of!(ReqMappingTypeParams, mapping_type), 8);

        assert_eq!(offset_of!(GetVersionParams, driver_version), 0);
        assert_eq!(offset_of!(GetVersionParams, minimum_api_version), 4);
    }

    #[test]
    fn params_bytes_are_the_struct() {
        let mut p = PinBufferV2Params {
            addr: 0x1122_3344_5566_7788,
            size: 0x10000,
            flags: 1,
            pad: 0,
            handle: 0,
        };
        let bytes = p.as_bytes_mut();
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[0..8], &0x1122_3344_5566_7788u64.to_ne_bytes());
        bytes[24..32].copy_from_slice(&42u64.to_ne_bytes());
        assert_eq!(p.handle, 42);
    }

    #[test]
    fn versions_print_as_major_minor() {
        assert_eq!(Version(API_VERSION).to_string(), "2.5");
        assert_eq!(Version((2 << 16) | 4).major(), 2);
        assert_eq!(Version((2 << 16) | 4).minor(), 4);
        assert!(Version((2 << 16) | 10) > Version((2 << 16) | 5));
    }
}
