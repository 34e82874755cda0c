//! The three ways gdr gets a CPU mapping of GPU memory, side by side. None of them knows of
//! the others or of anything above them: the pin layer (`bar::pin`) chooses among them, and
//! `peer` lends the dma-buf export to other devices' drivers.
//!
//! - [`gdrdrv`]: gdrcopy's kernel module (`/dev/gdrdrv`): pins any `cuMemAlloc` range and maps
//!   it through the device file.
//! - [`dmabuf`]: a CUDA range exported as a dma-buf file descriptor, which the pin layer
//!   `mmap`s and other devices' drivers import.
//! - [`vulkan`]: the NVIDIA Vulkan driver's host-visible device-local memory: new memory mapped
//!   from birth ([`vulkan::MappedBuffer`]), or `cuMemCreate` memory imported and mapped.
//!
//! Page sizes and the fork rule they all follow are in the crate's `page` module, below them.

pub(crate) mod dmabuf;
pub mod gdrdrv;
pub(crate) mod vulkan;
