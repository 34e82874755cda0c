//! `gdr-serve`: an accelerator-centric UDP server (the Lynx / SplitRPC design) and its
//! host-centric baseline, with a load generator.
//!
//! Network threads receive datagrams in batches, keep each request's control part (reply
//! address, request id, receive time) on the CPU and write its payload straight into a GPU
//! queue slot ([`gdr::mq`]); persistent GPU workers run the app and publish the answer,
//! which the thread sends back. See `docs/serve.md`.

pub mod apps;
pub mod exec;
pub mod gpu;
pub mod lenet;
pub mod limits;
pub mod load;
pub mod net;
pub mod run;
pub mod server;
pub mod signal;
pub mod wire;

pub use apps::App;
pub use exec::{Executor, QueueExec};
pub use server::{Counters, Idle, ServeReport, Server, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(transparent)]
    Mq(#[from] gdr::mq::MqError),
    #[error(transparent)]
    Cuda(#[from] gdr::cuda::CudaError),
    #[error("{0}")]
    Backend(String),
}
