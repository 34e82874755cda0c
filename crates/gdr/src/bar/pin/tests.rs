use super::*;
use rand::Rng;
use std::sync::Mutex;

#[test]
fn pins_and_mappings_cross_threads() {
    // libgdrapi's table and the Python package share both between threads.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Pinned>();
    send_sync::<PinnedMapping>();
}

#[test]
fn backend_names_round_trip() {
    for b in PinBackend::ALL {
        assert_eq!(PinBackend::parse(b.name()).unwrap(), b);
    }
    assert_eq!(PinBackend::parse(" DMABUF ").unwrap(), PinBackend::DmaBuf);
    assert!(matches!(
        PinBackend::parse("nvidia-peermem"),
        Err(PinError::UnknownBackend(_))
    ));
}

#[test]
fn mmap_refusal_names_the_driver_requirement() {
    let e = PinError::MmapRefused {
        errno: ENOTSUPP,
        driver: "13.0".into(),
    };
    let s = e.to_string();
    assert!(
        s.contains("524") && s.contains("ENOTSUPP") && s.contains("13.3"),
        "{s}"
    );
}

/// What the fake backend saw, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Bind,
    Pin { addr: u64, size: u64 },
    Map { len: usize },
    Unmap { base: usize, len: usize },
    Unpin,
    UnpinWhileMapped,
}

type Log = Arc<Mutex<Vec<Event>>>;

const PAGE: u64 = 4096;

/// A backend over host memory, registered only here: a pin `mmap`s fresh anonymous pages for
/// the page-rounded range (its "GPU memory", kept until unpin), a map hands out their address.
/// It logs every call, so the tests see the order the pin layer drives it in.
struct FakeBackend {
    log: Log,
    /// The next map fails (once).
    fail_map: Arc<AtomicBool>,
    /// What `callback_fired` answers.
    freed: Arc<AtomicBool>,
}

struct FakePinned {
    log: Log,
    fail_map: Arc<AtomicBool>,
    freed: Arc<AtomicBool>,
    mem: *mut u8,
    len: usize,
    /// Whether a mapping is open: unpinning with one open would be a mapping outliving its
    /// memory, which the drop logs.
    mapped: AtomicBool,
}

// SAFETY: `mem` is an anonymous mapping owned by this value alone, touched only through the
// pin layer's copy routines.
unsafe impl Send for FakePinned {}
// SAFETY: as above; `&FakePinned` only reads the pointer.
unsafe impl Sync for FakePinned {}

impl FakeBackend {
    fn new() -> FakeBackend {
        FakeBackend {
            log: Log::default(),
            fail_map: Arc::default(),
            freed: Arc::default(),
        }
    }

    fn events(&self) -> Vec<Event> {
        self.log.lock().unwrap().clone()
    }

    fn pin(&self, addr: u64, size: u64) -> Result<Pinned, PinError> {
        let log = self.log.clone();
        pin_through(
            self,
            move || {
                log.lock().unwrap().push(Event::Bind);
                Ok(())
            },
            addr,
            size,
        )
    }
}

impl Backend for FakeBackend {
    fn kind(&self) -> PinBackend {
        PinBackend::DmaBuf
    }

    fn pin(&self, addr: u64, size: u64) -> Result<Pinning, PinError> {
        self.log.lock().unwrap().push(Event::Pin { addr, size });
        let start = addr / PAGE * PAGE;
        let len = (addr + size).next_multiple_of(PAGE) - start;
        // SAFETY: a fresh private mapping at an address the kernel picks cannot overlap memory
        // Rust already uses.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(mem, libc::MAP_FAILED);
        Ok(Pinning {
            start,
            len,
            pin: Box::new(FakePinned {
                log: self.log.clone(),
                fail_map: self.fail_map.clone(),
                freed: self.freed.clone(),
                mem: mem.cast(),
                len: len as usize,
                mapped: AtomicBool::new(false),
            }),
        })
    }
}

impl BackendPin for FakePinned {
    fn backend(&self) -> PinBackend {
        PinBackend::DmaBuf
    }

    fn callback_fired(&self, _addr: u64) -> Result<bool, PinError> {
        Ok(self.freed.load(Ordering::Relaxed))
    }

    fn map(&self, len: usize) -> Result<RawMapping, PinError> {
        if self.fail_map.swap(false, Ordering::Relaxed) {
            return Err(PinError::MmapRefused {
                errno: ENOTSUPP,
                driver: "fake".into(),
            });
        }
        assert_eq!(len, self.len, "the whole pinned range is mapped");
        assert!(!self.mapped.swap(true, Ordering::Relaxed), "mapped twice");
        self.log.lock().unwrap().push(Event::Map { len });
        Ok(RawMapping {
            base: self.mem,
            len,
        })
    }

    unsafe fn unmap(&self, mapping: RawMapping) {
        assert!(self.mapped.swap(false, Ordering::Relaxed), "unmapped twice");
        self.log.lock().unwrap().push(Event::Unmap {
            base: mapping.base as usize,
            len: mapping.len,
        });
    }
}

impl Drop for FakePinned {
    fn drop(&mut self) {
        if self.mapped.load(Ordering::Relaxed) {
            // A mapping would outlive its memory: logged (the tests' event lists then differ)
            // and the pages leaked, rather than a panic inside a drop.
            self.log.lock().unwrap().push(Event::UnpinWhileMapped);
            return;
        }
        self.log.lock().unwrap().push(Event::Unpin);
        // SAFETY: our own mapping from `pin`, no longer mapped by the pin layer, so nothing
        // uses it any more.
        unsafe { libc::munmap(self.mem.cast(), self.len) };
    }
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill(&mut v[..]);
    v
}

