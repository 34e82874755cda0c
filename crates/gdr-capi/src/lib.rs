//! gdr's `libgdrapi.so.2`: gdrcopy 2.6's C API and ABI (see `include/gdrapi.h`) on top of gdr,
//! pinning through [`gdr::bar::Pinner`] (gdrdrv, dma-buf mmap or Vulkan import), with one
//! extension, [`gdr_alloc_mapped`], for machines where only new memory can be mapped.
//!
//! Every entry point catches panics (none may unwind into C) and returns 0 or a positive errno.
//! Handles and `gdr_t` values live in one process-wide table (the private `table` module), so a
//! stale or made-up one is answered with EINVAL. Messages follow gdrcopy's
//! `GDRCOPY_ENABLE_LOGGING` / `GDRCOPY_LOG_LEVEL` (the private `log` module).
//!
//! # Errors every entry point shares
//!
//! Besides the errnos each function lists: EIO when gdr panics inside the call (the panic is
//! caught and logged), and in a child forked after `gdr_open`, EINVAL for every call but
//! `gdr_open`, `gdr_runtime_get_version` and `gdr_close` of the child's own `gdr_t` (neither
//! CUDA nor the parent's mappings carry across fork). `gdr_open` signals failure with NULL, and
//! `gdr_runtime_get_version` cannot fail.
//!
//! # Safety, from Rust
//!
//! The entry points that write through a caller's pointer or copy to or from one are
//! `unsafe fn`s, each with a `# Safety` section: as in C, an out-pointer must be NULL (refused
//! with EINVAL) or writable, and a copy's host buffer must hold `size` bytes; only the GPU side
//! of a copy is checked against the handle's mapping. `gdr_open`, `gdr_close`, `gdr_unmap`,
//! `gdr_unpin_buffer` and `gdr_free_mapped` are safe: they dereference no pointer (a `gdr_t` is
//! a token looked up in the table, and `gdr_unmap`'s `va` is only compared).
//!
//! # Example
//!
//! gdrcopy's sequence from Rust, through this crate's rlib (the library's crate name is
//! `gdrapi`): open, allocate GPU memory with a CPU mapping (gdr's extension; pinning existing
//! memory with `gdr_pin_buffer` goes on the same way), map, copy in and out, release. Without a
//! usable GPU `gdr_open` answers NULL, as gdrcopy's does, and the example stops there.
//!
//! ```
//! use gdrapi::*;
//! use std::ffi::{c_ulong, c_void};
//!
//! let (mut major, mut minor) = (0, 0);
//! // SAFETY: both point to c_ints (and so for every out-pointer below: references).
//! unsafe { gdr_runtime_get_version(&mut major, &mut minor) };
//! assert_eq!((major, minor), (API_MAJOR, API_MINOR));
//! // A `gdr_t` that was never opened is refused, not followed.
//! assert_eq!(gdr_close(std::ptr::null_mut()), libc::EINVAL);
//!
//! let g = gdr_open();
//! if g.is_null() {
//!     // No usable GPU or no backend here (GDRCOPY_ENABLE_LOGGING=1 says which).
//! #   // The skip rule of every GPU test: a failure under GDR_REQUIRE_GPU=1, else logged.
//! #   gdr_testing::skip_or_fail::<()>("gdr_capi crate example (doctest)", "gdr_open() gave NULL");
//!     return;
//! }
//! let mut backend = 0;
//! // SAFETY: an out-pointer to a c_int.
//! assert_eq!(unsafe { gdr_get_attribute(g, ATTR_GDR_BACKEND, &mut backend) }, 0);
//! // A handle that was never handed out is refused too.
//! assert_eq!(gdr_unpin_buffer(g, GdrMh { h: 0 }), libc::EINVAL);
//!
//! let size = 1 << 16;
//! let (mut dptr, mut mh): (c_ulong, GdrMh) = (0, GdrMh { h: 0 });
//! // SAFETY: out-pointers to a c_ulong and a GdrMh.
//! match unsafe { gdr_alloc_mapped(g, size, &mut dptr, &mut mh) } {
//!     0 => {
//!         let mut va: *mut c_void = std::ptr::null_mut();
//!         // SAFETY: out-pointers to a pointer and to a GdrInfoV2.
//!         assert_eq!(unsafe { gdr_map(g, mh, &mut va, size) }, 0);
//!         let mut info = GdrInfoV2::default();
//!         assert_eq!(unsafe { gdr_get_info_v2(g, mh, &mut info) }, 0);
//!         assert_eq!(info.mapping_type, MAPPING_TYPE_WC);
//!         // `va` maps `info.va`: GPU address d is at va + (d - info.va).
//!         let at = |d: u64| -> *mut c_void {
//!             va.cast::<u8>().wrapping_add((d - info.va) as usize).cast()
//!         };
//!
//!         let msg = *b"hello, BAR1";
//!         let mut back = [0u8; 11];
//!         let p = at(dptr as u64);
//!         // SAFETY: the host buffers hold the sizes given (the mapping side is checked).
//!         unsafe {
//!             assert_eq!(gdr_copy_to_mapping(mh, p, msg.as_ptr().cast(), msg.len()), 0);
//!             assert_eq!(gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), p, back.len()), 0);
//!         }
//!         assert_eq!(back, msg);
//!         // Past the mapping: refused before any byte is copied.
//!         let past = at(info.va + size as u64);
//!         // SAFETY: as above.
//!         let rc = unsafe { gdr_copy_to_mapping(mh, past, msg.as_ptr().cast(), 1) };
//!         assert_eq!(rc, libc::EINVAL);
//!
//!         assert_eq!(gdr_unmap(g, mh, va, size), 0);
//!         assert_eq!(gdr_free_mapped(g, mh), 0);
//!     }
//!     // ENOTSUP: this GPU has no Vulkan mapping (pinning may still work).
//!     e => println!("gdr_alloc_mapped: errno {e} on backend {backend}"),
//! }
//! assert_eq!(gdr_close(g), 0);
//! ```

