//! `gdr copylat`: copy latency by size through the mapping, beside cuMemcpy, the auto copier,
//! the other copy paths and libgdrapi's copies, in both directions ([`measure`]).

use crate::capi_map::CapiMapping;
use crate::copy::{contenders, dir_name, time_all, Contender, MeasureError, RawLog, Timed};
use gdr::bar::auto::{AutoCopier, Direction, Path};
use gdr::bar::{MappedBuffer, VulkanBackend};
use serde::Serialize;
use std::time::Duration;

/// One size in one direction.
#[derive(Serialize)]
pub struct CopylatRow {
    /// `cpu->gpu` or `gpu->cpu` ([`dir_name`]).
    pub direction: &'static str,
    /// Bytes copied per call.
    pub size: usize,
    /// The one-thread mapping's median, in microseconds per call.
    pub mapping_median_us: f64,
    /// The one-thread mapping's fastest call.
    pub mapping_min_us: f64,
    /// The plain `cuMemcpyHtoD` / `cuMemcpyDtoH` call's median.
    pub cumemcpy_median_us: f64,
    /// The plain cuMemcpy's fastest call.
    pub cumemcpy_min_us: f64,
    /// cuMemcpy median / mapping median.
    pub speedup: f64,
    /// The auto copier's median.
    pub auto_median_us: f64,
    /// The path the auto copier was on at the end of the row.
    pub auto_path: String,
    /// Fastest single path (mapping on 1..N threads, or copy engine incl. its synchronize).
    pub best_path: String,
    /// That path's median.
    pub best_median_us: f64,
    /// best / auto: 1.0 means the auto copier is as fast as the best path.
    pub auto_vs_best: f64,
    /// libgdrapi's `gdr_copy_to_mapping` / `gdr_copy_from_mapping` on a mapping of its own,
    /// median, on the paths `GDR_CAPI_COPY` lets it take (absent when libgdrapi could not pin
    /// and map here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capi_median_us: Option<f64>,
    /// auto median / C API median: 1.0 means C callers copy as fast as the auto copier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capi_vs_auto: Option<f64>,
    /// gpu->cpu at 8 bytes only: the median of a bare volatile 8-byte load from the mapping,
    /// timed in the same interleaved rounds (the floor the mapping's read is held against).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bare_load_median_us: Option<f64>,
    /// Where other paths contend with calibration's choice: each one's running estimate in
    /// the auto copier after this row (`auto_path` is the one it was on at the end).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auto_contenders: Vec<Contender>,
}

/// Powers of two from `min` (rounded up) to `max`, doubling with checked arithmetic: a
/// `--max-size` near 2^64 ends the list instead of wrapping (which looped until the list's
/// allocation aborted).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(min.max(1).checked_next_power_of_two(), |s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect()
}

/// Times every size in both directions, each for `budget` per path. The C API's rows copy
/// through `capi` when given; with [`CapiMemory::Allocated`](crate::capi_map::CapiMemory) every
/// row copies to the library's allocation, through the mapping the C calls use (small writes to
/// two allocations can differ by tens of ns), else to a buffer of `be`'s. `on_size` is called
/// before each size is timed (for a progress line), outside the timing.
pub fn measure(
    be: &VulkanBackend,
    auto: &AutoCopier,
    sizes: &[usize],
    budget: Duration,
    raw: Option<&RawLog>,
    capi: Option<&CapiMapping>,
    mut on_size: impl FnMut(Direction, usize),
) -> Result<Vec<CopylatRow>, MeasureError> {
    let max = *sizes.iter().max().unwrap_or(&1);
    match capi.and_then(|c| {
        c.with_allocation(|buf| measure_on(buf, auto, sizes, budget, raw, Some(c), &mut on_size))
    }) {
        Some(rows) => rows,
        None => measure_on(
            &be.alloc(max, 4096)?,
            auto,
            sizes,
            budget,
            raw,
            capi,
            &mut on_size,
        ),
    }
}

