//! The Vulkan backend: GPU memory the CPU maps through BAR1 without any kernel module.
//!
//! On GPUs with a large BAR1 (resizable BAR), the NVIDIA Vulkan driver offers a memory type
//! that is DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT on the VRAM heap. We allocate blocks of
//! it with an exportable OPAQUE_FD handle, map each block once with `vkMapMemory` (a
//! write-combined CPU mapping of BAR1), and import the same memory into CUDA
//! (`cuImportExternalMemory`), which gives a device pointer to the same bytes. Buffers are
//! sub-allocated from blocks because a block of its own (`vkAllocateMemory`, `vkMapMemory`, the
//! CUDA import) costs far more than a range of one.
//!
//! The same device also imports existing `cuMemCreate` memory (exported as a POSIX fd) into
//! that memory type and maps it: the Vulkan way of pinning, for the pin layer and for
//! [`MappedImport`].

mod buffer;

pub use buffer::MappedBuffer;

use crate::bar::range_alloc::RangeAlloc;
use crate::cuda::{Context, CudaError, ExternalMemory};
use crate::page::keep_from_fork;
use ash::vk;
use gdr_mem::AccessError;
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

/// Default size of a sub-allocation block.
pub const DEFAULT_BLOCK_SIZE: usize = 64 << 20;
/// Allocations of at least this size get a block of their own.
const DEDICATED_THRESHOLD: usize = 16 << 20;
/// Block sizes are multiples of this (the GPU page size used for BAR mappings).
const BLOCK_GRANULE: usize = 2 << 20;

/// Errors from the BAR-mapping backends. Each says what is missing and how to get it.
#[derive(Debug, thiserror::Error)]
pub enum BarError {
    /// A CUDA call failed: getting the device's UUID, making the context current, or a copy
    /// through the device pointer.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// libvulkan.so.1 could not be loaded; the text is the loader's error.
    #[error(
        "the Vulkan loader (libvulkan.so.1) is not installed ({0}); install the libvulkan1 \
         package"
    )]
    NoLoader(String),
    /// The loader found no NVIDIA Vulkan driver (no ICD, `vkCreateInstance` answered
    /// `ERROR_INCOMPATIBLE_DRIVER`, or only other vendors' devices). The fix named depends on
    /// where gdr runs: in a container, the NVIDIA container toolkit's `graphics` capability
    /// (which mounts the ICD); elsewhere, the driver's Vulkan package. Made by
    /// [`BarError::no_icd`].
    #[error("no NVIDIA Vulkan driver (ICD) found: {why}; {}", icd_fix(.container.as_deref()))]
    NoIcd {
        /// What the loader said, e.g. `vkCreateInstance: no compatible Vulkan driver`.
        why: String,
        /// Why this looks like a container ([`crate::cuda::host::Host::container`]), if it
        /// does.
        container: Option<String>,
    },
    /// No Vulkan physical device has the CUDA device's UUID.
    #[error(
        "Vulkan does not list the CUDA device (it sees: {seen}); is the NVIDIA ICD the one in use?"
    )]
    DeviceNotFound {
        /// The names of the physical devices Vulkan does list, comma-separated.
        seen: String,
    },
    /// The GPU has no memory type that is DEVICE_LOCAL, HOST_VISIBLE and HOST_COHERENT: BAR1
    /// is too small for Vulkan to offer VRAM to the CPU.
    #[error(
        "the GPU offers no DEVICE_LOCAL|HOST_VISIBLE memory to Vulkan: BAR1 is not mappable; \
         enable resizable BAR (Above 4G decoding) in the firmware"
    )]
    NoHostVisibleVram,
    /// `vkAllocateMemory` answered `ERROR_OUT_OF_DEVICE_MEMORY`: the host-visible heap (BAR1)
    /// has no room left for the block.
    #[error(
        "out of BAR-mappable GPU memory allocating {size} bytes (host-visible heap is {heap} bytes)"
    )]
    OutOfMemory {
        /// The block asked for, in bytes (a buffer's size rounded up to the 2 MiB granule, or
        /// the pool's block size).
        size: usize,
        /// The size of the host-visible VRAM heap, in bytes.
        heap: u64,
    },
    /// CUDA-Vulkan interop failed: the driver lacks `VK_KHR_external_memory_fd`, or
    /// `cuImportExternalMemory` refused the block; the text is the cause.
    #[error("CUDA cannot import the Vulkan memory ({0}); CUDA-Vulkan interop is unavailable")]
    NoInterop(String),
    /// Any other failing Vulkan call.
    #[error("Vulkan call {call} failed: {result}")]
    Vulkan {
        /// The Vulkan entry point (`vkMapMemory`, say).
        call: &'static str,
        /// The `VkResult` it returned.
        result: ash::vk::Result,
    },
    /// An allocation request the backend refuses before calling Vulkan (size 0, an alignment
    /// that is not a power of two or exceeds 2 MiB, no device-only memory type); the text says
    /// which.
    #[error("bad allocation request: {0}")]
    BadLayout(String),
    /// A read or write of a [`MappedBuffer`] outside its bounds.
    #[error("mapped buffer: {0}")]
    Access(#[from] AccessError),
}

