//! BAR mappings on a real GPU: data written through the CPU mapping must be what cuMemcpy
//! reads, and the other way round. Skips without a GPU (fails under GDR_REQUIRE_GPU=1).

mod common;

use common::{backend, random, untouched_around};
use gdr::bar::BarError;
use gdr::cuda::{self, DeviceMemory};
use gdr::mem::{AccessError, MappedMemory};
use rand::Rng;

#[test]
fn cpu_writes_are_what_the_gpu_reads() {
    let Some(be) = backend("cpu_writes_are_what_the_gpu_reads") else {
        return;
    };
    for &size in &[1usize, 7, 8, 63, 64, 65, 4095, 4096, 65_539, 1 << 20] {
        for &off in &[0usize, 1, 13, 63] {
            let buf = be.alloc(size + off, 64).unwrap();
            cuda::memset(&buf, 0xA5).unwrap();
            // cuMemsetD8 may still be running when it returns.
            buf.context().synchronize().unwrap();
            let data = random(size);
            buf.write(off, &data).unwrap();
            let mut back = vec![0x5Au8; size + off];
            cuda::memcpy_dtoh(&mut back, &buf, 0).unwrap();
            assert!(back[..off].iter().all(|&b| b == 0xA5), "head clobbered");
            assert_eq!(&back[off..], &data[..], "size {size} offset {off}");
        }
    }
}

#[test]
fn gpu_writes_are_what_the_cpu_reads() {
    let Some(be) = backend("gpu_writes_are_what_the_cpu_reads") else {
        return;
    };
    for &size in &[1usize, 8, 9, 100, 4096, 65_537, 1 << 20] {
        for &off in &[0usize, 3, 32, 63] {
            let buf = be.alloc(size + off, 64).unwrap();
            let data = random(size + off);
            cuda::memcpy_htod(&buf, 0, &data).unwrap();
            // A pageable cuMemcpyHtoD returns once staged, not landed.
            buf.context().synchronize().unwrap();
            let mut back = vec![0xEEu8; size];
            buf.read(off, &mut back).unwrap();
            assert_eq!(&back[..], &data[off..], "size {size} offset {off}");
        }
    }
}

#[test]
fn alignment_sub_allocation_and_churn() {
    let Some(be) = backend("alignment_sub_allocation_and_churn") else {
        return;
    };
    let mut rng = rand::thread_rng();
    let mut live = Vec::new();
    for i in 0..3000 {
        if live.len() > 200 || (!live.is_empty() && rng.gen_bool(0.4)) {
            let j = rng.gen_range(0..live.len());
            let (buf, tag): (gdr::bar::MappedBuffer, u8) = live.swap_remove(j);
            let mut b = [0u8; 1];
            buf.read(buf.len() - 1, &mut b).unwrap();
            assert_eq!(b[0], tag, "buffer content changed under us");
            continue;
        }
        let size = rng.gen_range(1..200_000);
        let align = 1usize << rng.gen_range(0..17);
        let buf = be.alloc(size, align).unwrap();
        assert_eq!(buf.device_ptr() % align as u64, 0);
        assert_eq!(buf.host_ptr() as usize % align, 0);
        let tag = i as u8;
        buf.write(size - 1, &[tag]).unwrap();
        live.push((buf, tag));
    }
    drop(live);
    assert!(be.shared_blocks() <= 1, "empty blocks not released");
}

#[test]
fn large_dedicated_buffer_round_trips() {
    let Some(be) = backend("large_dedicated_buffer_round_trips") else {
        return;
    };
    let size = 64 << 20;
    let buf = be.alloc(size, 4096).unwrap();
    let data = random(size);
    buf.write_parallel(0, &data, 4).unwrap();
    let mut back = vec![0u8; size];
    cuda::memcpy_dtoh(&mut back, &buf, 0).unwrap();
    assert!(back == data, "64 MiB through the mapping differs");
}

#[test]
fn bad_requests_are_errors() {
    let Some(be) = backend("bad_requests_are_errors") else {
        return;
    };
    assert!(matches!(be.alloc(0, 64), Err(BarError::BadLayout(_))));
    assert!(matches!(be.alloc(10, 3), Err(BarError::BadLayout(_))));
    let buf = be.alloc(100, 64).unwrap();
    assert!(matches!(
        buf.write(90, &[0u8; 11]),
        Err(BarError::Access(AccessError::OutOfBounds { .. }))
    ));
    let mut out = [0u8; 2];
    assert!(matches!(
        buf.read(usize::MAX, &mut out),
        Err(BarError::Access(AccessError::OutOfBounds { .. }))
    ));
    let mut big = vec![0u8; 101];
    assert!(cuda::memcpy_dtoh(&mut big, &buf, 0).is_err());
}

