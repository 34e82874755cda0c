//! A GPU's probe result kept between processes, so that the first allocation of each process
//! does not pay for it.
//!
//! The allocator serves a GPU only once it has shown that the GPU's chunks can be mapped for the
//! CPU ([`VmmSource::probe`](crate::VmmSource::probe): a chunk made, imported into Vulkan and
//! mapped). Most of that cost is opening Vulkan, which the first pin needs anyway but a program
//! that never pins does not. A success is therefore written down, in the directory where the
//! auto copier keeps its calibrations ([`gdr::bar::auto::cache_dirs`]), under a key made of what
//! decides it: gdr's version, the kernel driver's, the GPU's UUID, and the Vulkan loader's
//! variables that choose the driver. A later process whose key matches serves at once and opens
//! Vulkan at its first mapping; if that mapping fails, the entry is removed
//! ([`ProbeCache::forget`]) so that the next process probes again. Failures are not written:
//! a GPU that could not be served is probed again by every process.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

/// The largest entry read back; an entry holds one key of a few hundred bytes.
const MAX_ENTRY_BYTES: u64 = 4096;

/// The Vulkan loader's variables that choose which driver a process gets: a process with other
/// values may reach another ICD (or none), so they are part of the key.
pub const VULKAN_DRIVER_VARS: [&str; 3] =
    ["VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES"];

/// What a probe result depends on, written out; equal keys mean the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeKey(String);

impl ProbeKey {
    /// The key for GPU `uuid` under kernel driver `driver` (its version string), gdr version
    /// `gdr`, and the Vulkan driver variables `vulkan` (name, value; `None` when unset).
    pub fn new(
        gdr: &str,
        driver: &str,
        uuid: [u8; 16],
        vulkan: &[(&str, Option<OsString>)],
    ) -> ProbeKey {
        let mut k = format!(
            "gdr-alloc probe 1\ngdr {gdr}\ndriver {}\ngpu ",
            driver.trim()
        );
        for b in uuid {
            k.push_str(&format!("{b:02x}"));
        }
        k.push('\n');
        for (name, value) in vulkan {
            match value {
                Some(v) => k.push_str(&format!("{name}={}\n", v.to_string_lossy())),
                None => k.push_str(&format!("{name} unset\n")),
            }
        }
        ProbeKey(k)
    }

    /// The key for GPU `uuid` in this process: this build's version, the loaded kernel driver's
    /// (`/sys/module/nvidia/version`, else the first line of `/proc/driver/nvidia/version`) and
    /// the environment's Vulkan driver variables. `None` when the driver's version cannot be
    /// read: then nothing is cached.
    pub fn for_gpu(uuid: [u8; 16]) -> Option<ProbeKey> {
        let driver = kernel_driver_version()?;
        let vulkan: Vec<(&str, Option<OsString>)> = VULKAN_DRIVER_VARS
            .iter()
            .map(|&v| (v, std::env::var_os(v)))
            .collect();
        Some(ProbeKey::new(
            env!("CARGO_PKG_VERSION"),
            &driver,
            uuid,
            &vulkan,
        ))
    }

    /// The key as written into its entry.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The entry's file name: a hash of the key (FNV-1a, stable across builds); the file holds
    /// the key itself, so that two keys of one hash never answer for each other.
    fn file_name(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.0.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("alloc-probe-{h:016x}")
    }
}

/// The loaded NVIDIA kernel driver's version, as its module reports it.
fn kernel_driver_version() -> Option<String> {
    if let Ok(v) = gdr::regular_file::read(std::path::Path::new("/sys/module/nvidia/version"), 256)
    {
        let v = String::from_utf8_lossy(&v).trim().to_owned();
        if !v.is_empty() {
            return Some(v);
        }
    }
    let v =
        gdr::regular_file::read(std::path::Path::new("/proc/driver/nvidia/version"), 4096).ok()?;
    let v = String::from_utf8_lossy(&v);
    let line = v.lines().next()?.trim().to_owned();
    (!line.is_empty()).then_some(line)
}

/// Where probe results are looked up and written.
///
/// # Examples
///
/// ```
/// use gdr_alloc::{ProbeCache, ProbeKey};
///
/// let dir = tempfile::tempdir()?;
/// let cache = ProbeCache::new(vec![dir.path().into()], Some(dir.path().into()));
/// let uuid = [7; 16];
/// let key = ProbeKey::new("0.1.0", "580.95.05", uuid, &[("VK_DRIVER_FILES", None)]);
/// assert!(!cache.holds(&key));
/// cache.store(&key)?;
/// assert!(cache.holds(&key));
/// // Another kernel driver may answer otherwise: its key is not held.
/// let updated = ProbeKey::new("0.1.0", "580.105.08", uuid, &[("VK_DRIVER_FILES", None)]);
/// assert!(!cache.holds(&updated));
/// cache.forget(&key);
/// assert!(!cache.holds(&key));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeCache {
    read: Vec<PathBuf>,
    write: Option<PathBuf>,
}

impl ProbeCache {
    /// A cache that looks in `read` (in order) and writes into `write` (`None`: never writes).
    pub fn new(read: Vec<PathBuf>, write: Option<PathBuf>) -> ProbeCache {
        ProbeCache { read, write }
    }

