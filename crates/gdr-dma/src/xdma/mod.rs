//! The Xilinx XDMA engine ("DMA/Bridge Subsystem for PCI Express", memory-mapped mode) as on
//! PicoEVB and HTG-K800: H2C and C2H channel 0, descriptor lists in host memory, completion by
//! interrupt or by polling the channel status, and the LED GPIO on BAR0.
//!
//! One submission is one descriptor list: the engine fetches it through the IOMMU, runs every
//! descriptor and stops at the one marked STOP, raising one interrupt for the whole list.

pub mod descriptor;
mod leds;
pub mod regs;

pub use leds::Leds;

use crate::engine::{
    check_submission, DmaDirection, DmaEngine, EngineLimits, Segment, TransferStats,
};
use crate::error::{DmaError, Result};
use crate::iommu::{DmaBuffer, IommuSpace};
use crate::irq::Interrupt;
use crate::memory::MappedMemory;
use crate::regs::RegisterIo;
use regs::*;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// PCI IDs of the picoevb bitstreams.
pub const VENDOR: u16 = 0x10de;
pub const DEVICE: u16 = 0x0001;
pub const SUBSYS_PICOEVB: u16 = 0x0001;
pub const SUBSYS_HTG_K800: u16 = 0x0002;

/// What differs between boards and bitstreams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdmaConfig {
    /// Bytes of RAM behind the engine on the AXI side.
    pub device_memory: u64,
    /// AXI address of device-memory offset 0.
    pub axi_base: u64,
    /// DMA channel used in each direction.
    pub channel: u64,
    /// Number of H2C channels in the IP (C2H channel interrupt bits follow them).
    pub h2c_channels: u64,
    /// Descriptors per submission (the size of the descriptor buffer).
    pub max_descriptors: usize,
    /// Largest length one descriptor may carry.
    pub max_segment: u64,
    /// IOVAs the device can reach.
    pub iova_limit: u64,
}

impl XdmaConfig {
    /// PicoEVB: 64 KiB of on-chip RAM.
    pub fn picoevb() -> Self {
        XdmaConfig {
            device_memory: 64 << 10,
            axi_base: 0,
            channel: 0,
            h2c_channels: 1,
            max_descriptors: 256,
            max_segment: 1 << 20,
            iova_limit: u64::MAX,
        }
    }

    /// HTG-K800: 2 GiB of RAM.
    pub fn htg_k800() -> Self {
        XdmaConfig {
            device_memory: 2 << 30,
            ..Self::picoevb()
        }
    }

    /// The board named by the PCI subsystem ID, if known.
    pub fn for_subsystem(subsystem_device: u16) -> Option<Self> {
        match subsystem_device {
            SUBSYS_PICOEVB => Some(Self::picoevb()),
            SUBSYS_HTG_K800 => Some(Self::htg_k800()),
            _ => None,
        }
    }
}

/// The XDMA engine over its register BAR.
pub struct XdmaEngine<R: RegisterIo> {
    regs: R,
    cfg: XdmaConfig,
    irq: Option<Box<dyn Interrupt>>,
    descs: DmaBuffer,
    align: u64,
}

