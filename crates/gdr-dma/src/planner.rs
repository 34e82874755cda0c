//! The transfer planner: any source to any destination (host memory, peer memory, device
//! memory) by way of the engine's two directions.
//!
//! A copy between two IOVA endpoints goes through device memory, as picoevb's driver does, but
//! in rounds that fill the whole staging window: each round is one descriptor list into device
//! memory and one list out again, instead of one descriptor and one interrupt per chunk. Chunks
//! never exceed a source piece, a destination piece, the staging window or the largest
//! descriptor.

use crate::engine::{
    check_submission, DmaDirection, DmaEngine, EngineLimits, Segment, TransferStats,
};
use crate::error::{DmaError, Result};
use crate::iommu::IommuSpace;
use crate::iova::IovaRange;
use std::time::Duration;

/// One side of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Memory reached through the IOMMU: a scatter list of IOVA pieces, used in order.
    Iova(Vec<IovaRange>),
    /// Device memory starting at this offset.
    Device(u64),
}

impl Endpoint {
    /// One contiguous IOVA range.
    pub fn iova(r: IovaRange) -> Self {
        Endpoint::Iova(vec![r])
    }
}

/// One submission of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub dir: DmaDirection,
    pub segs: Vec<Segment>,
}

/// Where in device memory a copy between two IOVA endpoints is staged, and (optionally) a host
/// bounce buffer for device-to-device copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staging {
    /// Where the staging window starts in device memory, in bytes (aligned to the engine).
    pub dev_offset: u64,
    /// Bytes of the window: each round of an IOVA-to-IOVA copy moves at most this much.
    pub len: u64,
    /// A mapped host buffer that device-to-device copies go through (out to it, back in);
    /// `None` refuses such copies.
    pub bounce: Option<IovaRange>,
}

impl Staging {
    /// All of device memory, no bounce buffer.
    pub fn whole_device(limits: &EngineLimits) -> Self {
        Staging {
            dev_offset: 0,
            len: limits.device_memory,
            bounce: None,
        }
    }
}

/// Walks a scatter list `len` bytes at a time.
struct Cursor<'a> {
    pieces: &'a [IovaRange],
    idx: usize,
    off: u64,
}

impl<'a> Cursor<'a> {
    fn new(pieces: &'a [IovaRange]) -> Self {
        Cursor {
            pieces,
            idx: 0,
            off: 0,
        }
    }
    /// The IOVA at the cursor and how many bytes remain in its piece.
    fn peek(&self) -> Option<(u64, u64)> {
        let p = self.pieces.get(self.idx)?;
        Some((p.iova + self.off, p.len - self.off))
    }
    fn advance(&mut self, n: u64) {
        self.off += n;
        if let Some(p) = self.pieces.get(self.idx) {
            if self.off >= p.len {
                self.idx += 1;
                self.off = 0;
            }
        }
    }
}

/// Segments moving `len` bytes between `iova` pieces and device memory at `dev`.
fn spans(cur: &mut Cursor<'_>, dev: u64, len: u64, max_seg: u64) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let (iova, avail) = cur
            .peek()
            .ok_or_else(|| DmaError::Invalid("scatter list shorter than the copy".into()))?;
        let n = avail.min(len - done).min(max_seg);
        out.push(Segment {
            iova,
            dev: dev + done,
            len: n,
        });
        cur.advance(n);
        done += n;
    }
    Ok(out)
}

fn batch(dir: DmaDirection, segs: Vec<Segment>, max: usize, steps: &mut Vec<Step>) {
    for c in segs.chunks(max.max(1)) {
        steps.push(Step {
            dir,
            segs: c.to_vec(),
        });
    }
}

