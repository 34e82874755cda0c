//! `gdr`: the command-line tool. Thin subcommands over the gdr crates; each library error
//! becomes one clear line on stderr and a non-zero exit code.

mod cmd;

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
    /// PCIe topology: path class and peer-to-peer verdict for every device pair
    Topo(cmd::topo::Args),
    /// User-space PCIe DMA engines (XDMA, QEMU edu) through VFIO
    Dma(cmd::dma::Args),
    /// Message queues to persistent GPU workers: `gdr mq bench`
    Mq(cmd::mq::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(a) => cmd::topo::run(a),
        Command::Dma(a) => cmd::dma::run(a),
        Command::Mq(a) => cmd::mq::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gdr: error: {e}");
            ExitCode::from(2)
        }
    }
}
