//! `gdr info`: what this machine has, and which mapping backends work here (and why not).
//! The facts are gathered by `gdr::info`; this module prints them.

use super::CmdResult;
use gdr::info::{gather, Info};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// What a status line says of something that is not there: the reason, unless the Missing
/// list below gives it already (each reason is printed once).
fn absent(info: &Info, prefix: &str, why: Option<&String>) -> String {
    match why {
        Some(w) if !w.is_empty() && info.missing.iter().any(|m| m.contains(w.as_str())) => {
            format!("{prefix} (why: under Missing below)")
        }
        Some(w) => format!("{prefix}: {w}"),
        None => prefix.to_string(),
    }
}

pub fn print(info: &Info) {
    let na = "not available";
    println!(
        "CUDA driver:  {}",
        info.cuda_driver
            .clone()
            .unwrap_or_else(|| absent(info, na, info.cuda_error.as_ref()))
    );
    println!(
        "NVIDIA driver: {}",
        info.nvml_driver.clone().unwrap_or_else(|| absent(
            info,
            "NVML not available",
            info.nvml_error.as_ref()
        ))
    );
    println!(
        "NVRTC:        {}",
        info.nvrtc
            .clone()
            .unwrap_or_else(|| absent(info, na, info.nvrtc_error.as_ref()))
    );
    println!(
        "Vulkan loader: {}",
        info.vulkan_loader.clone().unwrap_or_else(|| absent(
            info,
            na,
            info.vulkan_loader_error.as_ref()
        ))
    );
    // Asked only where the loader loaded: otherwise its line says why.
    if info.vulkan_loader.is_some() {
        println!(
            "Vulkan ICD:   {}",
            info.vulkan_icd.clone().unwrap_or_else(|| absent(
                info,
                "no NVIDIA GPU listed",
                info.vulkan_icd_error.as_ref()
            ))
        );
    }
    println!(
        "gdrdrv:       {}",
        info.gdrdrv.as_ref().map_or_else(
            || absent(info, na, info.gdrdrv_error.as_ref()),
            |v| format!("driver {v}")
        )
    );
    if let Some(why) = &info.container {
        println!("Container:    yes ({why})");
    }
    for g in &info.gpus {
        println!(
            "\nGPU {}: {} at {} (sm_{})",
            g.index,
            g.name,
            g.bus_id,
            g.compute_capability.replace('.', "")
        );
        println!("  memory       {}", gib(g.memory_bytes as u64));
        if let (Some(t), Some(u)) = (g.bar1_total, g.bar1_used) {
            println!("  BAR1         {} total, {} used", gib(t), gib(u));
        }
        if let Some(p) = &g.pcie {
            println!("  PCIe         {p}");
        }
        if let Some(l) = &g.nvlink {
            let direct: Vec<String> = l
                .to_gpu
                .iter()
                .map(|(b, n)| format!("{n} to {b}"))
                .collect();
            println!(
                "  NVLink       {} active: {} into an NVSwitch fabric{}{}",
                l.active,
                l.to_fabric,
                if direct.is_empty() { "" } else { ", " },
                direct.join(", ")
            );
        }
        println!(
            "  GPUDirect RDMA {}, dma-buf {}, host register {}, VMM {}, RDMA flush options {}, RDMA writes ordering {}",
            yes(g.gpudirect_rdma),
            yes(g.dma_buf),
            yes(g.host_register),
            yes(g.vmm),
            g.rdma_flush_writes_options,
            g.rdma_writes_ordering
        );
        println!("  CPU-mapping backends:");
        for b in &g.backends {
            // A backend that does not work: its reason once, under Missing, when it is there
            // (the line names it, or it names the reason of a line there).
            let listed = |m: &String| {
                let reason = m.split_once(": ").map_or(m.as_str(), |(_, r)| r);
                m.contains(&b.detail) || b.detail.contains(reason)
            };
            let detail = if !b.usable && info.missing.iter().any(listed) {
                "(why: under Missing below)"
            } else {
                b.detail.as_str()
            };
            println!(
                "    {:<10} {}  {detail}",
                b.name,
                if b.usable { "yes" } else { "no " },
            );
        }
    }
    if !info.missing.is_empty() {
        println!("\nMissing:");
        for m in &info.missing {
            println!("  - {m}");
        }
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub fn run(args: InfoArgs) -> CmdResult {
    let info = gather();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print(&info);
    }
    Ok(ExitCode::SUCCESS)
}