// The entry points are C functions whose pointer contracts are the header's; Rust callers are
// this crate's tests and doctest, and gdr-bench (`gdr apiperf`, the C API columns of
// `gdr copylat` and `gdr copybw`). `c_ulong` is u64 here but not on every target.
#![allow(clippy::unnecessary_cast)]

// What each module holds: `abi` the header's handle type and constants; `entry` the guard
// every entry point runs in and the out-pointer write; `errno` the errno of each gdr error;
// `open` gdr_open and gdr_close; `pin` pinning and unpinning; `map` mapping and unmapping;
// `copy` the copies and their paths; `alloc` gdr's allocation extension; `info` the entry
// points that describe; `table` the handles (`read_mostly` its lock); `ucx` gdr_open's choice
// in a UCX process; `log` gdrcopy's logging switches; `internal` the Rust-only door that
// gdr-cli's timings use (public but hidden).
mod abi;
mod alloc;
mod copy;
mod entry;
mod errno;
mod info;
#[doc(hidden)] // gdr-cli's timing of the C copies; see the module
pub mod internal;
mod log;
mod map;
mod open;
mod pin;
mod read_mostly;
mod table;
mod ucx;

pub use abi::{
    backend_code, GdrMh, API_MAJOR, API_MINOR, ATTR_GDR_BACKEND, ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE,
    ATTR_USE_PERSISTENT_MAPPING, ATTR_USING_DMA_BUF_MMAP, MAPPING_TYPE_CACHING,
    MAPPING_TYPE_DEVICE, MAPPING_TYPE_NONE, MAPPING_TYPE_WC, MAP_FLAG_DEFAULT,
    MAP_FLAG_REQ_WC_MAPPING, PIN_FLAG_FORCE_PCIE, USER_SPACE_DRIVER_VERSION,
};
pub use alloc::{gdr_alloc_mapped, gdr_free_mapped};
pub use copy::{gdr_copy_from_mapping, gdr_copy_to_mapping};
pub use info::{
    gdr_driver_get_version, gdr_get_attribute, gdr_get_info, gdr_get_info_v2,
    gdr_get_mapping_type_string, gdr_runtime_get_version, GdrInfoV1, GdrInfoV2,
};
pub use map::{gdr_map, gdr_map_v2, gdr_unmap};
pub use open::{gdr_close, gdr_open};
pub use pin::{gdr_get_callback_flag, gdr_pin_buffer, gdr_pin_buffer_v2, gdr_unpin_buffer};

#[cfg(test)]
mod tests;
