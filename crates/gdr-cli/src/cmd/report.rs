//! The output and calibration flags that copylat and copybw share, and `--capi-memory`'s
//! values (`gdr_bench::capi_map::CapiMemory` on the command line).

use gdr_bench::capi_map::CapiMemory;

/// Output and calibration flags shared by copylat and copybw.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Measure the auto copier's crossovers again instead of using the cached ones
    #[arg(long)]
    pub recalibrate: bool,
    /// Keep the auto copier on calibration's choice for every size (by default, where the copy
    /// engine and the one-thread mapping came near each other, it times both while copying and
    /// follows the faster)
    #[arg(long)]
    pub fixed_auto: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Write a plot of the results against size (SVG) to this file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,
    /// Also write every timed sample to this file (one JSON object per line and size: the
    /// direction, the size, and each compared path's per-call microseconds in time order)
    #[arg(long, value_name = "FILE.jsonl")]
    pub raw_samples: Option<String>,
    /// GPU memory of the "C API" rows: existing memory pinned with gdr_pin_buffer, as gdrcopy's
    /// programs use the library, or memory from gdr_alloc_mapped, the kind the Rust rows use
    #[arg(long, value_enum, default_value_t = CapiMemoryArg::Pinned)]
    pub capi_memory: CapiMemoryArg,
}

/// Which GPU memory the C API's rows copy to and from (`--capi-memory`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapiMemoryArg {
    /// Existing memory pinned with `gdr_pin_buffer` (POSIX-fd VMM memory, which every backend
    /// pins), as gdrcopy's programs use the library
    #[default]
    Pinned,
    /// Memory from libgdrapi's `gdr_alloc_mapped`, which the Rust rows then copy to as well
    /// (the same allocation through the same CPU mapping), so the rows differ only in the call
    Allocated,
}

impl From<CapiMemoryArg> for CapiMemory {
    fn from(m: CapiMemoryArg) -> Self {
        match m {
            CapiMemoryArg::Pinned => CapiMemory::Pinned,
            CapiMemoryArg::Allocated => CapiMemory::Allocated,
        }
    }
}
