//! `gdr copylat`: copy latency by size through the mapping, beside cuMemcpy and the auto
//! copier.

use super::capi_map::{CapiMapping, CapiMemory};
use super::gpu::{self, GpuArg};
use super::measure::{dir_name, time_all, RawLog, ReportArgs, Timed};
use super::plot::{write_svg, Panel, Series, SIZE_LABEL};
use super::table::{parse_size, size as hsize, Table};
use super::CmdResult;
use gdr::bar::auto::{AutoCopier, Direction, Path};
use gdr::bar::MappedBuffer;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct CopylatArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Smallest size (powers of two from here)
    #[arg(long, default_value = "1", value_parser = parse_size)]
    pub min_size: usize,
    /// Largest size
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    pub max_size: usize,
    /// Time spent on each path at each size, in milliseconds, from 1 to 60000 (at most 201
    /// samples, at least 9)
    #[arg(long, default_value_t = 1000)]
    pub budget_ms: u64,
    #[command(flatten)]
    pub report: ReportArgs,
}

#[derive(Serialize)]
pub struct CopylatRow {
    pub direction: &'static str,
    pub size: usize,
    pub mapping_median_us: f64,
    pub mapping_min_us: f64,
    pub cumemcpy_median_us: f64,
    pub cumemcpy_min_us: f64,
    /// cuMemcpy median / mapping median.
    pub speedup: f64,
    pub auto_median_us: f64,
    pub auto_path: String,
    /// Fastest single path (mapping on 1..N threads, or copy engine incl. its synchronize).
    pub best_path: String,
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
    pub auto_contenders: Vec<super::measure::Contender>,
}

/// Powers of two from `min` (rounded up) to `max`, doubling with checked arithmetic: a
/// `--max-size` near 2^64 ends the list instead of wrapping (which looped until the list's
/// allocation aborted).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(min.max(1).checked_next_power_of_two(), |s| s.checked_mul(2))
        .take_while(|&s| s <= max)
        .collect()
}

/// The auto copier as copylat's and copybw's flags ask for it.
pub fn copier_for(
    be: &gdr::bar::VulkanBackend,
    report: &ReportArgs,
) -> Result<AutoCopier, gdr::bar::BarError> {
    copier(be, report.recalibrate, report.fixed_auto, report.json)
}

pub fn copier(
    be: &gdr::bar::VulkanBackend,
    recalibrate: bool,
    fixed: bool,
    quiet: bool,
) -> Result<AutoCopier, gdr::bar::BarError> {
    let start = std::time::Instant::now();
    let (copier, measured) = if recalibrate {
        if !quiet {
            eprintln!("calibrating the auto copier (about ten seconds)...");
        }
        (AutoCopier::recalibrate(be)?, true)
    } else {
        if !quiet {
            eprintln!(
                "loading or measuring the auto copier's crossovers (first run: about ten seconds)..."
            );
        }
        AutoCopier::new(be)?
    };
    if measured && !quiet {
        eprintln!("calibrated in {:.0} s", start.elapsed().as_secs_f64());
    }
    Ok(if fixed {
        AutoCopier::fixed(copier.calibration().clone())
    } else {
        copier
    })
}

pub fn measure(
    be: &gdr::bar::VulkanBackend,
    auto: &AutoCopier,
    sizes: &[usize],
    budget: Duration,
    progress: bool,
    raw: Option<&RawLog>,
    capi_memory: CapiMemory,
) -> Result<Vec<CopylatRow>, Box<dyn std::error::Error + Send + Sync>> {
    let max = *sizes.iter().max().unwrap_or(&1);
    // libgdrapi's copies, timed beside the Rust paths (on the paths GDR_CAPI_COPY lets the
    // library take); without it the rows say nothing of C.
    let capi = match CapiMapping::open(be.context(), max, capi_memory) {
        Ok(m) => Some(m),
        Err(e) => {
            if progress {
                eprintln!("C API rows left out: {e}");
            }
            None
        }
    };
    // With --capi-memory allocated every row copies to the library's allocation, through the
    // mapping the C calls use: small writes to two allocations can differ by tens of ns.
    let rows = match capi.as_ref().and_then(|c| {
        c.with_allocation(|buf| measure_on(buf, auto, sizes, budget, progress, raw, Some(c)))
    }) {
        Some(rows) => rows,
        None => measure_on(
            &be.alloc(max, 4096)?,
            auto,
            sizes,
            budget,
            progress,
            raw,
            capi.as_ref(),
        ),
    }?;
    drop(capi);
    Ok(rows)
}

