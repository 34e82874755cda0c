//! A small SVG line plot with logarithmic axes (`--plot FILE.svg`).

use std::fmt::Write;

/// One line of the plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// Writes an SVG with log10 axes: x = size in bytes, y = `y_label`.
pub fn write_svg(path: &str, title: &str, y_label: &str, series: &[Series]) -> std::io::Result<()> {
    let (w, h, ml, mr, mt, mb) = (820.0, 520.0, 80.0, 220.0, 40.0, 60.0);
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x.log10());
        x1 = x1.max(x.log10());
        y0 = y0.min(y.log10());
        y1 = y1.max(y.log10());
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let (x0, x1, y0, y1) = (
        x0.floor(),
        x1.ceil().max(x0.floor() + 1.0),
        y0.floor(),
        y1.ceil().max(y0.floor() + 1.0),
    );
    let px = |x: f64| ml + (x.log10() - x0) / (x1 - x0) * (w - ml - mr);
    let py = |y: f64| h - mb - (y.log10() - y0) / (y1 - y0) * (h - mt - mb);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="15">{title}</text>"#,
        ml
    );
    for e in x0 as i32..=x1 as i32 {
        let x = px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{mt}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">1e{e}</text>"##,
            h - mb,
            h - mb + 18.0
        );
    }
    for e in y0 as i32..=y1 as i32 {
        let y = py(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">1e{e}</text>"##,
            w - mr,
            ml - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">size (bytes)</text>"#,
        (ml + w - mr) / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(20,{}) rotate(-90)" text-anchor="middle">{y_label}</text>"#,
        (mt + h - mb) / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let d: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        if !d.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                d.join(" ")
            );
        }
        let ly = mt + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            w - mr + 10.0,
            w - mr + 35.0,
            w - mr + 40.0,
            ly + 4.0,
            se.name
        );
    }
    s.push_str("</svg>\n");
    std::fs::write(path, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_polyline_per_series() {
        let dir = std::env::temp_dir().join(format!("gdr-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.svg");
        let series = vec![
            Series {
                name: "a".into(),
                points: vec![(1.0, 0.1), (1024.0, 1.0)],
            },
            Series {
                name: "b".into(),
                points: vec![(1.0, 5.0), (1024.0, 6.0)],
            },
        ];
        write_svg(f.to_str().unwrap(), "t", "us", &series).unwrap();
        let svg = std::fs::read_to_string(&f).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">a</text>") && svg.ends_with("</svg>\n"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
