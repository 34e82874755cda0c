//! The wire format of `gdr serve`: one UDP datagram per request and per response.
//!
//! Two framings. `Gdr` (the default) puts a 16-byte header in front of every request and
//! response, so a client can multiplex apps and match answers to questions:
//!
//! ```text
//! request                                  response
//!  0  magic  "gq"  [u8; 2]                  0  magic  "gq"
//!  2  version 1     u8                      2  version 1
//!  3  kind          u8 (0 request, 1 stats) 3  status  u8 (Status)
//!  4  app id        u16 LE                  4  app id  u16 LE (echoed)
//!  6  reserved      u16 (0)                 6  reserved
//!  8  request id    u64 LE                  8  request id u64 LE (echoed)
//! 16  payload                              16  payload (empty unless status is Ok)
//! ```
//!
//! `Sockperf` has no header of ours: every datagram starts with sockperf's own 14-byte header
//! (its `MsgHeader`, big-endian: u64 sequence number, u16 flags, u32 message length; the
//! smallest message sockperf sends, `-m 14`, is the header alone), which the server hands
//! back in front of the response, unchanged except for the client flag a sockperf server
//! clears (a sockperf client ignores messages that carry it); the rest of the datagram is
//! the payload of the server's app. With `echo` the answer is the datagram itself, as
//! sockperf's ping-pong and under-load modes expect.

/// Size of the `Gdr` framing's header.
pub const HEADER_LEN: usize = 16;
/// Size of sockperf's header (`MsgHeader::EFFECTIVE_SIZE` in sockperf's source).
pub const SOCKPERF_HEADER_LEN: usize = 14;
/// The two magic bytes of the `Gdr` framing.
pub const MAGIC: [u8; 2] = *b"gq";
/// The version byte (offset 2) of the `Gdr` framing, in requests and responses; a request
/// with any other is refused as [`Status::BadHeader`].
pub const VERSION: u8 = 1;
/// The kind byte (offset 3) of a request for an app; [`KIND_STATS`] is the other kind.
pub const KIND_REQUEST: u8 = 0;
/// The kind byte (offset 3) of a query for the server's counters: the response (app id 0,
/// the query's request id) carries them as JSON. Answered only by a server started with
/// stats on; otherwise it is bad input.
pub const KIND_STATS: u8 = 1;
/// Largest UDP payload over IPv4: 65535 less the 20-byte IP and 8-byte UDP headers.
pub const MAX_DATAGRAM: usize = 65507;

/// Sockperf's flag bits (offset 8, big-endian u16).
const SOCKPERF_CLIENT: u16 = 1;
const SOCKPERF_PONG_REQUEST: u16 = 2;

/// How the bytes of a datagram are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Framing {
    /// gdr-serve's own 16-byte header (magic, version, kind or status, app id, request id)
    /// in front of every request and response.
    Gdr,
    /// sockperf's 14-byte header in front of every request, handed back in front of the
    /// response; one app per server, no request ids of ours.
    Sockperf,
}

impl Framing {
    /// The framing a command line names: `gdr` or `sockperf`; None for anything else.
    pub fn parse(s: &str) -> Option<Framing> {
        match s {
            "gdr" => Some(Framing::Gdr),
            "sockperf" => Some(Framing::Sockperf),
            _ => None,
        }
    }

    /// Bytes in front of the payload of a request.
    pub fn header_len(self) -> usize {
        match self {
            Framing::Gdr => HEADER_LEN,
            Framing::Sockperf => SOCKPERF_HEADER_LEN,
        }
    }
}

/// The outcome byte of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum Status {
    /// Answered: the payload is the app's response.
    Ok = 0,
    /// A datagram of zero bytes.
    Empty = 1,
    /// Shorter than the header, or a payload shorter than the app needs.
    Truncated = 2,
    /// Larger than the receive buffer or the app's largest request.
    Oversized = 3,
    /// No app with that id runs on this server.
    UnknownApp = 4,
    /// Not our magic, version or kind.
    BadHeader = 5,
    /// The app failed on this request (its answer did not fit).
    AppFailed = 6,
}

impl Status {
    /// Every status, in the order of their byte values (0 to 6).
    pub const ALL: [Status; 7] = [
        Status::Ok,
        Status::Empty,
        Status::Truncated,
        Status::Oversized,
        Status::UnknownApp,
        Status::BadHeader,
        Status::AppFailed,
    ];

