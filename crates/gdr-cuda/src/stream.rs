//! Streams (ordered queues of GPU work) and the events that time them.

use super::{check_range, driver, sys, Context, DeviceMemory, Result};

/// A CUDA stream (`CUstream`): a queue of GPU work (copies, kernels, graph launches) that runs
/// in order. Destroyed on drop (`cuStreamDestroy`); work still queued then completes first.
///
/// # Examples
///
/// ```
/// use gdr_cuda::{Context, CudaError, DeviceBuffer, Event, Stream};
/// # /// The skip rule of gdr-testing, inline as in the crate's example.
/// # fn skipped(why: &dyn std::fmt::Display) {
/// #     use std::io::Write;
/// #     let required = std::env::var("GDR_REQUIRE_GPU").is_ok_and(|v| v == "1");
/// #     assert!(!required, "GDR_REQUIRE_GPU=1 but no usable GPU: {why}");
/// #     if let Some(log) = std::env::var_os("GDR_SKIP_LOG") {
/// #         let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
/// #         writeln!(f, "skipped: no GPU: gdr_cuda::Stream example (doctest)").unwrap();
/// #     }
/// # }
///
/// let ctx = match Context::on(0) {
///     Ok(ctx) => ctx,
///     Err(e) => {
/// #       skipped(&e);
///         return Ok(());
///     }
/// };
/// let stream = Stream::new(&ctx)?;
/// let (start, end) = (Event::new(&ctx)?, Event::new(&ctx)?);
/// let buf = DeviceBuffer::new(&ctx, 1 << 20)?;
/// let src: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
/// let mut back = vec![0u8; src.len()];
/// start.record(&stream)?;
/// // SAFETY: `src` and `back` outlive the copies, and `back` is read only after the
/// // stream's synchronize.
/// unsafe {
///     stream.memcpy_htod_async(&buf, 0, &src)?;
///     stream.memcpy_dtoh_async(&mut back, &buf, 0)?;
/// }
/// end.record(&stream)?;
/// stream.synchronize()?;
/// assert!(stream.query()?, "nothing left queued");
/// assert_eq!(back, src);
/// assert!(end.elapsed_ms_since(&start)? >= 0.0);
/// # Ok::<(), CudaError>(())
/// ```
pub struct Stream {
    pub(super) ctx: Context,
    pub(super) raw: sys::CUstream,
}

// SAFETY: streams may be used from any thread with the context current.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream (does not synchronise with the legacy default stream).
    pub fn new(ctx: &Context) -> Result<Stream> {
        let d = driver()?;
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuStreamCreate", unsafe {
            (d.api.stream_create)(&mut raw, sys::STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The raw `CUstream`, for driver calls this crate does not wrap; valid while `self`
    /// lives.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context the stream was created in; the stream keeps it alive.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Blocks until all work queued on this stream is done (`cuStreamSynchronize`), and
    /// returns the first error that work hit.
    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        d.check("cuStreamSynchronize", unsafe {
            (d.api.stream_synchronize)(self.raw)
        })
    }

    /// Ok(true) when all work is done, Ok(false) while some is pending, Err if it failed.
    pub fn query(&self) -> Result<bool> {
        let d = driver()?;
        // SAFETY: the stream is alive.
        match unsafe { (d.api.stream_query)(self.raw) } {
            sys::CUDA_ERROR_NOT_READY => Ok(false),
            rc => d.check("cuStreamQuery", rc).map(|_| true),
        }
    }

    /// Asynchronous host-to-device copy.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until the stream has executed the copy; for a
    /// truly asynchronous copy it must be page-locked.
    pub unsafe fn memcpy_htod_async(
        &self,
        dst: &impl DeviceMemory,
        offset: usize,
        src: &[u8],
    ) -> Result<()> {
        check_range("memcpy_htod_async", offset, src.len(), dst.len())?;
        let d = driver()?;
        // SAFETY: range checked; the caller keeps src alive.
        d.check("cuMemcpyHtoDAsync", unsafe {
            (d.api.memcpy_htod_async)(
                dst.device_ptr() + offset as u64,
                src.as_ptr().cast(),
                src.len(),
                self.raw,
            )
        })
    }

    /// Asynchronous device-to-host copy.
    ///
    /// # Safety
    /// `dst` must stay valid and not be read until the stream has executed the copy.
    pub unsafe fn memcpy_dtoh_async(
        &self,
        dst: &mut [u8],
        src: &impl DeviceMemory,
        offset: usize,
    ) -> Result<()> {
        check_range("memcpy_dtoh_async", offset, dst.len(), src.len())?;
        let d = driver()?;
        // SAFETY: range checked; the caller keeps dst alive.
        d.check("cuMemcpyDtoHAsync", unsafe {
            (d.api.memcpy_dtoh_async)(
                dst.as_mut_ptr().cast(),
                src.device_ptr() + offset as u64,
                dst.len(),
                self.raw,
            )
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the stream; the context is alive.
            unsafe { (d.api.stream_destroy)(self.raw) };
        }
    }
}

/// A CUDA event with timing enabled (`CUevent`): a marker recorded on a stream, to wait for or
/// to time the work between two of them ([`elapsed_ms_since`](Self::elapsed_ms_since)).
/// Destroyed on drop.
pub struct Event {
    _ctx: Context,
    pub(super) raw: sys::CUevent,
}

impl Event {
    /// Creates an event with timing enabled (`cuEventCreate` with `CU_EVENT_DEFAULT`) in the
    /// calling thread's current context (bind `ctx` first where another may be current); the
    /// event keeps `ctx` alive.
    pub fn new(ctx: &Context) -> Result<Event> {
        let d = driver()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        d.check("cuEventCreate", unsafe {
            (d.api.event_create)(&mut raw, sys::EVENT_DEFAULT)
        })?;
        Ok(Event {
            _ctx: ctx.clone(),
            raw,
        })
    }

    /// Records the event on `stream` (`cuEventRecord`): it completes once the work queued
    /// there before it has. Recording again moves it.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let d = driver()?;
        // SAFETY: event and stream are alive.
        d.check("cuEventRecord", unsafe {
            (d.api.event_record)(self.raw, stream.raw)
        })
    }

    /// Blocks until the last recording of the event has completed (`cuEventSynchronize`);
    /// returns at once for an event never recorded.
    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: the event is alive.
        d.check("cuEventSynchronize", unsafe {
            (d.api.event_synchronize)(self.raw)
        })
    }

    /// Milliseconds between `start` and `self` (both recorded and complete).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        let d = driver()?;
        let mut ms = 0f32;
        // SAFETY: both events are alive.
        d.check("cuEventElapsedTime", unsafe {
            (d.api.event_elapsed_time)(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: we own the event.
            unsafe { (d.api.event_destroy)(self.raw) };
        }
    }
}

/// Waits for the work queued on the legacy default stream, where the plain (non-`Async`)
/// `cuMemcpy*` calls run; unlike [`Context::synchronize`] it does not wait for kernels on
/// non-blocking streams (a persistent worker, for instance).
pub fn synchronize_legacy_stream() -> Result<()> {
    let d = driver()?;
    // SAFETY: the null stream handle names the legacy default stream.
    d.check("cuStreamSynchronize", unsafe {
        (d.api.stream_synchronize)(std::ptr::null_mut())
    })
}
