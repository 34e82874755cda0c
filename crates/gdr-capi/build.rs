//! Names the shared library as gdrcopy's, so a symlink or copy named libgdrapi.so.2 resolves,
//! and keeps it loaded once loaded (`-z nodelete`): a client that dlclose()s it while it still
//! holds mappings must not lose the code and the driver state behind them (the Vulkan device,
//! its threads and memory are shared by every handle and never torn down), so dlclose leaves
//! it in place and a later dlopen finds it as it was.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdrapi.so.2");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
