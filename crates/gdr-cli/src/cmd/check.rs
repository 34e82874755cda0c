//! `gdr check`: the first command to run on a machine. Says what is here and what is missing;
//! where a GPU is usable, validates the mapping (sanity) and prints a short latency table.

use super::{copylat, gpu, info, sanity, CmdResult};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub gpu: gpu::GpuArg,
}

pub fn run(args: Args) -> CmdResult {
    let inf = info::gather();
    info::print(&inf);
    let usable = inf
        .gpus
        .iter()
        .find(|g| g.index == args.gpu.gpu)
        // sanity and the latency table allocate through the Vulkan backend.
        .is_some_and(|g| g.backends.iter().any(|b| b.name == "vulkan" && b.usable));
    if !usable {
        println!(
            "\nNo usable GPU mapping here, so nothing more to check. gdr needs an NVIDIA GPU with \
             its driver (libcuda.so.1), the driver's Vulkan ICD and the libvulkan1 loader, and a \
             BAR1 large enough to map GPU memory (resizable BAR). `gdr info` shows the details."
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("\nValidating data through the mapping (gdr sanity)...");
    let code = sanity::run_quiet(args.gpu)?;
    if code != ExitCode::SUCCESS {
        println!("sanity failed: see the FAIL lines above; `gdr sanity` gives the full list");
        return Ok(code);
    }
    println!("\nLatency (median, microseconds):");
    let be = gpu::open(args.gpu)?;
    let auto = copylat::copier(&be, false, false)?;
    let rows = copylat::measure(
        &be,
        &auto,
        &[8, 64, 4096, 65536],
        Duration::from_millis(60),
        false,
    )?;
    copylat::print(&rows);
    println!("\nAll good. Next: `gdr copylat`, `gdr copybw`, `gdr pplat` for full measurements.");
    Ok(ExitCode::SUCCESS)
}
