//! QEMU's `edu` teaching device (PCI 1234:11e8) as a DMA engine: one 4 KiB buffer at device
//! address 0x40000, one transfer at a time, completion by MSI/INTx or by polling the command
//! register. It stands in for an FPGA in the VFIO integration test.
//!
//! The device trusts whatever it is told (older QEMUs abort on an out-of-range transfer), so
//! every request is checked here before a register is written.

use crate::engine::{
    check_submission, DmaDirection, DmaEngine, EngineLimits, Segment, TransferStats,
};
use crate::error::{DmaError, Result};
use crate::irq::Interrupt;
use crate::regs::RegisterIo;
use std::time::{Duration, Instant};

/// PCI IDs.
pub const VENDOR: u16 = 0x1234;
pub const DEVICE: u16 = 0x11e8;

/// Register offsets in BAR0 (QEMU docs/specs/edu.rst).
pub mod reg {
    pub const IDENT: u64 = 0x00;
    pub const LIVENESS: u64 = 0x04;
    pub const IRQ_STATUS: u64 = 0x24;
    pub const IRQ_ACK: u64 = 0x64;
    pub const DMA_SRC: u64 = 0x80;
    pub const DMA_DST: u64 = 0x88;
    pub const DMA_COUNT: u64 = 0x90;
    pub const DMA_CMD: u64 = 0x98;
    /// Command bits: start (cleared by the device when done), direction, interrupt on done.
    pub const CMD_START: u64 = 0x1;
    pub const CMD_TO_RAM: u64 = 0x2;
    pub const CMD_IRQ: u64 = 0x4;
    /// Interrupt status bit of a finished DMA.
    pub const IRQ_DMA: u32 = 0x100;
}

/// Where the device's buffer sits in its own DMA address space, and its size.
pub const BUFFER_ADDR: u64 = 0x40000;
pub const BUFFER_LEN: u64 = 4096;
/// The part of the buffer the engine uses. QEMU 7.2 (Debian 12) rejects a transfer that ends
/// at the buffer's last byte (an off-by-one in its range check) and aborts the whole VM, so
/// the last 64 bytes stay unused.
pub const BUFFER_USABLE: u64 = BUFFER_LEN - 64;
/// The device only drives 28 address bits unless started with a wider `dma_mask`.
pub const DEFAULT_IOVA_LIMIT: u64 = 1 << 28;

/// The edu DMA engine over its BAR0.
pub struct EduEngine<R: RegisterIo> {
    regs: R,
    irq: Option<Box<dyn Interrupt>>,
    iova_limit: u64,
}

impl<R: RegisterIo> EduEngine<R> {
    /// Checks the identification and liveness registers, and that no DMA is left running.
    pub fn new(regs: R, irq: Option<Box<dyn Interrupt>>) -> Result<Self> {
        if regs.len() < reg::DMA_CMD + 8 {
            return Err(DmaError::Unsupported(format!(
                "an edu BAR0 of at least {:#x} bytes (got {:#x})",
                reg::DMA_CMD + 8,
                regs.len()
            )));
        }
        let id = regs.read32(reg::IDENT);
        if id & 0xffff != 0x00ed {
            return Err(DmaError::Unsupported(format!(
                "an edu device (identification reads {id:#x})"
            )));
        }
        let probe = 0x5a5a_1234u32;
        regs.write32(reg::LIVENESS, probe);
        if regs.read32(reg::LIVENESS) != !probe {
            return Err(DmaError::Unsupported(
                "a live edu device (liveness check failed)".into(),
            ));
        }
        let mut e = EduEngine {
            regs,
            irq,
            iova_limit: DEFAULT_IOVA_LIMIT,
        };
        e.wait_idle(Duration::from_secs(1), "edu DMA left running")?;
        e.regs.write32(reg::IRQ_ACK, e.regs.read32(reg::IRQ_STATUS));
        Ok(e)
    }

    /// For a device started with a wider `dma_mask`.
    pub fn with_iova_limit(mut self, limit: u64) -> Self {
        self.iova_limit = limit;
        self
    }