    /// The status of a response's status byte; None for a value no status has (7 and up).
    pub fn from_u8(v: u8) -> Option<Status> {
        Self::ALL.into_iter().find(|s| *s as u8 == v)
    }

    /// The status in snake case (`ok`, `unknown_app`, ...): the key of a load report's error
    /// counts.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Empty => "empty",
            Status::Truncated => "truncated",
            Status::Oversized => "oversized",
            Status::UnknownApp => "unknown_app",
            Status::BadHeader => "bad_header",
            Status::AppFailed => "app_failed",
        }
    }
}

/// What the server keeps on the CPU about a request while its payload is on the GPU: enough
/// to build the response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// A request in the `Gdr` framing.
    Gdr {
        /// The app id of the request (offset 4), echoed in the response.
        app: u16,
        /// The client's request id (offset 8), echoed in the response.
        id: u64,
    },
    /// A request in the `Sockperf` framing.
    Sockperf {
        /// sockperf's header as the response returns it: the request's, with the client
        /// flag cleared.
        header: [u8; SOCKPERF_HEADER_LEN],
        /// Whether the client asked for a reply (sockperf's pong-request flag; clear in
        /// its under-load mode for most messages).
        reply: bool,
    },
}

impl Control {
    /// Whether a response datagram goes back at all.
    pub fn wants_reply(&self) -> bool {
        match self {
            Control::Gdr { .. } => true,
            Control::Sockperf { reply, .. } => *reply,
        }
    }

    /// The request id (sockperf: its sequence number).
    pub fn id(&self) -> u64 {
        match self {
            Control::Gdr { id, .. } => *id,
            Control::Sockperf { header, .. } => {
                u64::from_be_bytes(header[0..8].try_into().expect("8 bytes"))
            }
        }
    }
}

/// A parsed datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A request for an app the server runs (in the `Gdr` framing, `accept_app` said yes to
    /// its app id; sockperf's framing names no app).
    Request {
        /// What the response header is built from.
        control: Control,
        /// The bytes after the header, for the app (not yet checked against its limits).
        payload: &'a [u8],
    },
    /// A counters query ([`KIND_STATS`]).
    Stats {
        /// The query's request id, to be echoed.
        id: u64,
    },
    /// Bad input.
    Bad {
        /// Which kind of bad input, the code an error reply carries.
        status: Status,
        /// What an error reply is built from, when the header was good enough to say; None
        /// when the datagram had no usable header.
        control: Option<Control>,
    },
}

/// Parses one datagram of `len` bytes (`truncated` when the kernel cut it to the buffer,
/// MSG_TRUNC). `accept_app` says whether an app id is served here.
pub fn parse<'a>(
    framing: Framing,
    dgram: &'a [u8],
    truncated: bool,
    accept_app: impl Fn(u16) -> bool,
) -> Parsed<'a> {
    if dgram.is_empty() && !truncated {
        return Parsed::Bad {
            status: Status::Empty,
            control: None,
        };
    }
    match framing {
        Framing::Gdr => {
            if dgram.len() < HEADER_LEN {
                let status = if dgram.len() >= 2 && dgram[0..2] != MAGIC {
                    Status::BadHeader
                } else {
                    Status::Truncated
                };
                return Parsed::Bad {
                    status,
                    control: None,
                };
            }
            let app = u16::from_le_bytes([dgram[4], dgram[5]]);
            let id = u64::from_le_bytes(dgram[8..16].try_into().expect("8 bytes"));
            if dgram[0..2] != MAGIC || dgram[2] != VERSION {
                return Parsed::Bad {
                    status: Status::BadHeader,
                    control: None,
                };
            }
            let control = Control::Gdr { app, id };
            match dgram[3] {
                KIND_STATS => return Parsed::Stats { id },
                KIND_REQUEST => {}
                _ => {
                    return Parsed::Bad {
                        status: Status::BadHeader,
                        control: Some(control),
                    }
                }
            }
            if truncated {
                return Parsed::Bad {
                    status: Status::Oversized,
                    control: Some(control),
                };
            }
            if !accept_app(app) {
                return Parsed::Bad {
                    status: Status::UnknownApp,
                    control: Some(control),
                };
            }
            Parsed::Request {
                control,
                payload: &dgram[HEADER_LEN..],
            }
        }
        Framing::Sockperf => {
            if dgram.len() < SOCKPERF_HEADER_LEN {
                return Parsed::Bad {
                    status: Status::Truncated,
                    control: None,
                };
            }
            let mut header: [u8; SOCKPERF_HEADER_LEN] =
                dgram[..SOCKPERF_HEADER_LEN].try_into().expect("14 bytes");
            let flags = u16::from_be_bytes([header[8], header[9]]);
            let reply = flags & SOCKPERF_PONG_REQUEST != 0;
            header[8..10].copy_from_slice(&(flags & !SOCKPERF_CLIENT).to_be_bytes());
            let control = Control::Sockperf { header, reply };
            if truncated {
                return Parsed::Bad {
                    status: Status::Oversized,
                    control: Some(control),
                };
            }
            Parsed::Request {
                control,
                payload: &dgram[SOCKPERF_HEADER_LEN..],
            }
        }
    }
}

