//! `gdr`: the command-line tool. Thin subcommands over the gdr crates; each library error
//! becomes one clear line on stderr and a non-zero exit code.

/// `println!` for every subcommand, with write errors reported: std's panics with a backtrace
/// when stdout cannot take the output (`gdr info > /dev/full`); this one says so in one line
/// and exits 2 ([`out::write`]). Defined before `mod cmd` so that it shadows std's there.
macro_rules! println {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` with write errors reported, as [`println!`].
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

mod cmd;
mod out;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "gdr",
    version,
    about = "Direct data paths between NVIDIA GPUs, the CPU and PCIe devices",
    long_about = "Direct data paths between NVIDIA GPUs, the CPU and PCIe devices.\n\n\
                  Start with `gdr check`: it tells what this machine can do and runs a short \
                  validation and latency table when a GPU is usable."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// First run: what this machine has, then sanity and a short latency table on a GPU
    Check(cmd::check::CheckArgs),
    /// GPUs, drivers, BAR1, PCIe links, and which CPU-mapping backends work here (and why not)
    Info(cmd::info::InfoArgs),
    /// Validate data through the CPU mapping against cuMemcpy (exit code 1 on any failure)
    Sanity(cmd::sanity::SanityArgs),
    /// Copy latency by size: mapping vs cuMemcpy vs the auto copier
    Copylat(cmd::copylat::CopylatArgs),
    /// Copy bandwidth by size and thread count: mapping vs copy engine vs the auto copier
    Copybw(cmd::copybw::CopybwArgs),
    /// What caps CPU->GPU writes: store widths, orders and sources beside the copy engine
    Storebw(cmd::storebw::StorebwArgs),
    /// CPU<->GPU ping-pong with a persistent GPU thread vs the host-centric round trip
    Pplat(cmd::pplat::PplatArgs),
    /// PCIe topology: path class and peer-to-peer verdict for every device pair
    Topo(cmd::topo::TopoArgs),
    /// User-space PCIe DMA engines (XDMA, QEMU edu) through VFIO
    Dma(cmd::dma::DmaArgs),
    /// Message queues to persistent GPU workers: `gdr mq bench`
    Mq(cmd::mq::MqArgs),
    /// Cost of export/pin, map, unmap, unpin by size for each backend, and the cache's hit/miss
    Apiperf(cmd::apiperf::ApiperfArgs),
    /// UDP server whose requests go straight into GPU queues (or the host-centric baseline)
    Serve(cmd::serve::ServeArgs),
    /// Load generator for `gdr serve`: closed or open loop, loss and latency percentiles
    Load(cmd::load::LoadArgs),
    /// Run a program with gdr's allocator preloaded: its cudaMalloc memory becomes mappable
    Run(cmd::run::RunArgs),
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`gdr topo | head`) as command-line tools do, instead of
    // panicking in print!.
    // SAFETY: setting a signal disposition to its default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = match Cli::try_parse_from(out::help_args(std::env::args_os())) {
        Ok(cli) => cli,
        // Help, version or a usage error: clap's text, with a failed write reported too.
        Err(e) => {
            if let Err(w) = e.print() {
                out::fail(&w);
            }
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = match cli.command {
        Command::Check(a) => cmd::check::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Sanity(a) => cmd::sanity::run(a),
        Command::Copylat(a) => cmd::copylat::run(a),
        Command::Copybw(a) => cmd::copybw::run(a),
        Command::Storebw(a) => cmd::storebw::run(a),
        Command::Pplat(a) => cmd::pplat::run(a),
        Command::Topo(a) => cmd::topo::run(a),
        Command::Dma(a) => cmd::dma::run(a),
        Command::Mq(a) => cmd::mq::run(a),
        Command::Apiperf(a) => cmd::apiperf::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Run(a) => cmd::run::run(a),
    };
    // A calibration cache that could not go where it should (a read-only or missing home, as
    // in many containers): said once, whichever command used it.
    if let Some(note) = gdr::bar::auto::take_cache_note() {
        eprintln!("gdr: note: {note}");
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gdr: error: {e}");
            ExitCode::from(2)
        }
    }
}
