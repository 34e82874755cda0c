//! `gdr copybw`: bandwidth through the mapping on 1..N threads, beside the copy engine, the
//! auto copier and libgdrapi's copies, in both directions ([`measure`]).

use crate::capi_map::CapiMapping;
use crate::copy::{contenders, dir_name, time_all, Contender, MeasureError, RawLog, Timed};
use gdr::bar::auto::{AutoCopier, Direction, Path};
use gdr::bar::{MappedBuffer, VulkanBackend};
use serde::Serialize;
use std::time::Duration;

/// One size in one direction, in GB/s (10^9 bytes a second, from each path's median).
#[derive(Serialize)]
pub struct CopybwRow {
    /// `cpu->gpu` or `gpu->cpu` ([`dir_name`]).
    pub direction: &'static str,
    /// Bytes copied per call.
    pub size: usize,
    /// (threads, GB/s) through the mapping.
    pub mapping_gbps: Vec<(usize, f64)>,
    /// The copy engine (incl. its synchronize).
    pub copy_engine_gbps: f64,
    /// The auto copier.
    pub auto_gbps: f64,
    /// The path the auto copier was on at the end of the row.
    pub auto_path: String,
    /// The best of the copy engine and the thread counts that run as asked at this size.
    pub best_gbps: f64,
    /// auto / best: 1.0 means the auto copier is as fast as the best path.
    pub auto_vs_best: f64,
    /// libgdrapi's `gdr_copy_to_mapping` / `gdr_copy_from_mapping` on a mapping of its own, on
    /// the paths `GDR_CAPI_COPY` lets it take (absent when libgdrapi could not pin and map here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capi_gbps: Option<f64>,
    /// C API / auto: 1.0 means C callers copy as fast as the auto copier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capi_vs_auto: Option<f64>,
    /// The auto copier's contenders here and their estimates after this row (see copylat).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auto_contenders: Vec<Contender>,
}

fn gbps(size: usize, us: f64) -> f64 {
    size as f64 / us / 1e3
}

/// Times every size in both directions, the mapping on each of `threads` (in that order in
/// [`CopybwRow::mapping_gbps`]), each path for `budget`. The C API's rows copy through `capi`
/// when given; with [`CapiMemory::Allocated`](crate::capi_map::CapiMemory) every row copies to
/// the library's allocation, through the mapping the C calls use (as in copylat), else to a
/// buffer of `be`'s. `on_size` is called before each size is timed (for a progress line),
/// outside the timing.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    be: &VulkanBackend,
    auto: &AutoCopier,
    sizes: &[usize],
    threads: &[usize],
    budget: Duration,
    raw: Option<&RawLog>,
    capi: Option<&CapiMapping>,
    mut on_size: impl FnMut(Direction, usize),
) -> Result<Vec<CopybwRow>, MeasureError> {
    let max = *sizes.iter().max().unwrap_or(&1);
    // Every size both ways, the Rust paths on `buf`, the C calls on `capi`.
    let mut measure_on = |buf: &MappedBuffer| -> Result<Vec<CopybwRow>, MeasureError> {
        let mut rows = Vec::new();
        for dir in [Direction::ToGpu, Direction::FromGpu] {
            for &size in sizes {
                on_size(dir, size);
                let mut what: Vec<Timed> = threads
                    .iter()
                    .map(|&t| Timed::Path(Path::Mapping { threads: t }))
                    .collect();
                what.push(Timed::Path(Path::CopyEngine));
                what.push(Timed::Auto);
                if capi.is_some() {
                    what.push(Timed::Capi);
                }
                let s = time_all(&what, dir, buf, size, auto, capi, budget, raw)?;
                let n = threads.len();
                let mapping: Vec<(usize, f64)> = threads
                    .iter()
                    .zip(&s)
                    .map(|(&t, s)| (t, gbps(size, s.median)))
                    .collect();
                let ce = gbps(size, s[n].median);
                let a = gbps(size, s[n + 1].median);
                let c = capi.map(|_| gbps(size, s[n + 2].median));
                // The best over the thread counts that run as asked at this size (8 threads asked
                // for 64 KiB run as 4: the same copy timed twice would let noise set the "best").
                let best = mapping
                    .iter()
                    .filter(|m| Path::Mapping { threads: m.0 }.is_distinct_at(size))
                    .map(|m| m.1)
                    .fold(ce, f64::max);
                rows.push(CopybwRow {
                    direction: dir_name(dir),
                    size,
                    mapping_gbps: mapping,
                    copy_engine_gbps: ce,
                    auto_gbps: a,
                    auto_path: auto.path_for(dir, size).to_string(),
                    best_gbps: best,
                    auto_vs_best: a / best,
                    capi_gbps: c,
                    capi_vs_auto: c.map(|c| c / a),
                    auto_contenders: contenders(auto, dir, size),
                });
            }
        }
        Ok(rows)
    };
    match capi.and_then(|c| c.with_allocation(&mut measure_on)) {
        Some(rows) => rows,
        None => measure_on(&be.alloc(max, 4096)?),
    }
}
