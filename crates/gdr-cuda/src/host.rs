//! What the host, or the container this process runs in, gives the NVIDIA driver: its device
//! nodes, and the signs of a container. Errors use it to name the fix that applies here: a
//! container's user cannot install driver packages or load kernel modules, but can ask the NVIDIA
//! container toolkit for what is missing.
//!
//! Every question reads files under a root directory and variables of an environment, both given
//! to [`Host::at`], so that tests ask them of a fake `/dev` and fake container markers;
//! [`Host::this`] asks them of this process (`/` and its environment).

use std::collections::HashMap;
use std::path::PathBuf;

/// The nodes the CUDA driver opens besides the GPUs' own (`/dev/nvidiaN`).
const CONTROL_NODES: [&str; 2] = ["/dev/nvidiactl", "/dev/nvidia-uvm"];

/// How [`Host::missing_nodes`] names the absence of every GPU node.
pub const ANY_GPU_NODE: &str = "/dev/nvidiaN";

/// A root directory and an environment to inspect ([`Host::this`] for this process's).
pub struct Host {
    root: PathBuf,
    env: HashMap<String, String>,
}

impl Host {
    /// This process's: `/` and its environment.
    pub fn this() -> Host {
        Host {
            root: PathBuf::from("/"),
            env: std::env::vars().collect(),
        }
    }

