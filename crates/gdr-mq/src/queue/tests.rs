use super::*;
use crate::memory::PlainMemory;
use rand::{Rng, RngCore};

struct Alive;
impl WorkerLink for Alive {
    fn poll(&self) -> Result<bool, String> {
        Ok(true)
    }
}

/// A queue pair over plain memory with no worker: the test plays the worker.
fn bare(slots: u32, max_msg: u32, first_index: u32) -> QueuePair {
    bare_with(Geometry::new(slots, max_msg).unwrap(), first_index)
}

fn bare_with(geo: Geometry, first_index: u32) -> QueuePair {
    let mem = |n| Region::whole(Arc::new(PlainMemory::new(n).unwrap()));
    let (rx, tx) = (mem(geo.rx_bytes()), mem(geo.tx_bytes()));
    init_rings(&geo, &rx, &tx, first_index);
    QueuePair::new(QueueParts {
        id: 0,
        geo,
        rx,
        tx,
        status: mem(layout::STATUS_SIZE),
        first_index,
        wait_timeout: Duration::from_millis(50),
        link: Arc::new(Alive),
    })
}

/// Writes the response to message `count` as the worker would, leaving word `skip`
/// (if any) as it was.
fn answer(q: &QueuePair, count: u64, payload: &[u8], skip: Option<usize>) {
    let idx = q.index(count);
    let seq = layout::seq_of(idx);
    let off = q.p.geo.tx_slot_offset(idx);
    let mut data = vec![payload.len() as u32, count as u32, (count >> 32) as u32, 0];
    let mut padded = payload.to_vec();
    padded.resize(payload.len().next_multiple_of(8), 0);
    data.extend(
        padded
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes(c.try_into().unwrap())),
    );
    for (k, d) in data.into_iter().enumerate() {
        if Some(k) != skip {
            q.p.tx.store_u64(off + 8 * k, layout::tx_word(d, seq));
        }
    }
}

#[test]
fn rx_words_pack_every_word_with_its_seq_and_restamp_whole_slots() {
    let mut rng = rand::thread_rng();
    let mut msg = vec![0u8; 13];
    rng.fill_bytes(&mut msg);
    let mut out = Vec::new();
    pack_words(&mut out, 77, 0x1122_3344_5566_7788, &msg, 8);
    // 4 header words + 4 payload words (13 bytes, zero-padded): 8, an even count.
    assert_eq!(out.len(), 8 * 8);
    let w: Vec<u64> = out
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert!(w.iter().all(|&x| (x >> 32) as u32 == 77), "{w:x?}");
    assert_eq!(w[0] as u32, 13);
    assert_eq!(w[1] as u32, 0x5566_7788);
    assert_eq!(w[2] as u32, 0x1122_3344);
    assert_eq!(w[3] as u32, 0);
    let mut payload: Vec<u8> = w[4..]
        .iter()
        .flat_map(|&x| (x as u32).to_ne_bytes())
        .collect();
    assert_eq!(payload.split_off(13), [0, 0, 0]);
    assert_eq!(payload, msg);
    // A restamp pads to the whole slot with (0, seq).
    pack_words(&mut out, 78, 0, &msg, 24);
    assert_eq!(out.len(), 24 * 8);
    let last = u64::from_ne_bytes(out[23 * 8..].try_into().unwrap());
    assert_eq!(last, layout::tx_word(0, 78));
    // The staged slot: as packed, with a whole-slot write exactly at the restamp indices.
    let g = Geometry::new(4, 64).unwrap().with_rx_words();
    assert_eq!(g.rx_words_of(13), 8);
    assert_eq!(g.stride as usize / 8, 20);
}

