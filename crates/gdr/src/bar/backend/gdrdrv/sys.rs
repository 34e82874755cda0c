//! gdrdrv's binary interface, as gdrcopy 2.x's `gdrdrv.h` defines it: the device path, ioctl
//! command numbers, parameter blocks and constants. Nothing here touches the device; the safe
//! handle in [`super`] does.

use std::ffi::c_void;

/// Where the driver's device node lives.
pub const DEVICE_PATH: &str = "/dev/gdrdrv";
/// The driver's ioctl type byte.
pub const IOCTL_MAGIC: u8 = 0xDA;
/// The user-space API version this module speaks (major << 16 | minor): gdrcopy 2.5's, the first
/// with `PIN_BUFFER_V2` and `REQ_MAPPING_TYPE`. The driver names the oldest it accepts.
pub const API_VERSION: u32 = (2 << 16) | 5;

/// `_IOWR(IOCTL_MAGIC, nr, T)`, encoded by rustix (which knows each architecture's `_IOC`
/// layout: PowerPC, MIPS and SPARC differ from the rest).
// rustix's `Opcode` is `u32` or `c_ulong` depending on its backend; gdrdrv's numbers fit 32 bits.
#[allow(clippy::unnecessary_cast)]
const fn iowr<T>(nr: u8) -> u32 {
    rustix::ioctl::opcode::read_write::<T>(IOCTL_MAGIC, nr) as u32
}

/// What the C header's pointer-typed commands encode as their size: they name a pointer type.
type Pointer = *mut c_void;

/// Command 1: pin a range (v1: with a P2P token and VA space, both 0 for CUDA memory). The only
/// command whose number encodes its real structure size (40).
pub const PIN_BUFFER: u32 = iowr::<PinBufferParams>(1);
/// Command 2: unpin.
pub const UNPIN_BUFFER: u32 = iowr::<Pointer>(2);
/// Command 3: whether the NVIDIA free callback fired for a pin.
pub const GET_CB_FLAG: u32 = iowr::<Pointer>(3);
/// Command 4: pin information, v1 layout.
pub const GET_INFO: u32 = iowr::<Pointer>(4);
/// Command 5: pin information with the mapping type (driver 2.4+).
pub const GET_INFO_V2: u32 = iowr::<Pointer>(5);
/// Command 6: a driver attribute (driver 2.4+).
pub const GET_ATTR: u32 = iowr::<Pointer>(6);
/// Command 7: pin with flags (driver 2.5+).
pub const PIN_BUFFER_V2: u32 = iowr::<Pointer>(7);
/// Command 8: ask for a CPU mapping type before `mmap` (driver 2.5+).
pub const REQ_MAPPING_TYPE: u32 = iowr::<Pointer>(8);
/// Command 255: driver version and the oldest API version it accepts.
pub const GET_VERSION: u32 = iowr::<Pointer>(255);

/// `PIN_BUFFER` parameters (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinBufferParams {
    /// In: the CUDA device virtual address where the range starts.
    pub addr: u64,
    /// In: the range's length in bytes (the driver rounds the range out to GPU pages).
    pub size: u64,
    /// In: the P2P token of `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS)`; 0 for
    /// memory of the CUDA driver API.
    pub p2p_token: u64,
    /// In: the VA space token that comes with `p2p_token`; 0 with it.
    pub va_space: u32,
    /// C's implicit padding, made explicit so every byte sent is defined.
    pub _pad: u32,
    /// Out: the driver's handle of the new pin (also its mmap page offset).
    pub handle: u64,
}

/// `UNPIN_BUFFER` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpinBufferParams {
    /// In: the handle `PIN_BUFFER`/`PIN_BUFFER_V2` returned.
    pub handle: u64,
}

/// `GET_CB_FLAG` parameters (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetCbFlagParams {
    /// In: the pin asked about.
    pub handle: u64,
    /// Out: non-zero once the NVIDIA driver's free callback has run for the pin (the memory
    /// was freed or its context destroyed while pinned).
    pub flag: u32,
    /// Explicit tail padding (sent as 0).
    pub _pad: u32,
}

