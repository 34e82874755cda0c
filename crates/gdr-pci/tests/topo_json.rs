//! The JSON shape of `gdr topo --json`, checked on every fixture by parsing it back.

use gdr_pci::{Bdf, Topology};
use serde_json::Value;

mod topo_common;
use topo_common::path_between;

const CLASSES: &[&str] = &[
    "gpu",
    "nic",
    "rdma-nic",
    "nvme",
    "accelerator",
    "bridge",
    "other",
];
const VERDICTS: &[&str] = &["good", "works-slower", "poor-or-unsupported"];

fn is_path_class(s: &str) -> bool {
    matches!(s, "X" | "PIX" | "PXB" | "PHB" | "NODE" | "SYS")
        || s.strip_prefix("NV")
            .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0))
}

fn check_device(d: &Value) {
    let bdf = d["bdf"].as_str().expect("bdf string");
    bdf.parse::<Bdf>().expect("bdf parses");
    assert!(CLASSES.contains(&d["class"].as_str().unwrap()), "{d}");
    assert!(d["numa"].is_null() || d["numa"].is_u64(), "{d}");
    let affinity = d["numa_affinity"].as_array().expect("numa_affinity array");
    assert!(affinity.iter().all(Value::is_u64), "{d}");
    if let Some(n) = d["numa"].as_u64() {
        assert_eq!(affinity, &[Value::from(n)], "{d}");
    }
    assert!(
        d["gpu_numa_id"].is_null() || d["gpu_numa_id"].is_u64(),
        "{d}"
    );
    let link = d["link"].as_object().expect("link object");
    for k in [
        "current_speed_gts",
        "current_width",
        "max_speed_gts",
        "max_width",
    ] {
        assert!(link[k].is_null() || link[k].is_number(), "{k} in {d}");
    }
    assert!(d["names"].is_array() && d["bars"].is_array(), "{d}");
    assert!(d["acs"]["state"].is_string(), "{d}");
}

#[test]
fn json_has_the_documented_shape_on_every_fixture() {
    let dir = topo_common::fixtures_dir();
    for entry in std::fs::read_dir(dir).unwrap() {
        let root = entry.unwrap().path();
        let mut topo = Topology::read(&root).unwrap();
        let gpus: Vec<Bdf> = topo.gpus().iter().map(|d| d.bdf).collect();
        if gpus.len() >= 2 {
            topo.set_nvlinks(&[(gpus[0], gpus[1], 4)]).unwrap();
        }
        for all in [false, true] {
            let shown = if all {
                topo.endpoints()
            } else {
                topo.gpu_view()
            };
            let report = if all {
                topo.report(&shown)
            } else {
                topo.gpu_report(&shown)
            };
            let text = serde_json::to_string(&report).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            let devices = v["devices"].as_array().expect("devices array");
            assert_eq!(devices.len(), shown.len());
            devices.iter().for_each(check_device);
            v["bridges"]
                .as_array()
                .unwrap()
                .iter()
                .for_each(check_device);
            let pairs = v["pairs"].as_array().expect("pairs array");
            // --all: every pair; the GPU view: the pairs with a GPU on one side (every pair
            // where there is no GPU).
            let n = devices.len();
            let every = n * n.saturating_sub(1) / 2;
            let m = n - gpus.len();
            let asked = if all || gpus.is_empty() {
                every
            } else {
                every - m * m.saturating_sub(1) / 2
            };
            assert_eq!(pairs.len(), asked, "{root:?}");
            assert_eq!(v["pairs_left_out"], 0);
            let bdfs: Vec<&str> = devices.iter().map(|d| d["bdf"].as_str().unwrap()).collect();
            for p in pairs {
                assert!(
                    bdfs.contains(&p["a"].as_str().unwrap())
                        && bdfs.contains(&p["b"].as_str().unwrap())
                );
                assert!(is_path_class(p["path"].as_str().unwrap()), "{p}");
                assert!(VERDICTS.contains(&p["verdict"].as_str().unwrap()), "{p}");
                let reasons = p["reasons"].as_array().expect("reasons array");
                assert!(
                    !reasons.is_empty() && reasons.iter().all(Value::is_string),
                    "{p}"
                );
                assert_eq!(reasons.len(), p["findings"].as_array().unwrap().len());
            }
            if gpus.len() >= 2 {
                let nv = pairs
                    .iter()
                    .find(|p| p["a"] == gpus[0].to_string() && p["b"] == gpus[1].to_string());
                assert_eq!(nv.unwrap()["path"], "NV4");
            }
            assert!(v["warnings"].is_array());
        }
    }
}

#[test]
fn explained_path_serializes_with_hops() {
    let root = topo_common::fixtures_dir().join("two-socket");
    let topo = Topology::read(root).unwrap();
    let p = path_between(&topo, "gpu1", "gpu3");
    let v: Value = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(v["class"], "SYS");
    assert_eq!(v["verdict"], "poor-or-unsupported");
    let kinds: Vec<&str> = v["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "host-bridge").count(), 2);
    assert_eq!(
        kinds.iter().filter(|k| **k == "cpu-interconnect").count(),
        1
    );
    assert_eq!(kinds.first(), Some(&"device"));
}
