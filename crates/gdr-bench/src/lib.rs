//! gdr-bench: the benchmarks and baselines of gdr, kept out of the core library.
//!
//! - [`mq`]: `gdr mq bench`, round-trip latency per ring placement, throughput with batching,
//!   and the host-centric baseline, in one run.
//! - [`pingpong`]: the bare CPU <-> GPU ping-pong with a persistent GPU thread (`gdr pplat`).
//! - [`host_centric`]: the host-centric round trip (copy in, launch, copy out, synchronise)
//!   the queues are measured against, on gdr-mq's core (`gdr_mq::HostCentricSlot`, which
//!   gdr-serve's host-centric executor runs on too).
//! - [`stats`]: order statistics, batch timing and the latency histogram (`gdr::timing`'s,
//!   re-exported).

pub mod host_centric;
pub mod mq;
pub mod pingpong;
pub mod stats;
