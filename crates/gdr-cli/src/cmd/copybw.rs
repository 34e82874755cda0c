//! `gdr copybw`: bandwidth through the mapping on 1..N threads, beside the copy engines and
//! the auto copier (measured by `gdr_bench::copybw`).

use super::copylat::copier_for;
use super::gpu::{self, GpuArg};
use super::plot::{write_svg, Panel, Series, SIZE_LABEL};
use super::report::ReportArgs;
use super::table::{parse_size, size as hsize, Table};
use super::{budget_ms, in_range, sizes_in_range, CmdResult, MAX_COPY_SIZE, MAX_COPY_THREADS};
use gdr_bench::capi_map::CapiMapping;
use gdr_bench::copy::{dir_name, RawLog};
use gdr_bench::copybw::{self, CopybwRow};
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
    let capi = match CapiMapping::open(be.context(), max, args.report.capi_memory.into()) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("C API rows left out: {e}");
            None
        }
    };
    let raw = RawLog::create(args.report.raw_samples.as_deref())?;
    let rows = copybw::measure(
        &be,
        &auto,
        &args.sizes,
        &args.threads,
        budget,
        raw.as_ref(),
        capi.as_ref(),
        |dir, size| {
            if !args.report.json {
                eprint!("\r{} {:>6}   ", dir_name(dir), hsize(size));
            }
        },
    )?;
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
            let rs: Vec<&CopybwRow> = rows.iter().filter(|r| r.direction == dir).collect();
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
