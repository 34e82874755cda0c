//! CPU mappings of GPU memory through the GPU's BAR1.
//!
//! A [`MappedBuffer`] is GPU memory that is at once a CUDA device pointer and a
//! write-combined CPU mapping. The CPU pointer is never handed out as a Rust reference: reads
//! and writes go through [`MappedBuffer::write`] / [`MappedBuffer::read`] or the
//! [`MappedMemory`](crate::mem::MappedMemory) trait it implements (the stream-store and
//! stream-load routines of [`crate::copy`]), and the buffer keeps its block — the mapping and
//! the memory behind it — alive, so no mapping can outlive its memory.
//!
//! A [`Pinner`] pins memory that already exists (gdrcopy's `gdr_pin_buffer`) through one of
//! three backends (gdrdrv, dma-buf mmap, Vulkan import); a [`Pinned`] range is mapped with
//! [`Pinned::map`], and the [`PinnedMapping`] holds its pin, so again no mapping can outlive
//! its memory.
//!
//! [`copies`] holds the copies every front end makes: [`DeviceMapped`], a mapping that knows the
//! GPU memory behind it and so has the copy engine's copies beside the mapping's own, and
//! [`EngineCopy`], how those engine copies run. [`auto`] picks the fastest way (stores through
//! the mapping on 1..N threads, or the copy engine) per direction and size for any
//! `DeviceMapped`. [`pool`] is the ABI through which memory of gdr's allocator is pinned;
//! [`gdrdrv`] speaks to gdrcopy's kernel module directly.
//!
//! Inside, from the bottom: the backends (`backend::{gdrdrv, dmabuf, vulkan}`, which use only
//! the crate's page sizes and the range allocator), then [`pool`], then the pin layer (`pin`),
//! then [`copies`] (which makes [`MappedBuffer`] a [`DeviceMapped`]), then [`auto`].

pub mod auto;
mod backend;
pub mod copies;
mod pin;
pub mod pool;
mod range_alloc;

pub use backend::gdrdrv::{self, GdrDrv, GdrDrvAttr, GdrDrvError, GdrDrvMapping, GdrDrvPin};
pub use backend::vulkan::{BarError, MappedBuffer, MappedImport, VulkanBackend, VulkanInfo};
pub use copies::{DeviceMapped, EngineCopy, LazyStream};
pub use pin::{
    vulkan_import_outcome, BackendStatus, PinBackend, PinError, Pinned, PinnedMapping, Pinner,
    VulkanImportOutcome, BACKEND_ENV, ENOTSUPP,
};
pub use range_alloc::RangeAlloc;

// The dma-buf export is shared with `peer`, which re-exports its public items; `gdr info`
// reports the Vulkan loader's version.
pub(crate) use backend::dmabuf;
pub(crate) use backend::vulkan::{loader_version, nvidia_icd};
