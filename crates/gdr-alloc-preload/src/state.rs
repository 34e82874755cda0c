//! The process's allocator: its settings, its pool, which GPUs it serves, and its messages.

use crate::real::{self, call_real, CUresult, CUDA_SUCCESS};
use gdr_alloc::{Config, Pool, ProbeCache, Probed, VmmSource};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The allocator, made at the first allocation call.
pub struct Allocator {
    /// The settings, read from `GDR_ALLOC*` at the first allocation call.
    pub config: Config,
    /// The pool that serves the GPUs the settings and the probe allow.
    pub pool: Pool<VmmSource>,
    /// Per CUDA ordinal: served, or why not (probed once).
    gpus: Mutex<HashMap<i32, Result<(), String>>>,
    /// Frees that wait for their stream (PyTorch's pluggable-allocator frees): the event
    /// recorded on the stream at the free, and the address.
    deferred: Mutex<Vec<(usize, u64)>>,
    /// Per served CUDA ordinal: the context that was current when its first allocation was
    /// served (the primary context for programs of the runtime), which pool memory reports as
    /// its `CU_POINTER_ATTRIBUTE_CONTEXT`.
    contexts: Mutex<HashMap<i32, usize>>,
}

static ALLOCATOR: OnceLock<Option<Allocator>> = OnceLock::new();

/// Raised in a child after fork(): the pool's chunks are the parent's (CUDA does not carry
/// across fork), so the child passes every call to the driver, which answers as it does in a
/// forked child.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn in_forked_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Prints `msg` once per `key` for the life of the process, when the level allows it.
pub fn say_once(level: u8, key: &str, msg: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    if log_level() < level {
        return;
    }
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(key.to_owned()) {
        eprintln!("gdr_alloc: {msg}");
    }
}

/// Prints `msg` when the level allows it (level 2: every call).
pub fn say(level: u8, msg: std::fmt::Arguments<'_>) {
    if log_level() >= level {
        eprintln!("gdr_alloc: {msg}");
    }
}

/// The `GDR_ALLOC_LOG` level (1 until the settings are read).
pub fn log_level() -> u8 {
    match ALLOCATOR.get() {
        Some(Some(a)) => a.config.log,
        _ => std::env::var("GDR_ALLOC_LOG")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1),
    }
}

/// The allocator, made on first use; `None` when it passes everything through (switched off,
/// or a setting it cannot use: said once).
pub fn get() -> Option<&'static Allocator> {
    if FORKED.load(Ordering::Relaxed) {
        return None;
    }
    ALLOCATOR
        .get_or_init(|| {
            let config = match Config::from_env() {
                Ok(c) => c,
                Err(e) => {
                    say_once(
                        1,
                        "config",
                        &format!("{e}; passing every allocation through"),
                    );
                    return None;
                }
            };
            if !config.enabled {
                say_once(2, "off", "GDR_ALLOC=off: passing every allocation through");
                return None;
            }
            // Empty chunks go back to the driver when the program exits (before the CUDA
            // runtime's own exit handlers, which were registered earlier and so run later).
            // SAFETY: registering plain extern "C" functions.
            unsafe {
                libc::atexit(at_exit);
                libc::pthread_atfork(None, None, Some(in_forked_child));
            }
            let cache = config.cache;
            Some(Allocator {
                config,
                pool: Pool::new(VmmSource::new(), cache),
                gpus: Mutex::new(HashMap::new()),
                deferred: Mutex::new(Vec::new()),
                contexts: Mutex::new(HashMap::new()),
            })
        })
        .as_ref()
}

/// The allocator if it was ever made (frees and queries: no pool memory exists before).
pub fn existing() -> Option<&'static Allocator> {
    if FORKED.load(Ordering::Relaxed) {
        return None;
    }
    ALLOCATOR.get().and_then(Option::as_ref)
}

/// At exit: the idle chunks that were never mapped go back to the driver. Mapped ones stay
/// (their mapping is the Vulkan driver's, which has torn itself down by then: freeing it
/// crashed in gdrcopy's programs), and so do blocks still allocated (exit handlers registered
/// before this one, C++ destructors among them, may still use them). The driver reclaims all of
/// it with the process.
extern "C" fn at_exit() {
    if let Some(a) = existing() {
        let _ = std::panic::catch_unwind(|| a.pool.trim_unmapped());
    }
}