/// Times every size in both directions, the Rust paths on `buf` and the C calls on `capi`.
fn measure_on(
    buf: &MappedBuffer,
    auto: &AutoCopier,
    sizes: &[usize],
    budget: Duration,
    progress: bool,
    raw: Option<&RawLog>,
    capi: Option<&CapiMapping>,
) -> Result<Vec<CopylatRow>, Box<dyn std::error::Error + Send + Sync>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let mut rows = Vec::new();
    for dir in [Direction::ToGpu, Direction::FromGpu] {
        for &size in sizes {
            if progress {
                eprint!("\r{} {:>6}   ", dir_name(dir), hsize(size));
            }
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
                auto_contenders: super::measure::contenders(auto, dir, size),
            });
        }
    }
    if progress {
        eprint!("\r                    \r");
    }
    Ok(rows)
}

pub fn print(rows: &[CopylatRow]) {
    let mut t = Table::new(&[
        "direction",
        "size",
        "map med us",
        "map min us",
        "cuMemcpy med",
        "cuMemcpy min",
        "speedup",
        "auto med",
        "auto path",
        "auto/best",
        "C API med",
        "C/auto",
    ]);
    for r in rows {
        t.row(vec![
            r.direction.into(),
            hsize(r.size),
            format!("{:.3}", r.mapping_median_us),
            format!("{:.3}", r.mapping_min_us),
            format!("{:.3}", r.cumemcpy_median_us),
            format!("{:.3}", r.cumemcpy_min_us),
            format!("{:.1}x", r.speedup),
            format!("{:.3}", r.auto_median_us),
            r.auto_path.clone(),
            format!("{:.0}%", r.auto_vs_best * 100.0),
            r.capi_median_us.map_or("-".into(), |v| format!("{v:.3}")),
            r.capi_vs_auto
                .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
        ]);
    }
    t.print();
    for r in rows {
        if let Some(bare) = r.bare_load_median_us {
            println!(
                "reference: a bare 8-byte load from the mapping takes {bare:.3} us median; the \
                 mapping's 8-byte read {:.3} us ({:+.1}%)",
                r.mapping_median_us,
                (r.mapping_median_us / bare - 1.0) * 100.0
            );
        }
    }
}

pub fn run(args: CopylatArgs) -> CmdResult {
    if args.min_size > args.max_size {
        return Err(format!(
            "--min-size {} is larger than --max-size {}",
            args.min_size, args.max_size
        )
        .into());
    }
    // Checked before the GPU is opened.
    let sizes = sizes(args.min_size, args.max_size);
    if sizes.is_empty() {
        return Err(format!(
            "no power of two from --min-size {} to --max-size {}",
            args.min_size, args.max_size
        )
        .into());
    }
    let budget = super::budget_ms(args.budget_ms)?;
    let be = gpu::open(args.gpu)?;
    let auto = copier_for(&be, &args.report)?;
    let raw = RawLog::create(args.report.raw_samples.as_deref())?;
    let rows = measure(
        &be,
        &auto,
        &sizes,
        budget,
        !args.report.json,
        raw.as_ref(),
        args.report.capi_memory,
    )?;
    if let Some(raw) = raw {
        raw.finish()?;
    }
    if args.report.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print(&rows);
    }
    if let Some(f) = &args.report.plot {
        let panels: Vec<Panel> =
            ["cpu->gpu", "gpu->cpu"]
                .into_iter()
                .map(|dir| {
                    let rs: Vec<&CopylatRow> = rows.iter().filter(|r| r.direction == dir).collect();
                    let line = |name: &str, baseline: bool, y: fn(&CopylatRow) -> f64| Series {
                        name: name.into(),
                        points: rs.iter().map(|r| (r.size as f64, y(r))).collect(),
                        baseline,
                    };
                    Panel {
                        title: dir.into(),
                        series: vec![
                            line("mapping", false, |r| r.mapping_median_us),
                            line("cuMemcpy", true, |r| r.cumemcpy_median_us),
                            line("auto", false, |r| r.auto_median_us),
                        ]
                        .into_iter()
                        .chain(rs.iter().all(|r| r.capi_median_us.is_some()).then(|| {
                            line("C API", false, |r| r.capi_median_us.unwrap_or(f64::NAN))
                        }))
                        .collect(),
                    }
                })
                .collect();
        write_svg(
            f,
            "gdr copylat: median latency",
            SIZE_LABEL,
            "median latency (µs)",
            &panels,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::sizes;

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
