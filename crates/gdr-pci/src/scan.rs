//! The sysfs walker: turns a sysfs tree into a [`Topology`]. Anything odd becomes a warning and
//! the device (or the attribute) is left out; nothing here fails except a root with no PCI bus.

use crate::bdf::Bdf;
use crate::config::{self, AcsState};
use crate::cpulist::IdList;
use crate::device::{
    classify, natural_key, Bar, DeviceClass, IommuGroup, LinkState, PciDevice, PortType,
};
use crate::info::{link_name, parse_hex, parse_numa_node};
use crate::limits::{MAX_ATTR_BYTES, MAX_CONFIG_BYTES, MAX_WARNINGS};
use crate::sysfs::Sysfs;
use crate::sysfs_error::SysfsError;
use crate::topology::{HostBridge, TopoError, Topology, Warning};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The warnings of one scan, at most [`MAX_WARNINGS`] of them: a hostile tree can hold far
/// more odd entries than anyone reads.
struct Warnings {
    kept: Vec<Warning>,
    dropped: usize,
}

impl Warnings {
    fn push(&mut self, path: &Path, message: impl Into<String>) {
        if self.kept.len() == MAX_WARNINGS {
            self.dropped += 1;
            return;
        }
        self.kept.push(Warning {
            path: path.display().to_string(),
            message: message.into(),
        });
    }

    /// The kept warnings, then what the reader read only in part (never dropped: there are
    /// few), then how many were dropped.
    fn finish(mut self, fs: &Sysfs) -> Vec<Warning> {
        for (path, message) in fs.take_notes() {
            self.kept.push(Warning {
                path: path.display().to_string(),
                message,
            });
        }
        if self.dropped > 0 {
            self.kept.push(Warning {
                path: String::new(),
                message: format!("{} more warnings not shown", self.dropped),
            });
        }
        self.kept
    }
}

/// Why an entry was left out, for a warning: a file longer than sysfs allows is malformed,
/// anything else unreadable.
fn unreadable(e: &SysfsError) -> String {
    match e {
        SysfsError::TooLong { .. } => format!("malformed: {e}"),
        _ => format!("unreadable: {e}"),
    }
}

/// A device as first read, before the tree and the names are known.
struct Raw {
    bdf: Bdf,
    dir: PathBuf,
    host: String,
    /// BDF components of the sysfs path, topmost first, ending with the device itself.
    chain: Vec<Bdf>,
    vendor: Option<u16>,
    device: Option<u16>,
    class_code: Option<u32>,
    numa: Option<u32>,
    cpulist: Option<String>,
    link: LinkState,
    bars: Vec<Bar>,
    config: Option<Vec<u8>>,
    iommu_group: Option<u32>,
    driver: Option<String>,
}

