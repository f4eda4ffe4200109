//! The files a real node boots from, all under `DIR/nodes/<node>/`: containerd's config, the
//! CNI network, the kubelet's and kube-proxy's configuration and kubeconfigs, and `boot.sh`,
//! the node's "init".

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::csi::{CSI_ACKS, CSI_STORE, KUBELET_ROOT, shared_acks, shared_store};
use super::{PAUSE_IMAGE, RealNode, images::cluster_images_dir};
use crate::cluster::{Error, Result};

/// Host-wide sysctls the kubelet sets at start when they differ from what it wants
/// (`protectKernelDefaults: false`; with `true` it refuses to start instead). `boot.sh` bind-mounts
/// a node-private copy over each, so the kubelet writes its copy and the host keeps its values
/// (`kernel.panic_on_oops=1` on a shared machine would be a bad surprise).
pub const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

pub fn containerd_config(node: &RealNode) -> String {
    let dir = node.dir();
    let dir = dir.display();
    let sock = node.containerd_socket();
    let sock = sock.display();
    format!(
        r#"# containerd of real node {name}, written by podha-sim.
version = 2
root = "{dir}/containerd/root"
state = "{dir}/containerd/state"
oom_score = 0

[grpc]
  address = "{sock}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The CRI plugin writes -998 as the sandbox's oom_score_adj; without CAP_SYS_RESOURCE (CI VMs)
  # runc cannot lower the score and the sandbox fails. Clamp every score to containerd's own.
  restrict_oom_score_adj = true
  # Pod network namespaces under the node's state directory, not the host's /var/run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{dir}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{dir}/containerd/state/runc"
"#,
        name = node.name,
    )
}

/// A bridge `cni0` inside the node's namespace, pod addresses from `10.244.<k>.0/24` (kept
/// by host-local in the node's directory). containerd adds the loopback network itself.
/// Traffic leaving the pod network is masqueraded to the node's address, so that a pod reaches
/// the host and other nodes (podha probes their kubelet port); other nodes' pods are reached
/// through their node (`route_pods_between`).
pub fn cni_config(node: &RealNode) -> serde_json::Value {
    json!({
        "cniVersion": "0.4.0",
        "name": "podha-sim",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": node.pod_cidr() }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": node.dir().join("cni-ipam"),
            },
        }],
    })
}

/// `status_update`: the kubelet's `nodeStatusUpdateFrequency` (`None`: its default, 10 s). A
/// kubelet starts on a new pod's attachable volume only once it has reported the volume in the
/// Node's `status.volumesInUse`, which it does on this cycle; until then it skips the volume.
/// On a failover that is most of the time from "volume attached" to "replacement Running"
/// (docs/benchmarks.md).
pub fn kubelet_config(
    node: &RealNode,
    ca_cert: &Path,
    status_update: Option<Duration>,
) -> serde_json::Value {
    let dir = node.dir();
    let mut config = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip.to_string(),
        "port": super::KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "containerRuntimeEndpoint": format!("unix://{}", node.containerd_socket().display()),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup().root(),
        "failCgroupV1": false,
        "failSwapOn": false,
        // The kubelet's default -999 is refused without CAP_SYS_RESOURCE, as for the sandboxes.
        "oomScoreAdj": 0,
        "protectKernelDefaults": false,
        "podLogsDir": dir.join("pod-logs"),
        "nodeLeaseDurationSeconds": crate::cluster::NODE_LEASE_DURATION_SECONDS,
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": false },
            "x509": { "clientCAFile": ca_cert },
        },
        "authorization": { "mode": "AlwaysAllow" },
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": false,
        // A shared test machine's disk and memory are not the node's: never evict or collect.
        // Absolute floors, not percentages: 1% of a large host disk is gigabytes, and a disk
        // that full is the machine's business, not a reason for a sim node's disk pressure.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1Mi",
            "imagefs.available": "1Mi",
            "nodefs.inodesFree": "1",
            "imagefs.inodesFree": "1",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    });
    if let Some(every) = status_update {
        config["nodeStatusUpdateFrequency"] = json!(humantime::format_duration(every).to_string());
    }
    config
}

