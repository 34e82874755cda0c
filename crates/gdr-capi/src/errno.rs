//! The errno each gdr error is answered with: one table per error type, so every entry point
//! that meets the same error returns the same number.

use gdr::bar::{BarError, PinError};
use gdr::peer::PeerError;
use std::ffi::c_int;

/// The errno `gdr_pin_buffer` returns for a failed pin (unless the `gdr_t` stages it: see
/// [`stageable`]):
/// - ENOTSUP: memory this backend cannot map (not exportable, or its dma-buf mmap refused), or
///   gdr's allocator says the range cannot be pinned;
/// - ENOMEM: memory ran out while gdr's allocator mapped the chunk that holds the range;
/// - EINVAL: a range that spans allocations or is not CUDA memory of this GPU, or another
///   refusal of gdr's allocator;
/// - EIO: anything else.
pub(crate) fn of_pin(e: &PinError) -> c_int {
    match e {
        PinError::NotExportable { .. } | PinError::MmapRefused { .. } => libc::ENOTSUP,
        PinError::Pool(p) if p.errno == libc::ENOMEM => libc::ENOMEM,
        PinError::Pool(p) if p.errno == libc::ENOTSUP => libc::ENOTSUP,
        PinError::Pool(_) => libc::EINVAL,
        PinError::Peer(PeerError::OutsideAllocation { .. }) => libc::EINVAL,
        PinError::Cuda(_) | PinError::Peer(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// Whether a pin that failed with `e` becomes a staged pin where the `gdr_t` stages (see the
/// `ucx` module): exactly the failures answered with ENOTSUP, memory that exists but cannot be
/// mapped here.
pub(crate) fn stageable(e: &PinError) -> bool {
    of_pin(e) == libc::ENOTSUP
}

/// The errno `gdr_alloc_mapped` returns for a failed allocation: ENOMEM when the GPU memory
/// (or its mappable part) is exhausted, EINVAL for a size Vulkan cannot lay out, else EIO.
pub(crate) fn of_alloc(e: &BarError) -> c_int {
    match e {
        BarError::OutOfMemory { .. } => libc::ENOMEM,
        BarError::BadLayout(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(errno: i32) -> PinError {
        PinError::Pool(gdr::bar::pool::PoolPinError {
            addr: 0x1000,
            size: 4096,
            errno,
        })
    }

    #[test]
    fn pin_errors_map_to_gdrcopys_errnos() {
        let not_exportable = PinError::NotExportable {
            addr: 0x1000,
            cumemcreate: false,
            why: "no POSIX fd".into(),
        };
        let refused = PinError::MmapRefused {
            errno: libc::ENOTSUP,
            driver: String::new(),
        };
        for (e, want) in [
            (not_exportable, libc::ENOTSUP),
            (refused, libc::ENOTSUP),
            (pool(libc::ENOMEM), libc::ENOMEM),
            (pool(libc::ENOTSUP), libc::ENOTSUP),
            (pool(libc::EINVAL), libc::EINVAL),
            (pool(libc::EIO), libc::EINVAL),
            (PinError::NoBackend("none".into()), libc::EIO),
            (PinError::AlreadyMapped, libc::EIO),
        ] {
            assert_eq!(of_pin(&e), want, "{e}");
            assert_eq!(stageable(&e), want == libc::ENOTSUP, "{e}");
        }
    }
}
