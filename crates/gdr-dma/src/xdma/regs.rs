//! The XDMA register map as PicoEVB and HTG-K800 use it (BAR1, 64 KiB). A register's address is
//! `target << 12 | channel << 8 | offset`.

// The register map as the XDMA product guide (PG195) lays it out; the driver uses part of it.
#![allow(dead_code)]

/// Register block targets.
pub const TARGET_H2C: u64 = 0;
pub const TARGET_C2H: u64 = 1;
pub const TARGET_IRQ: u64 = 2;
pub const TARGET_CONFIG: u64 = 3;
pub const TARGET_H2C_SGDMA: u64 = 4;
pub const TARGET_C2H_SGDMA: u64 = 5;
pub const TARGET_SGDMA_COMMON: u64 = 6;

/// The address of `offset` in `target`'s block for `channel`.
pub const fn addr(target: u64, channel: u64, offset: u64) -> u64 {
    (target << 12) | (channel << 8) | offset
}

/// Channel registers (H2C and C2H blocks).
pub const CH_IDENTIFIER: u64 = 0x00;
pub const CH_CONTROL: u64 = 0x04;
pub const CH_CONTROL_W1S: u64 = 0x08;
pub const CH_CONTROL_W1C: u64 = 0x0c;
pub const CH_STATUS: u64 = 0x40;
pub const CH_STATUS_RC: u64 = 0x44;
pub const CH_COMPLETED: u64 = 0x48;
pub const CH_ALIGNMENTS: u64 = 0x4c;
pub const CH_INT_ENABLE: u64 = 0x90;
pub const CH_PERF_CONTROL: u64 = 0xc0;
pub const CH_PERF_CYCLES_LO: u64 = 0xc4;
pub const CH_PERF_CYCLES_HI: u64 = 0xc8;
pub const CH_PERF_DATA_LO: u64 = 0xcc;
pub const CH_PERF_DATA_HI: u64 = 0xd0;

/// SGDMA registers (H2C_SGDMA and C2H_SGDMA blocks).
pub const SG_DESC_LO: u64 = 0x80;
pub const SG_DESC_HI: u64 = 0x84;
pub const SG_DESC_ADJACENT: u64 = 0x88;

/// IRQ block: channel interrupt enable mask, write-1-to-set and write-1-to-clear.
pub const IRQ_CHANNEL_EN: u64 = 0x10;
pub const IRQ_CHANNEL_EN_W1S: u64 = 0x14;
pub const IRQ_CHANNEL_EN_W1C: u64 = 0x18;

/// The identifier register's fixed top 12 bits.
pub const IDENTIFIER_MAGIC: u32 = 0x1fc;

/// Control bits (the interrupt-enable bits share positions with the status bits below).
pub const CTRL_RUN: u32 = 1 << 0;

/// Status bits.
pub const ST_BUSY: u32 = 1 << 0;
pub const ST_DESC_STOPPED: u32 = 1 << 1;
pub const ST_DESC_COMPLETED: u32 = 1 << 2;
pub const ST_ALIGN_MISMATCH: u32 = 1 << 3;
pub const ST_MAGIC_STOPPED: u32 = 1 << 4;
pub const ST_INVALID_LENGTH: u32 = 1 << 5;
pub const ST_IDLE_STOPPED: u32 = 1 << 6;
pub const ST_READ_ERROR: u32 = 0x1f << 9;
pub const ST_WRITE_ERROR: u32 = 0x1f << 14;
pub const ST_DESC_ERROR: u32 = 0x1f << 19;

/// Every status bit that means the engine stopped on an error.
pub const ST_ERRORS: u32 = ST_ALIGN_MISMATCH
    | ST_MAGIC_STOPPED
    | ST_INVALID_LENGTH
    | ST_READ_ERROR
    | ST_WRITE_ERROR
    | ST_DESC_ERROR;

/// Names the error bits of a status word, for messages.
pub fn describe_status(st: u32) -> String {
    let mut v = Vec::new();
    for (bit, name) in [
        (ST_ALIGN_MISMATCH, "address/length alignment mismatch"),
        (ST_MAGIC_STOPPED, "bad descriptor magic"),
        (ST_INVALID_LENGTH, "invalid descriptor length"),
        (ST_READ_ERROR, "read error"),
        (ST_WRITE_ERROR, "write error"),
        (ST_DESC_ERROR, "descriptor fetch error"),
    ] {
        if st & bit != 0 {
            v.push(name);
        }
    }
    if v.is_empty() {
        "no error bits".to_string()
    } else {
        v.join(", ")
    }
}
