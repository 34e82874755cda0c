//! The copy routines for CPU mappings of GPU memory live in [`gdr_mem::copy`] (re-exported
//! here); this module adds the auto copier, which picks among them by measurement.

pub use gdr_mem::copy::*;

pub mod auto;
