//! The three LEDs of the picoevb bitstreams: an AXI GPIO block on BAR0 whose data register
//! drives them active-low (a 0 bit lights an LED, so 7 turns all of them off).

use crate::error::{DmaError, Result};
use crate::regs::RegisterIo;

/// GPIO data register offset in BAR0.
pub const GPIO_DATA: u64 = 0x0;
/// Mask of the LED bits.
pub const LED_MASK: u32 = 0x7;

/// The LED GPIO over BAR0.
pub struct Leds<R: RegisterIo> {
    regs: R,
}

impl<R: RegisterIo> Leds<R> {
    /// The LEDs over BAR0 `regs`; fails when the BAR is too small to hold the data register.
    pub fn new(regs: R) -> Result<Self> {
        if regs.len() < 4 {
            return Err(DmaError::Unsupported("a GPIO BAR0".into()));
        }
        Ok(Leds { regs })
    }

    /// Lights the LEDs whose bits are set in `lit` (bit 0 = LED 0) and turns the others off.
    pub fn set(&self, lit: u32) -> Result<()> {
        if lit & !LED_MASK != 0 {
            return Err(DmaError::Invalid(format!(
                "LED mask {lit:#x}: there are three LEDs (0..=7)"
            )));
        }
        self.regs.write32(GPIO_DATA, !lit & LED_MASK);
        Ok(())
    }

    /// The raw GPIO value as picoevb's set-leds writes it (0 = all on, 7 = all off).
    pub fn set_raw(&self, value: u32) -> Result<()> {
        if value & !LED_MASK != 0 {
            return Err(DmaError::Invalid(format!("GPIO value {value:#x} (0..=7)")));
        }
        self.set(!value & LED_MASK)
    }

    /// Which LEDs are lit, read back from the data register.
    pub fn get(&self) -> u32 {
        !self.regs.read32(GPIO_DATA) & LED_MASK
    }
}
