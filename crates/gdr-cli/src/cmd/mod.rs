//! One module per subcommand. Each has an `Args` (clap) and a `run(Args) -> CmdResult`.

pub mod dma;
pub mod mq;
pub mod topo;

/// What a subcommand returns: an exit code, or an error the CLI prints as one line.
pub type CmdResult = Result<std::process::ExitCode, Box<dyn std::error::Error + Send + Sync>>;
