//! A register-level behavioural model of the XDMA engine (memory-mapped mode, channel 0 of H2C
//! and C2H) for driver tests without the board. Written from the register map and descriptor
//! format, independently of the driver's own constants, so a wrong constant in the driver shows
//! up as a failing test.
//!
//! The model fetches descriptors and moves data through a simulated IOMMU, so unmapped
//! addresses fault as they would behind a real one. It checks magic, lengths, alignment, the
//! stop/EOP flags and the next-adjacent claims, sets the status bits a real engine would, and
//! records protocol violations that a real engine would not report but that would make it
//! misbehave (for the tests to assert there are none).

use gdr_dma::{EventFd, RegisterIo, SimIommu};
use std::sync::{Arc, Mutex, MutexGuard};

const MAGIC: u32 = 0xad4b;
const BUSY: u32 = 1;
const DESC_STOPPED: u32 = 1 << 1;
const DESC_COMPLETED: u32 = 1 << 2;
const ALIGN_MISMATCH: u32 = 1 << 3;
const MAGIC_STOPPED: u32 = 1 << 4;
const INVALID_LENGTH: u32 = 1 << 5;
/// One bit out of each 5-bit error field (the "unsupported request/slave error" flavour).
pub const READ_ERROR: u32 = 1 << 9;
pub const WRITE_ERROR: u32 = 1 << 14;
pub const DESC_ERROR: u32 = 1 << 19;

/// One descriptor as the model fetched it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub at: u64,
    pub control: u32,
    pub len: u32,
    pub src: u64,
    pub dst: u64,
    pub next: u64,
}

/// One run of a channel: from RUN to stop.
#[derive(Clone, Debug)]
pub struct Run {
    pub h2c: bool,
    pub descriptors: Vec<Fetched>,
    pub status: u32,
}

#[derive(Default, Clone, Copy)]
struct Channel {
    control: u32,
    status: u32,
    /// Status to show once the busy period ends.
    final_status: u32,
    busy_reads: u32,
    completed: u32,
    desc_lo: u32,
    desc_hi: u32,
    adjacent: u32,
    int_enable: u32,
}

/// Knobs and fault injection.
#[derive(Clone, Copy, Debug)]
pub struct ModelConfig {
    pub ram: usize,
    /// Alignments register: address alignment and length granularity in bytes.
    pub addr_align: u32,
    pub len_granularity: u32,
    /// Status reads that still show BUSY after a polled run (interrupt runs finish at once).
    pub busy_reads: u32,
    /// Never finish (the driver must time out).
    pub hang: bool,
    /// See a bad magic in the n-th descriptor fetched (0-based) of every run.
    pub corrupt_magic_at: Option<usize>,
    /// Fail the n-th descriptor fetch of every run.
    pub fail_fetch_at: Option<usize>,
    /// Report the wrong identifier on the C2H channel.
    pub bad_identifier: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            ram: 64 << 10,
            addr_align: 1,
            len_granularity: 1,
            busy_reads: 3,
            hang: false,
            corrupt_magic_at: None,
            fail_fetch_at: None,
            bad_identifier: false,
        }
    }
}

pub struct State {
    pub cfg: ModelConfig,
    pub ram: Vec<u8>,
    ch: [Channel; 2],
    irq_channel_en: u32,
    irq: Option<EventFd>,
    iommu: Arc<SimIommu>,
    pub runs: Vec<Run>,
    pub violations: Vec<String>,
    pub interrupts_sent: usize,
}

/// The model's BAR1; clones share one device.
#[derive(Clone)]
pub struct XdmaModel {
    st: Arc<Mutex<State>>,
}

impl XdmaModel {
    pub fn new(cfg: ModelConfig, iommu: Arc<SimIommu>, irq: Option<EventFd>) -> Self {
        XdmaModel {
            st: Arc::new(Mutex::new(State {
                ram: vec![0; cfg.ram],
                cfg,
                ch: [Channel::default(); 2],
                irq_channel_en: 0,
                irq,
                iommu,
                runs: Vec::new(),
                violations: Vec::new(),
                interrupts_sent: 0,
            })),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap()
    }

    /// True when the channel's RUN bit is set.
    pub fn running(&self, h2c: bool) -> bool {
        self.state().ch[usize::from(!h2c)].control & 1 != 0
    }
}

fn rd_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn rd_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

impl State {
    fn fetch(&self, at: u64) -> Option<Fetched> {
        let mut b = [0u8; 32];
        self.iommu.read(at, &mut b).ok()?;
        Some(Fetched {
            at,
            control: rd_u32(&b, 0),
            len: rd_u32(&b, 4),
            src: rd_u64(&b, 8),
            dst: rd_u64(&b, 16),
            next: rd_u64(&b, 24),
        })
    }

