//! The allocator's switches, read once from the environment.
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `GDR_ALLOC` | `on`, or `off` (every call goes to the driver) | `on` |
//! | `GDR_ALLOC_GPUS` | comma-separated CUDA ordinals served (others pass through) | all |
//! | `GDR_ALLOC_MIN_SIZE` | smaller requests pass through (bytes; K/M/G suffixes) | 1 |
//! | `GDR_ALLOC_MAX_SIZE` | larger requests pass through | none |
//! | `GDR_ALLOC_EXCLUDE` | comma-separated substrings of shared-object file names: a driver call made from a matching object passes through | none |
//! | `GDR_ALLOC_CACHE` | bytes of empty chunks kept for reuse; a chunk emptied beyond that goes back to the driver | 4G |
//! | `GDR_ALLOC_LOG` | 0 silent, 1 reasons and errors (once each), 2 every call | 1 |
//! | `GDR_ALLOC_PROBE` | `cached`: a GPU's successful probe is kept in gdr's cache directory and trusted by later processes, which open Vulkan at their first pin instead of their first allocation; `always`: every process probes, and nothing is read or written | `cached` |

use std::collections::BTreeSet;

/// Bytes of empty chunks kept by default.
pub const DEFAULT_CACHE: u64 = 4 << 30;

/// The allocator's settings.
///
/// # Examples
///
/// ```
/// use gdr_alloc::{Config, ConfigError};
/// use std::collections::HashMap;
///
/// let env = HashMap::from([
///     ("GDR_ALLOC_GPUS", "1, 0"),
///     ("GDR_ALLOC_MIN_SIZE", "64K"),
///     ("GDR_ALLOC_CACHE", "1G"),
/// ]);
/// let c = Config::from_vars(|k| env.get(k).map(|v| v.to_string()))?;
/// assert!(c.serves_gpu(0) && c.serves_gpu(1) && !c.serves_gpu(2));
/// assert!(!c.serves_size(4096) && c.serves_size(64 << 10));
/// assert_eq!(c.cache, 1 << 30);
/// // Unset variables keep the defaults; a value the allocator cannot use is named.
/// assert_eq!(Config::from_vars(|_| None)?, Config::default());
/// let e = Config::from_vars(|k| (k == "GDR_ALLOC_MAX_SIZE").then(|| "lots".into()));
/// assert!(matches!(e, Err(ConfigError { var: "GDR_ALLOC_MAX_SIZE", .. })));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `GDR_ALLOC=off`: everything passes through.
    pub enabled: bool,
    /// CUDA ordinals served; `None` for all.
    pub gpus: Option<BTreeSet<i32>>,
    /// Requests below this many bytes pass through (`GDR_ALLOC_MIN_SIZE`).
    pub min_size: u64,
    /// Requests above this many bytes pass through (`GDR_ALLOC_MAX_SIZE`; `u64::MAX`: none).
    pub max_size: u64,
    /// Callers (substrings of the calling object's file name) whose calls pass through.
    pub exclude: Vec<String>,
    /// Bytes of empty chunks kept for reuse (`GDR_ALLOC_CACHE`).
    pub cache: u64,
    /// Messages on stderr (`GDR_ALLOC_LOG`): 0 none, 1 reasons and errors (once each), 2 every
    /// call.
    pub log: u8,
    /// Whether a GPU's probe result is read from and written to the probe cache
    /// (`GDR_ALLOC_PROBE=cached`, the default) or measured in every process (`always`).
    pub probe_cache: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            gpus: None,
            min_size: 1,
            max_size: u64::MAX,
            exclude: Vec::new(),
            cache: DEFAULT_CACHE,
            log: 1,
            probe_cache: true,
        }
    }
}

/// A switch with a value the allocator cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct ConfigError {
    /// The environment variable, e.g. `GDR_ALLOC_GPUS`.
    pub var: &'static str,
    /// Its value as read.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// Parses a byte count: digits with an optional K, M, G or T suffix (powers of 1024; a
/// trailing `B` or `iB` is accepted).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 10),
        'm' | 'M' => (&t[..t.len() - 1], 20),
        'g' | 'G' => (&t[..t.len() - 1], 30),
        't' | 'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

