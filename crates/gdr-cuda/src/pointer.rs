//! Questions about an address of CUDA memory, and its dma-buf export: the pointer-attribute and
//! address-range calls, safe.

use super::{driver, sys, Result};
use std::os::fd::{FromRawFd, OwnedFd};

/// The `[base, base + size)` of the CUDA allocation containing `addr`
/// (`cuMemGetAddressRange`).
pub fn allocation_range(addr: u64) -> Result<(u64, u64)> {
    let d = driver()?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: out-pointers to live locals; the address is only looked up.
    d.check("cuMemGetAddressRange", unsafe {
        (d.api.mem_get_address_range)(&mut base, &mut size, addr)
    })?;
    Ok((base, size as u64))
}

/// CUDA's unique id of the allocation at `addr` (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): never reused
/// in the process, so a different id at the same address means the memory was reallocated.
/// `Ok(None)` when no allocation lives there (`CUDA_ERROR_INVALID_VALUE`).
pub fn buffer_id(addr: u64) -> Result<Option<u64>> {
    let d = driver()?;
    let mut id = 0u64;
    // SAFETY: the BUFFER_ID attribute is an unsigned long long written to the out-pointer.
    let rc = unsafe {
        (d.api.pointer_get_attribute)(
            (&mut id as *mut u64).cast(),
            sys::POINTER_ATTRIBUTE_BUFFER_ID,
            addr,
        )
    };
    match rc {
        sys::CUDA_ERROR_INVALID_VALUE => Ok(None),
        rc => d
            .check("cuPointerGetAttribute(BUFFER_ID)", rc)
            .map(|()| Some(id)),
    }
}

/// Makes CUDA memory operations on the allocation at `addr` synchronous
/// (`CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`), as the GPUDirect RDMA guide asks for memory that a
/// third party reads or writes.
pub fn set_sync_memops(addr: u64) -> Result<()> {
    let d = driver()?;
    let one: u32 = 1;
    // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int; `one` outlives the call.
    d.check("cuPointerSetAttribute(SYNC_MEMOPS)", unsafe {
        (d.api.pointer_set_attribute)(
            (&one as *const u32).cast(),
            sys::POINTER_ATTRIBUTE_SYNC_MEMOPS,
            addr,
        )
    })
}

/// A new dma-buf file descriptor for `[start, start + len)` of CUDA memory
/// (`cuMemGetHandleForAddressRange`); `pcie` asks for the PCIe (BAR1) mapping type. The range
/// must be host-page aligned.
pub fn dma_buf_fd(start: u64, len: u64, pcie: bool) -> Result<OwnedFd> {
    let d = driver()?;
    let flags = if pcie {
        sys::MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
    } else {
        0
    };
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: for the dma-buf handle type the out-parameter is an int.
    d.check("cuMemGetHandleForAddressRange", unsafe {
        (d.api.mem_get_handle_for_address_range)(
            (&mut fd as *mut std::ffi::c_int).cast(),
            start,
            len as usize,
            sys::MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            flags,
        )
    })?;
    // SAFETY: the driver returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
