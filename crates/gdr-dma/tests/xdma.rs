//! The XDMA driver against the behavioural model (tests/support/xdma_model.rs): single and
//! chained descriptors, both directions, copies larger than device RAM, interrupts vs polling,
//! and every error status.

#[path = "support/xdma_model.rs"]
mod xdma_model;

use gdr_dma::{
    Copier, DmaDirection, DmaEngine, DmaError, Endpoint, EventFd, Interrupt, IommuSpace, IovaRange,
    Leds, MappedMemory, Segment, SimIommu, XdmaConfig, XdmaEngine,
};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xdma_model::{GpioModel, ModelConfig, XdmaModel};

const T: Duration = Duration::from_secs(2);

struct Rig {
    model: XdmaModel,
    space: IommuSpace,
    engine: XdmaEngine<XdmaModel>,
}

fn rig(mcfg: ModelConfig, cfg: XdmaConfig, irq: bool) -> Rig {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 1 << 20, 1 << 40).unwrap();
    let ev = EventFd::new().unwrap();
    let model = XdmaModel::new(mcfg, sim, irq.then(|| ev.try_clone().unwrap()));
    let irq: Option<Box<dyn Interrupt>> = if irq { Some(Box::new(ev)) } else { None };
    let engine = XdmaEngine::new(model.clone(), &space, cfg, irq).unwrap();
    Rig {
        model,
        space,
        engine,
    }
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(rand::random());
    (0..n).map(|_| r.gen()).collect()
}

fn assert_clean(m: &XdmaModel) {
    let st = m.state();
    assert!(
        st.violations.is_empty(),
        "protocol violations: {:?}",
        st.violations
    );
}

#[test]
fn single_descriptor_each_way_polled() {
    let mut r = rig(ModelConfig::default(), XdmaConfig::picoevb(), false);
    let data = random_bytes(5000);
    let src = r.space.alloc_buffer(8192, "src").unwrap();
    let dst = r.space.alloc_buffer(8192, "dst").unwrap();
    src.write_at(0, &data).unwrap();
    dst.write_at(0, &vec![0xa5; 8192]).unwrap();

    let s = r
        .engine
        .submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: src.iova(),
                dev: 0x100,
                len: 5000,
            }],
            T,
        )
        .unwrap();
    assert_eq!((s.bytes, s.descriptors, s.interrupts), (5000, 1, 0));
    assert_eq!(&r.model.state().ram[0x100..0x100 + 5000], &data[..]);
    r.engine
        .submit(
            DmaDirection::FromDevice,
            &[Segment {
                iova: dst.iova() + 8,
                dev: 0x100,
                len: 5000,
            }],
            T,
        )
        .unwrap();
    let mut got = vec![0u8; 8192];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(&got[8..5008], &data[..]);
    assert!(
        got[..8].iter().chain(&got[5008..]).all(|&b| b == 0xa5),
        "wrote outside the range"
    );

    let st = r.model.state();
    assert_eq!(st.runs.len(), 2);
    for (run, h2c) in st.runs.iter().zip([true, false]) {
        assert_eq!(run.h2c, h2c);
        let d = run.descriptors[0];
        assert_eq!(d.control >> 16, 0xad4b);
        assert_eq!(
            d.control & 0x13,
            0x13,
            "STOP | COMPLETED | EOP on the only descriptor"
        );
        assert_eq!(d.len, 5000);
        assert_eq!(d.next, 0);
    }
    assert_eq!(st.runs[0].descriptors[0].src, src.iova());
    assert_eq!(st.runs[0].descriptors[0].dst, 0x100);
    assert_eq!(st.runs[1].descriptors[0].src, 0x100);
    assert_eq!(st.runs[1].descriptors[0].dst, dst.iova() + 8);
    drop(st);
    assert_clean(&r.model);
    assert!(
        !r.model.running(true) && !r.model.running(false),
        "channels stopped afterwards"
    );
}

#[test]
fn chained_descriptors_scatter_and_cross_descriptor_pages() {
    let mut r = rig(ModelConfig::default(), XdmaConfig::picoevb(), false);
    // 200 descriptors of 128 bytes from scattered pieces: the list spans two 4 KiB pages of
    // descriptors, so the next-adjacent counts must stop at the page boundary.
    let src = r.space.alloc_buffer(200 * 256, "src").unwrap();
    let data = random_bytes(200 * 256);
    src.write_at(0, &data).unwrap();
    let segs: Vec<Segment> = (0..200u64)
        .map(|i| Segment {
            iova: src.iova() + i * 256,
            dev: i * 128,
            len: 128,
        })
        .collect();
    let s = r.engine.submit(DmaDirection::ToDevice, &segs, T).unwrap();
    assert_eq!((s.descriptors, s.submissions), (200, 1));
    let st = r.model.state();
    for i in 0..200 {
        assert_eq!(
            &st.ram[i * 128..(i + 1) * 128],
            &data[i * 256..i * 256 + 128],
            "piece {i}"
        );
    }
    let run = &st.runs[0];
    assert_eq!(run.descriptors.len(), 200);
    assert!(
        run.descriptors[..199].iter().all(|d| d.control & 0x13 == 0),
        "only the last stops"
    );
    assert_eq!(run.descriptors[199].control & 0x13, 0x13);
    // Adjacency is used (not all zero) yet never crosses a page (checked by the model).
    assert!(run
        .descriptors
        .iter()
        .any(|d| (d.control >> 8) & 0x3f == 63));
    drop(st);
    assert_clean(&r.model);
}