    /// Checks a claim that `count` descriptors directly follow the one at `first`: they must be
    /// in its 4 KiB page and really be the chain's next links (none of the ones before them
    /// stops the chain).
    fn check_adjacent(&mut self, first: u64, count: u32, who: &str) {
        if count == 0 {
            return;
        }
        let last = first + 32 * u64::from(count);
        if last >> 12 != first >> 12 {
            self.violations.push(format!(
                "{who}: {count} adjacent descriptors after {first:#x} cross a 4 KiB boundary"
            ));
        }
        let mut at = first;
        for k in 0..count {
            match self.fetch(at) {
                Some(d) if d.control & 1 == 0 && d.next == at + 32 => at += 32,
                Some(_) => {
                    self.violations.push(format!(
                        "{who}: claims {count} adjacent descriptors after {first:#x}, the chain \
                         leaves after {k}"
                    ));
                    return;
                }
                None => {
                    self.violations
                        .push(format!("{who}: adjacent descriptor {at:#x} unmapped"));
                    return;
                }
            }
        }
    }

    /// Runs the descriptor list of channel `c` (0 = H2C, 1 = C2H); returns the final status.
    fn execute(&mut self, c: usize) -> u32 {
        let h2c = c == 0;
        let ch = self.ch[c];
        let mut at = (u64::from(ch.desc_hi) << 32) | u64::from(ch.desc_lo);
        let mut run = Run {
            h2c,
            descriptors: Vec::new(),
            status: 0,
        };
        let first_adj = ch.adjacent;
        let mut status = 0;
        let mut completed = 0;
        let mut i = 0usize;
        if at % 32 != 0 {
            status |= ALIGN_MISMATCH;
        } else {
            self.check_adjacent(at, first_adj, "SGDMA adjacent register");
        }
        while status == 0 {
            if i > 4096 {
                self.violations
                    .push("descriptor chain does not stop".into());
                status |= DESC_ERROR;
                break;
            }
            let fetched = if self.cfg.fail_fetch_at == Some(i) {
                None
            } else {
                self.fetch(at)
            };
            let Some(mut d) = fetched else {
                status |= DESC_ERROR;
                break;
            };
            if self.cfg.corrupt_magic_at == Some(i) {
                d.control ^= 0x0100_0000;
            }
            run.descriptors.push(d);
            if d.control >> 16 != MAGIC {
                status |= MAGIC_STOPPED;
                break;
            }
            let adj = (d.control >> 8) & 0x3f;
            if d.control & 1 == 0 {
                if d.next % 32 != 0 {
                    status |= ALIGN_MISMATCH;
                    break;
                }
                self.check_adjacent(d.next, adj, &format!("descriptor {i}"));
            } else if adj != 0 {
                self.violations
                    .push(format!("descriptor {i}: STOP with {adj} adjacent"));
            }
            let len = u64::from(d.len);
            if len == 0 || len > 0x0fff_ffff || len % u64::from(self.cfg.len_granularity) != 0 {
                status |= INVALID_LENGTH;
                break;
            }
            let a = u64::from(self.cfg.addr_align);
            if d.src % a != 0 || d.dst % a != 0 {
                status |= ALIGN_MISMATCH;
                break;
            }
            let mut data = vec![0u8; len as usize];
            if h2c {
                if self.iommu.read(d.src, &mut data).is_err() {
                    status |= READ_ERROR;
                    break;
                }
                match d
                    .dst
                    .checked_add(len)
                    .filter(|&e| e <= self.ram.len() as u64)
                {
                    Some(e) => self.ram[d.dst as usize..e as usize].copy_from_slice(&data),
                    None => {
                        status |= WRITE_ERROR;
                        break;
                    }
                }
            } else {
                match d
                    .src
                    .checked_add(len)
                    .filter(|&e| e <= self.ram.len() as u64)
                {
                    Some(e) => data.copy_from_slice(&self.ram[d.src as usize..e as usize]),
                    None => {
                        status |= READ_ERROR;
                        break;
                    }
                }
                if self.iommu.write(d.dst, &data).is_err() {
                    status |= WRITE_ERROR;
                    break;
                }
            }
            completed += 1;
            if d.control & 2 != 0 {
                status |= DESC_COMPLETED;
            }
            if d.control & 1 != 0 {
                if d.control & (1 << 4) == 0 {
                    self.violations
                        .push(format!("descriptor {i}: last descriptor without EOP"));
                }
                status |= DESC_STOPPED;
                break;
            }
            at = d.next;
            i += 1;
        }
        self.ch[c].completed = completed;
        run.status = status;
        self.runs.push(run);
        status
    }