    /// The device's major.minor version.
    pub fn version(&self) -> (u8, u8) {
        let id = self.regs.read32(reg::IDENT);
        ((id >> 24) as u8, (id >> 16) as u8)
    }

    /// Whether completions are waited for by interrupt (else the command register is polled).
    pub fn uses_interrupts(&self) -> bool {
        self.irq.is_some()
    }

    fn running(&self) -> bool {
        self.regs.read64(reg::DMA_CMD) & reg::CMD_START != 0
    }

    /// Polls the command register with a growing sleep until the start bit clears.
    fn wait_idle(&mut self, limit: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut nap = Duration::from_micros(2);
        while self.running() {
            let now = Instant::now();
            if now >= deadline {
                return Err(DmaError::Timeout {
                    what: what.to_string(),
                    after: limit,
                });
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(2));
        }
        Ok(())
    }

    fn run_one(&mut self, dir: DmaDirection, s: &Segment, timeout: Duration) -> Result<usize> {
        let (src, dst, cmd) = match dir {
            DmaDirection::ToDevice => (s.iova, BUFFER_ADDR + s.dev, 0),
            DmaDirection::FromDevice => (BUFFER_ADDR + s.dev, s.iova, reg::CMD_TO_RAM),
        };
        let irq_bit = if self.irq.is_some() { reg::CMD_IRQ } else { 0 };
        self.regs.write64(reg::DMA_SRC, src);
        self.regs.write64(reg::DMA_DST, dst);
        self.regs.write64(reg::DMA_COUNT, s.len);
        self.regs
            .write64(reg::DMA_CMD, cmd | irq_bit | reg::CMD_START);
        let what = format!("edu DMA of {} bytes", s.len);
        let deadline = Instant::now() + timeout;
        let mut interrupts = 0;
        if let Some(irq) = self.irq.as_mut() {
            // The interrupt was asked for, so wait for it even if the DMA already looks done;
            // a stale wake-up (left from an earlier transfer) just loops once more.
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !irq.wait(left)? {
                    return Err(self.drain_after_timeout(what, timeout));
                }
                interrupts += 1;
                // Acknowledge at the device first, then let VFIO deliver the next one.
                self.regs.write32(reg::IRQ_ACK, reg::IRQ_DMA);
                irq.rearm()?;
                if self.regs.read64(reg::DMA_CMD) & reg::CMD_START == 0 {
                    break;
                }
            }
        } else if self.wait_idle(timeout, &what).is_err() {
            return Err(self.drain_after_timeout(what, timeout));
        }
        Ok(interrupts)
    }

    /// edu cannot abort a transfer: after a timeout, wait (bounded) for the one in flight to
    /// end, so that the caller's buffers are no longer being read or written when the error
    /// reaches it, then clear its interrupt and re-enable delivery (INTx stays masked otherwise).
    fn drain_after_timeout(&mut self, what: String, after: Duration) -> DmaError {
        let drained = self.wait_idle(DRAIN_LIMIT, &what).is_ok();
        if let Some(irq) = self.irq.as_mut() {
            self.regs.write32(reg::IRQ_ACK, reg::IRQ_DMA);
            // A failed re-arm shows up as the next transfer's timeout; the timeout is the news.
            let _ = irq.rearm();
        }
        DmaError::Timeout {
            what: if drained {
                what
            } else {
                format!("{what} (and it was still running {DRAIN_LIMIT:?} later)")
            },
            after,
        }
    }
}

/// How long a timed-out edu transfer is waited for before giving up on it.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

