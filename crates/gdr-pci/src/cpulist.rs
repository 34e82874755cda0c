//! The kernel's list format for CPU and node numbers (`0-31,64-95`), as found in
//! `local_cpulist` and `/sys/devices/system/node/node*/cpulist`. A device's NUMA affinity is
//! derived from these when its `numa_node` is -1, and printed back in the same format.

/// A set of numbers as sorted, non-overlapping inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct IdList(Vec<(u32, u32)>);

impl IdList {
    /// Parses `0-3,8,10-11`; an empty string is the empty set. `None` on anything else
    /// (reversed ranges, stray characters).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let mut ranges = Vec::new();
        if text.is_empty() {
            return Some(Self(ranges));
        }
        for part in text.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
                None => {
                    let n = part.trim().parse().ok()?;
                    (n, n)
                }
            };
            if hi < lo {
                return None;
            }
            ranges.push((lo, hi));
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        Some(Self(merged))
    }

    pub(crate) fn intersects(&self, other: &Self) -> bool {
        self.0
            .iter()
            .any(|&(a, b)| other.0.iter().any(|&(c, d)| a <= d && c <= b))
    }
}

/// Formats sorted, distinct numbers the way the kernel does: `0-1,3`.
pub(crate) fn format_ids(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&ids[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", ids[i], ids[j]));
        }
        i = j + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn naive(text: &str) -> Vec<u32> {
        let mut v = Vec::new();
        for p in text.split(',').filter(|p| !p.is_empty()) {
            match p.split_once('-') {
                Some((a, b)) => v.extend(a.parse::<u32>().unwrap()..=b.parse().unwrap()),
                None => v.push(p.parse().unwrap()),
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn parses_and_rejects() {
        assert_eq!(IdList::parse("0-31,64-95").unwrap().0, [(0, 31), (64, 95)]);
        assert_eq!(IdList::parse("3,1-2,0").unwrap().0, [(0, 3)]);
        assert_eq!(IdList::parse("\n").unwrap().0, []);
        for bad in ["5-2", "a", "1,,2", "-3", "1-", "0x3"] {
            assert!(IdList::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn intersection_matches_a_naive_set_on_random_lists() {
        let mut rng = rand::thread_rng();
        let random_list = |rng: &mut rand::rngs::ThreadRng| -> String {
            let n = rng.gen_range(1..5);
            (0..n)
                .map(|_| {
                    let a = rng.gen_range(0..64u32);
                    if rng.gen_bool(0.5) {
                        format!("{a}-{}", a + rng.gen_range(0..8))
                    } else {
                        a.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        for _ in 0..500 {
            let (a, b) = (random_list(&mut rng), random_list(&mut rng));
            let (na, nb) = (naive(&a), naive(&b));
            let want = na.iter().any(|x| nb.contains(x));
            let (pa, pb) = (IdList::parse(&a).unwrap(), IdList::parse(&b).unwrap());
            assert_eq!(pa.intersects(&pb), want, "{a} / {b}");
            assert_eq!(naive(&format_ids(&na)), na, "{a}");
        }
    }

    #[test]
    fn formats_like_the_kernel() {
        assert_eq!(format_ids(&[0]), "0");
        assert_eq!(format_ids(&[0, 1]), "0-1");
        assert_eq!(format_ids(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_ids(&[]), "");
    }
}
