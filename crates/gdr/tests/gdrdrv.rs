//! `GdrDrv` against a stand-in for the gdrdrv kernel driver, and against real files for its
//! error paths.
//!
//! No CUSE here (no /dev/cuse, no modprobe), so the stand-in is a `DeviceFile` that behaves as
//! gdrdrv's ioctl and mmap handlers do: it matches command numbers exactly (written out by hand
//! below, not taken from the library), copies in and out the parameter block at offsets written
//! out by hand, enforces the driver's rules (one mapping per pin, no mapping after the free
//! callback, mapping no larger than the pin, same process only), and maps anonymous memory
//! filled with a pattern derived from the pinned GPU address, so a test can tell which pin a
//! mapping shows.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

use gdr::bar::gdrdrv::{
    DeviceFile, GdrDrv, GdrDrvAttr, GdrDrvError, Handle, MappingType, PinFlags, Version,
    API_VERSION,
};
use rand::Rng;

/// `GdrDrv::map` on the stand-in driver.
fn map_raw<F: DeviceFile>(
    drv: &GdrDrv<F>,
    h: Handle,
    size: usize,
) -> Result<gdr::bar::gdrdrv::GdrDrvMapping<'_, F>, GdrDrvError> {
    // SAFETY: the stand-in backs its "BAR" with its own memory, which an unpin does not free,
    // so a mapping outliving its pin here reads stale test bytes, nothing worse.
    unsafe { drv.map(h, size) }
}

// The driver's command numbers, computed by hand: 0xC0000000 (read|write) | size << 16 |
// 0xDA << 8 | nr, size 40 for PIN_BUFFER and 8 (a pointer) for the rest.
const PIN_BUFFER: u32 = 0xC028_DA01;
const UNPIN_BUFFER: u32 = 0xC008_DA02;
const GET_CB_FLAG: u32 = 0xC008_DA03;
const GET_INFO: u32 = 0xC008_DA04;
const GET_INFO_V2: u32 = 0xC008_DA05;
const GET_ATTR: u32 = 0xC008_DA06;
const PIN_BUFFER_V2: u32 = 0xC008_DA07;
const REQ_MAPPING_TYPE: u32 = 0xC008_DA08;
const GET_VERSION: u32 = 0xC008_DAFF;

const GPU_PAGE: u64 = 1 << 16;
/// The fake's "GPU memory": pins outside it are refused, as nvidia_p2p_get_pages refuses
/// addresses that are not CUDA memory.
const GPU_BASE: u64 = 0x7f00_0000_0000;
const GPU_SIZE: u64 = 1 << 30;
const SALT: u64 = 0x9e37_79b9_7f4a_7c15;

fn host_page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

#[derive(Debug, Clone)]
struct FakePin {
    va: u64,
    size: u64,
    cb_flag: bool,
    requested_type: u32,
    mapping_type: u32,
}

#[derive(Debug)]
struct State {
    driver_version: u32,
    minimum_api: u32,
    /// Driver 2.5+: PIN_BUFFER_V2 and REQ_MAPPING_TYPE.
    has_v2_pin: bool,
    /// Driver 2.4+: GET_INFO_V2 and GET_ATTR.
    has_v2_info: bool,
    /// The caller is not the process that opened the device.
    other_process: bool,
    next_handle: u64,
    pins: HashMap<u64, FakePin>,
    /// Live mappings: address -> (handle, len).
    mappings: HashMap<usize, (u64, usize)>,
    /// Every command number received, in order.
    requests: Vec<u32>,
    /// The last PIN_BUFFER(_V2) block as the driver read it.
    last_pin: Vec<u8>,
}

struct FakeGdrdrv {
    st: Mutex<State>,
}

impl FakeGdrdrv {
    fn new() -> Self {
        Self::with_version((2 << 16) | 5, true, true)
    }

