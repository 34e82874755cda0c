//! What this machine has for gdr, and which CPU-mapping backends work here (and why not): the
//! data behind `gdr info`, for any front end (the CLI prints it, the Python package returns it
//! as a dict). Gathering never fails: what fails is reported inside, and the `missing` list
//! ([`missing`]) names every library that did not load and every backend that does not work,
//! with why.

use crate::bar::{GdrDrv, PinBackend, Pinner, VulkanBackend, BACKEND_ENV};
use crate::cuda::host::Host;
use crate::cuda::{self, Attribute, Context, CudaError, Device, DeviceMemory};
use serde::Serialize;

/// Everything `gdr info` reports about this machine ([`gather`] fills it). Each library or
/// module is a pair: its version when it loaded, else the error that says why not.
#[derive(Serialize, Default)]
pub struct Info {
    /// The CUDA driver's version, `major.minor` (`cuDriverGetVersion`), when libcuda loaded.
    pub cuda_driver: Option<String>,
    /// Why libcuda did not load, or (with `cuda_driver` set) why the GPUs could not be counted.
    pub cuda_error: Option<String>,
    /// Whether libcuda.so.1 loaded, whether or not `cuInit` then succeeded: with it loaded and
    /// no `cuda_driver`, the driver is installed but could not start.
    pub cuda_loaded: bool,
    /// The device nodes whose absence made `cuInit` fail (`/dev/nvidia-uvm`, say;
    /// [`CudaError::MissingNodes`]); empty otherwise.
    pub missing_nodes: Vec<String>,
    /// Why this looks like a container ([`Host::container`]: `/.dockerenv exists`, say), or
    /// `None`. The fixes named for a missing ICD or device node depend on it.
    pub container: Option<String>,
    /// The NVIDIA kernel driver's version as NVML reports it (`580.159.04`, say).
    pub nvml_driver: Option<String>,
    /// Why NVML did not load or answer.
    pub nvml_error: Option<String>,
    /// NVRTC's version, `major.minor` (`nvrtcVersion`).
    pub nvrtc: Option<String>,
    /// Why NVRTC did not load.
    pub nvrtc_error: Option<String>,
    /// The Vulkan loader's instance version (both Vulkan backends need the loader).
    pub vulkan_loader: Option<String>,
    /// Why the Vulkan loader did not load or answer.
    pub vulkan_loader_error: Option<String>,
    /// The NVIDIA GPUs the Vulkan loader lists through the NVIDIA ICD, with the driver's version
    /// (asked without CUDA, so a missing ICD shows even where no GPU opens).
    pub vulkan_icd: Option<String>,
    /// Why the loader lists no NVIDIA GPU ([`crate::bar::BarError::NoIcd`], which names the fix
    /// for a container or a host); `None` too when the loader itself is missing.
    pub vulkan_icd_error: Option<String>,
    /// The gdrdrv kernel module's version (`/dev/gdrdrv`), for the gdrdrv pinning backend.
    pub gdrdrv: Option<String>,
    /// Why `/dev/gdrdrv` did not open ([`crate::bar::GdrDrvError`], as text).
    pub gdrdrv_error: Option<String>,
    /// Every GPU the CUDA driver lists, in CUDA's device order; empty without a driver.
    pub gpus: Vec<Gpu>,
    /// What is missing for gdr to work, and how to get it: every library that did not load and
    /// every mapping backend that does not work, each with why.
    pub missing: Vec<String>,
}

