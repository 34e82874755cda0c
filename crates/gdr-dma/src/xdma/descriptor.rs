//! XDMA descriptors: 32 bytes, little-endian, fetched by the engine from host memory.
//!
//! Descriptors of one submission lie back to back in one buffer. Each says how many descriptors
//! after its successor are also back to back ("next adjacent"), so the engine can fetch them in
//! one burst; such a run never crosses a 4 KiB boundary and never claims more than there are.

/// Magic value in the top 16 bits of every descriptor's control word.
pub const MAGIC: u32 = 0xad4b;
pub const CTRL_STOP: u32 = 1 << 0;
pub const CTRL_COMPLETED: u32 = 1 << 1;
pub const CTRL_EOP: u32 = 1 << 4;
/// Largest value of the next-adjacent field (6 bits).
pub const MAX_ADJACENT: u32 = 0x3f;
/// Largest descriptor length (28 bits).
pub const MAX_LEN: u64 = (1 << 28) - 1;
pub const SIZE: u64 = 32;

/// A descriptor before encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub control: u32,
    pub len: u32,
    pub src: u64,
    pub dst: u64,
    pub next: u64,
}

impl Descriptor {
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&self.control.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.src.to_le_bytes());
        b[16..24].copy_from_slice(&self.dst.to_le_bytes());
        b[24..32].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// How many descriptors directly follow slot `index + 1` in the same 4 KiB page, for a list of
/// `count` descriptors at `base` (32-byte aligned): the next-adjacent value of descriptor
/// `index`. Also the SGDMA adjacent register's value for the first descriptor (index -1 there,
/// see [`first_adjacent`]).
pub fn adjacent_after(base: u64, index: usize, count: usize) -> u32 {
    let succ = index + 1;
    if succ >= count {
        return 0;
    }
    run_after(base, succ, count)
}

/// The SGDMA adjacent register: descriptors directly following the first one.
pub fn first_adjacent(base: u64, count: usize) -> u32 {
    run_after(base, 0, count)
}

/// Descriptors after slot `slot` that share its 4 KiB page, capped by the list and the field.
fn run_after(base: u64, slot: usize, count: usize) -> u32 {
    let addr = base + slot as u64 * SIZE;
    let left_in_page = ((4096 - (addr & 0xfff)) / SIZE - 1) as usize;
    let left_in_list = count - slot - 1;
    left_in_page.min(left_in_list).min(MAX_ADJACENT as usize) as u32
}

/// The descriptors of one submission at `base`: chained by `next`, the last one with STOP,
/// COMPLETED (interrupt/flag) and EOP.
pub fn build_chain(base: u64, parts: &[(u64, u64, u64)]) -> Vec<Descriptor> {
    let n = parts.len();
    parts
        .iter()
        .enumerate()
        .map(|(i, &(src, dst, len))| {
            let last = i + 1 == n;
            let mut control = (MAGIC << 16) | (adjacent_after(base, i, n) << 8);
            if last {
                control |= CTRL_STOP | CTRL_COMPLETED | CTRL_EOP;
            }
            Descriptor {
                control,
                len: len as u32,
                src,
                dst,
                next: if last {
                    0
                } else {
                    base + (i as u64 + 1) * SIZE
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_little_endian_fields_in_order() {
        let d = Descriptor {
            control: 0xad4b_0113,
            len: 0x1234,
            src: 0x1_0000_2000,
            dst: 0x40,
            next: 0xdead_0000,
        };
        let b = d.encode();
        assert_eq!(&b[0..4], &[0x13, 0x01, 0x4b, 0xad]);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 0x1234);
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 0x2000);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 1);
        assert_eq!(
            u64::from_le_bytes(b[24..32].try_into().unwrap()),
            0xdead_0000
        );
    }

    #[test]
    fn adjacency_stops_at_list_end_page_end_and_field_max() {
        // 3 descriptors at a page start: first is followed by 2, desc 0's successor by 1.
        assert_eq!(first_adjacent(0x1000, 3), 2);
        assert_eq!(adjacent_after(0x1000, 0, 3), 1);
        assert_eq!(adjacent_after(0x1000, 1, 3), 0);
        assert_eq!(adjacent_after(0x1000, 2, 3), 0);
        // 200 descriptors: capped at 63.
        assert_eq!(first_adjacent(0x1000, 200), 63);
        // Near the page end: slot 126 of a page has only slot 127 after it.
        assert_eq!(adjacent_after(0x1000, 125, 200), 1);
        assert_eq!(adjacent_after(0x1000, 126, 200), 0);
        // Slot 128 starts a new page.
        assert_eq!(adjacent_after(0x1000, 127, 200), 63);
        let chain = build_chain(0x1000, &[(1, 2, 3), (4, 5, 6)]);
        assert_eq!(chain[0].next, 0x1020);
        assert_eq!(chain[0].control, 0xad4b_0000);
        assert_eq!(chain[1].control, 0xad4b_0013);
        assert_eq!(chain[1].next, 0);
    }
}