impl Config {
    /// Reads the `GDR_ALLOC*` variables.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the switches through `get` (the environment, or a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let bad = |var: &'static str, value: &str, why: &str| ConfigError {
            var,
            value: value.to_owned(),
            why: why.to_owned(),
        };
        if let Some(v) = get("GDR_ALLOC") {
            c.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "" | "1" | "on" | "yes" => true,
                "0" | "off" | "no" => false,
                _ => return Err(bad("GDR_ALLOC", &v, "expected on or off")),
            };
        }
        if let Some(v) = get("GDR_ALLOC_GPUS") {
            let t = v.trim();
            if !(t.is_empty() || t.eq_ignore_ascii_case("all")) {
                let mut set = BTreeSet::new();
                for part in t.split(',') {
                    let n: i32 = part.trim().parse().map_err(|_| {
                        bad(
                            "GDR_ALLOC_GPUS",
                            &v,
                            "expected CUDA ordinals like 0,1 or all",
                        )
                    })?;
                    if n < 0 {
                        return Err(bad("GDR_ALLOC_GPUS", &v, "ordinals are 0 or more"));
                    }
                    set.insert(n);
                }
                c.gpus = Some(set);
            }
        }
        let size = |var: &'static str| -> Result<Option<u64>, ConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => parse_size(&v)
                    .map(Some)
                    .ok_or_else(|| bad(var, &v, "expected a byte count such as 4096, 64K or 2M")),
            }
        };
        if let Some(n) = size("GDR_ALLOC_MIN_SIZE")? {
            c.min_size = n;
        }
        if let Some(n) = size("GDR_ALLOC_MAX_SIZE")? {
            c.max_size = n;
        }
        if c.min_size > c.max_size {
            return Err(bad(
                "GDR_ALLOC_MIN_SIZE",
                &c.min_size.to_string(),
                &format!("larger than GDR_ALLOC_MAX_SIZE ({})", c.max_size),
            ));
        }
        if let Some(n) = size("GDR_ALLOC_CACHE")? {
            c.cache = n;
        }
        if let Some(v) = get("GDR_ALLOC_EXCLUDE") {
            c.exclude = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(v) = get("GDR_ALLOC_LOG") {
            c.log = match v.trim() {
                "0" => 0,
                "" | "1" => 1,
                "2" => 2,
                _ => return Err(bad("GDR_ALLOC_LOG", &v, "expected 0, 1 or 2")),
            };
        }
        if let Some(v) = get("GDR_ALLOC_PROBE") {
            c.probe_cache = match v.trim().to_ascii_lowercase().as_str() {
                "" | "cached" => true,
                "always" => false,
                _ => return Err(bad("GDR_ALLOC_PROBE", &v, "expected cached or always")),
            };
        }
        Ok(c)
    }

    /// Whether allocations on CUDA device `ordinal` are to be served.
    pub fn serves_gpu(&self, ordinal: i32) -> bool {
        self.enabled && self.gpus.as_ref().is_none_or(|s| s.contains(&ordinal))
    }

    /// Whether a request of `size` bytes is to be served.
    pub fn serves_size(&self, size: u64) -> bool {
        (self.min_size..=self.max_size).contains(&size)
    }

    /// Whether a call from the shared object `file` passes through.
    pub fn excludes_caller(&self, file: &str) -> bool {
        self.exclude.iter().any(|x| file.contains(x.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_serve_everything() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.serves_gpu(0) && c.serves_gpu(7));
        assert!(c.serves_size(1) && c.serves_size(u64::MAX));
        assert!(!c.excludes_caller("/usr/lib/libcudart.so.13"));
    }

    #[test]
    fn every_switch_is_read() {
        let c = cfg(&[
            ("GDR_ALLOC", "on"),
            ("GDR_ALLOC_GPUS", "1, 3"),
            ("GDR_ALLOC_MIN_SIZE", "512"),
            ("GDR_ALLOC_MAX_SIZE", "2MiB"),
            ("GDR_ALLOC_EXCLUDE", "libnccl, ,libucs"),
            ("GDR_ALLOC_CACHE", "1G"),
            ("GDR_ALLOC_LOG", "2"),
            ("GDR_ALLOC_PROBE", "Always"),
        ])
        .unwrap();
        assert!(!c.serves_gpu(0) && c.serves_gpu(1) && c.serves_gpu(3));
        assert!(!c.serves_size(511) && c.serves_size(512) && c.serves_size(2 << 20));
        assert!(!c.serves_size((2 << 20) + 1));
        assert_eq!(c.exclude, ["libnccl", "libucs"]);
        assert!(c.excludes_caller("/opt/x/libnccl.so.2"));
        assert_eq!(c.cache, 1 << 30);
        assert_eq!(c.log, 2);
        assert!(!c.probe_cache);
        assert!(cfg(&[]).unwrap().probe_cache, "cached by default");
        assert!(cfg(&[("GDR_ALLOC_PROBE", "cached")]).unwrap().probe_cache);
        let off = cfg(&[("GDR_ALLOC", "off")]).unwrap();
        assert!(!off.serves_gpu(0));
        assert!(cfg(&[("GDR_ALLOC_GPUS", "all")]).unwrap().gpus.is_none());
    }

    #[test]
    fn bad_values_are_refused_with_the_variable_named() {
        for (var, val) in [
            ("GDR_ALLOC", "maybe"),
            ("GDR_ALLOC_GPUS", "0,x"),
            ("GDR_ALLOC_GPUS", "-1"),
            ("GDR_ALLOC_MIN_SIZE", "lots"),
            ("GDR_ALLOC_MAX_SIZE", "99999999999999999999"),
            ("GDR_ALLOC_CACHE", "1Q"),
            ("GDR_ALLOC_LOG", "3"),
            ("GDR_ALLOC_PROBE", "never"),
        ] {
            let e = cfg(&[(var, val)]).unwrap_err();
            assert_eq!(e.var, var, "{e}");
            assert!(e.to_string().contains(val), "{e}");
        }
        let e = cfg(&[("GDR_ALLOC_MIN_SIZE", "4K"), ("GDR_ALLOC_MAX_SIZE", "1K")]).unwrap_err();
        assert_eq!(e.var, "GDR_ALLOC_MIN_SIZE");
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size(" 2 M"), Some(2 << 20));
        assert_eq!(parse_size("3GiB"), Some(3 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("16777216T"), None); // overflows
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("-1"), None);
    }
}
