//! The few pieces of `<linux/vfio.h>` this crate uses, written out by hand (the ABI is stable).
//! All ioctls are `_IO(';', 100 + n)`: no size or direction bits, the argument is a pointer.

#![allow(dead_code)]

/// `_IO(';', 100 + nr)`, encoded by rustix.
const fn vfio_io(nr: u8) -> u64 {
    rustix::ioctl::opcode::none(b';', 100 + nr) as u64
}

pub const GET_API_VERSION: u64 = vfio_io(0);
pub const CHECK_EXTENSION: u64 = vfio_io(1);
pub const SET_IOMMU: u64 = vfio_io(2);
pub const GROUP_GET_STATUS: u64 = vfio_io(3);
pub const GROUP_SET_CONTAINER: u64 = vfio_io(4);
pub const GROUP_UNSET_CONTAINER: u64 = vfio_io(5);
pub const GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
pub const DEVICE_GET_INFO: u64 = vfio_io(7);
pub const DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
pub const DEVICE_GET_IRQ_INFO: u64 = vfio_io(9);
pub const DEVICE_SET_IRQS: u64 = vfio_io(10);
pub const DEVICE_RESET: u64 = vfio_io(11);
pub const IOMMU_GET_INFO: u64 = vfio_io(12);
pub const IOMMU_MAP_DMA: u64 = vfio_io(13);
pub const IOMMU_UNMAP_DMA: u64 = vfio_io(14);

pub const API_VERSION: i32 = 0;
pub const TYPE1_IOMMU: u64 = 1;
pub const TYPE1V2_IOMMU: u64 = 3;

pub const GROUP_FLAGS_VIABLE: u32 = 1;
pub const GROUP_FLAGS_CONTAINER_SET: u32 = 2;

pub const DEVICE_FLAGS_RESET: u32 = 1;
pub const DEVICE_FLAGS_PCI: u32 = 2;

pub const REGION_INFO_FLAG_READ: u32 = 1;
pub const REGION_INFO_FLAG_WRITE: u32 = 2;
pub const REGION_INFO_FLAG_MMAP: u32 = 4;

/// PCI region indices: BAR0..BAR5 are 0..5.
pub const PCI_ROM_REGION_INDEX: u32 = 6;
pub const PCI_CONFIG_REGION_INDEX: u32 = 7;

pub const PCI_INTX_IRQ_INDEX: u32 = 0;
pub const PCI_MSI_IRQ_INDEX: u32 = 1;
pub const PCI_MSIX_IRQ_INDEX: u32 = 2;

pub const IRQ_INFO_EVENTFD: u32 = 1;
pub const IRQ_SET_DATA_NONE: u32 = 1;
pub const IRQ_SET_DATA_EVENTFD: u32 = 4;
pub const IRQ_SET_ACTION_UNMASK: u32 = 16;
pub const IRQ_SET_ACTION_TRIGGER: u32 = 32;

pub const DMA_MAP_FLAG_READ: u32 = 1;
pub const DMA_MAP_FLAG_WRITE: u32 = 2;

pub const IOMMU_INFO_PGSIZES: u32 = 1;
pub const IOMMU_INFO_CAPS: u32 = 2;
pub const IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;

#[repr(C)]
#[derive(Default)]
pub struct GroupStatus {
    pub argsz: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Default)]
pub struct DeviceInfo {
    pub argsz: u32,
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

#[repr(C)]
#[derive(Default)]
pub struct RegionInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

#[repr(C)]
#[derive(Default)]
pub struct IrqInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub count: u32,
}

/// `vfio_irq_set` followed by one `s32` of data (an eventfd), which is all we ever pass.
#[repr(C)]
#[derive(Default)]
pub struct IrqSetOne {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub start: u32,
    pub count: u32,
    pub fd: i32,
}

#[repr(C)]
#[derive(Default)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub vaddr: u64,
    pub iova: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Default)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub iova: u64,
    pub size: u64,
}

/// `vfio_iommu_type1_info` header; capabilities follow it in the same buffer.
#[repr(C)]
#[derive(Default)]
pub struct IommuInfo {
    pub argsz: u32,
    pub flags: u32,
    pub iova_pgsizes: u64,
    pub cap_offset: u32,
    pub pad: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_and_layouts_match_the_kernel_header() {
        // Values as the C header computes them (_IO(';', 100) == 0x3b64).
        assert_eq!(GET_API_VERSION, 0x3b64);
        assert_eq!(SET_IOMMU, 0x3b66);
        assert_eq!(GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(IOMMU_UNMAP_DMA, 0x3b72);
        assert_eq!(std::mem::size_of::<RegionInfo>(), 32);
        assert_eq!(std::mem::size_of::<IrqSetOne>(), 24);
        assert_eq!(std::mem::size_of::<DmaMap>(), 32);
        assert_eq!(std::mem::size_of::<DmaUnmap>(), 24);
        assert_eq!(std::mem::size_of::<IommuInfo>(), 24);
    }
}
