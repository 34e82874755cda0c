use super::*;
use crate::open::{no_backend_line, no_gpu_line};
use gdr::cuda::CudaError;
use std::ffi::{c_char, c_ulong, c_void};

#[test]
fn info_layouts_match_gdrcopy() {
    assert_eq!(std::mem::size_of::<GdrInfoV2>(), 48);
    assert_eq!(std::mem::offset_of!(GdrInfoV2, tm_cycles), 24);
    assert_eq!(std::mem::offset_of!(GdrInfoV2, cycles_per_ms), 32);
    assert_eq!(std::mem::offset_of!(GdrInfoV2, flags), 36);
    assert_eq!(std::mem::offset_of!(GdrInfoV2, mapping_type), 40);
    assert_eq!(std::mem::size_of::<GdrInfoV1>(), 40);
    assert_eq!(std::mem::offset_of!(GdrInfoV1, flags), 36);
    assert_eq!(std::mem::size_of::<GdrMh>(), 8);
}

#[test]
fn mapping_type_names_are_gdrcopys() {
    let mut p: *const c_char = std::ptr::null();
    let name = |p: *const c_char| {
        // SAFETY: the library hands out static NUL-terminated names.
        unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap()
    };
    for (t, want) in [
        (0, "None"),
        (1, "Write Combining"),
        (2, "Caching"),
        (3, "Device"),
    ] {
        // SAFETY: an out-pointer to a pointer.
        assert_eq!(unsafe { gdr_get_mapping_type_string(t, &mut p) }, 0);
        assert_eq!(name(p), want);
    }
    // SAFETY: an out-pointer to a pointer, then NULL (refused).
    unsafe {
        assert_eq!(gdr_get_mapping_type_string(4, &mut p), libc::EINVAL);
        assert_eq!(
            gdr_get_mapping_type_string(1, std::ptr::null_mut()),
            libc::EINVAL
        );
    }
}

#[test]
fn bad_handles_and_gdrs_are_refused() {
    let bogus = 0x1234usize as *mut c_void;
    let mh = GdrMh { h: 77 };
    assert_eq!(gdr_close(bogus), libc::EINVAL);
    assert_eq!(gdr_unpin_buffer(bogus, mh), libc::EINVAL);
    assert_eq!(gdr_free_mapped(bogus, mh), libc::EINVAL);
    let mut out = GdrMh { h: 0 };
    let mut info = GdrInfoV2::default();
    let mut v1 = GdrInfoV1::default();
    let mut va = std::ptr::null_mut();
    let buf = [0u8; 8];
    let mut back = [0u8; 8];
    let (mut flag, mut v) = (0, 0);
    let (mut a, mut b) = (0, 0);
    let mut d: c_ulong = 0;
    // SAFETY: every out-pointer is a reference to a local of its type (or NULL), and every
    // copy's host buffer holds the size given.
    unsafe {
        assert_eq!(
            gdr_pin_buffer(bogus, 0x1000, 4096, 0, 0, &mut out),
            libc::EINVAL
        );
        assert_eq!(
            gdr_pin_buffer_v2(bogus, 0x1000, 4096, 8, &mut out),
            libc::EINVAL
        );
        assert_eq!(gdr_get_info_v2(bogus, mh, &mut info), libc::EINVAL);
        assert_eq!(gdr_get_info(bogus, mh, &mut v1), libc::EINVAL);
        assert_eq!(gdr_map(bogus, mh, &mut va, 4096), libc::EINVAL);
        assert_eq!(gdr_map_v2(bogus, mh, &mut va, 4096, 2), libc::EINVAL);
        assert_eq!(gdr_unmap(bogus, mh, va, 4096), libc::EINVAL);
        assert_eq!(
            gdr_copy_to_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 8),
            libc::EINVAL
        );
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 8),
            libc::EINVAL
        );
        // Size 0 copies nothing, but the handle is checked all the same (it returned 0).
        assert_eq!(
            gdr_copy_to_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 0),
            libc::EINVAL
        );
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), buf.as_ptr().cast(), 0),
            libc::EINVAL
        );
        assert_eq!(gdr_get_callback_flag(bogus, mh, &mut flag), libc::EINVAL);
        assert_eq!(gdr_get_attribute(bogus, 1, &mut v), libc::EINVAL);
        assert_eq!(gdr_driver_get_version(bogus, &mut a, &mut b), libc::EINVAL);
        gdr_runtime_get_version(&mut a, &mut b);
        assert_eq!((a, b), (2, 6));
        assert_eq!(gdr_alloc_mapped(bogus, 64, &mut d, &mut out), libc::EINVAL);
        assert_eq!(
            gdr_alloc_mapped(bogus, 64, std::ptr::null_mut(), &mut out),
            libc::EINVAL
        );
    }
}

#[test]
fn open_failures_name_the_capability_and_the_node() {
    let icd = gdr::bar::BarError::NoIcd {
        why: "vkCreateInstance: no compatible Vulkan driver".into(),
        container: Some("/run/.containerenv exists".into()),
    };
    let line = no_backend_line(&icd);
    assert!(
        line.starts_with(
            "gdr_open: no backend works here: no NVIDIA Vulkan driver (ICD) found: \
             vkCreateInstance: no compatible Vulkan driver; this is a container \
             (/run/.containerenv exists)"
        ) && line.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics")
            && line.contains("VK_DRIVER_FILES"),
        "{line}"
    );
    let init = CudaError::Driver {
        call: "cuInit",
        code: 999,
        name: "CUDA_ERROR_UNKNOWN".into(),
        text: "unknown error".into(),
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("dev")).unwrap();
    for f in [".dockerenv", "dev/nvidiactl", "dev/nvidia0"] {
        std::fs::write(root.path().join(f), "").unwrap();
    }
    let no_env: [(&str, &str); 0] = [];
    let e = gdr::cuda::explain_init(init, &gdr::cuda::host::Host::at(root.path(), no_env));
    let line = no_gpu_line(0, &e);
    assert!(
        line.starts_with(
            "gdr_open: no usable GPU 0: cuInit failed: CUDA_ERROR_UNKNOWN (999): unknown error; \
             /dev/nvidia-uvm is missing: this container (/.dockerenv exists) was started without it"
        ) && line.ends_with("(--device /dev/nvidia-uvm)"),
        "{line}"
    );
}