#[test]
fn copies_larger_than_device_ram_with_one_interrupt_per_list() {
    let cfg = XdmaConfig {
        max_segment: 4096,
        ..XdmaConfig::picoevb()
    };
    let mut r = rig(ModelConfig::default(), cfg, true);
    let len = 1usize << 20; // 16x the 64 KiB of device RAM
    let src = r.space.alloc_buffer(len, "src").unwrap();
    let dst = r.space.alloc_buffer(len, "dst").unwrap();
    let data = random_bytes(len);
    src.write_at(0, &data).unwrap();
    dst.write_at(0, &data.iter().map(|b| !b).collect::<Vec<_>>())
        .unwrap();
    let st = Copier::new(&mut r.engine, &r.space)
        .copy(
            &Endpoint::iova(src.range()),
            &Endpoint::iova(dst.range()),
            len as u64,
        )
        .unwrap();
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data, "copy through device RAM corrupted data");
    // 16 rounds, each one H2C list and one C2H list of 16 descriptors.
    assert_eq!(st.submissions, 32);
    assert_eq!(st.descriptors, 2 * len / 4096);
    assert_eq!(
        st.interrupts, 32,
        "one interrupt per list, not per descriptor"
    );
    let m = r.model.state();
    assert_eq!(m.interrupts_sent, 32);
    assert!(m.runs.iter().all(|run| run.descriptors.len() == 16));
    drop(m);
    assert_clean(&r.model);
}

#[test]
fn device_memory_endpoints_and_scatter_lists() {
    // The model's 2 GiB of RAM is only touched where written.
    let mcfg = ModelConfig {
        ram: 2 << 30,
        ..Default::default()
    };
    let mut r = rig(mcfg, XdmaConfig::htg_k800(), false);
    let a = r.space.alloc_buffer(12288, "a").unwrap();
    let b = r.space.alloc_buffer(12288, "b").unwrap();
    let data = random_bytes(12288);
    a.write_at(0, &data).unwrap();
    // Into device memory at 1 GiB from two pieces, back out into one.
    let pieces = Endpoint::Iova(vec![
        IovaRange::new(a.iova(), 4096),
        IovaRange::new(a.iova() + 4096, 8192),
    ]);
    let mut c = Copier::new(&mut r.engine, &r.space);
    c.copy(&pieces, &Endpoint::Device(1 << 30), 12288).unwrap();
    c.copy(
        &Endpoint::Device(1 << 30),
        &Endpoint::iova(b.range()),
        12288,
    )
    .unwrap();
    let mut got = vec![0u8; 12288];
    b.read_at(0, &mut got).unwrap();
    assert_eq!(got, data);
    assert!(matches!(
        c.copy(&pieces, &Endpoint::Device((2 << 30) - 4096), 12288),
        Err(DmaError::Oversize { .. })
    ));
    assert_clean(&r.model);
}

#[test]
fn unmapped_addresses_give_read_and_write_errors() {
    let mut r = rig(ModelConfig::default(), XdmaConfig::picoevb(), false);
    let buf = r.space.alloc_buffer(4096, "b").unwrap();
    let hole = buf.iova() + (64 << 20);
    // The Copier refuses before the device sees anything...
    let e = Copier::new(&mut r.engine, &r.space)
        .copy(
            &Endpoint::iova(IovaRange::new(hole, 4096)),
            &Endpoint::Device(0),
            4096,
        )
        .unwrap_err();
    assert!(matches!(e, DmaError::Unmapped { .. }), "{e}");
    assert!(r.model.state().runs.is_empty());
    // ...and straight to the engine, the IOMMU faults and the engine reports it.
    let e = r
        .engine
        .submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: hole,
                dev: 0,
                len: 4096,
            }],
            T,
        )
        .unwrap_err();
    match e {
        DmaError::Engine { status, detail, .. } => {
            assert_ne!(status & xdma_model::READ_ERROR, 0);
            assert!(
                detail.contains("read error") && detail.contains("0 of 1"),
                "{detail}"
            );
        }
        other => panic!("{other}"),
    }
    let e = r
        .engine
        .submit(
            DmaDirection::FromDevice,
            &[Segment {
                iova: hole,
                dev: 0,
                len: 64,
            }],
            T,
        )
        .unwrap_err();
    assert!(
        matches!(e, DmaError::Engine { status, .. } if status & xdma_model::WRITE_ERROR != 0),
        "{e}"
    );
    // The engine still works afterwards.
    r.engine
        .submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: buf.iova(),
                dev: 0,
                len: 64,
            }],
            T,
        )
        .unwrap();
    assert!(!r.model.running(true));
}

