//! NVML (`libnvidia-ml.so.1`), loaded at run time: BAR1 usage, PCIe link state and NVLink
//! peers — what CUDA does not report.

use crate::dylib::{self, api_table, LibrarySpec, LoadError};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// Errors from NVML.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NvmlError {
    /// NVML is not installed ([`LoadError::NotInstalled`]) or too old
    /// ([`LoadError::MissingSymbol`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An NVML call returned something other than `NVML_SUCCESS` (including `nvmlInit`: no
    /// driver loaded, or no permission).
    #[error("{call} failed: {text} ({code})")]
    Call {
        /// The entry point that failed, e.g. `nvmlDeviceGetCount`.
        call: &'static str,
        /// The raw `nvmlReturn_t`.
        code: i32,
        /// NVML's description of the code (`nvmlErrorString`).
        text: String,
    },
    /// A device count past [`MAX_DEVICES`](crate::MAX_DEVICES): a broken or fake NVML.
    #[error("{call} reported {value} devices, which no working driver reports")]
    Implausible {
        /// The call that reported it.
        call: &'static str,
        /// The count it reported.
        value: u64,
    },
}

type Ret = c_int;
type Dev = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Bar1Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlPciInfo_t` (v3 layout).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

const NVLINK_MAX_LINKS: c_uint = 18;
const NVLINK_DEVICE_TYPE_GPU: c_uint = 0;
const P2P_CAPS_INDEX_NVLINK: c_uint = 2;
const P2P_STATUS_OK: c_uint = 0;

api_table! {
    struct Api {
        init = "nvmlInit_v2"() -> Ret;
        error_string = "nvmlErrorString"(Ret) -> *const c_char;
        driver_version = "nvmlSystemGetDriverVersion"(*mut c_char, c_uint) -> Ret;
        count = "nvmlDeviceGetCount_v2"(*mut c_uint) -> Ret;
        by_index = "nvmlDeviceGetHandleByIndex_v2"(c_uint, *mut Dev) -> Ret;
        name = "nvmlDeviceGetName"(Dev, *mut c_char, c_uint) -> Ret;
        pci_info = "nvmlDeviceGetPciInfo_v3"(Dev, *mut PciInfo) -> Ret;
        bar1 = "nvmlDeviceGetBAR1MemoryInfo"(Dev, *mut Bar1Memory) -> Ret;
        curr_gen = "nvmlDeviceGetCurrPcieLinkGeneration"(Dev, *mut c_uint) -> Ret;
        curr_width = "nvmlDeviceGetCurrPcieLinkWidth"(Dev, *mut c_uint) -> Ret;
        max_gen = "nvmlDeviceGetMaxPcieLinkGeneration"(Dev, *mut c_uint) -> Ret;
        max_width = "nvmlDeviceGetMaxPcieLinkWidth"(Dev, *mut c_uint) -> Ret;
        nvlink_state = "nvmlDeviceGetNvLinkState"(Dev, c_uint, *mut c_int) -> Ret;
        nvlink_remote_pci = "nvmlDeviceGetNvLinkRemotePciInfo_v2"(Dev, c_uint, *mut PciInfo) -> Ret;
    }
    // Older drivers lack these. Without the first, every link whose remote end is not a GPU we
    // know counts as a fabric (NVSwitch) link; without the second, fabric peers count unconfirmed.
    optional {
        nvlink_remote_type = "nvmlDeviceGetNvLinkRemoteDeviceType"(Dev, c_uint, *mut c_uint) -> Ret;
        p2p_status = "nvmlDeviceGetP2PStatus"(Dev, Dev, c_uint, *mut c_uint) -> Ret;
    }
}

static API: OnceLock<Result<Api, NvmlError>> = OnceLock::new();

/// NVML as [`dylib`] names it in errors.
static LIBNVML: LibrarySpec = LibrarySpec {
    what: "NVML (libnvidia-ml.so.1)",
    install: "it ships with the NVIDIA driver (e.g. libnvidia-ml1 / nvidia-utils)",
    update: "the driver is too old",
};

fn load() -> Result<Api, NvmlError> {
    let lib = dylib::open(&LIBNVML, &["libnvidia-ml.so.1", "libnvidia-ml.so"])?;
    // SAFETY: the library is NVML; its symbols have the nvml.h signatures the table states.
    let api = unsafe { Api::resolve(lib) }?;
    // SAFETY: no arguments; may be called more than once.
    api.check("nvmlInit", unsafe { (api.init)() })?;
    Ok(api)
}

fn api() -> Result<&'static Api, NvmlError> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

impl Api {
    fn check(&self, call: &'static str, rc: Ret) -> Result<(), NvmlError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: nvmlErrorString returns a static string.
        let text = unsafe { CStr::from_ptr((self.error_string)(rc)) }
            .to_string_lossy()
            .into_owned();
        Err(NvmlError::Call {
            call,
            code: rc,
            text,
        })
    }

    fn uint(
        &self,
        call: &'static str,
        f: unsafe extern "C" fn(Dev, *mut c_uint) -> Ret,
        d: Dev,
    ) -> Option<u32> {
        let mut v = 0;
        // SAFETY: d is a live NVML handle; out-pointer to a live local.
        self.check(call, unsafe { f(d, &mut v) }).ok().map(|_| v)
    }
}

/// The address as sysfs names the device (`dddd:bb:dd.f`, lower case, the domain as wide as
/// it needs: `10000:e1:00.0` behind Intel VMD), from NVML's `0000dddd:BB:DD.F`.
fn normalize_bus_id(raw: &[c_char]) -> String {
    // SAFETY: NVML NUL-terminates bus ids within the array.
    let s = unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy();
    match s.parse::<gdr_pci::Bdf>() {
        Ok(bdf) => bdf.to_string(),
        Err(_) => s.to_lowercase(),
    }
}

/// What NVML reports for one GPU.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// NVML's index (`nvmlDeviceGetHandleByIndex`). NVML orders GPUs its own way and ignores
    /// `CUDA_VISIBLE_DEVICES`, so this need not be the CUDA ordinal: match GPUs by `bus_id`.
    pub index: u32,
    /// The product name (`nvmlDeviceGetName`).
    pub name: String,
    /// The PCI address as sysfs names it (`dddd:bb:dd.f`, lower case).
    pub bus_id: String,
    /// Size of the BAR1 aperture in bytes (`nvmlDeviceGetBAR1MemoryInfo`): how much GPU memory
    /// the CPU and other devices can have mapped at once. `None` when NVML does not say.
    pub bar1_total: Option<u64>,
    /// Bytes of the BAR1 aperture mapped now, by every process. `None` when NVML does not say.
    pub bar1_used: Option<u64>,
    /// The PCIe generation the link runs at now (1-6; `nvmlDeviceGetCurrPcieLinkGeneration`).
    /// An idle GPU may train its link down, so this can read below `pcie_gen_max`.
    pub pcie_gen: Option<u32>,
    /// The highest PCIe generation possible with this GPU in this system
    /// (`nvmlDeviceGetMaxPcieLinkGeneration`).
    pub pcie_gen_max: Option<u32>,
    /// The link width in lanes now, e.g. 16 (`nvmlDeviceGetCurrPcieLinkWidth`).
    pub pcie_width: Option<u32>,
    /// The widest link possible with this GPU in this system, in lanes
    /// (`nvmlDeviceGetMaxPcieLinkWidth`).
    pub pcie_width_max: Option<u32>,
}

/// NVML's driver version string, e.g. "580.159.04".
pub fn driver_version() -> Result<String, NvmlError> {
    let a = api()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: the buffer and its length match.
    a.check("nvmlSystemGetDriverVersion", unsafe {
        (a.driver_version)(buf.as_mut_ptr(), buf.len() as c_uint)
    })?;
    // SAFETY: NUL-terminated by NVML.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

fn handles(a: &Api) -> Result<Vec<Dev>, NvmlError> {
    let mut n = 0;
    // SAFETY: out-pointer to a live local.
    a.check("nvmlDeviceGetCount", unsafe { (a.count)(&mut n) })?;
    if n as usize > crate::MAX_DEVICES {
        return Err(NvmlError::Implausible {
            call: "nvmlDeviceGetCount",
            value: n.into(),
        });
    }
    (0..n)
        .map(|i| {
            let mut d: Dev = std::ptr::null_mut();
            // SAFETY: i < count; out-pointer to a live local.
            a.check("nvmlDeviceGetHandleByIndex", unsafe {
                (a.by_index)(i, &mut d)
            })
            .map(|_| d)
        })
        .collect()
}

fn pci_bus_id(a: &Api, d: Dev) -> Result<String, NvmlError> {
    // SAFETY: PciInfo is plain data; zero is a valid bit pattern.
    let mut p: PciInfo = unsafe { std::mem::zeroed() };
    // SAFETY: d is live; out-pointer to a live local.
    a.check("nvmlDeviceGetPciInfo", unsafe { (a.pci_info)(d, &mut p) })?;
    Ok(normalize_bus_id(&p.bus_id))
}

/// Every GPU NVML sees.
pub fn gpus() -> Result<Vec<GpuInfo>, NvmlError> {
    let a = api()?;
    handles(a)?
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut name = [0 as c_char; 96];
            // SAFETY: buffer and length match; d is live.
            a.check("nvmlDeviceGetName", unsafe {
                (a.name)(d, name.as_mut_ptr(), name.len() as c_uint)
            })?;
            let mut bar = Bar1Memory::default();
            // SAFETY: d is live; out-pointer to a live local.
            let bar_ok = a
                .check("nvmlDeviceGetBAR1MemoryInfo", unsafe {
                    (a.bar1)(d, &mut bar)
                })
                .is_ok();
            Ok(GpuInfo {
                index: i as u32,
                // SAFETY: NUL-terminated by NVML.
                name: unsafe { CStr::from_ptr(name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned(),
                bus_id: pci_bus_id(a, d)?,
                bar1_total: bar_ok.then_some(bar.total),
                bar1_used: bar_ok.then_some(bar.used),
                pcie_gen: a.uint("nvmlDeviceGetCurrPcieLinkGeneration", a.curr_gen, d),
                pcie_gen_max: a.uint("nvmlDeviceGetMaxPcieLinkGeneration", a.max_gen, d),
                pcie_width: a.uint("nvmlDeviceGetCurrPcieLinkWidth", a.curr_width, d),
                pcie_width_max: a.uint("nvmlDeviceGetMaxPcieLinkWidth", a.max_width, d),
            })
        })
        .collect()
}

/// One GPU's active NVLinks: direct links to other GPUs (by bus id) and links into an NVSwitch
/// fabric (or to a remote end NVML cannot name).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NvLinks {
    /// The GPU's PCI address (sysfs form, as [`GpuInfo::bus_id`]).
    pub bus_id: String,
    /// Links NVML reports active (`nvmlDeviceGetNvLinkState`), of at most 18.
    pub active: u32,
    /// Direct links to the other GPUs NVML sees: (the peer's bus id, active links to it).
    pub to_gpu: Vec<(String, u32)>,
    /// Active links not to a GPU of this machine: into an NVSwitch fabric, or to a remote end
    /// NVML cannot name.
    pub to_fabric: u32,
}

/// Every GPU's active NVLinks.
pub fn nvlink_report() -> Result<Vec<NvLinks>, NvmlError> {
    let a = api()?;
    report_for(a, &handles(a)?)
}

/// The NVLink report of `devs`, in their order.
fn report_for(a: &Api, devs: &[Dev]) -> Result<Vec<NvLinks>, NvmlError> {
    let ids: Vec<String> = devs
        .iter()
        .map(|&d| pci_bus_id(a, d))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (&d, me) in devs.iter().zip(&ids) {
        let mut r = NvLinks {
            bus_id: me.clone(),
            ..Default::default()
        };
        for link in 0..NVLINK_MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: d is live; out-pointer to a live local. An error means "no such link".
            if unsafe { (a.nvlink_state)(d, link, &mut active) } != 0 || active == 0 {
                continue;
            }
            r.active += 1;
            let remote_is_gpu = match a.nvlink_remote_type {
                Some(f) => {
                    let mut t: c_uint = u32::MAX;
                    // SAFETY: d is live; out-pointer to a live local.
                    let rc = unsafe { f(d, link, &mut t) };
                    rc == 0 && t == NVLINK_DEVICE_TYPE_GPU
                }
                None => true, // decided by the remote bus id below
            };
            let peer = remote_is_gpu
                .then(|| {
                    // SAFETY: PciInfo is plain data; zero is a valid bit pattern.
                    let mut p: PciInfo = unsafe { std::mem::zeroed() };
                    // SAFETY: d is live; out-pointer to a live local.
                    (unsafe { (a.nvlink_remote_pci)(d, link, &mut p) } == 0)
                        .then(|| normalize_bus_id(&p.bus_id))
                })
                .flatten()
                .filter(|b| ids.contains(b) && b != me);
            match peer {
                Some(b) => match r.to_gpu.iter_mut().find(|(x, _)| *x == b) {
                    Some(e) => e.1 += 1,
                    None => r.to_gpu.push((b, 1)),
                },
                None => r.to_fabric += 1,
            }
        }
        out.push(r);
    }
    Ok(out)
}

/// NVLink connections between GPUs as `nvidia-smi topo -m` counts them: (bus id a, bus id b,
/// links), a < b. Direct links count as they are; GPUs that both reach an NVSwitch fabric (HGX
/// boards) are connected by the smaller of their fabric link counts (NV18 between H100/H200s),
/// when NVML confirms NVLink peer-to-peer between them.
pub fn nvlinks() -> Result<Vec<(String, String, u32)>, NvmlError> {
    let a = api()?;
    let devs = handles(a)?;
    // One enumeration for both: report[i] describes devs[i].
    let report = report_for(a, &devs)?;
    let mut out = Vec::new();
    for i in 0..report.len() {
        for j in i + 1..report.len() {
            let (x, y) = (&report[i], &report[j]);
            let direct = x
                .to_gpu
                .iter()
                .find(|(b, _)| *b == y.bus_id)
                .map_or(0, |e| e.1);
            let fabric = if x.to_fabric > 0 && y.to_fabric > 0 {
                let confirmed = match a.p2p_status {
                    Some(f) => {
                        let mut st: c_uint = u32::MAX;
                        // SAFETY: both handles are live; out-pointer to a live local.
                        let rc = unsafe { f(devs[i], devs[j], P2P_CAPS_INDEX_NVLINK, &mut st) };
                        rc == 0 && st == P2P_STATUS_OK
                    }
                    None => true,
                };
                if confirmed {
                    x.to_fabric.min(y.to_fabric)
                } else {
                    0
                }
            } else {
                0
            };
            let n = direct + fabric;
            if n > 0 {
                let (p, q) = if x.bus_id < y.bus_id {
                    (x.bus_id.clone(), y.bus_id.clone())
                } else {
                    (y.bus_id.clone(), x.bus_id.clone())
                };
                out.push((p, q, n));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalised_to_sysfs_form() {
        let mut raw = [0 as c_char; 32];
        for (i, b) in b"00000000:1A:00.0".iter().enumerate() {
            raw[i] = *b as c_char;
        }
        assert_eq!(normalize_bus_id(&raw), "0000:1a:00.0");
        for (i, b) in b"00010000:E1:00.0".iter().enumerate() {
            raw[i] = *b as c_char;
        }
        assert_eq!(normalize_bus_id(&raw), "10000:e1:00.0");
        assert_eq!(std::mem::size_of::<PciInfo>(), 68);
    }
}