impl BarError {
    /// [`BarError::NoIcd`] for this process: `why` the loader found none, and whether this is a
    /// container ([`Host::this`](crate::cuda::host::Host::this)).
    pub fn no_icd(why: impl Into<String>) -> BarError {
        BarError::NoIcd {
            why: why.into(),
            container: crate::cuda::host::Host::this().container(),
        }
    }
}

/// What to do without the NVIDIA ICD: in a container (`container` says why it looks like one)
/// the toolkit's `graphics` capability, since a container's user cannot install driver packages
/// and the toolkit mounts the ICD only with it; elsewhere, the driver's Vulkan part.
fn icd_fix(container: Option<&str>) -> String {
    match container {
        Some(why) => format!(
            "this is a container ({why}), and the NVIDIA container toolkit mounts the Vulkan ICD \
             (nvidia_icd.json and the driver's Vulkan libraries) only with the graphics \
             capability: start it with NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics (or \
             all), or point VK_DRIVER_FILES at an nvidia_icd.json the container has"
        ),
        None => "install the NVIDIA driver's Vulkan part (nvidia_icd.json, e.g. \
                 libnvidia-gl-<version>) or point VK_DRIVER_FILES at its ICD file"
            .into(),
    }
}

/// What Vulkan says about the BAR-mappable memory of one GPU (for `gdr info`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct VulkanInfo {
    /// The physical device's name as Vulkan reports it (`VkPhysicalDeviceProperties::deviceName`).
    pub device_name: String,
    /// The NVIDIA driver version, `major.minor` (decoded from NVIDIA's 10.8.8.6-bit packing of
    /// `driverVersion`).
    pub driver_version: String,
    /// The Vulkan API version the device supports, `major.minor.patch`.
    pub api_version: String,
    /// Index of the DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT memory type buffers are
    /// allocated from (the one on the largest heap, if several).
    pub memory_type_index: u32,
    /// Index of the memory heap that type lives on.
    pub heap_index: u32,
    /// Size of the VRAM heap that the host-visible device-local type lives on.
    pub heap_size: u64,
}

/// The Vulkan instance and device bound to one CUDA device.
struct VkDevice {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    fd_ext: ash::khr::external_memory_fd::Device,
    memory_type_index: u32,
    /// A device-local type without HOST_VISIBLE, to tell import failures apart.
    device_only_type: Option<u32>,
    info: VulkanInfo,
}

impl Drop for VkDevice {
    fn drop(&mut self) {
        // SAFETY: every block holds an Arc to this device, so no memory is left; the device
        // is destroyed before its instance. (`shared_device` keeps every device for the life
        // of the process, so today this never runs; it keeps a dropped device from leaking.)
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn vk_err(call: &'static str) -> impl Fn(vk::Result) -> BarError {
    move |result| BarError::Vulkan { call, result }
}

/// Why [`BarError::NoIcd`] when the instance lists no physical device at all.
const NO_DEVICE: &str = "the Vulkan loader found no GPU (no ICD registered)";

/// A Vulkan 1.1 instance named gdr; no ICD is [`BarError::NoIcd`].
fn create_instance(entry: &ash::Entry) -> Result<ash::Instance, BarError> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"gdr")
        .api_version(vk::API_VERSION_1_1);
    let ici = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: the create info and everything it points to outlive the call.
    unsafe { entry.create_instance(&ici, None) }.map_err(|r| match r {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => {
            BarError::no_icd("vkCreateInstance: no compatible Vulkan driver")
        }
        r => BarError::Vulkan {
            call: "vkCreateInstance",
            result: r,
        },
    })
}

