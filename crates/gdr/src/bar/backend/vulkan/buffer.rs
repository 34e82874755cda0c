//! [`MappedBuffer`]: a sub-allocation of a Vulkan block, at once a CUDA device pointer and a
//! write-combined CPU mapping. Kept here, next to the blocks it is cut from, because the two
//! need each other: a block hands out buffers, and a buffer returns its range to the block.

use super::{BarError, Block, PoolRef};
use crate::cuda::{self, DeviceMemory};
use gdr_mem::{Caching, MappedMemory};
use std::sync::Arc;

/// GPU memory with a CPU mapping: a CUDA device pointer and a write-combined BAR1 mapping of
/// the same bytes. Freed (returned to its block) on drop.
pub struct MappedBuffer {
    block: Arc<Block>,
    pool: Option<PoolRef>,
    offset: usize,
    len: usize,
    reserved: usize,
}

impl MappedBuffer {
    pub(super) fn new(
        block: Arc<Block>,
        pool: Option<PoolRef>,
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

    /// The buffer's size in bytes, as asked for (the reservation behind it is rounded up to
    /// 64-byte lines).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes; never true, since allocations of 0 bytes are refused.
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

    /// Reads `dst.len()` bytes at `offset` through the CPU mapping (stream loads).
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), BarError> {
        Ok(self.read_at(offset, dst)?)
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
