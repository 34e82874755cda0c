//! The pool over real CUDA chunks (`VmmSource`) on GPU 0: allocations work as device memory,
//! a pin maps its chunk once, bytes cross both ways through the mapping, memory freed while
//! pinned stays held, and idle chunks go back to the driver. Without a GPU each test prints
//! `skipped: no GPU` (and fails under GDR_REQUIRE_GPU=1).

use gdr::cuda::{self, DeviceMemory};
use gdr_alloc::{Pool, ProbeCache, Probed, VmmSource, DEFAULT_CACHE};
use rand::RngCore;

/// A range of pool memory as the driver's copy calls take it.
struct Range(u64, usize);

impl DeviceMemory for Range {
    fn device_ptr(&self) -> u64 {
        self.0
    }
    fn len(&self) -> usize {
        self.1
    }
}

/// A pool on GPU 0 that serves it, or `None` (skipped) when there is no usable GPU.
fn pool(name: &str) -> Option<(gdr::cuda::Context, Pool<VmmSource>)> {
    let ctx = gdr_testing::gpu_context(name)?;
    let src = VmmSource::new();
    if let Err(why) = src.probe(0, None) {
        return gdr_testing::skip_or_fail(name, &format!("GPU 0 cannot serve the pool: {why}"));
    }
    Some((ctx, Pool::new(src, DEFAULT_CACHE)))
}

/// The permissions /proc/self/maps gives the page at `addr` ("rw-s", "---s"...).
fn perms_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            return perms.to_owned();
        }
    }
    panic!("{addr:#x} is not mapped at all");
}

fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

#[test]
fn pool_memory_is_device_memory_and_maps_both_ways() {
    let Some((ctx, p)) = pool("pool_memory_is_device_memory_and_maps_both_ways") else {
        return;
    };
    for size in [
        1usize,
        13,
        4096,
        65536 + 7,
        (1 << 20) + 1,
        3 << 20,
        24 << 20,
    ] {
        let a = p.alloc(0, size as u64).unwrap();
        let r = Range(a, size);
        // The driver's copies work on it.
        let data = random(size);
        cuda::memcpy_htod(&r, 0, &data).unwrap();
        let mut back = vec![0u8; size];
        cuda::memcpy_dtoh(&mut back, &r, 0).unwrap();
        assert_eq!(back, data, "{size} B: cuMemcpy round trip");
        // Pinned: the mapping reads what the driver wrote, and the driver reads what the CPU
        // writes through it.
        let pin = p.pin(a, size as u64).unwrap();
        p.map(pin.id).unwrap();
        let cpu = pin.cpu.wrapping_add((a - pin.base) as usize);
        let mut seen = vec![0u8; size];
        // SAFETY: [cpu, cpu + size) lies in the chunk's live mapping (the pin holds it).
        unsafe { gdr::copy::copy_from_mapping(&mut seen, cpu) };
        assert_eq!(seen, data, "{size} B: GPU -> CPU through the mapping");
        let fresh = random(size);
        // SAFETY: as above.
        unsafe { gdr::copy::copy_to_mapping(cpu, &fresh) };
        cuda::memcpy_dtoh(&mut back, &r, 0).unwrap();
        assert_eq!(back, fresh, "{size} B: CPU -> GPU through the mapping");
        p.unmap(pin.id).unwrap();
        p.unpin(pin.id).unwrap();
        p.free(a).unwrap();
    }
    ctx.synchronize().unwrap();
    let s = p.stats();
    assert_eq!(s.live_allocations, 0);
    assert!(s.mapped_chunks >= 1 && s.mapped_chunks <= s.chunks);
}

#[test]
fn a_pin_of_allocator_memory_takes_microseconds_after_its_chunk_is_mapped() {
    let Some((_ctx, p)) =
        pool("a_pin_of_allocator_memory_takes_microseconds_after_its_chunk_is_mapped")
    else {
        return;
    };
    let mut warm = Vec::new();
    let mut first = Vec::new();
    let mut live = Vec::new();
    for i in 0..300u64 {
        let size = 4096 * (1 + i % 16);
        let a = p.alloc(0, size).unwrap();
        live.push(a);
        let mapped = p.stats().mapped_chunks;
        let t = std::time::Instant::now();
        let pin = p.pin(a & !0xffff, 0x10000).unwrap();
        let us = t.elapsed().as_secs_f64() * 1e6;
        if p.stats().mapped_chunks > mapped {
            first.push(us);
        } else {
            warm.push(us);
        }
        p.unpin(pin.id).unwrap();
    }
    for a in live {
        p.free(a).unwrap();
    }
    warm.sort_by(f64::total_cmp);
    first.sort_by(f64::total_cmp);
    let median = |v: &[f64]| v[v.len() / 2];
    println!(
        "pool pin: median {:.2} us over {} pins; first pin of a chunk (its Vulkan import): median \
         {:.0} us over {} chunks",
        median(&warm),
        warm.len(),
        median(&first),
        first.len()
    );
    assert!(!first.is_empty() && warm.len() > 250);
    assert!(median(&warm) < 10.0, "median {:.2} us", median(&warm));
}