impl<R: RegisterIo> XdmaEngine<R> {
    /// Checks both channels' identifiers, reads their alignment needs and maps a descriptor
    /// buffer in `space`. With `irq`, completions are waited for by interrupt.
    pub fn new(
        regs: R,
        space: &IommuSpace,
        cfg: XdmaConfig,
        irq: Option<Box<dyn Interrupt>>,
    ) -> Result<Self> {
        if regs.len() < 0x7000 {
            return Err(DmaError::Unsupported(format!(
                "an XDMA register BAR of 64 KiB (got {:#x} bytes)",
                regs.len()
            )));
        }
        if cfg.max_descriptors == 0 || cfg.max_segment == 0 || cfg.device_memory == 0 {
            return Err(DmaError::Invalid(format!("XDMA configuration {cfg:?}")));
        }
        let mut align = 1u64;
        for (target, name) in [(TARGET_H2C, "H2C"), (TARGET_C2H, "C2H")] {
            let id = regs.read32(addr(target, cfg.channel, CH_IDENTIFIER));
            if id >> 20 != IDENTIFIER_MAGIC || u64::from((id >> 16) & 0xf) != target {
                return Err(DmaError::Unsupported(format!(
                    "an XDMA {name} channel {} (identifier reads {id:#010x})",
                    cfg.channel
                )));
            }
            // Alignments register: address alignment 23:16, length granularity 15:8 (bytes).
            let a = regs.read32(addr(target, cfg.channel, CH_ALIGNMENTS));
            for v in [(a >> 16) & 0xff, (a >> 8) & 0xff] {
                let v = u64::from(v).max(1);
                if !v.is_power_of_two() {
                    return Err(DmaError::Unsupported(format!("alignment {v} on {name}")));
                }
                align = align.max(v);
            }
        }
        let bytes = cfg.max_descriptors as u64 * descriptor::SIZE;
        let descs = space.alloc_buffer(bytes as usize, "xdma descriptors")?;
        let mut e = XdmaEngine {
            regs,
            cfg,
            irq,
            descs,
            align,
        };
        e.stop(TARGET_H2C);
        e.stop(TARGET_C2H);
        Ok(e)
    }

    /// The board configuration the engine was built with.
    pub fn config(&self) -> &XdmaConfig {
        &self.cfg
    }

    /// Whether completions are waited for by interrupt (else the status register is polled).
    pub fn uses_interrupts(&self) -> bool {
        self.irq.is_some()
    }

    fn reg(&self, target: u64, off: u64) -> u64 {
        addr(target, self.cfg.channel, off)
    }

    fn stop(&mut self, target: u64) {
        self.regs
            .write32(self.reg(target, CH_CONTROL_W1C), CTRL_RUN);
        self.regs.write32(self.reg(target, CH_INT_ENABLE), 0);
        let _ = self.regs.read32(self.reg(target, CH_STATUS_RC));
    }

    /// The bit of this channel in the IRQ block's channel enable mask.
    fn irq_bit(&self, target: u64) -> u32 {
        let n = if target == TARGET_H2C {
            self.cfg.channel
        } else {
            self.cfg.h2c_channels + self.cfg.channel
        };
        1u32 << n
    }

