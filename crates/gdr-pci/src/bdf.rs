//! PCI addresses (`domain:bus:device.function`), the key every other part of `topo` uses.

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A PCI function address. Printed the way sysfs names devices (`0000:17:00.0`); parsed from that
/// form or from the short `17:00.0` form that `lspci` prints (domain 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a PCI address (expected DDDD:BB:DD.F or BB:DD.F, hexadecimal)")]
pub struct BdfParseError(pub String);

impl Bdf {
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
        let err = || BdfParseError(s.to_string());
        let hex = |t: &str, max_len: usize| -> Result<u32, BdfParseError> {
            if t.is_empty() || t.len() > max_len || !t.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(t, 16).map_err(|_| err())
        };
        let (head, func) = s.rsplit_once('.').ok_or_else(err)?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [d, b, v] => (hex(d, 8)?, hex(b, 2)?, hex(v, 2)?),
            [b, v] => (0, hex(b, 2)?, hex(v, 2)?),
            _ => return Err(err()),
        };
        let function = hex(func, 1)?;
        if dev > 0x1f || function > 7 {
            return Err(err());
        }
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
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad} parsed");
        }
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
