//! Text for people: the matrix in the style of `nvidia-smi topo -m`, the device list, and the
//! hop-by-hop explanation of one path.

use crate::device::{format_size, DeviceClass, PciDevice};
use crate::limits::MAX_MATRIX_DEVICES;
use crate::path::{HopKind, PeerPath};
use crate::topology::Topology;
use crate::verdict::{Severity, Verdict};
use std::fmt::Write;

/// What the path classes mean (our wording of nvidia-smi's legend).
pub const LEGEND: &str = "\
Legend:
  X    = the device itself
  SYS  = PCIe plus the link between CPU sockets (NUMA nodes), e.g. UPI or Infinity Fabric
  NODE = PCIe plus the fabric between host bridges inside one NUMA node
  PHB  = PCIe plus a host bridge (the CPU's root complex)
  PXB  = several PCIe bridges or switches, no host bridge
  PIX  = at most one PCIe bridge or switch
  NV#  = a bonded set of # NVLinks
Verdicts: good = full peer-to-peer speed; works-slower = works, below full speed;
          poor-or-unsupported = may crawl or fail. `gdr topo --explain A B` says why.";

fn pad(out: &mut String, s: &str, w: usize) {
    let _ = write!(out, "{s:<w$}");
}

/// The matrix over `devices`, with CPU affinity, NUMA affinity and GPU NUMA ID columns for GPUs
/// (as `nvidia-smi topo -m` has them), then the legend and a device list that maps labels to
/// names and addresses.
pub fn matrix(topo: &Topology, devices: &[&PciDevice]) -> String {
    let mut out = String::new();
    if devices.is_empty() {
        out.push_str("no devices to show\n");
        return out;
    }
    // Rows and columns for the first MAX_MATRIX_DEVICES only: the matrix grows with the
    // square of the devices; the device list below covers all of them.
    let all = devices;
    let devices = &all[..all.len().min(MAX_MATRIX_DEVICES)];
    let labels: Vec<&str> = devices.iter().map(|d| d.label.as_str()).collect();
    let w = labels.iter().map(|l| l.len()).max().unwrap_or(4).max(4) + 2;
    let cells: Vec<Vec<String>> = devices
        .iter()
        .map(|a| {
            devices
                .iter()
                .map(|b| match topo.path(a.bdf, b.bdf) {
                    Ok(p) => p.class.to_string(),
                    Err(_) => "?".into(),
                })
                .collect()
        })
        .collect();
    let any_gpu = devices.iter().any(|d| d.class == DeviceClass::Gpu);
    let cpu_w = devices
        .iter()
        .filter_map(|d| d.cpulist.as_ref().map(|c| c.len()))
        .max()
        .unwrap_or(0)
        .max("CPU Affinity".len())
        + 2;
    pad(&mut out, "", w);
    for l in &labels {
        pad(&mut out, l, w);
    }
    let numa_w = devices
        .iter()
        .map(|d| d.numa_affinity_text().len())
        .max()
        .unwrap_or(0)
        .max("NUMA Affinity".len())
        + 2;
    if any_gpu {
        pad(&mut out, "CPU Affinity", cpu_w);
        pad(&mut out, "NUMA Affinity", numa_w);
        out.push_str("GPU NUMA ID");
    }
    out = out.trim_end().to_string();
    out.push('\n');
    for (i, d) in devices.iter().enumerate() {
        let mut line = String::new();
        pad(&mut line, &d.label, w);
        for c in &cells[i] {
            pad(&mut line, c, w);
        }
        if d.class == DeviceClass::Gpu {
            pad(&mut line, d.cpulist.as_deref().unwrap_or("N/A"), cpu_w);
            pad(&mut line, &d.numa_affinity_text(), numa_w);
            line.push_str(&d.gpu_numa_id.map_or("N/A".into(), |n| n.to_string()));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if all.len() > devices.len() {
        let _ = writeln!(
            out,
            "(matrix shown for the first {MAX_MATRIX_DEVICES} of {} devices; `gdr topo --explain \
             A B` gives any pair)",
            all.len()
        );
    }
    out.push('\n');
    out.push_str(LEGEND);
    out.push_str("\n\n");
    out.push_str(&device_list(all));
    out
}

/// One line per device: label, name, address, class, link, NUMA, BAR1 for GPUs, driver.
pub fn device_list(devices: &[&PciDevice]) -> String {
    let mut out = String::from("Devices:\n");
    let name_w = devices
        .iter()
        .map(|d| d.names.first().map_or(1, String::len))
        .max()
        .unwrap_or(0)
        .max(4);
    for d in devices {
        let ids = match (d.vendor, d.device) {
            (Some(v), Some(i)) => format!("{v:04x}:{i:04x}"),
            _ => "????:????".into(),
        };
        let name = if d.names.is_empty() {
            "-".into()
        } else {
            d.name()
        };
        let mut line = format!(
            "  {:<6} {:<name_w$}  {}  {ids}  {:<16} {}",
            d.label,
            name,
            d.bdf,
            d.class.to_string(),
            d.link.summary()
        );
        if let Some(n) = d.numa {
            let _ = write!(line, "  numa {n}");
        }
        if d.is_nvidia_gpu() {
            if let Some(s) = d.bar1_size() {
                let _ = write!(line, "  BAR1 {}", format_size(s));
            }
        }
        if let Some(drv) = &d.driver {
            let _ = write!(line, "  driver {drv}");
        }
        if d.names.len() > 1 {
            let _ = write!(line, "  ({})", d.names[1..].join(", "));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Verdict lines for pairs that involve a GPU (all pairs when there is no GPU), at most
/// [`MAX_PAIRS`](crate::limits::MAX_PAIRS) of them, then a line that counts the rest: the
/// default view of `gdr topo`, as [`Topology::gpu_report`] in JSON.
pub fn verdicts(topo: &Topology, devices: &[&PciDevice]) -> String {
    verdict_lines(topo, topo.gpu_pairs(devices))
}

/// Verdict lines for every pair of `devices`, GPU or not, at most
/// [`MAX_PAIRS`](crate::limits::MAX_PAIRS) of them, then a line that counts the rest: `gdr
/// topo --all`, as [`Topology::report`] in JSON.
pub fn verdicts_all(topo: &Topology, devices: &[&PciDevice]) -> String {
    verdict_lines(topo, topo.pairs(devices))
}

fn verdict_lines(topo: &Topology, pairs: crate::Pairs) -> String {
    let mut out = String::from("Peer-to-peer verdicts:\n");
    let mut n = 0;
    let note = pairs.left_out_note();
    for p in pairs {
        let (Some(a), Some(b)) = (topo.device(p.a), topo.device(p.b)) else {
            continue;
        };
        n += 1;
        let why: Vec<&str> = p
            .reasons
            .iter()
            .filter(|r| r.severity > Severity::Info)
            .map(|r| r.what.as_str())
            .collect();
        let mut line = format!(
            "  {:<13} {:<5} {}",
            format!("{}-{}", a.label, b.label),
            p.class.to_string(),
            p.verdict
        );
        if !why.is_empty() {
            let _ = write!(line, ": {}", why.join("; "));
        }
        out.push_str(&line);
        out.push('\n');
    }
    if n == 0 {
        out.push_str("  (no pairs)\n");
    }
    if let Some(note) = note {
        let _ = writeln!(out, "  ({note})");
    }
    out
}

fn severity_tag(s: Severity) -> &'static str {
    match s {
        Severity::Info => "note",
        Severity::Slower => "slower",
        Severity::Poor => "poor",
    }
}

/// The hop list and the verdict of one path, with better pairings when it is not good.
pub fn explain(topo: &Topology, p: &PeerPath) -> String {
    let mut out = String::new();
    let desc = |b| {
        topo.device(b).map_or(b.to_string(), |d: &PciDevice| {
            format!("{} ({}, {}, {})", d.name(), d.label, d.bdf, d.class)
        })
    };
    let _ = writeln!(out, "{}\n  <-> {}", desc(p.a), desc(p.b));
    let _ = writeln!(out, "path: {}", p.class);
    if p.class != p.pcie_class {
        let _ = writeln!(out, "PCIe path: {}", p.pcie_class);
    }
    out.push_str("\nhops (up = the link above a function, down = the link below a port):\n");
    for (i, h) in p.hops.iter().enumerate() {
        let mut line = match h.kind {
            HopKind::Device => format!(
                "  {:>2}. {}  {:<24} {:<12}",
                i + 1,
                h.bdf.map_or(String::new(), |b| b.to_string()),
                h.role,
                h.name
            ),
            _ => format!(
                "  {:>2}. {:<12}  {:<24} {}",
                i + 1,
                h.role,
                h.name,
                h.numa.map_or(String::new(), |n| format!("NUMA node {n}"))
            ),
        };
        if let Some(l) = &h.link {
            let side = if h.link_below { "down" } else { "up" };
            let _ = write!(line, "  {side} {}", l.summary());
        }
        if let Some(a) = &h.acs {
            if h.kind == HopKind::Device
                && topo
                    .device(h.bdf.unwrap_or(p.a))
                    .is_some_and(|d| d.is_bridge())
            {
                let _ = write!(line, "  {}", a.summary());
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let _ = writeln!(out, "\nverdict: {}", p.verdict);
    let mut reasons = p.reasons.clone();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    for r in &reasons {
        let _ = writeln!(out, "  [{}] {}", severity_tag(r.severity), r);
    }
    if p.verdict != Verdict::Good {
        let mut better = Vec::new();
        for (from, to) in [(p.a, p.b), (p.b, p.a)] {
            let (Some(f), Some(t)) = (topo.device(from), topo.device(to)) else {
                continue;
            };
            for c in topo.closest(from, t.class).iter().take(3) {
                if c.b != to && (c.class.rank(), c.verdict) < (p.class.rank(), p.verdict) {
                    if let Some(d) = topo.device(c.b) {
                        better.push(format!(
                            "  {} <-> {}: {}, {}",
                            f.name(),
                            d.name(),
                            c.class,
                            c.verdict
                        ));
                    }
                }
            }
        }
        if !better.is_empty() {
            out.push_str("\nbetter pairings:\n");
            out.push_str(&better.join("\n"));
            out.push('\n');
        }
    }
    out
}
