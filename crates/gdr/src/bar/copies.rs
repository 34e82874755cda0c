//! The copies every front end makes, in one place: [`DeviceMapped`], a [`MappedMemory`] that
//! knows the GPU memory behind its mapping, and [`EngineCopy`], how its copy-engine copies
//! run.
//!
//! A CPU mapping of GPU memory can be copied three ways: CPU stores and loads on the calling
//! thread ([`MappedMemory::write_at`] / [`MappedMemory::read_at`]), the same split over several
//! threads ([`MappedMemory::write_parallel`] / [`MappedMemory::read_parallel`]), which every
//! `MappedMemory` has, and the GPU's copy engine, which needs the device address and the
//! context of the memory: [`DeviceMapped::engine_write`] / [`DeviceMapped::engine_read`]. The
//! auto copier ([`super::auto`]) picks one per size, over any `DeviceMapped`; gdr's own buffers
//! ([`MappedBuffer`]), the C library's mappings and the benchmarks all go through these.
//!
//! Front ends differ only in what an engine copy promises its caller, and that is an option of
//! the one implementation ([`EngineCopy`]), not a copy path of their own: which stream it runs
//! on, whether the calling thread's stores through mappings are fenced before it starts,
//! whether the caller's current CUDA context is put back, and whether a failed engine copy is
//! done through the mapping instead.

use super::{BarError, MappedBuffer};
use crate::cuda::{
    self, Context, CudaError, CurrentContextGuard, DeviceMemory, DeviceRange, Stream,
};
use gdr_mem::{check_range, MappedMemory};
use std::sync::OnceLock;

/// A stream of one's own for copy-engine copies, made at the first copy that uses it (so a
/// front end that never leaves the mapping creates none). Unlike the legacy default stream, it
/// does not wait for other work there, so a persistent kernel on the default stream cannot
/// block a copy. When it cannot be made, every copy that asks for it fails: the first with
/// the driver's reason, the later ones with [`CudaError::NoDevice`].
#[derive(Default)]
pub struct LazyStream {
    cell: OnceLock<Option<Stream>>,
}

impl LazyStream {
    /// A stream not made yet.
    pub const fn new() -> LazyStream {
        LazyStream {
            cell: OnceLock::new(),
        }
    }

    /// The stream, made in `ctx` at the first call (which binds `ctx` on this thread).
    fn get(&self, ctx: &Context) -> Result<&Stream, CudaError> {
        let mut failed = None;
        let made = self.cell.get_or_init(|| match Stream::new(ctx) {
            Ok(s) => Some(s),
            Err(e) => {
                failed = Some(e);
                None
            }
        });
        match (made, failed) {
            (Some(s), _) => Ok(s),
            (None, Some(e)) => Err(e),
            (None, None) => Err(CudaError::NoDevice),
        }
    }
}

impl std::fmt::Debug for LazyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.cell.get() {
            None => "not made",
            Some(Some(_)) => "made",
            Some(None) => "failed",
        };
        f.debug_tuple("LazyStream").field(&state).finish()
    }
}

/// How a copy-engine copy of some memory runs and what it promises its caller: the one
/// implementation of the engine path, whose options are the front ends' differences.
///
/// [`EngineCopy::new`] is the Rust API's way: on the legacy default stream (`cuMemcpyHtoD`,
/// then a wait for that stream, since a pageable copy returns before it has landed; reads as
/// [`cuda::read_into_host`]), with the memory's context bound and left bound, and errors
/// returned. The C library adds its own stream, a store fence first, the caller's context put
/// back, and the mapping as the fallback.
#[derive(Clone, Copy)]
pub struct EngineCopy<'a> {
    context: &'a Context,
    stream: Option<&'a LazyStream>,
    fence_first: bool,
    restore_context: bool,
    fallback: Option<fn(&CudaError)>,
}

impl<'a> EngineCopy<'a> {
    /// Copies of memory in `context` on the legacy default stream, leaving `context` current
    /// on the calling thread, with no fence first and no fallback.
    pub fn new(context: &'a Context) -> EngineCopy<'a> {
        EngineCopy {
            context,
            stream: None,
            fence_first: false,
            restore_context: false,
            fallback: None,
        }
    }

    /// Runs the copies on `stream` (made in the copy's context at its first use), waiting for
    /// that stream alone.
    pub fn on_stream(self, stream: &'a LazyStream) -> EngineCopy<'a> {
        EngineCopy {
            stream: Some(stream),
            ..self
        }
    }

    /// Fences the calling thread's earlier stores through write-combined mappings before the
    /// copy starts, so that a copy-engine read sees them: the fence drains the write-combining
    /// buffers, and the copy's launch reaches the GPU behind those writes, in PCIe order.
    pub fn fencing_stores_first(self) -> EngineCopy<'a> {
        EngineCopy {
            fence_first: true,
            ..self
        }
    }

    /// Puts the calling thread's current CUDA context back when the copy returns.
    pub fn restoring_context(self) -> EngineCopy<'a> {
        EngineCopy {
            restore_context: true,
            ..self
        }
    }

