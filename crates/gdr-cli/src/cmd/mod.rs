//! One module per subcommand. Each has an `Args` (clap) and a `run(Args) -> CmdResult`.

pub mod apiperf;
pub mod check;
pub mod copybw;
pub mod copylat;
pub mod dma;
pub mod gpu;
pub mod info;
pub mod load;
pub mod measure;
pub mod mq;
pub mod plot;
pub mod pplat;
pub mod sanity;
pub mod serve;
pub mod table;
pub mod topo;

/// What a subcommand returns: an exit code, or an error the CLI prints as one line.
pub type CmdResult = Result<std::process::ExitCode, Box<dyn std::error::Error + Send + Sync>>;