impl<R: RegisterIo> DmaEngine for EduEngine<R> {
    fn name(&self) -> &'static str {
        "edu"
    }

    fn limits(&self) -> EngineLimits {
        EngineLimits {
            device_memory: BUFFER_USABLE,
            max_segment: BUFFER_USABLE,
            max_segments: 1,
            align: 1,
            iova_limit: self.iova_limit,
        }
    }

    fn submit(
        &mut self,
        dir: DmaDirection,
        segs: &[Segment],
        timeout: Duration,
    ) -> Result<TransferStats> {
        check_submission(&self.limits(), segs)?;
        let t0 = Instant::now();
        let mut stats = TransferStats {
            submissions: 1,
            ..Default::default()
        };
        for s in segs {
            stats.interrupts += self.run_one(dir, s, timeout)?;
            stats.bytes += s.len;
            stats.descriptors += 1;
        }
        stats.elapsed = t0.elapsed();
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::irq::EventFd;
    use std::cell::RefCell;

    /// A register-level edu: DMA completes after `latency` command reads, against a flat
    /// "RAM" at IOVA 0.
    struct Model {
        st: RefCell<St>,
        irq: Option<EventFd>,
    }
    #[derive(Default)]
    struct St {
        liveness: u32,
        src: u64,
        dst: u64,
        cnt: u64,
        cmd: u64,
        irq_status: u32,
        pending_reads: u32,
        latency: u32,
        hang: bool,
        buf: Vec<u8>,
        ram: Vec<u8>,
        writes: Vec<(u64, u64)>,
    }
    impl Model {
        fn new(latency: u32, irq: Option<EventFd>) -> Self {
            Model {
                st: RefCell::new(St {
                    latency,
                    buf: vec![0; 4096],
                    ram: vec![0; 1 << 16],
                    ..Default::default()
                }),
                irq,
            }
        }
        fn finish(&self, st: &mut St) {
            let n = st.cnt as usize;
            if st.cmd & reg::CMD_TO_RAM == 0 {
                let b = (st.dst - BUFFER_ADDR) as usize;
                let s = st.src as usize;
                let data = st.ram[s..s + n].to_vec();
                st.buf[b..b + n].copy_from_slice(&data);
            } else {
                let b = (st.src - BUFFER_ADDR) as usize;
                let d = st.dst as usize;
                let data = st.buf[b..b + n].to_vec();
                st.ram[d..d + n].copy_from_slice(&data);
            }
            st.cmd &= !reg::CMD_START;
            if st.cmd & reg::CMD_IRQ != 0 {
                st.irq_status |= reg::IRQ_DMA;
                if let Some(e) = &self.irq {
                    e.signal(1).unwrap();
                }
            }
        }
    }
    impl RegisterIo for Model {
        fn len(&self) -> u64 {
            1 << 20
        }
        fn read32(&self, off: u64) -> u32 {
            let st = self.st.borrow();
            match off {
                reg::IDENT => 0x0100_00ed,
                reg::LIVENESS => !st.liveness,
                reg::IRQ_STATUS => st.irq_status,
                _ => self.read64(off) as u32,
            }
        }
        fn write32(&self, off: u64, v: u32) {
            let mut st = self.st.borrow_mut();
            match off {
                reg::LIVENESS => st.liveness = v,
                reg::IRQ_ACK => st.irq_status &= !v,
                _ => {}
            }
        }
        fn read64(&self, off: u64) -> u64 {
            let mut st = self.st.borrow_mut();
            if off == reg::DMA_CMD && st.cmd & reg::CMD_START != 0 && !st.hang {
                if st.pending_reads == 0 {
                    self.finish(&mut st);
                } else {
                    st.pending_reads -= 1;
                }
            }
            match off {
                reg::DMA_SRC => st.src,
                reg::DMA_DST => st.dst,
                reg::DMA_COUNT => st.cnt,
                reg::DMA_CMD => st.cmd,
                _ => u64::MAX,
            }
        }
        fn write64(&self, off: u64, v: u64) {
            let mut st = self.st.borrow_mut();
            st.writes.push((off, v));
            if st.cmd & reg::CMD_START != 0 {
                return; // the device ignores writes while a DMA runs
            }
            match off {
                reg::DMA_SRC => st.src = v,
                reg::DMA_DST => st.dst = v,
                reg::DMA_COUNT => st.cnt = v,
                reg::DMA_CMD => {
                    st.cmd = v;
                    st.pending_reads = st.latency;
                    if self.irq.is_some() && v & reg::CMD_IRQ != 0 && !st.hang {
                        // With interrupts the model completes right away, as the timer would.
                        self.finish(&mut st);
                    }
                }
                _ => {}
            }
        }
    }

    fn random(n: usize, seed: u64) -> Vec<u8> {
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| r.gen()).collect()
    }

    #[test]
    fn round_trip_through_the_buffer_polling_and_with_interrupts() {
        for use_irq in [false, true] {
            let ev = EventFd::new().unwrap();
            let model = Model::new(5, use_irq.then(|| ev.try_clone().unwrap()));
            let data = random(3000, use_irq as u64 + 1);
            model.st.borrow_mut().ram[0x1000..0x1000 + 3000].copy_from_slice(&data);
            model.st.borrow_mut().ram[0x8000..0x8000 + 3000].fill(0xee);
            let irq: Option<Box<dyn Interrupt>> = if use_irq { Some(Box::new(ev)) } else { None };
            let mut e = EduEngine::new(model, irq).unwrap();
            assert_eq!(e.version(), (1, 0));
            let t = Duration::from_secs(1);
            let s = e
                .submit(
                    DmaDirection::ToDevice,
                    &[Segment {
                        iova: 0x1000,
                        dev: 0x100,
                        len: 3000,
                    }],
                    t,
                )
                .unwrap();
            assert_eq!((s.bytes, s.interrupts), (3000, use_irq as usize));
            e.submit(
                DmaDirection::FromDevice,
                &[Segment {
                    iova: 0x8000,
                    dev: 0x100,
                    len: 3000,
                }],
                t,
            )
            .unwrap();
            let st = e.regs.st.borrow();
            assert_eq!(&st.ram[0x8000..0x8000 + 3000], &data[..]);
            assert_eq!(st.irq_status, 0, "interrupt acknowledged");
            assert!(st.writes.contains(&(reg::DMA_DST, 0x8000)));
            assert!(st.writes.contains(&(reg::DMA_SRC, BUFFER_ADDR + 0x100)));
        }
    }

    #[test]
    fn refuses_what_the_device_cannot_do_without_touching_it() {
        let mut e = EduEngine::new(Model::new(0, None), None).unwrap();
        let t = Duration::from_secs(1);
        let bad = [
            Segment {
                iova: 0,
                dev: 0,
                len: 4097,
            },
            Segment {
                iova: 0,
                dev: 4000,
                len: 200,
            },
            Segment {
                iova: 1 << 28,
                dev: 0,
                len: 16,
            },
        ];
        for s in bad {
            assert!(matches!(
                e.submit(DmaDirection::ToDevice, &[s], t),
                Err(DmaError::Oversize { .. })
            ));
        }
        let two = [Segment {
            iova: 0,
            dev: 0,
            len: 8,
        }; 2];
        assert!(e.submit(DmaDirection::ToDevice, &two, t).is_err());
        assert!(e.regs.st.borrow().writes.is_empty());
    }

    #[test]
    fn a_hung_device_times_out_both_ways() {
        for use_irq in [false, true] {
            let ev = EventFd::new().unwrap();
            let model = Model::new(0, use_irq.then(|| ev.try_clone().unwrap()));
            let irq: Option<Box<dyn Interrupt>> = if use_irq { Some(Box::new(ev)) } else { None };
            let mut e = EduEngine::new(model, irq).unwrap();
            e.regs.st.borrow_mut().hang = true;
            let t0 = Instant::now();
            let r = e.submit(
                DmaDirection::ToDevice,
                &[Segment {
                    iova: 0,
                    dev: 0,
                    len: 64,
                }],
                Duration::from_millis(50),
            );
            // Bounded: the 50 ms limit plus the drain of a transfer edu cannot abort.
            assert!(
                t0.elapsed() < Duration::from_millis(50) + DRAIN_LIMIT + Duration::from_secs(1)
            );
            match r {
                Err(DmaError::Timeout { what, .. }) => {
                    assert!(what.contains("still running"), "{what}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn rejects_a_device_that_is_not_edu() {
        struct Dead;
        impl RegisterIo for Dead {
            fn len(&self) -> u64 {
                1 << 20
            }
            fn read32(&self, _: u64) -> u32 {
                u32::MAX
            }
            fn write32(&self, _: u64, _: u32) {}
        }
        assert!(matches!(
            EduEngine::new(Dead, None),
            Err(DmaError::Unsupported(_))
        ));
    }
}
