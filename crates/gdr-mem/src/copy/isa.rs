//! The instruction sets the copy kernels come in, and which of them this CPU runs.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use super::CopyError;

/// Environment variable that picks the ISA of the plain (non-`_with`) routines, e.g.
/// `GDR_COPY_ISA=avx2`; ignored when it names an ISA this CPU lacks or no ISA at all. Stores of
/// under 64 bytes always take the small-store path (plain 1..8-byte stores), whatever it says.
pub const ISA_ENV: &str = "GDR_COPY_ISA";

/// An instruction set a copy kernel is written for.
///
/// For copies into a mapping, [`Isa::Sse41`] adds nothing over [`Isa::Sse2`] (SSE4.1 has no new
/// store) and runs the SSE2 kernel. For copies out of one, [`Isa::Sse2`] uses plain aligned loads,
/// each its own uncached read: the baseline that the streaming loads of the others beat.
///
/// # Examples
///
/// ```
/// use gdr_mem::copy::{copy_from_mapping_with, copy_to_mapping_with, CopyError, Isa};
///
/// assert_eq!("AVX2".parse::<Isa>()?, Isa::Avx2);
/// assert_eq!(Isa::Sse41.to_string(), "sse4.1");
/// assert!(matches!("neon".parse::<Isa>(), Err(CopyError::UnknownIsa(_))));
/// assert_eq!(Isa::available()[0], Isa::Portable);
///
/// // Every kernel this CPU runs moves the same bytes (ordinary memory stands in for a mapping).
/// #[repr(align(64))]
/// struct Lines([u8; 256]);
/// let src: Vec<u8> = (0..=255).collect();
/// for isa in Isa::available() {
///     let mut mapping = Lines([0; 256]);
///     let mut back = [0u8; 200];
///     // SAFETY: `mapping` is 256 writable bytes in whole aligned lines, apart from `src` and
///     // `back`; the read covers [3, 203) of it.
///     unsafe {
///         copy_to_mapping_with(isa, mapping.0.as_mut_ptr(), &src)?;
///         copy_from_mapping_with(isa, &mut back, mapping.0.as_ptr().add(3))?;
///     }
///     assert_eq!(back[..], src[3..203], "{isa}");
/// }
/// # Ok::<(), CopyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Volatile word accesses and a full fence; every architecture.
    Portable,
    /// 16-byte non-temporal stores; plain 16-byte loads.
    Sse2,
    /// 16-byte streaming loads (`movntdqa`).
    Sse41,
    /// 32-byte non-temporal stores and streaming loads.
    Avx2,
    /// 64-byte non-temporal stores and streaming loads (AVX-512F).
    Avx512,
}

impl Isa {
    /// Every ISA, narrowest first.
    pub const ALL: [Isa; 5] = [Isa::Portable, Isa::Sse2, Isa::Sse41, Isa::Avx2, Isa::Avx512];

    /// The short lowercase name, as [`FromStr`] accepts it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Sse2 => "sse2",
            Isa::Sse41 => "sse4.1",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU (and OS, for the wide register state) runs kernels of this ISA.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Sse2 => std::arch::is_x86_feature_detected!("sse2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Sse41 => std::arch::is_x86_feature_detected!("sse4.1"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The ISAs this CPU runs, narrowest first (always starts with [`Isa::Portable`]).
    pub fn available() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// The ISAs with a distinct kernel for copies into a mapping that this CPU runs (the list
    /// [`Isa::available`] gives, less [`Isa::Sse41`], which would repeat SSE2).
    pub fn available_for_store() -> Vec<Isa> {
        Isa::available()
            .into_iter()
            .filter(|isa| *isa != Isa::Sse41)
            .collect()
    }

    /// The ISAs with a distinct kernel for copies out of a mapping that this CPU runs (all of
    /// [`Isa::available`]).
    pub fn available_for_load() -> Vec<Isa> {
        Isa::available()
    }

    /// The ISA [`super::copy_to_mapping`] uses: [`ISA_ENV`] when set to an available ISA,
    /// otherwise the widest available store. Decided once per process.
    pub fn detected_store() -> Isa {
        static STORE: OnceLock<Isa> = OnceLock::new();
        *STORE.get_or_init(|| {
            env_choice().unwrap_or_else(|| widest(&[Isa::Avx512, Isa::Avx2, Isa::Sse2]))
        })
    }

    /// The ISA [`super::copy_from_mapping`] uses: [`ISA_ENV`] when set to an available ISA,
    /// otherwise the widest available streaming load. Decided once per process.
    pub fn detected_load() -> Isa {
        static LOAD: OnceLock<Isa> = OnceLock::new();
        *LOAD.get_or_init(|| {
            env_choice().unwrap_or_else(|| widest(&[Isa::Avx512, Isa::Avx2, Isa::Sse41, Isa::Sse2]))
        })
    }

    /// `Ok(self)` when available, else the error naming it.
    pub(super) fn require(self) -> Result<Isa, CopyError> {
        self.require_given(self.is_available())
    }

    /// `Ok(self)` when `available`, else the error naming it (split out for tests).
    pub(super) fn require_given(self, available: bool) -> Result<Isa, CopyError> {
        if available {
            Ok(self)
        } else {
            Err(CopyError::Unsupported(self))
        }
    }
}

/// The first available ISA of `preference`, else [`Isa::Portable`].
fn widest(preference: &[Isa]) -> Isa {
    preference
        .iter()
        .copied()
        .find(|isa| isa.is_available())
        .unwrap_or(Isa::Portable)
}

/// The ISA named by [`ISA_ENV`], if it parses and is available.
fn env_choice() -> Option<Isa> {
    choice_from(std::env::var(ISA_ENV).ok().as_deref())
}

/// The ISA a setting names, if it parses and is available.
pub(super) fn choice_from(setting: Option<&str>) -> Option<Isa> {
    setting?
        .parse::<Isa>()
        .ok()
        .filter(|isa| isa.is_available())
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = CopyError;

    /// Parses a name case-insensitively; `sse41`, `avx512f` and `avx-512` are accepted too.
    fn from_str(s: &str) -> Result<Isa, CopyError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Ok(Isa::Portable),
            "sse2" => Ok(Isa::Sse2),
            "sse4.1" | "sse41" => Ok(Isa::Sse41),
            "avx2" => Ok(Isa::Avx2),
            "avx512" | "avx512f" | "avx-512" => Ok(Isa::Avx512),
            _ => Err(CopyError::UnknownIsa(s.to_string())),
        }
    }
}