impl VkDevice {
    fn open(ctx: &Context) -> Result<VkDevice, BarError> {
        // SAFETY: loading the Vulkan loader runs its initialisers; nothing else is required.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| BarError::NoLoader(e.to_string()))?;
        let instance = create_instance(&entry)?;
        match Self::open_on(entry.clone(), instance.clone(), ctx) {
            Ok(d) => Ok(d),
            Err(e) => {
                // SAFETY: no device was created from this instance (open_on cleans up its own).
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    fn open_on(
        entry: ash::Entry,
        instance: ash::Instance,
        ctx: &Context,
    ) -> Result<VkDevice, BarError> {
        let uuid = ctx.device().uuid()?;
        // SAFETY: the instance is alive.
        let pds = unsafe { instance.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        if pds.is_empty() {
            return Err(BarError::no_icd(NO_DEVICE));
        }
        let mut names = Vec::new();
        let mut found = None;
        for pd in pds {
            let mut id = vk::PhysicalDeviceIDProperties::default();
            let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
            // SAFETY: pd comes from this instance; the chain is well formed.
            unsafe { instance.get_physical_device_properties2(pd, &mut props) };
            let p = props.properties;
            // SAFETY: device_name is a NUL-terminated array filled by the driver.
            let name = unsafe { CStr::from_ptr(p.device_name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            names.push(name.clone());
            if id.device_uuid == uuid {
                found = Some((pd, p, name));
            }
        }
        let (pd, props, device_name) = found.ok_or_else(|| BarError::DeviceNotFound {
            seen: names.join(", "),
        })?;
        // SAFETY: pd is a valid physical device of this instance.
        let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
        let want = vk::MemoryPropertyFlags::DEVICE_LOCAL
            | vk::MemoryPropertyFlags::HOST_VISIBLE
            | vk::MemoryPropertyFlags::HOST_COHERENT;
        let (memory_type_index, heap_index) = (0..mem.memory_type_count)
            .filter(|&i| mem.memory_types[i as usize].property_flags.contains(want))
            .map(|i| (i, mem.memory_types[i as usize].heap_index))
            .max_by_key(|&(_, h)| mem.memory_heaps[h as usize].size)
            .ok_or(BarError::NoHostVisibleVram)?;
        let heap_size = mem.memory_heaps[heap_index as usize].size;
        let device_only_type = (0..mem.memory_type_count).find(|&i| {
            let f = mem.memory_types[i as usize].property_flags;
            f.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
                && !f.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
        });

        let prio = [1.0f32];
        let qci = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&prio)];
        let exts = [ash::khr::external_memory_fd::NAME.as_ptr()];
        let dci = vk::DeviceCreateInfo::default()
            .queue_create_infos(&qci)
            .enabled_extension_names(&exts);
        // SAFETY: create info and arrays outlive the call.
        let device = unsafe { instance.create_device(pd, &dci, None) }.map_err(|r| match r {
            vk::Result::ERROR_EXTENSION_NOT_PRESENT => {
                BarError::NoInterop("the Vulkan driver lacks VK_KHR_external_memory_fd".into())
            }
            r => BarError::Vulkan {
                call: "vkCreateDevice",
                result: r,
            },
        })?;
        let fd_ext = ash::khr::external_memory_fd::Device::new(&instance, &device);
        let v = props.driver_version;
        let a = props.api_version;
        Ok(VkDevice {
            _entry: entry,
            instance,
            device,
            fd_ext,
            memory_type_index,
            device_only_type,
            info: VulkanInfo {
                device_name,
                // NVIDIA packs its version as 10.8.8.6 bits.
                driver_version: format!("{}.{}", v >> 22, (v >> 14) & 0xff),
                api_version: format!(
                    "{}.{}.{}",
                    vk::api_version_major(a),
                    vk::api_version_minor(a),
                    vk::api_version_patch(a)
                ),
                memory_type_index,
                heap_index,
                heap_size,
            },
        })
    }
}

/// One `vkAllocateMemory` block: mapped for the CPU, imported into CUDA, sub-allocated.
struct Block {
    dev: Arc<VkDevice>,
    memory: vk::DeviceMemory,
    host: *mut u8,
    cuda: Option<ExternalMemory>,
    ranges: Mutex<RangeAlloc>,
}

// SAFETY: the raw host pointer is the block's own mapping; access to ranges is locked, and
// bytes behind the pointer are only reached through MappedBuffer's copy routines.
unsafe impl Send for Block {}
// SAFETY: as above; through `&Block` the host pointer and the memory handle are only read (they
// never change after `new`), and the range allocator is behind its mutex.
unsafe impl Sync for Block {}

impl Block {
    fn new(dev: Arc<VkDevice>, ctx: &Context, size: usize) -> Result<Block, BarError> {
        let mut export = vk::ExportMemoryAllocateInfo::default()
            .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let mai = vk::MemoryAllocateInfo::default()
            .allocation_size(size as u64)
            .memory_type_index(dev.memory_type_index)
            .push_next(&mut export);
        // SAFETY: the allocate info chain outlives the call.
        let memory = unsafe { dev.device.allocate_memory(&mai, None) }.map_err(|r| match r {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => BarError::OutOfMemory {
                size,
                heap: dev.info.heap_size,
            },
            r => BarError::Vulkan {
                call: "vkAllocateMemory",
                result: r,
            },
        })?;
        let free_memory = |dev: &VkDevice| {
            // SAFETY: memory is ours, unmapped and not imported when this runs.
            unsafe { dev.device.free_memory(memory, None) }
        };
        // SAFETY: memory is a live host-visible allocation, mapped whole once.
        let host = match unsafe {
            dev.device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        } {
            Ok(p) => {
                keep_from_fork(p.cast(), size);
                p.cast::<u8>()
            }
            Err(r) => {
                free_memory(&dev);
                return Err(BarError::Vulkan {
                    call: "vkMapMemory",
                    result: r,
                });
            }
        };
        let gfi = vk::MemoryGetFdInfoKHR::default()
            .memory(memory)
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        // SAFETY: memory was allocated exportable as OPAQUE_FD.
        let fd = match unsafe { dev.fd_ext.get_memory_fd(&gfi) } {
            // SAFETY: vkGetMemoryFdKHR returns a new fd that we own.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(r) => {
                // SAFETY: mapped above, not used after.
                unsafe { dev.device.unmap_memory(memory) };
                free_memory(&dev);
                return Err(BarError::Vulkan {
                    call: "vkGetMemoryFdKHR",
                    result: r,
                });
            }
        };
        let cuda = match ExternalMemory::import_opaque_fd(ctx, fd, size) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: mapped above, not used after.
                unsafe { dev.device.unmap_memory(memory) };
                free_memory(&dev);
                return Err(BarError::NoInterop(e.to_string()));
            }
        };
        Ok(Block {
            dev,
            memory,
            host,
            cuda: Some(cuda),
            ranges: Mutex::new(RangeAlloc::new(size)),
        })
    }

    fn host_base(&self) -> *mut u8 {
        self.host
    }

    fn device_base(&self) -> u64 {
        use crate::cuda::DeviceMemory;
        self.cuda.as_ref().map_or(0, |c| c.device_ptr())
    }

    fn context(&self) -> &Context {
        self.cuda.as_ref().expect("block is live").context()
    }

    fn try_alloc(&self, len: usize, align: usize) -> Option<usize> {
        self.ranges.lock().expect("block lock").alloc(len, align)
    }

    /// Returns a range; true when the block is now empty.
    fn release(&self, offset: usize, len: usize) -> bool {
        let mut r = self.ranges.lock().expect("block lock");
        r.free(offset, len);
        r.is_empty()
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // CUDA's view goes first (cuMemFree + cuDestroyExternalMemory), then the CPU mapping,
        // then the memory itself.
        drop(self.cuda.take());
        // SAFETY: no MappedBuffer is left (each holds an Arc to this block), so nothing uses
        // the mapping or the memory.
        unsafe {
            self.dev.device.unmap_memory(self.memory);
            self.dev.device.free_memory(self.memory, None);
        }
    }
}

struct Pool {
    dev: Arc<VkDevice>,
    ctx: Context,
    block_size: usize,
    blocks: Mutex<Vec<Arc<Block>>>,
}

impl Pool {
    /// Called by a dropped buffer whose block became empty: release the block unless it is
    /// the only shared one (kept to make the next allocation cheap).
    fn block_emptied(&self, block: &Arc<Block>) {
        let mut blocks = self.blocks.lock().expect("pool lock");
        if blocks.len() > 1 {
            if let Some(i) = blocks.iter().position(|b| Arc::ptr_eq(b, block)) {
                // Re-check under the pool lock: a racing allocation may have reused it.
                if blocks[i].ranges.lock().expect("block lock").is_empty() {
                    blocks.swap_remove(i);
                }
            }
        }
    }
}

/// The Vulkan instance and device of each GPU, opened once per process and kept: on the H100
/// (driver 580) a process that created and destroyed a few dozen instances had
/// `vkCreateInstance` fail with ERROR_INCOMPATIBLE_DRIVER, so backends share one (their
/// memory is still released per backend, block by block).
fn shared_device(ctx: &Context) -> Result<Arc<VkDevice>, BarError> {
    static DEVICES: Mutex<Vec<([u8; 16], Arc<VkDevice>)>> = Mutex::new(Vec::new());
    let uuid = ctx.device().uuid()?;
    let mut devs = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, d)) = devs.iter().find(|(u, _)| *u == uuid) {
        return Ok(d.clone());
    }
    let d = Arc::new(VkDevice::open(ctx)?);
    devs.push((uuid, d.clone()));
    end_forked_children_at_exit();
    Ok(d)
}

