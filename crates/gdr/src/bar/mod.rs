//! (to be written)
pub mod gdrdrv;