#[test]
fn rx_words_pack_every_length_and_padding() {
    let mut rng = rand::thread_rng();
    let mut out = vec![0xa5u8; 3]; // stale contents are replaced
    for len in 0..=70usize {
        let mut msg = vec![0u8; len];
        rng.fill_bytes(&mut msg);
        let seq = rng.next_u32();
        let tag = rng.next_u64();
        let need = layout::TX_HEADER_WORDS + 2 * len.div_ceil(8);
        for words in [0, need, need + 6] {
            pack_words(&mut out, seq, tag, &msg, words);
            let w: Vec<u64> = out
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            let even = (layout::TX_HEADER_WORDS + len.div_ceil(4)).next_multiple_of(2);
            assert_eq!(w.len(), words.max(even), "len {len} words {words}");
            assert!(w.iter().all(|&x| (x >> 32) as u32 == seq), "len {len}");
            assert_eq!(w[0] as u32 as usize, len);
            assert_eq!((w[2] << 32) | (w[1] & 0xffff_ffff), tag);
            assert_eq!(w[3] as u32, 0);
            let data: Vec<u8> = w[4..]
                .iter()
                .flat_map(|&x| (x as u32).to_ne_bytes())
                .collect();
            assert_eq!(&data[..len], &msg[..], "len {len}");
            assert!(data[len..].iter().all(|&b| b == 0), "len {len}: padding");
        }
    }
}

#[test]
fn a_response_is_ready_only_when_every_word_is_current() {
    let mut rng = rand::thread_rng();
    let mut q = bare(4, 64, rng.gen());
    let mut msg = vec![0u8; 61];
    rng.fill_bytes(&mut msg);
    q.send(&msg).unwrap();
    let mut out = vec![0xa5u8; 64];
    let idx = q.index(0);
    let off = q.p.geo.tx_slot_offset(idx);
    let stale = layout::tx_word(0, layout::seq_of(idx.wrapping_sub(4)));
    for skip in [0, 1, 2, 3, 4, 19] {
        for k in 0..20 {
            q.p.tx.store_u64(off + 8 * k, stale);
        }
        answer(&q, 0, &msg, Some(skip));
        assert_eq!(q.try_recv(&mut out).unwrap(), None, "word {skip} stale");
    }
    answer(&q, 0, &msg, None);
    assert_eq!(q.try_recv(&mut out).unwrap(), Some(61));
    assert_eq!(&out[..61], &msg[..]);
    assert_eq!(out[61..], [0xa5; 3]);
    assert_eq!(q.try_recv(&mut out).unwrap(), None);
}

#[test]
fn a_response_arriving_in_any_word_order_is_taken_whole() {
    let mut rng = rand::thread_rng();
    for len in [0usize, 1, 7, 8, 33, 200, 256] {
        let mut q = bare(8, 256, rng.gen());
        let mut msg = vec![0u8; len];
        rng.fill_bytes(&mut msg);
        q.send(&msg).unwrap();
        // The full response as words, stored one at a time in a random order.
        let idx = q.index(0);
        let off = q.p.geo.tx_slot_offset(idx);
        answer(&q, 0, &msg, None);
        let n = q.p.geo.tx_words(len);
        let words: Vec<u64> = (0..n).map(|k| q.p.tx.load_u64(off + 8 * k)).collect();
        let stale = layout::tx_word(0xdead_beef, layout::seq_of(idx.wrapping_sub(8)));
        for k in 0..n {
            q.p.tx.store_u64(off + 8 * k, stale);
        }
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        let mut out = vec![0x5au8; 256];
        for (i, &k) in order.iter().enumerate() {
            assert_eq!(q.try_recv(&mut out).unwrap(), None, "{i} of {n} words");
            q.p.tx.store_u64(off + 8 * k, words[k]);
        }
        assert_eq!(q.try_recv(&mut out).unwrap(), Some(len));
        assert_eq!(&out[..len], &msg[..]);
        assert!(out[len..].iter().all(|&b| b == 0x5a));
    }
}