pub(crate) fn scan(fs: &Sysfs) -> Result<Topology, TopoError> {
    let mut w = Warnings {
        kept: Vec::new(),
        dropped: 0,
    };
    let bus = Path::new("bus/pci/devices");
    let entries = fs.list(bus).map_err(|source| TopoError::NotSysfs {
        root: fs.root().to_path_buf(),
        source,
    })?;

    let mut raws = Vec::new();
    let mut seen: HashMap<PathBuf, Bdf> = HashMap::new();
    for name in entries {
        let rel = bus.join(&name);
        let Ok(bdf) = name.parse::<Bdf>() else {
            w.push(&rel, "not a PCI address; skipped");
            continue;
        };
        let dir = match fs.link(&rel) {
            Ok(t) => t,
            // A plain directory instead of a link (hand-made trees): read it in place.
            Err(SysfsError::NotALink) => rel.clone(),
            Err(e) => {
                w.push(&rel, format!("unreadable link ({e}); device skipped"));
                continue;
            }
        };
        let resolved = match target_problem(fs, &dir) {
            Ok(r) => r,
            Err(why) => {
                w.push(&rel, format!("{why}; device skipped"));
                continue;
            }
        };
        // One directory is one function: a second address leading to it (a hand-made or
        // hostile tree; the kernel never does this) would be read and paired again.
        if let Some(&first) = seen.get(&resolved) {
            w.push(
                &rel,
                format!("leads to the same directory as {first}; device skipped"),
            );
            continue;
        }
        seen.insert(resolved, bdf);
        raws.push(read_device(fs, bdf, dir, &mut w));
    }

    let groups = read_iommu_groups(fs, &raws, &mut w);
    let nodes = read_numa_nodes(fs, &mut w);
    let host_dirs = list_host_bridges(fs, &mut w);
    let rdma = class_links(fs, "infiniband", &mut w);
    let nvme = class_links(fs, "nvme", &mut w);
    let net = class_links(fs, "net", &mut w);

    let index: HashMap<Bdf, usize> = raws.iter().enumerate().map(|(i, r)| (r.bdf, i)).collect();
    for (what, links) in [("infiniband", &rdma), ("nvme", &nvme), ("net", &net)] {
        for (name, bdf) in links {
            if !index.contains_key(bdf) {
                w.push(
                    &Path::new("class").join(what).join(name),
                    format!("points at {bdf}, which bus/pci/devices does not list"),
                );
            }
        }
    }

    // Parents: the nearest ancestor in the path that is itself a listed device.
    let mut parents: Vec<Option<Bdf>> = Vec::with_capacity(raws.len());
    for r in &raws {
        let ancestors = &r.chain[..r.chain.len().saturating_sub(1)];
        let parent = ancestors
            .iter()
            .rev()
            .find(|b| index.contains_key(b))
            .copied();
        if let Some(direct) = ancestors.last() {
            if parent != Some(*direct) {
                w.push(
                    &r.dir,
                    format!("parent {direct} is not listed in bus/pci/devices; tree is partial"),
                );
            }
        }
        parents.push(parent);
    }

    // Port types: config space when readable, otherwise the shape of the tree (parents first).
    let mut order: Vec<usize> = (0..raws.len()).collect();
    order.sort_by_key(|&i| raws[i].chain.len());
    let mut ports: Vec<(PortType, bool)> = vec![(PortType::Unknown, true); raws.len()];
    let mut bridges_without_ext_config = 0;
    for &i in &order {
        let r = &raws[i];
        let class = classify(r.class_code, r.vendor, false, false);
        let from_config = r.config.as_deref().and_then(config::pcie_port_type);
        let host_function = r.class_code.map(|c| c >> 8) == Some(0x0600);
        ports[i] = if host_function {
            (PortType::HostBridge, false)
        } else if let Some(t) = from_config {
            (PortType::from_field(t), false)
        } else {
            let parent_port = parents[i].map(|p| ports[index[&p]].0);
            (infer_port(class, parent_port), true)
        };
        if class == DeviceClass::Bridge
            && !host_function
            && r.config.as_ref().is_some_and(|c| c.len() < 0x104)
        {
            bridges_without_ext_config += 1;
        }
    }
    if bridges_without_ext_config > 0 {
        w.push(
            Path::new(""),
            format!(
                "config space past 64 bytes was unreadable for {bridges_without_ext_config} \
                 bridge(s) (it needs root): ACS state unknown there"
            ),
        );
    }

    // Class names by device, in one pass each: a tree of thousands of devices and names
    // stays linear.
    let by_device = |links: &[(String, Bdf)]| {
        let mut m: HashMap<Bdf, Vec<String>> = HashMap::new();
        for (n, b) in links {
            m.entry(*b).or_default().push(n.clone());
        }
        m
    };
    let (rdma, nvme, net) = (by_device(&rdma), by_device(&nvme), by_device(&net));
    let mut devices: Vec<PciDevice> = Vec::with_capacity(raws.len());
    for (i, r) in raws.into_iter().enumerate() {
        let names_of = |m: &HashMap<Bdf, Vec<String>>| m.get(&r.bdf).cloned().unwrap_or_default();
        let ib = names_of(&rdma);
        let nv = names_of(&nvme);
        let class = classify(r.class_code, r.vendor, !ib.is_empty(), !nv.is_empty());
        let mut names = ib;
        names.extend(nv);
        names.extend(names_of(&net));
        let acs = match &r.config {
            Some(c) => config::find_acs(c),
            None => AcsState::Unknown,
        };
        if let AcsState::Malformed { why } = &acs {
            w.push(
                &r.dir.join("config"),
                format!("extended capabilities: {why}"),
            );
        }
        let numa_affinity = numa_affinity(&r, nodes.as_deref(), &mut w);
        devices.push(PciDevice {
            bdf: r.bdf,
            label: String::new(),
            names,
            class,
            vendor: r.vendor,
            device: r.device,
            class_code: r.class_code,
            port_type: ports[i].0,
            port_type_inferred: ports[i].1,
            numa: r.numa,
            numa_affinity,
            cpulist: r.cpulist,
            gpu_numa_id: None,
            link: r.link,
            iommu_group: r.iommu_group.map(|id| IommuGroup {
                id,
                kind: groups.get(&id).cloned().flatten(),
            }),
            bars: r.bars,
            acs,
            driver: r.driver,
            parent: parents[i],
            host_bridge: r.host,
            sysfs_path: r.dir.display().to_string(),
        });
    }
    assign_labels(&mut devices);

    let host_bridges = build_host_bridges(&devices, host_dirs);
    Ok(Topology::from_parts(
        fs.root().to_path_buf(),
        devices,
        host_bridges,
        !groups.is_empty(),
        w.finish(fs),
    ))
}

