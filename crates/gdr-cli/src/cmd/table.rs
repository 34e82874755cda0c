//! Column-aligned tables for people (JSON is for programs).

/// A table printed with right-aligned columns under a header.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let n = self.header.len();
        let mut w: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.len());
            }
        }
        let line = |cells: &[String]| {
            let s: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{:>width$}", c, width = w[i]))
                .collect();
            println!("{}", s.join("  ").trim_end());
        };
        line(&self.header);
        for r in &self.rows {
            line(r);
        }
    }
}

/// Human size: 1, 64, 4K, 1M, 256M.
pub fn size(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// Parses 4096, 4K, 4KiB, 16M, 1G.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?} (examples: 64, 4K, 16M, 1G)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("7"), Ok(7));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999999G").is_err());
        assert_eq!(size(4096), "4K");
        assert_eq!(size(256 << 20), "256M");
        assert_eq!(size(65537), "65537");
    }
}
