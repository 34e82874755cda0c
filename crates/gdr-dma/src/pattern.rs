//! The test surface of picoevb's rdma-malloc: a 1024x1024 array of u32 where word (x, y) holds
//! `(y << 16) | x`, and a destination pre-filled with the bitwise inverse so that any word the
//! copy misses is caught.

/// Width and height of the surface in words.
pub const SURFACE_DIM: usize = 1024;
/// Bytes in the surface (4 MiB).
pub const SURFACE_BYTES: usize = SURFACE_DIM * SURFACE_DIM * 4;

/// The word at index `i` of a surface `width` words wide.
pub fn surface_word(i: usize, width: usize) -> u32 {
    let (x, y) = (i % width, i / width);
    ((y as u32) << 16) | x as u32
}

/// The source surface of `words` words (`SURFACE_DIM` wide).
pub fn surface(words: usize) -> Vec<u32> {
    (0..words).map(|i| surface_word(i, SURFACE_DIM)).collect()
}

/// The poisoned destination: every word the inverse of the source's.
pub fn poison(words: usize) -> Vec<u32> {
    (0..words).map(|i| !surface_word(i, SURFACE_DIM)).collect()
}

/// The first mismatching words against the surface pattern: (index, expected, found), at most
/// `max` of them, and the total count.
pub fn check_surface(found: &[u32], max: usize) -> (Vec<(usize, u32, u32)>, usize) {
    let mut first = Vec::new();
    let mut count = 0;
    for (i, &w) in found.iter().enumerate() {
        let want = surface_word(i, SURFACE_DIM);
        if w != want {
            count += 1;
            if first.len() < max {
                first.push((i, want, w));
            }
        }
    }
    (first, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_picoevb_and_poison_never_does() {
        assert_eq!(SURFACE_BYTES, 4 << 20);
        assert_eq!(surface_word(0, SURFACE_DIM), 0);
        assert_eq!(surface_word(5, SURFACE_DIM), 5);
        assert_eq!(surface_word(3 * 1024 + 7, SURFACE_DIM), (3 << 16) | 7);
        let s = surface(4096);
        assert_eq!(check_surface(&s, 4).1, 0);
        let p = poison(4096);
        let (first, n) = check_surface(&p, 2);
        assert_eq!(n, 4096);
        assert_eq!(first[0], (0, 0, u32::MAX));
        let mut one_off = s.clone();
        one_off[1500] ^= 1;
        assert_eq!(
            check_surface(&one_off, 4).0,
            vec![(1500, s[1500], s[1500] ^ 1)]
        );
    }
}