/// Whether the directory a link points at can be read; if not, what to say.
/// Where it leads inside the tree when it can be read.
fn target_problem(fs: &Sysfs, target: &Path) -> Result<PathBuf, String> {
    match fs.resolve_dir(target) {
        Ok(p) => Ok(p),
        Err(e) if e.is_not_found() => Err(format!("dangling link to {}", target.display())),
        // A loop names where it turns.
        Err(e @ SysfsError::LinkLoop(_)) => Err(e.to_string()),
        Err(e) => Err(format!("link to {}: {e}", target.display())),
    }
}

fn infer_port(class: DeviceClass, parent: Option<PortType>) -> PortType {
    if class != DeviceClass::Bridge {
        return match parent {
            None => PortType::RcIntegratedEndpoint,
            Some(_) => PortType::Endpoint,
        };
    }
    match parent {
        None => PortType::RootPort,
        Some(PortType::RootPort | PortType::SwitchDownstream) => PortType::SwitchUpstream,
        Some(PortType::SwitchUpstream) => PortType::SwitchDownstream,
        Some(_) => PortType::Unknown,
    }
}

/// `pci0000:17` → (domain, bus), the name sysfs gives a host bridge's root bus.
pub(crate) fn parse_host_bridge(name: &str) -> Option<(u32, u8)> {
    let rest = name.strip_prefix("pci")?;
    let (d, b) = rest.split_once(':')?;
    if d.is_empty() || b.len() != 2 || !(d.len() <= 8 && d.bytes().all(|c| c.is_ascii_hexdigit())) {
        return None;
    }
    Some((
        u32::from_str_radix(d, 16).ok()?,
        u8::from_str_radix(b, 16).ok()?,
    ))
}

/// The host bridge and the chain of PCI addresses in a device's sysfs path.
fn parse_device_path(dir: &Path, bdf: Bdf, w: &mut Warnings) -> (String, Vec<Bdf>) {
    let mut host = None;
    let mut chain = Vec::new();
    for c in dir.components() {
        let s = c.as_os_str().to_string_lossy();
        if let Ok(b) = s.parse::<Bdf>() {
            chain.push(b);
        } else if chain.is_empty() && parse_host_bridge(&s).is_some() {
            host = Some(s.into_owned());
        }
    }
    if chain.last() != Some(&bdf) {
        w.push(
            dir,
            format!("sysfs path does not end in {bdf}; its place in the tree is a guess"),
        );
        chain.push(bdf);
    }
    let host = host.unwrap_or_else(|| {
        let top = chain[0];
        w.push(
            dir,
            "no pciDDDD:BB host bridge in the sysfs path; assuming one per top-level bus",
        );
        format!("pci{:04x}:{:02x}", top.domain, top.bus)
    });
    (host, chain)
}

/// Reads one attribute. Absent optional attributes are silent (not every device has a link or a
/// NUMA node); every other failure is a warning.
fn attr(fs: &Sysfs, dir: &Path, name: &str, required: bool, w: &mut Warnings) -> Option<String> {
    let rel = dir.join(name);
    match fs.read_text(&rel, MAX_ATTR_BYTES) {
        Ok(s) => Some(s),
        Err(e) if e.is_not_found() && !required => None,
        Err(e) => {
            w.push(&rel, unreadable(&e));
            None
        }
    }
}

fn hex_attr(fs: &Sysfs, dir: &Path, name: &str, max: u64, w: &mut Warnings) -> Option<u64> {
    let s = attr(fs, dir, name, true, w)?;
    match parse_hex(&s) {
        Some(v) if v <= max => Some(v),
        _ => {
            w.push(
                &dir.join(name),
                format!("unexpected content `{}`", short(&s)),
            );
            None
        }
    }
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(40).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t.escape_debug().to_string()
}

fn parse_speed(s: &str) -> Option<f64> {
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (v.is_finite() && v > 0.0).then_some(v)
}

fn parse_width(s: &str) -> Option<u32> {
    let v: u32 = s.trim().trim_start_matches('x').parse().ok()?;
    (v > 0).then_some(v)
}

