//! `gdr-serve`: an accelerator-centric UDP server (the Lynx / SplitRPC design) and its
//! host-centric baseline, with a load generator.
//!
//! Network threads receive datagrams in batches, keep each request's control part (reply
//! address, request id, receive time) on the CPU and write its payload straight into a GPU
//! queue slot (`gdr_mq`); persistent GPU workers run the app and publish the answer,
//! which the thread sends back. See `docs/serve.md`.

// Modules, each using only those above it: wire, limits, lenet, net, apps, exec, gpu,
// server, load, run (signal stands alone). The backends (exec, gpu) know nothing of the
// server, which takes them as executors.
mod apps;
mod exec;
mod gpu;
mod lenet;
mod limits;
mod load;
mod net;
mod run;
mod server;
mod signal;
mod wire;

pub use apps::{App, AppKind, DEFAULT_SEED, ID_ECHO, ID_LENET, ID_USER, ID_VECADD};
pub use exec::{
    cpu_workers, split_queues, Answer, AppFailure, Executor, Idle, QueueExec, CPU_PARK,
};
pub use gpu::{
    auto_cluster, launch_workers, resident_shared_mem, worker_stages, GpuShape, HostCentricExec,
    WorkerStages,
};
// The LeNet reference on the CPU (the app's answers are checked against it) and its inputs.
pub use lenet::{
    forward as lenet_forward, image as lenet_image, logits_match as lenet_logits_match,
    parse_logits as lenet_parse_logits, RESIDENT_FLOATS as LENET_RESIDENT_FLOATS,
};
pub use limits::{
    available_memory, thread_bytes, MAX_APP_SOURCE, MAX_BATCH, MAX_IMAGES, MAX_OUTSTANDING,
    MAX_QUEUE_SETS, MAX_RATE, MAX_STREAMS, MAX_THREADS, MAX_TIMEOUT_MS, MAX_UNANSWERED,
};
// The load generator (`gdr load`): `run_load` sends what a `LoadConfig` says.
pub use load::{run as run_load, server_counters, LoadConfig, LoadMode, LoadReport, Payload};
pub use run::{serve, Mode, ServeOptions, DEFAULT_LISTEN};
pub use server::{Counters, ServeReport, Server, ServerConfig, StageSummary};
pub use signal::stop_flag;
// The datagram format (docs/serve.md): gdr-serve's own header or sockperf's.
pub use wire::{
    anonymous_error, decode_response, encode_request, encode_response_header, encode_stats_query,
    parse as parse_datagram, Control, Framing, Parsed, Response, Status,
    HEADER_LEN as WIRE_HEADER_LEN, KIND_REQUEST, KIND_STATS, MAGIC as WIRE_MAGIC, MAX_DATAGRAM,
    SOCKPERF_HEADER_LEN, VERSION as WIRE_VERSION,
};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(transparent)]
    Mq(#[from] gdr_mq::MqError),
    #[error(transparent)]
    Cuda(#[from] gdr::cuda::CudaError),
    #[error("{0}")]
    Backend(String),
}
