//! `gdr apiperf`: what making GPU memory reachable costs, by size — gdrcopy's apiperf for every
//! backend that works here, plus the registration cache's hit and miss. The rows and how each
//! is timed are `gdr_bench::apiperf`'s.

use super::gpu::GpuArg;
use super::table::{parse_size, size as hsize, Table};
use super::CmdResult;
use gdr::cuda::Context;
use gdr_bench::apiperf::{self, sizes, ApiperfRow, ApiperfSkip};
use serde::Serialize;
use std::process::ExitCode;

/// The most `--iters`: each run pins and maps, so more than this takes hours at 1 GiB.
const MAX_ITERS: usize = 100_000;

#[derive(clap::Args)]
pub struct ApiperfArgs {
    #[command(flatten)]
    pub gpu: GpuArg,
    /// Smallest size (bytes; K/M/G suffixes)
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub min_size: usize,
    /// Largest size
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub max_size: usize,
    /// Runs of each operation per size, from 1 to 100000 (at most 5 for sizes over 256 MiB)
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// How a backend left out is written, in the table's "not timed:" lines and in the JSON.
fn skipped_line(s: &ApiperfSkip) -> String {
    match s.size {
        None => format!("{}: {}", s.what, s.why),
        Some(size) => format!("{} at {}: {}", s.what, hsize(size), s.why),
    }
}

pub fn run(args: ApiperfArgs) -> CmdResult {
    if args.min_size > args.max_size {
        return Err("--min-size is larger than --max-size".into());
    }
    // Checked before the GPU is opened.
    let sizes = sizes(args.min_size, args.max_size);
    if sizes.is_empty() {
        return Err(format!(
            "no size from --min-size {} to --max-size {}",
            args.min_size, args.max_size
        )
        .into());
    }
    // 0 ran once, silently; a huge count ran for days.
    super::in_range("iters", &[args.iters], 1, MAX_ITERS)?;
    let ctx = Context::on(args.gpu.gpu)?;
    let rep = apiperf::measure(&ctx, &sizes, args.iters);
    let skipped: Vec<String> = rep.skipped.iter().map(skipped_line).collect();
    if args.json {
        /// What `--json` prints.
        #[derive(Serialize)]
        struct Report<'a> {
            rows: &'a [ApiperfRow],
            /// Backends (or steps) that could not be timed here, and why.
            skipped: &'a [String],
        }
        let json = Report {
            rows: &rep.rows,
            skipped: &skipped,
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        let mut t = Table::new(&["Backend", "Op", "Size", "Median(us)", "Min(us)", "N"]);
        for r in &rep.rows {
            t.row(vec![
                r.backend.clone(),
                r.op.to_string(),
                hsize(r.size),
                format!("{:.2}", r.median_us),
                format!("{:.2}", r.min_us),
                r.n.to_string(),
            ]);
        }
        t.print();
        for s in &skipped {
            println!("not timed: {s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::skipped_line;
    use gdr_bench::apiperf::{ApiperfError, ApiperfSkip};

    /// The lines are worded as before the benchmark moved to gdr-bench.
    #[test]
    fn skipped_backends_are_written_as_before() {
        let open = ApiperfSkip {
            what: "capi".into(),
            size: None,
            why: ApiperfError::Open,
        };
        assert_eq!(
            skipped_line(&open),
            "capi: gdr_open() failed (GDRCOPY_ENABLE_LOGGING=1 says why)"
        );
        let map = ApiperfSkip {
            what: "capi-vulkan".into(),
            size: Some(4096),
            why: ApiperfError::Capi {
                call: "gdr_map",
                errno: 22,
            },
        };
        assert_eq!(skipped_line(&map), "capi-vulkan at 4K: gdr_map: errno 22");
    }
}
