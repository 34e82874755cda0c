//! `libgdr_alloc.so`: gdr's allocator behind the CUDA driver's allocation entry points, for
//! programs that are not rebuilt (`LD_PRELOAD`, or `gdr run -- PROGRAM`).
//!
//! The library does nothing until a program calls one of the entry points it puts in front of
//! libcuda's ([`interpose`]); the first allocation reads the settings (`GDR_ALLOC*`), and the
//! first one on each GPU probes it (a chunk made, imported into Vulkan and mapped). Where that
//! works, `cudaMalloc` / `cuMemAlloc` memory comes from gdr's pool ([`gdr_alloc::Pool`] over
//! POSIX-fd `cuMemCreate` chunks) and libgdrapi can pin and map it; elsewhere every call passes
//! through, and the reason is said once on stderr.
//!
//! [`abi`] exports `include/gdr_alloc.h` for code that knows about the allocator. Unsafe code is
//! confined to the C entry points and the trampolines that learn a caller's address; the pool
//! below them is safe Rust.

#![allow(non_snake_case)] // the CUDA entry points keep CUDA's names

mod abi;
mod interpose;
mod real;
mod state;