    /// The calibration cache's directories of this process ([`gdr::bar::auto::cache_dirs`]:
    /// `$GDR_CACHE_DIR`, `$XDG_CACHE_HOME/gdr` or `~/.cache/gdr`, else a directory of this
    /// user's under the temporary directory).
    pub fn of_process() -> ProbeCache {
        let d = gdr::bar::auto::cache_dirs();
        ProbeCache::new(d.read.clone(), d.write.clone())
    }

    /// Whether a success is recorded for `key`.
    pub fn holds(&self, key: &ProbeKey) -> bool {
        let name = key.file_name();
        self.read.iter().any(|dir| {
            gdr::regular_file::read(&dir.join(&name), MAX_ENTRY_BYTES)
                .is_ok_and(|b| b == key.as_str().as_bytes())
        })
    }

    /// Records a success for `key`: written whole under a temporary name, then renamed, so a
    /// reader sees the entry whole or not at all. An error leaves nothing behind.
    pub fn store(&self, key: &ProbeKey) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = self.write.as_ref().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no writable cache directory",
            )
        })?;
        let name = key.file_name();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(key.as_str().as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, dir.join(&name)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Removes the entry for `key` wherever this process may write (a mapping failed where the
    /// entry said it would work).
    pub fn forget(&self, key: &ProbeKey) {
        if let Some(dir) = &self.write {
            let _ = std::fs::remove_file(dir.join(key.file_name()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(driver: &str, vk: Option<&str>) -> ProbeKey {
        ProbeKey::new(
            "1.2.3",
            driver,
            [0xab; 16],
            &[
                ("VK_DRIVER_FILES", vk.map(OsString::from)),
                ("VK_ICD_FILENAMES", None),
            ],
        )
    }

    #[test]
    fn a_stored_key_is_held_and_no_other() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        let c = ProbeCache::new(vec![d.clone()], Some(d.clone()));
        let k = key("580.159.04", Some("/icd.json"));
        assert!(!c.holds(&k));
        c.store(&k).unwrap();
        assert!(c.holds(&k));
        // Any part of the key changed misses: driver, Vulkan variable, GPU.
        assert!(!c.holds(&key("580.160.00", Some("/icd.json"))));
        assert!(!c.holds(&key("580.159.04", None)));
        let other_gpu = ProbeKey::new(
            "1.2.3",
            "580.159.04",
            [0xcd; 16],
            &[
                ("VK_DRIVER_FILES", Some("/icd.json".into())),
                ("VK_ICD_FILENAMES", None),
            ],
        );
        assert!(!c.holds(&other_gpu));
        // Nothing but the entry is left in the directory.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        c.forget(&k);
        assert!(!c.holds(&k));
    }

    #[test]
    fn an_entry_with_other_contents_does_not_answer() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        let c = ProbeCache::new(vec![d.clone()], Some(d.clone()));
        let k = key("580.159.04", None);
        // The same file name with another key inside (a hash collision, or a damaged file).
        std::fs::write(
            d.join(k.file_name()),
            b"gdr-alloc probe 1\nsomething else\n",
        )
        .unwrap();
        assert!(!c.holds(&k));
        // A directory where the entry would be is no entry.
        std::fs::remove_file(d.join(k.file_name())).unwrap();
        std::fs::create_dir(d.join(k.file_name())).unwrap();
        assert!(!c.holds(&k));
    }

    #[test]
    fn entries_are_found_in_every_read_directory_and_written_only_to_one() {
        let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (ta.path().to_path_buf(), tb.path().to_path_buf());
        let k = key("580.159.04", None);
        ProbeCache::new(vec![], Some(b.clone())).store(&k).unwrap();
        let c = ProbeCache::new(vec![a.clone(), b.clone()], None);
        assert!(c.holds(&k), "found in the second directory");
        // Without a writable directory nothing is stored, with an error, and nothing breaks.
        let k2 = key("1.0", None);
        assert!(c.store(&k2).is_err());
        assert!(!c.holds(&k2));
        c.forget(&k); // no writable directory: nothing removed
        assert!(c.holds(&k));
    }

    #[test]
    fn a_failed_store_leaves_no_temporary_file() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        let k = key("580.159.04", None);
        // The entry's name taken by a non-empty directory: the rename fails.
        std::fs::create_dir(d.join(k.file_name())).unwrap();
        std::fs::write(d.join(k.file_name()).join("x"), b"x").unwrap();
        let c = ProbeCache::new(vec![d.clone()], Some(d.clone()));
        assert!(c.store(&k).is_err());
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "only the blocking directory: {names:?}");
    }

    #[test]
    fn the_key_names_what_it_depends_on() {
        let k = key(
            " 580.159.04\n",
            Some("/usr/share/vulkan/icd.d/nvidia_icd.json"),
        );
        let s = k.as_str();
        assert!(s.contains("gdr 1.2.3\n"), "{s}");
        assert!(s.contains("driver 580.159.04\n"), "{s}");
        assert!(s.contains(&format!("gpu {}\n", "ab".repeat(16))), "{s}");
        assert!(
            s.contains("VK_DRIVER_FILES=/usr/share/vulkan/icd.d/nvidia_icd.json\n"),
            "{s}"
        );
        assert!(s.contains("VK_ICD_FILENAMES unset\n"), "{s}");
        assert_eq!(
            k.file_name(),
            key(
                "580.159.04",
                Some("/usr/share/vulkan/icd.d/nvidia_icd.json")
            )
            .file_name()
        );
        assert_ne!(k.file_name(), key("580.159.04", None).file_name());
    }
}
