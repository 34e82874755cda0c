//! Names the shared library as gdrcopy's, so a symlink or copy named libgdrapi.so.2 resolves.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdrapi.so.2");
}
