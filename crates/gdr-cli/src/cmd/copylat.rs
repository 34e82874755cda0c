//! `gdr copylat`: copy latency by size through the mapping, beside cuMemcpy and the auto
//! copier (measured by `gdr_bench::copylat`).

use super::gpu::{self, GpuArg};
use super::plot::{write_svg, Panel, Series, SIZE_LABEL};
use super::report::ReportArgs;
use super::table::{parse_size, size as hsize, Table};
use super::CmdResult;
use gdr::bar::auto::AutoCopier;
use gdr_bench::capi_map::{CapiMapping, CapiMemory};
use gdr_bench::copy::{dir_name, RawLog};
use gdr_bench::copylat::{self, sizes, CopylatRow};
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

/// Opens libgdrapi's mapping for the C API's rows, then times every size in both directions
/// ([`copylat::measure`]), with a progress line on stderr when `progress` is set.
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
    let rows = copylat::measure(be, auto, sizes, budget, raw, capi.as_ref(), |dir, size| {
        if progress {
            eprint!("\r{} {:>6}   ", dir_name(dir), hsize(size));
        }
    })?;
    drop(capi);
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
        args.report.capi_memory.into(),
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
