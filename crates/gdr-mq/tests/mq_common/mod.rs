//! Shared by the mq tests: requests that carry a unique id, and a checker that proves every
//! response answers the oldest outstanding request, exactly once and in order.
//!
//! The handlers under test answer `transform(request)` (bytes reversed, each xored with the
//! length), which is invertible, so the checker reads the id back out of the response itself:
//! a response delivered twice is reported as a duplicate by id, not as "wrong bytes".

#![allow(dead_code)] // each test binary uses its own part

use rand::Rng;
use std::collections::{HashSet, VecDeque};

/// Bytes of the id at the front of every tracked request.
pub const ID_BYTES: usize = 8;

/// [`transform`] as a CUDA handler: a response proves the GPU saw exactly this request.
pub const TRANSFORM: &str = r#"
__device__ unsigned int handle(const unsigned char *req, unsigned int len,
                               unsigned char *resp, unsigned int cap) {
    if (len > cap) return cap + 1;
    const unsigned char k = (unsigned char)len;
    for (unsigned int i = 0; i < len; i++) resp[i] = req[len - 1 - i] ^ k;
    return len;
}
"#;

/// Reverses the request and xors every byte with its length.
pub fn transform(req: &[u8]) -> Vec<u8> {
    let k = req.len() as u8;
    req.iter().rev().map(|b| b ^ k).collect()
}

/// The request a `transform` response answers.
pub fn untransform(resp: &[u8]) -> Vec<u8> {
    transform(resp)
}

/// Requests sent and not yet answered, plus every id answered so far.
pub struct Tracker {
    stream: u64,
    next: u64,
    pending: VecDeque<(u64, Vec<u8>)>,
    seen: HashSet<u64>,
}

impl Tracker {
    /// Ids are `stream << 40 | n`, so trackers of different queues never share one.
    pub fn new(stream: u64) -> Tracker {
        Tracker {
            stream,
            next: 0,
            pending: VecDeque::new(),
            seen: HashSet::new(),
        }
    }

    /// A fresh request of `len` bytes (at least [`ID_BYTES`]): the id, then random bytes.
    /// It counts as outstanding from now on.
    pub fn request(&mut self, rng: &mut impl Rng, len: usize) -> Vec<u8> {
        let id = (self.stream << 40) | self.next;
        self.next += 1;
        let mut m = vec![0u8; len.max(ID_BYTES)];
        rng.fill_bytes(&mut m[ID_BYTES..]);
        m[..ID_BYTES].copy_from_slice(&id.to_le_bytes());
        self.pending.push_back((id, m.clone()));
        m
    }

    /// Checks one response: it must carry an id never answered before, the id of the oldest
    /// outstanding request, and exactly that request's transform.
    pub fn check(&mut self, resp: &[u8]) -> Result<(), String> {
        if resp.len() < ID_BYTES {
            return Err(format!("a {}-byte response carries no id", resp.len()));
        }
        let req = untransform(resp);
        let id = u64::from_le_bytes(req[..ID_BYTES].try_into().expect("8 bytes"));
        if !self.seen.insert(id) {
            return Err(format!(
                "message id {id:#x} delivered twice (after {} answers)",
                self.seen.len()
            ));
        }
        let Some((want, m)) = self.pending.front() else {
            return Err(format!("response with id {id:#x} but nothing outstanding"));
        };
        if id != *want {
            return Err(format!(
                "out of order: got the answer to id {id:#x}, expected id {want:#x}"
            ));
        }
        if resp != transform(m) {
            return Err(format!("id {id:#x}: the response has the wrong bytes"));
        }
        self.pending.pop_front();
        Ok(())
    }

    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Distinct ids answered.
    pub fn answered(&self) -> u64 {
        self.seen.len() as u64
    }
}
