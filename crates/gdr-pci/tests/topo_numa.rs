//! NUMA affinity as nvidia-smi prints it: `numa_node` when the kernel sets it, otherwise the
//! nodes whose CPUs meet the device's `local_cpulist`, and node 0 on a machine without node
//! directories. VMs (the H100 Firecracker machine) leave `numa_node` at -1 everywhere.

use gdr_pci::capture::capture;
use gdr_pci::fixture::{FixtureFunction, TreeBuilder};
use gdr_pci::Topology;
use rand::seq::SliceRandom;
use rand::Rng;
use std::collections::BTreeSet;

mod topo_common;
use topo_common::{scratch, Scratch};

/// One GPU per entry, each on its own root port of one host bridge: (numa_node, local_cpulist).
fn machine(
    name: &str,
    nodes: Option<&[(u32, String)]>,
    gpus: &[(Option<u32>, Option<String>)],
) -> Scratch {
    let root = scratch(name);
    let mut t = TreeBuilder::create(&root).unwrap();
    for (id, cpus) in nodes.unwrap_or_default() {
        t.numa_node(*id, cpus).unwrap();
    }
    let hb = t.host_bridge("pci0000:00").unwrap();
    for (i, (numa, cpus)) in gpus.iter().enumerate() {
        let mut f = FixtureFunction::new(
            &format!("0000:{:02x}:00.0", i + 1),
            0x10de,
            0x2330,
            0x030200,
        )
        .bar(0, 1 << 24)
        .bar(1, 1 << 34);
        f.numa = *numa;
        f.cpulist = cpus.clone();
        let rp = t
            .add(
                &hb,
                FixtureFunction::new(
                    &format!("0000:00:{:02x}.0", i + 1),
                    0x8086,
                    0x352a,
                    0x060400,
                ),
            )
            .unwrap();
        t.add(&rp, f).unwrap();
    }
    t.finish().unwrap();
    root
}

fn affinities(topo: &Topology) -> Vec<(Vec<u32>, String)> {
    topo.gpus()
        .iter()
        .map(|d| (d.numa_affinity.clone(), d.numa_affinity_text()))
        .collect()
}

fn s(x: &str) -> Option<String> {
    Some(x.to_string())
}

#[test]
fn without_node_directories_the_machine_is_node_0() {
    let root = machine("flat", None, &[(None, s("0-15")), (None, None)]);
    let topo = Topology::read(&root).unwrap();
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    assert_eq!(
        affinities(&topo),
        [(vec![0], "0".into()), (vec![], "N/A".into())]
    );
    assert_eq!(topo.gpus()[0].numa, None);
}

#[test]
fn nodes_follow_the_cpus_when_numa_node_is_unset() {
    let nodes = [(0, "0-7,16-23".to_string()), (1, "8-15,24-31".to_string())];
    let gpus = [
        (None, s("8-15")),   // node 1 only
        (None, s("0-31")),   // both: the kernel's answer for NUMA_NO_NODE
        (None, s("20")),     // node 0 through its second range
        (None, s("40-47")),  // CPUs of no node
        (Some(1), s("0-7")), // numa_node wins over the CPUs
        (Some(0), None),     // numa_node without a cpulist
    ];
    let root = machine("two", Some(&nodes), &gpus);
    let topo = Topology::read(&root).unwrap();
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
    assert_eq!(
        affinities(&topo),
        [
            (vec![1], "1".into()),
            (vec![0, 1], "0-1".into()),
            (vec![0], "0".into()),
            (vec![], "N/A".into()),
            (vec![1], "1".into()),
            (vec![0], "0".into()),
        ]
    );
    // A capture keeps the node lists and reads back the same.
    let dest = scratch("two-capture");
    capture(&root, &dest).unwrap();
    assert_eq!(
        std::fs::read_to_string(dest.join("devices/system/node/node1/cpulist")).unwrap(),
        "8-15,24-31\n"
    );
    assert_eq!(
        affinities(&Topology::read(&dest).unwrap()),
        affinities(&topo)
    );
}

#[test]
fn malformed_cpu_lists_warn_and_leave_the_affinity_unknown() {
    let nodes = [(0, "0-7".to_string()), (1, "15-8".to_string())];
    let root = machine("bad", Some(&nodes), &[(None, s("8-15")), (None, s("0-7"))]);
    let gpu1 = root.join("devices/pci0000:00/0000:00:02.0/0000:02:00.0/local_cpulist");
    std::fs::write(&gpu1, "zero\n").unwrap();
    let topo = Topology::read(&root).unwrap();
    // node1 is unreadable, so the first GPU's CPUs belong to no known node.
    assert_eq!(
        affinities(&topo),
        [(vec![], "N/A".into()), (vec![], "N/A".into())]
    );
    let w: Vec<String> = topo.warnings().iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .any(|w| w.contains("node/node1/cpulist") && w.contains("15-8")),
        "{w:?}"
    );
    assert!(
        w.iter()
            .any(|w| w.contains("0000:02:00.0/local_cpulist") && w.contains("zero")),
        "{w:?}"
    );
}

/// Random CPU-to-node layouts: the derived affinity is exactly the set of nodes that own one of
/// the device's CPUs.
#[test]
fn random_layouts_match_a_naive_count() {
    let mut rng = rand::thread_rng();
    for round in 0..20 {
        let n_cpus = rng.gen_range(2..64u32);
        let n_nodes = rng.gen_range(1..=4u32.min(n_cpus));
        let mut owner: Vec<u32> = (0..n_cpus).map(|c| c % n_nodes).collect();
        owner.shuffle(&mut rng);
        let list = |cpus: &[u32]| {
            cpus.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let nodes: Vec<(u32, String)> = (0..n_nodes)
            .map(|n| {
                let mine: Vec<u32> = (0..n_cpus).filter(|&c| owner[c as usize] == n).collect();
                (n, list(&mine))
            })
            .collect();
        let mut want = Vec::new();
        let gpus: Vec<(Option<u32>, Option<String>)> = (0..3)
            .map(|_| {
                let mut cpus: Vec<u32> = (0..n_cpus).filter(|_| rng.gen_bool(0.2)).collect();
                if cpus.is_empty() {
                    cpus.push(rng.gen_range(0..n_cpus));
                }
                let set: BTreeSet<u32> = cpus.iter().map(|&c| owner[c as usize]).collect();
                want.push(set.into_iter().collect::<Vec<u32>>());
                (None, Some(list(&cpus)))
            })
            .collect();
        let root = machine(&format!("random{round}"), Some(&nodes), &gpus);
        let topo = Topology::read(&root).unwrap();
        assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
        let got: Vec<Vec<u32>> = topo
            .gpus()
            .iter()
            .map(|d| d.numa_affinity.clone())
            .collect();
        assert_eq!(got, want, "nodes {nodes:?}, gpus {gpus:?}");
    }
}