#[test]
fn a_chunk_mapping_is_open_only_where_a_pin_is_mapped() {
    let Some((_ctx, p)) = pool("a_chunk_mapping_is_open_only_where_a_pin_is_mapped") else {
        return;
    };
    let a = p.alloc(0, 4096).unwrap();
    let pin = p.pin(a & !0xffff, 0x10000).unwrap();
    let page = pin.cpu as usize + (a as usize & !0xffff) - pin.base as usize;
    assert!(
        perms_at(page).starts_with("---"),
        "pinned, not mapped: {}",
        perms_at(page)
    );
    p.map(pin.id).unwrap();
    assert!(
        perms_at(page).starts_with("rw-"),
        "mapped: {}",
        perms_at(page)
    );
    let other = page + 0x10000;
    assert!(
        perms_at(other).starts_with("---"),
        "the next page stays closed: {}",
        perms_at(other)
    );
    p.unmap(pin.id).unwrap();
    assert!(
        perms_at(page).starts_with("---"),
        "unmapped: {}",
        perms_at(page)
    );
    p.unpin(pin.id).unwrap();
    p.free(a).unwrap();
}

#[test]
fn freed_while_pinned_stays_readable_and_idle_chunks_go_back() {
    let Some((ctx, p)) = pool("freed_while_pinned_stays_readable_and_idle_chunks_go_back") else {
        return;
    };
    let a = p.alloc(0, 8192).unwrap();
    let data = random(8192);
    cuda::memcpy_htod(&Range(a, 8192), 0, &data).unwrap();
    // A pageable cuMemcpyHtoD returns once staged; the mapping read below needs it landed.
    cuda::synchronize_legacy_stream().unwrap();
    let pin = p.pin(a, 8192).unwrap();
    p.map(pin.id).unwrap();
    p.free(a).unwrap();
    assert_eq!(p.pin_freed(pin.id), Some(true));
    let mut seen = vec![0u8; 8192];
    // SAFETY: the pin holds the chunk and its mapping.
    unsafe {
        gdr::copy::copy_from_mapping(&mut seen, pin.cpu.wrapping_add((a - pin.base) as usize))
    };
    assert_eq!(seen, data, "the bytes of freed memory, still pinned");
    let b = p.alloc(0, 8192).unwrap();
    assert_ne!(a, b, "not reused while pinned");
    p.free(b).unwrap();
    p.unpin(pin.id).unwrap(); // closes the mapping too
    let (free_before, _) = ctx.mem_info().unwrap();
    let released = p.trim(None);
    let (free_after, _) = ctx.mem_info().unwrap();
    assert!(released >= 2 << 20, "{released}");
    assert!(
        free_after >= free_before + released as usize - (2 << 20),
        "the driver got the memory back: free {free_before} -> {free_after}, released {released}"
    );
    assert_eq!(p.stats().chunks, 0);
}

/// The probe cache: the first probe measures and records, a second source (another process's,
/// in effect) is answered by the record, and its pool then opens Vulkan at the first pin and
/// moves bytes through it.
#[test]
fn a_cached_probe_serves_at_once_and_maps_at_the_first_pin() {
    let name = "a_cached_probe_serves_at_once_and_maps_at_the_first_pin";
    let Some(_ctx) = gdr_testing::gpu_context(name) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let cache = ProbeCache::new(vec![dir.clone()], Some(dir.clone()));
    let first = VmmSource::new();
    match first.probe(0, Some(&cache)) {
        Ok(p) => assert_eq!(p, Probed::Measured, "an empty cache cannot answer"),
        Err(why) => {
            gdr_testing::skip_or_fail::<()>(name, &format!("GPU 0 cannot serve the pool: {why}"));
            return;
        }
    }
    let entries = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(entries, 1, "the success was recorded");
    let second = VmmSource::new();
    let t0 = std::time::Instant::now();
    assert_eq!(second.probe(0, Some(&cache)).unwrap(), Probed::Cached);
    let probe_time = t0.elapsed();
    assert!(
        probe_time.as_millis() < 20,
        "a cached probe took {probe_time:?}"
    );
    let p = Pool::new(second, DEFAULT_CACHE);
    let n = 100_000;
    let a = p.alloc(0, n as u64).unwrap();
    let pin = p.pin(a, n as u64).unwrap();
    p.map(pin.id).unwrap();
    let cpu = pin.cpu.wrapping_add((a - pin.base) as usize);
    let data = random(n);
    // SAFETY: [cpu, cpu + n) lies in the chunk's live mapping (the pin holds it).
    unsafe { gdr::copy::copy_to_mapping(cpu, &data) };
    let mut back = vec![0xeeu8; n];
    cuda::memcpy_dtoh(&mut back, &Range(a, n), 0).unwrap();
    assert!(
        back == data,
        "bytes written through the mapping reached the GPU"
    );
    p.unmap(pin.id).unwrap();
    p.unpin(pin.id).unwrap();
    p.free(a).unwrap();
}
