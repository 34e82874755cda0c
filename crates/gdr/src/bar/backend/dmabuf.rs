//! Exporting CUDA memory as a dma-buf: the kernel-module-free way to hand GPU memory to another
//! device's driver (an RDMA NIC through `ibv_reg_dmabuf_mr`, an FPGA driver, VFIO).
//!
//! `cuMemGetHandleForAddressRange` wants a host-page-aligned pointer and size inside one
//! allocation. [`DmaBuf::export`] takes any range: it rounds out to host pages, clamped to the
//! allocation the range lies in (so rounding never reaches memory that is not the caller's),
//! and remembers where the caller's bytes sit in the exported range. It asks for a BAR1 (PCIe)
//! mapping first and falls back to the driver's choice when that is refused (some GPUs, the
//! H100 among them, answer `CUDA_ERROR_NOT_SUPPORTED`), saying which one it got.
//!
//! The same export is the dma-buf pin backend: the pin layer `mmap`s its descriptor for a CPU
//! mapping. Other devices' drivers get it through `gdr::peer`, which re-exports it.

use crate::cuda::{self, set_sync_memops, Context, CudaError, DeviceMemory};
use crate::page::host_page_size;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A CUDA call around the export failed (making the context current, or a range outside
    /// the [`DeviceMemory`] given, which is `CudaError::OutOfBounds`).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A range of 0 bytes was asked for; refused before calling the driver.
    #[error("nothing to export at {addr:#x}: size 0")]
    Empty {
        /// The range's start.
        addr: u64,
    },
    /// `cuMemGetAddressRange` does not know the address: it is not device memory of the
    /// current context.
    #[error("{addr:#x} is not CUDA device memory of the current context: {source}")]
    NotDeviceMemory {
        /// The address asked about.
        addr: u64,
        /// The driver's answer.
        #[source]
        source: CudaError,
    },
    /// The range leaves the allocation its start lies in; one dma-buf covers one allocation.
    #[error(
        "range {addr:#x}+{size:#x} runs past its allocation {base:#x}+{alloc_size:#x}: one \
         export covers one allocation"
    )]
    OutsideAllocation {
        /// The range's start.
        addr: u64,
        /// The range's length in bytes.
        size: u64,
        /// The start of the allocation `addr` lies in.
        base: u64,
        /// That allocation's size in bytes.
        alloc_size: u64,
    },
    /// `cuMemGetHandleForAddressRange` answered `CUDA_ERROR_NOT_SUPPORTED` without the PCIe
    /// flag too: this GPU, driver or kernel cannot export dma-bufs.
    #[error(
        "this GPU or driver cannot export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0 \
         or the call is refused): {0}"
    )]
    Unsupported(CudaError),
    /// `cuMemGetHandleForAddressRange` failed for the (host-page-rounded) range; out of BAR1
    /// space shows here ([`PeerError::is_out_of_memory`]).
    #[error("exporting {start:#x}+{len:#x} as a dma-buf failed: {source}")]
    Export {
        /// The rounded range's start, host-page aligned.
        start: u64,
        /// The rounded range's length in bytes, a multiple of the host page.
        len: u64,
        /// The driver's answer.
        #[source]
        source: CudaError,
    },
}

impl PeerError {
    /// Whether the driver ran out of memory or mapping space (BAR1) for the export.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            PeerError::Export { source, .. } | PeerError::Cuda(source) => source.is_out_of_memory(),
            _ => false,
        }
    }
}

/// How the exporter's importers will reach the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DmaBufMapping {
    /// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE`: through BAR1, as a PCIe peer sees it.
    Pcie,
    /// No flag: the driver's choice (BAR1 on discrete GPUs; a coherent path on C2C systems).
    Default,
}

impl fmt::Display for DmaBufMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DmaBufMapping::Pcie => "pcie",
            DmaBufMapping::Default => "default",
        })
    }
}

/// Set once the driver refused the PCIe mapping flag, so later exports skip the doomed call.
static PCIE_REFUSED: AtomicBool = AtomicBool::new(false);

/// The `[base, base + size)` of the CUDA allocation containing `addr`.
pub fn allocation_range(addr: u64) -> Result<(u64, u64), PeerError> {
    cuda::allocation_range(addr).map_err(|source| PeerError::NotDeviceMemory { addr, source })
}

/// A dma-buf file descriptor exported for a range of CUDA memory. The descriptor closes when
/// the value drops (importers that took their own reference keep the memory pinned).
pub struct DmaBuf {
    fd: OwnedFd,
    start: u64,
    len: u64,
    addr: u64,
    size: u64,
    mapping: DmaBufMapping,
    sync_memops: bool,
}

impl DmaBuf {
    /// Exports `[addr, addr + size)` of CUDA memory in `ctx` (made current here): rounded out to
    /// host pages inside its allocation.
    pub fn export(ctx: &Context, addr: u64, size: u64) -> Result<DmaBuf, PeerError> {
        Self::export_within(ctx, addr, size, addr, size)
    }

    /// Exports `mem[offset..offset + len]`.
    pub fn export_memory(
        mem: &impl DeviceMemory,
        ctx: &Context,
        offset: usize,
        len: usize,
    ) -> Result<DmaBuf, PeerError> {
        match offset.checked_add(len) {
            Some(end) if end <= mem.len() => {}
            _ => {
                return Err(PeerError::Cuda(CudaError::OutOfBounds {
                    what: "dma-buf export",
                    offset,
                    len,
                    size: mem.len(),
                }))
            }
        }
        Self::export(ctx, mem.device_ptr() + offset as u64, len as u64)
    }

