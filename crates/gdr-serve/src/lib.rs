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
//! use gdr_serve::apps::ID_ECHO;
//! use gdr_serve::wire::{
//!     self, decode_response, encode_request, encode_response_header, Control, Framing, Parsed,
//!     Status, HEADER_LEN,
//! };
//! use gdr_serve::App;
//!
//! // Client: request 42 for the echo app, 5 payload bytes behind the 16-byte header.
//! let mut dgram = Vec::new();
//! encode_request(&mut dgram, ID_ECHO, 42, b"hello");
//! assert_eq!(dgram.len(), HEADER_LEN + 5);
//!
//! // Server: a server of echo parses it, keeps the control part and runs the app.
//! let echo = App::builtin("echo", 1, 1024)?;
//! let serves = |app: u16| app == echo.id();
//! let Parsed::Request { control, payload } = wire::parse(Framing::Gdr, &dgram, false, serves)
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
//!     wire::parse(Framing::Gdr, &dgram, false, serves),
//!     Parsed::Bad { status: Status::UnknownApp, control: Some(Control::Gdr { app: 7, id: 43 }) }
//! ));
//! # Ok::<(), gdr_serve::ServeError>(())
//! ```

// Modules, each using only those above it: wire, limits, lenet, net, apps, exec, gpu,
// server, load, run (signal stands alone). The backends (exec, gpu) know nothing of the
// server, which takes them as executors.
pub mod apps;
pub mod exec;
pub mod gpu;
pub mod lenet;
pub mod limits;
pub mod load;
mod net;
pub mod run;
pub mod server;
pub mod signal;
pub mod wire;

// What a user starts from: a whole server run (`serve` with its options), a server of one's
// own with its executors, an app, and a load run (`load::run`). The rest is under its module.
pub use apps::App;
pub use load::LoadConfig;
pub use run::{serve, Mode, ServeOptions};
pub use server::{Server, ServerConfig};

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
