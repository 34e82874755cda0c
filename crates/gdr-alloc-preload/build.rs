//! Gives the library its soname, so the installed libgdr_alloc.so.0 link resolves, and keeps it
//! loaded once loaded (`-z nodelete`): a client that dlopen()s it (PyTorch's and CuPy's
//! pluggable allocators do) and dlclose()s it while its memory is still in use must not unmap
//! the code that frees that memory and the driver state behind it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdr_alloc.so.0");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
