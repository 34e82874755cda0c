//! The shared copies on a real GPU: every path of `write_on` / `read_on` over gdr's buffers and
//! over a `DeviceMapped` of another kind (a window of a buffer with the C library's engine
//! options: its own stream, a fence first, the caller's context put back, the mapping as the
//! fallback). Bytes are checked against what cuMemcpy sees, with the bytes around the range
//! untouched. Skips without a GPU (fails under GDR_REQUIRE_GPU=1).

mod common;

use common::{backend, contested_copier, random, untouched_around};
use gdr::bar::auto::{read_on, write_on, Path};
use gdr::bar::{DeviceMapped, EngineCopy, LazyStream, MappedBuffer};
use gdr::cuda::{self, CudaError, DeviceMemory};
use gdr::mem::{Caching, MappedMemory};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Engine failures the fallback was told of (one test uses the fallback).
static FELL_BACK: AtomicUsize = AtomicUsize::new(0);

fn count_fallback(_: &CudaError) {
    FELL_BACK.fetch_add(1, Ordering::SeqCst);
}

/// `len` bytes at `offset` of a buffer, copied as the C library copies a handle's mapping.
/// `addr` is the GPU address it names: the buffer's, or a wrong one to make the engine fail.
struct Window<'a> {
    buf: &'a MappedBuffer,
    offset: usize,
    len: usize,
    addr: u64,
    stream: &'a LazyStream,
}

// SAFETY: a range inside the buffer's page-granular write-combined mapping (checked where
// made), which the borrow of the buffer keeps alive.
unsafe impl MappedMemory for Window<'_> {
    fn cpu_ptr(&self) -> *mut u8 {
        self.buf.host_ptr().wrapping_add(self.offset)
    }
    fn size(&self) -> usize {
        self.len
    }
    fn caching(&self) -> Caching {
        Caching::WriteCombined
    }
}

impl DeviceMapped for Window<'_> {
    fn device_addr(&self) -> u64 {
        self.addr
    }
    fn engine(&self) -> EngineCopy<'_> {
        EngineCopy::new(self.buf.context())
            .on_stream(self.stream)
            .fencing_stores_first()
            .restoring_context()
            .falling_back(count_fallback)
    }
}

fn window<'a>(
    buf: &'a MappedBuffer,
    offset: usize,
    len: usize,
    stream: &'a LazyStream,
) -> Window<'a> {
    assert!(offset + len <= buf.len());
    Window {
        buf,
        offset,
        len,
        addr: buf.device_ptr() + offset as u64,
        stream,
    }
}

const PATHS: [Path; 3] = [
    Path::Mapping { threads: 1 },
    Path::Mapping { threads: 4 },
    Path::CopyEngine,
];

/// Writes `data` at `at` of `mem` (which starts `base` bytes into `buf`) on `path`, then reads
/// it back on `path`, checking both against cuMemcpy and the guard bytes around the range.
fn round_trip(
    buf: &MappedBuffer,
    mem: &impl DeviceMapped,
    base: usize,
    path: Path,
    at: usize,
    data: &[u8],
) {
    let n = data.len();
    cuda::memset(buf, 0xA5).unwrap();
    buf.context().synchronize().unwrap();
    write_on(path, mem, at, data).unwrap();
    let mut gpu = vec![0u8; buf.len()];
    cuda::memcpy_dtoh(&mut gpu, buf, 0).unwrap();
    let start = base + at;
    assert!(
        gpu[start..start + n] == *data,
        "{path}: write of {n} B at {at}"
    );
    assert!(
        untouched_around(&gpu, start, n, 0xA5),
        "{path}: write of {n} B at {at} touched bytes outside it"
    );
    let mut back = vec![0x5Au8; n + 2];
    read_on(path, mem, at, &mut back[1..=n]).unwrap();
    assert!(back[1..=n] == *data, "{path}: read of {n} B at {at}");
    assert_eq!(
        (back[0], back[n + 1]),
        (0x5A, 0x5A),
        "{path}: read past dst"
    );
}