    fn with_version(driver_version: u32, has_v2_pin: bool, has_v2_info: bool) -> Self {
        Self {
            st: Mutex::new(State {
                driver_version,
                minimum_api: 2 << 16,
                has_v2_pin,
                has_v2_info,
                other_process: false,
                next_handle: 1,
                pins: HashMap::new(),
                mappings: HashMap::new(),
                requests: Vec::new(),
                last_pin: Vec::new(),
            }),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap()
    }

    /// What the NVIDIA free callback does: the memory went away under the pin.
    fn fire_callback(&self, handle: Handle) {
        self.st().pins.get_mut(&handle.0).unwrap().cb_flag = true;
    }
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

impl State {
    fn pin(&mut self, addr: u64, size: u64) -> io::Result<u64> {
        let end = addr.checked_add(size).ok_or(errno(libc::EINVAL))?;
        if size == 0 || addr < GPU_BASE || end > GPU_BASE + GPU_SIZE {
            return Err(errno(libc::EINVAL));
        }
        let va = addr & !(GPU_PAGE - 1);
        let rounded = (end + GPU_PAGE - 1) & !(GPU_PAGE - 1);
        let handle = self.next_handle;
        self.next_handle += 1;
        self.pins.insert(
            handle,
            FakePin {
                va,
                size: rounded - va,
                cb_flag: false,
                requested_type: 0,
                mapping_type: 0,
            },
        );
        Ok(handle)
    }

    fn pin_of(&self, handle: u64) -> io::Result<&FakePin> {
        self.pins.get(&handle).ok_or(errno(libc::EINVAL))
    }
}

impl DeviceFile for FakeGdrdrv {
    unsafe fn ioctl(&self, request: u32, arg: &mut [u8]) -> io::Result<()> {
        let mut st = self.st();
        st.requests.push(request);
        if (request >> 8) & 0xff != 0xDA {
            return Err(errno(libc::EINVAL));
        }
        if st.other_process {
            return Err(errno(libc::EACCES));
        }
        // copy_from_user of the driver's own struct size: a shorter block would fault.
        let need = match request {
            PIN_BUFFER => 40,
            GET_INFO | GET_INFO_V2 => 48,
            PIN_BUFFER_V2 => 32,
            GET_CB_FLAG | REQ_MAPPING_TYPE => 16,
            UNPIN_BUFFER | GET_ATTR | GET_VERSION => 8,
            _ => return Err(errno(libc::ENOTTY)),
        };
        if arg.len() < need {
            return Err(errno(libc::EFAULT));
        }
        match request {
            GET_VERSION => {
                put_u32(arg, 0, st.driver_version);
                put_u32(arg, 4, st.minimum_api);
            }
            PIN_BUFFER => {
                st.last_pin = arg[..40].to_vec();
                let (addr, size) = (get_u64(arg, 0), get_u64(arg, 8));
                if get_u64(arg, 16) != 0 || get_u32(arg, 24) != 0 {
                    return Err(errno(libc::EINVAL)); // tokens are for the legacy UVA path
                }
                let handle = st.pin(addr, size)?;
                put_u64(arg, 32, handle);
            }
            PIN_BUFFER_V2 if st.has_v2_pin => {
                st.last_pin = arg[..32].to_vec();
                let (addr, size, flags) = (get_u64(arg, 0), get_u64(arg, 8), get_u32(arg, 16));
                if flags & !1 != 0 || get_u32(arg, 20) != 0 {
                    return Err(errno(libc::EINVAL));
                }
                let handle = st.pin(addr, size)?;
                put_u64(arg, 24, handle);
            }
            UNPIN_BUFFER => {
                let handle = get_u64(arg, 0);
                st.pins.remove(&handle).ok_or(errno(libc::EINVAL))?;
            }
            GET_CB_FLAG => {
                let flag = st.pin_of(get_u64(arg, 0))?.cb_flag;
                put_u32(arg, 8, flag.into());
            }
            GET_INFO | GET_INFO_V2 => {
                if request == GET_INFO_V2 && !st.has_v2_info {
                    return Err(errno(libc::ENOTTY));
                }
                let pin = st.pin_of(get_u64(arg, 0))?.clone();
                put_u64(arg, 8, pin.va);
                put_u64(arg, 16, pin.size);
                put_u32(arg, 24, GPU_PAGE as u32);
                put_u32(arg, 28, 2_000_000);
                put_u64(arg, 32, 12_345);
                if request == GET_INFO_V2 {
                    put_u32(arg, 40, pin.mapping_type);
                } else {
                    put_u32(arg, 40, (pin.mapping_type != 0).into());
                    put_u32(arg, 44, (pin.mapping_type == 1).into());
                }
            }
            GET_ATTR if st.has_v2_info => {
                let val = match get_u32(arg, 0) {
                    1 => 0,
                    2 => 1,
                    _ => return Err(errno(libc::EINVAL)),
                };
                put_u32(arg, 4, val);
            }
            REQ_MAPPING_TYPE if st.has_v2_pin => {
                let (handle, ty) = (get_u64(arg, 0), get_u32(arg, 8));
                if ty > 3 {
                    return Err(errno(libc::EINVAL));
                }
                st.pins
                    .get_mut(&handle)
                    .ok_or(errno(libc::EINVAL))?
                    .requested_type = ty;
            }
            _ => return Err(errno(libc::ENOTTY)),
        }
        Ok(())
    }

    fn mmap(&self, len: usize, offset: u64) -> io::Result<NonNull<u8>> {
        let page = host_page() as u64;
        let mut st = self.st();
        if st.other_process {
            return Err(errno(libc::EACCES));
        }
        if !offset.is_multiple_of(page) || len == 0 || !len.is_multiple_of(page as usize) {
            return Err(errno(libc::EINVAL));
        }
        let handle = offset / page;
        let pin = st.pin_of(handle)?.clone();
        let already = st.mappings.values().any(|&(h, _)| h == handle);
        if already || pin.cb_flag || len as u64 > pin.size {
            return Err(errno(libc::EINVAL));
        }
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address overlaps nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // "GPU memory": every 8-byte word holds its GPU address, salted.
        let words = ptr.cast::<u64>();
        for i in 0..len / 8 {
            // SAFETY: the mapping is `len` bytes, page aligned, and ours alone.
            unsafe { words.add(i).write((pin.va + 8 * i as u64) ^ SALT) };
        }
        let ty = if pin.requested_type == 0 {
            1
        } else {
            pin.requested_type
        };
        st.pins.get_mut(&handle).unwrap().mapping_type = ty;
        st.mappings.insert(ptr as usize, (handle, len));
        Ok(NonNull::new(ptr.cast()).unwrap())
    }

    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> io::Result<()> {
        let mut st = self.st();
        let Some((handle, mapped)) = st.mappings.remove(&(ptr.as_ptr() as usize)) else {
            return Err(errno(libc::EINVAL));
        };
        assert_eq!(mapped, len, "unmapping a different length than mapped");
        // The driver's vma close: the pin (if still there) is no longer mapped.
        if let Some(pin) = st.pins.get_mut(&handle) {
            pin.mapping_type = 0;
        }
        // SAFETY: this is the anonymous mapping `mmap` made, and the caller is done with it.
        if unsafe { libc::munmap(ptr.as_ptr().cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn open_fake(fake: FakeGdrdrv) -> GdrDrv<FakeGdrdrv> {
    GdrDrv::with_file(fake).unwrap()
}

fn random_range(rng: &mut impl Rng) -> (u64, u64) {
    let addr = GPU_BASE + rng.gen_range(0..GPU_SIZE / 2);
    let size = rng.gen_range(1..4 * GPU_PAGE);
    (addr, size)
}

#[test]
fn opening_reads_the_version() {
    let drv = open_fake(FakeGdrdrv::new());
    let v = drv.version();
    assert_eq!(
        (v.driver, v.minimum_api),
        (Version((2 << 16) | 5), Version(2 << 16))
    );
    assert_eq!(v.driver.to_string(), "2.5");
    assert_eq!(drv.file().st().requests, vec![GET_VERSION]);
}

#[test]
fn a_driver_demanding_a_newer_api_is_refused() {
    let fake = FakeGdrdrv::new();
    fake.st().minimum_api = (3 << 16) | 1;
    let err = GdrDrv::with_file(fake).unwrap_err();
    assert!(matches!(err, GdrDrvError::ApiTooOld { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "gdrdrv 2.5 requires API version 3.1 or newer; this library speaks 2.5"
    );
    let fake = FakeGdrdrv::new();
    fake.st().minimum_api = API_VERSION;
    assert!(GdrDrv::with_file(fake).is_ok());
}

#[test]
fn pin_info_map_unpin_round_trip() {
    let drv = open_fake(FakeGdrdrv::new());
    let mut rng = rand::thread_rng();
    for _ in 0..50 {
        let (addr, size) = random_range(&mut rng);
        let flags = if rng.gen_bool(0.5) {
            PinFlags::FORCE_PCIE
        } else {
            PinFlags::NONE
        };
        let h = drv.pin_buffer(addr, size, flags).unwrap();
        // The block the driver read: exactly our arguments at the ABI's offsets.
        let block = drv.file().st().last_pin.clone();
        assert_eq!(block.len(), 32);
        assert_eq!(block[0..8], addr.to_ne_bytes());
        assert_eq!(block[8..16], size.to_ne_bytes());
        assert_eq!(block[16..20], flags.0.to_ne_bytes());
        assert_eq!(block[20..24], [0; 4]);

        let va = addr & !(GPU_PAGE - 1);
        let pinned = ((addr + size + GPU_PAGE - 1) & !(GPU_PAGE - 1)) - va;
        let info = drv.get_info(h).unwrap();
        assert_eq!((info.va, info.mapped_size), (va, pinned));
        assert_eq!(
            (info.page_size, info.tsc_khz, info.tm_cycles),
            (65536, 2_000_000, 12_345)
        );
        assert_eq!(info.mapping_type, MappingType::None);
        assert!(!drv.get_callback_flag(h).unwrap());

        let map_size = rng.gen_range(1..=pinned as usize);
        let m = map_raw(&drv, h, map_size).unwrap();
        assert_eq!(m.size(), map_size);
        assert_eq!(m.mapped_len() % drv.host_page_size(), 0);
        assert!(m.mapped_len() >= map_size);
        // The mapping shows this pin's memory, from its rounded start.
        for _ in 0..16 {
            let word = rng.gen_range(0..m.mapped_len() / 8);
            // SAFETY: in bounds of a live mapping; 8-byte aligned (page-aligned base).
            let got = unsafe { m.as_ptr().cast::<u64>().add(word).read_volatile() };
            assert_eq!(got ^ SALT, va + 8 * word as u64);
        }
        assert_eq!(
            drv.get_info(h).unwrap().mapping_type,
            MappingType::WriteCombined
        );
        drop(m);
        assert!(drv.file().st().mappings.is_empty());
        assert_eq!(drv.get_info(h).unwrap().mapping_type, MappingType::None);
        drv.unpin(h).unwrap();
    }
    assert!(drv.file().st().pins.is_empty());
}

#[test]
fn pinned_guard_unpins_and_maps() {
    let drv = open_fake(FakeGdrdrv::new());
    let addr = GPU_BASE + 3 * GPU_PAGE + 0x123;
    {
        let p = drv.pin(addr, 100, PinFlags::NONE).unwrap();
        assert_eq!(p.size(), 100);
        assert_eq!(p.info().unwrap().va, GPU_BASE + 3 * GPU_PAGE);
        let m = p.map(100).unwrap();
        // SAFETY: first word of a live mapping.
        let first = unsafe { m.as_ptr().cast::<u64>().read_volatile() };
        assert_eq!(first ^ SALT, GPU_BASE + 3 * GPU_PAGE);
        assert_eq!(drv.file().st().pins.len(), 1);
    }
    let st = drv.file().st();
    assert!(st.pins.is_empty() && st.mappings.is_empty());
    assert_eq!(st.requests.last(), Some(&UNPIN_BUFFER));
    drop(st);

    let p = drv.pin(addr, 100, PinFlags::NONE).unwrap();
    let h = p.handle();
    p.unpin().unwrap();
    // Unpinned exactly once: a second unpin of the handle is refused.
    assert!(matches!(
        drv.unpin(h),
        Err(GdrDrvError::Ioctl {
            op: "UNPIN_BUFFER",
            ..
        })
    ));
}

#[test]
fn requested_mapping_type_is_used() {
    let drv = open_fake(FakeGdrdrv::new());
    let p = drv.pin(GPU_BASE, GPU_PAGE, PinFlags::NONE).unwrap();
    drv.req_mapping_type(p.handle(), MappingType::Device)
        .unwrap();
    let m = p.map(4096).unwrap();
    assert_eq!(p.info().unwrap().mapping_type, MappingType::Device);
    drop(m);
}

#[test]
fn attributes() {
    let drv = open_fake(FakeGdrdrv::new());
    assert_eq!(drv.get_attr(GdrDrvAttr::USE_PERSISTENT_MAPPING).unwrap(), 0);
    assert_eq!(
        drv.get_attr(GdrDrvAttr::SUPPORT_PIN_FLAG_FORCE_PCIE)
            .unwrap(),
        1
    );
    let err = drv.get_attr(GdrDrvAttr(99)).unwrap_err();
    assert!(
        matches!(err, GdrDrvError::Ioctl { op: "GET_ATTR", .. }),
        "{err:?}"
    );
    let old = open_fake(FakeGdrdrv::with_version((2 << 16) | 3, false, false));
    let err = old
        .get_attr(GdrDrvAttr::USE_PERSISTENT_MAPPING)
        .unwrap_err();
    assert!(
        matches!(err, GdrDrvError::Unsupported { op: "GET_ATTR" }),
        "{err:?}"
    );
}

#[test]
fn old_drivers_get_the_v1_commands() {
    let drv = open_fake(FakeGdrdrv::with_version((2 << 16) | 3, false, false));
    let addr = GPU_BASE + 0x10_0000 + 5;
    let h = drv.pin_buffer(addr, 10, PinFlags::NONE).unwrap();
    assert_eq!(
        drv.file().st().requests,
        vec![GET_VERSION, PIN_BUFFER_V2, PIN_BUFFER]
    );
    let block = drv.file().st().last_pin.clone();
    assert_eq!(block.len(), 40);
    assert_eq!(block[0..8], addr.to_ne_bytes());
    assert_eq!(block[8..16], 10u64.to_ne_bytes());
    assert_eq!(block[16..32], [0; 16]);
    // Remembered: the next pin goes straight to v1.
    drv.pin_buffer(addr, 10, PinFlags::NONE).unwrap();
    assert_eq!(drv.file().st().requests.last(), Some(&PIN_BUFFER));
    assert_eq!(drv.file().st().requests.len(), 4);
    // A flag needs v2.
    let err = drv.pin_buffer(addr, 10, PinFlags::FORCE_PCIE).unwrap_err();
    assert!(
        matches!(
            err,
            GdrDrvError::Unsupported {
                op: "PIN_BUFFER_V2"
            }
        ),
        "{err:?}"
    );

    // GET_INFO (v1) stands in for GET_INFO_V2.
    let m = map_raw(&drv, h, 1).unwrap();
    let info = drv.get_info(h).unwrap();
    assert_eq!(info.mapping_type, MappingType::WriteCombined);
    assert_eq!(info.va, GPU_BASE + 0x10_0000);
    let n = drv.file().st().requests.len();
    assert_eq!(drv.file().st().requests[n - 2..], [GET_INFO_V2, GET_INFO]);
    drop(m);
    assert_eq!(drv.get_info(h).unwrap().mapping_type, MappingType::None);
    assert_eq!(drv.file().st().requests.last(), Some(&GET_INFO));
    let err = drv
        .req_mapping_type(h, MappingType::WriteCombined)
        .unwrap_err();
    assert!(matches!(err, GdrDrvError::Unsupported { .. }));
    // A flagged pin on a v2 driver that fails for another reason is not retried as v1.
    let v2 = open_fake(FakeGdrdrv::new());
    let err = v2.pin_buffer(0x1000, 10, PinFlags::NONE).unwrap_err();
    assert!(
        matches!(
            err,
            GdrDrvError::Ioctl {
                op: "PIN_BUFFER_V2",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(v2.file().st().requests.last(), Some(&PIN_BUFFER_V2));
}

#[test]
fn driver_rules_surface_as_errors() {
    let drv = open_fake(FakeGdrdrv::new());
    // Nothing sent for empty ranges.
    assert!(matches!(
        drv.pin_buffer(GPU_BASE, 0, PinFlags::NONE),
        Err(GdrDrvError::EmptyRange { op: "pin" })
    ));
    assert_eq!(drv.file().st().requests.len(), 1);
    // Not GPU memory.
    let err = drv.pin_buffer(0x1000, 10, PinFlags::NONE).unwrap_err();
    let GdrDrvError::Ioctl { op, source } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        (*op, source.raw_os_error()),
        ("PIN_BUFFER_V2", Some(libc::EINVAL))
    );
    assert_eq!(
        err.to_string(),
        format!("gdrdrv PIN_BUFFER_V2 failed: {source}")
    );

    let h = drv.pin_buffer(GPU_BASE, GPU_PAGE, PinFlags::NONE).unwrap();
    assert!(matches!(
        map_raw(&drv, h, 0),
        Err(GdrDrvError::EmptyRange { op: "map" })
    ));
    // Larger than the pin.
    let err = map_raw(&drv, h, GPU_PAGE as usize + 1).unwrap_err();
    assert!(
        matches!(&err, GdrDrvError::Map { source, .. } if source.raw_os_error() == Some(libc::EINVAL))
    );
    // One mapping per pin.
    let m = map_raw(&drv, h, 4096).unwrap();
    assert!(matches!(
        map_raw(&drv, h, 4096),
        Err(GdrDrvError::Map { .. })
    ));
    drop(m);
    // Unknown handles.
    assert!(matches!(
        map_raw(&drv, Handle(999), 4096),
        Err(GdrDrvError::Map { .. })
    ));
    assert!(matches!(
        drv.get_info(Handle(999)),
        Err(GdrDrvError::Ioctl {
            op: "GET_INFO_V2",
            ..
        })
    ));
    assert!(matches!(
        drv.get_callback_flag(Handle(999)),
        Err(GdrDrvError::Ioctl { .. })
    ));
    // A handle whose offset would not fit off_t.
    assert!(matches!(
        map_raw(&drv, Handle(u64::MAX >> 4), 4096),
        Err(GdrDrvError::HandleOutOfRange { .. })
    ));
    // Memory freed under the pin: the flag says so, and it cannot be mapped any more.
    drv.file().fire_callback(h);
    assert!(drv.get_callback_flag(h).unwrap());
    assert!(matches!(
        map_raw(&drv, h, 4096),
        Err(GdrDrvError::Map { .. })
    ));
    drv.unpin(h).unwrap();
    // After fork: the driver refuses another process.
    drv.file().st().other_process = true;
    let err = drv.get_version().unwrap_err();
    assert!(
        matches!(err, GdrDrvError::NotOwner { op: "GET_VERSION" }),
        "{err:?}"
    );
}

#[test]
fn missing_device_says_the_module_is_not_loaded() {
    let err = GdrDrv::open_path(Path::new("/nonexistent/gdrdrv")).unwrap_err();
    assert!(matches!(err, GdrDrvError::NotLoaded { .. }), "{err:?}");
    assert!(err
        .to_string()
        .starts_with("no /nonexistent/gdrdrv: the gdrdrv kernel module is not loaded"));
}

#[test]
fn default_device_opens_or_says_why() {
    match GdrDrv::open() {
        Ok(drv) => assert_eq!(drv.version().driver.major(), 2),
        Err(err) => {
            let present = Path::new("/dev/gdrdrv").exists();
            assert!(
                present || matches!(err, GdrDrvError::NotLoaded { .. }),
                "{err:?}"
            );
        }
    }
}

/// The real ioctl path, against a device that is not gdrdrv: /dev/null answers ENOTTY.
#[test]
fn a_device_that_is_not_gdrdrv_is_named_as_such() {
    let err = GdrDrv::open_path(Path::new("/dev/null")).unwrap_err();
    assert!(
        matches!(err, GdrDrvError::Unsupported { op: "GET_VERSION" }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not gdrdrv"));
}

#[test]
fn unopenable_paths() {
    let err = GdrDrv::open_path(Path::new("/tmp")).unwrap_err();
    let GdrDrvError::Open { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(source.raw_os_error(), Some(libc::EISDIR));
    let err = GdrDrv::open_path(Path::new("/dev/gdr\0drv")).unwrap_err();
    assert!(matches!(err, GdrDrvError::Open { .. }), "{err:?}");
}