/// Times every size in both directions, the Rust paths on `buf` and the C calls on `capi`.
fn measure_on(
    buf: &MappedBuffer,
    auto: &AutoCopier,
    sizes: &[usize],
    budget: Duration,
    raw: Option<&RawLog>,
    capi: Option<&CapiMapping>,
    on_size: &mut impl FnMut(Direction, usize),
) -> Result<Vec<CopylatRow>, MeasureError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let mut rows = Vec::new();
    for dir in [Direction::ToGpu, Direction::FromGpu] {
        for &size in sizes {
            on_size(dir, size);
            // Results come back in this order (the timer shuffles the order of each round):
            // mapping, plain cuMemcpy, auto, then the other candidates for "best".
            let mut what = vec![
                Timed::Path(Path::Mapping { threads: 1 }),
                Timed::PlainCuMemcpy,
                Timed::Auto,
                Timed::Path(Path::CopyEngine),
            ];
            if dir == Direction::FromGpu && size == 8 {
                what.push(Timed::BareLoad);
            }
            if capi.is_some() {
                what.push(Timed::Capi);
            }
            // The other thread counts, where they run as asked (8 threads asked for 32 KiB
            // run as 2: the same copy timed twice would let noise choose the "best").
            what.extend(
                [2, 4, 8]
                    .into_iter()
                    .filter(|&t| t <= threads)
                    .map(|t| Path::Mapping { threads: t })
                    .filter(|p| p.is_distinct_at(size))
                    .map(Timed::Path),
            );
            let s = time_all(&what, dir, buf, size, auto, capi, budget, raw)?;
            let (map, plain, a) = (s[0], s[1], s[2]);
            let (best_i, best) = what
                .iter()
                .zip(&s)
                .enumerate()
                .filter(|(_, (w, _))| matches!(w, Timed::Path(_)))
                .map(|(i, (_, s))| (i, s.median))
                .min_by(|x, y| x.1.total_cmp(&y.1))
                .expect("paths measured");
            let best_path = match what[best_i] {
                Timed::Path(p) => p,
                _ => unreachable!("filtered to paths"),
            };
            let capi_at = what.iter().position(|w| matches!(w, Timed::Capi));
            rows.push(CopylatRow {
                direction: dir_name(dir),
                size,
                mapping_median_us: map.median,
                mapping_min_us: map.min,
                cumemcpy_median_us: plain.median,
                cumemcpy_min_us: plain.min,
                speedup: plain.median / map.median,
                auto_median_us: a.median,
                auto_path: auto.path_for(dir, size).to_string(),
                best_path: best_path.to_string(),
                best_median_us: best,
                auto_vs_best: best / a.median,
                bare_load_median_us: what
                    .iter()
                    .position(|w| matches!(w, Timed::BareLoad))
                    .map(|i| s[i].median),
                capi_median_us: capi_at.map(|i| s[i].median),
                capi_vs_auto: capi_at.map(|i| a.median / s[i].median),
                auto_contenders: contenders(auto, dir, size),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::{sizes, CopylatRow};
    use crate::copy::Contender;

    /// The keys `gdr copylat --json` writes, in order (scripts/compare-gdr.sh and
    /// scripts/perf_tables.py read them); the optional ones only when present.
    #[test]
    fn rows_keep_their_json_keys() {
        let mut row = CopylatRow {
            direction: "cpu->gpu",
            size: 8,
            mapping_median_us: 1.0,
            mapping_min_us: 1.0,
            cumemcpy_median_us: 2.0,
            cumemcpy_min_us: 2.0,
            speedup: 2.0,
            auto_median_us: 1.0,
            auto_path: "mapping x1".into(),
            best_path: "mapping x1".into(),
            best_median_us: 1.0,
            auto_vs_best: 1.0,
            capi_median_us: None,
            capi_vs_auto: None,
            bare_load_median_us: None,
            auto_contenders: Vec::new(),
        };
        // The top-level keys in the order written.
        let keys = |row: &CopylatRow| -> Vec<String> {
            let text = serde_json::to_string(row).expect("serialises");
            let serde_json::Value::Object(m) = serde_json::to_value(row).expect("serialises")
            else {
                panic!("not an object: {text}");
            };
            let mut k: Vec<String> = m.keys().cloned().collect();
            k.sort_by_key(|k| text.find(&format!("\"{k}\":")).expect("written"));
            k
        };
        let base = [
            "direction",
            "size",
            "mapping_median_us",
            "mapping_min_us",
            "cumemcpy_median_us",
            "cumemcpy_min_us",
            "speedup",
            "auto_median_us",
            "auto_path",
            "best_path",
            "best_median_us",
            "auto_vs_best",
        ];
        assert_eq!(keys(&row), base);
        row.capi_median_us = Some(1.0);
        row.capi_vs_auto = Some(1.0);
        row.bare_load_median_us = Some(0.5);
        row.auto_contenders = vec![Contender {
            path: "copy engine".into(),
            estimate_us: 3.0,
        }];
        let optional = [
            "capi_median_us",
            "capi_vs_auto",
            "bare_load_median_us",
            "auto_contenders",
        ];
        assert_eq!(keys(&row), [&base[..], &optional[..]].concat());
    }

    /// `s *= 2` wrapped past 2^63 to 0 (release) and looped until the list's allocation
    /// aborted; the doubling is checked now.
    #[test]
    fn sizes_near_two_to_the_64_end_instead_of_wrapping() {
        assert_eq!(sizes(1, 8), vec![1, 2, 4, 8]);
        assert_eq!(sizes(3, 8), vec![4, 8]);
        assert_eq!(sizes(1 << 63, usize::MAX), vec![1 << 63]);
        assert!(sizes((1 << 63) + 1, usize::MAX).is_empty());
        assert_eq!(sizes(1, usize::MAX).len(), 64);
    }
}
