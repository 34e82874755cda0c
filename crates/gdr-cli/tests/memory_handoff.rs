//! One memory vocabulary across the crates: GPU memory mapped through BAR1 (gdr's
//! `MappedBuffer`) and ring regions are `gdr_mem::MappedMemory`, so they go to a ring or into an
//! IOMMU for a DMA engine with no `unsafe` at the call site. The IOMMU here is gdr-dma's
//! simulated one, which reaches memory through the CPU mapping as a device reaches it through
//! the IOMMU; the GPU test checks with cuMemcpy that the "device's" writes landed in GPU memory.

use gdr::bar::VulkanBackend;
use gdr::cuda;
use gdr::mem::MappedMemory;
use gdr_dma::{IommuSpace, SimIommu};
use gdr_mq::{PlainMemory, Region, RingMemory};
use gdr_testing::{gpu_context, skip_or_fail};
use rand::RngCore;
use std::sync::Arc;

fn random(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

fn space() -> (Arc<SimIommu>, IommuSpace) {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 0x1_0000, 0x1000_0000).unwrap();
    (sim, space)
}

#[test]
fn a_ring_region_goes_into_the_iommu_without_unsafe() {
    let mem: Arc<dyn RingMemory> = Arc::new(PlainMemory::new(4 * 4096).unwrap());
    let region = Region::whole(mem).sub(4096, 2 * 4096).unwrap();
    let (sim, space) = space();
    let m = space.map_owned(Arc::new(region.clone()), "ring").unwrap();
    assert_eq!(m.len(), 2 * 4096);
    let data = random(3000);
    sim.write(m.iova() + 5000, &data).unwrap();
    let mut back = vec![0x5au8; 3000];
    region.read(5000, &mut back);
    assert_eq!(back, data);
    // And the other way: what the CPU writes through the region, the device reads.
    let data = random(100);
    region.write(64, &data);
    let mut seen = vec![0u8; 100];
    sim.read(m.iova() + 64, &mut seen).unwrap();
    assert_eq!(seen, data);
    let iova = m.iova();
    drop(m);
    assert!(
        sim.read(iova, &mut seen).is_err(),
        "still mapped after drop"
    );
}

#[test]
fn a_bar_mapping_of_gpu_memory_goes_into_the_iommu_without_unsafe() {
    let name = "a_bar_mapping_of_gpu_memory_goes_into_the_iommu_without_unsafe";
    let Some(ctx) = gpu_context(name) else {
        return;
    };
    let be = match VulkanBackend::new(&ctx) {
        Ok(b) => b,
        Err(e) => {
            skip_or_fail::<()>(name, &e.to_string());
            return;
        }
    };
    let len = 64 << 10;
    let buf = be.alloc(len, 4096).unwrap();
    cuda::memset(&buf, 0xa5).unwrap();
    buf.context().synchronize().unwrap();
    let gpu = Arc::new(buf);
    let (sim, space) = space();
    let m = space.map_owned(gpu.clone(), "gpu").unwrap();
    // The "device" writes GPU memory through the IOMMU; the GPU sees exactly those bytes.
    let data = random(10_000);
    sim.write(m.iova() + 777, &data).unwrap();
    let mut back = vec![0x5au8; len];
    cuda::memcpy_dtoh(&mut back, &*gpu, 0).unwrap();
    assert!(back[..777].iter().all(|&b| b == 0xa5), "head clobbered");
    assert_eq!(&back[777..10_777], &data[..]);
    assert!(back[10_777..].iter().all(|&b| b == 0xa5), "tail clobbered");
    // The same buffer is also a ring region; the trait reads what the device wrote.
    let region = Region::whole(gpu.clone() as Arc<dyn RingMemory>);
    let mut via_ring = vec![0u8; 10_000];
    region.read_at(777, &mut via_ring).unwrap();
    assert_eq!(via_ring, data);
    drop(m);
    assert_eq!(
        Arc::strong_count(&gpu),
        2,
        "the mapping still holds the buffer"
    );
}
