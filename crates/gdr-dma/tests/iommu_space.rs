//! The IOMMU address space ([`IommuSpace`]) over the simulated IOMMU: mappings are checked,
//! unmapped on drop, and memory a device may still reach is never freed.

use gdr_dma::{DmaError, HostPages, IommuBackend, IommuSpace, IovaRange, MappedMemory, SimIommu};
use std::sync::Arc;

#[test]
fn map_check_and_unmap_on_drop() {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 0x10_0000, 0x1000_0000).unwrap();
    let host = HostPages::new(3 * 4096).unwrap();
    {
        // SAFETY: dropped (below) before `host`.
        let m = unsafe { space.map(&host, "host") }.unwrap();
        assert_eq!(m.len(), 3 * 4096);
        space.check(IovaRange::new(m.iova() + 4096, 8192)).unwrap();
        assert!(matches!(
            space.check(IovaRange::new(m.iova() + 4096, 8193)),
            Err(DmaError::Unmapped { .. })
        ));
        assert!(space.check(IovaRange::new(m.iova() - 1, 2)).is_err());
        assert!(space.check(IovaRange::new(m.iova(), 0)).is_err());
        // The simulated IOMMU reaches the CPU memory behind the IOVA.
        sim.write(m.iova() + 10, &[7, 8, 9]).unwrap();
        let mut b = [0u8; 3];
        host.read_at(10, &mut b).unwrap();
        assert_eq!(b, [7, 8, 9]);
        assert_eq!(space.mappings().len(), 1);
    }
    assert!(space.mappings().is_empty());
    assert_eq!(sim.mapped_ranges(), vec![]);
}

#[test]
fn refuses_misaligned_and_oversize_mappings() {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 0x1000, 0x10_0000).unwrap();
    let host = HostPages::new(4 * 4096).unwrap();
    assert!(matches!(
        // SAFETY: refused, so nothing is mapped.
        unsafe { space.map_part(&host, 1, 4096, "x") },
        Err(DmaError::Misaligned { .. })
    ));
    assert!(matches!(
        // SAFETY: refused, so nothing is mapped.
        unsafe { space.map_part(&host, 0, 100, "x") },
        Err(DmaError::Misaligned { .. })
    ));
    assert!(matches!(
        // SAFETY: refused, so nothing is mapped.
        unsafe { space.map_part(&host, 4096, 4 * 4096, "x") },
        Err(DmaError::Oversize { .. })
    ));
    assert!(matches!(
        space.alloc_buffer(2 << 20, "big"),
        Err(DmaError::IovaExhausted { .. })
    ));
    assert!(sim.mapped_ranges().is_empty());
    assert!(IommuSpace::new(sim, 0x10, 0x10_0000).is_err());
}

#[test]
fn dma_buffer_owns_its_mapping() {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 0x1000, 0x100_0000).unwrap();
    let b = space.alloc_buffer(100, "b").unwrap();
    assert_eq!(b.len(), 4096);
    b.write_at(0, b"hello").unwrap();
    let mut out = [0u8; 5];
    sim.read(b.iova(), &mut out).unwrap();
    assert_eq!(&out, b"hello");
    let iova = b.iova();
    drop(b);
    assert!(sim.read(iova, &mut out).is_err());
    assert!(space.check(IovaRange::new(iova, 1)).is_err());
}

#[test]
fn owned_mapping_keeps_its_memory_alive() {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 0x1000, 0x100_0000).unwrap();
    let host = Arc::new(HostPages::new(2 * 4096).unwrap());
    let m = space.map_owned(host.clone(), "owned").unwrap();
    assert_eq!(Arc::strong_count(&host), 2);
    assert_eq!(m.len(), 2 * 4096);
    sim.write(m.iova() + 4095, &[1, 2]).unwrap();
    let mut b = [0u8; 2];
    m.memory().read_at(4095, &mut b).unwrap();
    assert_eq!(b, [1, 2]);
    let iova = m.iova();
    drop(m);
    assert_eq!(Arc::strong_count(&host), 1);
    assert!(sim.read(iova, &mut b).is_err());
    assert!(space.mappings().is_empty());
}

/// An IOMMU that maps but refuses every unmap.
struct StuckIommu(SimIommu);

impl IommuBackend for StuckIommu {
    fn page_size(&self) -> u64 {
        self.0.page_size()
    }
    fn map(&self, vaddr: usize, iova: u64, len: u64) -> Result<(), DmaError> {
        self.0.map(vaddr, iova, len)
    }
    fn unmap(&self, _iova: u64, _len: u64) -> Result<(), DmaError> {
        Err(DmaError::Invalid("unmap refused".into()))
    }
}

#[test]
fn a_refused_unmap_leaks_the_owned_memory_instead_of_freeing_it() {
    let stuck = Arc::new(StuckIommu(SimIommu::new(4096)));
    let space = IommuSpace::new(stuck.clone(), 0x1000, 0x100_0000).unwrap();
    let host = Arc::new(HostPages::new(4096).unwrap());
    let m = space.map_owned(host.clone(), "stuck").unwrap();
    let iova = m.iova();
    drop(m);
    // The mapping's reference was leaked: the memory outlives every other owner.
    assert_eq!(Arc::strong_count(&host), 2);
    // The device can still reach it, and the IOVA is not handed out again.
    stuck.0.write(iova, &[9]).unwrap();
    let mut b = [0u8; 1];
    host.read_at(0, &mut b).unwrap();
    assert_eq!(b, [9]);
    let again = space.alloc_buffer(4096, "next");
    assert!(again.is_err() || again.unwrap().iova() != iova);
}
