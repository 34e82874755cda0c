//! Run-time loading of the NVIDIA user-space libraries gdr calls (libcuda, NVRTC, NVML).
//!
//! Nothing in gdr links against GPU software: building and testing need none of it, and a
//! machine without it gets a typed error that says what to install. Each user names its library
//! once (a [`LibrarySpec`]: how to call it in messages, what to install, what to update), lists
//! the file names or paths to try in order ([`open`]), and resolves its table of entry points
//! once with `api_table!`, which generates a struct of function pointers that keeps the library
//! loaded as long as the pointers live (the shape of cudarc's sys layer).

use std::ffi::OsStr;
use std::fmt;

/// How a library is named in errors and what to tell the user when it is missing or old.
///
/// # Examples
///
/// ```
/// use gdr_cuda::dylib::{self, LibrarySpec, LoadError};
///
/// static SPEC: LibrarySpec = LibrarySpec {
///     what: "libexample (libexample.so.1)",
///     install: "install the example package",
///     update: "update the example package",
/// };
/// let candidates = ["libgdr-no-such-library.so.1", "/nonexistent/libexample.so.1"];
/// let Err(e) = dylib::open(&SPEC, &candidates) else {
///     panic!("a library that does not exist loaded");
/// };
/// assert!(matches!(&e, LoadError::NotInstalled { tried, .. } if tried.len() == 2));
/// assert!(e.to_string().starts_with("libexample (libexample.so.1) could not be loaded"));
/// assert!(e.to_string().ends_with("; install the example package"));
/// ```
#[derive(Debug)]
pub struct LibrarySpec {
    /// The library as a user knows it, e.g. "NVML (libnvidia-ml.so.1)".
    pub what: &'static str,
    /// What to do when none of the candidates loads (install which package, set which variable).
    pub install: &'static str,
    /// What to do when an entry point is missing (the library is too old).
    pub update: &'static str,
}

/// Why a library or one of its entry points is not available.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// None of the candidate files loaded.
    #[error("{} could not be loaded: {reason} (tried {}); {}", library.what, Tried(tried), library.install)]
    NotInstalled {
        /// The library's name and what to install.
        library: &'static LibrarySpec,
        /// Every candidate tried, in order.
        tried: Vec<String>,
        /// What the dynamic loader said about the first candidate.
        reason: String,
    },
    /// The library loaded but lacks a required entry point: it is older than the call.
    #[error("{} lacks {symbol}, an entry point gdr needs; {}", library.what, library.update)]
    MissingSymbol {
        /// The library's name and what to update.
        library: &'static LibrarySpec,
        /// The entry point's C name, e.g. `cuMemCreate`.
        symbol: &'static str,
    },
}

/// A candidate list for messages: `a, b, c`.
struct Tried<'a>(&'a [String]);

impl fmt::Display for Tried<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(t)?;
        }
        Ok(())
    }
}

/// A loaded library, ready to have its entry points resolved.
pub struct Loaded {
    lib: libloading::Library,
    spec: &'static LibrarySpec,
}