/// The auto copier with every class contested by the copy engine and the one-thread mapping:
/// plain, timed and explored calls must all leave exactly the bytes asked for, with the bytes
/// around them untouched, in both directions.
#[test]
fn auto_copier_contests_copy_exactly() {
    use gdr::bar::auto::Direction;
    let Some(be) = backend("auto_copier_contests_copy_exactly") else {
        return;
    };
    let copier = common::contested_copier();
    const GUARD: usize = 64;
    for &size in &[1usize, 100, 4096, 8192 + 13, 70_000, 300_000] {
        let contest = copier.contest(Direction::ToGpu, size);
        assert_eq!(contest.map(|c| c.paths().len()), Some(2));
        let buf = be.alloc(size + 2 * GUARD, 64).unwrap();
        // Enough calls for bursts on the other path in each class.
        for call in 0..600 {
            let data = random(size);
            cuda::memset(&buf, 0xA5).unwrap();
            buf.context().synchronize().unwrap();
            copier.write(&buf, GUARD, &data).unwrap();
            let mut gpu = vec![0u8; buf.len()];
            cuda::memcpy_dtoh(&mut gpu, &buf, 0).unwrap();
            assert!(
                untouched_around(&gpu, GUARD, size, 0xA5),
                "write of {size} B (call {call}) touched the guard bytes"
            );
            assert!(
                gpu[GUARD..GUARD + size] == data[..],
                "write of {size} B, call {call}"
            );
            let mut back = vec![0x5Au8; size + 2 * GUARD];
            copier
                .read(&buf, GUARD, &mut back[GUARD..GUARD + size])
                .unwrap();
            assert!(untouched_around(&back, GUARD, size, 0x5A));
            assert!(
                back[GUARD..GUARD + size] == data[..],
                "read of {size} B, call {call}"
            );
        }
    }
}

/// The auto copier follows a contender that is faster in a steady stream: with the copy engine
/// rated as slow as the one-thread mapping, a stream of 64 KiB reads moves to the copy engine
/// (several times faster than reading 64 KiB through a BAR on one thread), and the bytes are
/// right.
#[test]
fn auto_copier_moves_to_a_faster_contender() {
    use gdr::bar::auto::{read_on, AutoCopier, Calibration, Direction, Path, Point, CLASSES};
    use std::time::{Duration, Instant};
    let Some(be) = backend("auto_copier_moves_to_a_faster_contender") else {
        return;
    };
    let size = 64 << 10;
    let buf = be.alloc(size, 4096).unwrap();
    let x1 = Path::Mapping { threads: 1 };
    let data = random(size);
    cuda::memcpy_htod(&buf, 0, &data).unwrap();
    buf.context().synchronize().unwrap();
    let mut back = vec![0u8; size];
    // One thread's time for this size, measured here.
    let t = Instant::now();
    for _ in 0..50 {
        read_on(x1, &buf, 0, &mut back).unwrap();
    }
    let x1_us = t.elapsed().as_secs_f64() * 1e6 / 50.0;
    let points = [x1, Path::CopyEngine]
        .into_iter()
        .map(|path| Point {
            direction: Direction::FromGpu,
            size,
            path,
            median_us: x1_us,
        })
        .collect();
    let copier = AutoCopier::from_calibration(Calibration {
        key: "test".into(),
        to_gpu: vec![x1; CLASSES],
        from_gpu: vec![x1; CLASSES],
        points,
    });
    let c = copier
        .contest(Direction::FromGpu, size)
        .expect("two paths contend");
    assert_eq!(c.paths().len(), 2);
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        back.fill(0);
        copier.read(&buf, 0, &mut back).unwrap();
        assert!(back == data, "a read of the stream differs");
    }
    let estimates: Vec<String> = (0..c.paths().len())
        .map(|i| format!("{} {:.2} us", c.path(i), c.estimate_us(i)))
        .collect();
    assert_eq!(
        c.current(),
        Path::CopyEngine,
        "one thread {x1_us:.2} us; estimates {estimates:?}"
    );
}
