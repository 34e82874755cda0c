//! `gdr copybw`: bandwidth through the mapping on 1..N threads, beside the copy engines and
//! the auto copier.

use super::capi_map::CapiMapping;
use super::copylat::copier_for;
use super::gpu::{self, GpuArg};
use super::measure::{dir_name, time_all, MeasureError, RawLog, ReportArgs, Timed};
use super::plot::{write_svg, Panel, Series, SIZE_LABEL};
use super::table::{parse_size, size as hsize, Table};
use super::{budget_ms, in_range, sizes_in_range, CmdResult, MAX_COPY_SIZE, MAX_COPY_THREADS};
use gdr::bar::auto::{Direction, Path};
use gdr::bar::MappedBuffer;
use serde::Serialize;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CopybwArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Copy sizes (comma separated; each from 1 to 1024G)
    #[arg(long, value_delimiter = ',', default_value = "64K,256K,1M,4M,16M,64M,256M", value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// CPU thread counts for the mapping path (comma separated; each from 1 to 256)
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Time spent on each path at each size, in milliseconds, from 1 to 60000 (at most 201
    /// samples, at least 9)
    #[arg(long, default_value_t = 1000)]
    pub budget_ms: u64,
    #[command(flatten)]
    pub report: ReportArgs,
}

#[derive(Serialize)]
struct Row {
    direction: &'static str,
    size: usize,
    /// (threads, GB/s) through the mapping.
    mapping_gbps: Vec<(usize, f64)>,
    copy_engine_gbps: f64,
    auto_gbps: f64,
    auto_path: String,
    best_gbps: f64,
    auto_vs_best: f64,
    /// libgdrapi's `gdr_copy_to_mapping` / `gdr_copy_from_mapping` on a mapping of its own, on
    /// the paths `GDR_CAPI_COPY` lets it take (absent when libgdrapi could not pin and map here).
    #[serde(skip_serializing_if = "Option::is_none")]
    capi_gbps: Option<f64>,
    /// C API / auto: 1.0 means C callers copy as fast as the auto copier.
    #[serde(skip_serializing_if = "Option::is_none")]
    capi_vs_auto: Option<f64>,
    /// The auto copier's contenders here and their estimates after this row (see copylat).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    auto_contenders: Vec<super::measure::Contender>,
}

fn gbps(size: usize, us: f64) -> f64 {
    size as f64 / us / 1e3
}