extern "C" {
    /// glibc's `on_exit`: like atexit, but the handler gets exit()'s status.
    fn on_exit(
        f: extern "C" fn(std::ffi::c_int, *mut std::ffi::c_void),
        arg: *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
}

/// In a child forked from a process that opened the NVIDIA Vulkan driver, exit() flushes stdio
/// and ends the child right away: the driver's exit handlers, inherited from the parent, crash
/// in a forked child (gdrcopy's fork tests saw such children exit with a signal after a clean
/// test). Handlers registered later (in the child) still run before this one; those registered
/// in the parent, the driver's among them, do not.
fn end_forked_children_at_exit() {
    extern "C" fn quick_exit(status: std::ffi::c_int, _: *mut std::ffi::c_void) {
        // SAFETY: flushing every stdio stream and ending the process; nothing runs after.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status)
        }
    }
    extern "C" fn in_child() {
        // SAFETY: registers a handler of the right signature; called once per fork.
        unsafe { on_exit(quick_exit, std::ptr::null_mut()) };
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain extern "C" function as the fork child handler, once.
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_child));
    });
}

/// The Vulkan loader's instance version (`1.3.275`), or why the loader (libvulkan.so.1) does
/// not load. Needs no GPU: it tells a machine without the loader from one whose GPU or driver is
/// missing, since both Vulkan backends (this one and [`super::PinBackend::Vulkan`]) need it.
pub fn loader_version() -> Result<String, BarError> {
    // SAFETY: loading the Vulkan loader runs its initialisers; nothing else is required.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| BarError::NoLoader(e.to_string()))?;
    // SAFETY: a global command; the entry is alive. `None` is a Vulkan 1.0 loader.
    let v = unsafe { entry.try_enumerate_instance_version() }
        .map_err(vk_err("vkEnumerateInstanceVersion"))?
        .unwrap_or(vk::API_VERSION_1_0);
    Ok(format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    ))
}

