//! Real nodes: a real kubelet and containerd (Debian's, with runc and the CNI plugins) beside
//! the kwok nodes, each node a small machine of its own on this host:
//!
//! - a network namespace and address on the cluster's bridge (`net`),
//! - a cgroup tree holding every process it runs, containers included (`cgroup`),
//! - a mount namespace of its own, where `/proc/sys/kernel/random/boot_id` is a file of the
//!   node (a new one per boot, which the kubelet reports as `status.nodeInfo.bootID`), the
//!   machine has an identity of its own (its SMBIOS UUID, which its kubelet reports as
//!   `status.nodeInfo.systemUUID` and its BMC's Redfish system as its `UUID`: `files::
//!   write_identity`), and the
//!   host-wide sysctls the kubelet sets are node-private copies (`files::KUBELET_SYSCTLS`),
//!   and [`MACHINE_DIR`] shows what the machine has outside its operating system (its BMC),
//! - its files under `DIR/nodes/<node>/`: containerd root and state, the CNI network, the
//!   kubelet's root directory, configuration, kubeconfig and client certificate
//!   (`system:node:<node>`, so the Node authorizer and NodeRestriction apply), `boot.sh`.
//!
//! The node images (the pause image from `podha-pause`, podha-csi's from `podha-csi`, built by
//! Docker in `make node-images`) are checked and copied into `DIR/images/` (`images`) and
//! imported into every node's containerd at boot. podha-csi's node plugin runs on every real
//! node as a DaemonSet (`csi`).
//!
//! Faults: `kill` freezes and SIGKILLs the whole cgroup tree (containerd, shims, containers,
//! kubelet) and takes the node's veth down; `freeze` freezes the tree (a hung machine);
//! `partition` drops the node's packets to the host side (the API server) while its containers
//! run on. `boot` after a kill is a reboot: new boot ID, runtime state wiped, mounts gone with
//! the old mount namespace.

pub mod cgroup;
mod cluster_ops;
pub mod csi;
pub mod files;
pub mod images;
pub mod net;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Error, Result};
use cgroup::NodeCgroup;

/// The sandbox image every real node's containerd uses, built from `podha-pause` (`images`).
pub const PAUSE_IMAGE: &str = "podha.io/sim/pause:1";
/// The kubelet's port on the node's address.
pub const KUBELET_PORT: u16 = 10250;
/// Where a real node shows its pods (hostPath) what a machine has outside its operating system:
/// `bmc/watchdog` and `bmc/power`, its BMC's watchdog and power control (`super::bmc`),
/// `boot_id`, the node's boot ID (a container's /proc shows the host's), and `cgroup`, the
/// node's cgroup v2 tree (`kubepods/besteffort/...`, as a cgroup v2 machine's
/// `/sys/fs/cgroup` with the kubelet's cgroupfs driver). The podha agent's DaemonSet mounts it
/// (`crate::chart_install::sim_agent_values`).
pub const MACHINE_DIR: &str = "/run/podha-sim-machine";

/// Commands a real node runs from the host's PATH (Debian packages, `make node-deps`).
const HOST_COMMANDS: [&str; 7] = [
    "containerd",
    "ctr",
    "runc",
    "nsenter",
    "unshare",
    "ip",
    "iptables",
];
const CNI_PLUGINS: [&str; 3] = ["bridge", "host-local", "loopback"];

/// One real node of a cluster, with every name and path derived from the cluster.
#[derive(Debug, Clone)]
pub struct RealNode {
    pub name: String,
    pub index: u8,
    pub ip: Ipv4Addr,
    cluster_dir: PathBuf,
    cluster_id: String,
    logs_dir: PathBuf,
}

impl RealNode {
    pub fn new(cluster_dir: &Path, name: &str, index: u8, ip: Ipv4Addr) -> Self {
        RealNode {
            name: name.to_string(),
            index,
            ip,
            cluster_dir: cluster_dir.to_path_buf(),
            cluster_id: cluster_id(cluster_dir),
            logs_dir: cluster_dir.join("logs"),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.cluster_dir.join("nodes").join(&self.name)
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    pub fn netns(&self) -> String {
        format!("podha-sim-{}-{}", self.cluster_id, self.name)
    }

    /// Host end of the node's veth; interface names have at most 15 bytes.
    pub fn veth(&self) -> String {
        format!("{}n{}", bridge_name(&self.cluster_dir), self.index)
    }

    pub fn cgroup(&self) -> NodeCgroup {
        NodeCgroup::new(format!("podha-sim-{}-{}", self.cluster_id, self.name))
    }

    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }
}

/// 16 hex digits naming the cluster in host-wide names (namespaces, cgroups, iptables tags).
pub fn cluster_id(dir: &Path) -> String {
    super::blackhole::tag(dir)
        .trim_start_matches("podha-sim:")
        .to_string()
}

pub fn bridge_name(dir: &Path) -> String {
    format!("phs{}", &cluster_id(dir)[..8])
}

/// `$PODHA_NODE_BIN_DIR`, else `${PODHA_CACHE:-$HOME/.cache/podha}/node-k8s-<K8S>/bin`, where
/// `make node-deps` builds the kubelet.
pub fn default_node_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PODHA_NODE_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    super::bins::cache_dir()
        .join(format!("node-k8s-{}", super::k8s_version()))
        .join("bin")
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(cmd).is_file()))
}