fn read_link_attrs(fs: &Sysfs, dir: &Path, w: &mut Warnings) -> LinkState {
    let mut get = |n: &str| attr(fs, dir, n, false, w);
    let (cs, cw, ms, mw) = (
        get("current_link_speed"),
        get("current_link_width"),
        get("max_link_speed"),
        get("max_link_width"),
    );
    LinkState {
        current_speed_gts: cs.as_deref().and_then(parse_speed),
        current_width: cw.as_deref().and_then(parse_width),
        max_speed_gts: ms.as_deref().and_then(parse_speed),
        max_width: mw.as_deref().and_then(parse_width),
    }
}

/// `resource`: one `start end flags` line per BAR (0-5), then the ROM and bridge windows.
fn parse_resource(text: &str) -> Result<Vec<Bar>, String> {
    const IORESOURCE_IO: u64 = 0x100;
    const IORESOURCE_PREFETCH: u64 = 0x2000;
    const IORESOURCE_MEM_64: u64 = 0x0010_0000;
    let mut bars = Vec::new();
    for (i, line) in text.lines().enumerate().take(6) {
        let f: Vec<Option<u64>> = line.split_whitespace().map(parse_hex).collect();
        let [Some(start), Some(end), Some(flags)] = f[..] else {
            return Err(format!("line {} is `{}`", i + 1, short(line)));
        };
        if end == 0 && start == 0 {
            continue;
        }
        if end < start {
            return Err(format!("line {} ends before it starts", i + 1));
        }
        bars.push(Bar {
            index: i as u8,
            start,
            size: (end - start).saturating_add(1),
            io: flags & IORESOURCE_IO != 0,
            mem64: flags & IORESOURCE_MEM_64 != 0,
            prefetchable: flags & IORESOURCE_PREFETCH != 0,
        });
    }
    Ok(bars)
}

fn read_device(fs: &Sysfs, bdf: Bdf, dir: PathBuf, w: &mut Warnings) -> Raw {
    let (host, chain) = parse_device_path(&dir, bdf, w);
    let vendor = hex_attr(fs, &dir, "vendor", 0xffff, w).map(|v| v as u16);
    let device = hex_attr(fs, &dir, "device", 0xffff, w).map(|v| v as u16);
    let class_code = hex_attr(fs, &dir, "class", 0xff_ffff, w).map(|v| v as u32);
    let numa = attr(fs, &dir, "numa_node", false, w).and_then(|s| match parse_numa_node(&s) {
        Ok(n) => n,
        Err(()) => {
            w.push(
                &dir.join("numa_node"),
                format!("unexpected content `{}`", short(&s)),
            );
            None
        }
    });
    let cpulist = attr(fs, &dir, "local_cpulist", false, w).filter(|s| !s.is_empty());
    let link = read_link_attrs(fs, &dir, w);
    let bars = match attr(fs, &dir, "resource", true, w).map(|t| parse_resource(&t)) {
        Some(Ok(b)) => b,
        Some(Err(why)) => {
            w.push(&dir.join("resource"), format!("malformed: {why}"));
            Vec::new()
        }
        None => Vec::new(),
    };
    let config = match fs.read(&dir.join("config"), MAX_CONFIG_BYTES) {
        Ok(c) => Some(c),
        Err(e) => {
            w.push(&dir.join("config"), unreadable(&e));
            None
        }
    };
    let iommu_group = optional_link(fs, &dir.join("iommu_group"), w).and_then(|t| {
        let id = link_name(&t)?.parse::<u32>().ok();
        if id.is_none() {
            w.push(
                &dir.join("iommu_group"),
                format!("odd target {}", t.display()),
            );
        }
        id
    });
    let driver =
        optional_link(fs, &dir.join("driver"), w).and_then(|t| Some(link_name(&t)?.to_string()));
    Raw {
        bdf,
        dir,
        host,
        chain,
        vendor,
        device,
        class_code,
        numa,
        cpulist,
        link,
        bars,
        config,
        iommu_group,
        driver,
    }
}

fn optional_link(fs: &Sysfs, rel: &Path, w: &mut Warnings) -> Option<PathBuf> {
    match fs.link(rel) {
        Ok(t) => Some(t),
        Err(e) if e.is_not_found() => None,
        Err(e) => {
            w.push(rel, format!("unreadable link: {e}"));
            None
        }
    }
}

