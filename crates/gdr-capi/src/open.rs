//! `gdr_open` and `gdr_close`: choosing the backends, the `gdr_t` tokens (a forked child's
//! included), and releasing what a `gdr_t` still holds.

use crate::entry::guard;
use crate::log::{log, Level};
use crate::table::{self, forked, with_state, Gdr, Handle};
use crate::{copy, ucx};
use gdr::bar::{PinBackend, Pinner, VulkanBackend};
use gdr::cuda::{Context, CudaError};
use std::ffi::{c_int, c_void};
use std::panic::catch_unwind;

fn open_inner() -> Option<Gdr> {
    // Before any GPU work: a UCX process without gdr's allocator is better off without us.
    let stage = match ucx::decide(
        ucx::mode(),
        ucx::gdrcopy_module_loaded(),
        gdr::bar::pool::is_present(),
    ) {
        ucx::Decision::Open { stage } => stage,
        ucx::Decision::Refuse(why) => {
            log!(
                Level::Warn,
                "gdr_open: {why} (GDR_CAPI_UCX=off opens anyway)"
            );
            return None;
        }
    };
    let ordinal = std::env::var("GDR_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let ctx = match Context::on(ordinal) {
        Ok(c) => c,
        Err(e) => {
            log!(Level::Error, "{}", no_gpu_line(ordinal, &e));
            return None;
        }
    };
    // gdrcopy's switch for its dma-buf backend; GDR_BACKEND (read by Pinner) names any.
    let choice = match std::env::var("GDRCOPY_USE_DMABUF_MMAP").as_deref() {
        Ok("1") => Some(PinBackend::DmaBuf),
        _ => None,
    };
    let pinner = match Pinner::new(&ctx, choice) {
        Ok(p) => {
            log!(
                Level::Info,
                "gdr_open: {} backend ({})",
                p.backend(),
                p.reason()
            );
            Some(p)
        }
        Err(e) if choice.is_some() => {
            log!(Level::Error, "gdr_open: GDRCOPY_USE_DMABUF_MMAP=1 but {e}");
            return None;
        }
        Err(e) => {
            log!(Level::Warn, "gdr_open: nothing can be pinned here: {e}");
            None
        }
    };
    let vulkan = match VulkanBackend::new(&ctx) {
        Ok(v) => Ok(v),
        Err(e) => {
            log!(Level::Info, "gdr_open: gdr_alloc_mapped unavailable: {e}");
            Err(e)
        }
    };
    let vulkan = match (vulkan, &pinner) {
        (Ok(v), _) => Some(v),
        (Err(_), Some(_)) => None,
        (Err(e), None) => {
            log!(Level::Error, "{}", no_backend_line(&e));
            return None;
        }
    };
    Some(Gdr {
        backend: pinner.as_ref().map(Pinner::backend),
        pinners: [(ctx.device().ordinal(), pinner)].into_iter().collect(),
        ctx,
        vulkan,
        stage,
    })
}

/// `gdr_open`'s error line when GPU `ordinal` cannot be opened: the CUDA error, which names a
/// missing device node and its fix where that is why ([`CudaError::MissingNodes`]).
pub(crate) fn no_gpu_line(ordinal: usize, e: &CudaError) -> String {
    format!("gdr_open: no usable GPU {ordinal}: {e}")
}

/// `gdr_open`'s error line when nothing can be pinned and Vulkan failed with `vulkan`: Vulkan's
/// reason comes first, since it names the fix for a missing ICD (in a container, the
/// `graphics` driver capability).
pub(crate) fn no_backend_line(vulkan: &gdr::bar::BarError) -> String {
    format!(
        "gdr_open: no backend works here: {vulkan} (gdrdrv, CUDA 13.3+ dma-buf mmap or Vulkan \
         with a mappable BAR1 are needed; `gdr info` explains)"
    )
}

/// The `gdr_t` of a `gdr_open` in a forked child: a token with bit 0 set (the parent's have
/// it clear), good for `gdr_close` only.
fn child_token() -> *mut c_void {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((n << 4) | 1) as *mut c_void
}

