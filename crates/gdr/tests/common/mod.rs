//! What the GPU tests of gdr's BAR mappings share: the backend (or a skip), random bytes, and an
//! auto copier whose every class is contested.

use gdr::bar::auto::{AutoCopier, Calibration, Direction, Path, Point, CLASSES};
use gdr::bar::VulkanBackend;
use gdr_testing::{gpu_context, skip_or_fail};
use rand::RngCore;

/// The Vulkan backend on GPU 0, or `None` after the skip is said.
pub fn backend(name: &str) -> Option<VulkanBackend> {
    let ctx = gpu_context(name)?;
    match VulkanBackend::new(&ctx) {
        Ok(b) => Some(b),
        Err(e) => skip_or_fail(name, &e.to_string()),
    }
}

/// `n` random bytes.
pub fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

/// An auto copier with every class of both directions contested by the copy engine and the
/// one-thread mapping (rated alike), so that calls go to both.
pub fn contested_copier() -> AutoCopier {
    let paths = [Path::Mapping { threads: 1 }, Path::CopyEngine];
    let mut points = Vec::new();
    for direction in [Direction::ToGpu, Direction::FromGpu] {
        for k in 0..CLASSES {
            for path in paths {
                points.push(Point {
                    direction,
                    size: 1 << k,
                    path,
                    median_us: 1.0,
                });
            }
        }
    }
    AutoCopier::from_calibration(Calibration {
        key: "test".into(),
        to_gpu: vec![paths[0]; CLASSES],
        from_gpu: vec![paths[0]; CLASSES],
        points,
    })
}

/// Whether every byte of `bytes` outside `[start, start + len)` is still `fill`.
pub fn untouched_around(bytes: &[u8], start: usize, len: usize, fill: u8) -> bool {
    bytes[..start]
        .iter()
        .chain(&bytes[start + len..])
        .all(|&b| b == fill)
}