/// The NVIDIA GPUs the Vulkan loader lists, `NVIDIA H100 80GB HBM3 (driver 580.159)` comma-
/// separated, or why it lists none ([`BarError::NoLoader`], [`BarError::NoIcd`]). Needs no CUDA:
/// it tells a machine (or container) without the NVIDIA ICD apart before any GPU is opened.
pub fn nvidia_icd() -> Result<String, BarError> {
    // SAFETY: loading the Vulkan loader runs its initialisers; nothing else is required.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| BarError::NoLoader(e.to_string()))?;
    let instance = create_instance(&entry)?;
    // SAFETY: the instance is alive.
    let pds = unsafe { instance.enumerate_physical_devices() };
    let mut nvidia = Vec::new();
    let mut others = Vec::new();
    for &pd in pds.as_deref().unwrap_or_default() {
        // SAFETY: pd comes from this instance.
        let p = unsafe { instance.get_physical_device_properties(pd) };
        // SAFETY: device_name is a NUL-terminated array filled by the driver.
        let name = unsafe { CStr::from_ptr(p.device_name.as_ptr()) }.to_string_lossy();
        if p.vendor_id == NVIDIA_VENDOR_ID {
            let v = p.driver_version;
            nvidia.push(format!("{name} (driver {}.{})", v >> 22, (v >> 14) & 0xff));
        } else {
            others.push(name.into_owned());
        }
    }
    // SAFETY: nothing was created from the instance; it is not used after.
    unsafe { instance.destroy_instance(None) };
    let pds = pds.map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    match (nvidia.is_empty(), pds.is_empty()) {
        (false, _) => Ok(nvidia.join(", ")),
        (true, true) => Err(BarError::no_icd(NO_DEVICE)),
        (true, false) => Err(BarError::no_icd(format!(
            "the Vulkan loader lists no NVIDIA GPU (it sees: {})",
            others.join(", ")
        ))),
    }
}

