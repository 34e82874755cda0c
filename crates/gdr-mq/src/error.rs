//! Errors of the message queues. Every one says what happened and, where messages were lost
//! with a worker, how many were in flight.

use gdr::bar::BarError;
use gdr::cuda::CudaError;
use std::fmt;
use std::time::Duration;

/// Where the messages of a queue were when something went wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct InFlight {
    /// Requests the host has sent.
    pub sent: u64,
    /// Requests the workers have answered (their lazily written count).
    pub answered: u64,
    /// Responses the host has received.
    pub received: u64,
}

impl InFlight {
    /// Messages sent and not yet received.
    pub fn pending(&self) -> u64 {
        self.sent - self.received
    }
}

impl fmt::Display for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} message(s) in flight: sent {}, answered by the worker {}, received {}",
            self.pending(),
            self.sent,
            self.answered,
            self.received
        )
    }
}

/// Why a queue's workers are no longer running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ExitReason {
    /// The host asked them to stop.
    Stopped,
    /// No request arrived for longer than the idle watchdog allows.
    IdleTimeout,
    /// A worker found the ring inconsistent (`error`, `arg` as in `layout::ERR_*`).
    Protocol { error: u32, arg: u32 },
    /// The workers ended without saying why (the kernel finished early).
    Unknown { state: u32 },
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::layout::*;
        match *self {
            ExitReason::Stopped => write!(f, "stopped on request"),
            ExitReason::IdleTimeout => write!(f, "idle watchdog expired"),
            ExitReason::Protocol { error, arg } => match error {
                ERR_BAD_SEQ => write!(
                    f,
                    "ring corrupt: slot of message {arg} has a wrong seq word"
                ),
                ERR_BAD_LEN => write!(
                    f,
                    "ring corrupt: message {arg} claims a length above the slot"
                ),
                ERR_OVERRUN => write!(f, "ring corrupt: doorbell {arg} is more than a ring ahead"),
                ERR_STALLED => write!(
                    f,
                    "stalled: the batch before message {arg} was not retired within the retire \
                     timeout (a handler ran longer, or its worker stopped)"
                ),
                e => write!(f, "worker error {e} at message {arg}"),
            },
            ExitReason::Unknown { state } => write!(f, "worker ended early (state {state})"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("message of {len} bytes is larger than the queue's slot payload of {max} bytes")]
    Oversize { len: usize, max: usize },
    #[error(
        "queue {queue}: all {slots} slots are in flight; receive responses before sending more"
    )]
    Full { queue: usize, slots: u32 },
    #[error("queue {queue}: recv with no request in flight would wait forever")]
    NothingInFlight { queue: usize },
    #[error("receive buffer of {cap} bytes is too small for the {len}-byte response")]
    BufferTooSmall { len: usize, cap: usize },
    #[error(
        "the handler answered message {index} with {len} bytes, above the {max}-byte capacity"
    )]
    ResponseTooLong { index: u64, len: usize, max: usize },
    #[error("timed out after {waited:?} waiting for {what}; {in_flight}")]
    Timeout {
        what: &'static str,
        waited: Duration,
        in_flight: InFlight,
    },
    #[error("queue {queue}: worker exited ({reason}); {in_flight}")]
    WorkerExited {
        queue: usize,
        reason: ExitReason,
        in_flight: InFlight,
    },
    #[error("queue {queue}: worker failed: {cause}; {in_flight}")]
    WorkerFailed {
        queue: usize,
        cause: String,
        in_flight: InFlight,
    },
    #[error("queue {queue}: protocol violation: {what}")]
    Protocol { queue: usize, what: String },
    #[error("bad queue configuration: {0}")]
    Config(String),
    #[error(
        "bad queue configuration: {clusters} clusters of {width} worker blocks do not fit at \
         once on this GPU (it holds {fit}); use fewer queues or a smaller cluster"
    )]
    ClustersDoNotFit { clusters: u32, width: u32, fit: u32 },
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Bar(#[from] BarError),
}

impl MqError {
    /// The in-flight picture carried by the error, if any.
    pub fn in_flight(&self) -> Option<InFlight> {
        match self {
            MqError::Timeout { in_flight, .. }
            | MqError::WorkerExited { in_flight, .. }
            | MqError::WorkerFailed { in_flight, .. } => Some(*in_flight),
            _ => None,
        }
    }
}
