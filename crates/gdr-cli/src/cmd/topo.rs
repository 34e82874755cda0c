//! `gdr topo`: the PCIe matrix, peer-to-peer verdicts, one path explained, JSON, and captures of
//! the sysfs entries behind them for bug reports.

use super::CmdResult;
use gdr::topo::{capture, render, Topology, Warning};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(
    about = "PCIe topology: path class and peer-to-peer verdict for device pairs",
    long_about = "PCIe topology: path class and peer-to-peer verdict for device pairs.\n\n\
                  Prints a matrix like `nvidia-smi topo -m` over the GPUs and the devices that \
                  exchange data with them (NICs, RDMA NICs, NVMe, FPGAs), each GPU's CPU and NUMA \
                  affinity, and a verdict per GPU pair: good, works-slower or \
                  poor-or-unsupported. Run as root to see ACS state (it lives in config space).\n\n\
                  Bounded for any tree: the matrix shows at most 64 devices, and at most 16384 \
                  pairs are judged (the GPU view: pairs with a GPU on one side; --all: every \
                  pair); past either bound a line says what was left out."
)]
pub struct TopoArgs {
    /// Show every PCIe endpoint, not only GPUs and their peer devices, and judge every pair
    /// of them (at most 16384 pairs; a warning counts the rest)
    #[arg(long)]
    all: bool,

    /// Explain the path between two devices hop by hop, with the verdict and its reasons.
    /// A and B: an address (0000:17:00.0 or 17:00.0), a name (gpu0, mlx5_0, nvme0, eth0) or a
    /// matrix label (GPU0, NIC1)
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    explain: Option<Vec<String>>,

    /// Read this sysfs tree instead of /sys (a capture, or a test fixture)
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs: PathBuf,

    /// Write JSON instead of text: {"devices":[..],"pairs":[..],"pairs_left_out":N,..}, or one
    /// pair with its hops together with --explain
    #[arg(long)]
    json: bool,

    /// Copy the sysfs entries this command reads into DIR (absent or empty), to attach to a bug
    /// report; read it back with --sysfs DIR
    #[arg(long, value_name = "DIR", conflicts_with_all = ["explain", "json", "all"])]
    capture: Option<PathBuf>,
}

fn print_warnings(warnings: &[Warning]) {
    for w in warnings {
        eprintln!("gdr: warning: {w}");
    }
}

/// NVLink counts between GPUs come from NVML (sysfs does not show them). Only for the live
/// system: a capture has no NVML behind it. Without NVML the matrix is PCIe-only.
fn add_nvlinks(topo: &mut Topology) {
    let Ok(links) = gdr::nvml::nvlinks() else {
        return;
    };
    let parsed: Vec<_> = links
        .iter()
        .filter_map(|(a, b, n)| Some((a.parse().ok()?, b.parse().ok()?, *n)))
        .collect();
    if let Err(e) = topo.set_nvlinks(&parsed) {
        eprintln!("gdr: warning: NVLink information from NVML not used: {e}");
    }
}

/// The line for an empty view; it suggests `--all` only to those who did not give it.
fn nothing_to_show(all: bool) -> &'static str {
    if all {
        "no devices to show (no PCIe endpoint found, only bridges)"
    } else {
        "no devices to show (no GPU, NIC, NVMe or accelerator found; --all shows every endpoint)"
    }
}

pub fn run(args: TopoArgs) -> CmdResult {
    if let Some(dest) = &args.capture {
        let s = capture::capture(&args.sysfs, dest)?;
        print_warnings(&s.warnings);
        println!(
            "captured {} files ({} bytes), {} links and {} directories from {} into {}",
            s.files,
            s.bytes,
            s.links,
            s.dirs,
            args.sysfs.display(),
            dest.display()
        );
        if s.serials_scrubbed > 0 {
            println!(
                "zeroed the device serial numbers in {} config files",
                s.serials_scrubbed
            );
        }
        println!(
            "{} PCI functions, {} of them GPUs; read it back with: gdr topo --sysfs {}",
            s.topology.devices().len(),
            s.topology.gpus().len(),
            dest.display()
        );
        return Ok(ExitCode::SUCCESS);
    }

    let mut topo = Topology::read(&args.sysfs)?;
    print_warnings(topo.warnings());
    if args.sysfs == std::path::Path::new("/sys") {
        add_nvlinks(&mut topo);
    }

    if let Some(pair) = &args.explain {
        let (a, b) = match pair.as_slice() {
            [a, b] => (topo.find(a)?.bdf, topo.find(b)?.bdf),
            _ => return Err("--explain takes two devices".into()),
        };
        let path = topo.path(a, b)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&path)?);
        } else {
            print!("{}", render::explain(&topo, &path));
        }
        return Ok(ExitCode::SUCCESS);
    }

    let shown = if args.all {
        topo.endpoints()
    } else {
        topo.gpu_view()
    };
    if args.json {
        // The default view's pairs are those with a GPU; --all asks for every pair. Both are
        // bounded (gdr_pci::limits::MAX_PAIRS), with a warning in the JSON past the bound.
        let report = if args.all {
            topo.report(&shown)
        } else {
            topo.gpu_report(&shown)
        };
        if report.pairs_left_out > 0 {
            eprintln!(
                "gdr: warning: {} pairs left out of the JSON: at most {} are judged at once",
                report.pairs_left_out,
                gdr::topo::limits::MAX_PAIRS
            );
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    if shown.is_empty() {
        println!("{}", nothing_to_show(args.all));
    } else {
        print!("{}", render::matrix(&topo, &shown));
    }
    if shown.len() > 1 {
        println!();
        // --all judges every pair, as its JSON does; the default view the pairs with a GPU.
        if args.all {
            print!("{}", render::verdicts_all(&topo, &shown));
        } else {
            print!("{}", render::verdicts(&topo, &shown));
        }
    }
    if topo.gpus().is_empty() {
        println!("\nno NVIDIA GPU found under {}", args.sysfs.display());
    }
    Ok(ExitCode::SUCCESS)
}
