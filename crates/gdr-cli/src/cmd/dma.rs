//! `gdr dma`: the picoevb test programs over user-space DMA engines (XDMA boards, QEMU's edu).
//!
//! - `copy`: rdma-malloc's check: a 4 MiB surface of `(y<<16)|x` words copied through the
//!   device into a destination poisoned with its inverse, verified word by word; `--peer` copies
//!   into another device's BAR and back out instead (peer memory, as a GPU's BAR1).
//! - `h2c`, `c2h`: rdma-malloc-{h2c,c2h}-perf: one timed transfer of min(device RAM, 100 MiB),
//!   printed as `Bytes:N usecs:N MB/s:X`, then a table over sizes.
//! - `leds VALUE`: set-leds (XDMA boards). `info`: what was found and what is missing.
//!
//! `--json` prints each result as one JSON object instead. `info --json` prints one even when
//! no device can be opened (`"found": false` and why), then fails as the text form does.

use super::CmdResult;
use gdr_dma::pattern::{check_surface, poison, surface, SURFACE_BYTES};
use gdr_dma::{
    bind_hint, Copier, DmaError, Endpoint, EngineKind, MappedMemory, OpenOptions, Session,
};
use gdr_pci::{Bdf, PciInfo, Sysfs};
use serde::Serialize;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct DmaArgs {
    #[command(subcommand)]
    action: Action,
    /// PCI address of the DMA device (DDDD:BB:DD.F); default: the first XDMA or edu device
    #[arg(long, global = true)]
    device: Option<String>,
    /// Engine driving the device (auto: by PCI vendor:device)
    #[arg(long, global = true, value_enum, default_value = "auto")]
    engine: Engine,
    /// Poll the device for completion instead of waiting for its interrupt
    #[arg(long, global = true)]
    poll: bool,
    /// Device RAM size in bytes (4K, 2G, ...), for XDMA bitstreams other than PicoEVB/HTG-K800
    #[arg(long, global = true, value_parser = parse_bytes)]
    ram_size: Option<u64>,
    /// Print JSON instead of text
    #[arg(long, global = true)]
    json: bool,
}

