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
/// The start of the verdict where an NVIDIA driver is here but nothing maps, before the reason.
const NOTHING_MAPS: &str = "gdr cannot map GPU memory here";
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
    latency: Option<Vec<gdr_bench::copylat::CopylatRow>>,
    verdict: String,
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
    let failure = if usable {
        None
    } else {
        nothing_maps(&inf, args.gpu.gpu)
    };
    let mut rep = Report {
        info: inf,
        gpu: args.gpu.gpu,
        mapping_usable: usable,
        sanity: None,
        latency: None,
        verdict: NO_MAPPING.into(),
    };
    if let Some(why) = failure {
        rep.verdict = format!("{NOTHING_MAPS}: {why}");
        return finish(&args, &rep, ExitCode::from(1));
    }
    if !usable {
        return finish(&args, &rep, ExitCode::SUCCESS);
    }
    if args.json {
        let s = sanity::report(args.gpu)?;
        let failed = s.failed;
        rep.sanity = Some(s);
        if failed > 0 {
            rep.verdict = SANITY_FAILED.into();
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
        gdr_bench::capi_map::CapiMemory::Pinned,
    )?;
    if !args.json {
        copylat::print(&rows);
    }
    rep.latency = Some(rows);
    rep.verdict = ALL_GOOD.into();
    finish(&args, &rep, ExitCode::SUCCESS)
}

/// Why `gdr check` fails on a machine with an NVIDIA driver where the GPU `gpu` has no mapping
/// backend: the driver is installed but did not start (a missing device node, say), or the GPU
/// is listed and neither the Vulkan mapping nor any pinning backend works on it. `None` where
/// there is nothing to fail for: no driver at all (a build machine), or a pinning backend that
/// works.
fn nothing_maps(inf: &gdr::info::Info, gpu: usize) -> Option<String> {
    if inf.cuda_loaded && inf.cuda_driver.is_none() {
        return inf.cuda_error.clone();
    }
    let g = inf.gpus.iter().find(|g| g.index == gpu)?;
    let row = |name| g.backends.iter().find(|b| b.name == name);
    if row("pin-auto").is_some_and(|b| b.usable) {
        return None;
    }
    // The Vulkan mapping's reason: gdr's own backend, and the one that names the fix for a
    // missing ICD or device node.
    Some(row("vulkan").map_or_else(|| "no backend was probed".into(), |b| b.detail.clone()))
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
