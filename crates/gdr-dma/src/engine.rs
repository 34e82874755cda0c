//! The DMA engine abstraction: a device that moves bytes between IOVAs (host or peer memory,
//! through the IOMMU) and its own memory, one batch of descriptors at a time.

use crate::error::{DmaError, Result};
use std::time::Duration;

/// Which way a submission moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaDirection {
    /// Host/peer memory -> device memory (XDMA's H2C).
    ToDevice,
    /// Device memory -> host/peer memory (XDMA's C2H).
    FromDevice,
}

/// One descriptor: `len` bytes between IOVA `iova` and device-memory offset `dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The I/O virtual address on the host/peer side, as the IOMMU maps it.
    pub iova: u64,
    /// Byte offset into the engine's device memory.
    pub dev: u64,
    /// Bytes to move.
    pub len: u64,
}

/// What an engine can do in one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLimits {
    /// Bytes of device memory, addressed from offset 0.
    pub device_memory: u64,
    /// Largest length of one descriptor.
    pub max_segment: u64,
    /// Descriptors per submission (1 for engines without descriptor lists).
    pub max_segments: usize,
    /// Addresses and lengths must be multiples of this (a power of two).
    pub align: u64,
    /// IOVAs at or above this are out of the device's reach.
    pub iova_limit: u64,
}

/// What one or more submissions did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors (segments) run.
    pub descriptors: usize,
    /// Submissions (descriptor lists) run.
    pub submissions: usize,
    /// Interrupts waited for (0 when the engine polled).
    pub interrupts: usize,
    /// Time from starting the engine to seeing it finish, summed over submissions.
    pub elapsed: Duration,
}

impl TransferStats {
    /// Adds the counts and time of `o` to these.
    pub fn add(&mut self, o: &TransferStats) {
        self.bytes += o.bytes;
        self.descriptors += o.descriptors;
        self.submissions += o.submissions;
        self.interrupts += o.interrupts;
        self.elapsed += o.elapsed;
    }
}

/// A DMA engine.
pub trait DmaEngine {
    /// Short name for messages ("xdma", "edu").
    fn name(&self) -> &'static str;
    /// What one submission may ask for; [`check_submission`] holds requests to it.
    fn limits(&self) -> EngineLimits;
    /// Runs `segs` in direction `dir` as one submission and waits for it, at most `timeout`.
    /// On timeout the engine is stopped (an engine that cannot abort, like edu, waits a bounded
    /// time for the transfer to end) before returning [`DmaError::Timeout`].
    fn submit(
        &mut self,
        dir: DmaDirection,
        segs: &[Segment],
        timeout: Duration,
    ) -> Result<TransferStats>;
}

/// Checks a submission against an engine's limits; engines call this before touching
/// hardware, so a bad request never reaches the device.
pub fn check_submission(limits: &EngineLimits, segs: &[Segment]) -> Result<()> {
    if segs.is_empty() {
        return Err(DmaError::Invalid("empty submission".into()));
    }
    if segs.len() > limits.max_segments {
        return Err(DmaError::Oversize {
            what: "descriptors in one submission",
            len: segs.len() as u64,
            limit: limits.max_segments as u64,
        });
    }
    for s in segs {
        if s.len == 0 {
            return Err(DmaError::Invalid("zero-length descriptor".into()));
        }
        if s.len > limits.max_segment {
            return Err(DmaError::Oversize {
                what: "descriptor length",
                len: s.len,
                limit: limits.max_segment,
            });
        }
        if s.dev
            .checked_add(s.len)
            .is_none_or(|e| e > limits.device_memory)
        {
            return Err(DmaError::Oversize {
                what: "device memory range",
                len: s.dev.saturating_add(s.len),
                limit: limits.device_memory,
            });
        }
        if s.iova
            .checked_add(s.len)
            .is_none_or(|e| e > limits.iova_limit)
        {
            return Err(DmaError::Oversize {
                what: "IOVA beyond the device's address reach",
                len: s.iova.saturating_add(s.len),
                limit: limits.iova_limit,
            });
        }
        for (what, v) in [
            ("descriptor IOVA", s.iova),
            ("device memory offset", s.dev),
            ("descriptor length", s.len),
        ] {
            if v % limits.align != 0 {
                return Err(DmaError::Misaligned {
                    what,
                    value: v,
                    align: limits.align,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submission_checks_name_each_limit() {
        let l = EngineLimits {
            device_memory: 0x1000,
            max_segment: 0x800,
            max_segments: 2,
            align: 4,
            iova_limit: 1 << 20,
        };
        let ok = Segment {
            iova: 0x1000,
            dev: 0x800,
            len: 0x800,
        };
        check_submission(&l, &[ok, ok]).unwrap();
        let err = |segs: &[Segment]| check_submission(&l, segs).unwrap_err();
        assert!(matches!(err(&[]), DmaError::Invalid(_)));
        assert!(matches!(
            err(&[ok, ok, ok]),
            DmaError::Oversize {
                what: "descriptors in one submission",
                ..
            }
        ));
        assert!(matches!(
            err(&[Segment { len: 0, ..ok }]),
            DmaError::Invalid(_)
        ));
        assert!(matches!(
            err(&[Segment {
                len: 0x804,
                dev: 0,
                ..ok
            }]),
            DmaError::Oversize {
                what: "descriptor length",
                ..
            }
        ));
        assert!(matches!(
            err(&[Segment {
                dev: 0x804,
                len: 0x800,
                ..ok
            }]),
            DmaError::Oversize {
                what: "device memory range",
                ..
            }
        ));
        assert!(matches!(
            err(&[Segment {
                dev: u64::MAX,
                ..ok
            }]),
            DmaError::Oversize { .. }
        ));
        assert!(matches!(
            err(&[Segment {
                iova: (1 << 20) - 4,
                ..ok
            }]),
            DmaError::Oversize { .. }
        ));
        assert!(matches!(
            err(&[Segment { iova: 0x1002, ..ok }]),
            DmaError::Misaligned {
                what: "descriptor IOVA",
                ..
            }
        ));
        assert!(matches!(
            err(&[Segment { dev: 2, ..ok }]),
            DmaError::Misaligned {
                what: "device memory offset",
                ..
            }
        ));
        assert!(matches!(
            err(&[Segment { len: 6, ..ok }]),
            DmaError::Misaligned {
                what: "descriptor length",
                ..
            }
        ));
    }
}
