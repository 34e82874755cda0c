//! The CUDA layer on a real GPU: NVRTC compile, launch, mapped host memory, graphs.

use gdr::cuda::{
    self, DeviceBuffer, DeviceMemory, Graph, HostBuffer, KernelArgs, LaunchConfig, Module, Stream,
};
use gdr_testing::gpu_context;
use rand::RngCore;

const SRC: &str = r#"
extern "C" __global__ void add_one(unsigned char *dst, const unsigned char *src, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + 1;
}
"#;

#[test]
fn nvrtc_kernel_on_device_and_mapped_host_memory() {
    let Some(ctx) = gpu_context("nvrtc_kernel_on_device_and_mapped_host_memory") else {
        return;
    };
    let module = Module::from_source(&ctx, "add_one.cu", SRC).unwrap();
    let f = module.function("add_one").unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let n = 100_003usize;
    let mut src = HostBuffer::new(&ctx, n).unwrap();
    rand::thread_rng().fill_bytes(src.as_mut_slice());
    let dst = DeviceBuffer::new(&ctx, n).unwrap();
    cuda::memset(&dst, 0).unwrap();
    let (d, s, len): (u64, u64, u64) = (dst.device_ptr(), src.device_ptr(), n as u64);
    let args = KernelArgs::new().arg(&d).arg(&s).arg(&len);
    // SAFETY: parameters match add_one's signature; buffers live until synchronize.
    unsafe {
        f.launch(
            &stream,
            LaunchConfig::linear(n.div_ceil(256) as u32, 256),
            &args,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    let mut out = vec![0u8; n];
    cuda::memcpy_dtoh(&mut out, &dst, 0).unwrap();
    for (i, (&o, &s)) in out.iter().zip(src.as_slice()).enumerate() {
        assert_eq!(o, s.wrapping_add(1), "byte {i}");
    }

    // The same launch captured in a graph and replayed.
    let graph = Graph::capture(&stream, |st| {
        // SAFETY: as above.
        unsafe { f.launch(st, LaunchConfig::linear(n.div_ceil(256) as u32, 256), &args) }
    })
    .unwrap();
    cuda::memset(&dst, 0).unwrap();
    graph.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    cuda::memcpy_dtoh(&mut out, &dst, 0).unwrap();
    assert_eq!(out[n - 1], src.as_slice()[n - 1].wrapping_add(1));
}

#[test]
fn compile_errors_carry_the_log() {
    let Some(ctx) = gpu_context("compile_errors_carry_the_log") else {
        return;
    };
    let err = match Module::from_source(&ctx, "bad.cu", "this is not cuda") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("bad source compiled"),
    };
    assert!(err.contains("bad.cu"), "{err}");
}

/// Copy-engine reads into host memory (`cuda::read_into_host`): through the page-locked chunks
/// for pageable destinations up to `STAGED_READ_MAX`, straight in for page-locked ones and
/// larger reads; every size and offset gives the device's bytes, on the legacy stream and on
/// a stream of ours, and a range past the buffer is refused before anything is written.
#[test]
fn reads_into_host_memory_give_the_device_bytes() {
    let Some(ctx) = gpu_context("reads_into_host_memory_give_the_device_bytes") else {
        return;
    };
    let n = 8 << 20;
    let mut want = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut want);
    let dev = DeviceBuffer::new(&ctx, n).unwrap();
    cuda::memcpy_htod(&dev, 0, &want).unwrap();
    // Landed before the reads below, some of them on a non-blocking stream that does not wait
    // for the legacy one.
    cuda::synchronize_legacy_stream().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let sizes = [
        1,
        4095,
        (64 << 10) + 3,
        256 << 10,
        (1 << 20) + 17,
        2 << 20,
        (2 << 20) + 1,
        (5 << 20) + 7,
        cuda::STAGED_READ_MAX - 1,
        cuda::STAGED_READ_MAX,
        cuda::STAGED_READ_MAX + 1,
        (7 << 20) + 5,
    ];
    for (i, &len) in sizes.iter().enumerate() {
        let offset = [0, 13, 4096][i % 3];
        let on = if i % 2 == 0 { None } else { Some(&stream) };
        let mut dst = vec![!want[offset]; len];
        assert!(!cuda::is_page_locked(dst.as_ptr(), len));
        cuda::read_into_host(&ctx, &mut dst, &dev, offset, on).unwrap();
        assert!(dst == want[offset..offset + len], "{len} bytes at {offset}");
    }
    // A page-locked destination is copied into directly.
    let mut pinned = HostBuffer::new(&ctx, 3 << 20).unwrap();
    assert!(cuda::is_page_locked(pinned.as_slice().as_ptr(), 3 << 20));
    pinned.as_mut_slice().fill(0xEE);
    cuda::read_into_host(&ctx, pinned.as_mut_slice(), &dev, 7, Some(&stream)).unwrap();
    assert!(pinned.as_slice() == &want[7..7 + (3 << 20)]);
    // Nothing to read: Ok inside the buffer, refused past it.
    cuda::read_into_host(&ctx, &mut [], &dev, n, None).unwrap();
    assert!(cuda::read_into_host(&ctx, &mut [], &dev, n + 1, None).is_err());
    // Past the end: refused, nothing written.
    let mut dst = vec![0xABu8; 4096];
    assert!(cuda::read_into_host(&ctx, &mut dst, &dev, n - 100, None).is_err());
    assert!(dst.iter().all(|&b| b == 0xAB));
    // The stager on its own, reused across reads of different chunkings.
    let mut st = cuda::Stager::new(&ctx).unwrap();
    for len in [(3 << 20) + 1, 100, 1 << 20] {
        let mut dst = vec![0u8; len];
        st.read(&mut dst, &dev, 1, None).unwrap();
        assert!(dst == want[1..1 + len], "stager, {len} bytes");
    }
}
