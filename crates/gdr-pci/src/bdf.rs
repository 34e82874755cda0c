//! PCI addresses (`domain:bus:device.function`), the key every other part of the crate uses.

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A PCI function address. Printed the way sysfs names devices (`0000:17:00.0`); parsed from that
/// form or from the short `17:00.0` form that `lspci` prints (domain 0). The domain is 32 bits
/// wide: Intel VMD puts its devices in domains from `10000` up.
///
/// # Examples
///
/// ```
/// use gdr_pci::{Bdf, BdfParseErrorKind};
///
/// let gpu: Bdf = "0000:17:00.0".parse()?;
/// assert_eq!(gpu, Bdf::new(0, 0x17, 0, 0));
/// // lspci's short form is domain 0; printing gives sysfs's long form.
/// assert_eq!("17:00.0".parse::<Bdf>()?, gpu);
/// assert_eq!(gpu.to_string(), "0000:17:00.0");
/// // A bus has 32 device slots.
/// assert_eq!("17:20.0".parse::<Bdf>().unwrap_err().kind, BdfParseErrorKind::Device);
/// # Ok::<(), gdr_pci::BdfParseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    /// PCI segment (domain): 0 on most machines, 16 bits in sysfs names, 32 bits with VMD.
    pub domain: u32,
    /// Bus number within the domain (0-255).
    pub bus: u8,
    /// Device (slot) number on the bus (0-31).
    pub device: u8,
    /// Function number of the device (0-7).
    pub function: u8,
}

/// Why a string is not a PCI address: the string, and which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{input}` is not a PCI address: {kind} (expected DDDD:BB:DD.F or BB:DD.F, hexadecimal)")]
pub struct BdfParseError {
    /// The text that was given, unchanged.
    pub input: String,
    /// Which part of it is wrong.
    pub kind: BdfParseErrorKind,
}

/// The part of an address that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BdfParseErrorKind {
    /// Not `[DDDD:]BB:DD.F`: a colon or the dot is missing, or there are too many parts.
    #[error("not of the form [DDDD:]BB:DD.F")]
    Shape,
    /// The domain is empty, longer than 8 hex digits, or not hexadecimal.
    #[error("the domain is not 1 to 8 hex digits")]
    Domain,
    /// The bus is empty, longer than 2 hex digits, or not hexadecimal.
    #[error("the bus is not 1 or 2 hex digits")]
    Bus,
    /// The device is not hexadecimal or above 0x1f (a bus has 32 device slots).
    #[error("the device is not a hex number up to 1f")]
    Device,
    /// The function is not one hex digit up to 7 (a device has 8 functions).
    #[error("the function is not a hex digit up to 7")]
    Function,
}

impl Bdf {
    /// The address `domain:bus:device.function`. Nothing is checked: `device` above 0x1f or
    /// `function` above 7 give an address no parse would accept.
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        Self {
            domain,
            bus,
            device,
            function,
        }
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for Bdf {
    type Err = BdfParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use BdfParseErrorKind as K;
        let err = |kind| BdfParseError {
            input: s.to_string(),
            kind,
        };
        // At most `max_len` hex digits (no sign, no prefix), and at most `max`.
        let hex = |t: &str, max_len: usize, max: u32, kind| {
            if t.is_empty() || t.len() > max_len || !t.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err(kind));
            }
            match u32::from_str_radix(t, 16) {
                Ok(v) if v <= max => Ok(v),
                _ => Err(err(kind)),
            }
        };
        let (head, func) = s.rsplit_once('.').ok_or_else(|| err(K::Shape))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [d, b, v] => (hex(d, 8, u32::MAX, K::Domain)?, *b, *v),
            [b, v] => (0, *b, *v),
            _ => return Err(err(K::Shape)),
        };
        let bus = hex(bus, 2, 0xff, K::Bus)?;
        let dev = hex(dev, 2, 0x1f, K::Device)?;
        let function = hex(func, 1, 7, K::Function)?;
        Ok(Bdf::new(domain, bus as u8, dev as u8, function as u8))
    }
}

impl Serialize for Bdf {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_long_and_short_forms() {
        let b: Bdf = "0000:17:00.0".parse().unwrap();
        assert_eq!(
            "0000:3b:00.1".parse::<Bdf>().unwrap(),
            Bdf::new(0, 0x3b, 0, 1)
        );
        assert_eq!(
            "0:0:4.0".parse::<Bdf>().unwrap().to_string(),
            "0000:00:04.0"
        );
        assert_eq!(
            "ffffffff:ff:1f.7".parse::<Bdf>().unwrap(),
            Bdf::new(u32::MAX, 0xff, 0x1f, 7)
        );
        assert_eq!(b, Bdf::new(0, 0x17, 0, 0));
        assert_eq!("17:00.0".parse::<Bdf>().unwrap(), b);
        assert_eq!(
            "10000:e0:1f.7".parse::<Bdf>().unwrap(),
            Bdf::new(0x10000, 0xe0, 0x1f, 7)
        );
        assert_eq!(
            "0000:AB:1c.3".parse::<Bdf>().unwrap().to_string(),
            "0000:ab:1c.3"
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "17:00",
            "17:20.0",
            "17:00.8",
            "x7:00.0",
            "0000:17:00.0.1",
            "1:2:3:4.0",
            "123:00.0",
            "gpu0",
            ":00.0",
            "17:00.",
            "00:.0",
            "+0:00.0",
            "0000:00:04.0 ",
            "100000000:00:00.0",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn errors_name_the_part_at_fault() {
        let kind = |s: &str| s.parse::<Bdf>().unwrap_err().kind;
        assert_eq!(kind("gpu0"), BdfParseErrorKind::Shape);
        assert_eq!(kind("1:2:3:4.0"), BdfParseErrorKind::Shape);
        assert_eq!(kind("x:00:04.0"), BdfParseErrorKind::Domain);
        assert_eq!(kind("123:00.0"), BdfParseErrorKind::Bus);
        assert_eq!(kind("0000:00:20.0"), BdfParseErrorKind::Device);
        assert_eq!(kind("00:04.8"), BdfParseErrorKind::Function);
        assert_eq!(
            "00:04".parse::<Bdf>().unwrap_err().to_string(),
            "`00:04` is not a PCI address: not of the form [DDDD:]BB:DD.F \
             (expected DDDD:BB:DD.F or BB:DD.F, hexadecimal)"
        );
    }

    #[test]
    fn display_round_trips_random_addresses() {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        for _ in 0..1000 {
            let b = Bdf::new(
                rng.gen_range(0..0x20000),
                rng.gen(),
                rng.gen_range(0..32),
                rng.gen_range(0..8),
            );
            assert_eq!(b.to_string().parse::<Bdf>().unwrap(), b);
        }
    }
}