    fn start(&mut self, c: usize) {
        self.ch[c].completed = 0;
        self.ch[c].status = BUSY;
        if self.cfg.hang {
            return;
        }
        let fin = self.execute(c);
        let irq_mode = self.ch[c].int_enable != 0;
        if irq_mode {
            self.finish(c, fin);
        } else {
            self.ch[c].final_status = fin;
            self.ch[c].busy_reads = self.cfg.busy_reads;
        }
    }

    fn finish(&mut self, c: usize, fin: u32) {
        self.ch[c].status = fin;
        self.ch[c].busy_reads = 0;
        // Interrupt when an enabled event happened and the channel's IRQ is enabled.
        if self.ch[c].int_enable & fin != 0 && self.irq_channel_en & (1 << c) != 0 {
            if let Some(e) = &self.irq {
                e.signal(1).unwrap();
                self.interrupts_sent += 1;
            }
        }
    }

    fn status_read(&mut self, c: usize) -> u32 {
        if self.ch[c].status & BUSY != 0 && !self.cfg.hang && self.ch[c].control & 1 != 0 {
            if self.ch[c].busy_reads == 0 {
                let fin = self.ch[c].final_status;
                self.finish(c, fin);
            } else {
                self.ch[c].busy_reads -= 1;
            }
        }
        self.ch[c].status
    }

    fn set_control(&mut self, c: usize, v: u32) {
        let was = self.ch[c].control & 1;
        self.ch[c].control = v;
        if was == 0 && v & 1 != 0 {
            self.start(c);
        } else if was != 0 && v & 1 == 0 {
            // Stopping clears busy; a run in progress is abandoned.
            self.ch[c].status &= !BUSY;
        }
    }
}

impl RegisterIo for XdmaModel {
    fn len(&self) -> u64 {
        64 << 10
    }

    fn read32(&self, a: u64) -> u32 {
        let mut st = self.state();
        let (target, chan, off) = ((a >> 12) & 0xf, (a >> 8) & 0xf, a & 0xff);
        match (target, chan, off) {
            (0 | 1, 0, _) => {
                let c = target as usize;
                match off {
                    0x00 => {
                        if c == 1 && st.cfg.bad_identifier {
                            0x1fc0_0006
                        } else {
                            0x1fc0_0006 | ((target as u32) << 16)
                        }
                    }
                    0x04 => st.ch[c].control,
                    0x40 => st.status_read(c),
                    0x44 => {
                        let s = st.status_read(c);
                        st.ch[c].status &= BUSY;
                        s
                    }
                    0x48 => st.ch[c].completed,
                    0x4c => (st.cfg.addr_align << 16) | (st.cfg.len_granularity << 8) | 64,
                    0x90 => st.ch[c].int_enable,
                    _ => 0,
                }
            }
            (2, 0, 0x10) => st.irq_channel_en,
            (4 | 5, 0, 0x80) => st.ch[(target - 4) as usize].desc_lo,
            (4 | 5, 0, 0x84) => st.ch[(target - 4) as usize].desc_hi,
            (4 | 5, 0, 0x88) => st.ch[(target - 4) as usize].adjacent,
            _ => 0,
        }
    }

    fn write32(&self, a: u64, v: u32) {
        let mut st = self.state();
        let (target, chan, off) = ((a >> 12) & 0xf, (a >> 8) & 0xf, a & 0xff);
        match (target, chan, off) {
            (0 | 1, 0, _) => {
                let c = target as usize;
                match off {
                    0x04 => st.set_control(c, v),
                    0x08 => {
                        let n = st.ch[c].control | v;
                        st.set_control(c, n)
                    }
                    0x0c => {
                        let n = st.ch[c].control & !v;
                        st.set_control(c, n)
                    }
                    0x40 => st.ch[c].status &= !v,
                    0x90 => st.ch[c].int_enable = v,
                    _ => {}
                }
            }
            (2, 0, 0x10) => st.irq_channel_en = v,
            (2, 0, 0x14) => st.irq_channel_en |= v,
            (2, 0, 0x18) => st.irq_channel_en &= !v,
            (4 | 5, 0, 0x80) => st.ch[(target - 4) as usize].desc_lo = v,
            (4 | 5, 0, 0x84) => st.ch[(target - 4) as usize].desc_hi = v,
            (4 | 5, 0, 0x88) => st.ch[(target - 4) as usize].adjacent = v,
            _ => {}
        }
    }
}

/// The GPIO block on BAR0: one data register.
#[derive(Clone, Default)]
pub struct GpioModel {
    pub data: Arc<Mutex<u32>>,
}

impl RegisterIo for GpioModel {
    fn len(&self) -> u64 {
        4096
    }
    fn read32(&self, a: u64) -> u32 {
        if a == 0 {
            *self.data.lock().unwrap()
        } else {
            0
        }
    }
    fn write32(&self, a: u64, v: u32) {
        if a == 0 {
            *self.data.lock().unwrap() = v & 7;
        }
    }
}
