//! `libgdr_alloc.so`: gdr's allocator behind the CUDA driver's allocation entry points, for
//! programs that are not rebuilt (`LD_PRELOAD`, or `gdr run -- PROGRAM`).
//!
//! The library does nothing until a program calls one of the entry points it puts in front of
//! libcuda's (module `interpose`); the first allocation reads the settings (`GDR_ALLOC*`), and
//! the first one on each GPU probes it (a chunk made, imported into Vulkan and mapped). Where
//! that works, `cudaMalloc` / `cuMemAlloc` memory comes from gdr's pool ([`gdr_alloc::Pool`]
//! over POSIX-fd `cuMemCreate` chunks) and libgdrapi can pin and map it; elsewhere every call
//! passes through, and the reason is said once on stderr.
//!
//! Module `abi` exports `include/gdr_alloc.h` for code that knows about the allocator. Unsafe
//! code is confined to the C entry points and the trampolines that learn a caller's address; the
//! pool below them is safe Rust.
//!
//! # Example
//!
//! The library is used from outside Rust, so its example is a shell session (docs/alloc.md has
//! more):
//!
//! ```text
//! $ cargo build --release -p gdr-alloc-preload
//! $ GDR_ALLOC_LOG=2 LD_PRELOAD=target/release/libgdr_alloc_preload.so ./my_cuda_program
//! $ gdr run -- ./my_cuda_program   # the same, through gdr's command line
//! ```
//!
//! `cargo build` names the file after the crate's Rust name, `gdr_alloc_preload` (the gdr-alloc
//! crate is `gdr_alloc`); installed (`scripts/install-capi.sh`) and in the bundle and the wheel
//! it is `libgdr_alloc.so`, and its soname is `libgdr_alloc.so.0` either way. The library has no
//! Rust API, so no doctests: the tests in `tests/` run it in C programs.

#![allow(non_snake_case)] // the CUDA entry points keep CUDA's names

mod abi;
mod interpose;
mod real;
mod state;
