//! Decoding the bits of PCI configuration space that sysfs does not spell out: the PCI Express
//! port type (standard capability 0x10) and Access Control Services (extended capability 0x000D).
//!
//! Linux lets anyone read the first 64 bytes of `config` but only root the rest, so every answer
//! here can be "not readable"; the caller then falls back to the tree shape or reports "unknown".

use serde::Serialize;

const STATUS: usize = 0x06;
const STATUS_CAP_LIST: u16 = 1 << 4;
const CAP_POINTER: usize = 0x34;
const CAP_ID_PCIE: u8 = 0x10;
const EXT_CAP_START: usize = 0x100;
const EXT_CAP_ID_ACS: u16 = 0x000d;
const EXT_CAP_ID_DSN: u16 = 0x0003;

// ACS capability and control register bits (PCIe base specification, ACS Extended
// Capability); the same positions in both registers.

/// ACS Source Validation: the port checks the requester ID's bus number of upstream requests.
pub const ACS_SOURCE_VALIDATION: u16 = 1 << 0;
/// ACS Translation Blocking: the port blocks upstream requests with translated addresses.
pub const ACS_TRANSLATION_BLOCKING: u16 = 1 << 1;
/// ACS P2P Request Redirect: peer requests go up to the root complex instead of across.
pub const ACS_P2P_REQUEST_REDIRECT: u16 = 1 << 2;
/// ACS P2P Completion Redirect: peer completions go up to the root complex too.
pub const ACS_P2P_COMPLETION_REDIRECT: u16 = 1 << 3;
/// ACS Upstream Forwarding: redirected requests may be forwarded upstream.
pub const ACS_UPSTREAM_FORWARDING: u16 = 1 << 4;
/// ACS P2P Egress Control: a per-port egress vector blocks or redirects peer requests.
pub const ACS_P2P_EGRESS_CONTROL: u16 = 1 << 5;
/// ACS Direct Translated P2P: requests with translated addresses may go straight to the peer.
pub const ACS_DIRECT_TRANSLATED_P2P: u16 = 1 << 6;

fn u16_at(cfg: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*cfg.get(off)?, *cfg.get(off + 1)?]))
}

fn u32_at(cfg: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes([
        *cfg.get(off)?,
        *cfg.get(off + 1)?,
        *cfg.get(off + 2)?,
        *cfg.get(off + 3)?,
    ]))
}

/// The "Device/Port Type" field of the PCI Express capability (bits 7:4 of its flags), or `None`
/// when the capability is absent or lies beyond the bytes that could be read.
pub fn pcie_port_type(cfg: &[u8]) -> Option<u8> {
    if u16_at(cfg, STATUS)? & STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut ptr = (*cfg.get(CAP_POINTER)? & 0xfc) as usize;
    // At most 48 capabilities fit in the 192 bytes after the header; the bound stops loops.
    for _ in 0..48 {
        if ptr < 0x40 {
            return None;
        }
        let id = *cfg.get(ptr)?;
        if id == CAP_ID_PCIE {
            return Some(((u16_at(cfg, ptr + 2)? >> 4) & 0xf) as u8);
        }
        ptr = (*cfg.get(ptr + 1)? & 0xfc) as usize;
    }
    None
}

/// What the ACS extended capability of a port or function says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum AcsState {
    /// Extended config space could not be read (not root, or a conventional PCI device).
    Unknown,
    /// The capability list was read and has no ACS entry.
    Absent,
    /// The capability list is broken (truncated, looping, pointing into the header).
    Malformed {
        /// What is wrong with the list, and at which offset.
        why: String,
    },
    /// The capability was found; its registers, decoded.
    Present(Acs),
}

/// The ACS capability and control registers, with the bits that redirect peer traffic decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Acs {
    /// The ACS Capability register: which controls the port implements (`ACS_*` bits).
    pub capability: u16,
    /// The ACS Control register: which of them are on (`ACS_*` bits).
    pub control: u16,
    /// P2P Request Redirect: peer requests are sent upstream instead of across.
    pub request_redirect: bool,
    /// P2P Completion Redirect: peer completions are sent upstream too.
    pub completion_redirect: bool,
    /// Upstream Forwarding: redirected traffic may go up (to the root complex and IOMMU).
    pub upstream_forwarding: bool,
}

