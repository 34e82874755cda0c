//! Copy-engine reads into pageable host memory through page-locked chunks.
//!
//! `cuMemcpyDtoH` into pageable memory is slow for mid-sized reads, while the copy engine fills
//! page-locked memory several times faster over the same sizes. A [`Stager`] keeps four
//! page-locked chunks of 256 KiB and pipelines a read through them: the copy engine fills the
//! next chunks while the CPU copies the finished one out to the caller's memory. Past a few MiB
//! one core's copy-out no longer beats the driver's own pageable path, so [`read_into_host`]
//! stages reads of up to [`STAGED_READ_MAX`] only (the measurements behind both limits:
//! docs/perf.md).
//!
//! Destinations that are page-locked already (`cuMemHostAlloc`, `cuMemHostRegister`) are copied
//! into directly: the copy engine alone is faster there.
//!
//! Ordering: a read runs on the stream it is given, in order with the work queued there before
//! it (`None`: the legacy default stream, as `cuMemcpyDtoH`), and has completed when the call
//! returns.

use super::{check_range, driver, sys, Context, DeviceMemory, Event, Result, Stream};
use std::sync::Mutex;

/// Page-locked chunks a stager keeps in flight.
const SLOTS: usize = 4;
/// Bytes of one chunk: a 1 MiB read overlaps four steps.
const CHUNK: usize = 256 << 10;

/// The largest read [`read_into_host`] stages; larger ones take the driver's pageable path.
pub const STAGED_READ_MAX: usize = SLOTS * CHUNK;

/// The `(offset, len)` pieces, of one chunk at most, that a read of `len` bytes goes in.
fn parts(len: usize) -> Vec<(usize, usize)> {
    (0..len)
        .step_by(CHUNK)
        .map(|at| (at, CHUNK.min(len - at)))
        .collect()
}

struct Slot {
    buf: super::HostBuffer,
    /// Recorded after the chunk's copy into `buf`.
    filled: Event,
}

/// Page-locked staging chunks of one context, for [`Stager::read`].
pub struct Stager {
    ctx: Context,
    slots: Vec<Slot>,
}

// SAFETY: a stager is plain page-locked memory and CUDA events, which the driver lets any
// thread use with the context bound; `read` takes `&mut self`, so one thread at a time does.
unsafe impl Send for Stager {}