/// PCI vendor ID of NVIDIA, as `VkPhysicalDeviceProperties::vendorID` reports it.
const NVIDIA_VENDOR_ID: u32 = 0x10de;

/// Allocates BAR-mapped GPU memory through Vulkan. Cheap to clone (shared pool).
///
/// # Examples
///
/// ```
/// use gdr::bar::{BarError, VulkanBackend};
/// use gdr::cuda::DeviceMemory;
///
/// const NAME: &str = "gdr::bar::VulkanBackend example (doctest)";
/// let Some(ctx) = gdr_testing::gpu_context(NAME) else {
///     return Ok(());
/// };
/// let be = match VulkanBackend::new(&ctx) {
///     Ok(be) => be,
///     Err(e) => {
///         gdr_testing::skip_or_fail::<()>(NAME, &e.to_string());
///         return Ok(());
///     }
/// };
/// // Small buffers share one block, each on its own aligned lines.
/// let a = be.alloc(100, 256)?;
/// let b = be.alloc(100, 256)?;
/// assert_eq!(be.shared_blocks(), 1);
/// assert_eq!((a.device_ptr() % 256, b.device_ptr() % 256), (0, 0));
/// a.write(0, &[1; 100])?;
/// b.write(0, &[2; 100])?;
/// let mut back = [0u8; 100];
/// a.read(0, &mut back)?;
/// assert_eq!(back, [1; 100], "`b` is apart from `a`");
/// assert!(matches!(be.alloc(0, 64), Err(BarError::BadLayout(_))));
/// # Ok::<(), BarError>(())
/// ```
#[derive(Clone)]
pub struct VulkanBackend {
    pool: Arc<Pool>,
}

impl VulkanBackend {
    /// Opens the Vulkan device matching `ctx`'s GPU (by UUID).
    pub fn new(ctx: &Context) -> Result<Self, BarError> {
        Self::with_block_size(ctx, DEFAULT_BLOCK_SIZE)
    }

    /// As [`new`](Self::new), with sub-allocation blocks of `block_size` bytes instead of
    /// the default 64 MiB: clamped to between 2 MiB and a quarter of the host-visible heap,
    /// then rounded up to a multiple of 2 MiB. A buffer of at least half a block, or of at
    /// least 16 MiB, gets a block of its own.
    pub fn with_block_size(ctx: &Context, block_size: usize) -> Result<Self, BarError> {
        let dev = shared_device(ctx)?;
        // Small-BAR GPUs have a ~256 MiB host-visible heap: keep blocks well inside it.
        let cap = (dev.info.heap_size as usize / 4).max(BLOCK_GRANULE);
        let block_size = block_size
            .clamp(BLOCK_GRANULE, cap)
            .next_multiple_of(BLOCK_GRANULE);
        Ok(VulkanBackend {
            pool: Arc::new(Pool {
                dev,
                ctx: ctx.clone(),
                block_size,
                blocks: Mutex::new(Vec::new()),
            }),
        })
    }

    /// What Vulkan says about the device and its BAR-mappable memory.
    pub fn info(&self) -> &VulkanInfo {
        &self.pool.dev.info
    }

    /// The CUDA context the backend's memory is imported into (the one it was opened with).
    pub fn context(&self) -> &Context {
        &self.pool.ctx
    }

    /// Number of live `vkAllocateMemory` blocks (shared ones; dedicated blocks not counted).
    pub fn shared_blocks(&self) -> usize {
        self.pool.blocks.lock().expect("pool lock").len()
    }

    /// Allocates `len` bytes (>= 1) in a block of its own: always a fresh `vkAllocateMemory`,
    /// `vkMapMemory` and CUDA import (what `gdr apiperf` times as this backend's "pin").
    pub fn alloc_dedicated(&self, len: usize) -> Result<MappedBuffer, BarError> {
        if len == 0 {
            return Err(BarError::BadLayout("size must be at least 1 byte".into()));
        }
        self.dedicated(len, len.next_multiple_of(64), 64)
    }

    /// A buffer of `len` bytes (`reserve` rounded) at the start of a block of its own.
    fn dedicated(
        &self,
        len: usize,
        reserve: usize,
        align: usize,
    ) -> Result<MappedBuffer, BarError> {
        let size = reserve.next_multiple_of(BLOCK_GRANULE);
        let block = Arc::new(Block::new(self.pool.dev.clone(), &self.pool.ctx, size)?);
        let off = block
            .try_alloc(reserve, align)
            .expect("a fresh block holds what it was sized for");
        Ok(MappedBuffer::new(block, None, off, len, reserve))
    }