/// Every IOMMU group and its type. An absent directory means no IOMMU (or a kernel without
/// groups); a group without `type` is a kernel older than 5.11.
fn read_iommu_groups(fs: &Sysfs, raws: &[Raw], w: &mut Warnings) -> BTreeMap<u32, Option<String>> {
    let dir = Path::new("kernel/iommu_groups");
    let mut groups = BTreeMap::new();
    let mut ids = fs.iommu_groups().unwrap_or_else(|e| {
        w.push(dir, format!("unreadable: {e}"));
        Vec::new()
    });
    ids.extend(raws.iter().filter_map(|r| r.iommu_group));
    for id in ids {
        if groups.contains_key(&id) {
            continue;
        }
        let kind = attr(fs, &dir.join(id.to_string()), "type", false, w);
        groups.insert(id, kind);
    }
    groups
}

/// Every NUMA node with its CPUs, from `devices/system/node/node<N>/cpulist`. `None` when the
/// directory is absent: a kernel without NUMA support, where the whole machine is one node.
fn read_numa_nodes(fs: &Sysfs, w: &mut Warnings) -> Option<Vec<(u32, IdList)>> {
    let dir = Path::new("devices/system/node");
    let names = match fs.list(dir) {
        Ok(v) => v,
        Err(e) if e.is_not_found() => return None,
        Err(e) => {
            w.push(dir, format!("unreadable: {e}"));
            return Some(Vec::new());
        }
    };
    let mut nodes = Vec::new();
    for name in names {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let node_dir = dir.join(&name);
        let Some(text) = attr(fs, &node_dir, "cpulist", true, w) else {
            continue;
        };
        match IdList::parse(&text) {
            Some(cpus) => nodes.push((id, cpus)),
            None => w.push(
                &node_dir.join("cpulist"),
                format!("unexpected content `{}`", short(&text)),
            ),
        }
    }
    nodes.sort_by_key(|(id, _)| *id);
    Some(nodes)
}

/// The NUMA nodes near a device, the way nvidia-smi reports "NUMA Affinity": its `numa_node`
/// when the kernel knows it, otherwise every node with a CPU in the device's `local_cpulist`
/// (in a VM the kernel leaves `numa_node` at -1 but still lists the CPUs). `nodes` is `None` on
/// a machine without node directories, which is then a single node 0.
fn numa_affinity(r: &Raw, nodes: Option<&[(u32, IdList)]>, w: &mut Warnings) -> Vec<u32> {
    if let Some(n) = r.numa {
        return vec![n];
    }
    let Some(text) = &r.cpulist else {
        return Vec::new();
    };
    let Some(cpus) = IdList::parse(text) else {
        w.push(
            &r.dir.join("local_cpulist"),
            format!("unexpected content `{}`", short(text)),
        );
        return Vec::new();
    };
    match nodes {
        None => vec![0],
        Some(nodes) => nodes
            .iter()
            .filter(|(_, node_cpus)| node_cpus.intersects(&cpus))
            .map(|(id, _)| *id)
            .collect(),
    }
}

/// Host bridges named in `/sys/devices` (also those with nothing below them).
fn list_host_bridges(fs: &Sysfs, w: &mut Warnings) -> Vec<String> {
    let dir = Path::new("devices");
    let names = match fs.list(dir) {
        Ok(v) => v,
        Err(e) => {
            w.push(dir, format!("unreadable: {e}"));
            return Vec::new();
        }
    };
    let hosts: Vec<String> = names
        .into_iter()
        .filter(|n| parse_host_bridge(n).is_some())
        .collect();
    for h in &hosts {
        if let Err(e) = fs.list(&dir.join(h)) {
            w.push(&dir.join(h), format!("unreadable: {e}"));
        }
    }
    hosts
}

