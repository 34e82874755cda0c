//! A mapping made through libgdrapi's C entry points, for timing `gdr_copy_to_mapping` and
//! `gdr_copy_from_mapping` beside the Rust paths in one run (copylat, copybw).

use gdr::cuda::{vmm::VmmBuffer, Context, DeviceMemory};
use gdrapi::{
    gdr_close, gdr_copy_from_mapping, gdr_copy_to_mapping, gdr_map, gdr_open, gdr_pin_buffer,
    gdr_unmap, gdr_unpin_buffer, GdrMh,
};
use std::ffi::c_void;

/// A `gdr_copy_*` call that returned an errno.
#[derive(Debug, thiserror::Error)]
#[error("{call} returned errno {errno}")]
pub struct CapiError {
    /// The C function.
    pub call: &'static str,
    /// What it returned.
    pub errno: i32,
}

/// `len` bytes of GPU memory (POSIX-fd VMM memory, which every backend of libgdrapi pins)
/// pinned and mapped through libgdrapi's own `gdr_open`, `gdr_pin_buffer` and `gdr_map`.
pub struct CapiMapping {
    g: *mut c_void,
    mh: GdrMh,
    va: *mut c_void,
    len: usize,
    // Freed after the unmap and unpin of `drop`.
    _mem: VmmBuffer,
}

impl CapiMapping {
    /// Opens libgdrapi and pins and maps `len` bytes on `ctx`'s GPU; `Err` says why not
    /// (the rows are then left out, with that reason).
    pub fn open(ctx: &Context, len: usize) -> Result<CapiMapping, String> {
        let mem = VmmBuffer::new(ctx, len).map_err(|e| format!("VMM allocation: {e}"))?;
        let g = gdr_open();
        if g.is_null() {
            return Err("gdr_open() failed (GDRCOPY_ENABLE_LOGGING=1 says why)".into());
        }
        let mut mh = GdrMh { h: 0 };
        let rc = gdr_pin_buffer(g, mem.device_ptr() as _, len, 0, 0, &mut mh);
        if rc != 0 {
            gdr_close(g);
            return Err(format!("gdr_pin_buffer: errno {rc}"));
        }
        let mut va = std::ptr::null_mut();
        let rc = gdr_map(g, mh, &mut va, len);
        if rc != 0 {
            gdr_unpin_buffer(g, mh);
            gdr_close(g);
            return Err(format!("gdr_map: errno {rc}"));
        }
        Ok(CapiMapping {
            g,
            mh,
            va,
            len,
            _mem: mem,
        })
    }

    /// `gdr_copy_to_mapping` of `src` to the start of the mapping.
    pub fn write(&self, src: &[u8]) -> Result<(), CapiError> {
        assert!(src.len() <= self.len, "a copy inside the mapping");
        match gdr_copy_to_mapping(self.mh, self.va, src.as_ptr().cast(), src.len()) {
            0 => Ok(()),
            errno => Err(CapiError {
                call: "gdr_copy_to_mapping",
                errno,
            }),
        }
    }

    /// `gdr_copy_from_mapping` of the start of the mapping into `dst`.
    pub fn read(&self, dst: &mut [u8]) -> Result<(), CapiError> {
        assert!(dst.len() <= self.len, "a copy inside the mapping");
        match gdr_copy_from_mapping(self.mh, dst.as_mut_ptr().cast(), self.va, dst.len()) {
            0 => Ok(()),
            errno => Err(CapiError {
                call: "gdr_copy_from_mapping",
                errno,
            }),
        }
    }
}

impl Drop for CapiMapping {
    fn drop(&mut self) {
        gdr_unmap(self.g, self.mh, self.va, self.len);
        gdr_unpin_buffer(self.g, self.mh);
        gdr_close(self.g);
    }
}
