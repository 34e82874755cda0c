//! `gdr storebw`: what caps CPU -> GPU writes through the mapping. Store widths, orders,
//! sources (registers, a buffer, a prefetched buffer) and targets (GPU, host memory) beside
//! the copy engine from pinned host memory, timed interleaved in one run
//! (`gdr_bench::write_ceiling`).

use super::gpu::{self, GpuArg};
use super::table::{parse_size, size as hsize, Table};
use super::{budget_ms, in_range, sizes_in_range, CmdResult, MAX_COPY_SIZE, MAX_COPY_THREADS};
use gdr_bench::write_ceiling::{self, CeilingConfig, CeilingRow, Skipped, PAGE};
use serde::Serialize;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct StorebwArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Region sizes (comma separated; multiples of 4K, from 4K to 1024G)
    #[arg(long, value_delimiter = ',', default_value = "16M,64M,256M", value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Thread counts of the library copy and of the register stores; the largest also runs
    /// the width, half-line, order and host-memory cases (comma separated; each from 1 to 256)
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub threads: Vec<usize>,
    /// Time per case and size, in milliseconds, from 1 to 60000 (at least 9 samples each)
    #[arg(long, default_value_t = 400)]
    pub budget_ms: u64,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct StorebwReport {
    rows: Vec<CeilingRow>,
    skipped: Vec<Skipped>,
}

pub fn run(args: StorebwArgs) -> CmdResult {
    // Checked before the GPU is opened: on a machine without one, a bad argument is still
    // reported as such. Each case keeps its own crew of threads for the run.
    sizes_in_range("sizes", &args.sizes, PAGE, MAX_COPY_SIZE)?;
    if let Some(s) = args.sizes.iter().find(|&&s| s % PAGE != 0) {
        return Err(format!("--sizes {}: must be a multiple of 4K", hsize(*s)).into());
    }
    in_range("threads", &args.threads, 1, MAX_COPY_THREADS)?;
    let budget = budget_ms(args.budget_ms)?;
    let be = gpu::open(args.gpu)?;
    let max = *args.sizes.iter().max().expect("checked non-empty");
    let buf = be.alloc(max, PAGE)?;
    let cfg = CeilingConfig {
        sizes: args.sizes.clone(),
        cases: write_ceiling::cases(&args.threads),
        budget,
        samples: 101,
    };
    if !args.json {
        eprintln!(
            "timing {} cases at {} sizes, about {:.0} s",
            cfg.cases.len(),
            cfg.sizes.len(),
            (cfg.cases.len() * cfg.sizes.len()) as f64 * args.budget_ms as f64 / 1e3
        );
    }
    let (rows, skipped) = write_ceiling::measure(Some(be.context()), &buf, &cfg)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&StorebwReport { rows, skipped })?
        );
        return Ok(ExitCode::SUCCESS);
    }
    for s in &skipped {
        eprintln!("left out: {} ({})", s.case, s.why);
    }
    let mut t = Table::new(&[
        "case",
        "size",
        "GB/s",
        "best GB/s",
        "lines/us",
        "vs CE pinned",
    ]);
    for r in &rows {
        let reference = rows
            .iter()
            .find(|o| o.size == r.size && o.detail == write_ceiling::Case::CopyEnginePinned)
            .map(|o| o.gbps);
        t.row(vec![
            r.case.clone(),
            hsize(r.size),
            format!("{:.2}", r.gbps),
            format!("{:.2}", r.gbps_best),
            format!("{:.1}", r.lines_per_us),
            reference.map_or("-".into(), |c| format!("{:.0}%", r.gbps / c * 100.0)),
        ]);
    }
    t.print();
    Ok(ExitCode::SUCCESS)
}
