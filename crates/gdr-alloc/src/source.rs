//! Chunks from the CUDA driver: POSIX-fd `cuMemCreate` allocations, mapped for the CPU through
//! a Vulkan import.

use crate::pool::{ChunkSource, SourceError};
use crate::probe_cache::{ProbeCache, ProbeKey};
use gdr::bar::{MappedImport, VulkanBackend};
use gdr::cuda::{self, vmm::VmmBuffer, Context, CudaError, CurrentContextGuard, Device};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What the source knows of one GPU.
struct Gpu {
    device: Device,
    /// Devices whose kernels can reach this GPU's memory: each chunk is made accessible to
    /// them too, as `cudaMalloc` memory is once peer access is enabled.
    peers: Vec<Device>,
    granularity: usize,
    /// The Vulkan side, opened at the first mapping ([`VmmSource::vulkan`]).
    vulkan: OnceLock<VulkanBackend>,
    /// The last failure to open it, and when: retried after [`VULKAN_RETRY`].
    vulkan_failed: Mutex<Option<(Instant, SourceError)>>,
    /// Set when the probe was answered by the probe cache: the entry that said so, removed if
    /// Vulkan then fails to open.
    cached_by: OnceLock<(ProbeCache, ProbeKey)>,
}

/// How [`VmmSource::probe`] decided that a GPU can be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probed {
    /// A chunk was made, imported into Vulkan and mapped (and the success cached, where a cache
    /// was given and could be written).
    Measured,
    /// The probe cache held a success for this GPU, driver and Vulkan setup: Vulkan is opened at
    /// the first mapping instead.
    Cached,
}

/// Chunks of CUDA VMM memory with a POSIX-fd handle; mappings through Vulkan.
///
/// # Examples
///
/// ```
/// use gdr::cuda::{self, DeviceMemory};
/// use gdr_alloc::{Pool, VmmSource, DEFAULT_CACHE};
///
/// const NAME: &str = "gdr_alloc::VmmSource example (doctest)";
/// let Some(_ctx) = gdr_testing::gpu_context(NAME) else {
///     return Ok(());
/// };
/// let src = VmmSource::new();
/// if let Err(why) = src.probe(0, None) {
///     gdr_testing::skip_or_fail::<()>(NAME, &format!("GPU 0 cannot serve the pool: {why}"));
///     return Ok(());
/// }
/// let pool = Pool::new(src, DEFAULT_CACHE);
/// let addr = pool.alloc(0, 4096)?; // device memory, as cudaMalloc gives
/// /// The allocation as the driver's copies take it.
/// struct Range(u64);
/// impl DeviceMemory for Range {
///     fn device_ptr(&self) -> u64 {
///         self.0
///     }
///     fn len(&self) -> usize {
///         4096
///     }
/// }
/// let pin = pool.pin(addr, 4096)?;
/// pool.map(pin.id)?;
/// let cpu = pin.cpu.wrapping_add(usize::try_from(addr - pin.base)?);
/// // SAFETY: [cpu, cpu + 4096) lies in the chunk's mapping, which the pin keeps.
/// unsafe { gdr::copy::copy_to_mapping(cpu, b"through BAR1") };
/// let mut back = [0u8; 12];
/// cuda::memcpy_dtoh(&mut back, &Range(addr), 0)?;
/// assert_eq!(&back, b"through BAR1");
/// pool.unmap(pin.id)?;
/// pool.unpin(pin.id)?;
/// assert!(pool.free(addr).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct VmmSource {
    gpus: Mutex<HashMap<i32, Arc<Gpu>>>,
}

/// How long a failure to open Vulkan (other than for want of memory) stands before a mapping
/// tries again.
const VULKAN_RETRY: Duration = Duration::from_secs(1);

/// Free device memory below which a failure to open Vulkan is taken for the full device's.
const LOW_DEVICE_MEMORY: usize = 512 << 20;

/// A Vulkan failure as the pool sees it: out of device memory, or anything else.
fn failed_bar(e: gdr::bar::BarError) -> SourceError {
    match e {
        gdr::bar::BarError::OutOfMemory { .. } => SourceError::OutOfMemory,
        e => SourceError::Failed {
            code: None,
            what: e.to_string(),
        },
    }
}

fn failed(e: CudaError) -> SourceError {
    match e.code() {
        Some(CudaError::OUT_OF_MEMORY) => SourceError::OutOfMemory,
        code => SourceError::Failed {
            code,
            what: e.to_string(),
        },
    }
}