#[test]
fn bad_magic_and_descriptor_fetch_errors_are_reported() {
    let buf_len = 16 * 1024;
    for (mcfg, want) in [
        (
            ModelConfig {
                corrupt_magic_at: Some(2),
                ..Default::default()
            },
            "bad descriptor magic",
        ),
        (
            ModelConfig {
                fail_fetch_at: Some(1),
                ..Default::default()
            },
            "descriptor fetch error",
        ),
    ] {
        let mut r = rig(mcfg, XdmaConfig::picoevb(), false);
        let buf = r.space.alloc_buffer(buf_len, "b").unwrap();
        let segs: Vec<Segment> = (0..4u64)
            .map(|i| Segment {
                iova: buf.iova() + i * 4096,
                dev: i * 4096,
                len: 4096,
            })
            .collect();
        match r
            .engine
            .submit(DmaDirection::ToDevice, &segs, T)
            .unwrap_err()
        {
            DmaError::Engine { detail, .. } => assert!(detail.contains(want), "{detail}"),
            other => panic!("{other}"),
        }
        assert!(!r.model.running(true), "channel stopped after the error");
    }
}

#[test]
fn alignment_and_length_rules_come_from_the_engine() {
    let mcfg = ModelConfig {
        addr_align: 64,
        len_granularity: 4,
        ..Default::default()
    };
    let mut r = rig(mcfg, XdmaConfig::picoevb(), false);
    assert_eq!(r.engine.limits().align, 64);
    let buf = r.space.alloc_buffer(8192, "b").unwrap();
    for seg in [
        Segment {
            iova: buf.iova() + 4,
            dev: 0,
            len: 64,
        },
        Segment {
            iova: buf.iova(),
            dev: 32,
            len: 64,
        },
        Segment {
            iova: buf.iova(),
            dev: 0,
            len: 66,
        },
    ] {
        assert!(matches!(
            r.engine.submit(DmaDirection::ToDevice, &[seg], T),
            Err(DmaError::Misaligned { .. })
        ));
    }
    assert!(matches!(
        r.engine.submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: buf.iova(),
                dev: 0,
                len: 2 << 20
            }],
            T
        ),
        Err(DmaError::Oversize { .. })
    ));
    assert!(
        r.model.state().runs.is_empty(),
        "nothing reached the device"
    );
    // Aligned requests pass the model's own checks.
    r.engine
        .submit(
            DmaDirection::ToDevice,
            &[Segment {
                iova: buf.iova() + 64,
                dev: 128,
                len: 640,
            }],
            T,
        )
        .unwrap();
    assert_eq!(r.model.state().runs[0].status & 0x3f, 0x6);
}

#[test]
fn a_hung_engine_times_out_and_is_stopped() {
    for irq in [false, true] {
        let mut r = rig(
            ModelConfig {
                hang: true,
                ..Default::default()
            },
            XdmaConfig::picoevb(),
            irq,
        );
        let buf = r.space.alloc_buffer(4096, "b").unwrap();
        let t0 = Instant::now();
        let e = r
            .engine
            .submit(
                DmaDirection::FromDevice,
                &[Segment {
                    iova: buf.iova(),
                    dev: 0,
                    len: 4096,
                }],
                Duration::from_millis(30),
            )
            .unwrap_err();
        assert!(matches!(e, DmaError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(!r.model.running(false), "RUN cleared after the timeout");
    }
}

#[test]
fn wrong_identifier_or_small_bar_is_refused() {
    let sim = Arc::new(SimIommu::new(4096));
    let space = IommuSpace::new(sim.clone(), 1 << 20, 1 << 30).unwrap();
    let model = XdmaModel::new(
        ModelConfig {
            bad_identifier: true,
            ..Default::default()
        },
        sim,
        None,
    );
    assert!(matches!(
        XdmaEngine::new(model, &space, XdmaConfig::picoevb(), None),
        Err(DmaError::Unsupported(_))
    ));
    assert!(space.mappings().is_empty(), "descriptor buffer not leaked");
    assert!(matches!(
        XdmaEngine::new(GpioModel::default(), &space, XdmaConfig::picoevb(), None),
        Err(DmaError::Unsupported(_))
    ));
}

#[test]
fn leds_are_written_inverted() {
    let gpio = GpioModel::default();
    let leds = Leds::new(gpio.clone()).unwrap();
    leds.set(0b101).unwrap();
    assert_eq!(*gpio.data.lock().unwrap(), 0b010);
    assert_eq!(leds.get(), 0b101);
    leds.set_raw(7).unwrap();
    assert_eq!(*gpio.data.lock().unwrap(), 7, "picoevb's 7 = all off");
    assert_eq!(leds.get(), 0);
    leds.set_raw(0).unwrap();
    assert_eq!(leds.get(), 7);
    assert!(leds.set(8).is_err());
    assert!(leds.set_raw(9).is_err());
    assert_eq!(
        *gpio.data.lock().unwrap(),
        0,
        "a refused value writes nothing"
    );
}