/// An address in the middle of a page, so the caller's range and the pinned one differ.
const ADDR: u64 = 0x7f00_0000_1000 + 100;
const SIZE: u64 = 5000;

#[test]
fn a_registered_backend_goes_through_pin_map_unmap_unpin_in_order() {
    let be = FakeBackend::new();
    let pinned = be.pin(ADDR, SIZE).unwrap();
    assert_eq!(pinned.backend(), PinBackend::DmaBuf);
    assert!(!pinned.is_pooled());
    assert_eq!(
        (pinned.addr(), pinned.size()),
        (ADDR, SIZE),
        "the caller's range"
    );
    assert_eq!(pinned.start(), ADDR - 100);
    assert_eq!(pinned.pinned_len(), 2 * PAGE);
    assert!(!pinned.is_mapped());

    let m = pinned.map().unwrap();
    assert!(pinned.is_mapped());
    assert_eq!(m.len(), SIZE as usize);
    assert_eq!(MappedMemory::size(&m), SIZE as usize);
    assert_eq!(m.mapped_len(), 2 * PAGE as usize);
    assert_eq!(m.host_ptr() as usize, m.base_ptr() as usize + 100);
    assert_eq!(m.cpu_ptr(), m.host_ptr());
    let base = m.base_ptr() as usize;

    let data = random_bytes(SIZE as usize);
    m.write(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    m.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    // Out of the caller's range, though inside the pinned one: refused.
    assert!(matches!(
        m.write(SIZE as usize - 1, &[1, 2]),
        Err(PinError::Access(_))
    ));

    drop(m);
    assert!(!pinned.is_mapped());
    assert_eq!(
        be.events(),
        [
            Event::Bind,
            Event::Pin {
                addr: ADDR,
                size: SIZE
            },
            Event::Map {
                len: 2 * PAGE as usize
            },
            Event::Unmap {
                base,
                len: 2 * PAGE as usize
            },
        ]
    );

    // The memory outlives the mapping: a second mapping reads what the first wrote.
    let m = pinned.map().unwrap();
    let mut again = vec![0u8; data.len()];
    m.read(0, &mut again).unwrap();
    assert_eq!(again, data);
    drop(m);
    drop(pinned);
    let events = be.events();
    assert_eq!(events.len(), 7, "{events:?}");
    assert!(matches!(events[4], Event::Map { .. }));
    assert!(matches!(events[5], Event::Unmap { .. }));
    assert_eq!(events[6], Event::Unpin);
}

#[test]
fn the_mapping_keeps_the_pin_when_the_pinned_goes_first() {
    let be = FakeBackend::new();
    let pinned = be.pin(ADDR, SIZE).unwrap();
    let m = pinned.map().unwrap();
    drop(pinned);
    // Still pinned: the mapping holds it, and still works.
    assert!(!be.events().contains(&Event::Unpin));
    let data = random_bytes(SIZE as usize);
    m.write(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    m.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(m.pinned().addr(), ADDR);
    drop(m);
    let events = be.events();
    assert!(
        matches!(
            events[..],
            [
                Event::Bind,
                Event::Pin { .. },
                Event::Map { .. },
                Event::Unmap { .. },
                Event::Unpin
            ]
        ),
        "{events:?}"
    );
}

#[test]
fn one_mapping_per_pin_and_a_failed_map_leaves_it_unmapped() {
    let be = FakeBackend::new();
    let pinned = be.pin(ADDR, SIZE).unwrap();
    let m = pinned.map().unwrap();
    assert!(matches!(pinned.map(), Err(PinError::AlreadyMapped)));
    drop(m);

    be.fail_map.store(true, Ordering::Relaxed);
    assert!(matches!(
        pinned.map(),
        Err(PinError::MmapRefused {
            errno: ENOTSUPP,
            ..
        })
    ));
    assert!(!pinned.is_mapped(), "a failed map leaves no mapping");
    let m = pinned.map().expect("a map after a failed one");
    drop(m);
    drop(pinned);
    let maps = be
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Map { .. }))
        .count();
    assert_eq!(
        maps, 2,
        "the refused and the failed map reached no backend map"
    );
    assert_eq!(be.events().last(), Some(&Event::Unpin));
}

#[test]
fn shared_checks_come_before_the_backend() {
    let be = FakeBackend::new();
    assert!(matches!(
        be.pin(ADDR, 0),
        Err(PinError::Empty { addr: ADDR })
    ));
    // A context that cannot be made current stops the pin before the backend.
    let e = pin_through(&be, || Err(CudaError::NoDevice), ADDR, SIZE).unwrap_err();
    assert!(matches!(e, PinError::Cuda(CudaError::NoDevice)), "{e}");
    assert_eq!(be.events(), []);
}

#[test]
fn the_callback_flag_is_the_backends() {
    let be = FakeBackend::new();
    let pinned = be.pin(ADDR, SIZE).unwrap();
    assert!(!pinned.callback_fired().unwrap());
    be.freed.store(true, Ordering::Relaxed);
    assert!(pinned.callback_fired().unwrap());
}

#[test]
fn pins_without_a_buffer_id_never_report_a_free() {
    // Unknown at the pin: the flag stays 0 and CUDA is not asked.
    assert!(!pinned_buffer_freed(ADDR, None).unwrap());
}
