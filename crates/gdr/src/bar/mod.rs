//! CPU mappings of GPU memory through the GPU's BAR1.
//!
//! A [`MappedBuffer`] is GPU memory that is at once a CUDA device pointer and a
//! write-combined CPU mapping. The CPU pointer is never handed out as a Rust reference: reads
//! and writes go through [`MappedBuffer::write`] / [`MappedBuffer::read`] or the
//! [`MappedMemory`] trait it implements (the stream-store and stream-load routines of
//! [`crate::copy`]), and the buffer keeps its block — the mapping and
//! the memory behind it — alive, so no mapping can outlive its memory.
//!
//! [`auto`] picks the fastest way (stores through the mapping on 1..N threads, or the copy
//! engine) per direction and size for such buffers.

pub mod auto;
pub mod gdrdrv;
pub mod pin;
pub mod pool;
mod range_alloc;
pub mod vulkan;

pub use pin::{
    BackendStatus, PinBackend, PinError, Pinned, PinnedMapping, Pinner, VulkanImportOutcome,
};
pub use range_alloc::RangeAlloc;
pub use vulkan::{MappedImport, VulkanBackend, VulkanInfo};

use crate::cuda::{self, CudaError, DeviceMemory};
use gdr_mem::{check_range, AccessError, Caching, MappedMemory};
use std::sync::Arc;

/// Marks a fresh CPU mapping of GPU memory MADV_DONTFORK, so a forked child does not inherit
/// it: the child's copy would outlive the parent's control of the memory (the parent may unpin
/// or free it while the child still writes). A child that touches the address faults instead.
/// Best effort: a kernel that refuses leaves the mapping as it was.
pub(crate) fn keep_from_fork(ptr: *mut u8, len: usize) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize).saturating_add(len).next_multiple_of(page);
    // SAFETY: madvise only changes the fork behaviour of our own mapping's pages.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTFORK) };
}

/// Errors from the BAR-mapping backends. Each says what is missing and how to get it.
#[derive(Debug, thiserror::Error)]
pub enum BarError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(
        "the Vulkan loader (libvulkan.so.1) is not installed ({0}); install the libvulkan1 \
         package"
    )]
    NoLoader(String),
    #[error(
        "no NVIDIA Vulkan driver (ICD) found: {0}; install the NVIDIA driver's Vulkan part \
         (nvidia_icd.json, e.g. libnvidia-gl-<version>) or point VK_DRIVER_FILES at its ICD file"
    )]
    NoIcd(String),
    #[error(
        "Vulkan does not list the CUDA device (it sees: {seen}); is the NVIDIA ICD the one in use?"
    )]
    DeviceNotFound { seen: String },
    #[error(
        "the GPU offers no DEVICE_LOCAL|HOST_VISIBLE memory to Vulkan: BAR1 is not mappable; \
         enable resizable BAR (Above 4G decoding) in the firmware"
    )]
    NoHostVisibleVram,
    #[error(
        "out of BAR-mappable GPU memory allocating {size} bytes (host-visible heap is {heap} bytes)"
    )]
    OutOfMemory { size: usize, heap: u64 },
    #[error("CUDA cannot import the Vulkan memory ({0}); CUDA-Vulkan interop is unavailable")]
    NoInterop(String),
    #[error("Vulkan call {call} failed: {result}")]
    Vulkan {
        call: &'static str,
        result: ash::vk::Result,
    },
    #[error("bad allocation request: {0}")]
    BadLayout(String),
    #[error("mapped buffer: {0}")]
    Access(#[from] AccessError),
}

/// GPU memory with a CPU mapping: a CUDA device pointer and a write-combined BAR1 mapping of
/// the same bytes. Freed (returned to its block) on drop.
pub struct MappedBuffer {
    block: Arc<vulkan::Block>,
    pool: Option<vulkan::PoolRef>,
    offset: usize,
    len: usize,
    reserved: usize,
}

impl MappedBuffer {
    fn new(
        block: Arc<vulkan::Block>,
        pool: Option<vulkan::PoolRef>,
        offset: usize,
        len: usize,
        reserved: usize,
    ) -> Self {
        MappedBuffer {
            block,
            pool,
            offset,
            len,
            reserved,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA context the device pointer belongs to.
    pub fn context(&self) -> &cuda::Context {
        self.block.context()
    }

    /// Writes `src` at `offset` through the CPU mapping (stream stores + store fence): when it
    /// returns, the bytes are visible to work the GPU starts afterwards.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), BarError> {
        Ok(self.write_at(offset, src)?)
    }

    /// Like [`write`](Self::write) but split across `threads` CPU threads (bulk copies).
    pub fn write_parallel(
        &self,
        offset: usize,
        src: &[u8],
        threads: usize,
    ) -> Result<(), BarError> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: the range is inside this buffer's part of the mapping (checked), which stays
        // mapped while self holds the block.
        unsafe { crate::copy::copy_to_mapping_parallel(self.host_ptr().add(offset), src, threads) };
        Ok(())
    }

    /// Reads `dst.len()` bytes at `offset` through the CPU mapping (stream loads).
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), BarError> {
        Ok(self.read_at(offset, dst)?)
    }

    /// Like [`read`](Self::read) but split across `threads` CPU threads.
    pub fn read_parallel(
        &self,
        offset: usize,
        dst: &mut [u8],
        threads: usize,
    ) -> Result<(), BarError> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the range is inside the buffer; the aligned 64-byte lines around it are
        // inside the block's page-granular mapping, which the copy routine may read.
        unsafe {
            crate::copy::copy_from_mapping_parallel(dst, self.host_ptr().add(offset), threads)
        };
        Ok(())
    }

    /// The CPU address of the first byte. Valid only while `self` lives; for code that shares
    /// words with GPU threads (flags, rings) through volatile accesses.
    pub fn host_ptr(&self) -> *mut u8 {
        // SAFETY: offset lies inside the block's mapping.
        unsafe { self.block.host_base().add(self.offset) }
    }
}

// SAFETY: host_ptr..+len is this buffer's part of the block's mapping, which stays mapped (at
// that address) while self holds the block; the mapping is page-granular, so the lines around
// the range are readable; no Rust reference to the bytes is ever handed out.
unsafe impl MappedMemory for MappedBuffer {
    #[inline]
    fn cpu_ptr(&self) -> *mut u8 {
        self.host_ptr()
    }
    #[inline]
    fn size(&self) -> usize {
        self.len
    }
    #[inline]
    fn caching(&self) -> Caching {
        Caching::WriteCombined
    }
}

impl DeviceMemory for MappedBuffer {
    fn device_ptr(&self) -> u64 {
        self.block.device_base() + self.offset as u64
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for MappedBuffer {
    fn drop(&mut self) {
        let emptied = self.block.release(self.offset, self.reserved);
        if emptied {
            if let Some(pool) = self.pool.as_ref().and_then(|w| w.upgrade()) {
                pool.block_emptied(&self.block);
            }
        }
    }
}

impl std::fmt::Debug for MappedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBuffer")
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len)
            .finish()
    }
}