/// One GPU as `gdr info` reports it: CUDA's attributes, NVML's BAR1 and link details, and
/// which mapping backends work on it.
#[derive(Serialize, Default)]
pub struct Gpu {
    /// The CUDA device ordinal.
    pub index: usize,
    /// The product name (`cuDeviceGetName`); empty if CUDA would not say.
    pub name: String,
    /// The PCI address, `dddd:bb:dd.0` in lower case, from CUDA's PCI domain, bus and device
    /// attributes (NVML's details are matched by it); empty if CUDA would not say.
    pub bus_id: String,
    /// The compute capability, `major.minor` (`9.0` on an H100).
    pub compute_capability: String,
    /// Total device memory in bytes (`cuDeviceTotalMem`).
    pub memory_bytes: usize,
    /// Size of the BAR1 aperture in bytes (NVML): how much GPU memory can be mapped for the
    /// CPU and other devices at once. `None` without NVML or the GPU in NVML's list.
    pub bar1_total: Option<u64>,
    /// Bytes of BAR1 mapped now, by every process (NVML).
    pub bar1_used: Option<u64>,
    /// The PCIe link now and at most, `gen5 x16 (max gen5 x16)` (NVML); `None` when NVML does
    /// not say.
    pub pcie: Option<String>,
    /// Active NVLinks, from NVML: direct GPU links and links into an NVSwitch fabric.
    pub nvlink: Option<crate::nvml::NvLinks>,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`: other devices may reach this GPU's
    /// memory through `nvidia_p2p_get_pages` (what gdrdrv and peer-memory drivers use).
    pub gpudirect_rdma: bool,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: `cuMemGetHandleForAddressRange` can export
    /// dma-bufs (the dma-buf backend and [`crate::peer::DmaBuf`]).
    pub dma_buf: bool,
    /// `CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED`: `cuMemHostRegister` can pin host memory.
    pub host_register: bool,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`: `cuMemCreate` and friends
    /// work (the Vulkan pinning backend and gdr's allocator need them).
    pub vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`: a mask of
    /// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_*` (1 host, 2 memops); 0 when unknown.
    pub rdma_flush_writes_options: i32,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`: 0 none, 100 the owning GPU
    /// sees RDMA writes in order, 200 all devices do.
    pub rdma_writes_ordering: i32,
    /// One row per mapping backend, each proven or refused on this GPU: `vulkan`,
    /// `pin-gdrdrv`, `pin-dmabuf`, `pin-vulkan`, then `pin-auto` (the one a [`Pinner`] picks).
    pub backends: Vec<Backend>,
}

/// Whether one mapping backend works on one GPU, and why (not).
#[derive(Serialize)]
pub struct Backend {
    /// The row's name: `vulkan`, `pin-gdrdrv`, `pin-dmabuf`, `pin-vulkan` or `pin-auto`.
    pub name: &'static str,
    /// Whether the backend opened and its probe (a small allocation written and read back, or
    /// pinned and mapped) succeeded.
    pub usable: bool,
    /// What it found when usable (versions, the heap size), else the error.
    pub detail: String,
}

/// Gathers everything `gdr info` prints; never fails (what fails is reported inside).
pub fn gather() -> Info {
    let mut info = Info::default();
    match crate::nvml::driver_version() {
        Ok(v) => info.nvml_driver = Some(v),
        Err(e) => info.nvml_error = Some(e.to_string()),
    }
    match crate::cuda::nvrtc::version() {
        Ok((a, b)) => info.nvrtc = Some(format!("{a}.{b}")),
        Err(e) => info.nvrtc_error = Some(e.to_string()),
    }
    info.container = Host::this().container();
    match crate::bar::loader_version() {
        Ok(v) => {
            info.vulkan_loader = Some(v);
            match crate::bar::nvidia_icd() {
                Ok(g) => info.vulkan_icd = Some(g),
                Err(e) => info.vulkan_icd_error = Some(e.to_string()),
            }
        }
        Err(e) => info.vulkan_loader_error = Some(e.to_string()),
    }
    match GdrDrv::open() {
        Ok(d) => info.gdrdrv = Some(d.version().driver.to_string()),
        Err(e) => info.gdrdrv_error = Some(e.to_string()),
    }
    gather_gpus(&mut info);
    info.missing = missing(&info);
    info
}

fn gather_gpus(info: &mut Info) {
    let drv = match cuda::driver() {
        Ok(d) => d,
        Err(e) => {
            info.cuda_loaded = !matches!(e, CudaError::Load(_));
            if let CudaError::MissingNodes { nodes, .. } = &e {
                info.missing_nodes = nodes.clone();
            }
            info.cuda_error = Some(e.to_string());
            return;
        }
    };
    info.cuda_loaded = true;
    info.cuda_driver = Some(drv.version_string());
    let n = match Device::count() {
        Ok(n) => n,
        Err(e) => {
            info.cuda_error = Some(e.to_string());
            0
        }
    };
    let nvml_gpus = crate::nvml::gpus().unwrap_or_default();
    let nvlinks = crate::nvml::nvlink_report().unwrap_or_default();
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
            gpudirect_rdma: attr(Attribute::GpuDirectRdmaSupported) != 0,
            dma_buf: attr(Attribute::DmaBufSupported) != 0,
            host_register: attr(Attribute::HostRegisterSupported) != 0,
            vmm: attr(Attribute::VirtualMemoryManagementSupported) != 0,
            rdma_flush_writes_options: attr(Attribute::GpuDirectRdmaFlushWritesOptions),
            rdma_writes_ordering: attr(Attribute::GpuDirectRdmaWritesOrdering),
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
        info.gpus.push(g);
    }
}

/// The mapping backends `gdr info` accounts for: the name of each one's row in
/// [`Gpu::backends`], and how the "Missing:" list calls it.
const BACKENDS: [(&str, &str); 4] = [
    ("vulkan", "mapping backend vulkan (new BAR-mapped memory)"),
    ("pin-gdrdrv", "pinning backend gdrdrv"),
    ("pin-dmabuf", "pinning backend dmabuf"),
    ("pin-vulkan", "pinning backend vulkan"),
];

/// The "Missing:" list: each library that did not load and each backend that works on no GPU
/// (or not on every GPU), with why. Derived from the rest of `info` only.
pub fn missing(info: &Info) -> Vec<String> {
    let mut out = Vec::new();
    match (&info.cuda_driver, &info.cuda_error) {
        (None, Some(e)) => out.push(format!("CUDA driver: {e}")),
        (Some(_), Some(e)) => out.push(format!("a usable GPU: {e}")),
        _ if info.gpus.is_empty() => out.push("a GPU: the CUDA driver sees none".into()),
        _ => {}
    }
    if let Some(e) = &info.nvml_error {
        out.push(format!("NVML (BAR1, PCIe and NVLink details): {e}"));
    }
    if let Some(e) = &info.nvrtc_error {
        out.push(format!(
            "NVRTC (the GPU kernels of pplat, mq and serve): {e}"
        ));
    }
    if let Some(e) = &info.vulkan_loader_error {
        out.push(format!("Vulkan loader (both vulkan backends): {e}"));
    }
    if let Some(e) = &info.vulkan_icd_error {
        out.push(format!("NVIDIA Vulkan ICD (both vulkan backends): {e}"));
    }
    if info.gpus.is_empty() {
        // Nothing to probe the backends on: say what each one lacks on this machine.
        let no_gpu = if !info.missing_nodes.is_empty() {
            format!(
                "needs {} (missing, see the CUDA driver line)",
                info.missing_nodes.join(", ")
            )
        } else if info.cuda_driver.is_none() && info.cuda_loaded {
            "needs a GPU (the CUDA driver did not start)".to_string()
        } else if info.cuda_driver.is_none() {
            "needs a GPU (the CUDA driver did not load)".to_string()
        } else {
            "needs a GPU (the CUDA driver sees none)".to_string()
        };
        let loader = if info.vulkan_loader_error.is_some() {
            " and the Vulkan loader (missing)"
        } else if info.vulkan_icd_error.is_some() {
            " and the NVIDIA Vulkan ICD (missing)"
        } else {
            ""
        };
        for (row, label) in BACKENDS {
            let why = match row {
                "pin-gdrdrv" => match &info.gdrdrv_error {
                    Some(e) => format!("{no_gpu}; {e}"),
                    None => no_gpu.clone(),
                },
                "pin-dmabuf" => {
                    format!("{no_gpu}, and CUDA driver 13.3+ for dma-buf mmap on discrete GPUs")
                }
                _ => format!("{no_gpu}{loader}"),
            };
            out.push(format!("{label}: {why}"));
        }
        return out;
    }
    // A backend that fails for a library listed above says so instead of repeating the
    // library's reason (each reason once).
    let libraries = [
        ("the CUDA driver", &info.cuda_error),
        ("NVML", &info.nvml_error),
        ("NVRTC", &info.nvrtc_error),
        ("the Vulkan loader", &info.vulkan_loader_error),
        ("the NVIDIA Vulkan ICD", &info.vulkan_icd_error),
    ];
    for (row, label) in BACKENDS {
        // GPUs on which the backend does not work, grouped by why.
        let mut why: Vec<(String, Vec<usize>)> = Vec::new();
        for g in &info.gpus {
            let detail = match g.backends.iter().find(|b| b.name == row) {
                Some(b) if b.usable => continue,
                Some(b) => b.detail.clone(),
                None => "not probed".to_string(),
            };
            let detail = match libraries.iter().find(|(_, e)| {
                e.as_ref()
                    .is_some_and(|e| !e.is_empty() && detail.contains(e.as_str()))
            }) {
                Some((lib, _)) => format!("needs {lib} (missing, see above)"),
                None => detail,
            };
            match why.iter_mut().find(|(d, _)| *d == detail) {
                Some((_, gpus)) => gpus.push(g.index),
                None => why.push((detail, vec![g.index])),
            }
        }
        for (detail, gpus) in why {
            if gpus.len() == info.gpus.len() {
                out.push(format!("{label}: {detail}"));
            } else {
                let list: Vec<String> = gpus.iter().map(|i| i.to_string()).collect();
                out.push(format!("{label} on GPU {}: {detail}", list.join(", ")));
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine of the issue: no driver, no NVML, no NVRTC, no Vulkan loader, no gdrdrv.
    fn bare_machine() -> Info {
        Info {
            cuda_error: Some("no libcuda.so.1 here".into()),
            nvml_error: Some("no libnvidia-ml.so.1 here".into()),
            nvrtc_error: Some("no libnvrtc.so here".into()),
            vulkan_loader_error: Some("no libvulkan.so.1 here".into()),
            gdrdrv_error: Some("no /dev/gdrdrv here".into()),
            ..Default::default()
        }
    }

    fn line<'a>(missing: &'a [String], prefix: &str) -> &'a str {
        missing
            .iter()
            .find(|m| m.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {missing:#?}"))
    }

    #[test]
    fn a_bare_machine_lists_every_library_and_backend_with_why() {
        let m = missing(&bare_machine());
        assert!(line(&m, "CUDA driver: ").contains("no libcuda.so.1 here"));
        assert!(line(&m, "NVML ").contains("no libnvidia-ml.so.1 here"));
        assert!(line(&m, "NVRTC ").contains("no libnvrtc.so here"));
        assert!(line(&m, "Vulkan loader ").contains("no libvulkan.so.1 here"));
        let gdrdrv = line(&m, "pinning backend gdrdrv: ");
        assert!(gdrdrv.contains("CUDA driver") && gdrdrv.contains("no /dev/gdrdrv here"));
        assert!(line(&m, "pinning backend dmabuf: ").contains("13.3"));
        for vk in ["pinning backend vulkan: ", "mapping backend vulkan "] {
            let l = line(&m, vk);
            assert!(
                l.contains("CUDA driver") && l.contains("Vulkan loader"),
                "{l}"
            );
        }
        assert_eq!(m.len(), 8, "{m:#?}");
    }

    #[test]
    fn what_is_there_is_not_listed_as_missing() {
        let info = Info {
            cuda_driver: Some("13.0".into()),
            nvml_driver: Some("580.1".into()),
            nvrtc: Some("13.0".into()),
            vulkan_loader: Some("1.3.275".into()),
            gdrdrv: Some("2.5".into()),
            ..Default::default()
        };
        let m = missing(&info);
        assert_eq!(m[0], "a GPU: the CUDA driver sees none");
        for absent in ["CUDA driver:", "NVML", "NVRTC", "Vulkan loader"] {
            assert!(!m.iter().any(|l| l.starts_with(absent)), "{absent}: {m:#?}");
        }
        // With the libraries there, a backend lacks only the GPU.
        let l = line(&m, "pinning backend vulkan: ");
        assert!(!l.contains("Vulkan loader"), "{l}");
    }

    fn gpu(index: usize, rows: &[(&'static str, bool, &str)]) -> Gpu {
        Gpu {
            index,
            backends: rows
                .iter()
                .map(|&(name, usable, detail)| Backend {
                    name,
                    usable,
                    detail: detail.into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn backends_are_listed_once_per_reason_naming_the_gpus_only_when_not_all() {
        let info = Info {
            cuda_driver: Some("13.0".into()),
            nvml_driver: Some("580.1".into()),
            nvrtc: Some("13.0".into()),
            vulkan_loader: Some("1.3.275".into()),
            gpus: vec![
                gpu(
                    0,
                    &[
                        ("vulkan", true, "usable"),
                        ("pin-gdrdrv", false, "module not loaded"),
                        ("pin-dmabuf", true, "works"),
                        ("pin-vulkan", false, "import refused"),
                        ("pin-auto", true, "dmabuf"),
                    ],
                ),
                gpu(
                    1,
                    &[
                        ("vulkan", true, "usable"),
                        ("pin-gdrdrv", false, "module not loaded"),
                        ("pin-dmabuf", false, "errno 524"),
                        ("pin-vulkan", false, "not in the ICD"),
                        ("pin-auto", false, "none"),
                    ],
                ),
            ],
            ..Default::default()
        };
        let m = missing(&info);
        assert_eq!(
            m,
            [
                "pinning backend gdrdrv: module not loaded",
                "pinning backend dmabuf on GPU 1: errno 524",
                "pinning backend vulkan on GPU 0: import refused",
                "pinning backend vulkan on GPU 1: not in the ICD",
            ]
        );
    }

    /// A container started without /dev/nvidia-uvm: cuInit fails, and every backend names the
    /// node instead of "the CUDA driver did not load".
    #[test]
    fn a_missing_node_is_named_instead_of_a_missing_driver() {
        let d = tempfile::tempdir().unwrap();
        for f in [".dockerenv", "dev/nvidiactl", "dev/nvidia0"] {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        let no_env: [(&str, &str); 0] = [];
        let host = Host::at(d.path(), no_env);
        let init = CudaError::Driver {
            call: "cuInit",
            code: 999,
            name: "CUDA_ERROR_UNKNOWN".into(),
            text: "unknown error".into(),
        };
        let err = cuda::explain_init(init, &host);
        let info = Info {
            cuda_error: Some(err.to_string()),
            cuda_loaded: true,
            missing_nodes: vec!["/dev/nvidia-uvm".into()],
            container: host.container(),
            nvml_driver: Some("580.1".into()),
            nvrtc: Some("13.0".into()),
            vulkan_loader: Some("1.3.275".into()),
            vulkan_icd: Some("NVIDIA H100 (driver 580.159)".into()),
            gdrdrv_error: Some("no /dev/gdrdrv here".into()),
            ..Default::default()
        };
        let m = missing(&info);
        let cuda = line(&m, "CUDA driver: ");
        assert!(
            cuda.contains("/dev/nvidia-uvm is missing: this container (/.dockerenv exists)")
                && cuda.contains("--device /dev/nvidia-uvm"),
            "{cuda}"
        );
        for b in [
            "mapping backend vulkan (new BAR-mapped memory): ",
            "pinning backend vulkan: ",
        ] {
            assert_eq!(
                line(&m, b),
                format!("{b}needs /dev/nvidia-uvm (missing, see the CUDA driver line)")
            );
        }
        assert!(!m.iter().any(|l| l.contains("did not load")), "{m:#?}");
    }

    /// A GPU whose container has no ICD: the ICD's line names the capability once, and the
    /// vulkan backends point at it.
    #[test]
    fn a_missing_icd_is_listed_once_with_its_fix() {
        let icd = crate::bar::BarError::NoIcd {
            why: "vkCreateInstance: no compatible Vulkan driver".into(),
            container: Some("container=podman".into()),
        }
        .to_string();
        let info = Info {
            cuda_driver: Some("13.0".into()),
            cuda_loaded: true,
            nvml_driver: Some("580.1".into()),
            nvrtc: Some("13.0".into()),
            vulkan_loader: Some("1.3.275".into()),
            vulkan_icd_error: Some(icd.clone()),
            gpus: vec![gpu(
                0,
                &[
                    ("vulkan", false, &icd),
                    ("pin-gdrdrv", false, "no /dev/gdrdrv"),
                    ("pin-dmabuf", false, "needs CUDA 13.3"),
                    ("pin-vulkan", false, &format!("vulkan: {icd}")),
                    ("pin-auto", false, "none"),
                ],
            )],
            ..Default::default()
        };
        let m = missing(&info);
        let l = line(&m, "NVIDIA Vulkan ICD (both vulkan backends): ");
        assert!(
            l.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics")
                && l.contains("VK_DRIVER_FILES"),
            "{l}"
        );
        for b in [
            "mapping backend vulkan (new BAR-mapped memory): ",
            "pinning backend vulkan: ",
        ] {
            assert_eq!(
                line(&m, b),
                format!("{b}needs the NVIDIA Vulkan ICD (missing, see above)")
            );
        }
    }

    /// On whatever machine runs the tests: every library and backend is either there or in the
    /// "Missing:" list with a reason (here, without a GPU, the bare-machine case for real).
    #[test]
    fn gather_accounts_for_every_library_and_backend() {
        let info = gather();
        let m = &info.missing;
        let has = |prefix: &str| {
            m.iter()
                .any(|l| l.starts_with(prefix) && l.len() > prefix.len() + 2)
        };
        assert!(
            info.cuda_driver.is_some() && info.cuda_error.is_none()
                || has("CUDA driver: ")
                || has("a usable GPU: "),
            "{m:#?}"
        );
        assert!(info.nvml_driver.is_some() || has("NVML "), "{m:#?}");
        assert!(info.nvrtc.is_some() || has("NVRTC "), "{m:#?}");
        assert!(
            info.vulkan_loader.is_some() || has("Vulkan loader "),
            "{m:#?}"
        );
        assert!(info.gdrdrv.is_some() != info.gdrdrv_error.is_some());
        for (row, label) in BACKENDS {
            let everywhere = !info.gpus.is_empty()
                && info
                    .gpus
                    .iter()
                    .all(|g| g.backends.iter().any(|b| b.name == row && b.usable));
            assert!(everywhere || has(label), "{label}: {m:#?}");
        }
    }
}