pub fn run(args: CopybwArgs) -> CmdResult {
    // Checked before the GPU is opened: on a machine without one, a bad argument is still
    // reported as such.
    sizes_in_range("sizes", &args.sizes, 1, MAX_COPY_SIZE)?;
    in_range("threads", &args.threads, 1, MAX_COPY_THREADS)?;
    let budget = budget_ms(args.budget_ms)?;
    let be = gpu::open(args.gpu)?;
    let auto = copier_for(&be, &args.report)?;
    let max = *args.sizes.iter().max().expect("checked non-empty");
    // libgdrapi's copies, timed beside the Rust paths (on the paths GDR_CAPI_COPY lets the
    // library take); without it the rows say nothing of C.
    let capi = match CapiMapping::open(be.context(), max, args.report.capi_memory) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("C API rows left out: {e}");
            None
        }
    };
    let raw = RawLog::create(args.report.raw_samples.as_deref())?;
    // Every size both ways, the Rust paths on `buf`, the C calls on `capi`.
    let measure_on = |buf: &MappedBuffer| -> Result<Vec<Row>, MeasureError> {
        let mut rows = Vec::new();
        for dir in [Direction::ToGpu, Direction::FromGpu] {
            for &size in &args.sizes {
                if !args.report.json {
                    eprint!("\r{} {:>6}   ", dir_name(dir), hsize(size));
                }
                let mut what: Vec<Timed> = args
                    .threads
                    .iter()
                    .map(|&t| Timed::Path(Path::Mapping { threads: t }))
                    .collect();
                what.push(Timed::Path(Path::CopyEngine));
                what.push(Timed::Auto);
                if capi.is_some() {
                    what.push(Timed::Capi);
                }
                let s = time_all(
                    &what,
                    dir,
                    buf,
                    size,
                    &auto,
                    capi.as_ref(),
                    budget,
                    raw.as_ref(),
                )?;
                let n = args.threads.len();
                let mapping: Vec<(usize, f64)> = args
                    .threads
                    .iter()
                    .zip(&s)
                    .map(|(&t, s)| (t, gbps(size, s.median)))
                    .collect();
                let ce = gbps(size, s[n].median);
                let a = gbps(size, s[n + 1].median);
                let c = capi.as_ref().map(|_| gbps(size, s[n + 2].median));
                // The best over the thread counts that run as asked at this size (8 threads asked
                // for 64 KiB run as 4: the same copy timed twice would let noise set the "best").
                let best = mapping
                    .iter()
                    .filter(|m| Path::Mapping { threads: m.0 }.is_distinct_at(size))
                    .map(|m| m.1)
                    .fold(ce, f64::max);
                rows.push(Row {
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
                    auto_contenders: super::measure::contenders(&auto, dir, size),
                });
            }
        }
        Ok(rows)
    };
    // With --capi-memory allocated every row copies to the library's allocation, through the
    // mapping the C calls use (as in copylat).
    let rows = match capi.as_ref().and_then(|c| c.with_allocation(measure_on)) {
        Some(rows) => rows,
        None => measure_on(&be.alloc(max, 4096)?),
    }?;
    drop(capi);
    if let Some(raw) = raw {
        raw.finish()?;
    }
    if args.report.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        eprint!("\r                    \r");
        let mut header: Vec<String> = vec!["direction".into(), "size".into()];
        header.extend(args.threads.iter().map(|t| format!("map x{t} GB/s")));
        header.extend([
            "copy engine".into(),
            "auto".into(),
            "auto path".into(),
            "auto/best".into(),
            "C API".into(),
            "C/auto".into(),
        ]);
        let hdr: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut t = Table::new(&hdr);
        for r in &rows {
            let mut cells = vec![r.direction.to_string(), hsize(r.size)];
            cells.extend(r.mapping_gbps.iter().map(|m| format!("{:.2}", m.1)));
            cells.extend([
                format!("{:.2}", r.copy_engine_gbps),
                format!("{:.2}", r.auto_gbps),
                r.auto_path.clone(),
                format!("{:.0}%", r.auto_vs_best * 100.0),
                r.capi_gbps.map_or("-".into(), |v| format!("{v:.2}")),
                r.capi_vs_auto
                    .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
            ]);
            t.row(cells);
        }
        t.print();
    }
    if let Some(f) = &args.report.plot {
        let mut panels = Vec::new();
        for dir in ["cpu->gpu", "gpu->cpu"] {
            let rs: Vec<&Row> = rows.iter().filter(|r| r.direction == dir).collect();
            let mut series = Vec::new();
            for (i, &t) in args.threads.iter().enumerate() {
                series.push(Series {
                    name: format!("map x{t}"),
                    points: rs
                        .iter()
                        .map(|r| (r.size as f64, r.mapping_gbps[i].1))
                        .collect(),
                    baseline: false,
                });
            }
            series.push(Series {
                name: "copy engine".into(),
                points: rs
                    .iter()
                    .map(|r| (r.size as f64, r.copy_engine_gbps))
                    .collect(),
                baseline: true,
            });
            series.push(Series {
                name: "auto".into(),
                points: rs.iter().map(|r| (r.size as f64, r.auto_gbps)).collect(),
                baseline: false,
            });
            if rs.iter().all(|r| r.capi_gbps.is_some()) {
                series.push(Series {
                    name: "C API".into(),
                    points: rs
                        .iter()
                        .map(|r| (r.size as f64, r.capi_gbps.unwrap_or(f64::NAN)))
                        .collect(),
                    baseline: false,
                });
            }
            panels.push(Panel {
                title: dir.into(),
                series,
            });
        }
        write_svg(
            f,
            "gdr copybw: bandwidth",
            SIZE_LABEL,
            "bandwidth (GB/s)",
            &panels,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
