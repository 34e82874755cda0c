//! The peer-to-peer verdict for a path, and the reasons behind it, each written so that the
//! reader knows what to change.

use crate::config::AcsState;
use crate::device::{format_size, link_is_below, pcie_generation, DeviceClass, PciDevice};
use crate::geometry::{Geometry, PathClass};
use crate::topology::Topology;
use serde::Serialize;
use std::fmt;

/// Can the two devices DMA to each other, and how well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Full peer-to-peer speed is to be expected (printed `good`).
    Good,
    /// Peer-to-peer works, below full speed (`works-slower`).
    WorksSlower,
    /// Peer-to-peer may crawl or fail (`poor-or-unsupported`).
    PoorOrUnsupported,
}

impl Verdict {
    pub(crate) fn from_reasons(reasons: &[Reason]) -> Self {
        match reasons.iter().map(|r| r.severity).max() {
            Some(Severity::Poor) => Verdict::PoorOrUnsupported,
            Some(Severity::Slower) => Verdict::WorksSlower,
            _ => Verdict::Good,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Good => "good",
            Verdict::WorksSlower => "works-slower",
            Verdict::PoorOrUnsupported => "poor-or-unsupported",
        })
    }
}

/// How much a finding weighs: `Info` leaves the verdict at good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// A fact or a note; no effect on the verdict.
    Info,
    /// Makes the verdict at best works-slower.
    Slower,
    /// Makes the verdict poor-or-unsupported.
    Poor,
}

/// One finding about a path: what was seen, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// How much the finding weighs in the verdict.
    pub severity: Severity,
    /// Short: "crosses the inter-socket link (NUMA 0 to 1)".
    pub what: String,
    /// What it means and what to change; may be empty for plain facts.
    pub advice: String,
}