    /// The files under `root` (standing for `/`) and the variables `env`.
    pub fn at<K: Into<String>, V: Into<String>>(
        root: impl Into<PathBuf>,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Host {
        Host {
            root: root.into(),
            env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }

    fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    fn exists(&self, abs: &str) -> bool {
        // symlink_metadata: a node bound in as a dangling link still counts as there.
        std::fs::symlink_metadata(self.path(abs)).is_ok()
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Why this looks like a container (`/.dockerenv exists`, say), or `None` where nothing
    /// says so. The signs, first found wins: the `container` variable (podman, systemd-nspawn),
    /// `KUBERNETES_SERVICE_HOST` (every Kubernetes pod), `/.dockerenv` (docker),
    /// `/run/.containerenv` (podman), a container manager named in `/proc/1/cgroup` (cgroup
    /// v1), and a root file system on an overlay of a container store (`/proc/self/mountinfo`,
    /// which cgroup v2 leaves as the one sign).
    pub fn container(&self) -> Option<String> {
        if let Some(v) = self.var("container") {
            return Some(format!("container={v}"));
        }
        if self.var("KUBERNETES_SERVICE_HOST").is_some() {
            return Some("KUBERNETES_SERVICE_HOST is set".into());
        }
        for marker in ["/.dockerenv", "/run/.containerenv"] {
            if self.exists(marker) {
                return Some(format!("{marker} exists"));
            }
        }
        const MANAGERS: [&str; 6] = ["kubepods", "docker", "containerd", "libpod", "crio", "lxc"];
        if let Ok(cg) = std::fs::read_to_string(self.path("/proc/1/cgroup")) {
            if let Some(m) = MANAGERS.iter().find(|m| cg.contains(*m)) {
                return Some(format!("/proc/1/cgroup names {m}"));
            }
        }
        const STORES: [&str; 4] = ["docker", "containerd", "containers/storage", "kubelet"];
        let mountinfo = std::fs::read_to_string(self.path("/proc/self/mountinfo")).ok()?;
        mountinfo.lines().find_map(|l| {
            // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE SUPEROPTIONS`
            let (mount, fs) = l.split_once(" - ")?;
            let on_root = mount.split(' ').nth(4) == Some("/");
            let overlay = fs.starts_with("overlay ") || fs.starts_with("fuse-overlayfs ");
            let store = STORES.iter().find(|s| fs.contains(*s))?;
            (on_root && overlay).then(|| format!("the root file system is a {store} overlay"))
        })
    }

    /// The device nodes the CUDA driver needs that this `/dev` lacks: `/dev/nvidiactl`,
    /// `/dev/nvidia-uvm`, and [`ANY_GPU_NODE`] when there is no `/dev/nvidia<N>` at all. Empty
    /// under WSL (`/dev/dxg`), where the driver uses none of them.
    pub fn missing_nodes(&self) -> Vec<String> {
        if self.exists("/dev/dxg") {
            return Vec::new();
        }
        let mut out: Vec<String> = CONTROL_NODES
            .iter()
            .filter(|n| !self.exists(n))
            .map(|n| n.to_string())
            .collect();
        let gpu_node = std::fs::read_dir(self.path("/dev")).is_ok_and(|d| {
            d.flatten().any(|e| {
                let name = e.file_name();
                let n = name.to_string_lossy();
                n.strip_prefix("nvidia")
                    .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            })
        });
        if !gpu_node {
            out.push(ANY_GPU_NODE.into());
        }
        out
    }

    /// What to do about `missing` (nodes from [`Host::missing_nodes`], not empty) here: in a
    /// container, start it with the NVIDIA container toolkit or pass the nodes in; on a host,
    /// load the kernel module that makes them.
    pub fn node_fix(&self, missing: &[String]) -> String {
        let list = missing.join(", ");
        let verb = if missing.len() == 1 { "is" } else { "are" };
        if let Some(why) = self.container() {
            let devices: Vec<String> = missing
                .iter()
                .map(|n| format!("--device {}", n.replace(ANY_GPU_NODE, "/dev/nvidia0")))
                .collect();
            let them = if missing.len() == 1 { "it" } else { "them" };
            return format!(
                "{list} {verb} missing: this container ({why}) was started without {them}; start \
                 it through the NVIDIA container toolkit (docker run --gpus all, podman run \
                 --device nvidia.com/gpu=all, or a Kubernetes nvidia.com/gpu resource limit), or \
                 pass {them} in ({})",
                devices.join(" ")
            );
        }
        let uvm_only = missing.iter().all(|n| n == "/dev/nvidia-uvm");
        let fix = if uvm_only {
            "load the nvidia-uvm kernel module (`sudo modprobe nvidia-uvm`; `sudo nvidia-modprobe \
             -u -c 0` also makes the node)"
        } else {
            "load the NVIDIA kernel driver (`sudo modprobe nvidia nvidia-uvm`; `sudo \
             nvidia-modprobe -u -c 0` also makes the nodes)"
        };
        format!("{list} {verb} missing: {fix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn root_with(files: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in files {
            let p = d.path().join(f.trim_start_matches('/'));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, "").unwrap();
        }
        d
    }

    const NO_ENV: [(&str, &str); 0] = [];

    #[test]
    fn each_container_sign_is_named() {
        let bare = root_with(&["/dev/null"]);
        assert_eq!(Host::at(bare.path(), NO_ENV).container(), None);
        let h = Host::at(bare.path(), [("container", "podman")]);
        assert_eq!(h.container().as_deref(), Some("container=podman"));
        let h = Host::at(bare.path(), [("KUBERNETES_SERVICE_HOST", "10.0.0.1")]);
        assert_eq!(
            h.container().as_deref(),
            Some("KUBERNETES_SERVICE_HOST is set")
        );
        // An empty variable is no sign.
        assert_eq!(Host::at(bare.path(), [("container", "")]).container(), None);
        for marker in ["/.dockerenv", "/run/.containerenv"] {
            let d = root_with(&[marker]);
            let want = format!("{marker} exists");
            assert_eq!(Host::at(d.path(), NO_ENV).container(), Some(want));
        }
    }

    #[test]
    fn cgroup_and_mountinfo_signs() {
        let d = root_with(&[]);
        fs::create_dir_all(d.path().join("proc/1")).unwrap();
        fs::write(d.path().join("proc/1/cgroup"), "0::/\n").unwrap();
        fs::create_dir_all(d.path().join("proc/self")).unwrap();
        let host_root = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        fs::write(d.path().join("proc/self/mountinfo"), host_root).unwrap();
        assert_eq!(Host::at(d.path(), NO_ENV).container(), None);
        let overlay = "600 500 0:50 / / rw,relatime master:1 - overlay overlay rw,lowerdir=\
                       /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/1/fs\n";
        fs::write(d.path().join("proc/self/mountinfo"), overlay).unwrap();
        assert_eq!(
            Host::at(d.path(), NO_ENV).container().as_deref(),
            Some("the root file system is a containerd overlay")
        );
        fs::write(
            d.path().join("proc/1/cgroup"),
            "12:pids:/kubepods/burstable/pod1\n",
        )
        .unwrap();
        assert_eq!(
            Host::at(d.path(), NO_ENV).container().as_deref(),
            Some("/proc/1/cgroup names kubepods")
        );
    }

    #[test]
    fn missing_nodes_are_named() {
        let full = root_with(&["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3"]);
        assert!(Host::at(full.path(), NO_ENV).missing_nodes().is_empty());
        let no_uvm = root_with(&["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm-tools"]);
        assert_eq!(
            Host::at(no_uvm.path(), NO_ENV).missing_nodes(),
            ["/dev/nvidia-uvm"]
        );
        // nvidia-modeset and nvidia-caps are not GPU nodes.
        let none = root_with(&["/dev/nvidia-modeset", "/dev/nvidia-caps/nvidia-cap1"]);
        assert_eq!(
            Host::at(none.path(), NO_ENV).missing_nodes(),
            ["/dev/nvidiactl", "/dev/nvidia-uvm", ANY_GPU_NODE]
        );
        let wsl = root_with(&["/dev/dxg"]);
        assert!(Host::at(wsl.path(), NO_ENV).missing_nodes().is_empty());
    }

    #[test]
    fn the_fix_for_missing_nodes_depends_on_where_we_are() {
        let d = root_with(&["/.dockerenv", "/dev/nvidiactl", "/dev/nvidia0"]);
        let h = Host::at(d.path(), NO_ENV);
        let missing = h.missing_nodes();
        assert_eq!(missing, ["/dev/nvidia-uvm"]);
        let fix = h.node_fix(&missing);
        assert!(fix.starts_with("/dev/nvidia-uvm is missing: this container (/.dockerenv exists) was started without it"), "{fix}");
        assert!(
            fix.contains("--gpus all") && fix.contains("nvidia.com/gpu"),
            "{fix}"
        );
        assert!(fix.ends_with("(--device /dev/nvidia-uvm)"), "{fix}");

        let d = root_with(&["/dev/null"]);
        let h = Host::at(d.path(), NO_ENV);
        let uvm = h.node_fix(&["/dev/nvidia-uvm".to_string()]);
        assert!(uvm.contains("sudo modprobe nvidia-uvm") && !uvm.contains("container"));
        let all = h.node_fix(&h.missing_nodes());
        assert!(
            all.starts_with("/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidiaN are missing: load the NVIDIA kernel driver"),
            "{all}"
        );
        let in_pod = Host::at(d.path(), [("KUBERNETES_SERVICE_HOST", "x")]);
        let pod = in_pod.node_fix(&in_pod.missing_nodes());
        assert!(pod.contains("--device /dev/nvidia0"), "{pod}");
    }

    #[test]
    fn a_failed_cuinit_names_the_missing_node_and_the_fix() {
        let init = crate::CudaError::Driver {
            call: "cuInit",
            code: 999,
            name: "CUDA_ERROR_UNKNOWN".into(),
            text: "unknown error".into(),
        };
        let d = root_with(&["/run/.containerenv", "/dev/nvidiactl", "/dev/nvidia0"]);
        let e = crate::explain_init(init.clone(), &Host::at(d.path(), NO_ENV));
        assert_eq!(
            e.to_string(),
            "cuInit failed: CUDA_ERROR_UNKNOWN (999): unknown error; /dev/nvidia-uvm is missing: \
             this container (/run/.containerenv exists) was started without it; start it through \
             the NVIDIA container toolkit (docker run --gpus all, podman run --device \
             nvidia.com/gpu=all, or a Kubernetes nvidia.com/gpu resource limit), or pass it in \
             (--device /dev/nvidia-uvm)"
        );
        assert!(
            matches!(&e, crate::CudaError::MissingNodes { nodes, .. } if nodes == &["/dev/nvidia-uvm"])
        );
        // Every node there: cuInit's error as it was.
        fs::write(d.path().join("dev/nvidia-uvm"), "").unwrap();
        let e = crate::explain_init(init, &Host::at(d.path(), NO_ENV));
        assert!(
            matches!(e, crate::CudaError::Driver { code: 999, .. }),
            "{e}"
        );
    }
}
