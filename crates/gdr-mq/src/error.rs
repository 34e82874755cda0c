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
    /// A worker found the ring inconsistent, or waited too long on another worker, and
    /// failed the queue (`QueueStatus::state` is `STATE_FAILED`).
    Protocol {
        /// Which inconsistency: one of the [`layout`](crate::layout) error codes
        /// (`ERR_BAD_SEQ`, `ERR_BAD_LEN`, `ERR_OVERRUN`, `ERR_STALLED`); any other value is an
        /// application kernel's own code, shown as a number.
        error: u32,
        /// The detail the worker wrote with it (`QueueStatus::error_arg`): the message index
        /// concerned (for `ERR_OVERRUN`, the doorbell's producer index), as the worker's
        /// wrapping u32.
        arg: u32,
    },
    /// The workers ended without saying why (the kernel finished early, or never set a final
    /// state).
    Unknown {
        /// The raw `QueueStatus::state` word found (one of `layout::STATE_*`, or garbage); `0`
        /// also when the state could not be read as an exit reason at all.
        state: u32,
    },
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

/// Everything the message queues can fail with.
///
/// The first group is a caller's mistake or a full ring, reported before anything is written
/// (the queue stays usable); the second says the workers are gone or misbehaved, with the
/// [`InFlight`] picture of the messages at that moment ([`MqError::in_flight`]); the rest wrap
/// the driver and mapping errors of setting a queue up.
#[derive(Debug, thiserror::Error)]
pub enum MqError {
    /// A request (or, for the host-centric baseline, a message) is longer than a slot's
    /// payload capacity, `max_msg`. Nothing was sent.
    #[error("message of {len} bytes is larger than the queue's slot payload of {max} bytes")]
    Oversize {
        /// Bytes of the message.
        len: usize,
        /// The queue's `max_msg` in bytes.
        max: usize,
    },
    /// [`QueuePair::send`](crate::QueuePair::send) found no credit: `slots` messages are in
    /// flight (requests not yet answered plus responses not yet received). Receive first, or
    /// use `try_send`, which reports this as `Ok(false)`.
    #[error(
        "queue {queue}: all {slots} slots are in flight; receive responses before sending more"
    )]
    Full {
        /// Index of the queue in its set.
        queue: usize,
        /// Slots per ring, the most messages that can be in flight.
        slots: u32,
    },
    /// A blocking receive was called with no request outstanding: nothing could ever arrive.
    #[error("queue {queue}: recv with no request in flight would wait forever")]
    NothingInFlight {
        /// Index of the queue in its set.
        queue: usize,
    },
    /// The oldest response does not fit the caller's buffer. It stays queued: receive it again
    /// with a buffer of at least `len` bytes.
    #[error("receive buffer of {cap} bytes is too small for the {len}-byte response")]
    BufferTooSmall {
        /// Bytes of the response.
        len: usize,
        /// Bytes of the buffer given.
        cap: usize,
    },
    /// The handler returned a response length above the slot capacity. The worker sent
    /// `max_msg` bytes of payload with the true length; the host drops that response (its slot
    /// is retired) and reports it, so the next receive gets the next message.
    #[error(
        "the handler answered message {index} with {len} bytes, above the {max}-byte capacity"
    )]
    ResponseTooLong {
        /// The message's position in the queue's stream (0 for the first message sent, not
        /// the ring index; 0 for the host-centric baseline).
        index: u64,
        /// The length the handler returned, in bytes.
        len: usize,
        /// The queue's `max_msg` in bytes.
        max: usize,
    },
    /// A blocking call waited its whole bound (`QueueConfig::wait_timeout`, or the timeout
    /// given to a stop) while the workers still looked alive.
    #[error("timed out after {waited:?} waiting for {what}; {in_flight}")]
    Timeout {
        /// What was awaited, in words (`"a response"`, the kernel to stop).
        what: &'static str,
        /// How long the call waited.
        waited: Duration,
        /// The queue's messages when it gave up.
        in_flight: InFlight,
    },
    /// The queue's workers have left (stopped, idle watchdog, or a protocol error they
    /// found); messages still in flight will not be answered.
    #[error("queue {queue}: worker exited ({reason}); {in_flight}")]
    WorkerExited {
        /// Index of the queue in its set.
        queue: usize,
        /// Why they left, from the queue's status record.
        reason: ExitReason,
        /// The queue's messages when that was seen.
        in_flight: InFlight,
    },
    /// The workers died without leaving a reason of their own: the worker kernel failed (a
    /// trap, a fault: its stream reports a CUDA error) or a CPU worker thread panicked.
    #[error("queue {queue}: worker failed: {cause}; {in_flight}")]
    WorkerFailed {
        /// Index of the queue in its set (0 for a failure of the whole set).
        queue: usize,
        /// The CUDA error or panic message, as text.
        cause: String,
        /// The queue's messages when that was seen.
        in_flight: InFlight,
    },
    /// The host found the ring inconsistent (a response carrying another message's tag), or a
    /// benchmark found a wrong answer. The queue cannot be trusted after this.
    #[error("queue {queue}: protocol violation: {what}")]
    Protocol {
        /// Index of the queue in its set.
        queue: usize,
        /// What was wrong, in words.
        what: String,
    },
    /// A configuration that cannot work (slot count not a power of two, too many warps, word
    /// RX with several workers, ...), or a resource that could not be had for it (memory, a
    /// thread); the text says which.
    #[error("bad queue configuration: {0}")]
    Config(String),
    /// The worker kernel runs in thread-block clusters and not all of its clusters can be
    /// resident at once, which the workers need (they wait on each other and on the host).
    #[error(
        "bad queue configuration: {clusters} clusters of {width} worker blocks do not fit at \
         once on this GPU (it holds {fit}); use fewer queues or a smaller cluster"
    )]
    ClustersDoNotFit {
        /// Clusters the launch needs (worker blocks / `width`).
        clusters: u32,
        /// Blocks per cluster, as the kernel was compiled.
        width: u32,
        /// Clusters of that width the GPU holds at once (the driver's answer).
        fit: u32,
    },
    /// A CUDA driver or NVRTC call failed (compiling the handler, allocating, launching).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Mapping GPU memory through BAR1 failed (placements with a ring in GPU memory).
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
