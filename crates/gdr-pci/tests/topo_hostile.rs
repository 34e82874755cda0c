//! Captures are attached to bug reports, so `gdr topo --sysfs DIR` reads untrusted trees. Each
//! hostile entry here must give a warning that names it, the rest of the tree must still be
//! read, and the read must finish within a second in bounded memory: no entry may make the
//! reader block, allocate by a file's claimed size, follow links forever or leave the tree.
//!
//! The trees are built at run time (FIFOs and links to /dev/zero do not belong in git).

use gdr_pci::limits::{
    MAX_ATTR_BYTES, MAX_CONFIG_BYTES, MAX_DIR_ENTRIES, MAX_LINK_HOPS, MAX_WARNINGS,
};
use gdr_pci::{capture, Topology};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod topo_common;
use topo_common::{assert_warned, scratch, small_machine};

/// A read of a tree this small needs a few MiB; a reader that allocates by a file's size or
/// reads /dev/zero goes far past this.
const PEAK_RSS_CAP: u64 = 256 << 20;
const TIME_CAP: Duration = Duration::from_secs(1);

/// Runs `work` on its own thread and fails the test when it takes longer than [`TIME_CAP`]
/// (a reader blocked on a FIFO would otherwise hang the test run).
fn within_time_cap<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    let out = rx
        .recv_timeout(TIME_CAP)
        .unwrap_or_else(|_| panic!("{what} did not finish within {TIME_CAP:?}"));
    assert!(
        start.elapsed() < TIME_CAP,
        "{what} took {:?}",
        start.elapsed()
    );
    out
}

/// The process's peak resident memory (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// Reads the tree under the time cap and checks the memory cap.
fn read_hostile(root: &Path) -> Topology {
    let r = root.to_path_buf();
    let topo = within_time_cap("reading the tree", move || Topology::read(&r)).unwrap();
    assert!(
        peak_rss() < PEAK_RSS_CAP,
        "peak memory {} MiB",
        peak_rss() >> 20
    );
    topo
}

/// The devices of the small machine that the hostile entries did not touch are all there.
fn assert_rest_is_read(topo: &Topology, expect_devices: usize) {
    assert_eq!(
        topo.devices().len(),
        expect_devices,
        "{:?}",
        topo.warnings()
    );
    assert!(topo.find("gpu0").is_ok(), "{:?}", topo.warnings());
    assert!(topo.find("mlx5_0").is_ok(), "{:?}", topo.warnings());
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn replace_with_link(at: &Path, target: impl AsRef<Path>) {
    let _ = std::fs::remove_file(at);
    let _ = std::fs::remove_dir_all(at);
    symlink(target, at).unwrap();
}

/// Copies a device directory's plain files to `to`, with `vendor` changed to 0xdead, as a
/// stand-in for a directory outside the capture that a link must not reach.
fn decoy_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    std::fs::write(to.join("vendor"), "0xdead\n").unwrap();
}

#[test]
fn config_linked_to_dev_zero_is_refused() {
    let (root, [gpu, nic, _, _]) = small_machine("hostile-zero");
    replace_with_link(&root.join(&gpu).join("config"), "/dev/zero");
    // The same through a relative link that climbs out of the capture.
    let up = "../".repeat(gpu.components().count() + 8);
    replace_with_link(&root.join(&nic).join("config"), format!("{up}dev/zero"));
    let topo = read_hostile(&root);
    assert_warned(&topo, "0000:03:00.0/config", "absolute link to /dev/zero");
    assert_warned(&topo, "0000:04:00.0/config", "leaves the sysfs root");
    assert_rest_is_read(&topo, 8);
    assert_eq!(topo.find("gpu0").unwrap().vendor, Some(0x10de));
}

#[test]
fn a_fifo_attribute_does_not_block() {
    let (root, [gpu, nic, nvme, _]) = small_machine("hostile-fifo");
    for (dir, name) in [(&gpu, "numa_node"), (&nic, "config"), (&nvme, "resource")] {
        let at = root.join(dir).join(name);
        std::fs::remove_file(&at).unwrap();
        mkfifo(&at);
    }
    let topo = read_hostile(&root);
    for what in [
        "0000:03:00.0/numa_node",
        "0000:04:00.0/config",
        "0000:05:00.0/resource",
    ] {
        assert_warned(&topo, what, "not a regular file (a FIFO)");
    }
    assert_rest_is_read(&topo, 8);
    assert_eq!(topo.find("gpu0").unwrap().numa, None);
}

#[test]
fn a_huge_sparse_attribute_is_not_read_whole() {
    let (root, [gpu, nic, _, _]) = small_machine("hostile-sparse");
    for (dir, name) in [(&gpu, "resource"), (&nic, "config")] {
        let f = std::fs::File::create(root.join(dir).join(name)).unwrap();
        f.set_len(1 << 30).unwrap();
    }
    let topo = read_hostile(&root);
    assert_warned(
        &topo,
        "0000:03:00.0/resource",
        &format!("longer than {MAX_ATTR_BYTES} bytes"),
    );
    assert_warned(
        &topo,
        "0000:04:00.0/config",
        &format!("longer than {MAX_CONFIG_BYTES} bytes"),
    );
    assert_rest_is_read(&topo, 8);
    assert!(topo.find("gpu0").unwrap().bars.is_empty());
}