impl Acs {
    /// Decodes the ACS Capability and Control registers (offsets 4 and 6 of the capability).
    pub fn from_registers(capability: u16, control: u16) -> Self {
        Self {
            capability,
            control,
            request_redirect: control & ACS_P2P_REQUEST_REDIRECT != 0,
            completion_redirect: control & ACS_P2P_COMPLETION_REDIRECT != 0,
            upstream_forwarding: control & ACS_UPSTREAM_FORWARDING != 0,
        }
    }

    /// Whether peer traffic arriving at this port is turned upstream rather than routed across.
    pub fn redirects_peer_traffic(&self) -> bool {
        self.request_redirect || self.completion_redirect
    }
}

impl AcsState {
    /// The decoded registers, when present.
    pub fn acs(&self) -> Option<&Acs> {
        match self {
            AcsState::Present(a) => Some(a),
            _ => None,
        }
    }

    /// Short human form: `RR+ CR+ UF-`, `no ACS`, `unknown`.
    pub fn summary(&self) -> String {
        match self {
            AcsState::Unknown => "ACS unknown".into(),
            AcsState::Absent => "no ACS".into(),
            AcsState::Malformed { .. } => "ACS unreadable".into(),
            AcsState::Present(a) => {
                let f = |on: bool| if on { '+' } else { '-' };
                format!(
                    "ACS RR{} CR{} UF{}",
                    f(a.request_redirect),
                    f(a.completion_redirect),
                    f(a.upstream_forwarding)
                )
            }
        }
    }
}

/// Offsets of the extended capabilities, in list order; stops quietly at anything malformed.
fn ext_caps(cfg: &[u8]) -> Vec<(usize, u16)> {
    let mut out = Vec::new();
    let mut off = EXT_CAP_START;
    while out.len() < (4096 - EXT_CAP_START) / 4 {
        let Some(header) = u32_at(cfg, off) else {
            break;
        };
        if header == 0 || header == 0xffff_ffff {
            break;
        }
        out.push((off, (header & 0xffff) as u16));
        let next = ((header >> 20) & 0xffc) as usize;
        if next < EXT_CAP_START || out.iter().any(|&(o, _)| o == next) {
            break;
        }
        off = next;
    }
    out
}

/// Zeroes the Device Serial Number capability (0x0003), so that a capture for a bug report
/// carries no serial numbers. Returns whether there was one.
pub fn scrub_serial_number(cfg: &mut [u8]) -> bool {
    let mut found = false;
    for (off, id) in ext_caps(cfg) {
        if id == EXT_CAP_ID_DSN {
            let end = (off + 12).min(cfg.len());
            if off + 4 < end {
                cfg[off + 4..end].fill(0);
            }
            found = true;
        }
    }
    found
}

