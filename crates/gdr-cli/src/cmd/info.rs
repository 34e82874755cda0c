//! `gdr info`: what this machine has, and which mapping backends work here (and why not).
//! The facts are gathered by `gdr::info`; this module prints them.

use super::CmdResult;
use gdr::info::{gather, Info};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

pub fn print(info: &Info) {
    println!(
        "CUDA driver:  {}",
        info.cuda_driver.clone().unwrap_or_else(|| format!(
            "not available: {}",
            info.cuda_error.clone().unwrap_or_default()
        ))
    );
    println!(
        "NVIDIA driver: {}",
        info.nvml_driver.clone().unwrap_or_else(|| format!(
            "NVML not available: {}",
            info.nvml_error.clone().unwrap_or_default()
        ))
    );
    println!(
        "NVRTC:        {}",
        info.nvrtc.clone().unwrap_or_else(|| format!(
            "not available: {}",
            info.nvrtc_error.clone().unwrap_or_default()
        ))
    );
    println!(
        "Vulkan loader: {}",
        info.vulkan_loader.clone().unwrap_or_else(|| format!(
            "not available: {}",
            info.vulkan_loader_error.clone().unwrap_or_default()
        ))
    );
    println!(
        "gdrdrv:       {}",
        info.gdrdrv.as_ref().map_or_else(
            || format!(
                "not available: {}",
                info.gdrdrv_error.clone().unwrap_or_default()
            ),
            |v| format!("driver {v}")
        )
    );
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
            println!(
                "    {:<10} {}  {}",
                b.name,
                if b.usable { "yes" } else { "no " },
                b.detail
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

pub fn run(args: Args) -> CmdResult {
    let info = gather();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print(&info);
    }
    Ok(ExitCode::SUCCESS)
}