impl Stager {
    /// Allocates the chunks (1 MiB of page-locked memory) in `ctx`.
    pub fn new(ctx: &Context) -> Result<Stager> {
        ctx.bind()?;
        let slots = (0..SLOTS)
            .map(|_| {
                Ok(Slot {
                    buf: super::HostBuffer::new(ctx, CHUNK)?,
                    filled: Event::new(ctx)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Stager {
            ctx: ctx.clone(),
            slots,
        })
    }

    /// The context the chunks belong to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Copies `dst.len()` bytes of `src` at `offset` into `dst` with the copy engine, through
    /// the chunks, on `stream` (`None`: the legacy default stream); returns once every byte is
    /// in `dst`. The caller's context must be `self.context()` (bound on this thread).
    pub fn read(
        &mut self,
        dst: &mut [u8],
        src: &impl DeviceMemory,
        offset: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        check_range("staged read", offset, dst.len(), src.len())?;
        let raw = stream.map_or(std::ptr::null_mut(), Stream::raw);
        let r = self.pipeline(dst, src.device_ptr() + offset as u64, raw);
        if r.is_err() {
            // No copy may still be writing a chunk when the next read reuses it.
            let _ = synchronize(stream);
        }
        r
    }

    fn pipeline(&mut self, dst: &mut [u8], src: u64, stream: sys::CUstream) -> Result<()> {
        let parts = parts(dst.len());
        let mut issued = 0;
        while issued < parts.len().min(SLOTS) {
            self.issue(issued, parts[issued], src, stream)?;
            issued += 1;
        }
        for (k, &(at, len)) in parts.iter().enumerate() {
            let slot = &self.slots[k % SLOTS];
            slot.filled.synchronize()?;
            dst[at..at + len].copy_from_slice(&slot.buf.as_slice()[..len]);
            if issued < parts.len() {
                self.issue(issued, parts[issued], src, stream)?;
                issued += 1;
            }
        }
        Ok(())
    }

    /// Queues part `k` (`(at, len)` of the read) into chunk `k % SLOTS` and records its event.
    fn issue(
        &mut self,
        k: usize,
        (at, len): (usize, usize),
        src: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let d = driver()?;
        let slot = &mut self.slots[k % SLOTS];
        let host = slot.buf.as_mut_slice();
        debug_assert!(len <= host.len());
        // SAFETY: `len` <= the chunk's length; the chunk is owned by `self`, which the caller
        // holds mutably until every queued copy has completed (waited for in `pipeline`, or
        // the stream synchronized on an error). The source range was checked by `read`.
        d.check("cuMemcpyDtoHAsync", unsafe {
            (d.api.memcpy_dtoh_async)(host.as_mut_ptr().cast(), src + at as u64, len, stream)
        })?;
        // SAFETY: event and stream are alive.
        d.check("cuEventRecord", unsafe {
            (d.api.event_record)(slot.filled.raw, stream)
        })
    }
}

/// Waits for `stream`'s work (`None`: the legacy default stream's).
fn synchronize(stream: Option<&Stream>) -> Result<()> {
    stream.map_or_else(super::synchronize_legacy_stream, Stream::synchronize)
}

/// Whether the host range `[ptr, ptr + len)` is page-locked memory CUDA knows (allocated or
/// registered), judged by its first and last byte.
pub fn is_page_locked(ptr: *const u8, len: usize) -> bool {
    let Ok(d) = driver() else {
        return false;
    };
    let locked = |p: *const u8| {
        let mut ty: u32 = 0;
        // SAFETY: MEMORY_TYPE writes an unsigned int to the out-pointer; the address is only
        // looked up.
        let rc = unsafe {
            (d.api.pointer_get_attribute)(
                (&mut ty as *mut u32).cast(),
                sys::POINTER_ATTRIBUTE_MEMORY_TYPE,
                p as u64,
            )
        };
        rc == sys::CUDA_SUCCESS && ty == sys::MEMORYTYPE_HOST
    };
    len > 0 && locked(ptr) && locked(ptr.wrapping_add(len - 1))
}

/// One stager per context, made at the first staged read there.
static STAGERS: Mutex<Vec<Stager>> = Mutex::new(Vec::new());

/// Reads `dst.len()` bytes of `src` at `offset` into host memory with the copy engine, on
/// `stream` (`None`: the legacy default stream), and waits for them: straight into `dst` when
/// it is page-locked or larger than [`STAGED_READ_MAX`], else through the process's page-locked
/// chunks for `ctx` (made at the first such read). While another thread holds the chunks, or
/// where they cannot be allocated, the copy goes straight into `dst` too. `ctx` must be bound
/// on this thread and be the context of `src`.
pub fn read_into_host(
    ctx: &Context,
    dst: &mut [u8],
    src: &impl DeviceMemory,
    offset: usize,
    stream: Option<&Stream>,
) -> Result<()> {
    if dst.is_empty() {
        return check_range("read_into_host", offset, 0, src.len());
    }
    if dst.len() <= STAGED_READ_MAX && !is_page_locked(dst.as_ptr(), dst.len()) {
        if let Ok(mut stagers) = STAGERS.try_lock() {
            let at = match stagers.iter().position(|s| s.ctx.same_as(ctx)) {
                Some(i) => Some(i),
                None => Stager::new(ctx).ok().map(|s| {
                    stagers.push(s);
                    stagers.len() - 1
                }),
            };
            if let Some(i) = at {
                return stagers[i].read(dst, src, offset, stream);
            }
        }
    }
    match stream {
        None => super::memcpy_dtoh(dst, src, offset),
        Some(s) => {
            // SAFETY: `dst` is not read before the stream is synchronized just below.
            unsafe { s.memcpy_dtoh_async(dst, src, offset)? };
            s.synchronize()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_a_read_tile_it_in_chunks() {
        assert!(parts(0).is_empty());
        for len in [
            1,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            STAGED_READ_MAX,
            3 * STAGED_READ_MAX + 7,
        ] {
            let p = parts(len);
            assert_eq!(p.len(), len.div_ceil(CHUNK), "{len}");
            let mut next = 0;
            for &(at, n) in &p {
                assert!(at == next && n > 0 && n <= CHUNK, "{len}: {at}+{n}");
                next = at + n;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn without_a_driver_nothing_is_page_locked() {
        // No CUDA on the build machine: the check answers false rather than failing.
        if driver().is_err() {
            let v = [0u8; 16];
            assert!(!is_page_locked(v.as_ptr(), v.len()));
        }
        assert!(!is_page_locked(std::ptr::null(), 0));
    }
}