#[test]
fn a_wrong_tag_is_a_protocol_error() {
    let mut q = bare(4, 64, 7);
    q.send(b"x").unwrap();
    answer(&q, 0, b"y", None);
    let off = q.p.geo.tx_slot_offset(7);
    q.p.tx
        .store_u64(off + 8, layout::tx_word(5, layout::seq_of(7)));
    assert!(matches!(
        q.try_recv(&mut [0u8; 8]),
        Err(MqError::Protocol { .. })
    ));
}

#[test]
fn slots_are_restamped_once_per_2_pow_31_messages() {
    let slots = 4u32;
    let first = (1u32 << 31) - 2;
    // Slots a little larger than the longest message sent, so its last word is the
    // restamp's alone.
    let mut q = bare(slots, 72, first);
    let long = [0x11u8; 64];
    let mut out = [0u8; 64];
    // Messages first .. first + 8: the ones at 2^31 .. 2^31 + 3 restamp their slot.
    for count in 0..8u64 {
        let msg: &[u8] = if count < 2 { &long } else { b"ab" };
        q.send(msg).unwrap();
        answer(&q, count, msg, None);
        assert_eq!(q.try_recv(&mut out).unwrap(), Some(msg.len()));
        let idx = q.index(count);
        let off = q.p.geo.tx_slot_offset(idx);
        let last = q.p.tx.load_u64(off + q.p.geo.tx_stride as usize - 8);
        let stamped = (last >> 32) as u32 == layout::seq_of(idx);
        assert_eq!(stamped, idx & 0x7fff_ffff < slots, "message {idx:#x}");
    }
}

/// Slots their seq publishes: staging writes a request's tag and payload but leaves the
/// slot's (seq, len) word as it was (no reader may take the slot yet); the doorbell's ring
/// stores that word, then the doorbell. One and two requests a ring, across ring laps.
#[test]
fn seq_publishes_stores_a_slots_seq_word_only_when_rung() {
    let slots = 4u32;
    let geo = Geometry::new(slots, 64).unwrap().with_seq_publishes();
    assert!(geo.seq_publishes);
    assert!(
        !Geometry::new(slots, 64)
            .unwrap()
            .with_rx_words()
            .with_seq_publishes()
            .seq_publishes
    );
    let mut q = bare_with(geo, u32::MAX - 5);
    let mut rng = rand::thread_rng();
    let mut out = [0u8; 64];
    let mut count = 0u64;
    for round in 0..8 {
        let batch = 1 + round % 2;
        let mut staged = Vec::new();
        for _ in 0..batch {
            let mut msg = vec![0u8; rng.gen_range(0..=64)];
            rng.fill_bytes(&mut msg);
            let idx = q.index(count);
            let off = RX_CONTROL_SIZE + geo.slot_offset(idx);
            let before = q.p.rx.load_u64(off);
            assert_ne!(before as u32, layout::seq_of(idx));
            q.stage(&msg);
            assert_eq!(
                q.p.rx.load_u64(off),
                before,
                "seq word stored before the ring"
            );
            assert_eq!(q.p.rx.load_u64(off + SEQ_LEN_BYTES), count, "tag");
            let mut payload = vec![0u8; msg.len()];
            q.p.rx.read(off + SLOT_HEADER_SIZE, &mut payload);
            assert_eq!(payload, msg);
            staged.push((count, off, msg));
            count += 1;
        }
        let bell = q.p.rx.load_u32(DB_PROD);
        assert_eq!(
            bell,
            q.index(count - batch as u64),
            "doorbell moved before the ring"
        );
        q.ring();
        assert_eq!(q.p.rx.load_u32(DB_PROD), q.index(count));
        for (c, off, msg) in staged {
            let idx = q.index(c);
            assert_eq!(
                q.p.rx.load_u64(off),
                seq_len_word(layout::seq_of(idx), msg.len() as u32)
            );
            answer(&q, c, &msg, None);
            assert_eq!(q.try_recv(&mut out).unwrap(), Some(msg.len()));
            assert_eq!(out[..msg.len()], msg[..]);
        }
    }
}
