//! Small, self-contained SVG line plots with logarithmic axes (`--plot FILE.svg`).
//!
//! One panel per direction, side by side on a shared y scale. The x axis is the copy size,
//! ticked at powers of two in binary units (B, KiB, MiB, GiB); the y axis is ticked with
//! plain decimal numbers. Every series of a panel gets its own colour (the same series
//! keeps its colour from panel to panel); a baseline series is drawn grey and dashed and
//! says so in the legend. Each panel carries its own legend below the plot area, so the
//! legend never covers data and every entry names its direction.

use std::fmt::Write;

/// One line of a panel.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// The reference path (cuMemcpy, copy engine): drawn grey and dashed.
    pub baseline: bool,
}

/// One plot area, e.g. one copy direction.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

/// Colours for the non-baseline series (Tableau 10 without its grey).
const COLORS: [&str; 9] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf",
];
const BASELINE_COLOR: &str = "#555555";
const BASELINE_DASH: &str = "7 4";

const PANEL_W: f64 = 470.0;
const PLOT_H: f64 = 340.0;
const ML: f64 = 70.0; // left margin of a panel (y tick labels)
const MR: f64 = 36.0; // room for the last x tick label
const MT: f64 = 64.0; // figure title + panel title
const MB: f64 = 52.0; // x tick labels + x axis title
const LEGEND_ROW: f64 = 18.0;
/// Rough width of a 12 px sans-serif character, to lay out legend columns.
const CHAR_W: f64 = 6.8;

/// Legend label of a series in a panel: names the direction, and the baseline as such.
fn legend_label(panel: &Panel, se: &Series) -> String {
    let b = if se.baseline { " (baseline)" } else { "" };
    format!("{}{b}, {}", se.name, panel.title)
}

/// Legend columns that fit the labels across one panel, and the column width.
fn legend_cols(panels: &[Panel]) -> (usize, f64) {
    let longest = panels
        .iter()
        .flat_map(|p| {
            p.series
                .iter()
                .map(move |s| legend_label(p, s).chars().count())
        })
        .max()
        .unwrap_or(0);
    let col_w = 31.0 + longest as f64 * CHAR_W + 16.0;
    let cols = ((PANEL_W - 2.0 * LEGEND_PAD) / col_w).floor().max(1.0);
    (cols as usize, (PANEL_W - 2.0 * LEGEND_PAD) / cols)
}
const LEGEND_PAD: f64 = 16.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `2^e` bytes in binary units: "1 B", "64 KiB", "1 MiB", "4 GiB".
pub fn pow2_label(e: i32) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let e = e.max(0);
    let u = ((e / 10) as usize).min(UNITS.len() - 1);
    format!("{} {}", 1u64 << (e - 10 * u as i32), UNITS[u])
}

/// A y tick value without exponent notation: 0.01, 0.5, 2, 100, 20000.
fn num_label(v: f64) -> String {
    if v >= 1.0 {
        format!("{}", v.round() as i64)
    } else {
        let digits = (-v.log10().floor()) as usize;
        format!("{v:.digits$}")
    }
}

/// Exponents of the labelled x ticks: powers of two from `lo` to `hi`, every `step`-th one
/// (step 1, 2, 4, 5, 10 or 20, aligned to multiples of itself) so that at most `max_ticks`
/// labels fit.
fn x_ticks(lo: i32, hi: i32, max_ticks: usize) -> Vec<i32> {
    for step in [1, 2, 4, 5, 10, 20] {
        let t: Vec<i32> = (lo..=hi).filter(|e| e.rem_euclid(step) == 0).collect();
        if t.len() <= max_ticks && t.len() >= 2 {
            return t;
        }
    }
    vec![lo, hi]
}

/// y tick values within 10^lo..10^hi: decades, with 2 and 5 between when the range is short.
fn y_ticks(lo: i32, hi: i32) -> Vec<f64> {
    let mult: &[f64] = match hi - lo {
        0..=1 => &[1.0, 2.0, 5.0],
        2..=3 => &[1.0, 3.0],
        _ => &[1.0],
    };
    let mut v = Vec::new();
    for e in lo..=hi {
        for &m in mult {
            let x = m * 10f64.powi(e);
            if x <= 10f64.powi(hi) * 1.0001 {
                v.push(x);
            }
        }
    }
    v
}

fn good(p: &(f64, f64)) -> bool {
    p.0 > 0.0 && p.1 > 0.0 && p.0.is_finite() && p.1.is_finite()
}

