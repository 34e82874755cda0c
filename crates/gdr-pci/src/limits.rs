//! Bounds on what reading a sysfs tree may cost. Captures come with bug reports, so the tree
//! read by `gdr topo --sysfs DIR` is untrusted: whatever it holds, the read must end soon, in
//! little memory, without leaving the tree. Each bound is far above what a real `/sys` needs;
//! an entry past one is left out with a [`Warning`](super::Warning).

/// Bytes read from one attribute at most. The kernel formats an attribute into one page, which
/// is 64 KiB on kernels with 64 KiB pages (aarch64 machines such as Grace).
pub const MAX_ATTR_BYTES: usize = 64 << 10;

/// Bytes read from a `config` file at most: PCI Express config space is 4 KiB.
pub const MAX_CONFIG_BYTES: usize = 4096;

/// Bytes read from the whole tree at most. A real `/sys` gives a few KiB per PCI function.
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;

/// Entries one directory listing visits at most (a real `bus/pci/devices` holds a few
/// thousand functions on the largest SR-IOV hosts).
pub const MAX_DIR_ENTRIES: usize = 16384;

/// Symlinks one lookup follows at most, as the kernel's own limit (ELOOP).
pub const MAX_LINK_HOPS: usize = 40;

/// Warnings kept at most; past this they are counted in one last warning.
pub const MAX_WARNINGS: usize = 256;

/// Device pairs judged at most by one call ([`Topology::pairs`](super::Topology::pairs) and
/// the report and verdict list built on it); the rest are counted and named in a warning. Each
/// pair costs a path walk and a few hundred bytes of JSON, so the work stays linear in the
/// devices shown. A real machine's GPU view has a few hundred pairs (8 GPUs with 16 NICs and
/// drives: 8 x 23 + ...), and `--all` on a large host a few thousand.
pub const MAX_PAIRS: usize = 16384;

/// Devices the text matrix shows at most (its rows and columns): 64 columns are already about
/// 400 characters wide. Past it the matrix covers the first ones, says so, and the device list
/// and the verdicts go on for all of them.
pub const MAX_MATRIX_DEVICES: usize = 64;
