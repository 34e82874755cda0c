//! `gdr-serve`: an accelerator-centric UDP server (the Lynx / SplitRPC design) and its
//! host-centric baseline, with a load generator.
//!
//! Network threads receive datagrams in batches, keep each request's control part (reply
//! address, request id, receive time) on the CPU and write its payload straight into a GPU
//! queue slot (`gdr_mq`); persistent GPU workers run the app and publish the answer,
//! which the thread sends back. See `docs/serve.md`.
//!
//! # Example
//!
//! A request as a client builds it, parsed as the server's network thread does, answered by
//! the echo app's CPU version and the answer decoded again: the wire functions alone, with no
//! socket and no GPU.
//!
//! ```
//! use gdr_serve::{
//!     decode_response, encode_request, encode_response_header, parse_datagram, App, Control,
//!     Framing, Parsed, Status, ID_ECHO, WIRE_HEADER_LEN,
//! };
//!
//! // Client: request 42 for the echo app, 5 payload bytes behind the 16-byte header.
//! let mut dgram = Vec::new();
//! encode_request(&mut dgram, ID_ECHO, 42, b"hello");
//! assert_eq!(dgram.len(), WIRE_HEADER_LEN + 5);
//!
//! // Server: a server of echo parses it, keeps the control part and runs the app.
//! let echo = App::builtin("echo", 1, 1024)?;
//! let serves = |app: u16| app == echo.id();
//! let Parsed::Request { control, payload } = parse_datagram(Framing::Gdr, &dgram, false, serves)
//! else {
//!     panic!("a well-formed request for echo");
//! };
//! assert_eq!(control, Control::Gdr { app: ID_ECHO, id: 42 });
//! assert_eq!(echo.check(payload.len()), Ok(()));
//! let mut answer = vec![0u8; echo.max_response()];
//! let n = echo.run_cpu(payload, &mut answer).expect("echo has a CPU version");
//! let mut reply = Vec::new();
//! encode_response_header(&mut reply, &control, Status::Ok);
//! reply.extend_from_slice(&answer[..n]);
//!
//! // Client: the response carries the request's app and id back.
//! let r = decode_response(&reply).expect("a gdr-framed response");
//! assert_eq!((r.status, r.app, r.id, r.payload), (Status::Ok, ID_ECHO, 42, &b"hello"[..]));
//!
//! // Bad input gets its status code: here an app this server does not run.
//! encode_request(&mut dgram, 7, 43, b"?");
//! assert!(matches!(
//!     parse_datagram(Framing::Gdr, &dgram, false, serves),
//!     Parsed::Bad { status: Status::UnknownApp, control: Some(Control::Gdr { app: 7, id: 43 }) }
//! ));
//! # Ok::<(), gdr_serve::ServeError>(())
//! ```

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

pub use apps::{App, AppKind, CLUSTER_WARPS, DEFAULT_SEED, ID_ECHO, ID_LENET, ID_USER, ID_VECADD};
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
    available_memory, thread_bytes, MAX_APP_SOURCE, MAX_BATCH, MAX_IMAGES, MAX_IN_FLIGHT,
    MAX_OUTSTANDING, MAX_QUEUE_SETS, MAX_RATE, MAX_STREAMS, MAX_THREADS, MAX_TIMEOUT_MS,
    MAX_UNANSWERED,
};
// The load generator (`gdr load`): `run_load` sends what a `LoadConfig` says.
pub use load::{run as run_load, server_counters, LoadConfig, LoadMode, LoadReport, Payload};
pub use run::{serve, Mode, ServeOptions, DEFAULT_LISTEN};
pub use server::{Counters, ServeReport, Server, ServerConfig, StageSummary};
pub use signal::{stop_flag, stop_flag_after_setup, stop_when_ready};
// The datagram format (docs/serve.md): gdr-serve's own header or sockperf's.
pub use wire::{
    anonymous_error, decode_response, encode_request, encode_response_header, encode_stats_query,
    parse as parse_datagram, Control, Framing, Parsed, Response, Status,
    HEADER_LEN as WIRE_HEADER_LEN, KIND_REQUEST, KIND_STATS, MAGIC as WIRE_MAGIC, MAX_DATAGRAM,
    SOCKPERF_HEADER_LEN, VERSION as WIRE_VERSION,
};

/// Why a server, a load run or one of their parts could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting refused before anything was set up: an unknown app or mode, a number past
    /// its bound (the `MAX_*` constants), more memory than the machine has to spare, a shape
    /// the GPU or the app cannot have. The message is the whole explanation, naming the
    /// command-line option to change.
    #[error("{0}")]
    Config(String),
    /// A system call failed: what was being done (binding a socket, receiving, starting a
    /// thread) and the OS error.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// A `gdr_mq` queue or its workers failed (creating or launching them, a send or receive).
    #[error(transparent)]
    Mq(#[from] gdr_mq::MqError),
    /// A CUDA driver call failed (no GPU, a context, a module load, a launch).
    #[error(transparent)]
    Cuda(#[from] gdr::cuda::CudaError),
    /// Serving failed at run time: a network thread panicked, or every executor of a network
    /// thread failed.
    #[error("{0}")]
    Backend(String),
}