impl VmmSource {
    /// A source with nothing opened yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn gpu(&self, ordinal: i32) -> Result<Arc<Gpu>, SourceError> {
        if let Some(g) = self
            .gpus
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ordinal)
        {
            return Ok(g.clone());
        }
        let n = usize::try_from(ordinal).map_err(|_| SourceError::Failed {
            code: Some(CudaError::INVALID_VALUE),
            what: format!("device {ordinal}"),
        })?;
        let device = Device::get(n).map_err(failed)?;
        let count = Device::count().map_err(failed)?;
        let mut peers = Vec::new();
        for i in (0..count).filter(|&i| i != n) {
            let p = Device::get(i).map_err(failed)?;
            if p.can_access_peer(device).unwrap_or(false) {
                peers.push(p);
            }
        }
        let granularity = cuda::vmm::device_granularity(device).map_err(failed)?;
        let g = Arc::new(Gpu {
            device,
            peers,
            granularity,
            vulkan: OnceLock::new(),
            vulkan_failed: Mutex::new(None),
            cached_by: OnceLock::new(),
        });
        let mut gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        Ok(gpus.entry(ordinal).or_insert(g).clone())
    }

    /// The GPU's Vulkan side, opened at the first call. A failure is not kept for good: the
    /// first pin may come when the device is full (a program that allocated everything it
    /// could, then pins), where opening Vulkan fails and works again once memory is freed. A
    /// failure with less than [`LOW_DEVICE_MEMORY`] free counts as out of memory and the next
    /// call tries again; after any other, the next try waits [`VULKAN_RETRY`], and calls in
    /// between return that failure.
    fn vulkan(gpu: &Gpu) -> Result<&VulkanBackend, SourceError> {
        if let Some(be) = gpu.vulkan.get() {
            return Ok(be);
        }
        let mut last_failure = gpu.vulkan_failed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(be) = gpu.vulkan.get() {
            return Ok(be); // opened by another thread while this one waited
        }
        if let Some((when, e)) = &*last_failure {
            if *e != SourceError::OutOfMemory && when.elapsed() < VULKAN_RETRY {
                return Err(e.clone());
            }
        }
        let opened = {
            // Opening the backend retains and binds the GPU's primary context; the calling
            // thread is the program's, so its current context is put back.
            let _current = CurrentContextGuard::save().ok();
            Context::new(gpu.device).map_err(failed).and_then(|ctx| {
                VulkanBackend::new(&ctx).map_err(|e| {
                    // Whatever Vulkan calls it, a failure with the device (nearly) full is the
                    // full device's: tried again at the next mapping, and the cache stands.
                    let full = ctx
                        .mem_info()
                        .is_ok_and(|(free, _)| free < LOW_DEVICE_MEMORY);
                    if full {
                        SourceError::OutOfMemory
                    } else {
                        failed_bar(e)
                    }
                })
            })
        };
        match opened {
            Ok(be) => {
                *last_failure = None;
                Ok(gpu.vulkan.get_or_init(|| be))
            }
            Err(e) => {
                *last_failure = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Whether GPU `ordinal` can give mappable chunks: VMM with POSIX-fd handles, and one chunk
    /// made, imported into Vulkan and mapped. With a `cache`, a success recorded there for this
    /// GPU, driver and Vulkan setup stands for the last step (module `probe_cache`), and a
    /// measured success is recorded. `Err` says why not.
    pub fn probe(&self, ordinal: i32, cache: Option<&ProbeCache>) -> Result<Probed, String> {
        let gpu = self.gpu(ordinal).map_err(|e| e.to_string())?;
        let attr = |a, what: &str| match gpu.device.attribute(a) {
            Ok(0) => Err(format!("GPU {ordinal} does not support {what}")),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        attr(
            cuda::Attribute::VirtualMemoryManagementSupported,
            "CUDA virtual memory management (cuMemCreate)",
        )?;
        attr(
            cuda::Attribute::HandleTypePosixFdSupported,
            "POSIX-fd handles for cuMemCreate memory",
        )?;
        let key = match cache {
            Some(_) => gpu.device.uuid().ok().and_then(ProbeKey::for_gpu),
            None => None,
        };
        if let (Some(cache), Some(key)) = (cache, &key) {
            if cache.holds(key) {
                let _ = gpu.cached_by.set((cache.clone(), key.clone()));
                return Ok(Probed::Cached);
            }
        }
        let chunk = self
            .create(ordinal, gpu.granularity)
            .map_err(|e| e.to_string())?
            .1;
        self.map(ordinal, &chunk)
            .map(drop)
            .map_err(|e| format!("its memory cannot be mapped for the CPU: {e}"))?;
        if let (Some(cache), Some(key)) = (cache, &key) {
            // Not kept (no writable directory): the next process probes too.
            let _ = cache.store(key);
        }
        Ok(Probed::Measured)
    }
}

impl ChunkSource for VmmSource {
    type Chunk = VmmBuffer;
    type Mapping = MappedImport;

    fn granularity(&self, device: i32) -> Result<usize, SourceError> {
        Ok(self.gpu(device)?.granularity)
    }

    fn create(&self, device: i32, size: usize) -> Result<(u64, VmmBuffer), SourceError> {
        let gpu = self.gpu(device)?;
        let buf =
            VmmBuffer::on_device(gpu.device, size, gpu.granularity, &gpu.peers).map_err(failed)?;
        Ok((cuda::DeviceMemory::device_ptr(&buf), buf))
    }

    fn map(&self, device: i32, chunk: &VmmBuffer) -> Result<(*mut u8, MappedImport), SourceError> {
        let gpu = self.gpu(device)?;
        let be = Self::vulkan(&gpu).inspect_err(|e| {
            // The cache said this would work and it did not (for another reason than a full
            // device, which passes): the next process probes.
            if *e != SourceError::OutOfMemory {
                if let Some((cache, key)) = gpu.cached_by.get() {
                    cache.forget(key);
                }
            }
        })?;
        let fd = chunk.export_fd().map_err(failed)?;
        let m = be
            .import_mapped(fd, chunk.alloc_size())
            .map_err(failed_bar)?;
        Ok((m.host_ptr(), m))
    }
}