impl Reason {
    fn new(severity: Severity, what: impl Into<String>, advice: impl Into<String>) -> Self {
        Self {
            severity,
            what: what.into(),
            advice: advice.into(),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.advice.is_empty() {
            f.write_str(&self.what)
        } else {
            write!(f, "{}: {}", self.what, self.advice)
        }
    }
}

const SMALL_BAR1: u64 = 1 << 30;

fn who(d: &PciDevice) -> String {
    if d.names.is_empty() {
        d.bdf.to_string()
    } else {
        format!("{} [{}]", d.name(), d.bdf)
    }
}

fn numa_text(n: Option<u32>) -> String {
    n.map_or("?".into(), |n| n.to_string())
}

pub(crate) fn assess(
    topo: &Topology,
    g: &Geometry,
    a: usize,
    b: usize,
    nvlinks: Option<u32>,
) -> Vec<Reason> {
    use Severity::*;
    let devs = topo.devices();
    let mut out = Vec::new();
    if a == b {
        out.push(Reason::new(Info, "the same device", ""));
        return out;
    }
    let (da, db) = (&devs[a], &devs[b]);

    match g.class {
        PathClass::Pix => out.push(Reason::new(
            Info,
            "the path turns around inside one PCIe switch or port",
            "peer traffic never reaches the CPU: the best PCIe placement",
        )),
        PathClass::Pxb => out.push(Reason::new(
            Info,
            format!("the path crosses {} PCIe switches but no host bridge", g.bridges),
            "full peer-to-peer bandwidth, a little latency per switch",
        )),
        PathClass::Phb => out.push(Reason::new(
            Slower,
            format!("the path goes up through host bridge {} (the CPU root complex)", g.host_bridges[0]),
            "peer-to-peer works but slower than through a switch, and peer reads can be severely \
             limited on some CPUs; for full speed use devices under one PCIe switch",
        )),
        PathClass::Node => out.push(Reason::new(
            Slower,
            format!(
                "the path crosses between host bridges {} and {} of NUMA node {}",
                g.host_bridges[0],
                g.host_bridges[1],
                numa_text(g.numa.0)
            ),
            "peer traffic goes through the CPU's internal fabric between root complexes; how fast, \
             or whether at all, depends on the CPU; prefer devices under one switch",
        )),
        PathClass::Sys => out.push(Reason::new(
            Poor,
            format!(
                "the path crosses the inter-socket link (NUMA node {} to {})",
                numa_text(g.numa.0),
                numa_text(g.numa.1)
            ),
            "peer-to-peer across sockets may be extremely slow or fail; pair devices on the same \
             socket",
        )),
        PathClass::Local | PathClass::NvLink(_) => {}
    }
    if g.class == PathClass::Node && g.numa.0.is_none() {
        out.push(Reason::new(
            Info,
            "sysfs gives no NUMA node for these devices",
            "NODE assumes one socket; on a multi-socket machine this may really be SYS",
        ));
    }

    iommu(topo, da, &mut out);
    iommu(topo, db, &mut out);
    acs(topo, g, &mut out);
    links(topo, g, &mut out);
    bar1(da, &mut out);
    bar1(db, &mut out);

    if let Some(n) = nvlinks {
        // Over NVLink the PCIe findings do not limit GPU-to-GPU traffic; keep them as notes.
        for r in &mut out {
            r.severity = Info;
            r.what = format!("(PCIe path) {}", r.what);
        }
        out.insert(
            0,
            Reason::new(
                Info,
                format!("connected by {n} NVLinks"),
                format!(
                    "GPU peer traffic uses NVLink; the PCIe path would be {}",
                    g.class
                ),
            ),
        );
    }
    out.dedup();
    out
}

fn iommu(topo: &Topology, d: &PciDevice, out: &mut Vec<Reason>) {
    use Severity::*;
    let Some(g) = &d.iommu_group else {
        if !topo.iommu_groups_present() {
            let r = Reason::new(Info, "no IOMMU groups: the IOMMU is off", "");
            if !out.contains(&r) {
                out.push(r);
            }
        }
        return;
    };
    let kind = g.kind.as_deref().unwrap_or("");
    let r = match kind {
        "identity" => Reason::new(
            Info,
            format!("IOMMU in pass-through for {}, group {}", who(d), g.id),
            "",
        ),
        "DMA" | "DMA-FQ" => Reason::new(
            Poor,
            format!(
                "IOMMU translation is on for {}: group {} has type {kind}",
                who(d),
                g.id
            ),
            "peer DMA addresses go through the IOMMU and Linux turns on ACS redirection, so peer \
             traffic detours through the root complex or is blocked; GPUDirect RDMA wants the \
             IOMMU off or in pass-through: boot with iommu=pt (with intel_iommu=on or \
             amd_iommu=on) or disable it",
        ),
        "unmanaged" => Reason::new(
            Slower,
            format!(
                "{} is owned by a user-space driver (VFIO; IOMMU group {} is unmanaged)",
                who(d),
                g.id
            ),
            "peers reach it only at addresses that driver mapped into its IOVA space (gdr dma \
             maps peer BARs there), and the traffic passes the root complex",
        ),
        "blocked" => Reason::new(
            Poor,
            format!("the IOMMU blocks DMA from {}, group {}", who(d), g.id),
            "bind a driver to the device or give the group a DMA domain",
        ),
        other => Reason::new(
            Info,
            format!(
                "{} is in IOMMU group {} of unknown type{}",
                who(d),
                g.id,
                if other.is_empty() {
                    String::new()
                } else {
                    format!(" `{other}`")
                }
            ),
            "the kernel does not say whether DMA is translated (no iommu_groups/N/type before \
             Linux 5.11); check the kernel command line for iommu=pt",
        ),
    };
    out.push(r);
}

fn acs(topo: &Topology, g: &Geometry, out: &mut Vec<Reason>) {
    use Severity::*;
    let devs = topo.devices();
    let inner = &g.nodes[1..g.nodes.len().saturating_sub(1).max(1)];
    let mut unknown = 0;
    for &n in inner {
        let d = &devs[n];
        match &d.acs {
            AcsState::Present(acs) if acs.redirects_peer_traffic() => {
                let role = d.port_type.describe();
                let r = if matches!(g.class, PathClass::Pix | PathClass::Pxb) {
                    Reason::new(
                        Slower,
                        format!("ACS redirect is on at {} ({role})", d.bdf),
                        format!(
                            "the port sends peer requests up to the root complex instead of \
                             across the switch, so this {} path behaves like PHB; when the IOMMU \
                             is off or in pass-through, turn it off in the firmware, or as root \
                             after each boot: setpci -s {} ECAP_ACS+0x6.w=0000",
                            g.class, d.bdf
                        ),
                    )
                } else {
                    Reason::new(
                        Info,
                        format!("ACS redirect is on at {} ({role})", d.bdf),
                        "the path goes through the root complex anyway",
                    )
                };
                out.push(r);
            }
            AcsState::Unknown if d.is_bridge() => unknown += 1,
            AcsState::Malformed { why } => out.push(Reason::new(
                Info,
                format!("ACS state of {} unreadable", d.bdf),
                why.clone(),
            )),
            _ => {}
        }
    }
    if unknown > 0 {
        out.push(Reason::new(
            Info,
            format!("ACS state unknown on {unknown} port(s) of the path"),
            "config space past 64 bytes needs root: run as root to see whether ACS redirects \
             peer traffic",
        ));
    }
}

fn links(topo: &Topology, g: &Geometry, out: &mut Vec<Reason>) {
    use Severity::*;
    let devs = topo.devices();
    for &n in &g.nodes {
        let d = &devs[n];
        // Root and downstream ports report the link below them, which their child on the path
        // reports too; each physical link is judged once, at its lower end.
        if link_is_below(d.port_type) {
            continue;
        }
        let l = d.link;
        let parent = d.parent.and_then(|p| topo.device(p)).map(|p| p.link);
        let max_w = lower(l.max_width, parent.and_then(|p| p.max_width));
        let max_s = lower(l.max_speed_gts, parent.and_then(|p| p.max_speed_gts));
        if let (Some(cur), Some(max)) = (l.current_width, max_w) {
            if cur < max {
                out.push(Reason::new(
                    Slower,
                    format!("{} link runs at x{cur} of x{max}", who(d)),
                    format!(
                        "{}% of the lanes; reseat the card, or check the slot wiring and the \
                         firmware's bifurcation setting",
                        cur * 100 / max
                    ),
                ));
            }
        }
        if let (Some(cur), Some(max)) = (l.current_speed_gts, max_s) {
            if cur + 0.01 < max {
                let gen =
                    |s: f64| pcie_generation(s).map_or(String::new(), |g| format!(" (Gen{g})"));
                let what = format!(
                    "{} link at {cur} GT/s{} of {max} GT/s{}",
                    who(d),
                    gen(cur),
                    gen(max)
                );
                out.push(if d.is_nvidia_gpu() {
                    Reason::new(
                        Info,
                        what,
                        "NVIDIA GPUs slow their link when idle; check it under load \
                         (nvidia-smi -q -d PCIE)",
                    )
                } else {
                    Reason::new(
                        Slower,
                        what,
                        "check the slot and the firmware's PCIe speed setting",
                    )
                });
            }
        }
        if let (Some(own), Some(up)) = (l.max_speed_gts, parent.and_then(|p| p.max_speed_gts)) {
            if up + 0.01 < own && d.class != DeviceClass::Bridge {
                out.push(Reason::new(
                    Info,
                    format!(
                        "{} supports {own} GT/s but the port above it only {up} GT/s",
                        who(d)
                    ),
                    "",
                ));
            }
        }
    }
}

/// The smaller of two optional limits; a missing one does not limit.
fn lower<T: PartialOrd>(x: Option<T>, y: Option<T>) -> Option<T> {
    match (x, y) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

fn bar1(d: &PciDevice, out: &mut Vec<Reason>) {
    use Severity::*;
    if !d.is_nvidia_gpu() {
        return;
    }
    match d.bar1_size() {
        Some(s) if s < SMALL_BAR1 => out.push(Reason::new(
            Slower,
            format!("{} BAR1 is only {}", who(d), format_size(s)),
            "no more GPU memory than that (less the driver's share) can be exposed to peers at \
             once, so large transfers must re-pin; enable Resizable BAR and Above 4G Decoding \
             in the firmware",
        )),
        Some(s) => out.push(Reason::new(
            Info,
            format!("{} BAR1 is {}", who(d), format_size(s)),
            "",
        )),
        None => out.push(Reason::new(
            Info,
            format!(
                "{} BAR1 size unknown (`resource` lists no memory BAR after BAR0)",
                who(d)
            ),
            "",
        )),
    }
}