    /// Allocates `len` bytes (>= 1) at an address aligned to `align` (a power of two) on both
    /// the CPU mapping and the device pointer.
    pub fn alloc(&self, len: usize, align: usize) -> Result<MappedBuffer, BarError> {
        if len == 0 {
            return Err(BarError::BadLayout("size must be at least 1 byte".into()));
        }
        if !align.is_power_of_two() || align > BLOCK_GRANULE {
            return Err(BarError::BadLayout(format!(
                "alignment {align} must be a power of two no larger than {BLOCK_GRANULE}"
            )));
        }
        // Keep buffers on distinct 64-byte lines so two buffers never share a
        // write-combining line (a partial line flush would be slow and racy to reason about).
        let align = align.max(64);
        let reserve = len.next_multiple_of(64);
        let pool = &self.pool;
        if reserve >= DEDICATED_THRESHOLD.min(pool.block_size / 2) {
            return self.dedicated(len, reserve, align);
        }
        let mut blocks = pool.blocks.lock().expect("pool lock");
        for b in blocks.iter() {
            if let Some(off) = b.try_alloc(reserve, align) {
                return Ok(MappedBuffer::new(
                    b.clone(),
                    Some(Arc::downgrade(pool)),
                    off,
                    len,
                    reserve,
                ));
            }
        }
        let block = Arc::new(Block::new(pool.dev.clone(), &pool.ctx, pool.block_size)?);
        let off = block.try_alloc(reserve, align).expect("fresh block");
        blocks.push(block.clone());
        Ok(MappedBuffer::new(
            block,
            Some(Arc::downgrade(pool)),
            off,
            len,
            reserve,
        ))
    }
}

type PoolRef = Weak<Pool>;

/// Memory made by another API (a CUDA `cuMemCreate` allocation exported as a POSIX fd)
/// imported into Vulkan in the host-visible device-local memory type, so that `vkMapMemory` can
/// give it a CPU mapping. Freed (the import released) on drop.
pub(crate) struct Imported {
    dev: Arc<VkDevice>,
    memory: vk::DeviceMemory,
    size: usize,
}

// SAFETY: a Vulkan memory handle is a plain value usable from any thread; mapping and unmapping
// are serialised by the owner (the pin layer, `bar::pin`).
unsafe impl Send for Imported {}
// SAFETY: as above; `vkMapMemory`/`vkUnmapMemory` need the memory object externally
// synchronised, and the owner maps it at most once at a time (the pin's `mapped` flag, or
// `MappedImport`, which maps once and unmaps in drop).
unsafe impl Sync for Imported {}

impl VulkanBackend {
    /// Imports `size` bytes named by an OPAQUE_FD-compatible `fd` into the host-visible
    /// device-local memory type (`VkImportMemoryFdInfoKHR`). On success Vulkan owns the fd.
    /// With `host_visible` false the first device-local type without HOST_VISIBLE is used
    /// instead (to tell "no import at all" from "no host-visible import").
    pub(crate) fn import_fd(
        &self,
        fd: OwnedFd,
        size: usize,
        host_visible: bool,
    ) -> Result<Imported, BarError> {
        use std::os::fd::IntoRawFd;
        let dev = &self.pool.dev;
        let type_index = if host_visible {
            dev.memory_type_index
        } else {
            dev.device_only_type.ok_or(BarError::BadLayout(
                "the GPU has no device-local memory type without HOST_VISIBLE".into(),
            ))?
        };
        let raw = fd.into_raw_fd();
        let mut import = vk::ImportMemoryFdInfoKHR::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD)
            .fd(raw);
        let mai = vk::MemoryAllocateInfo::default()
            .allocation_size(size as u64)
            .memory_type_index(type_index)
            .push_next(&mut import);
        // SAFETY: the allocate info chain outlives the call; on success Vulkan owns `raw`.
        match unsafe { dev.device.allocate_memory(&mai, None) } {
            Ok(memory) => Ok(Imported {
                dev: dev.clone(),
                memory,
                size,
            }),
            Err(result) => {
                // SAFETY: the import failed, so the fd is still ours.
                unsafe { libc::close(raw) };
                Err(BarError::Vulkan {
                    call: "vkAllocateMemory(VkImportMemoryFdInfoKHR)",
                    result,
                })
            }
        }
    }
}