    /// Exports as much of `[want_start, want_start + want_len)` as lies in the allocation of
    /// `[addr, addr + size)`, which it must contain (the registration cache asks for the
    /// 64 KiB-rounded range around a caller's request). Tries the whole wanted range first when
    /// it leaves the allocation, since neighbouring allocations then share one export, and
    /// clamps when the driver refuses.
    pub fn export_within(
        ctx: &Context,
        want_start: u64,
        want_len: u64,
        addr: u64,
        size: u64,
    ) -> Result<DmaBuf, PeerError> {
        if size == 0 {
            return Err(PeerError::Empty { addr });
        }
        ctx.bind()?;
        let (base, alloc_size) = allocation_range(addr)?;
        let alloc_end = base + alloc_size;
        let end = addr.checked_add(size).ok_or(PeerError::OutsideAllocation {
            addr,
            size,
            base,
            alloc_size,
        })?;
        if addr < base || end > alloc_end {
            return Err(PeerError::OutsideAllocation {
                addr,
                size,
                base,
                alloc_size,
            });
        }
        let page = host_page_size();
        let round = |s: u64, e: u64| (s & !(page - 1), e.div_ceil(page) * page);
        let want_end = want_start.saturating_add(want_len).max(end);
        let want_start = want_start.min(addr);
        let clamped = round(want_start.max(base), want_end.min(alloc_end));
        let whole = round(want_start, want_end);
        let sync_memops = set_sync_memops(addr).is_ok();
        if whole != clamped {
            if let Ok(buf) = Self::export_range(whole.0, whole.1, addr, size, sync_memops) {
                return Ok(buf);
            }
        }
        Self::export_range(clamped.0, clamped.1, addr, size, sync_memops)
    }

    fn export_range(
        start: u64,
        end: u64,
        addr: u64,
        size: u64,
        sync_memops: bool,
    ) -> Result<DmaBuf, PeerError> {
        let len = end - start;
        let call = |pcie: bool| cuda::dma_buf_fd(start, len, pcie);
        let mut mapping = DmaBufMapping::Default;
        let mut result = Err(None);
        if !PCIE_REFUSED.load(Ordering::Relaxed) {
            match call(true) {
                Ok(fd) => {
                    mapping = DmaBufMapping::Pcie;
                    result = Ok(fd);
                }
                Err(e)
                    if matches!(
                        e.code(),
                        Some(CudaError::NOT_SUPPORTED | CudaError::INVALID_VALUE)
                    ) =>
                {
                    // Refused as a flag, or the range itself is bad: the plain call tells.
                    if e.is_not_supported() {
                        PCIE_REFUSED.store(true, Ordering::Relaxed);
                    }
                }
                Err(e) => result = Err(Some(e)),
            }
        }
        let fd = match result {
            Ok(fd) => fd,
            Err(Some(source)) => return Err(PeerError::Export { start, len, source }),
            Err(None) => call(false).map_err(|source| {
                if source.is_not_supported() {
                    PeerError::Unsupported(source)
                } else {
                    PeerError::Export { start, len, source }
                }
            })?,
        };
        Ok(DmaBuf {
            fd,
            start,
            len,
            addr,
            size,
            mapping,
            sync_memops,
        })
    }

    /// The descriptor, for an importer (`ibv_reg_dmabuf_mr`, a driver's ioctl).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gives up ownership of the descriptor.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// GPU virtual address of the first exported byte (host-page aligned).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Bytes exported (a multiple of the host page).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing is exported; never true of a successful export (a size of 0 is
    /// refused with [`PeerError::Empty`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the caller's first byte is in the dma-buf (`addr - start`).
    pub fn offset(&self) -> u64 {
        self.addr - self.start
    }

    /// Where `addr` (inside the export) is in the dma-buf.
    pub fn offset_of(&self, addr: u64) -> Option<u64> {
        (addr >= self.start && addr < self.start + self.len).then(|| addr - self.start)
    }

    /// Whether `[addr, addr + size)` lies inside the export.
    pub fn covers(&self, addr: u64, size: u64) -> bool {
        addr >= self.start
            && addr
                .checked_add(size)
                .is_some_and(|e| e <= self.start + self.len)
    }

    /// The caller's address and size as asked.
    pub fn requested(&self) -> (u64, u64) {
        (self.addr, self.size)
    }

    /// Which mapping type the driver granted.
    pub fn mapping(&self) -> DmaBufMapping {
        self.mapping
    }

    /// Whether SYNC_MEMOPS could be set on the allocation (imported memory may refuse it).
    pub fn sync_memops(&self) -> bool {
        self.sync_memops
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("fd", &self.fd.as_raw_fd())
            .field("start", &format_args!("{:#x}", self.start))
            .field("len", &self.len)
            .field("offset", &self.offset())
            .field("mapping", &self.mapping)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_recognised() {
        let oom = PeerError::Export {
            start: 0,
            len: 4096,
            source: CudaError::Driver {
                call: "x",
                code: CudaError::OUT_OF_MEMORY,
                name: String::new(),
                text: String::new(),
            },
        };
        assert!(oom.is_out_of_memory());
        assert!(!PeerError::Empty { addr: 0 }.is_out_of_memory());
    }
}
