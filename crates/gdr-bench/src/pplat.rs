//! `gdr pplat`: the CPU <-> GPU ping-pong ([`ping_pong`]) in every placement and with the GPU
//! loop's variants, beside the host-centric round trip (copy in, launch, copy out,
//! synchronize; and as a CUDA graph) and the bus floor ([`measure`]).

use crate::pingpong::{
    bar_read_round_trip, host_centric, ping_pong, GpuLoop, PingPongError, PingPongPlacement,
};
use crate::stats::Summary;
use gdr::bar::VulkanBackend;
use serde::Serialize;
use std::time::Duration;

/// One row: a path and its round trip.
#[derive(Serialize)]
pub struct PplatRow {
    /// The placement (and the GPU loop, for a variant), or the baseline's name.
    pub path: String,
    /// Whether a persistent GPU thread answered (else a baseline: host-centric, the floor).
    pub persistent: bool,
    /// The GPU thread's loop (persistent rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_loop: Option<GpuLoop>,
    /// The round trip's order statistics, in microseconds.
    pub us: Summary,
}

/// What `gdr pplat` reports.
#[derive(Serialize)]
pub struct PplatReport {
    /// The four placements with the reported GPU loop, the loop's variants, the host-centric
    /// rows, and the bus floor (a CPU read of GPU memory).
    pub rows: Vec<PplatRow>,
    /// Host-centric (plain launches) median / best placement's median (reported loop).
    pub speedup_vs_host_centric: f64,
}

/// The GPU loop's variants, each timed in a placement beside the reported loop: the lean loop
/// and each of its two differences alone where the flag is in GPU memory, the lean loop where
/// the GPU polls host memory, 4 and 16 polling warps in both of those placements, 8 loads of
/// the flag in flight a poll where it is in GPU memory, and 2, 4 and 8 pollers in separate
/// blocks (a flag and an answer each) where the GPU polls host memory.
const LOOP_VARIANTS: [(PingPongPlacement, GpuLoop); 12] = [
    (PingPongPlacement::GpuFlagHostAnswer, GpuLoop::LEAN),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            fence: false,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
    ),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            fence: true,
            ..GpuLoop::LEAN
        },
    ),
    (PingPongPlacement::HostFlagHostAnswer, GpuLoop::LEAN),
    (PingPongPlacement::GpuFlagHostAnswer, pollers(4)),
    (PingPongPlacement::GpuFlagHostAnswer, pollers(16)),
    (PingPongPlacement::HostFlagHostAnswer, pollers(4)),
    (PingPongPlacement::HostFlagHostAnswer, pollers(16)),
    (
        PingPongPlacement::GpuFlagHostAnswer,
        GpuLoop {
            loads: 8,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        },
    ),
    (PingPongPlacement::HostFlagHostAnswer, blocks(2)),
    (PingPongPlacement::HostFlagHostAnswer, blocks(4)),
    (PingPongPlacement::HostFlagHostAnswer, blocks(8)),
];

/// The reported loop with `n` polling warps.
const fn pollers(n: u32) -> GpuLoop {
    GpuLoop {
        pollers: n,
        ..GpuLoop::TIMER_EACH_POLL_FENCED
    }
}

/// The reported loop with `n` pollers in separate blocks.
const fn blocks(n: u32) -> GpuLoop {
    GpuLoop {
        pollers: n,
        blocks: true,
        ..GpuLoop::TIMER_EACH_POLL_FENCED
    }
}

/// The loop of the four placement rows.
const REPORTED: GpuLoop = GpuLoop::TIMER_EACH_POLL_FENCED;

/// The floor row's name: a CPU read of a GPU word through the mapping, one PCIe round trip.
pub const FLOOR_ROW: &str = "floor: 4-byte CPU read of GPU memory (one PCIe round trip)";

/// Times the four placements with the reported loop, the loop's variants, the host-centric
/// round trip (plain launches and as a CUDA graph, a quarter of the rounds, at least 100) and
/// the floor, each after `warmup` unmeasured rounds, giving up on a round after `timeout`.
pub fn measure(
    be: &VulkanBackend,
    warmup: u32,
    rounds: u32,
    timeout: Duration,
) -> Result<PplatReport, PingPongError> {
    let mut rows = Vec::new();
    for p in PingPongPlacement::ALL {
        let s = ping_pong(be, p, REPORTED, warmup, rounds, timeout)?;
        rows.push(PplatRow {
            path: p.to_string(),
            persistent: true,
            gpu_loop: Some(REPORTED),
            us: s,
        });
    }
    // The loop's variants, right after the four placements: each placement's row above is the
    // reference they are read against (each run takes tens of milliseconds, short against the
    // host's drift).
    for (p, l) in LOOP_VARIANTS {
        let s = ping_pong(be, p, l, warmup, rounds, timeout)?;
        rows.push(PplatRow {
            path: format!("{p} [{l}]"),
            persistent: true,
            gpu_loop: Some(l),
            us: s,
        });
    }
    // The host-centric loop is several times slower per round (docs/perf.md#ping-pong-gdr-pplat):
    // fewer rounds give the same confidence.
    let hc_rounds = (rounds / 4).max(100);
    let hc = host_centric(be.context(), warmup.min(200), hc_rounds, false)?;
    let graph = host_centric(be.context(), warmup.min(200), hc_rounds, true)?;
    let best = rows
        .iter()
        .filter(|r| r.gpu_loop == Some(REPORTED))
        .map(|r| r.us.median)
        .fold(f64::INFINITY, f64::min);
    let speedup = hc.median / best;
    rows.push(PplatRow {
        path: "host-centric: HtoD copy, launch, DtoH copy, sync".into(),
        persistent: false,
        gpu_loop: None,
        us: hc,
    });
    rows.push(PplatRow {
        path: "host-centric as one CUDA graph, sync".into(),
        persistent: false,
        gpu_loop: None,
        us: graph,
    });
    rows.push(PplatRow {
        path: FLOOR_ROW.into(),
        persistent: false,
        gpu_loop: None,
        us: bar_read_round_trip(be, warmup, rounds)?,
    });
    Ok(PplatReport {
        rows,
        speedup_vs_host_centric: speedup,
    })
}

#[cfg(test)]
mod tests {
    use super::{PplatReport, PplatRow, FLOOR_ROW};
    use crate::stats::Summary;

    /// The keys `gdr pplat --json` writes (scripts/compare-gdr.sh and scripts/perf_tables.py
    /// read `rows[].path`, `rows[].us.median` and the speed-up).
    #[test]
    fn the_report_keeps_its_json_keys() {
        let r = PplatReport {
            rows: vec![PplatRow {
                path: FLOOR_ROW.into(),
                persistent: false,
                gpu_loop: None,
                us: Summary::of(&mut [1.0, 2.0, 3.0]),
            }],
            speedup_vs_host_centric: 4.0,
        };
        let v = serde_json::to_value(&r).expect("serialises");
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().expect("an object").keys().cloned().collect()
        };
        assert_eq!(keys(&v), ["rows", "speedup_vs_host_centric"]);
        assert_eq!(keys(&v["rows"][0]), ["path", "persistent", "us"]);
        assert_eq!(v["rows"][0]["us"]["median"], 2.0);
    }
}
