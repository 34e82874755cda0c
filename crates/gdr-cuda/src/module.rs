//! Loaded modules, their kernels, and kernel launches (their arguments are `args`'s).

use super::{driver, nvrtc, sys, Context, CudaError, KernelArgs, Result, Stream};
use std::ffi::c_int;

/// A loaded module (cubin from NVRTC).
pub struct Module {
    ctx: Context,
    raw: sys::CUmodule,
    /// Kernels already resolved, by name (`CUfunction` as usize so the map is Send): a lookup
    /// per launch would put a CString and a driver call on every launch's path.
    functions: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

// SAFETY: module handles are context-wide and usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a cubin or PTX image.
    pub fn load(ctx: &Context, image: &[u8]) -> Result<Module> {
        let d = driver()?;
        ctx.bind()?;
        // PTX must be NUL-terminated; a cubin is self-describing. Append a NUL either way.
        let mut owned = image.to_vec();
        owned.push(0);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the image buffer is alive for the call; the driver copies it.
        d.check("cuModuleLoadData", unsafe {
            (d.api.module_load_data)(&mut raw, owned.as_ptr().cast())
        })?;
        Ok(Module {
            ctx: ctx.clone(),
            raw,
            functions: Default::default(),
        })
    }

    /// Compiles CUDA C with NVRTC for this context's device (cached per process) and loads it.
    pub fn from_source(ctx: &Context, name: &str, source: &str) -> Result<Module> {
        let cubin = nvrtc::compile_for(ctx.device(), name, source)?;
        Self::load(ctx, &cubin)
    }

    /// The kernel `name`, resolved once per module and cached.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let mut cache = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&raw) = cache.get(name) {
            return Ok(Function {
                raw: raw as sys::CUfunction,
                _module: self,
            });
        }
        let d = driver()?;
        let cname = std::ffi::CString::new(name).map_err(|_| CudaError::BadName(name.into()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: module alive, name NUL-terminated.
        d.check("cuModuleGetFunction", unsafe {
            (d.api.module_get_function)(&mut raw, self.raw, cname.as_ptr())
        })?;
        cache.insert(name.to_string(), raw as usize);
        Ok(Function { raw, _module: self })
    }

    /// The context the module was loaded into; the module keeps it alive.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the module; functions borrow it, so none is left.
            unsafe { (d.api.module_unload)(self.raw) };
        }
    }
}

/// A kernel in a loaded module.
pub struct Function<'m> {
    raw: sys::CUfunction,
    _module: &'m Module,
}

/// Launch geometry.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    /// Blocks in x, y and z (`cuLaunchKernel`'s `gridDimX/Y/Z`); each at least 1.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y and z (`blockDimX/Y/Z`); their product at most the kernel's
    /// [`Function::max_threads_per_block`].
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block in bytes (`sharedMemBytes`); above 48 KiB the kernel
    /// needs [`Function::set_max_dynamic_shared`] first.
    pub shared_mem: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch: `blocks` blocks of `threads` threads, no dynamic shared
    /// memory.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem: 0,
        }
    }
}

impl Function<'_> {
    /// Lets launches of this kernel ask for up to `bytes` of dynamic shared memory; needed
    /// above 48 KiB, where the driver otherwise refuses the launch.
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        let d = driver()?;
        // Beyond c_int any value is far past every GPU's limit: the driver refuses it.
        let v = c_int::try_from(bytes).unwrap_or(c_int::MAX);
        // SAFETY: the function handle is alive (it borrows its module); plain value arguments.
        d.check("cuFuncSetAttribute", unsafe {
            (d.api.func_set_attribute)(
                self.raw,
                sys::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                v,
            )
        })
    }

    /// One of the kernel's attributes (`cuFuncGetAttribute`); a negative value reads as 0.
    fn attribute(&self, attr: c_int) -> Result<u32> {
        let d = driver()?;
        let mut v: c_int = 0;
        // SAFETY: the function handle is alive (it borrows its module); `v` is a valid out
        // pointer for the call.
        d.check("cuFuncGetAttribute", unsafe {
            (d.api.func_get_attribute)(&mut v, attr, self.raw)
        })?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// The most threads a block of this kernel can have (its registers per thread decide).
    pub fn max_threads_per_block(&self) -> Result<u32> {
        self.attribute(sys::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
    }

    /// The cluster width the kernel was compiled for (`__cluster_dims__`), or 1 without one.
    pub fn required_cluster_width(&self) -> Result<u32> {
        Ok(self
            .attribute(sys::FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)?
            .max(1))
    }

    /// How many of this kernel's clusters the GPU can hold at once in a launch of `cfg`
    /// (`cuOccupancyMaxActiveClusters`; the kernel's compile-time cluster size).
    pub fn max_active_clusters(&self, stream: &Stream, cfg: LaunchConfig) -> Result<u32> {
        let d = driver()?;
        let lc = sys::CUlaunchConfig {
            grid_dim: [cfg.grid.0, cfg.grid.1, cfg.grid.2],
            block_dim: [cfg.block.0, cfg.block.1, cfg.block.2],
            shared_mem_bytes: cfg.shared_mem,
            stream: stream.raw(),
            attrs: std::ptr::null_mut(),
            num_attrs: 0,
        };
        let mut n: c_int = 0;
        // SAFETY: the function handle and the stream are alive; `lc` is a complete
        // CUlaunchConfig with no attributes, `n` a valid out pointer.
        d.check("cuOccupancyMaxActiveClusters", unsafe {
            (d.api.occupancy_max_active_clusters)(&mut n, self.raw, &lc)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Launches the kernel on `stream` with `args` as its parameters. The driver copies the
    /// parameters' values during the call, so `args` is borrowed only for it.
    ///
    /// # Safety
    /// `args` must match the kernel's signature: as many parameters, in its order, each of the
    /// C type of its parameter (a `u64` device address for a pointer, `u32` for an `unsigned
    /// int`, ...). Any memory the kernel touches must stay alive until it completes.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        args: &KernelArgs<'_>,
    ) -> Result<()> {
        let d = driver()?;
        // SAFETY: the caller guarantees the parameters match the kernel; each pointer in
        // `args` is a live borrow of its value, and the driver only reads the array and the
        // values (the `*mut` is the C signature's). Handles are alive.
        d.check("cuLaunchKernel", unsafe {
            (d.api.launch_kernel)(
                self.raw,
                cfg.grid.0,
                cfg.grid.1,
                cfg.grid.2,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                cfg.shared_mem,
                stream.raw,
                args.as_ptrs().as_ptr().cast_mut(),
                std::ptr::null_mut(),
            )
        })
    }
}
