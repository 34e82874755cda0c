//! A mapping made through libgdrapi's C entry points, for timing `gdr_copy_to_mapping` and
//! `gdr_copy_from_mapping` beside the Rust paths in one run ([`copylat`](crate::copylat),
//! [`copybw`](crate::copybw)).

use gdr::bar::MappedBuffer;
use gdr::cuda::{vmm::VmmBuffer, Context, DeviceMemory};
use gdrapi::{
    gdr_alloc_mapped, gdr_close, gdr_copy_from_mapping, gdr_copy_to_mapping, gdr_free_mapped,
    gdr_map, gdr_open, gdr_pin_buffer, gdr_unmap, gdr_unpin_buffer, GdrMh,
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

/// Which GPU memory the C API's rows copy to and from (`--capi-memory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapiMemory {
    /// Existing memory pinned with `gdr_pin_buffer` (POSIX-fd VMM memory, which every backend
    /// pins), as gdrcopy's programs use the library.
    #[default]
    Pinned,
    /// Memory from libgdrapi's `gdr_alloc_mapped`, which the Rust rows then copy to as well
    /// (the same allocation through the same CPU mapping), so the rows differ only in the call.
    Allocated,
}

/// What backs a [`CapiMapping`], released in `drop` after the unmap.
enum Backing {
    /// A VMM allocation of ours, pinned: unpinned, then freed when this drops (held for that
    /// drop only).
    Pinned { _mem: VmmBuffer },
    /// The library's own allocation (`gdr_free_mapped`).
    Allocated,
}

/// `len` bytes of GPU memory, pinned or allocated ([`CapiMemory`]) and mapped through
/// libgdrapi's own `gdr_open` and `gdr_map`.
pub struct CapiMapping {
    g: *mut c_void,
    mh: GdrMh,
    va: *mut c_void,
    len: usize,
    // Released after the unmap of `drop`.
    backing: Backing,
}

impl CapiMapping {
    /// Opens libgdrapi and pins (or allocates, per `memory`) and maps `len` bytes on `ctx`'s
    /// GPU; `Err` says why not (the rows are then left out, with that reason).
    pub fn open(ctx: &Context, len: usize, memory: CapiMemory) -> Result<CapiMapping, String> {
        let vmm = match memory {
            CapiMemory::Pinned => {
                Some(VmmBuffer::new(ctx, len).map_err(|e| format!("VMM allocation: {e}"))?)
            }
            CapiMemory::Allocated => None,
        };
        let g = gdr_open();
        if g.is_null() {
            return Err("gdr_open() failed (GDRCOPY_ENABLE_LOGGING=1 says why)".into());
        }
        let mut mh = GdrMh { h: 0 };
        let (rc, call) = match &vmm {
            Some(mem) => (
                // SAFETY: `mh` is a GdrMh to write the handle to.
                unsafe { gdr_pin_buffer(g, mem.device_ptr() as _, len, 0, 0, &mut mh) },
                "gdr_pin_buffer",
            ),
            None => {
                let mut dptr = 0;
                (
                    // SAFETY: out-pointers to a c_ulong and a GdrMh.
                    unsafe { gdr_alloc_mapped(g, len, &mut dptr, &mut mh) },
                    "gdr_alloc_mapped",
                )
            }
        };
        if rc != 0 {
            gdr_close(g);
            return Err(format!("{call}: errno {rc}"));
        }
        let backing = match vmm {
            Some(mem) => Backing::Pinned { _mem: mem },
            None => Backing::Allocated,
        };
        let mut va = std::ptr::null_mut();
        // SAFETY: an out-pointer to a pointer.
        let rc = unsafe { gdr_map(g, mh, &mut va, len) };
        if rc != 0 {
            release(g, mh, &backing);
            gdr_close(g);
            return Err(format!("gdr_map: errno {rc}"));
        }
        Ok(CapiMapping {
            g,
            mh,
            va,
            len,
            backing,
        })
    }

    /// Runs `f` on the library's own buffer behind this mapping (`None` unless the memory is
    /// [`CapiMemory::Allocated`]); `f` must not drop or remap this mapping.
    pub fn with_allocation<R>(&self, f: impl FnOnce(&MappedBuffer) -> R) -> Option<R> {
        match self.backing {
            Backing::Allocated => gdrapi::internal::with_allocation(self.mh, f),
            Backing::Pinned { .. } => None,
        }
    }

    /// `gdr_copy_to_mapping` of `src` to the start of the mapping.
    pub fn write(&self, src: &[u8]) -> Result<(), CapiError> {
        assert!(src.len() <= self.len, "a copy inside the mapping");
        // SAFETY: `src` holds the bytes copied; the range in the mapping is checked (and fits).
        match unsafe { gdr_copy_to_mapping(self.mh, self.va, src.as_ptr().cast(), src.len()) } {
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
        // SAFETY: `dst` is borrowed mutably for the bytes copied; the range in the mapping is
        // checked (and fits).
        match unsafe { gdr_copy_from_mapping(self.mh, dst.as_mut_ptr().cast(), self.va, dst.len()) }
        {
            0 => Ok(()),
            errno => Err(CapiError {
                call: "gdr_copy_from_mapping",
                errno,
            }),
        }
    }
}

/// Unpins or frees what `mh` holds (a pinned VMM buffer is freed by its own drop afterwards).
fn release(g: *mut c_void, mh: GdrMh, backing: &Backing) {
    match backing {
        Backing::Pinned { .. } => gdr_unpin_buffer(g, mh),
        Backing::Allocated => gdr_free_mapped(g, mh),
    };
}

impl Drop for CapiMapping {
    fn drop(&mut self) {
        gdr_unmap(self.g, self.mh, self.va, self.len);
        release(self.g, self.mh, &self.backing);
        gdr_close(self.g);
    }
}
