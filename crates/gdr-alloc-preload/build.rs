//! Gives the library its soname, so the installed libgdr_alloc.so.0 link resolves.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgdr_alloc.so.0");
}
