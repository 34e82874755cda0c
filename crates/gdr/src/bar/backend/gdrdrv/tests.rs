//! The ABI's numbers and layouts, checked against hand-computed values.

use super::*;
use std::mem::{offset_of, size_of};

#[test]
fn command_numbers_match_hand_computed_values() {
    // dir 3 (read|write) << 30 | size << 16 | 0xDA << 8 | nr
    assert_eq!(PIN_BUFFER, 0xC028_DA01); // size 40: the whole struct
    assert_eq!(UNPIN_BUFFER, 0xC008_DA02); // size 8: a pointer
    assert_eq!(GET_CB_FLAG, 0xC008_DA03);
    assert_eq!(GET_INFO, 0xC008_DA04);
    assert_eq!(GET_INFO_V2, 0xC008_DA05);
    assert_eq!(GET_ATTR, 0xC008_DA06);
    assert_eq!(PIN_BUFFER_V2, 0xC008_DA07);
    assert_eq!(REQ_MAPPING_TYPE, 0xC008_DA08);
    assert_eq!(GET_VERSION, 0xC008_DAFF);
}

/// The `_IOC` encoding the numbers rely on (rustix's), field by field, on the common layout.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
#[allow(clippy::unnecessary_cast)]
fn ioc_encodes_each_field() {
    use rustix::ioctl::{opcode::from_components, Direction};
    let ioc = |dir, ty, nr, size| from_components(dir, ty, nr, size) as u32;
    assert_eq!(ioc(Direction::None, 0, 0, 0), 0);
    assert_eq!(ioc(Direction::Write, 0, 0, 0), 0x4000_0000);
    assert_eq!(ioc(Direction::Read, 0, 0, 0), 0x8000_0000);
    assert_eq!(ioc(Direction::None, 0xAB, 0, 0), 0xAB00);
    assert_eq!(ioc(Direction::None, 0, 0x7F, 0), 0x7F);
    assert_eq!(ioc(Direction::None, 0, 0, 0x3FFF), 0x3FFF_0000);
    // Sizes wider than the field are truncated, as the C macro's users see.
    assert_eq!(ioc(Direction::None, 0, 0, 0x4001), 0x0001_0000);
    // A well-known number from <linux/fs.h>: BLKGETSIZE64 = _IOR(0x12, 114, size_t).
    assert_eq!(ioc(Direction::Read, 0x12, 114, 8), 0x8008_1272);
}

#[test]
fn struct_sizes() {
    assert_eq!(size_of::<PinBufferParams>(), 40);
    assert_eq!(size_of::<UnpinBufferParams>(), 8);
    assert_eq!(size_of::<GetCbFlagParams>(), 16);
    assert_eq!(size_of::<GetInfoParams>(), 48);
    assert_eq!(size_of::<GetInfoV2Params>(), 48);
    assert_eq!(size_of::<GetAttrParams>(), 8);
    assert_eq!(size_of::<PinBufferV2Params>(), 32);
    assert_eq!(size_of::<ReqMappingTypeParams>(), 16);
    assert_eq!(size_of::<GetVersionParams>(), 8);
}

#[test]
fn field_offsets() {
    assert_eq!(offset_of!(PinBufferParams, addr), 0);
    assert_eq!(offset_of!(PinBufferParams, size), 8);
    assert_eq!(offset_of!(PinBufferParams, p2p_token), 16);
    assert_eq!(offset_of!(PinBufferParams, va_space), 24);
    assert_eq!(offset_of!(PinBufferParams, handle), 32);

    assert_eq!(offset_of!(UnpinBufferParams, handle), 0);

    assert_eq!(offset_of!(GetCbFlagParams, handle), 0);
    assert_eq!(offset_of!(GetCbFlagParams, flag), 8);

    assert_eq!(offset_of!(GetInfoParams, handle), 0);
    assert_eq!(offset_of!(GetInfoParams, va), 8);
    assert_eq!(offset_of!(GetInfoParams, mapped_size), 16);
    assert_eq!(offset_of!(GetInfoParams, page_size), 24);
    assert_eq!(offset_of!(GetInfoParams, tsc_khz), 28);
    assert_eq!(offset_of!(GetInfoParams, tm_cycles), 32);
    assert_eq!(offset_of!(GetInfoParams, mapped), 40);
    assert_eq!(offset_of!(GetInfoParams, wc_mapping), 44);

    assert_eq!(offset_of!(GetInfoV2Params, handle), 0);
    assert_eq!(offset_of!(GetInfoV2Params, va), 8);
    assert_eq!(offset_of!(GetInfoV2Params, mapped_size), 16);
    assert_eq!(offset_of!(GetInfoV2Params, page_size), 24);
    assert_eq!(offset_of!(GetInfoV2Params, tsc_khz), 28);
    assert_eq!(offset_of!(GetInfoV2Params, tm_cycles), 32);
    assert_eq!(offset_of!(GetInfoV2Params, mapping_type), 40);

    assert_eq!(offset_of!(GetAttrParams, attr), 0);
    assert_eq!(offset_of!(GetAttrParams, val), 4);

    assert_eq!(offset_of!(PinBufferV2Params, addr), 0);
    assert_eq!(offset_of!(PinBufferV2Params, size), 8);
    assert_eq!(offset_of!(PinBufferV2Params, flags), 16);
    assert_eq!(offset_of!(PinBufferV2Params, pad), 20);
    assert_eq!(offset_of!(PinBufferV2Params, handle), 24);

    assert_eq!(offset_of!(ReqMappingTypeParams, handle), 0);
    assert_eq!(offset_of!(ReqMappingTypeParams, mapping_type), 8);

    assert_eq!(offset_of!(GetVersionParams, driver_version), 0);
    assert_eq!(offset_of!(GetVersionParams, minimum_api_version), 4);
}

#[test]
fn params_bytes_are_the_struct() {
    let mut p = PinBufferV2Params {
        addr: 0x1122_3344_5566_7788,
        size: 0x10000,
        flags: 1,
        pad: 0,
        handle: 0,
    };
    let bytes = p.as_bytes_mut();
    assert_eq!(bytes.len(), 32);
    assert_eq!(&bytes[0..8], &0x1122_3344_5566_7788u64.to_ne_bytes());
    bytes[24..32].copy_from_slice(&42u64.to_ne_bytes());
    assert_eq!(p.handle, 42);
}

#[test]
fn versions_print_as_major_minor() {
    assert_eq!(Version(API_VERSION).to_string(), "2.5");
    assert_eq!(Version((2 << 16) | 4).major(), 2);
    assert_eq!(Version((2 << 16) | 4).minor(), 4);
    assert!(Version((2 << 16) | 10) > Version((2 << 16) | 5));
}
