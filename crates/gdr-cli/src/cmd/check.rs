//! `gdr check`: the first command to run on a machine. Says what is here and what is missing;
//! where a GPU is usable, validates the mapping (sanity) and prints a short latency table.

use super::{copylat, gpu, info, sanity, CmdResult};
use serde::Serialize;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub gpu: gpu::GpuArg,
    /// Print JSON instead of text: `info`, then `sanity` and `latency` (null where no GPU
    /// mapping is usable), and a one-line `verdict`
    #[arg(long)]
    pub json: bool,
}

const NO_MAPPING: &str = "No usable GPU mapping here, so nothing more to check. gdr needs an \
     NVIDIA GPU with its driver (libcuda.so.1), the driver's Vulkan ICD and the libvulkan1 \
     loader, and a BAR1 large enough to map GPU memory (resizable BAR). `gdr info` shows the \
     details.";
const SANITY_FAILED: &str =
    "sanity failed: see the FAIL lines above; `gdr sanity` gives the full list";
const ALL_GOOD: &str =
    "All good. Next: `gdr copylat`, `gdr copybw`, `gdr pplat` for full measurements.";

/// What `gdr check --json` prints.
#[derive(Serialize)]
struct Report {
    info: gdr::info::Info,
    gpu: usize,
    /// Whether `--gpu` has a working Vulkan mapping, which sanity and the latency table need.
    mapping_usable: bool,
    sanity: Option<sanity::SanityReport>,
    latency: Option<Vec<copylat::CopylatRow>>,
    verdict: &'static str,
}

pub fn run(args: CheckArgs) -> CmdResult {
    let inf = gdr::info::gather();
    if !args.json {
        info::print(&inf);
    }
    let usable = inf
        .gpus
        .iter()
        .find(|g| g.index == args.gpu.gpu)
        // sanity and the latency table allocate through the Vulkan backend.
        .is_some_and(|g| g.backends.iter().any(|b| b.name == "vulkan" && b.usable));
    let mut rep = Report {
        info: inf,
        gpu: args.gpu.gpu,
        mapping_usable: usable,
        sanity: None,
        latency: None,
        verdict: NO_MAPPING,
    };
    if !usable {
        return finish(&args, &rep, ExitCode::SUCCESS);
    }
    if args.json {
        let s = sanity::report(args.gpu)?;
        let failed = s.failed;
        rep.sanity = Some(s);
        if failed > 0 {
            rep.verdict = SANITY_FAILED;
            return finish(&args, &rep, ExitCode::from(1));
        }
    } else {
        println!("\nValidating data through the mapping (gdr sanity)...");
        let code = sanity::run_quiet(args.gpu)?;
        if code != ExitCode::SUCCESS {
            println!("{SANITY_FAILED}");
            return Ok(code);
        }
        println!("\nLatency (median, microseconds):");
    }
    let be = gpu::open(args.gpu)?;
    let auto = copylat::copier(&be, false, false, args.json)?;
    let rows = copylat::measure(
        &be,
        &auto,
        &[8, 64, 4096, 65536],
        Duration::from_millis(60),
        false,
        None,
        super::capi_map::CapiMemory::Pinned,
    )?;
    if !args.json {
        copylat::print(&rows);
    }
    rep.latency = Some(rows);
    rep.verdict = ALL_GOOD;
    finish(&args, &rep, ExitCode::SUCCESS)
}

/// Prints the verdict (text) or the whole report (JSON), and returns `code`.
fn finish(args: &CheckArgs, rep: &Report, code: ExitCode) -> CmdResult {
    if args.json {
        println!("{}", serde_json::to_string_pretty(rep)?);
    } else {
        println!("\n{}", rep.verdict);
    }
    Ok(code)
}