/// Walks the extended capability list (from offset 0x100) for ACS.
pub fn find_acs(cfg: &[u8]) -> AcsState {
    if cfg.len() < EXT_CAP_START + 4 {
        return AcsState::Unknown;
    }
    let malformed = |why: String| AcsState::Malformed { why };
    let mut off = EXT_CAP_START;
    // Each entry takes at least 4 bytes, so more steps than this means the list loops.
    for _ in 0..(4096 - EXT_CAP_START) / 4 {
        let Some(header) = u32_at(cfg, off) else {
            return malformed(format!(
                "capability at {off:#x} lies past the end of config"
            ));
        };
        // All-zero or all-ones at 0x100: no extended capabilities (or the device is gone).
        if header == 0 || header == 0xffff_ffff {
            return if off == EXT_CAP_START {
                AcsState::Absent
            } else {
                malformed(format!("empty capability header at {off:#x}"))
            };
        }
        if (header & 0xffff) as u16 == EXT_CAP_ID_ACS {
            return match (u16_at(cfg, off + 4), u16_at(cfg, off + 6)) {
                (Some(cap), Some(ctl)) => AcsState::Present(Acs::from_registers(cap, ctl)),
                _ => malformed(format!("ACS capability at {off:#x} is cut off")),
            };
        }
        let next = ((header >> 20) & 0xffc) as usize;
        if next == 0 {
            return AcsState::Absent;
        }
        if next < EXT_CAP_START {
            return malformed(format!(
                "next pointer {next:#x} at {off:#x} points into the header"
            ));
        }
        off = next;
    }
    malformed("extended capability list loops".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn put32(cfg: &mut [u8], off: usize, v: u32) {
        cfg[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn finds_acs_after_another_capability() {
        let mut cfg = vec![0u8; 4096];
        // AER (id 1, version 2) at 0x100 pointing to ACS at 0x148.
        put32(&mut cfg, 0x100, 0x0001 | (2 << 16) | (0x148 << 20));
        put32(&mut cfg, 0x148, 0x000d | (1 << 16));
        cfg[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        cfg[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        let acs = find_acs(&cfg);
        let a = acs.acs().expect("present");
        assert_eq!((a.capability, a.control), (0x5f, 0x1d));
        assert!(a.request_redirect && a.completion_redirect && a.upstream_forwarding);
        assert_eq!(acs.summary(), "ACS RR+ CR+ UF+");
    }

    #[test]
    fn short_config_is_unknown_and_loops_are_caught() {
        assert_eq!(find_acs(&[0u8; 64]), AcsState::Unknown);
        assert_eq!(find_acs(&[0u8; 256]), AcsState::Unknown);
        assert_eq!(find_acs(&[0u8; 4096]), AcsState::Absent);
        let mut cfg = vec![0u8; 4096];
        put32(&mut cfg, 0x100, 0x0001 | (0x100 << 20));
        assert!(matches!(find_acs(&cfg), AcsState::Malformed { .. }));
        put32(&mut cfg, 0x100, 0x0001 | (0x40 << 20));
        assert!(matches!(find_acs(&cfg), AcsState::Malformed { .. }));
        // A pointer to the last dword: the next header would be cut off by a 0x1000-byte read.
        let mut cut = vec![0u8; 0x200];
        put32(&mut cut, 0x100, 0x0001 | (0x1fc << 20));
        put32(&mut cut, 0x1fc, 0x000d);
        assert!(matches!(find_acs(&cut), AcsState::Malformed { .. }));
    }

    #[test]
    fn serial_numbers_are_scrubbed_and_nothing_else() {
        let mut cfg = vec![0u8; 4096];
        rand::thread_rng().fill(&mut cfg[..0x100]);
        put32(&mut cfg, 0x100, 0x0003 | (1 << 16) | (0x150 << 20));
        put32(&mut cfg, 0x104, 0xdead_beef);
        put32(&mut cfg, 0x108, 0x0bad_f00d);
        put32(&mut cfg, 0x150, 0x000d | (1 << 16));
        put32(&mut cfg, 0x154, 0x001d_005f);
        let before = cfg.clone();
        assert!(scrub_serial_number(&mut cfg));
        assert_eq!(&cfg[0x104..0x10c], &[0u8; 8]);
        assert_eq!(&cfg[..0x104], &before[..0x104]);
        assert_eq!(&cfg[0x10c..], &before[0x10c..]);
        assert_eq!(find_acs(&cfg), find_acs(&before));
        let mut none = vec![0u8; 4096];
        assert!(!scrub_serial_number(&mut none));
        assert!(!scrub_serial_number(&mut [0u8; 64]));
    }

    #[test]
    fn port_type_from_pcie_capability() {
        let mut cfg = vec![0u8; 256];
        cfg[STATUS] = STATUS_CAP_LIST as u8;
        cfg[CAP_POINTER] = 0x50;
        cfg[0x50] = 0x01; // power management
        cfg[0x51] = 0x60;
        cfg[0x60] = CAP_ID_PCIE;
        cfg[0x62] = 0x62; // version 2, type 6 = switch downstream port
        assert_eq!(pcie_port_type(&cfg), Some(6));
        assert_eq!(pcie_port_type(&cfg[..64]), None);
        cfg[0x51] = 0x50; // loop back onto itself
        assert_eq!(pcie_port_type(&cfg), None);
    }

    #[test]
    fn random_config_space_never_panics() {
        let mut rng = rand::thread_rng();
        for _ in 0..2000 {
            let len = rng.gen_range(0..=4096);
            let mut cfg = vec![0u8; len];
            rng.fill(&mut cfg[..]);
            let _ = find_acs(&cfg);
            let _ = scrub_serial_number(&mut cfg);
            let _ = pcie_port_type(&cfg);
        }
    }
}