/// kube-proxy in iptables mode, inside the node's network namespace: it makes Service
/// ClusterIPs (the `kubernetes` Service above all, which in-cluster clients use) reach their
/// endpoints from the node and its pods. It leaves host-wide settings alone: no conntrack table
/// size or timeouts (`0` keeps the kernel's), no localhost NodePorts (no `route_localnet` on
/// all interfaces), no OOM score (refused without CAP_SYS_RESOURCE, as for the kubelet).
/// `masqueradeAll`: service traffic leaves the node from its address, since the host has no
/// route back to the pod network.
pub fn kube_proxy_config(node: &RealNode) -> serde_json::Value {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": { "kubeconfig": node.dir().join("kube-proxy.kubeconfig") },
        "hostnameOverride": node.name,
        "bindAddress": node.ip.to_string(),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": node.pod_cidr(),
        // NodePorts on the node's address only, not on every local address (cni0's too).
        "nodePortAddresses": ["primary"],
        "oomScoreAdj": 0,
        "iptables": { "masqueradeAll": true, "localhostNodePorts": false },
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    })
}

/// A kubeconfig for a node's component: the API server through the bridge (see `net`), TLS
/// checked as `localhost` (a name in the serving certificate), a client certificate of the
/// node's directory (`pki/<cert>.crt` and `.key`).
pub fn kubeconfig(node: &RealNode, ca_cert: &Path, server: (Ipv4Addr, u16), cert: &str) -> String {
    let dir = node.dir();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "podha-sim",
            "cluster": {
                "server": format!("https://{}:{}", server.0, server.1),
                "certificate-authority": ca_cert,
                "tls-server-name": "localhost",
            },
        }],
        "users": [{ "name": cert, "user": {
            "client-certificate": dir.join(format!("pki/{cert}.crt")),
            "client-key": dir.join(format!("pki/{cert}.key")),
        }}],
        "contexts": [{ "name": "node", "context": { "cluster": "podha-sim", "user": cert } }],
        "current-context": "node",
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// `boot.sh`: joins the node's cgroup, enters a mount namespace of its own and the node's
/// network namespace (never `ip netns exec`: it remounts /sys and hides /sys/fs/cgroup), gives
/// the node its boot ID and private sysctls, wipes the runtime state (a reboot empties /run),
/// starts containerd (log `logs/containerd-<node>.log`), imports the pause image, starts
/// kube-proxy (log `logs/kube-proxy-<node>.log`) and runs the kubelet, restarting it when it
/// exits as systemd would (its output goes where the script's does, `logs/kubelet-<node>.log`).
pub fn boot_script(node: &RealNode, cgroup_procs: &[std::path::PathBuf], bin_dir: &Path) -> String {
    let dir = node.dir();
    let d = dir.display();
    let sock = node.containerd_socket();
    let sock = sock.display();
    let logs = node.logs_dir.display();
    let name = &node.name;
    let procs: Vec<String> = cgroup_procs
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let sysctls: Vec<String> = KUBELET_SYSCTLS
        .iter()
        .map(|s| {
            format!(
                "mount --bind {d}/sysctl/{} /proc/sys/{s}",
                s.replace('/', ".")
            )
        })
        .collect();
    format!(
        r#"#!/bin/sh
# Boots real node {name} of a podha-sim cluster (written by podha-sim; see cluster/realnode).
set -eu
if [ "${{1:-}}" != inside ]; then
  for f in {procs}; do echo $$ > "$f"; done
  exec unshare --mount --propagation private -- nsenter --net=/run/netns/{netns} -- /bin/sh -eu "$0" inside
fi
mount --bind {d}/boot_id /proc/sys/kernel/random/boot_id
# The machine's identity (see write_identity): its own machine ID, and its own SMBIOS UUID where
# the host has one. The kubelet reports the UUID as status.nodeInfo.systemUUID, and on a host
# without DMI the machine ID in its place.
mount --bind {d}/machine-id /etc/machine-id
if [ -e /sys/class/dmi/id/product_uuid ]; then
  mount --bind {d}/product_uuid /sys/class/dmi/id/product_uuid
fi
{sysctls}
rm -rf {d}/containerd/state
mkdir -p {d}/containerd/state/run {d}/kubelet {d}/pod-logs {d}/container-logs {d}/cni-cache
# Host paths containerd, CNI and the kubelet hard-code, made node-private (and emptied at boot
# where a machine's would be): shim sockets, CNI results, container log links.
mkdir -p /run/containerd /var/lib/cni /var/log/containers
mount --bind {d}/containerd/state/run /run/containerd
mount --bind {d}/cni-cache /var/lib/cni
mount --bind {d}/container-logs /var/log/containers
# The kubelet's root directory where CSI node plugins expect it, shared so that the mounts a
# plugin container makes there (Bidirectional propagation) reach the kubelet and the pods; and
# the storage every node reaches (podha-csi's store, and its writers' acknowledgements).
mkdir -p {kubelet_root} {csi_store} {csi_acks}
mount --bind {d}/kubelet {kubelet_root}
mount --make-shared {kubelet_root}
mount --bind {store} {csi_store}
mount --bind {acks} {csi_acks}
# What the machine has outside its operating system, where its pods find it: the BMC's FIFOs
# and the boot ID.
mkdir -p {machine}/bmc {d}/bmc
touch {machine}/boot_id
mount --bind {d}/bmc {machine}/bmc
mount --bind {d}/boot_id {machine}/boot_id
# The node's own cgroup v2 tree, as a machine's /sys/fs/cgroup: a fence that kills the pods'
# cgroup (cgroup.kill) reaches this node's containers and nothing of the host's.
mkdir -p {machine}/cgroup
mount --bind {unified} {machine}/cgroup
echo "boot $(cat /proc/sys/kernel/random/boot_id): starting containerd"
containerd --config {d}/containerd.toml >> {logs}/containerd-{name}.log 2>&1 &
i=0
until ctr -a {sock} version > /dev/null 2>&1; do
  i=$((i + 1))
  if [ $i -gt 300 ]; then echo "containerd did not answer in 30 s, see {logs}/containerd-{name}.log"; exit 1; fi
  sleep 0.1
done
for image in {images}/*.tar; do ctr -a {sock} -n k8s.io images import "$image"; done
echo "starting kube-proxy and the kubelet"
{kube_proxy} --config={d}/kube-proxy.json --v=2 >> {logs}/kube-proxy-{name}.log 2>&1 &
# The kubelet is restarted whenever it exits, as systemd's kubelet.service does (Restart=always):
# kubelet v1.34.4 sometimes dies as it starts ("fatal error: concurrent map read and map write"
# in hardEvictionReservation: its DRA plugin manager's first read of the node races the
# container manager's start).
while :; do
  {kubelet} --config={d}/kubelet.json --kubeconfig={d}/kubeconfig \
    --root-dir={kubelet_root} --cert-dir={d}/kubelet/pki \
    --hostname-override={name} --node-ip={ip} --node-labels=type=real \
    --v=2 || echo "kubelet exited with status $?; restarting it in 1 s"
  sleep 1
done
"#,
        procs = procs.join(" "),
        netns = node.netns(),
        sysctls = sysctls.join("\n"),
        images = cluster_images_dir(&node.cluster_dir).display(),
        kubelet_root = KUBELET_ROOT,
        csi_store = CSI_STORE,
        csi_acks = CSI_ACKS,
        store = shared_store(&node.cluster_dir).display(),
        acks = shared_acks(&node.cluster_dir).display(),
        kubelet = bin_dir.join("kubelet").display(),
        kube_proxy = bin_dir.join("kube-proxy").display(),
        ip = node.ip,
        machine = super::MACHINE_DIR,
        unified = node.cgroup().unified().display(),
    )
}

/// Writes every file above, the node-private sysctl copies (starting from the host's values)
/// and the CNI directories.
/// The machine's identity, which `boot.sh` shows its kubelet in place of the host's: its SMBIOS
/// UUID `system_uuid` as DMI shows it (`product_uuid`), and its machine ID (`machine-id`, the
/// same 128 bits as 32 hex digits). The kubelet (cadvisor) reads the DMI file for
/// `status.nodeInfo.systemUUID` and, on a host without DMI (a VM without SMBIOS), falls back to
/// `/etc/machine-id`: either way the node reports its BMC's system UUID.
pub fn write_identity(node: &RealNode, system_uuid: &str) -> Result<()> {
    let hex = podha::api::canonical_uuid(system_uuid);
    if hex.len() != 32 {
        return Err(Error::Other(format!(
            "{}'s system UUID {system_uuid:?} is not 128 bits",
            node.name
        )));
    }
    let dir = node.dir();
    write(&dir.join("product_uuid"), &format!("{system_uuid}\n"))?;
    write(&dir.join("machine-id"), &format!("{hex}\n"))
}

pub fn write_all(
    node: &RealNode,
    ca_cert: &Path,
    server: (Ipv4Addr, u16),
    real: &crate::cluster::state::RealNodes,
) -> Result<()> {
    let dir = node.dir();
    for sub in [
        "cni/net.d",
        "cni-ipam",
        "pki",
        "sysctl",
        "kubelet",
        "pod-logs",
    ] {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p).map_err(|e| Error::io(format!("create {}", p.display()), e))?;
    }
    for shared in [
        shared_store(&node.cluster_dir),
        shared_acks(&node.cluster_dir),
    ] {
        std::fs::create_dir_all(&shared)
            .map_err(|e| Error::io(format!("create {}", shared.display()), e))?;
    }
    let json = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    write(&dir.join("containerd.toml"), &containerd_config(node))?;
    write(
        &dir.join("cni/net.d/10-podha-sim.conflist"),
        &json(&cni_config(node)),
    )?;
    write(
        &dir.join("kubelet.json"),
        &json(&kubelet_config(
            node,
            ca_cert,
            real.node_status_update_frequency,
        )),
    )?;
    write(
        &dir.join("kubeconfig"),
        &kubeconfig(node, ca_cert, server, "node"),
    )?;
    write(
        &dir.join("kube-proxy.json"),
        &json(&kube_proxy_config(node)),
    )?;
    write(
        &dir.join("kube-proxy.kubeconfig"),
        &kubeconfig(node, ca_cert, server, "kube-proxy"),
    )?;
    for s in KUBELET_SYSCTLS {
        let host = format!("/proc/sys/{s}");
        let value =
            std::fs::read_to_string(&host).map_err(|e| Error::io(format!("read {host}"), e))?;
        write(&dir.join("sysctl").join(s.replace('/', ".")), &value)?;
    }
    let procs = node.cgroup().runtime_procs_files()?;
    write(
        &dir.join("boot.sh"),
        &boot_script(node, &procs, &real.node_bin_dir),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_status_cycle_is_its_default_unless_asked() {
        let node = RealNode::new(
            Path::new("/tmp/c"),
            "node-4",
            4,
            Ipv4Addr::new(172, 31, 9, 4),
        );
        let ca = Path::new("/tmp/c/ca.crt");
        let default = kubelet_config(&node, ca, None);
        assert!(default.get("nodeStatusUpdateFrequency").is_none());
        let fast = kubelet_config(&node, ca, Some(Duration::from_secs(1)));
        assert_eq!(fast["nodeStatusUpdateFrequency"], "1s");
        assert_eq!(fast["address"], "172.31.9.4");
    }
}