/// Renders the figure: x = copy size in bytes, y = `y_label` (with its unit), both log.
pub fn render_svg(title: &str, x_label: &str, y_label: &str, panels: &[Panel]) -> String {
    let pts = panels
        .iter()
        .flat_map(|p| p.series.iter())
        .flat_map(|s| s.points.iter())
        .filter(|p| good(p));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        y0 = y0.min(y.log10());
        y1 = y1.max(y.log10());
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 10.0, 0.0, 1.0);
    }
    let (xe0, xe1) = (
        x0.floor() as i32,
        (x1.ceil() as i32).max(x0.floor() as i32 + 1),
    );
    let (ye0, ye1) = (
        y0.floor() as i32,
        (y1.ceil() as i32).max(y0.floor() as i32 + 1),
    );
    let plot_w = PANEL_W - ML - MR;
    let (cols, col_w) = legend_cols(panels);
    let rows = panels
        .iter()
        .map(|p| p.series.len().div_ceil(cols))
        .max()
        .unwrap_or(0);
    let legend_h = 12.0 + LEGEND_ROW * rows as f64;
    let w = PANEL_W * panels.len().max(1) as f64;
    let h = MT + PLOT_H + MB + legend_h;
    let (top, bottom) = (MT, MT + PLOT_H);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="16" font-weight="bold" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let xticks = x_ticks(xe0, xe1, (plot_w / 50.0) as usize);
    let yticks = y_ticks(ye0, ye1);
    for (pi, panel) in panels.iter().enumerate() {
        let left = pi as f64 * PANEL_W + ML;
        let right = left + plot_w;
        let px = |x: f64| left + (x.log2() - xe0 as f64) / (xe1 - xe0) as f64 * plot_w;
        let py = |y: f64| bottom - (y.log10() - ye0 as f64) / (ye1 - ye0) as f64 * PLOT_H;
        let _ = writeln!(s, r#"<g class="panel">"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="14" font-weight="bold" text-anchor="middle">{}</text>"#,
            (left + right) / 2.0,
            top - 12.0,
            esc(&panel.title)
        );
        // Light grid line at every power of two, darker and labelled at the ticks.
        for e in xe0..=xe1 {
            let x = px(2f64.powi(e));
            let labelled = xticks.contains(&e);
            let c = if labelled { "#cccccc" } else { "#eeeeee" };
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom}" stroke="{c}"/>"#
            );
            if labelled {
                let _ = writeln!(
                    s,
                    r#"<text class="xtick" x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                    bottom + 17.0,
                    pow2_label(e)
                );
            }
        }
        for &v in &yticks {
            let y = py(v);
            let _ = writeln!(
                s,
                r#"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="{}"/><text class="ytick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                if (v.log10().fract()).abs() < 1e-9 {
                    "#cccccc"
                } else {
                    "#eeeeee"
                },
                left - 6.0,
                y + 4.0,
                num_label(v)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{PLOT_H}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (left + right) / 2.0,
            bottom + 38.0,
            esc(x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            left - 52.0,
            (top + bottom) / 2.0,
            esc(y_label)
        );
        let mut ci = 0;
        let style: Vec<(&str, String)> = panel
            .series
            .iter()
            .map(|se| {
                if se.baseline {
                    (
                        BASELINE_COLOR,
                        format!(r#" stroke-dasharray="{BASELINE_DASH}""#),
                    )
                } else {
                    ci += 1;
                    (COLORS[(ci - 1) % COLORS.len()], String::new())
                }
            })
            .collect();
        // Baselines last, so that a series running along one does not hide its dashes.
        let mut order: Vec<usize> = (0..panel.series.len()).collect();
        order.sort_by_key(|&i| panel.series[i].baseline);
        for i in order {
            let (c, dash) = (&style[i].0, &style[i].1);
            let p: Vec<(f64, f64)> = panel.series[i]
                .points
                .iter()
                .filter(|p| good(p))
                .map(|&(x, y)| (px(x), py(y)))
                .collect();
            if p.is_empty() {
                continue;
            }
            let d: Vec<String> = p.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                s,
                r#"<polyline class="series" fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"#,
                d.join(" ")
            );
            for (x, y) in &p {
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{c}"/>"#);
            }
        }
        for (i, se) in panel.series.iter().enumerate() {
            let (c, dash) = (&style[i].0, &style[i].1);
            let lx = pi as f64 * PANEL_W + LEGEND_PAD + (i % cols) as f64 * col_w;
            let ly = bottom + MB + 8.0 + LEGEND_ROW * (i / cols) as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2.5"{dash}/><text class="legend" x="{}" y="{}">{}</text>"#,
                lx + 26.0,
                lx + 31.0,
                ly + 4.0,
                esc(&legend_label(panel, se))
            );
        }
        let _ = writeln!(s, "</g>");
    }
    s.push_str("</svg>\n");
    s
}

