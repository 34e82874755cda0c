//! Fuzz targets of the datagram parsers of both framings, as property tests: any bytes, cut
//! or not, parse without a panic to exactly one outcome that is consistent with the bytes, and
//! what the encoders write parses back to what went in. Bounded (a fixed number of cases,
//! about a second) so that they run in every `cargo test`; `PROPTEST_CASES=100000` runs longer.

use gdr_serve::wire::{
    self, decode_response, encode_request, encode_response_header, Control, Framing, Parsed,
    Status, KIND_REQUEST, KIND_STATS, SOCKPERF_HEADER_LEN,
};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Bytes that are often almost a request: a real header with some bytes changed, or noise.
fn datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 0..2048),
        (
            any::<u16>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec((0usize..16, any::<u8>()), 0..3),
            0usize..400,
        )
            .prop_map(|(app, id, payload, flips, cut)| {
                let mut d = Vec::new();
                encode_request(&mut d, app, id, &payload);
                for (at, v) in flips {
                    d[at] = v;
                }
                d.truncate(cut.min(d.len()));
                d
            }),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gdr_framing_parses_any_bytes_consistently(d in datagram(), cut in any::<bool>(), app in any::<u16>()) {
        match wire::parse(Framing::Gdr, &d, cut, |a| a == app) {
            Parsed::Request { control, payload } => {
                prop_assert!(!cut);
                prop_assert!(d.len() >= wire::HEADER_LEN);
                prop_assert_eq!(&d[..2], &wire::MAGIC[..]);
                prop_assert_eq!(d[2], wire::VERSION);
                prop_assert_eq!(d[3], KIND_REQUEST);
                let id = u64::from_le_bytes(d[8..16].try_into().unwrap());
                prop_assert_eq!(control, Control::Gdr { app, id });
                prop_assert_eq!(payload, &d[wire::HEADER_LEN..]);
            }
            Parsed::Stats { id } => {
                prop_assert!(d.len() >= wire::HEADER_LEN && d[3] == KIND_STATS);
                prop_assert_eq!(id, u64::from_le_bytes(d[8..16].try_into().unwrap()));
            }
            Parsed::Bad { status, control } => {
                prop_assert!(status != Status::Ok);
                // An error goes back only to a requester whose header was read whole.
                if control.is_some() {
                    prop_assert!(d.len() >= wire::HEADER_LEN);
                }
                if d.is_empty() && !cut {
                    prop_assert_eq!(status, Status::Empty);
                }
            }
        }
    }

    #[test]
    fn sockperf_framing_parses_any_bytes_consistently(d in datagram(), cut in any::<bool>()) {
        match wire::parse(Framing::Sockperf, &d, cut, |_| false) {
            Parsed::Request { control, payload } => {
                prop_assert!(!cut && d.len() >= SOCKPERF_HEADER_LEN);
                prop_assert_eq!(payload, &d[SOCKPERF_HEADER_LEN..]);
                prop_assert_eq!(control.id(), u64::from_be_bytes(d[..8].try_into().unwrap()));
                let flags = u16::from_be_bytes([d[8], d[9]]);
                prop_assert_eq!(control.wants_reply(), flags & 2 != 0);
                // The header goes back as it came, less the client flag.
                let mut r = Vec::new();
                encode_response_header(&mut r, &control, Status::Ok);
                prop_assert_eq!(&r[..8], &d[..8]);
                prop_assert_eq!(u16::from_be_bytes([r[8], r[9]]), flags & !1);
                prop_assert_eq!(&r[10..14], &d[10..14]);
            }
            Parsed::Stats { .. } => prop_assert!(false, "sockperf has no stats query"),
            Parsed::Bad { status, .. } => {
                prop_assert!(cut || d.len() < SOCKPERF_HEADER_LEN, "{:?}", status);
            }
        }
    }

    #[test]
    fn requests_and_responses_round_trip(app in any::<u16>(), id in any::<u64>(),
                                         payload in proptest::collection::vec(any::<u8>(), 0..1500),
                                         status in 0usize..7) {
        let mut d = Vec::new();
        encode_request(&mut d, app, id, &payload);
        prop_assert_eq!(
            wire::parse(Framing::Gdr, &d, false, |_| true),
            Parsed::Request { control: Control::Gdr { app, id }, payload: &payload[..] }
        );
        let status = Status::ALL[status];
        let mut r = Vec::new();
        encode_response_header(&mut r, &Control::Gdr { app, id }, status);
        r.extend_from_slice(&payload);
        let back = decode_response(&r).expect("ours");
        prop_assert_eq!((back.status, back.app, back.id, back.payload), (status, app, id, &payload[..]));
    }

    #[test]
    fn responses_decode_from_any_bytes_without_panicking(d in datagram()) {
        if let Some(r) = decode_response(&d) {
            prop_assert!(d.len() >= wire::HEADER_LEN);
            prop_assert_eq!(r.payload, &d[wire::HEADER_LEN..]);
            prop_assert_eq!(r.status as u8, d[3]);
        }
    }
}