/// `GET_INFO` parameters, v1 (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetInfoParams {
    /// In: the pin asked about.
    pub handle: u64,
    /// Out (as all fields below): the GPU virtual address where the pinned, GPU-page-rounded
    /// range starts.
    pub va: u64,
    /// Bytes pinned (a multiple of `page_size`).
    pub mapped_size: u64,
    /// The GPU page size of the pin in bytes (64 KiB on current GPUs).
    pub page_size: u32,
    /// The CPU's TSC frequency in kHz, to turn `tm_cycles` into time.
    pub tsc_khz: u32,
    /// TSC cycles the kernel spent in `nvidia_p2p_get_pages` for this pin.
    pub tm_cycles: u64,
    /// Non-zero while the pin is mapped by a process.
    pub mapped: u32,
    /// Non-zero if that mapping is write-combined (else cached).
    pub wc_mapping: u32,
}

/// `GET_INFO_V2` parameters (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetInfoV2Params {
    /// In: the pin asked about.
    pub handle: u64,
    /// Out (as all fields below): the GPU virtual address where the pinned, GPU-page-rounded
    /// range starts.
    pub va: u64,
    /// Bytes pinned (a multiple of `page_size`).
    pub mapped_size: u64,
    /// The GPU page size of the pin in bytes (64 KiB on current GPUs).
    pub page_size: u32,
    /// The CPU's TSC frequency in kHz, to turn `tm_cycles` into time.
    pub tsc_khz: u32,
    /// TSC cycles the kernel spent in `nvidia_p2p_get_pages` for this pin.
    pub tm_cycles: u64,
    /// The current CPU mapping type, `GDR_MAPPING_TYPE_*` (0 none, 1 write-combined,
    /// 2 cached, 3 device); [`super::MappingType`] decodes it.
    pub mapping_type: u32,
    /// Explicit tail padding.
    pub _pad: u32,
}

/// `GET_ATTR` parameters (8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetAttrParams {
    /// In: the attribute asked for, `GDRDRV_ATTR_*` ([`super::GdrDrvAttr`]).
    pub attr: u32,
    /// Out: the attribute's value.
    pub val: u32,
}

/// `PIN_BUFFER_V2` parameters (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinBufferV2Params {
    /// In: the CUDA device virtual address where the range starts.
    pub addr: u64,
    /// In: the range's length in bytes (the driver rounds the range out to GPU pages).
    pub size: u64,
    /// In: `GDR_PIN_FLAG_*` bits ([`super::PinFlags`]).
    pub flags: u32,
    /// C's implicit padding, made explicit so every byte sent is defined.
    pub pad: u32,
    /// Out: the driver's handle of the new pin (also its mmap page offset).
    pub handle: u64,
}

/// `REQ_MAPPING_TYPE` parameters (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqMappingTypeParams {
    /// In: the pin the next `mmap` will map.
    pub handle: u64,
    /// In: the `GDR_MAPPING_TYPE_*` wanted (0 lets the driver choose).
    pub mapping_type: u32,
    /// Explicit tail padding (sent as 0).
    pub _pad: u32,
}

/// `GET_VERSION` parameters (8 bytes, all out).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GetVersionParams {
    /// The driver's own version, `major << 16 | minor`.
    pub driver_version: u32,
    /// The oldest user-space API version the driver accepts, `major << 16 | minor`.
    pub minimum_api_version: u32,
}

/// A parameter block: plain integers with every padding byte spelled out as a field, so that
/// viewing it as bytes reads only initialised memory.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integer fields without implicit padding.
pub(super) unsafe trait Params: Copy {
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

// Each impl below holds for the same reason: the struct is repr(C) with u32/u64 fields only,
// and its size is asserted below to equal the sum of its fields, so there is no implicit
// padding.
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for PinBufferParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for UnpinBufferParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for GetCbFlagParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for GetInfoParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for GetInfoV2Params {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for GetAttrParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for PinBufferV2Params {}
// SAFETY: repr(C), integer fields, no padding (see above).
unsafe impl Params for ReqMappingTypeParams {}
// SAFETY: repr(C), integer fields, no padding (see above).
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