#[test]
fn every_path_copies_a_buffer_exactly() {
    let Some(be) = backend("every_path_copies_a_buffer_exactly") else {
        return;
    };
    let buf = be.alloc((1 << 20) + 4096, 64).unwrap();
    for path in PATHS {
        for (at, n) in [(0, 1), (13, 63), (4095, 65_537), (7, 1 << 20)] {
            round_trip(&buf, &buf, 0, path, at, &random(n));
        }
    }
}

#[test]
fn every_path_copies_a_window_with_the_c_library_options() {
    let Some(be) = backend("every_path_copies_a_window_with_the_c_library_options") else {
        return;
    };
    let buf = be.alloc((1 << 20) + 8192, 64).unwrap();
    let stream = LazyStream::new();
    let w = window(&buf, 4096 + 3, 1 << 20, &stream);
    let before = FELL_BACK.load(Ordering::SeqCst);
    for path in PATHS {
        for (at, n) in [(0, 1), (13, 63), (4095, 65_537), (0, 1 << 20)] {
            round_trip(&buf, &w, 4096 + 3, path, at, &random(n));
        }
    }
    assert_eq!(
        FELL_BACK.load(Ordering::SeqCst),
        before,
        "the engine failed"
    );
    // A range past the window fails on every path and writes nothing.
    for path in PATHS {
        assert!(
            write_on(path, &w, (1 << 20) - 10, &[1u8; 11]).is_err(),
            "{path}"
        );
        assert!(read_on(path, &w, 1, &mut [0u8; 1 << 20]).is_err(), "{path}");
    }
}

/// A window whose GPU address is NULL: the copy engine refuses it, the fallback is told, and
/// the copy goes through the mapping, so the bytes still land.
#[test]
fn a_failed_engine_copy_falls_back_to_the_mapping() {
    let Some(be) = backend("a_failed_engine_copy_falls_back_to_the_mapping") else {
        return;
    };
    let buf = be.alloc(1 << 16, 64).unwrap();
    let stream = LazyStream::new();
    let mut w = window(&buf, 64, 1 << 15, &stream);
    w.addr = 0;
    let before = FELL_BACK.load(Ordering::SeqCst);
    round_trip(&buf, &w, 64, Path::CopyEngine, 5, &random(20_000));
    assert_eq!(
        FELL_BACK.load(Ordering::SeqCst),
        before + 2,
        "write and read fell back"
    );
    // Without the fallback, the same failure is the caller's error.
    let bare = EngineCopy::new(buf.context()).on_stream(&stream);
    let err = bare.write(&w.device_range(), 0, &[1u8; 8]);
    assert!(err.is_err(), "a copy to NULL succeeded");
}

/// The auto copier over a window, every class contested between the copy engine and the
/// one-thread mapping, so both run across the calls.
#[test]
fn the_auto_copier_copies_any_device_mapped_memory() {
    let Some(be) = backend("the_auto_copier_copies_any_device_mapped_memory") else {
        return;
    };
    let copier = contested_copier();
    let buf = be.alloc(1 << 18, 64).unwrap();
    let stream = LazyStream::new();
    let w = window(&buf, 128 + 1, 200_000, &stream);
    for call in 0..300 {
        let n = [1usize, 100, 4096, 70_000][call % 4];
        let data = random(n);
        copier.write(&w, 17, &data).unwrap();
        let mut gpu = vec![0u8; n];
        cuda::memcpy_dtoh(&mut gpu, &buf, 128 + 1 + 17).unwrap();
        assert!(gpu == data, "write of {n} B, call {call}");
        let mut back = vec![0u8; n];
        copier.read(&w, 17, &mut back).unwrap();
        assert!(back == data, "read of {n} B, call {call}");
    }
}