    /// When the copy engine fails on a range that fits the memory, tells `note` and copies
    /// through the mapping on the calling thread instead, so that such a copy never fails
    /// ([`DeviceMapped::engine_write`] and [`DeviceMapped::engine_read`] only: a bare
    /// [`EngineCopy::write`] has no mapping to fall back on).
    pub fn falling_back(self, note: fn(&CudaError)) -> EngineCopy<'a> {
        EngineCopy {
            fallback: Some(note),
            ..self
        }
    }

    /// The context the copies run in.
    pub fn context(&self) -> &'a Context {
        self.context
    }

    /// Copies `src` into `dst` at `offset` with the copy engine and waits until it has landed.
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the range leaves `dst` (nothing copied), or the
    /// driver's error.
    pub fn write(
        &self,
        dst: &impl DeviceMemory,
        offset: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let _current = self.enter()?;
        match self.stream()? {
            None => {
                cuda::memcpy_htod(dst, offset, src)?;
                // A pageable HtoD returns once staged; wait until it has landed.
                cuda::synchronize_legacy_stream()
            }
            Some(stream) => {
                // SAFETY: `src` is borrowed for this call and outlives the copy: the stream is
                // synchronised before this returns.
                unsafe { stream.memcpy_htod_async(dst, offset, src)? };
                stream.synchronize()
            }
        }
    }

    /// Reads `dst.len()` bytes of `src` at `offset` into `dst` with the copy engine; `dst` holds
    /// them when this returns. Through gdr's page-locked chunks where `dst` is pageable and at
    /// most [`cuda::STAGED_READ_MAX`] ([`cuda::read_into_host`], faster than the driver's
    /// pageable path there).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the range leaves `src`, or the driver's error.
    pub fn read(
        &self,
        src: &impl DeviceMemory,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), CudaError> {
        let _current = self.enter()?;
        let stream = self.stream()?;
        cuda::read_into_host(self.context, dst, src, offset, stream)
    }

    /// What every copy does first: the fence when asked for, the caller's context saved when it
    /// is to be put back (the guard returned does that when dropped), and the memory's context
    /// bound. The copy engine needs it current on this thread; the mapping paths need none, so
    /// a thread without it would otherwise fail on large copies only.
    fn enter(&self) -> Result<Option<CurrentContextGuard>, CudaError> {
        if self.fence_first {
            gdr_mem::store_fence();
        }
        let saved = if self.restore_context {
            Some(CurrentContextGuard::save()?)
        } else {
            None
        };
        self.context.bind()?;
        Ok(saved)
    }

    /// The stream to copy on: `None` for the legacy default stream.
    fn stream(&self) -> Result<Option<&'a Stream>, CudaError> {
        self.stream.map(|s| s.get(self.context)).transpose()
    }
}

impl std::fmt::Debug for EngineCopy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineCopy")
            .field("own_stream", &self.stream.is_some())
            .field("fence_first", &self.fence_first)
            .field("restore_context", &self.restore_context)
            .field("fallback", &self.fallback.is_some())
            .finish()
    }
}

/// A CPU mapping of GPU memory that knows the GPU side of the same bytes, so it has the copy
/// engine's copies beside the mapping's own, and the auto copier ([`super::auto::AutoCopier`])
/// copies it.
///
/// Implementors promise that [`device_addr`](Self::device_addr) `..+ size()` is the GPU memory
/// that `cpu_ptr()..+ size()` maps, alive as long as the mapping is, in the context that
/// [`engine`](Self::engine) names.
pub trait DeviceMapped: MappedMemory {
    /// The CUDA device address of the mapping's first byte.
    fn device_addr(&self) -> u64;

    /// How copy-engine copies of this memory run ([`EngineCopy`]).
    fn engine(&self) -> EngineCopy<'_>;

    /// The GPU side of the mapping: [`device_addr`](Self::device_addr), `size()` bytes.
    fn device_range(&self) -> DeviceRange {
        DeviceRange {
            addr: self.device_addr(),
            len: self.size(),
        }
    }

    /// Copies `src` to `offset` with the copy engine ([`EngineCopy::write`]): the bytes are in
    /// GPU memory when this returns.
    ///
    /// # Errors
    /// [`BarError::Cuda`] with [`CudaError::OutOfBounds`] when the range leaves the memory, or
    /// the engine's error (unless the engine falls back to the mapping,
    /// [`EngineCopy::falling_back`]).
    fn engine_write(&self, offset: usize, src: &[u8]) -> Result<(), BarError> {
        let engine = self.engine();
        let copied = engine.write(&self.device_range(), offset, src);
        let fits = check_range(offset, src.len(), self.size()).is_ok();
        or_fall_back(&engine, copied, fits, || self.write_at(offset, src))
    }

    /// Reads `dst.len()` bytes at `offset` into `dst` with the copy engine
    /// ([`EngineCopy::read`]).
    ///
    /// # Errors
    /// As [`engine_write`](Self::engine_write).
    fn engine_read(&self, offset: usize, dst: &mut [u8]) -> Result<(), BarError> {
        let engine = self.engine();
        let copied = engine.read(&self.device_range(), offset, dst);
        let fits = check_range(offset, dst.len(), self.size()).is_ok();
        or_fall_back(&engine, copied, fits, || self.read_at(offset, dst))
    }
}

/// An engine copy's outcome: `copied` as it is, unless it failed on a range that `fits` and
/// `engine` falls back; then its note is told and the copy is made through the mapping.
fn or_fall_back(
    engine: &EngineCopy<'_>,
    copied: Result<(), CudaError>,
    fits: bool,
    mapping: impl FnOnce() -> Result<(), gdr_mem::AccessError>,
) -> Result<(), BarError> {
    match (copied, engine.fallback) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some(note)) if fits => {
            note(&e);
            Ok(mapping()?)
        }
        (Err(e), _) => Err(e.into()),
    }
}

impl DeviceMapped for MappedBuffer {
    fn device_addr(&self) -> u64 {
        self.device_ptr()
    }
    fn engine(&self) -> EngineCopy<'_> {
        EngineCopy::new(self.context())
    }
}
