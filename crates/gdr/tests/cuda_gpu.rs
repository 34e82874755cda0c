//! The CUDA layer on a real GPU: NVRTC compile, launch, mapped host memory, graphs.

use gdr::cuda::{
    self, DeviceBuffer, DeviceMemory, Graph, HostBuffer, LaunchConfig, Module, Stream,
};
use gdr_testing::gpu_context;
use rand::RngCore;
use std::ffi::c_void;

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
    let (mut d, mut s, mut len) = (dst.device_ptr(), src.device_ptr(), n as u64);
    let mut params = [
        &mut d as *mut u64 as *mut c_void,
        &mut s as *mut u64 as *mut c_void,
        &mut len as *mut u64 as *mut c_void,
    ];
    // SAFETY: parameters match add_one's signature; buffers live until synchronize.
    unsafe {
        f.launch(
            &stream,
            LaunchConfig::linear(n.div_ceil(256) as u32, 256),
            &mut params,
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
        unsafe {
            f.launch(
                st,
                LaunchConfig::linear(n.div_ceil(256) as u32, 256),
                &mut params,
            )
        }
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