/// Writes a request datagram into `out` (cleared first).
pub fn encode_request(out: &mut Vec<u8>, app: u16, id: u64, payload: &[u8]) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(KIND_REQUEST);
    out.extend_from_slice(&app.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(payload);
}

/// The counters query datagram for request id `id`: a `Gdr` header of kind [`KIND_STATS`],
/// app id 0, no payload.
pub fn encode_stats_query(id: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN);
    encode_request(&mut v, 0, id, &[]);
    v[3] = KIND_STATS;
    v
}

/// Writes the response header for `control` with `status` into `out` (cleared first); the
/// caller appends the payload.
pub fn encode_response_header(out: &mut Vec<u8>, control: &Control, status: Status) {
    out.clear();
    match control {
        Control::Gdr { app, id } => {
            out.extend_from_slice(&MAGIC);
            out.push(VERSION);
            out.push(status as u8);
            out.extend_from_slice(&app.to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&id.to_le_bytes());
        }
        Control::Sockperf { header, .. } => out.extend_from_slice(header),
    }
}

/// The header of an error response to a datagram that had no usable header of its own.
pub fn anonymous_error(out: &mut Vec<u8>, status: Status) {
    encode_response_header(out, &Control::Gdr { app: 0, id: 0 }, status);
}

/// A decoded response (`Gdr` framing).
#[derive(Debug, PartialEq, Eq)]
pub struct Response<'a> {
    /// The outcome (offset 3).
    pub status: Status,
    /// The app id of the request (offset 4); 0 for a counters answer or an error to a
    /// datagram without a usable header.
    pub app: u16,
    /// The request id of the request (offset 8); 0 for an error to a datagram without a
    /// usable header.
    pub id: u64,
    /// The bytes after the header: the app's answer when `status` is `Ok`, else empty.
    pub payload: &'a [u8],
}