/// Byte counts as the other subcommands take them (4096, 4K, 16M, 1G).
fn parse_bytes(s: &str) -> Result<u64, String> {
    super::table::parse_size(s).map(|v| v as u64)
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Engine {
    Auto,
    Xdma,
    Edu,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Show the device, its engine, limits and IOMMU window, or what is missing
    Info,
    /// Copy the 4 MiB test surface through the device and verify every word
    Copy {
        /// Bytes to copy (a multiple of 4, e.g. 64K or 4M; default the 4 MiB surface)
        #[arg(long, default_value_t = SURFACE_BYTES as u64, value_parser = parse_bytes)]
        size: u64,
        /// Go through this device's BAR (bound to vfio-pci) as peer memory: host -> peer -> host
        #[arg(long)]
        peer: Option<String>,
        /// BAR of the peer device (default: its largest mappable BAR)
        #[arg(long)]
        peer_bar: Option<u32>,
        /// Byte offset into the peer BAR
        #[arg(long, default_value_t = 0, value_parser = parse_bytes)]
        peer_offset: u64,
    },
    /// Time host -> device transfers
    H2c {
        /// Sizes for the table (default: powers of 4 from 4 KiB up to the device RAM)
        #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
        sizes: Vec<u64>,
    },
    /// Time device -> host transfers
    C2h {
        /// Sizes for the table (default: powers of 4 from 4 KiB up to the device RAM)
        #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
        sizes: Vec<u64>,
    },
    /// Light LEDs: bit 0..2 of VALUE set = LED on (XDMA boards; writes the GPIO inverted)
    Leds {
        /// Which LEDs to light, as a bit mask 0..=7: bit 0 is LED 0, bit 1 LED 1, bit 2 LED 2;
        /// the others go off (0: all off, 7: all on)
        #[arg(value_parser = clap::value_parser!(u32).range(0..=7))]
        value: u32,
    },
}

fn known(d: &PciInfo) -> bool {
    EngineKind::for_ids(d.vendor, d.device).is_some()
}

/// One line saying what this machine lacks for VFIO.
fn vfio_status(sysfs: &Sysfs) -> String {
    let mut v = Vec::new();
    if !std::path::Path::new("/dev/vfio/vfio").exists() {
        v.push("VFIO is not loaded (/dev/vfio/vfio missing: `modprobe vfio-pci`)".to_string());
    }
    if sysfs.iommu_groups().unwrap_or_default().is_empty() {
        v.push(
            "the IOMMU is off (no IOMMU groups: enable VT-d/AMD-Vi and boot with intel_iommu=on or amd_iommu=on)"
                .to_string(),
        );
    }
    if v.is_empty() {
        "VFIO and the IOMMU are available".into()
    } else {
        v.join("; ")
    }
}

fn pick_device(args: &DmaArgs, sysfs: &Sysfs) -> Result<Bdf, String> {
    if let Some(d) = &args.device {
        return d.trim().parse::<Bdf>().map_err(|e| e.to_string());
    }
    sysfs
        .devices()
        .unwrap_or_default()
        .into_iter()
        .find(known)
        .map(|d| d.bdf)
        .ok_or_else(|| {
            format!(
            "no DMA device found: no XDMA (10de:0001) or edu (1234:11e8) device on this machine \
             (pass --device DDDD:BB:DD.F); {}",
            vfio_status(sysfs)
        )
        })
}

/// Turns open errors into one line that says what to do.
fn explain(e: DmaError, addr: &Bdf) -> String {
    match e {
        DmaError::NotBound { .. } | DmaError::NoIommu { .. } | DmaError::GroupNotViable { .. } => {
            e.to_string()
        }
        DmaError::NoVfio => format!(
            "{e}; then bind {addr}: {}",
            bind_hint(addr, None).replace("modprobe vfio-pci; ", "")
        ),
        DmaError::Sys { .. } => format!("{e} (are you root, and is {addr} bound to vfio-pci?)"),
        _ => e.to_string(),
    }
}

fn open(args: &DmaArgs) -> Result<Session, String> {
    let sysfs = Sysfs::default();
    let addr = pick_device(args, &sysfs)?;
    let opts = OpenOptions {
        engine: match args.engine {
            Engine::Auto => EngineKind::Auto,
            Engine::Xdma => EngineKind::Xdma,
            Engine::Edu => EngineKind::Edu,
        },
        interrupts: !args.poll,
        device_memory: args.ram_size,
        ..OpenOptions::default()
    };
    Session::open(&addr, &opts).map_err(|e| explain(e, &addr))
}

pub fn run(args: DmaArgs) -> CmdResult {
    match &args.action {
        Action::Info => info(&args),
        Action::Copy {
            size,
            peer,
            peer_bar,
            peer_offset,
        } => copy(&args, *size, peer.as_deref(), *peer_bar, *peer_offset),
        Action::H2c { sizes } => timing(&args, true, sizes),
        Action::C2h { sizes } => timing(&args, false, sizes),
        Action::Leds { value } => leds(&args, *value),
    }
}

/// What `gdr dma info --json` prints.
#[derive(Serialize)]
struct InfoJson {
    found: bool,
    /// The device asked for (`--device`) or found.
    device: Option<String>,
    /// Why nothing could be opened (`found` false).
    error: Option<String>,
    /// What this machine lacks for VFIO, or that it has it.
    vfio: String,
    vendor: Option<String>,
    subsystem: Option<String>,
    class: Option<String>,
    engine: Option<&'static str>,
    iommu_group: Option<u32>,
    /// Non-empty BARs: (index, size in bytes).
    bars: Vec<(usize, u64)>,
    device_memory: Option<u64>,
    max_segments: Option<usize>,
    max_segment: Option<u64>,
    align: Option<u64>,
    completion: &'static str,
    iova_limit: Option<u64>,
    iova_ranges: Vec<(u64, u64)>,
    leds_lit: Option<u32>,
}

fn info(args: &DmaArgs) -> CmdResult {
    let completion = if args.poll {
        "polling"
    } else {
        "interrupt (eventfd)"
    };
    let s = match open(args) {
        Ok(s) => s,
        Err(e) if args.json => {
            let j = InfoJson {
                found: false,
                device: args.device.clone(),
                error: Some(e.clone()),
                vfio: vfio_status(&Sysfs::default()),
                vendor: None,
                subsystem: None,
                class: None,
                engine: None,
                iommu_group: None,
                bars: Vec::new(),
                device_memory: None,
                max_segments: None,
                max_segment: None,
                align: None,
                completion,
                iova_limit: None,
                iova_ranges: Vec::new(),
                leds_lit: None,
            };
            println!("{}", serde_json::to_string_pretty(&j)?);
            // The same failure (one line on stderr, exit 2) as without --json.
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let i = s.info();
    let l = s.engine.limits();
    let bars: Vec<(usize, u64)> = s
        .device
        .bar_sizes()
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, n)| n > 0)
        .collect();
    if args.json {
        let j = InfoJson {
            found: true,
            device: Some(i.bdf.to_string()),
            error: None,
            vfio: vfio_status(&Sysfs::default()),
            vendor: Some(format!("{:04x}:{:04x}", i.vendor, i.device)),
            subsystem: Some(format!(
                "{:04x}:{:04x}",
                i.subsystem_vendor, i.subsystem_device
            )),
            class: Some(format!("{:06x}", i.class)),
            engine: Some(s.engine.name()),
            iommu_group: i.iommu_group,
            bars,
            device_memory: Some(l.device_memory),
            max_segments: Some(l.max_segments),
            max_segment: Some(l.max_segment),
            align: Some(l.align),
            completion,
            iova_limit: Some(s.space.limit()),
            iova_ranges: s.iova_ranges().to_vec(),
            leds_lit: s.leds.as_ref().map(|l| l.get()),
        };
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "device:        {} ({:04x}:{:04x}, subsystem {:04x}:{:04x}, class {:06x})",
        i.bdf, i.vendor, i.device, i.subsystem_vendor, i.subsystem_device, i.class
    );
    println!("engine:        {}", s.engine.name());
    println!(
        "IOMMU group:   {}",
        i.iommu_group.map(|g| g.to_string()).unwrap_or_default()
    );
    let bars: Vec<String> = bars.iter().map(|(k, n)| format!("BAR{k} {n:#x}")).collect();
    println!("BARs:          {}", bars.join(", "));
    println!("device memory: {} bytes", l.device_memory);
    println!(
        "descriptors:   up to {} per submission, {} bytes each, alignment {}",
        l.max_segments, l.max_segment, l.align
    );
    println!("completion:    {completion}");
    let ranges: Vec<String> = s
        .iova_ranges()
        .iter()
        .map(|(a, b)| format!("{a:#x}-{b:#x}"))
        .collect();
    println!(
        "IOVA window:   below {:#x}; usable ranges {}",
        s.space.limit(),
        ranges.join(", ")
    );
    if let Some(leds) = &s.leds {
        println!("LEDs lit:      {:#x}", leds.get());
    }
    Ok(ExitCode::SUCCESS)
}

fn copy(
    args: &DmaArgs,
    size: u64,
    peer: Option<&str>,
    peer_bar: Option<u32>,
    peer_offset: u64,
) -> CmdResult {
    if size == 0 || !size.is_multiple_of(4) {
        return Err(format!("--size {size}: must be a positive multiple of 4").into());
    }
    let mut s = open(args)?;
    let words = (size / 4) as usize;
    let src = s.space.alloc_buffer(size as usize, "copy-src")?;
    let dst = s.space.alloc_buffer(size as usize, "copy-dst")?;
    src.write_u32s(0, &surface(words))?;
    dst.write_u32s(0, &poison(words))?;
    let mut stats = gdr_dma::TransferStats::default();
    let how = match peer {
        None => {
            stats.add(&Copier::new(s.engine.as_mut(), &s.space).copy(
                &Endpoint::iova(src.range()),
                &Endpoint::iova(dst.range()),
                size,
            )?);
            "host -> device -> host".to_string()
        }
        Some(p) => {
            let paddr: Bdf = p.trim().parse()?;
            let pd = s.open_peer(&paddr).map_err(|e| explain(e, &paddr))?;
            let index = match peer_bar {
                Some(b) => b,
                None => {
                    let sizes = pd.bar_sizes();
                    let best = (0..6u32)
                        .filter(|&k| pd.region(k).is_ok_and(|r| r.mappable()))
                        .max_by_key(|&k| sizes[k as usize]);
                    best.ok_or_else(|| format!("{paddr} has no mappable BAR"))?
                }
            };
            let bar = pd.map_bar(index)?;
            if peer_offset
                .checked_add(size)
                .is_none_or(|e| e > bar.size() as u64)
            {
                return Err(format!(
                    "{paddr} BAR{index} has {:#x} bytes, too small for {size:#x} at offset {peer_offset:#x}",
                    bar.size()
                )
                .into());
            }
            // SAFETY: `pm` is dropped at the end of this block, before `bar`.
            let pm = unsafe { s.space.map(&bar, "peer BAR")? };
            let window = pm.range().slice(peer_offset, size)?;
            let mut c = Copier::new(s.engine.as_mut(), &s.space);
            stats.add(&c.copy(&Endpoint::iova(src.range()), &Endpoint::iova(window), size)?);
            stats.add(&c.copy(&Endpoint::iova(window), &Endpoint::iova(dst.range()), size)?);
            format!("host -> device -> {paddr} BAR{index} -> device -> host")
        }
    };
    let mut got = vec![0u32; words];
    dst.read_u32s(0, &mut got)?;
    let (first, bad) = check_surface(&got, 4);
    if bad > 0 {
        let list: Vec<String> = first
            .iter()
            .map(|(i, w, g)| format!("[{i}] want {w:#010x} got {g:#010x}"))
            .collect();
        return Err(format!(
            "{bad} of {words} words wrong after {how}: {}",
            list.join(", ")
        )
        .into());
    }
    let dma_us = stats.elapsed.as_secs_f64() * 1e6;
    if args.json {
        let j = serde_json::json!({
            "verified_bytes": size,
            "path": how,
            "engine": s.engine.name(),
            "submissions": stats.submissions,
            "descriptors": stats.descriptors,
            "interrupts": stats.interrupts,
            "dma_us": dma_us,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "verified {size} bytes ({how}) with {}: {} submissions, {} descriptors, {} interrupts, {dma_us:.0} us of DMA",
        s.engine.name(),
        stats.submissions,
        stats.descriptors,
        stats.interrupts,
    );
    Ok(ExitCode::SUCCESS)
}

/// One timed transfer size, for `h2c`/`c2h --json`.
#[derive(Serialize)]
struct TimingRow {
    bytes: u64,
    descriptors: usize,
    usecs: f64,
    mb_per_s: f64,
}

fn timing(args: &DmaArgs, h2c: bool, sizes: &[u64]) -> CmdResult {
    let mut s = open(args)?;
    let l = s.engine.limits();
    let full = l.device_memory.min(100 << 20);
    let sizes: Vec<u64> = if sizes.is_empty() {
        std::iter::successors(Some(4096u64), |&n| Some(n * 4))
            .take_while(|&n| n <= full)
            .collect()
    } else {
        sizes.to_vec()
    };
    // Every size checked before anything is timed: a bad one fails at once, not mid-table.
    if let Some(n) = sizes
        .iter()
        .find(|&&n| n == 0 || n > full || n % l.align != 0)
    {
        return Err(format!("size {n}: must be 1..={full} and a multiple of {}", l.align).into());
    }
    let buf = s.space.alloc_buffer(full as usize, "perf")?;
    buf.write_u32s(0, &surface((full / 4) as usize))?;
    let mut run = |len: u64| -> Result<gdr_dma::TransferStats, DmaError> {
        let host = Endpoint::iova(buf.range().slice(0, len)?);
        let mut c = Copier::new(s.engine.as_mut(), &s.space);
        if h2c {
            c.copy(&host, &Endpoint::Device(0), len)
        } else {
            c.copy(&Endpoint::Device(0), &host, len)
        }
    };
    let mbps = |bytes: u64, us: f64| if us > 0.0 { bytes as f64 / us } else { 0.0 };
    let st = run(full)?;
    let us = st.elapsed.as_secs_f64() * 1e6;
    let whole = TimingRow {
        bytes: st.bytes,
        descriptors: st.descriptors,
        usecs: us,
        mb_per_s: mbps(st.bytes, us),
    };
    if !args.json {
        println!(
            "Bytes:{} usecs:{:.0} MB/s:{:.3}",
            whole.bytes, whole.usecs, whole.mb_per_s
        );
        println!(
            "{:>12} {:>6} {:>12} {:>10}",
            "bytes", "descs", "usecs", "MB/s"
        );
    }
    let mut rows = Vec::new();
    for &n in &sizes {
        let reps = 3;
        let mut best = f64::MAX;
        let mut descs = 0;
        for _ in 0..reps {
            let st = run(n)?;
            best = best.min(st.elapsed.as_secs_f64() * 1e6);
            descs = st.descriptors;
        }
        let row = TimingRow {
            bytes: n,
            descriptors: descs,
            usecs: best,
            mb_per_s: mbps(n, best),
        };
        if !args.json {
            println!(
                "{:>12} {:>6} {:>12.1} {:>10.3}",
                row.bytes, row.descriptors, row.usecs, row.mb_per_s
            );
        }
        rows.push(row);
    }
    if args.json {
        let j = serde_json::json!({
            "direction": if h2c { "h2c" } else { "c2h" },
            "engine": s.engine.name(),
            "device_memory": l.device_memory,
            "whole": whole,
            "best_of_3": rows,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn leds(args: &DmaArgs, value: u32) -> CmdResult {
    let s = open(args)?;
    let leds = s.leds.as_ref().ok_or_else(|| {
        format!(
            "{} has no LEDs: `leds` needs an XDMA (picoevb) board",
            s.engine.name()
        )
    })?;
    leds.set(value)?;
    if args.json {
        let j = serde_json::json!({ "leds_lit": leds.get(), "gpio": !value & 7 });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!("LEDs lit: {:#x} (GPIO <- {:#x})", leds.get(), !value & 7);
    }
    Ok(ExitCode::SUCCESS)
}
