//! gdrapi.h's handle type and constants: mapping types and flags, attributes, the pin flag,
//! the API version, and the numbers of gdr's backends.

use gdr::bar::PinBackend;
use std::ffi::{c_int, c_uint, c_ulong};

/// `gdr_mh_t`: a pin or allocation handle, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrMh {
    /// The handle's number in the process-wide table: a counter value from 1 up, never
    /// handed out twice (0 is never a handle).
    pub h: c_ulong,
}

/// `GDR_MAPPING_TYPE_NONE`: the handle is not mapped.
pub const MAPPING_TYPE_NONE: c_uint = 0;
/// `GDR_MAPPING_TYPE_WC`: write-combined, the type of every mapping gdr makes.
pub const MAPPING_TYPE_WC: c_uint = 1;
/// `GDR_MAPPING_TYPE_CACHING`: gdrcopy's cached mapping; gdr never makes one (only
/// `gdr_get_mapping_type_string` knows it).
pub const MAPPING_TYPE_CACHING: c_uint = 2;
/// `GDR_MAPPING_TYPE_DEVICE`: gdrcopy's device (uncached) mapping; gdr never makes one (only
/// `gdr_get_mapping_type_string` knows it).
pub const MAPPING_TYPE_DEVICE: c_uint = 3;
/// `GDR_MAP_FLAG_DEFAULT`: the library's own choice of mapping, write-combined here.
pub const MAP_FLAG_DEFAULT: c_int = 0;
/// `GDR_MAP_FLAG_REQ_WC_MAPPING`: a write-combined mapping, granted; `gdr_map_v2` refuses the
/// caching and device requests (2, 3) with EINVAL, as gdrcopy's dma-buf backend does.
pub const MAP_FLAG_REQ_WC_MAPPING: c_int = 1;
/// `GDR_ATTR_USE_PERSISTENT_MAPPING`: whether pins hold the memory until unpinned; gdrdrv's
/// answer on that backend, 1 on dma-buf and Vulkan.
pub const ATTR_USE_PERSISTENT_MAPPING: c_int = 1;
/// `GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE`: whether [`PIN_FLAG_FORCE_PCIE`] is honoured;
/// gdrdrv's answer on that backend, 1 on dma-buf and Vulkan (every mapping of a discrete GPU
/// on an x86 host is BAR1 over PCIe).
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int = 2;
/// `GDR_ATTR_USING_DMA_BUF_MMAP`: 1 on the dma-buf backend, 0 on gdrdrv and Vulkan.
pub const ATTR_USING_DMA_BUF_MMAP: c_int = 3;
/// gdr extension, `GDR_ATTR_GDR_BACKEND`: which backend a `gdr_t` pins with, as
/// [`backend_code`] numbers them (`GDR_GDR_BACKEND_GDRDRV`, `_DMABUF`, `_VULKAN`).
pub const ATTR_GDR_BACKEND: c_int = 0x1000;
/// `GDR_PIN_FLAG_FORCE_PCIE`, the one flag `gdr_pin_buffer_v2` accepts (what every mapping is
/// anyway); any other bit is EINVAL.
pub const PIN_FLAG_FORCE_PCIE: u32 = 1;
/// `GDR_API_MAJOR_VERSION`: the gdrcopy API major version implemented, 2.
pub const API_MAJOR: c_int = 2;
/// `GDR_API_MINOR_VERSION`: the gdrcopy API minor version implemented, 6.
pub const API_MINOR: c_int = 6;
/// What `gdr_driver_get_version` answers on the backends without a kernel module: the gdrdrv
/// interface level they implement (see the header).
pub const USER_SPACE_DRIVER_VERSION: (c_int, c_int) = (2, 6);

/// The `GDR_GDR_BACKEND_*` number of a backend, what `gdr_get_attribute` answers for
/// [`ATTR_GDR_BACKEND`]: 1 gdrdrv, 2 dma-buf, 3 Vulkan.
pub fn backend_code(b: PinBackend) -> c_int {
    match b {
        PinBackend::GdrDrv => 1,
        PinBackend::DmaBuf => 2,
        PinBackend::Vulkan => 3,
    }
}
