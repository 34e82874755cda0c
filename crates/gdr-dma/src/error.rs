//! The one error type of the crate. Every failure a caller can act on has its own variant, so a
//! test (or the CLI) can tell "the device is not bound to vfio-pci" from "the engine timed out"
//! without parsing text.

use std::time::Duration;

/// Everything that can go wrong between opening a device and verifying a copy.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// A system call failed; `op` names what was being attempted.
    #[error("{op}: {source}")]
    Sys {
        /// What was being attempted ("open /dev/vfio/vfio", "VFIO_IOMMU_MAP_DMA iova ...").
        op: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The PCI address does not parse (`DDDD:BB:DD.F` or `BB:DD.F`); the error says which
    /// part is wrong.
    #[error("bad PCI address: {0}")]
    BadAddress(#[from] gdr_pci::BdfParseError),

    /// No PCI device with that address exists.
    #[error("no PCI device {0} (see `lspci -D`)")]
    DeviceNotFound(String),

    /// The device is listed but sysfs does not say what it is (an attribute unreadable or
    /// malformed).
    #[error("sysfs: {0}")]
    Pci(gdr_pci::PciError),

    /// The VFIO container device node is missing: the modules are not loaded.
    #[error("VFIO is not available: /dev/vfio/vfio is missing; load it with `modprobe vfio-pci`")]
    NoVfio,

    /// The device has no IOMMU group: the IOMMU is off or absent.
    #[error(
        "{addr} has no IOMMU group: the IOMMU is off. Enable VT-d/AMD-Vi in the firmware and boot \
         with `intel_iommu=on iommu=pt` (Intel) or `amd_iommu=on` (AMD)"
    )]
    NoIommu {
        /// The device's PCI address.
        addr: String,
    },

    /// The device is bound to another driver (or none); the message says how to bind it.
    #[error("{addr} is {current}, not vfio-pci; bind it with: {hint}")]
    NotBound {
        /// The device's PCI address.
        addr: String,
        /// Its state in words: "bound to xdma", "bound to no driver".
        current: String,
        /// The shell commands that bind it to vfio-pci ([`bind_hint`](crate::bind_hint)).
        hint: String,
    },

    /// Some device of the IOMMU group is not bound to vfio-pci, so the group cannot be used.
    #[error("IOMMU group {group} is not viable: bind every device in it to vfio-pci ({members})")]
    GroupNotViable {
        /// The IOMMU group number.
        group: u32,
        /// The members in the way, with their drivers.
        members: String,
    },

    /// The kernel or the hardware does not offer what we need (the text names it).
    #[error("unsupported: need {0}")]
    Unsupported(String),

    /// The device's IDs match no engine.
    #[error(
        "{addr} ({vendor:04x}:{device:04x}) is not a known DMA device (XDMA 10de:0001, edu \
         1234:11e8); pass --engine xdma|edu to force one"
    )]
    UnknownDevice {
        /// The device's PCI address.
        addr: String,
        /// Its PCI vendor ID.
        vendor: u16,
        /// Its PCI device ID.
        device: u16,
    },

    /// A region (BAR, config space) is absent, too small or cannot be mapped.
    #[error("region {index} of {addr}: {why}")]
    Region {
        /// The device's PCI address.
        addr: String,
        /// VFIO's region index: BAR0-5 are 0-5, the ROM 6, config space 7.
        index: u32,
        /// What is wrong with it.
        why: String,
    },

    /// An address or length does not meet the alignment the hardware or the IOMMU needs.
    #[error("{what} {value:#x} is not aligned to {align:#x}")]
    Misaligned {
        /// Which value: "descriptor IOVA", "length of an IOMMU mapping", ...
        what: &'static str,
        /// The value given.
        value: u64,
        /// The alignment it needs, in bytes (a power of two).
        align: u64,
    },

    /// A CPU copy to or from DMA memory outside the memory.
    #[error("CPU access to DMA memory: {0}")]
    Access(#[from] gdr_mem::AccessError),

    /// A transfer names device memory or a descriptor length beyond what the engine has.
    #[error("{what}: {len:#x} bytes exceed the limit of {limit:#x}")]
    Oversize {
        /// Which quantity: "descriptor length", "device memory range", ...
        what: &'static str,
        /// The value asked for (a length, or an end address), in bytes or descriptors.
        len: u64,
        /// The most there is, in the same unit.
        limit: u64,
    },

    /// A transfer names an IOVA range that is not (entirely) mapped in the IOMMU.
    #[error("IOVA range {iova:#x}+{len:#x} is not mapped for DMA")]
    Unmapped {
        /// Start of the range.
        iova: u64,
        /// Bytes in the range.
        len: u64,
    },

    /// The IOVA window has no free range of that size left.
    #[error("IOVA window exhausted: no free {len:#x}-byte range below {limit:#x}")]
    IovaExhausted {
        /// Bytes asked for.
        len: u64,
        /// The window's end (one past its last IOVA).
        limit: u64,
    },

    /// A wait ran out of time; the engine was stopped before returning.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// What was waited for ("XDMA ToDevice list of 3 descriptors").
        what: String,
        /// The limit that passed.
        after: Duration,
    },

    /// The engine stopped with an error status (decoded into words by the engine).
    #[error("{engine} reported an error: {detail} (status {status:#x})")]
    Engine {
        /// The engine's name ("xdma", "edu").
        engine: &'static str,
        /// The raw status register.
        status: u32,
        /// The status decoded, with how far the submission got.
        detail: String,
    },

    /// A request that makes no sense (zero length, device-to-device without a bounce, ...).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl DmaError {
    /// Wraps the current `errno` with the name of the operation that failed.
    pub(crate) fn last_os(op: impl Into<String>) -> Self {
        DmaError::Sys {
            op: op.into(),
            source: std::io::Error::last_os_error(),
        }
    }

    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        DmaError::Sys {
            op: op.into(),
            source,
        }
    }
}

impl From<gdr_pci::PciError> for DmaError {
    /// A missing device keeps its own variant (and its hint); anything else sysfs says is
    /// passed on as it is.
    fn from(e: gdr_pci::PciError) -> Self {
        match e {
            gdr_pci::PciError::NotFound(bdf) => DmaError::DeviceNotFound(bdf.to_string()),
            e => DmaError::Pci(e),
        }
    }
}

/// The crate's result type (crate-private: users see `std::result::Result<T, DmaError>`).
pub(crate) type Result<T, E = DmaError> = std::result::Result<T, E>;