fn check_endpoint(ep: &Endpoint, len: u64, limits: &EngineLimits) -> Result<()> {
    match ep {
        Endpoint::Device(off) => {
            if off
                .checked_add(len)
                .is_none_or(|e| e > limits.device_memory)
            {
                return Err(DmaError::Oversize {
                    what: "copy into/out of device memory",
                    len: off.saturating_add(len),
                    limit: limits.device_memory,
                });
            }
            if off % limits.align != 0 {
                return Err(DmaError::Misaligned {
                    what: "device memory offset",
                    value: *off,
                    align: limits.align,
                });
            }
        }
        Endpoint::Iova(pieces) => {
            let total = pieces.iter().try_fold(0u64, |a, p| a.checked_add(p.len));
            if total.is_none_or(|t| t < len) {
                return Err(DmaError::Oversize {
                    what: "copy longer than its IOVA endpoint",
                    len,
                    limit: total.unwrap_or(u64::MAX),
                });
            }
            for p in pieces {
                for (what, v) in [("IOVA piece start", p.iova), ("IOVA piece length", p.len)] {
                    if v % limits.align != 0 {
                        return Err(DmaError::Misaligned {
                            what,
                            value: v,
                            align: limits.align,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// Plans a copy of `len` bytes from `src` to `dst` for an engine with `limits`.
pub fn plan(
    limits: &EngineLimits,
    staging: &Staging,
    src: &Endpoint,
    dst: &Endpoint,
    len: u64,
) -> Result<Vec<Step>> {
    if len == 0 {
        return Err(DmaError::Invalid("zero-length copy".into()));
    }
    if !limits.align.is_power_of_two() || limits.max_segment < limits.align {
        return Err(DmaError::Invalid(format!("engine limits {limits:?}")));
    }
    if !len.is_multiple_of(limits.align) {
        return Err(DmaError::Misaligned {
            what: "copy length",
            value: len,
            align: limits.align,
        });
    }
    check_endpoint(src, len, limits)?;
    check_endpoint(dst, len, limits)?;
    // Descriptor lengths stay multiples of the alignment.
    let max_seg = limits.max_segment & !(limits.align - 1);
    let mut steps = Vec::new();
    match (src, dst) {
        (Endpoint::Iova(s), Endpoint::Device(d)) => {
            let segs = spans(&mut Cursor::new(s), *d, len, max_seg)?;
            batch(
                DmaDirection::ToDevice,
                segs,
                limits.max_segments,
                &mut steps,
            );
        }
        (Endpoint::Device(d), Endpoint::Iova(s)) => {
            let segs = spans(&mut Cursor::new(s), *d, len, max_seg)?;
            batch(
                DmaDirection::FromDevice,
                segs,
                limits.max_segments,
                &mut steps,
            );
        }
        (Endpoint::Iova(s), Endpoint::Iova(t)) => {
            let window = staging.len & !(limits.align - 1);
            if window == 0
                || !staging.dev_offset.is_multiple_of(limits.align)
                || staging
                    .dev_offset
                    .checked_add(staging.len)
                    .is_none_or(|e| e > limits.device_memory)
            {
                return Err(DmaError::Invalid(format!(
                    "staging window {:#x}+{:#x} in {:#x} bytes of device memory",
                    staging.dev_offset, staging.len, limits.device_memory
                )));
            }
            let (mut cs, mut ct) = (Cursor::new(s), Cursor::new(t));
            let mut done = 0;
            while done < len {
                let n = window.min(len - done);
                let h2c = spans(&mut cs, staging.dev_offset, n, max_seg)?;
                let c2h = spans(&mut ct, staging.dev_offset, n, max_seg)?;
                batch(DmaDirection::ToDevice, h2c, limits.max_segments, &mut steps);
                batch(
                    DmaDirection::FromDevice,
                    c2h,
                    limits.max_segments,
                    &mut steps,
                );
                done += n;
            }
        }
        (Endpoint::Device(a), Endpoint::Device(b)) => {
            let bounce = staging.bounce.ok_or_else(|| {
                DmaError::Invalid("device-to-device copy needs a host bounce buffer".into())
            })?;
            let window = bounce.len & !(limits.align - 1);
            if window == 0 || bounce.iova % limits.align != 0 {
                return Err(DmaError::Invalid(format!("bounce buffer {bounce:?}")));
            }
            let (lo_a, lo_b) = (*a, *b);
            if lo_a < lo_b + len && lo_b < lo_a + len {
                return Err(DmaError::Invalid(
                    "overlapping device-to-device copy".into(),
                ));
            }
            let mut done = 0;
            while done < len {
                let n = window.min(len - done);
                let piece = [IovaRange::new(bounce.iova, n)];
                let c2h = spans(&mut Cursor::new(&piece), a + done, n, max_seg)?;
                let h2c = spans(&mut Cursor::new(&piece), b + done, n, max_seg)?;
                batch(
                    DmaDirection::FromDevice,
                    c2h,
                    limits.max_segments,
                    &mut steps,
                );
                batch(DmaDirection::ToDevice, h2c, limits.max_segments, &mut steps);
                done += n;
            }
        }
    }
    Ok(steps)
}

/// Runs plans on an engine, checking every IOVA against the IOMMU's table first.
pub struct Copier<'a> {
    engine: &'a mut dyn DmaEngine,
    space: &'a IommuSpace,
    staging: Staging,
    timeout: Duration,
}

impl<'a> Copier<'a> {
    /// A copier staging through all of device memory, with a 5 s limit per submission.
    pub fn new(engine: &'a mut dyn DmaEngine, space: &'a IommuSpace) -> Self {
        let staging = Staging::whole_device(&engine.limits());
        Copier {
            engine,
            space,
            staging,
            timeout: Duration::from_secs(5),
        }
    }

    /// Stages through `staging` instead of all of device memory.
    pub fn staging(mut self, staging: Staging) -> Self {
        self.staging = staging;
        self
    }

    /// The limit for each submission.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Copies `len` bytes from `src` to `dst`.
    pub fn copy(&mut self, src: &Endpoint, dst: &Endpoint, len: u64) -> Result<TransferStats> {
        let limits = self.engine.limits();
        let steps = plan(&limits, &self.staging, src, dst, len)?;
        // Validate the whole plan before the first byte moves.
        for st in &steps {
            check_submission(&limits, &st.segs)?;
            for s in &st.segs {
                self.space.check(IovaRange::new(s.iova, s.len))?;
            }
        }
        let mut total = TransferStats::default();
        for st in &steps {
            let s = self.engine.submit(st.dir, &st.segs, self.timeout)?;
            total.add(&s);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> EngineLimits {
        EngineLimits {
            device_memory: 0x1000,
            max_segment: 0x400,
            max_segments: 3,
            align: 4,
            iova_limit: 1 << 32,
        }
    }

    fn bytes(steps: &[Step], dir: DmaDirection) -> u64 {
        steps
            .iter()
            .filter(|s| s.dir == dir)
            .flat_map(|s| &s.segs)
            .map(|s| s.len)
            .sum()
    }

    #[test]
    fn host_to_host_goes_through_device_in_full_rounds() {
        let l = limits();
        let src = Endpoint::Iova(vec![
            IovaRange::new(0x10000, 0x900),
            IovaRange::new(0x20000, 0x1700),
        ]);
        let dst = Endpoint::iova(IovaRange::new(0x40000, 0x2000));
        let steps = plan(&l, &Staging::whole_device(&l), &src, &dst, 0x2000).unwrap();
        assert_eq!(bytes(&steps, DmaDirection::ToDevice), 0x2000);
        assert_eq!(bytes(&steps, DmaDirection::FromDevice), 0x2000);
        // Round 1: 0x1000 bytes in: 0x400,0x400,0x100 (end of piece 1) | 0x400, 0x300.
        assert_eq!(steps[0].dir, DmaDirection::ToDevice);
        let lens: Vec<u64> = steps[0].segs.iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![0x400, 0x400, 0x100]);
        assert_eq!(
            steps[1].segs[0],
            Segment {
                iova: 0x20000,
                dev: 0x900,
                len: 0x400
            }
        );
        assert_eq!(
            steps[1].segs[1],
            Segment {
                iova: 0x20400,
                dev: 0xd00,
                len: 0x300
            }
        );
        assert_eq!(steps[2].dir, DmaDirection::FromDevice);
        // Every submission fits the engine; device offsets stay in the window.
        for st in &steps {
            check_submission(&l, &st.segs).unwrap();
        }
        // Each destination byte comes from the staged copy of the same source byte.
        let mut img = vec![0u64; 0x1000];
        let mut src_of_dst = std::collections::HashMap::new();
        let flat = |r: &[IovaRange], i: u64| {
            let mut i = i;
            for p in r {
                if i < p.len {
                    return p.iova + i;
                }
                i -= p.len;
            }
            unreachable!()
        };
        let (Endpoint::Iova(sp), Endpoint::Iova(_)) = (&src, &dst) else {
            unreachable!()
        };
        for st in &steps {
            for s in &st.segs {
                for k in 0..s.len {
                    match st.dir {
                        DmaDirection::ToDevice => img[(s.dev + k) as usize] = s.iova + k,
                        DmaDirection::FromDevice => {
                            src_of_dst.insert(s.iova + k, img[(s.dev + k) as usize]);
                        }
                    }
                }
            }
        }
        for i in 0..0x2000u64 {
            assert_eq!(src_of_dst[&(0x40000 + i)], flat(sp, i));
        }
    }

    #[test]
    fn one_descriptor_engines_get_one_segment_per_step() {
        let l = EngineLimits {
            max_segments: 1,
            max_segment: 0x1000,
            ..limits()
        };
        let steps = plan(
            &l,
            &Staging::whole_device(&l),
            &Endpoint::iova(IovaRange::new(0, 0x3000)),
            &Endpoint::iova(IovaRange::new(0x10000, 0x3000)),
            0x3000,
        )
        .unwrap();
        assert_eq!(steps.len(), 6);
        assert!(steps.iter().all(|s| s.segs.len() == 1));
        let dirs: Vec<_> = steps.iter().map(|s| s.dir).collect();
        assert_eq!(
            dirs[..2],
            [DmaDirection::ToDevice, DmaDirection::FromDevice]
        );
    }

    #[test]
    fn device_endpoints_and_bounce() {
        let l = limits();
        let st = Staging::whole_device(&l);
        let h2c = plan(
            &l,
            &st,
            &Endpoint::iova(IovaRange::new(0x1000, 0x800)),
            &Endpoint::Device(0x100),
            0x800,
        )
        .unwrap();
        assert!(h2c.iter().all(|s| s.dir == DmaDirection::ToDevice));
        assert_eq!(
            h2c[0].segs[0],
            Segment {
                iova: 0x1000,
                dev: 0x100,
                len: 0x400
            }
        );
        let c2h = plan(
            &l,
            &st,
            &Endpoint::Device(0),
            &Endpoint::iova(IovaRange::new(0x1000, 0x800)),
            0x800,
        )
        .unwrap();
        assert!(c2h.iter().all(|s| s.dir == DmaDirection::FromDevice));
        assert!(matches!(
            plan(
                &l,
                &st,
                &Endpoint::Device(0),
                &Endpoint::Device(0x800),
                0x400
            ),
            Err(DmaError::Invalid(_))
        ));
        let bounced = Staging {
            bounce: Some(IovaRange::new(0x9000, 0x200)),
            ..st
        };
        let d2d = plan(
            &l,
            &bounced,
            &Endpoint::Device(0),
            &Endpoint::Device(0x800),
            0x400,
        )
        .unwrap();
        assert_eq!(d2d.len(), 4);
        assert_eq!(d2d[0].dir, DmaDirection::FromDevice);
        assert_eq!(
            d2d[1].segs[0],
            Segment {
                iova: 0x9000,
                dev: 0x800,
                len: 0x200
            }
        );
        assert!(plan(
            &l,
            &bounced,
            &Endpoint::Device(0),
            &Endpoint::Device(0x100),
            0x400
        )
        .is_err());
    }

    #[test]
    fn refuses_oversize_misaligned_and_empty() {
        let l = limits();
        let st = Staging::whole_device(&l);
        let host = Endpoint::iova(IovaRange::new(0x1000, 0x800));
        let err = |s: &Endpoint, d: &Endpoint, n| plan(&l, &st, s, d, n).unwrap_err();
        assert!(matches!(
            err(&host, &Endpoint::Device(0xc00), 0x800),
            DmaError::Oversize { .. }
        ));
        assert!(matches!(
            err(&host, &Endpoint::Device(0), 0x804),
            DmaError::Oversize { .. }
        ));
        assert!(matches!(
            err(&host, &Endpoint::Device(2), 0x400),
            DmaError::Misaligned { .. }
        ));
        assert!(matches!(
            err(&host, &Endpoint::Device(0), 0x3fe),
            DmaError::Misaligned { .. }
        ));
        let odd = Endpoint::iova(IovaRange::new(0x1001, 0x800));
        assert!(matches!(
            err(&odd, &Endpoint::Device(0), 0x400),
            DmaError::Misaligned { .. }
        ));
        assert!(matches!(
            err(&host, &Endpoint::Device(0), 0),
            DmaError::Invalid(_)
        ));
        let bad_stage = Staging {
            dev_offset: 0xf00,
            len: 0x200,
            bounce: None,
        };
        assert!(plan(&l, &bad_stage, &host, &host, 0x400).is_err());
    }
}
