//! `gdr topo` must stay near-linear in the number of devices. A tree of [`DEVICES`] functions
//! (16384, the most one listing of `bus/pci/devices` visits), half of them GPUs, is read,
//! reported as JSON in both views, drawn as a matrix and judged pair by pair within
//! [`TIME_CAP`] and [`PEAK_RSS_CAP`]: judging every pair grows with the square of the devices,
//! which these bounds catch (the measured figures are in docs/topology.md, "Reading untrusted
//! captures"). Thousands of addresses that lead to one device directory are read once.
//!
//! The tests of this file run one at a time (a lock), so that the time and the peak memory each
//! measures are its own.

use gdr_pci::limits::{MAX_DIR_ENTRIES, MAX_MATRIX_DEVICES, MAX_PAIRS};
use gdr_pci::{render, Topology};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod topo_common;
use topo_common::{assert_warned, small_machine};

const DEVICES: usize = MAX_DIR_ENTRIES;
/// The bound for `gdr topo` as shipped, its time going mostly to the 16384 directory reads: an
/// optimized build takes about 1.3 s on the build machine but 1.7-2.2 s on the GPU hosts' VMs
/// (2.03 and 2.12 s in two runs there, over a 2 s bound), whose file systems are slower. Quadratic
/// judging took 21.5 s for 2000 devices, so 5 s still fails by far for it. The unoptimized
/// build of `cargo test` is several times slower and gets a looser bound on the same terms.
const TIME_CAP: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(10)
} else {
    Duration::from_secs(5)
};
const PEAK_RSS_CAP: u64 = 256 << 20;
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// `devices/pci0001:00/0001:BB:DD.F` for device `i`, the address as a string.
fn address(i: usize) -> String {
    format!("0001:{:02x}:{:02x}.{}", i >> 8, (i >> 3) & 0x1f, i & 7)
}

/// A flat tree of `n` functions on one host bridge, even ones GPUs and odd ones NICs, each
/// with only the attributes that classify it (the others are warned about, within the cap on
/// warnings: the tree is for timing, and made in a few seconds).
fn wide_tree(root: &Path, n: usize) {
    let hb = root.join("devices/pci0001:00");
    let bus = root.join("bus/pci/devices");
    std::fs::create_dir_all(&bus).unwrap();
    for i in 0..n {
        let a = address(i);
        let dir = hb.join(&a);
        std::fs::create_dir_all(&dir).unwrap();
        let (vendor, class) = if i % 2 == 0 {
            ("0x10de", "0x030200")
        } else {
            ("0x15b3", "0x020000")
        };
        std::fs::write(dir.join("vendor"), vendor).unwrap();
        std::fs::write(dir.join("class"), class).unwrap();
        symlink(format!("../../../devices/pci0001:00/{a}"), bus.join(&a)).unwrap();
    }
}

/// A scratch directory in memory (/dev/shm) where there is one: tens of thousands of entries
/// are made and removed far faster in tmpfs than on the disk of a small VM.
fn memory_scratch() -> tempfile::TempDir {
    let b = tempfile::Builder::new()
        .prefix("topo-scale-")
        .tempdir_in("/dev/shm");
    b.or_else(|_| tempfile::Builder::new().prefix("topo-scale-").tempdir())
        .unwrap()
}

#[test]
fn sixteen_thousand_devices_take_bounded_time_and_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let root = memory_scratch();
    wide_tree(root.path(), DEVICES);

    let start = Instant::now();
    let topo = Topology::read(root.path()).unwrap();
    assert_eq!(topo.devices().len(), DEVICES);
    assert_eq!(topo.gpus().len(), DEVICES / 2);
    for (view, all) in [(topo.gpu_view(), false), (topo.endpoints(), true)] {
        let report = if all {
            topo.report(&view)
        } else {
            topo.gpu_report(&view)
        };
        assert_eq!(report.devices.len(), view.len());
        assert_eq!(report.pairs.len(), MAX_PAIRS, "all: {all}");
        // Every pair has a GPU on one side: all pairs but those of two NICs.
        let (n, nics) = (DEVICES, DEVICES / 2);
        let asked = n * (n - 1) / 2 - if all { 0 } else { nics * (nics - 1) / 2 };
        assert_eq!(report.pairs_left_out, asked - MAX_PAIRS, "all: {all}");
        assert!(
            report.warnings.iter().any(|w| w.contains("pairs left out")),
            "{:?}",
            report.warnings
        );
        let json = serde_json::to_string(&report).unwrap();
        assert!(json.len() < 64 << 20, "{} bytes of JSON", json.len());
        let matrix = render::matrix(&topo, &view);
        assert!(
            matrix.contains(&format!(
                "matrix shown for the first {MAX_MATRIX_DEVICES} of {DEVICES} devices"
            )),
            "{}",
            &matrix[..400]
        );
        assert!(matrix.lines().count() < MAX_MATRIX_DEVICES + DEVICES + 40);
        let verdicts = render::verdicts(&topo, &view);
        assert!(verdicts.lines().count() <= MAX_PAIRS + 2);
        assert!(verdicts.contains("pairs left out"), "{}", &verdicts[..200]);
    }
    let took = start.elapsed();
    let rss = peak_rss();
    eprintln!("{DEVICES} devices: {took:?}, peak {} MiB", rss >> 20);
    assert!(took < TIME_CAP, "took {took:?}");
    assert!(rss < PEAK_RSS_CAP, "peak memory {} MiB", rss >> 20);
}

#[test]
fn thousands_of_addresses_of_one_device_are_read_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (root, [gpu, ..]) = small_machine("aliases");
    let bus = root.join("bus/pci/devices");
    for i in 0..2000 {
        symlink(Path::new("../../..").join(&gpu), bus.join(address(i))).unwrap();
    }
    let start = Instant::now();
    let topo = Topology::read(&*root).unwrap();
    assert_eq!(topo.devices().len(), 8);
    assert_eq!(topo.gpus().len(), 1);
    assert_warned(
        &topo,
        "bus/pci/devices/0001:00:00.0",
        "leads to the same directory as 0000:03:00.0; device skipped",
    );
    let json = serde_json::to_string(&topo.gpu_report(&topo.gpu_view())).unwrap();
    assert!(json.len() < 1 << 20);
    assert!(start.elapsed() < TIME_CAP, "took {:?}", start.elapsed());
}