/// The CUDA ordinal of the context current on this thread; `None` when there is none.
pub fn current_device() -> Option<c_int> {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    if call_real!(ctx_get_current(&mut ctx)) != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut dev: c_int = -1;
    (call_real!(ctx_get_device(&mut dev)) == CUDA_SUCCESS).then_some(dev)
}

impl Allocator {
    /// Whether allocations on `device` are served; probes the GPU the first time (a chunk made,
    /// imported into Vulkan and mapped: slow, unless the probe cache of an earlier process
    /// answers, `GDR_ALLOC_PROBE`) and says once why not.
    pub fn serves(&self, device: c_int) -> Result<(), String> {
        if !self.config.serves_gpu(device) {
            return Err(format!("GPU {device} is not in GDR_ALLOC_GPUS"));
        }
        if let Some(r) = self
            .gpus
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&device)
        {
            return r.clone();
        }
        let cache = self.config.probe_cache.then(ProbeCache::of_process);
        let probed = self.pool.source().probe(device, cache.as_ref());
        let r = probed.clone().map(drop);
        if r.is_ok() {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            if call_real!(ctx_get_current(&mut ctx)) == CUDA_SUCCESS && !ctx.is_null() {
                self.contexts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(device)
                    .or_insert(ctx as usize);
            }
        }
        match &probed {
            Ok(how) => {
                let how = match how {
                    Probed::Measured => "probed",
                    Probed::Cached => {
                        "probe cached by an earlier process; Vulkan opens at the first pin"
                    }
                };
                say_once(
                    2,
                    &format!("gpu{device}"),
                    &format!(
                        "GPU {device}: serving cudaMalloc/cuMemAlloc from POSIX-fd cuMemCreate \
                         chunks, mappable for the CPU through Vulkan ({how})"
                    ),
                )
            }
            Err(why) => say_once(
                1,
                &format!("gpu{device}"),
                &format!("GPU {device}: passing allocations through to the driver: {why}"),
            ),
        }
        self.gpus
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(device)
            .or_insert(r)
            .clone()
    }

    /// The context pool memory at `addr` reports: the one recorded for its GPU at that GPU's
    /// first allocation; `None` for memory that is not a live block of the pool.
    pub fn context_of(&self, addr: u64) -> Option<*mut c_void> {
        let b = self.pool.block_at(addr)?;
        let ctx = *self
            .contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&b.device)?;
        Some(ctx as *mut c_void)
    }

    /// Frees `addr` (pool memory) once the work before this point on `stream` is done: an
    /// event marks that point; the block is freed when a later call finds the event complete.
    /// Without an event (the driver refused one) the stream is synchronised now.
    pub fn free_after(&self, addr: u64, stream: *mut c_void) -> CUresult {
        let mut ev: *mut c_void = std::ptr::null_mut();
        // CU_EVENT_DISABLE_TIMING (2): the cheapest kind.
        if call_real!(event_create(&mut ev, 2)) == CUDA_SUCCESS {
            if call_real!(event_record(ev, stream)) == CUDA_SUCCESS {
                self.deferred
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((ev as usize, addr));
                return CUDA_SUCCESS;
            }
            call_real!(event_destroy(ev));
        }
        let rc = call_real!(stream_synchronize(stream));
        self.pool.free(addr);
        rc
    }

    /// Frees the deferred blocks whose events completed (all of them, after waiting, with
    /// `wait`).
    pub fn drain_deferred(&self, wait: bool) {
        let done: Vec<(usize, u64)> = {
            let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if d.is_empty() {
                return;
            }
            let mut done = Vec::new();
            d.retain(|&(ev, addr)| {
                let complete = wait
                    || call_real!(event_query(ev as *mut c_void)) != real::CUDA_ERROR_NOT_READY;
                if complete {
                    done.push((ev, addr));
                }
                !complete
            });
            done
        };
        for (ev, addr) in done {
            if wait {
                // SAFETY: an event this allocator created and has not destroyed.
                call_real!(event_synchronize(ev as *mut c_void));
            }
            call_real!(event_destroy(ev as *mut c_void));
            self.pool.free(addr);
        }
    }
}