#[test]
fn symlink_loops_are_named_as_loops() {
    let (root, [gpu, _, _, _]) = small_machine("hostile-loop");
    let bus = root.join("bus/pci/devices");
    // a -> b -> a, between two device links.
    symlink("0000:00:08.0", bus.join("0000:00:07.0")).unwrap();
    symlink("0000:00:07.0", bus.join("0000:00:08.0")).unwrap();
    // A link to itself, where a device should be and where an attribute should be.
    symlink("0000:00:09.0", bus.join("0000:00:09.0")).unwrap();
    replace_with_link(&root.join(&gpu).join("local_cpulist"), "local_cpulist");
    // A directory loop that never ends in a link to itself: x -> x/x.
    std::fs::create_dir_all(root.join("class/net")).unwrap();
    symlink("eth9/x", root.join("class/net/eth9")).unwrap();
    let topo = read_hostile(&root);
    let w = topo.warnings();
    for what in [
        "bus/pci/devices/0000:00:07.0",
        "bus/pci/devices/0000:00:08.0",
        "bus/pci/devices/0000:00:09.0",
        "0000:03:00.0/local_cpulist",
    ] {
        assert_warned(&topo, what, "symlink loop");
    }
    assert_warned(
        &topo,
        "class/net/eth9",
        &format!("more than {MAX_LINK_HOPS} symlinks"),
    );
    assert!(
        !w.iter().any(|w| w.message.contains("dangling")),
        "a loop is no dangling link: {w:?}"
    );
    assert_rest_is_read(&topo, 8);
}

#[test]
fn links_do_not_leave_the_capture() {
    let (root, [gpu, nic, nvme, _]) = small_machine("hostile-escape");
    // Next to the tree, as both are in the system's temporary directory.
    let outside = scratch("hostile-outside");
    // The NVMe drive's directory climbs out of the tree, the NIC's is an absolute link, and the
    // GPU's cpulist is an absolute link to a file: all of them to look-alikes outside.
    decoy_copy(&root.join(&nvme), &outside.join("nvme"));
    decoy_copy(&root.join(&nic), &outside.join("nic"));
    std::fs::write(outside.join("cpulist"), "0-3\n").unwrap();
    let up = "../".repeat(nvme.components().count());
    replace_with_link(
        &root.join(&nvme),
        format!(
            "{up}{}/nvme",
            outside.file_name().unwrap().to_str().unwrap()
        ),
    );
    replace_with_link(&root.join(&nic), outside.join("nic"));
    replace_with_link(
        &root.join(&gpu).join("local_cpulist"),
        outside.join("cpulist"),
    );
    let topo = read_hostile(&root);
    let w = topo.warnings();
    assert_warned(
        &topo,
        "bus/pci/devices/0000:05:00.0",
        "leaves the sysfs root",
    );
    assert_warned(&topo, "bus/pci/devices/0000:04:00.0", "absolute link");
    assert_warned(&topo, "0000:03:00.0/local_cpulist", "absolute link");
    assert!(
        topo.devices().iter().all(|d| d.vendor != Some(0xdead)),
        "read a device outside the capture"
    );
    assert_eq!(topo.find("gpu0").unwrap().cpulist, None);
    assert_eq!(topo.devices().len(), 6, "{w:?}");
}

#[test]
fn a_huge_directory_is_listed_only_in_part() {
    let (root, _) = small_machine("hostile-wide");
    let devices = root.join("devices");
    for i in 0..MAX_DIR_ENTRIES + 100 {
        std::fs::write(devices.join(format!("junk{i}")), "").unwrap();
    }
    let topo = read_hostile(&root);
    assert_warned(
        &topo,
        "devices",
        &format!("more than {MAX_DIR_ENTRIES} entries"),
    );
    assert_rest_is_read(&topo, 8);
}

#[test]
fn a_flood_of_odd_entries_keeps_a_bounded_list_of_warnings() {
    let (root, _) = small_machine("hostile-flood");
    let extra = 50;
    for i in 0..MAX_WARNINGS + extra {
        std::fs::create_dir(root.join(format!("bus/pci/devices/junk{i}"))).unwrap();
    }
    let topo = read_hostile(&root);
    let w = topo.warnings();
    assert_eq!(w.len(), MAX_WARNINGS + 1);
    assert!(w[..MAX_WARNINGS]
        .iter()
        .all(|w| w.message.contains("not a PCI address")));
    assert_eq!(
        w[MAX_WARNINGS].message,
        format!("{extra} more warnings not shown")
    );
    assert_rest_is_read(&topo, 8);
}

/// A capture of a hostile tree records what the reads returned: nothing past the caps.
#[test]
fn capturing_a_hostile_tree_copies_no_more_than_the_caps() {
    let (root, [gpu, nic, nvme, _]) = small_machine("hostile-capture");
    replace_with_link(&root.join(&gpu).join("config"), "/dev/zero");
    let at = root.join(&nic).join("numa_node");
    std::fs::remove_file(&at).unwrap();
    mkfifo(&at);
    std::fs::File::create(root.join(&nvme).join("resource"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let dest = scratch("hostile-capture-dest");
    let (src, dst) = (root.to_path_buf(), dest.to_path_buf());
    let summary = within_time_cap("capturing the tree", move || capture::capture(&src, &dst))
        .expect("capture");
    assert!(
        peak_rss() < PEAK_RSS_CAP,
        "peak memory {} MiB",
        peak_rss() >> 20
    );
    assert!(summary.bytes < 1 << 20, "{} bytes captured", summary.bytes);
    let mut stack: Vec<PathBuf> = vec![dest.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                let cap = if e.file_name() == "config" {
                    MAX_CONFIG_BYTES
                } else {
                    MAX_ATTR_BYTES
                } as u64;
                assert!(
                    meta.len() <= cap,
                    "{}: {} bytes",
                    e.path().display(),
                    meta.len()
                );
            } else {
                assert!(meta.file_type().is_symlink(), "{}", e.path().display());
            }
        }
    }
    assert_eq!(summary.topology.devices().len(), 8);
}