/// Loads the first of `candidates` (file names searched the dynamic loader's way, or paths) that
/// the dynamic loader accepts.
pub fn open<S: AsRef<OsStr>>(
    spec: &'static LibrarySpec,
    candidates: &[S],
) -> Result<Loaded, LoadError> {
    let mut reason = None;
    for c in candidates {
        // A path (not a name for the loader to search, which finds only libraries): the loader
        // would open a FIFO there and wait for a writer forever.
        let c = c.as_ref();
        if let Err(e) = gdr_pci::regular_file::check_library(std::path::Path::new(c)) {
            reason.get_or_insert_with(|| e.to_string());
            continue;
        }
        // SAFETY: loading one of NVIDIA's libraries runs its initialisers, which have no
        // preconditions on our side.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => return Ok(Loaded { lib, spec }),
            Err(e) => {
                reason.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Err(LoadError::NotInstalled {
        library: spec,
        tried: candidates
            .iter()
            .map(|c| c.as_ref().to_string_lossy().into_owned())
            .collect(),
        reason: reason.unwrap_or_else(|| "no candidate to try".into()),
    })
}

impl Loaded {
    /// The entry point `name_nul` (NUL-terminated) as a `T`.
    ///
    /// # Safety
    /// `T` must be the function pointer type of the symbol's real signature.
    pub unsafe fn symbol<T: Copy>(&self, name_nul: &'static str) -> Result<T, LoadError> {
        // SAFETY: the caller guarantees `T` matches the symbol.
        unsafe { self.lib.get::<T>(name_nul.as_bytes()) }
            .map(|s| *s)
            .map_err(|_| LoadError::MissingSymbol {
                library: self.spec,
                symbol: name_nul.trim_end_matches('\0'),
            })
    }

    /// The entry point `name_nul` if the library has it (for calls newer versions added).
    ///
    /// # Safety
    /// As [`symbol`](Self::symbol).
    pub unsafe fn optional<T: Copy>(&self, name_nul: &'static str) -> Option<T> {
        // SAFETY: as the caller guarantees.
        unsafe { self.symbol(name_nul) }.ok()
    }

    /// The library itself, to keep alive as long as pointers resolved from it.
    pub fn into_library(self) -> libloading::Library {
        self.lib
    }
}

/// Generates a struct of function pointers resolved from a [`Loaded`] library, with a
/// `resolve` constructor that fails with [`LoadError::MissingSymbol`] on the first required
/// entry point missing. Entry points in an `optional { .. }` block become `Option`s. The struct
/// owns the library (last field, so it is dropped after nothing can call the pointers).
///
/// The macro is crate-private, so this cannot be a doctest (a doctest is a crate of its own and
/// cannot name it); the unit tests below run the same shape against the C library.
///
/// ```ignore
/// api_table! {
///     /// NVML's entry points.
///     pub struct Api {
///         init = "nvmlInit_v2"() -> c_int;
///     }
///     optional {
///         p2p_status = "nvmlDeviceGetP2PStatus"(Dev, Dev, c_uint, *mut c_uint) -> c_int;
///     }
/// }
/// ```
macro_rules! api_table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $field:ident = $sym:literal ( $($arg:ty),* $(,)? ) -> $ret:ty; )*
        }
        $( optional {
            $( $ofield:ident = $osym:literal ( $($oarg:ty),* $(,)? ) -> $oret:ty; )*
        } )?
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            $($( pub $ofield: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*)?
            /// Kept last so the pointers above never outlive the library.
            _lib: libloading::Library,
        }

        impl $name {
            /// Resolves every entry point in `lib`.
            ///
            /// # Safety
            /// `lib` must be the library whose C signatures this table states.
            pub unsafe fn resolve(
                lib: $crate::dylib::Loaded,
            ) -> Result<Self, $crate::dylib::LoadError> {
                Ok(Self {
                    $(
                        // SAFETY: the caller guarantees the symbol has this signature.
                        $field: unsafe { lib.symbol(concat!($sym, "\0"))? },
                    )*
                    $($(
                        // SAFETY: as above.
                        $ofield: unsafe { lib.optional(concat!($osym, "\0")) },
                    )*)?
                    _lib: lib.into_library(),
                })
            }
        }
    };
}
pub(crate) use api_table;

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_int;

    static LIBC: LibrarySpec = LibrarySpec {
        what: "the C library (libc.so.6)",
        install: "install glibc",
        update: "update glibc",
    };

    api_table! {
        struct Libc {
            getpid = "getpid"() -> c_int;
            abs = "abs"(c_int) -> c_int;
        }
        optional {
            nothing = "gdr_no_such_symbol"() -> c_int;
        }
    }

    api_table! {
        #[allow(dead_code)]
        struct Broken {
            abs = "abs"(c_int) -> c_int;
            missing = "gdr_no_such_symbol"() -> c_int;
        }
    }

    #[test]
    fn the_first_loadable_candidate_wins_and_entry_points_resolve() {
        let lib = open(&LIBC, &["libgdr-no-such-library.so.7", "libc.so.6"]).unwrap();
        // SAFETY: getpid and abs have these signatures in every C library.
        let api = unsafe { Libc::resolve(lib) }.unwrap();
        // SAFETY: plain calls with valid arguments.
        assert_eq!(unsafe { (api.getpid)() } as u32, std::process::id());
        // SAFETY: as above.
        assert_eq!(unsafe { (api.abs)(-3) }, 3);
        assert!(api.nothing.is_none());
    }

    #[test]
    fn errors_name_the_library_the_candidates_and_the_symbol() {
        let e = open(&LIBC, &["libgdr-nope.so.1", "/nonexistent/libgdr-nope.so"])
            .err()
            .unwrap();
        match &e {
            LoadError::NotInstalled { tried, .. } => assert_eq!(tried.len(), 2),
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.starts_with("the C library (libc.so.6) could not be loaded: "));
        assert!(
            msg.contains("(tried libgdr-nope.so.1, /nonexistent/libgdr-nope.so); install glibc")
        );

        let lib = open(&LIBC, &["libc.so.6"]).unwrap();
        // SAFETY: abs has this signature; the missing symbol is never called.
        let e = unsafe { Broken::resolve(lib) }.err().unwrap();
        assert!(matches!(
            e,
            LoadError::MissingSymbol {
                symbol: "gdr_no_such_symbol",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "the C library (libc.so.6) lacks gdr_no_such_symbol, an entry point gdr needs; \
             update glibc"
        );
    }
}
