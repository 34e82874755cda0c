//! The statistics of the benchmarks: order statistics of a sample set ([`Summary`]), batch
//! timing, and the latency histogram ([`Histogram`], [`LatencySummary`]).
//!
//! They are [`gdr::timing`]'s (the server uses them too, without the benchmarks), re-exported
//! here at their old paths.

pub use gdr::timing::{
    ns_quantile_us, time_per_call_us, Histogram, LatencySummary, Op, Summary, LONG_OP, WARM_UP,
};