impl VulkanBackend {
    /// Imports `size` bytes named by an OPAQUE_FD-compatible `fd` (a POSIX-fd `cuMemCreate`
    /// allocation) into the host-visible device-local type and maps all of it for the CPU: the
    /// mapping lives as long as the returned value. On success Vulkan owns the fd.
    pub fn import_mapped(&self, fd: OwnedFd, size: usize) -> Result<MappedImport, BarError> {
        let imported = self.import_fd(fd, size, true)?;
        let host = imported.map()?;
        Ok(MappedImport { imported, host })
    }
}

/// CUDA memory imported into Vulkan and mapped whole for the CPU (a write-combined BAR1
/// mapping), owned: unmapped and the import released on drop. The memory itself stays with
/// its allocator; the import only holds a reference to it, so it stays valid while this lives.
pub struct MappedImport {
    imported: Imported,
    host: *mut u8,
}

// SAFETY: the mapping is reached only through raw pointers handed to the copy routines; the
// import is Send + Sync.
unsafe impl Send for MappedImport {}
// SAFETY: as above; through `&MappedImport` only the pointer and the length are read.
unsafe impl Sync for MappedImport {}

impl MappedImport {
    /// CPU address of the first byte; valid while `self` lives.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.imported.size
    }

    /// Whether the mapping is empty (an import of 0 bytes; Vulkan refuses those, so never in
    /// practice).
    pub fn is_empty(&self) -> bool {
        self.imported.size == 0
    }
}

impl Drop for MappedImport {
    fn drop(&mut self) {
        // SAFETY: mapped in import_mapped; the pointer is not used after this value is gone.
        unsafe { self.imported.unmap() }
        // The import is freed by its own drop.
    }
}

impl Imported {
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Maps the whole memory for the CPU (`vkMapMemory`).
    pub(crate) fn map(&self) -> Result<*mut u8, BarError> {
        // SAFETY: the memory is live; the owner maps it at most once at a time.
        unsafe {
            self.dev
                .device
                .map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .map(|p| {
            keep_from_fork(p.cast(), self.size);
            p.cast::<u8>()
        })
        .map_err(vk_err("vkMapMemory"))
    }

    /// Undoes [`map`](Self::map).
    ///
    /// # Safety
    /// The memory must be mapped and nothing may use the mapping afterwards.
    pub(crate) unsafe fn unmap(&self) {
        // SAFETY: per the contract.
        unsafe { self.dev.device.unmap_memory(self.memory) }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the owner unmapped it (mappings borrow the pin); the import is ours.
        unsafe { self.dev.device.free_memory(self.memory, None) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_icd_a_container_is_told_the_capability_and_a_host_the_package() {
        let why = "vkCreateInstance: no compatible Vulkan driver";
        let pod = BarError::NoIcd {
            why: why.into(),
            container: Some("KUBERNETES_SERVICE_HOST is set".into()),
        }
        .to_string();
        assert_eq!(
            pod,
            "no NVIDIA Vulkan driver (ICD) found: vkCreateInstance: no compatible Vulkan driver; \
             this is a container (KUBERNETES_SERVICE_HOST is set), and the NVIDIA container \
             toolkit mounts the Vulkan ICD (nvidia_icd.json and the driver's Vulkan libraries) \
             only with the graphics capability: start it with \
             NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics (or all), or point \
             VK_DRIVER_FILES at an nvidia_icd.json the container has"
        );
        let host = BarError::NoIcd {
            why: why.into(),
            container: None,
        }
        .to_string();
        assert_eq!(
            host,
            "no NVIDIA Vulkan driver (ICD) found: vkCreateInstance: no compatible Vulkan driver; \
             install the NVIDIA driver's Vulkan part (nvidia_icd.json, e.g. \
             libnvidia-gl-<version>) or point VK_DRIVER_FILES at its ICD file"
        );
    }

    /// On whatever machine runs the tests: the probe either lists NVIDIA GPUs or says why not,
    /// naming the capability where this looks like a container.
    #[test]
    fn the_icd_probe_says_what_it_found_or_why_not() {
        match nvidia_icd() {
            Ok(gpus) => assert!(gpus.contains("(driver "), "{gpus}"),
            Err(BarError::NoLoader(e)) => assert!(!e.is_empty()),
            Err(e @ BarError::NoIcd { .. }) => {
                let text = e.to_string();
                assert!(text.contains("VK_DRIVER_FILES"), "{text}");
                let in_container = crate::cuda::host::Host::this().container().is_some();
                assert_eq!(
                    text.contains("NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics"),
                    in_container,
                    "{text}"
                );
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
}