fn is_child_token(g: *mut c_void) -> bool {
    g as usize & 1 == 1
}

/// gdrcopy's `gdr_open`: opens CUDA device 0 (or `GDR_CUDA_DEVICE`), picks the first pinning
/// backend that works there (gdrdrv, dma-buf mmap, Vulkan; `GDRCOPY_USE_DMABUF_MMAP=1` or
/// `GDR_BACKEND` choose one) and opens Vulkan for [`gdr_alloc_mapped`](crate::gdr_alloc_mapped).
///
/// Returns a `gdr_t`: an opaque token, not a pointer, valid until [`gdr_close`]. NULL when
/// no GPU is usable, when no backend works (nor `gdr_alloc_mapped`), or when the backend
/// `GDRCOPY_USE_DMABUF_MMAP=1` asks for does not; the log says why, and there is no errno.
/// In a child forked after a `gdr_open`, a token that only `gdr_close` accepts.
///
/// UCX (its `gdr_copy` module loaded in the process) fails every registration when one pin
/// fails, so there, by default (`GDR_CAPI_UCX` unset or `auto`): without gdr's allocator in
/// the process, NULL (UCX then runs as without gdrcopy); with it, a pin of memory that cannot
/// be mapped is a *staged pin*, whose `gdr_map` gives inaccessible addresses and whose copies
/// run on the copy engine. `GDR_CAPI_UCX=staged` stages in every process, `off` never.
/// docs/ucx.md has the reasons.
#[no_mangle]
pub extern "C" fn gdr_open() -> *mut c_void {
    if forked() {
        // gdrcopy's gdr_open in a child only opens the driver; what the child then asks of the
        // parent's memory fails. Here CUDA (initialised in the parent) does not carry across
        // fork either: the child gets a gdr_t that can be closed, and every other call with it
        // fails with EINVAL.
        log!(
            Level::Info,
            "gdr_open: in a child forked after gdr_open: this gdr_t can only be closed (CUDA \
             and the parent's pins do not carry across fork)"
        );
        return child_token();
    }
    catch_unwind(|| {
        table::watch_fork();
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        let Some(g) = open_inner() else {
            return std::ptr::null_mut();
        };
        copy::init(g.vulkan.as_ref());
        // A token that is never handed out twice (not a freed allocation that malloc could
        // return again), so a stale gdr_t can never alias a newer one.
        with_state(|s| {
            let token = (s.fresh() as usize) << 4;
            s.gdrs.insert(token, g);
            token as *mut c_void
        })
    })
    .unwrap_or(std::ptr::null_mut())
}

/// gdrcopy's `gdr_close`: unmaps and unpins every handle still held through `g`, frees its
/// [`gdr_alloc_mapped`](crate::gdr_alloc_mapped) memory, and forgets `g`.
///
/// 0, or EINVAL when `g` is not an open `gdr_t` (closed before, made up, NULL).
#[no_mangle]
pub extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    if forked() && is_child_token(g) {
        return 0;
    }
    guard("gdr_close", || {
        let (gone, doomed) = with_state(|s| {
            let gone = s.gdrs.remove(&(g as usize));
            let keys: Vec<u64> = s
                .handles
                .iter()
                .filter(|(_, h)| h.owner == g as usize)
                .map(|(&k, _)| k)
                .collect();
            let doomed: Vec<Handle> = keys
                .into_iter()
                .filter_map(|k| s.handles.remove(&k))
                .collect();
            (gone, doomed)
        });
        let Some(gdr) = gone else {
            return libc::EINVAL;
        };
        let _current = gdr::cuda::CurrentContextGuard::save().ok();
        if !doomed.is_empty() {
            log!(
                Level::Info,
                "gdr_close: releasing {} handle(s) still pinned or allocated",
                doomed.len()
            );
        }
        drop(doomed); // unmaps, then unpins or frees, outside the lock
        drop(gdr);
        0
    })
}
