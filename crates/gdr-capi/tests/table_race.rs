//! The handle table under concurrent use, on a GPU: copies on several threads while other
//! threads change the table (allocate, map, unmap, free) and one handle is unmapped in the
//! middle of a stream of copies to it. Each copy's bytes are read back and compared; a copy to
//! the unmapped handle must be refused (EINVAL) from the moment `gdr_unmap` returns, never
//! reach the freed mapping.
//!
//! Copies look their handle up without a locked instruction (read_mostly.rs), so this is the
//! test that the writers' barrier and wait keep them apart from the changes.

use gdr_testing::skip_or_fail;
use gdrapi::*;
use rand::{Rng, RngCore};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SIZE: usize = 64 << 10;

/// A `gdr_alloc_mapped` buffer, mapped; `None` when this GPU has no Vulkan mapping.
fn mapped(g: *mut c_void) -> Option<(GdrMh, usize)> {
    let (mut d, mut mh) = (0, GdrMh { h: 0 });
    // SAFETY: out-pointers to a c_ulong and a GdrMh.
    match unsafe { gdr_alloc_mapped(g, SIZE, &mut d, &mut mh) } {
        0 => {}
        libc::ENOTSUP => return None,
        e => panic!("gdr_alloc_mapped: errno {e}"),
    }
    let mut va = std::ptr::null_mut();
    // SAFETY: an out-pointer to a pointer.
    assert_eq!(unsafe { gdr_map(g, mh, &mut va, SIZE) }, 0);
    Some((mh, va as usize))
}

fn release(g: *mut c_void, mh: GdrMh, va: usize) {
    assert_eq!(gdr_unmap(g, mh, va as *mut c_void, SIZE), 0);
    assert_eq!(gdr_free_mapped(g, mh), 0);
}

/// Copies fresh bytes of random sizes into `[off, off + len)` of the mapping and back, until
/// `stop`; returns the number of round trips.
fn round_trips(mh: GdrMh, va: usize, off: usize, len: usize, stop: &AtomicBool) -> u64 {
    let mut rng = rand::thread_rng();
    let (mut src, mut back) = (vec![0u8; len], vec![0u8; len]);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let size = rng.gen_range(1..=len);
        let at = off + rng.gen_range(0..=len - size);
        rng.fill_bytes(&mut src[..size]);
        back[..size].fill(!src[0]);
        let p = (va + at) as *mut c_void;
        // SAFETY: `src` and `back` hold at least `size` bytes (the mapping side is checked).
        unsafe {
            assert_eq!(gdr_copy_to_mapping(mh, p, src.as_ptr().cast(), size), 0);
            assert_eq!(
                gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), p, size),
                0
            );
        }
        assert!(back[..size] == src[..size], "{size} bytes at {at}");
        n += 1;
    }
    n
}

#[test]
fn copies_stay_correct_while_the_table_changes_and_an_unmap_races_them() {
    let name = "copies_stay_correct_while_the_table_changes_and_an_unmap_races_them";
    let g = gdr_open();
    if g.is_null() {
        return skip_or_fail(name, "gdr_open found no usable GPU").unwrap_or(());
    }
    let Some((stable, sva)) = mapped(g) else {
        assert_eq!(gdr_close(g), 0);
        return skip_or_fail(name, "no Vulkan mapping on this GPU").unwrap_or(());
    };
    let (victim, vva) = mapped(g).expect("a second buffer");
    let gs = g as usize;
    let stop = AtomicBool::new(false);
    let (churned, victim_ok) = (AtomicU64::new(0), AtomicU64::new(0));
    let unmapped = AtomicBool::new(false);
    let half = SIZE / 2;
    let stop_ref = &stop;

    let trips = std::thread::scope(|s| {
        let copiers: Vec<_> = (0..2)
            .map(|i| s.spawn(move || round_trips(stable, sva, i * half, half, stop_ref)))
            .collect();
        // Writers: every iteration takes the table exclusively four times.
        s.spawn(|| {
            let g = gs as *mut c_void;
            while !stop.load(Ordering::Relaxed) {
                let (mh, va) = mapped(g).expect("churn buffer");
                let v = 0x5eed_u64.to_ne_bytes();
                // SAFETY: `v` holds the 8 bytes copied.
                let rc =
                    unsafe { gdr_copy_to_mapping(mh, va as *mut c_void, v.as_ptr().cast(), 8) };
                assert_eq!(rc, 0);
                release(g, mh, va);
                churned.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Copies into the victim until its unmap: 0 before, EINVAL after, nothing else.
        let hammer = s.spawn(|| {
            let src = [0xABu8; 256];
            let mut refused = 0u64;
            loop {
                let was_unmapped = unmapped.load(Ordering::SeqCst);
                // SAFETY: `src` holds the 256 bytes copied (the mapping side is checked: the
                // copies after the unmap are refused, never reach the freed mapping).
                let rc = unsafe {
                    gdr_copy_to_mapping(victim, vva as *mut c_void, src.as_ptr().cast(), 256)
                };
                match rc {
                    0 => {
                        assert!(!was_unmapped, "a copy into an unmapped handle went through");
                        assert_eq!(refused, 0, "a copy went through after one was refused");
                        victim_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    libc::EINVAL => refused += 1,
                    e => panic!("copy into the victim: errno {e}"),
                }
                if was_unmapped && refused > 1000 {
                    return refused;
                }
            }
        });
        let t0 = Instant::now();
        while victim_ok.load(Ordering::Relaxed) < 1000 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(gdr_unmap(g, victim, vva as *mut c_void, SIZE), 0);
        unmapped.store(true, Ordering::SeqCst);
        assert!(hammer.join().unwrap() > 1000);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        copiers.into_iter().map(|c| c.join().unwrap()).sum::<u64>()
    });
    let (churn, ok) = (churned.into_inner(), victim_ok.into_inner());
    println!("{trips} round trips, {churn} allocate-map-unmap-free cycles, {ok} victim copies");
    assert!(
        trips > 100 && churn > 10 && ok >= 1000,
        "{trips} {churn} {ok}"
    );
    assert_eq!(gdr_free_mapped(g, victim), 0);
    release(g, stable, sva);
    assert_eq!(gdr_close(g), 0);
}