/// Everything a real node needs on the host, or an error naming what is missing and how to get it.
pub fn check_host(node_bin_dir: &Path, node_images_dir: &Path) -> Result<()> {
    let mut missing: Vec<String> = HOST_COMMANDS
        .iter()
        .filter(|c| !on_path(c))
        .map(|c| c.to_string())
        .collect();
    missing.extend(
        CNI_PLUGINS
            .iter()
            .filter(|p| !Path::new("/usr/lib/cni").join(p).is_file())
            .map(|p| format!("/usr/lib/cni/{p}")),
    );
    for bin in ["kubelet", "kube-proxy"] {
        let path = node_bin_dir.join(bin);
        if !path.is_file() {
            missing.push(path.display().to_string());
        }
    }
    if !missing.is_empty() {
        return Err(Error::Other(format!(
            "real nodes need {} (missing): run `make node-deps`",
            missing.join(", ")
        )));
    }
    images::check(node_images_dir)
}

/// The cluster-wide part: the bridge, and the DNAT to each of the host's loopback `ports` the
/// nodes reach (the API server's, the Redfish service's).
pub fn create_host_network(dir: &Path, subnet: u8, ports: &[u16]) -> Result<()> {
    net::create_bridge(
        &bridge_name(dir),
        subnet,
        ports,
        &super::blackhole::tag(dir),
    )
}

/// Everything a node needs before its first boot: files, its machine's identity (SMBIOS UUID
/// `system_uuid`), client certificate, network namespace, cgroups.
pub fn prepare(
    node: &RealNode,
    real: &super::state::RealNodes,
    apiserver_port: u16,
    system_uuid: &str,
) -> Result<()> {
    let subnet = real.subnet;
    let pki = super::pki::Pki::paths(&node.cluster_dir);
    files::write_all(
        node,
        &pki.ca_cert,
        (net::host_ip(subnet), apiserver_port),
        real,
    )?;
    files::write_identity(node, system_uuid)?;
    super::pki::issue_client_cert(
        &node.cluster_dir,
        &format!("system:node:{}", node.name),
        "system:nodes",
        &node.dir().join("pki/node.crt"),
        &node.dir().join("pki/node.key"),
    )?;
    // The user the default ClusterRoleBinding `system:node-proxier` names.
    super::pki::issue_client_cert(
        &node.cluster_dir,
        "system:kube-proxy",
        "system:node-proxier",
        &node.dir().join("pki/kube-proxy.crt"),
        &node.dir().join("pki/kube-proxy.key"),
    )?;
    net::create_node(
        &node.netns(),
        &node.veth(),
        &bridge_name(&node.cluster_dir),
        subnet,
        node.ip,
    )?;
    node.cgroup().create()
}

/// Every node's pods reachable from every other node (a pod reaches another node's pods, and
/// a Service's pods wherever they run).
pub fn route_pods_between(nodes: &[RealNode]) -> Result<()> {
    for from in nodes {
        for to in nodes.iter().filter(|to| to.name != from.name) {
            net::add_pod_route(&from.netns(), &to.pod_cidr(), to.ip)?;
        }
    }
    Ok(())
}

/// The command that boots the node (run it detached, see `process::spawn`), after giving the
/// node a new boot ID (returned) and bringing its link up.
pub fn boot_command(node: &RealNode) -> Result<(Command, String)> {
    let boot_id = super::pki::random_uuid()?;
    let path = node.dir().join("boot_id");
    std::fs::write(&path, format!("{boot_id}\n"))
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    net::set_link(&node.veth(), true)?;
    let mut cmd = Command::new("/bin/sh");
    cmd.arg(node.dir().join("boot.sh"));
    Ok((cmd, boot_id))
}

/// The machine dies: every process of the node SIGKILLed, its address silent.
pub fn kill(node: &RealNode) -> Result<()> {
    net::set_link(&node.veth(), false)?;
    node.cgroup().kill_all()
}

/// Removes the node from the host: processes, cgroups, namespace, veth.
pub fn remove(node: &RealNode) -> Result<()> {
    node.cgroup().remove()?;
    net::delete_node(&node.netns(), &node.veth())
}

/// Removes the cluster-wide part (after every node is removed).
pub fn remove_host_network(dir: &Path) -> Result<()> {
    net::delete_bridge(&bridge_name(dir), &super::blackhole::tag(dir))
}