/// Decodes a response datagram; None when it is not one of ours.
pub fn decode_response(d: &[u8]) -> Option<Response<'_>> {
    if d.len() < HEADER_LEN || d[0..2] != MAGIC || d[2] != VERSION {
        return None;
    }
    Some(Response {
        status: Status::from_u8(d[3])?,
        app: u16::from_le_bytes([d[4], d[5]]),
        id: u64::from_le_bytes(d[8..16].try_into().expect("8 bytes")),
        payload: &d[HEADER_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(app: u16) -> impl Fn(u16) -> bool {
        move |a| a == app
    }

    #[test]
    fn request_round_trips_through_parse() {
        let payload: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
        let mut d = Vec::new();
        encode_request(&mut d, 2, 0xdead_beef_0042, &payload);
        assert_eq!(d.len(), HEADER_LEN + payload.len());
        match parse(Framing::Gdr, &d, false, only(2)) {
            Parsed::Request {
                control,
                payload: p,
            } => {
                assert_eq!(
                    control,
                    Control::Gdr {
                        app: 2,
                        id: 0xdead_beef_0042
                    }
                );
                assert_eq!(p, &payload[..]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn response_header_echoes_app_and_id() {
        let mut r = Vec::new();
        encode_response_header(&mut r, &Control::Gdr { app: 3, id: 77 }, Status::Ok);
        r.extend_from_slice(b"abc");
        let d = decode_response(&r).unwrap();
        assert_eq!(
            (d.status, d.app, d.id, d.payload),
            (Status::Ok, 3, 77, &b"abc"[..])
        );
        let mut e = Vec::new();
        encode_response_header(&mut e, &Control::Gdr { app: 9, id: 5 }, Status::UnknownApp);
        assert_eq!(decode_response(&e).unwrap().status, Status::UnknownApp);
        assert!(decode_response(b"xx").is_none());
        assert!(
            decode_response(&[b'g', b'q', 1, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none()
        );
    }

    #[test]
    fn every_kind_of_bad_input_gets_its_code() {
        let bad = |d: &[u8], trunc: bool| match parse(Framing::Gdr, d, trunc, only(1)) {
            Parsed::Bad { status, .. } => status,
            other => panic!("{d:?}: {other:?}"),
        };
        assert_eq!(bad(&[], false), Status::Empty);
        assert_eq!(bad(b"gq\x01", false), Status::Truncated);
        assert_eq!(bad(b"zz\x01\x00", false), Status::BadHeader);
        let mut d = Vec::new();
        encode_request(&mut d, 1, 1, &[1, 2, 3]);
        assert_eq!(bad(&d, true), Status::Oversized);
        encode_request(&mut d, 4, 1, &[]);
        assert_eq!(bad(&d, false), Status::UnknownApp);
        let mut v = d.clone();
        v[2] = 9;
        assert_eq!(bad(&v, false), Status::BadHeader);
        let mut k = d.clone();
        k[3] = 7;
        assert_eq!(bad(&k, false), Status::BadHeader);
        // Errors that know their requester carry its id.
        match parse(Framing::Gdr, &d, false, only(1)) {
            Parsed::Bad { control, .. } => {
                assert_eq!(control, Some(Control::Gdr { app: 4, id: 1 }))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stats_query_is_recognised() {
        let q = encode_stats_query(12);
        assert_eq!(
            parse(Framing::Gdr, &q, false, only(1)),
            Parsed::Stats { id: 12 }
        );
    }

    #[test]
    fn sockperf_header_comes_back_with_the_client_flag_cleared() {
        // A LeNet image behind sockperf's 14-byte header: sockperf -m 798.
        let mut d = vec![0u8; 14 + 784];
        d[0..8].copy_from_slice(&41u64.to_be_bytes());
        d[8..10].copy_from_slice(&(SOCKPERF_CLIENT | SOCKPERF_PONG_REQUEST).to_be_bytes());
        d[10..14].copy_from_slice(&798u32.to_be_bytes());
        d[14] = 0xab;
        match parse(Framing::Sockperf, &d, false, only(1)) {
            Parsed::Request { control, payload } => {
                assert!(control.wants_reply());
                assert_eq!(control.id(), 41);
                assert_eq!(payload.len(), 784);
                assert_eq!(payload[0], 0xab);
                let mut r = Vec::new();
                encode_response_header(&mut r, &control, Status::Ok);
                assert_eq!(r.len(), 14);
                assert_eq!(&r[0..8], &d[0..8]);
                assert_eq!(u16::from_be_bytes([r[8], r[9]]), SOCKPERF_PONG_REQUEST);
                assert_eq!(&r[10..14], &d[10..14]);
            }
            other => panic!("{other:?}"),
        }
        // Under-load mode: a message without the pong request flag gets no reply.
        d[8..10].copy_from_slice(&SOCKPERF_CLIENT.to_be_bytes());
        match parse(Framing::Sockperf, &d, false, only(1)) {
            Parsed::Request { control, .. } => assert!(!control.wants_reply()),
            other => panic!("{other:?}"),
        }
        // sockperf's smallest message is its header alone: a request with an empty payload.
        match parse(Framing::Sockperf, &d[..14], false, only(1)) {
            Parsed::Request { payload, .. } => assert!(payload.is_empty()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(Framing::Sockperf, &d[..13], false, only(1)),
            Parsed::Bad {
                status: Status::Truncated,
                control: None,
            }
        ));
    }

    #[test]
    fn status_codes_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_u8(s as u8), Some(s));
        }
        assert_eq!(Status::from_u8(99), None);
    }
}