    /// Runs one descriptor list and waits for the engine to stop.
    fn run(
        &mut self,
        dir: DmaDirection,
        segs: &[Segment],
        timeout: Duration,
    ) -> Result<TransferStats> {
        let (target, sg) = match dir {
            DmaDirection::ToDevice => (TARGET_H2C, TARGET_H2C_SGDMA),
            DmaDirection::FromDevice => (TARGET_C2H, TARGET_C2H_SGDMA),
        };
        let base = self.descs.iova();
        let parts: Vec<(u64, u64, u64)> = segs
            .iter()
            .map(|s| {
                let axi = self.cfg.axi_base + s.dev;
                match dir {
                    DmaDirection::ToDevice => (s.iova, axi, s.len),
                    DmaDirection::FromDevice => (axi, s.iova, s.len),
                }
            })
            .collect();
        let chain = descriptor::build_chain(base, &parts);
        let mut img = Vec::with_capacity(chain.len() * 32);
        for d in &chain {
            img.extend_from_slice(&d.encode());
        }
        self.descs.write_at(0, &img)?;
        // The descriptors must be in memory before the engine is told to fetch them.
        fence(Ordering::SeqCst);

        let _ = self.regs.read32(self.reg(target, CH_STATUS_RC));
        self.regs
            .write32(addr(sg, self.cfg.channel, SG_DESC_LO), base as u32);
        self.regs
            .write32(addr(sg, self.cfg.channel, SG_DESC_HI), (base >> 32) as u32);
        self.regs.write32(
            addr(sg, self.cfg.channel, SG_DESC_ADJACENT),
            descriptor::first_adjacent(base, chain.len()),
        );
        let events = ST_DESC_STOPPED | ST_DESC_COMPLETED | ST_ERRORS;
        let irq_bit = self.irq_bit(target);
        if self.irq.is_some() {
            self.regs.write32(self.reg(target, CH_INT_ENABLE), events);
            self.regs
                .write32(addr(TARGET_IRQ, 0, IRQ_CHANNEL_EN_W1S), irq_bit);
        }
        let t0 = Instant::now();
        self.regs
            .write32(self.reg(target, CH_CONTROL), CTRL_RUN | events);

        let deadline = t0 + timeout;
        let mut interrupts = 0;
        let mut nap = Duration::from_micros(1);
        let status = loop {
            // With interrupts, wait for one before looking: the engine was told to interrupt on
            // stop and on every error, so each list ends with exactly one, and none is left
            // behind to wake the next wait early. A stale one only costs a second look.
            if let Some(irq) = self.irq.as_mut() {
                let left = deadline.saturating_duration_since(Instant::now());
                if !left.is_zero() && irq.wait(left)? {
                    interrupts += 1;
                }
            }
            let st = self.regs.read32(self.reg(target, CH_STATUS));
            if st & ST_BUSY == 0 || st & ST_ERRORS != 0 {
                break st;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.stop(target);
                if let Some(irq) = self.irq.as_mut() {
                    self.regs
                        .write32(addr(TARGET_IRQ, 0, IRQ_CHANNEL_EN_W1C), irq_bit);
                    // With the channel's interrupt off, re-enable delivery: a late INTx would
                    // otherwise stay masked and every later transfer time out. A failure here
                    // surfaces as the next transfer's timeout; this one's is the news.
                    let _ = irq.rearm();
                }
                return Err(DmaError::Timeout {
                    what: format!("XDMA {dir:?} list of {} descriptors", segs.len()),
                    after: timeout,
                });
            }
            if self.irq.is_none() {
                std::thread::sleep(nap.min(left));
                nap = (nap * 2).min(Duration::from_micros(500));
            }
        };
        let elapsed = t0.elapsed();
        let completed = self.regs.read32(self.reg(target, CH_COMPLETED));
        // Reading the clear-on-read status also drops the interrupt condition.
        let _ = self.regs.read32(self.reg(target, CH_STATUS_RC));
        self.regs
            .write32(self.reg(target, CH_CONTROL_W1C), CTRL_RUN);
        if self.irq.is_some() {
            self.regs.write32(self.reg(target, CH_INT_ENABLE), 0);
            self.regs
                .write32(addr(TARGET_IRQ, 0, IRQ_CHANNEL_EN_W1C), irq_bit);
            if let Some(irq) = self.irq.as_mut() {
                irq.rearm()?;
            }
        }
        if status & ST_ERRORS != 0 {
            return Err(DmaError::Engine {
                engine: "xdma",
                status,
                detail: format!(
                    "{} after {completed} of {} descriptors",
                    describe_status(status),
                    segs.len()
                ),
            });
        }
        if completed as usize != segs.len() || status & ST_DESC_STOPPED == 0 {
            return Err(DmaError::Engine {
                engine: "xdma",
                status,
                detail: format!(
                    "stopped after {completed} of {} descriptors without the stop flag",
                    segs.len()
                ),
            });
        }
        Ok(TransferStats {
            bytes: segs.iter().map(|s| s.len).sum(),
            descriptors: segs.len(),
            submissions: 1,
            interrupts,
            elapsed,
        })
    }
}

impl<R: RegisterIo> DmaEngine for XdmaEngine<R> {
    fn name(&self) -> &'static str {
        "xdma"
    }

    fn limits(&self) -> EngineLimits {
        let max_seg = self.cfg.max_segment.min(descriptor::MAX_LEN) & !(self.align - 1);
        EngineLimits {
            device_memory: self.cfg.device_memory,
            max_segment: max_seg,
            max_segments: self.cfg.max_descriptors,
            align: self.align,
            iova_limit: self.cfg.iova_limit,
        }
    }

    fn submit(
        &mut self,
        dir: DmaDirection,
        segs: &[Segment],
        timeout: Duration,
    ) -> Result<TransferStats> {
        check_submission(&self.limits(), segs)?;
        self.run(dir, segs, timeout)
    }
}