/// `/sys/class/<class>/<name>` links, each resolved to the PCI function it belongs to. Entries
/// on no PCI device (virtual interfaces, fabrics controllers) are skipped without a word.
fn class_links(fs: &Sysfs, class: &str, w: &mut Warnings) -> Vec<(String, Bdf)> {
    let dir = Path::new("class").join(class);
    let names = match fs.list(&dir) {
        Ok(v) => v,
        Err(e) if e.is_not_found() => return Vec::new(),
        Err(e) => {
            w.push(&dir, format!("unreadable: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for name in names {
        let rel = dir.join(&name);
        let target = match fs.link(&rel) {
            Ok(t) => t,
            Err(e) => {
                w.push(&rel, format!("unreadable link: {e}"));
                continue;
            }
        };
        if let Err(why) = target_problem(fs, &target) {
            w.push(&rel, why);
            continue;
        }
        let owner = target
            .components()
            .rev()
            .find_map(|c| c.as_os_str().to_str()?.parse::<Bdf>().ok());
        if let Some(bdf) = owner {
            out.push((name, bdf));
        }
    }
    out
}

/// Labels and short names: GPUs in address order (as nvidia-smi numbers them), RDMA NICs in
/// RDMA-name order (nvidia-smi's NIC legend), the rest in address order within their class.
fn assign_labels(devices: &mut [PciDevice]) {
    let classes = [
        DeviceClass::Gpu,
        DeviceClass::RdmaNic,
        DeviceClass::Nic,
        DeviceClass::Nvme,
        DeviceClass::Accelerator,
        DeviceClass::Other,
    ];
    for class in classes {
        let mut members: Vec<usize> = (0..devices.len())
            .filter(|&i| devices[i].class == class)
            .collect();
        if class == DeviceClass::RdmaNic {
            members.sort_by_key(|&i| {
                (
                    devices[i].names.first().map(|n| natural_key(n)),
                    devices[i].bdf,
                )
            });
        } else {
            members.sort_by_key(|&i| devices[i].bdf);
        }
        for (n, &i) in members.iter().enumerate() {
            devices[i].label = format!("{}{n}", class.label_prefix());
            if class == DeviceClass::Gpu {
                devices[i].names.insert(0, format!("gpu{n}"));
            }
        }
    }
}

/// Host bridges with their NUMA node (taken from the devices below; root ports first).
fn build_host_bridges(devices: &[PciDevice], listed: Vec<String>) -> Vec<HostBridge> {
    // Per host bridge: the NUMA node of its first root device that has one, else of any
    // device below it; in one pass over the devices.
    let mut numa: HashMap<&str, (Option<u32>, Option<u32>)> = HashMap::new();
    for d in devices {
        let e = numa.entry(d.host_bridge.as_str()).or_default();
        if d.parent.is_none() && e.0.is_none() {
            e.0 = d.numa;
        }
        if e.1.is_none() {
            e.1 = d.numa;
        }
    }
    let mut names: Vec<String> = listed;
    let mut seen: std::collections::HashSet<String> = names.iter().cloned().collect();
    for d in devices {
        if seen.insert(d.host_bridge.clone()) {
            names.push(d.host_bridge.clone());
        }
    }
    names.sort_by_key(|n| parse_host_bridge(n));
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let numa = numa
                .get(name.as_str())
                .and_then(|(root, any)| root.or(*any));
            let (domain, bus) = parse_host_bridge(&name).unwrap_or((0, 0));
            HostBridge {
                name,
                domain,
                bus,
                numa,
            }
        })
        .collect()
}

impl Topology {
    /// Reads the tree under `root` (`/sys` on a live system). Fails only when `root` has no
    /// `bus/pci/devices`; every other problem is a [`Warning`] and a partial answer.
    pub fn read(root: impl AsRef<Path>) -> Result<Self, TopoError> {
        scan(&Sysfs::new(root.as_ref()))
    }

    /// [`Topology::read`] on `/sys`.
    pub fn read_system() -> Result<Self, TopoError> {
        Self::read("/sys")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lines() {
        let text = "0x00000000f0000000 0x00000000f0ffffff 0x0000000000040200\n\
                    0x0000380000000000 0x0000381fffffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        let bars = parse_resource(text).unwrap();
        assert_eq!(bars.len(), 2);
        assert_eq!(bars[0].size, 16 << 20);
        assert_eq!((bars[1].index, bars[1].size), (1, 128 << 30));
        assert!(bars[1].mem64 && bars[1].prefetchable && !bars[0].prefetchable);
        assert!(parse_resource("0x1 0x2\n").is_err());
        assert!(parse_resource("0x10 0x1 0x200\n").is_err());
    }

    #[test]
    fn speeds_widths_and_names() {
        assert_eq!(parse_speed("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(parse_speed("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_speed("Unknown"), None);
        assert_eq!(parse_width("16"), Some(16));
        assert_eq!(parse_width("0"), None);
        assert_eq!(parse_host_bridge("pci0000:17"), Some((0, 0x17)));
        assert_eq!(parse_host_bridge("pci10000:e0"), Some((0x10000, 0xe0)));
        assert_eq!(parse_host_bridge("pci_bus"), None);
        let mut v = vec!["mlx5_10", "mlx5_2", "ibp1"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["ibp1", "mlx5_2", "mlx5_10"]);
    }
}
