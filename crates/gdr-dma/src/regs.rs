//! Register access. Engines talk to their hardware only through [`RegisterIo`], so a
//! behavioural model can stand in for the real BAR in tests and the driver logic runs unchanged.

use std::ptr::NonNull;

/// 32- and 64-bit register reads and writes at byte offsets into one register block.
///
/// Methods take `&self` because MMIO reads have side effects the type system cannot see anyway;
/// implementations that keep state (models) use interior mutability.
pub trait RegisterIo {
    /// Size of the register block in bytes.
    fn len(&self) -> u64;
    /// Reads the 32-bit register at byte `offset`.
    fn read32(&self, offset: u64) -> u32;
    /// Writes `value` to the 32-bit register at byte `offset`.
    fn write32(&self, offset: u64, value: u32);
    /// A 64-bit read. The default reads low then high half; MMIO does one 8-byte access, which
    /// devices with 64-bit registers (edu) need.
    fn read64(&self, offset: u64) -> u64 {
        u64::from(self.read32(offset)) | (u64::from(self.read32(offset + 4)) << 32)
    }
    /// A 64-bit write; the default writes low then high half.
    fn write64(&self, offset: u64, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
    /// Whether the block has no registers at all.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A mapped MMIO region (a BAR). Out-of-range or misaligned accesses behave like a PCIe master
/// abort (reads return all ones, writes are dropped) instead of panicking or touching memory
/// outside the mapping.
pub struct Mmio {
    base: NonNull<u8>,
    len: u64,
}

// SAFETY: an MMIO mapping is plain device memory addressed through volatile accesses; moving
// the handle to another thread does not change what any access does.
unsafe impl Send for Mmio {}

impl Mmio {
    /// Wraps a mapped register block.
    ///
    /// # Safety
    /// `base..base+len` must be a live mapping of device registers (or memory) for as long as the
    /// returned value exists, and nothing else may free it meanwhile.
    pub unsafe fn new(base: NonNull<u8>, len: u64) -> Self {
        Mmio { base, len }
    }

    fn in_range(&self, offset: u64, size: u64) -> bool {
        offset.is_multiple_of(size) && offset.checked_add(size).is_some_and(|end| end <= self.len)
    }
}

impl RegisterIo for Mmio {
    fn len(&self) -> u64 {
        self.len
    }

    fn read32(&self, offset: u64) -> u32 {
        if !self.in_range(offset, 4) {
            return u32::MAX;
        }
        // SAFETY: offset+4 <= len and offset is 4-byte aligned, so the access stays inside the
        // live mapping promised by `Mmio::new`; volatile because the device changes it.
        unsafe {
            self.base
                .as_ptr()
                .add(offset as usize)
                .cast::<u32>()
                .read_volatile()
        }
    }

    fn write32(&self, offset: u64, value: u32) {
        if !self.in_range(offset, 4) {
            return;
        }
        // SAFETY: as in `read32`: `in_range` checked that the 4-byte access is aligned and ends
        // inside the mapping, which `Mmio::new`'s caller keeps alive.
        unsafe {
            self.base
                .as_ptr()
                .add(offset as usize)
                .cast::<u32>()
                .write_volatile(value)
        }
    }

    fn read64(&self, offset: u64) -> u64 {
        if !self.in_range(offset, 8) {
            return u64::MAX;
        }
        // SAFETY: `in_range` checked that the 8-byte access is aligned and ends inside the
        // mapping, which `Mmio::new`'s caller keeps alive; volatile as the device changes it.
        unsafe {
            self.base
                .as_ptr()
                .add(offset as usize)
                .cast::<u64>()
                .read_volatile()
        }
    }

    fn write64(&self, offset: u64, value: u64) {
        if !self.in_range(offset, 8) {
            return;
        }
        // SAFETY: `in_range` checked that the 8-byte access is aligned and ends inside the
        // mapping, which `Mmio::new`'s caller keeps alive; volatile as the device changes it.
        unsafe {
            self.base
                .as_ptr()
                .add(offset as usize)
                .cast::<u64>()
                .write_volatile(value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmio_over_plain_memory_reads_back_and_rejects_out_of_range() {
        let mut backing = vec![0u64; 4];
        let base = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        {
            // SAFETY: `backing` is 32 bytes, outlives `mmio` (dropped at the end of this
            // block) and is not touched through any other reference meanwhile.
            let mmio = unsafe { Mmio::new(base, 32) };
            mmio.write32(4, 0xdead_beef);
            assert_eq!(mmio.read32(4), 0xdead_beef);
            mmio.write64(8, 0x0123_4567_89ab_cdef);
            assert_eq!(mmio.read64(8), 0x0123_4567_89ab_cdef);
            assert_eq!(mmio.read32(8), 0x89ab_cdef);
            // Beyond the end, straddling the end, misaligned: all-ones reads, dropped writes.
            assert_eq!(mmio.read32(32), u32::MAX);
            assert_eq!(mmio.read64(28), u64::MAX);
            assert_eq!(mmio.read32(2), u32::MAX);
            mmio.write32(30, 1);
            mmio.write32(u64::MAX - 1, 1);
        }
        assert_eq!(backing[0], 0xdead_beef_0000_0000);
        assert_eq!(backing[3], 0);
    }
}
