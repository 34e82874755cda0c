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
//! The raw interface (command numbers, parameter blocks) stays private to this crate. Outside it,
//! the safe handle [`GdrDrv`] is the API, with [`DEVICE_PATH`] and [`API_VERSION`]; a
//! [`DeviceFile`] stand-in for the driver sees only command numbers and parameter bytes.
//!
//! # What is verified
//! Command numbers and layouts are unit-tested against hand-computed values; the handle is tested
//! against a fake driver (`tests/gdrdrv.rs`) that decodes command numbers and parameter bytes as
//! the kernel does, and against real non-gdrdrv files for its error paths. It has not been run
//! against a real gdrdrv: neither the development machine nor the H100 machine can load it.
mod file;
mod mapping;
mod sys;
#[cfg(test)]
mod tests;

pub use file::{DevFile, DeviceFile};
pub use mapping::{GdrDrvMapping, GdrDrvPin};
use sys::*;
pub use sys::{API_VERSION, DEVICE_PATH};

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What went wrong with gdrdrv.
#[derive(Debug, thiserror::Error)]
pub enum GdrDrvError {
    /// The device node does not exist (`ENOENT` from `open`).
    #[error(
        "no {}: the gdrdrv kernel module is not loaded (gdrcopy's insmod.sh or \
         `modprobe gdrdrv` loads it; in a container, pass the device in)",
        path.display()
    )]
    NotLoaded {
        /// The device node that was opened.
        path: PathBuf,
    },
    /// The device node exists but no driver is registered for its major number (`ENXIO` or
    /// `ENODEV` from `open`).
    #[error("{} exists but no driver answers behind it: the gdrdrv module was unloaded", path.display())]
    NoDriver {
        /// The device node that was opened.
        path: PathBuf,
    },
    /// `open` answered `EACCES` or `EPERM`.
    #[error(
        "permission denied opening {}: the device node must be readable and writable by this \
         user (gdrcopy's insmod.sh creates it 0666; containers need it passed in)",
        path.display()
    )]
    PermissionDenied {
        /// The device node that was opened.
        path: PathBuf,
    },
    /// `open` failed for another reason.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The device node that was opened.
        path: PathBuf,
        /// The error `open` returned.
        #[source]
        source: io::Error,
    },
    /// An ioctl answered `ENOTTY`: the file is not gdrdrv, or the command is newer than the
    /// driver.
    #[error(
        "the device does not understand {op} (ENOTTY): not gdrdrv, or a gdrdrv too old for it"
    )]
    Unsupported {
        /// The command, as gdrdrv.h names it without its prefix (`PIN_BUFFER_V2`).
        op: &'static str,
    },
    /// An ioctl answered `EACCES`: gdrdrv serves only the process that opened the device.
    #[error("gdrdrv refused {op}: the device was opened by another process (fork?)")]
    NotOwner {
        /// The command refused.
        op: &'static str,
    },
    /// An ioctl failed with any other errno (`EINVAL` for an unknown handle or a range that is
    /// not CUDA memory, for instance).
    #[error("gdrdrv {op} failed: {source}")]
    Ioctl {
        /// The command that failed.
        op: &'static str,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The driver's oldest accepted API version is newer than [`API_VERSION`].
    #[error(
        "gdrdrv {driver} requires API version {required} or newer; this library speaks {ours}"
    )]
    ApiTooOld {
        /// The driver's own version.
        driver: Version,
        /// The oldest API version the driver accepts.
        required: Version,
        /// The API version this module speaks ([`API_VERSION`]).
        ours: Version,
    },
    /// A pin or a mapping of 0 bytes was asked for; refused before calling the driver.
    #[error("nothing to {op}: size 0")]
    EmptyRange {
        /// `"pin"` or `"map"`.
        op: &'static str,
    },
    /// The mapping's size rounded up to the host page overflows `usize`.
    #[error("a mapping of {size} bytes does not fit the address space")]
    SizeOverflow {
        /// The size asked for, in bytes.
        size: usize,
    },
    /// The handle shifted by the host page shift (its mmap offset) exceeds `i64::MAX`.
    #[error("handle {handle:#x} does not fit an mmap offset")]
    HandleOutOfRange {
        /// The driver's handle.
        handle: u64,
    },
    /// `mmap` of the device file failed: an unknown handle, a second mapping of it, a size
    /// past the pin, or a process other than the one that opened the device.
    #[error("mapping {len} bytes of handle {handle:#x} failed: {source}")]
    Map {
        /// The pin being mapped.
        handle: u64,
        /// The length passed to `mmap` (the size rounded up to the host page), in bytes.
        len: usize,
        /// The error `mmap` returned.
        #[source]
        source: io::Error,
    },
    /// `GET_INFO_V2` returned a mapping type outside `GDR_MAPPING_TYPE_*` (0..=3); the value
    /// is the raw number.
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
///
/// # Examples
///
/// ```
/// use gdr::bar::gdrdrv::Version;
///
/// let v = Version(2 << 16 | 5);
/// assert_eq!((v.major(), v.minor()), (2, 5));
/// assert_eq!(v.to_string(), "2.5");
/// assert!(Version(2 << 16 | 4) < v && v < Version(3 << 16), "ordered as versions");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u32);