/// Writes [`render_svg`] to `path`.
pub fn write_svg(
    path: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    panels: &[Panel],
) -> std::io::Result<()> {
    std::fs::write(path, render_svg(title, x_label, y_label, panels))
}

/// x axis title shared by the copy plots.
pub const SIZE_LABEL: &str = "copy size (bytes, binary units: 1 KiB = 1024 B)";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A copybw-like figure from made-up numbers: 4 mapping thread counts, copy engine
    /// (baseline) and auto, for both directions, 64 KiB..256 MiB.
    pub(crate) fn sample_bw() -> String {
        let sizes: Vec<f64> = (0..7).map(|i| 65536.0 * 4f64.powi(i)).collect();
        let mut panels = Vec::new();
        for (dir, scale) in [("cpu->gpu", 1.0), ("gpu->cpu", 0.05)] {
            let mut series = Vec::new();
            for t in [1.0f64, 2.0, 4.0, 8.0] {
                series.push(Series {
                    name: format!("map x{t}"),
                    points: sizes
                        .iter()
                        .map(|&s| (s, scale * 9.0 * t.sqrt() * (s / (s + 2e5))))
                        .collect(),
                    baseline: false,
                });
            }
            series.push(Series {
                name: "copy engine".into(),
                points: sizes.iter().map(|&s| (s, 24.0 * s / (s + 1e6))).collect(),
                baseline: true,
            });
            series.push(Series {
                name: "auto".into(),
                points: sizes
                    .iter()
                    .map(|&s| {
                        (
                            s,
                            (24.0 * s / (s + 1e6)).max(scale * 25.0 * (s / (s + 2e5))),
                        )
                    })
                    .collect(),
                baseline: false,
            });
            panels.push(Panel {
                title: dir.into(),
                series,
            });
        }
        render_svg(
            "gdr copybw: bandwidth",
            SIZE_LABEL,
            "bandwidth (GB/s)",
            &panels,
        )
    }

    /// A copylat-like figure, 1 B..16 MiB.
    pub(crate) fn sample_lat() -> String {
        let sizes: Vec<f64> = (0..=24).map(|e| 2f64.powi(e)).collect();
        let panels: Vec<Panel> = ["cpu->gpu", "gpu->cpu"]
            .iter()
            .map(|dir| Panel {
                title: (*dir).into(),
                series: vec![
                    Series {
                        name: "mapping".into(),
                        points: sizes.iter().map(|&s| (s, 0.1 + s / 8e3)).collect(),
                        baseline: false,
                    },
                    Series {
                        name: "cuMemcpy".into(),
                        points: sizes.iter().map(|&s| (s, 8.0 + s / 2.2e4)).collect(),
                        baseline: true,
                    },
                    Series {
                        name: "auto".into(),
                        points: sizes
                            .iter()
                            .map(|&s| (s, (0.12 + s / 8e3).min(8.5 + s / 2.2e4)))
                            .collect(),
                        baseline: false,
                    },
                ],
            })
            .collect();
        render_svg(
            "gdr copylat: median latency",
            SIZE_LABEL,
            "median latency (µs)",
            &panels,
        )
    }

    fn texts<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        let open = format!(r#"<text class="{class}""#);
        svg.match_indices(&open)
            .map(|(i, _)| {
                let rest = &svg[i..];
                let a = rest.find('>').unwrap() + 1;
                &rest[a..a + rest[a..].find("</text>").unwrap()]
            })
            .collect()
    }

    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let k = format!(r#" {name}=""#);
        let i = tag.find(&k)? + k.len();
        Some(&tag[i..i + tag[i..].find('"')?])
    }

    /// The `<polyline>` tags of each panel.
    fn lines(svg: &str) -> Vec<Vec<&str>> {
        svg.split(r#"<g class="panel">"#)
            .skip(1)
            .map(|p| {
                p.lines()
                    .filter(|l| l.starts_with("<polyline"))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn pow2_labels_use_binary_units() {
        assert_eq!(pow2_label(0), "1 B");
        assert_eq!(pow2_label(9), "512 B");
        assert_eq!(pow2_label(10), "1 KiB");
        assert_eq!(pow2_label(16), "64 KiB");
        assert_eq!(pow2_label(20), "1 MiB");
        assert_eq!(pow2_label(28), "256 MiB");
        assert_eq!(pow2_label(30), "1 GiB");
        assert_eq!(num_label(0.01), "0.01");
        assert_eq!(num_label(0.5), "0.5");
        assert_eq!(num_label(20000.0), "20000");
    }

    #[test]
    fn size_axis_reads_in_binary_units() {
        for svg in [sample_bw(), sample_lat()] {
            let x = texts(&svg, "xtick");
            assert!(x.len() >= 4, "{x:?}");
            assert!(x.contains(&"64 KiB") && x.contains(&"1 MiB"), "{x:?}");
            assert!(x.iter().all(|l| l.ends_with(" B")
                || l.ends_with(" KiB")
                || l.ends_with(" MiB")
                || l.ends_with(" GiB")));
            let y = texts(&svg, "ytick");
            assert!(!y.is_empty());
            assert!(!svg.contains(">1e"), "no exponent labels");
            assert!(x.iter().chain(&y).all(|l| !l.contains('e')), "{x:?} {y:?}");
            assert!(svg.contains("copy size (bytes"));
        }
        assert!(sample_bw().contains("bandwidth (GB/s)"));
        assert!(sample_lat().contains("median latency (µs)"));
    }

    #[test]
    fn every_series_has_its_own_colour_and_the_baseline_is_dashed() {
        let svg = sample_bw();
        let panels = lines(&svg);
        assert_eq!(panels.len(), 2, "one panel per direction");
        for p in &panels {
            assert_eq!(p.len(), 6);
            let colours: HashSet<&str> = p.iter().map(|l| attr(l, "stroke").unwrap()).collect();
            assert_eq!(colours.len(), 6, "6 series, 6 colours");
            let dashed: Vec<&&str> = p
                .iter()
                .filter(|l| attr(l, "stroke-dasharray").is_some())
                .collect();
            assert_eq!(dashed.len(), 1, "only the baseline is dashed");
            assert_eq!(attr(dashed[0], "stroke"), Some(BASELINE_COLOR));
        }
        let legend = texts(&svg, "legend");
        assert!(
            legend.contains(&"copy engine (baseline), cpu-&gt;gpu"),
            "{legend:?}"
        );
        assert!(legend.contains(&"copy engine (baseline), gpu-&gt;cpu"));
        assert_eq!(legend.iter().filter(|l| l.contains("baseline")).count(), 2);
        let lat = sample_lat();
        for p in lines(&lat) {
            let colours: HashSet<&str> = p.iter().map(|l| attr(l, "stroke").unwrap()).collect();
            assert_eq!(colours.len(), 3);
            assert_eq!(
                p.iter()
                    .filter(|l| attr(l, "stroke-dasharray").is_some())
                    .count(),
                1
            );
        }
        assert!(texts(&lat, "legend").contains(&"cuMemcpy (baseline), cpu-&gt;gpu"));
    }

    #[test]
    fn legend_entries_are_distinct_per_direction() {
        let svg = sample_bw();
        let legend = texts(&svg, "legend");
        assert_eq!(legend.len(), 12);
        let set: HashSet<&&str> = legend.iter().collect();
        assert_eq!(set.len(), 12, "{legend:?}");
        assert!(legend.contains(&"map x1, cpu-&gt;gpu") && legend.contains(&"map x1, gpu-&gt;cpu"));
        // Panel titles name the direction too.
        assert!(svg.contains(">cpu-&gt;gpu</text>") && svg.contains(">gpu-&gt;cpu</text>"));
    }

    #[test]
    fn legend_sits_below_the_data() {
        let svg = sample_bw();
        for l in svg.lines().filter(|l| l.contains(r#"class="legend""#)) {
            let y: f64 = attr(l, "y1").unwrap().parse().unwrap();
            assert!(y > MT + PLOT_H + 30.0, "{l}");
        }
        for l in svg.lines().filter(|l| l.starts_with("<circle")) {
            let y: f64 = attr(l, "cy").unwrap().parse().unwrap();
            assert!((MT - 0.1..=MT + PLOT_H + 0.1).contains(&y), "{l}");
        }
    }

    #[test]
    fn writes_the_file_and_survives_empty_input() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.svg");
        let panels = vec![Panel {
            title: "a<b".into(),
            series: vec![Series {
                name: "x".into(),
                points: vec![(0.0, 1.0), (f64::NAN, 2.0)],
                baseline: false,
            }],
        }];
        write_svg(f.to_str().unwrap(), "t", SIZE_LABEL, "us", &panels).unwrap();
        let svg = std::fs::read_to_string(&f).unwrap();
        assert!(svg.contains("a&lt;b") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 0);
        if let Ok(out) = std::env::var("GDR_PLOT_SAMPLES") {
            std::fs::write(format!("{out}/bw.svg"), sample_bw()).unwrap();
            std::fs::write(format!("{out}/lat.svg"), sample_lat()).unwrap();
        }
        dir.close().unwrap();
    }
}
