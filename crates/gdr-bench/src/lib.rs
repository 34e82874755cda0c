//! gdr-bench: the benchmarks and baselines of gdr, kept out of the core library.
//!
//! - [`copylat`], [`copybw`]: `gdr copylat` and `gdr copybw`, the copy paths by size in both
//!   directions, timed interleaved by [`copy::time_all`], with libgdrapi's copies beside them
//!   on a [`capi_map::CapiMapping`].
//! - [`apiperf`]: `gdr apiperf`, what pinning, mapping, exporting and the registration cache
//!   cost by size, through the Rust API and libgdrapi.
//! - [`mq`]: `gdr mq bench`, round-trip latency per ring placement, throughput with batching,
//!   and the host-centric baseline, in one run.
//! - [`pingpong`]: the bare CPU <-> GPU ping-pong with a persistent GPU thread, and [`pplat`]:
//!   `gdr pplat`'s rows of it.
//! - [`host_centric`]: the host-centric round trip (copy in, launch, copy out, synchronise)
//!   the queues are measured against, on gdr-mq's core (`gdr_mq::HostCentricSlot`, which
//!   gdr-serve's host-centric executor runs on too).
//! - [`stats`]: order statistics, batch timing and the latency histogram (`gdr::timing`'s,
//!   re-exported).
//! - [`write_ceiling`]: what caps CPU -> GPU writes through the mapping (`gdr storebw`): store
//!   widths, orders, sources and targets beside the copy engine from pinned memory.
//!
//! # Example
//!
//! A small `gdr mq bench`: the Lynx placement with word-format RX against the host-centric
//! baseline, and one 64-byte throughput point. The statistics run anywhere; the benchmark
//! needs a GPU, and without a usable one the example prints why and stops there (failing
//! instead under `GDR_REQUIRE_GPU=1`, as the GPU tests do).
//!
//! ```
//! use gdr_bench::mq::{self, BenchConfig};
//! use gdr_bench::stats::Summary;
//! use gdr_mq::Placement;
//! use std::time::Duration;
//!
//! // The order statistics the benchmarks report, here of five round trips in microseconds.
//! let mut rtt = [2.1, 2.0, 2.4, 9.5, 2.2];
//! let s = Summary::of(&mut rtt);
//! assert_eq!((s.n, s.min, s.median, s.max), (5, 2.0, 2.2, 9.5));
//!
//! let bc = BenchConfig {
//!     placements: vec![Placement::LYNX],
//!     rx_formats: vec![true],
//!     latency_iters: 500,
//!     sizes: vec![64],
//!     queues: vec![1],
//!     duration: Duration::from_millis(100),
//!     ..BenchConfig::quick()
//! };
//! let Some(ctx) = gdr_testing::gpu_context("gdr_bench crate example (doctest)") else {
//!     return Ok(());
//! };
//! let report = mq::run(&ctx, &bc)?;
//! println!(
//!     "{}: best {} p50 {:.2} us, {:.1}x below host-centric",
//!     report.device, report.best_placement, report.best_p50_us, report.speedup_vs_host_centric
//! );
//! // The placement's point, then host-centric and its CUDA-graph form.
//! assert_eq!(report.latency.len(), 3);
//! assert_eq!(report.best_placement, "rx-gpu/tx-host words");
//! assert_eq!(report.throughput.len(), 1);
//! # Ok::<(), gdr_mq::MqError>(())
//! ```

pub mod apiperf;
pub mod capi_map;
pub mod copy;
pub mod copybw;
pub mod copylat;
pub mod host_centric;
pub mod mq;
pub mod pingpong;
pub mod pplat;
pub mod stats;
pub mod write_ceiling;