impl Version {
    /// The major version: the upper 16 bits.
    pub fn major(self) -> u32 {
        self.0 >> 16
    }
    /// The minor version: the lower 16 bits.
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
    /// The driver's own version (gdrcopy's release, 2.4 say).
    pub driver: Version,
    /// The oldest user-space API version the driver accepts; opening fails with
    /// [`GdrDrvError::ApiTooOld`] when it is newer than [`API_VERSION`].
    pub minimum_api: Version,
}

/// A pinned range's driver handle (also its mmap page offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// `PIN_BUFFER_V2` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PinFlags(pub u32);

impl PinFlags {
    /// No flag: the driver picks the path (BAR1 on PCIe, the coherent link on C2C platforms).
    /// The only value drivers older than 2.5 accept.
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
pub struct GdrDrvAttr(pub u32);

impl GdrDrvAttr {
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
    /// The CPU's TSC frequency in kHz as the driver reports it, to turn `tm_cycles` into time.
    pub tsc_khz: u32,
    /// TSC cycles the driver spent pinning (`nvidia_p2p_get_pages`).
    pub tm_cycles: u64,
    /// Current CPU mapping type (`None` when not mapped).
    pub mapping_type: MappingType,
}

/// An open gdrdrv: pins CUDA memory and maps it for the CPU.
///
/// The driver serves only the process that opened it; share a `GdrDrv` between threads freely
/// (it is `Sync` when the file is), but do not use it in a forked child.
///
/// # Examples
///
/// [`GdrDrv::open`] opens `/dev/gdrdrv`; each way it can fail is its own error, which says what
/// to do:
///
/// ```
/// use gdr::bar::{GdrDrv, GdrDrvError};
/// use std::path::Path;
///
/// let missing = GdrDrv::open_path(Path::new("/nonexistent/gdrdrv"));
/// assert!(matches!(missing, Err(GdrDrvError::NotLoaded { .. })));
/// // A file that is not the driver answers its first command (the version) with ENOTTY.
/// let not_gdrdrv = tempfile::NamedTempFile::new()?;
/// let e = GdrDrv::open_path(not_gdrdrv.path()).unwrap_err();
/// assert!(matches!(e, GdrDrvError::Unsupported { op: "GET_VERSION" }), "{e}");
/// # Ok::<(), std::io::Error>(())
/// ```
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
        let page = crate::page::host_page_size();
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
    pub fn get_attr(&self, attr: GdrDrvAttr) -> Result<u32, GdrDrvError> {
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
    /// [`GdrDrvPin::map`], which also ties it to the pin.
    ///
    /// # Safety
    /// `handle` must stay pinned until the mapping is dropped: the mapping borrows only the
    /// driver, and after an unpin it would point at GPU memory that may be reused.
    pub unsafe fn map(
        &self,
        handle: Handle,
        size: usize,
    ) -> Result<GdrDrvMapping<'_, F>, GdrDrvError> {
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
        Ok(GdrDrvMapping {
            drv: self,
            ptr,
            len,
            size,
            handle,
            _not_sync: PhantomData,
        })
    }

    /// Pins and returns a guard that unpins on drop; mappings made from it borrow it.
    pub fn pin(
        &self,
        addr: u64,
        size: u64,
        flags: PinFlags,
    ) -> Result<GdrDrvPin<'_, F>, GdrDrvError> {
        let handle = self.pin_buffer(addr, size, flags)?;
        Ok(GdrDrvPin {
            drv: self,
            handle,
            size,
        })
    }
}
