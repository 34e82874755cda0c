//! `gdr info`: what this machine has, and which mapping backends work here (and why not).

use super::CmdResult;
use gdr::bar::pin::BACKEND_ENV;
use gdr::bar::{PinBackend, Pinner, VulkanBackend};
use gdr::cuda::{self, sys, Context, Device, DeviceMemory};
use serde::Serialize;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Default)]
pub struct Info {
    pub cuda_driver: Option<String>,
    pub cuda_error: Option<String>,
    pub nvml_driver: Option<String>,
    pub nvml_error: Option<String>,
    pub nvrtc: Option<String>,
    pub nvrtc_error: Option<String>,
    pub gpus: Vec<Gpu>,
    /// What is missing for gdr to work, and how to get it.
    pub missing: Vec<String>,
}

#[derive(Serialize, Default)]
pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub bus_id: String,
    pub compute_capability: String,
    pub memory_bytes: usize,
    pub bar1_total: Option<u64>,
    pub bar1_used: Option<u64>,
    pub pcie: Option<String>,
    /// Active NVLinks, from NVML: direct GPU links and links into an NVSwitch fabric.
    pub nvlink: Option<gdr::nvml::NvLinks>,
    pub gpudirect_rdma: bool,
    pub dma_buf: bool,
    pub host_register: bool,
    pub vmm: bool,
    pub rdma_flush_writes_options: i32,
    pub rdma_writes_ordering: i32,
    pub backends: Vec<Backend>,
}

#[derive(Serialize)]
pub struct Backend {
    pub name: &'static str,
    pub usable: bool,
    pub detail: String,
}

/// Gathers everything `gdr info` prints; never fails (what fails is reported inside).
pub fn gather() -> Info {
    let mut info = Info::default();
    match gdr::nvml::driver_version() {
        Ok(v) => info.nvml_driver = Some(v),
        Err(e) => info.nvml_error = Some(e.to_string()),
    }
    let nvml_gpus = gdr::nvml::gpus().unwrap_or_default();
    let nvlinks = gdr::nvml::nvlink_report().unwrap_or_default();
    match gdr::cuda::nvrtc::version() {
        Ok((a, b)) => info.nvrtc = Some(format!("{a}.{b}")),
        Err(e) => info.nvrtc_error = Some(e.to_string()),
    }
    let drv = match cuda::driver() {
        Ok(d) => d,
        Err(e) => {
            info.cuda_error = Some(e.to_string());
            info.missing.push(format!("CUDA driver: {e}"));
            return info;
        }
    };
    info.cuda_driver = Some(drv.version_string());
    let n = match Device::count() {
        Ok(n) => n,
        Err(e) => {
            info.cuda_error = Some(e.to_string());
            0
        }
    };
    if n == 0 {
        info.missing.push("a GPU: the CUDA driver sees none".into());
    }
    for i in 0..n {
        let Ok(dev) = Device::get(i) else { continue };
        let attr = |a| dev.attribute(a).unwrap_or(0);
        let mut g = Gpu {
            index: i,
            name: dev.name().unwrap_or_default(),
            bus_id: dev.pci_bus_id().unwrap_or_default(),
            compute_capability: dev
                .compute_capability()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_default(),
            memory_bytes: dev.total_mem().unwrap_or(0),
            gpudirect_rdma: attr(sys::ATTR_GPU_DIRECT_RDMA_SUPPORTED) != 0,
            dma_buf: attr(sys::ATTR_DMA_BUF_SUPPORTED) != 0,
            host_register: attr(sys::ATTR_HOST_REGISTER_SUPPORTED) != 0,
            vmm: attr(sys::ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0,
            rdma_flush_writes_options: attr(sys::ATTR_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS),
            rdma_writes_ordering: attr(sys::ATTR_GPU_DIRECT_RDMA_WRITES_ORDERING),
            ..Default::default()
        };
        if let Some(n) = nvml_gpus.iter().find(|n| n.bus_id == g.bus_id) {
            g.bar1_total = n.bar1_total;
            g.bar1_used = n.bar1_used;
            if let (Some(a), Some(b)) = (n.pcie_gen, n.pcie_width) {
                g.pcie = Some(format!(
                    "gen{a} x{b} (max gen{} x{})",
                    n.pcie_gen_max.unwrap_or(0),
                    n.pcie_width_max.unwrap_or(0)
                ));
            }
        }
        g.nvlink = nvlinks
            .iter()
            .find(|l| l.bus_id == g.bus_id && l.active > 0)
            .cloned();
        g.backends = backends(dev);
        if !g.backends.iter().any(|b| b.usable) {
            let why = g
                .backends
                .first()
                .map(|b| b.detail.clone())
                .unwrap_or_default();
            info.missing
                .push(format!("GPU {i}: no CPU-mapping backend works: {why}"));
        }
        info.gpus.push(g);
    }
    info
}

fn backends(dev: Device) -> Vec<Backend> {
    let mut out = Vec::new();
    let vulkan = (|| -> Result<String, Box<dyn std::error::Error>> {
        let ctx = Context::new(dev)?;
        let be = VulkanBackend::new(&ctx)?;
        // Prove the path end to end: a write through the mapping, read back by the GPU.
        let buf = be.alloc(64, 64)?;
        let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        buf.write(0, &pattern)?;
        let mut back = vec![0u8; 64];
        cuda::memcpy_dtoh(&mut back, &buf, 0)?;
        if back != pattern {
            return Err("data written through the mapping did not reach GPU memory".into());
        }
        let i = be.info();
        Ok(format!(
            "{} via Vulkan {} ({}), host-visible VRAM heap {:.1} GiB, device pointer {:#x}",
            "usable",
            i.api_version,
            i.device_name,
            i.heap_size as f64 / (1u64 << 30) as f64,
            buf.device_ptr()
        ))
    })();
    out.push(match vulkan {
        Ok(d) => Backend {
            name: "vulkan",
            usable: true,
            detail: d,
        },
        Err(e) => Backend {
            name: "vulkan",
            usable: false,
            detail: e.to_string(),
        },
    });
    // Pinning existing allocations: each backend proven or refused on a small allocation.
    match Context::new(dev) {
        Ok(ctx) => {
            for st in Pinner::probe_all(&ctx) {
                out.push(Backend {
                    name: pin_name(st.backend),
                    usable: st.usable,
                    detail: st.reason,
                });
            }
            let (usable, detail) = match Pinner::new(&ctx, None) {
                Ok(p) => (
                    true,
                    format!(
                        "{}: {} (override: {}=gdrdrv|dmabuf|vulkan)",
                        p.backend(),
                        p.reason(),
                        BACKEND_ENV
                    ),
                ),
                Err(e) => (false, e.to_string()),
            };
            out.push(Backend {
                name: "pin-auto",
                usable,
                detail,
            });
        }
        Err(e) => out.push(Backend {
            name: "pin-auto",
            usable: false,
            detail: e.to_string(),
        }),
    }
    out
}

fn pin_name(b: PinBackend) -> &'static str {
    match b {
        PinBackend::GdrDrv => "pin-gdrdrv",
        PinBackend::DmaBuf => "pin-dmabuf",
        PinBackend::Vulkan => "pin-vulkan",
    }
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
