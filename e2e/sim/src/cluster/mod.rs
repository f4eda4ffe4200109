//! Starting, stopping and breaking the sim cluster's processes.
//!
//! A sim cluster lives in a directory `DIR`:
//!
//! | path | what |
//! |---|---|
//! | `DIR/kubeconfig` | admin kubeconfig (bearer token of a `system:masters` user, CA file) |
//! | `DIR/state.json` | ports, nodes and the pid/start time of every process (see `state`) |
//! | `DIR/logs/<name>.log` | stdout+stderr of each process: `etcd`, `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `csi-plugin-<rwo|other>`, `csi-provisioner-<rwo|other>`, `csi-attacher-<rwo|other>`, `kwok-<node>`, `csi-node-<node>` |
//! | `DIR/pki/` | CA, serving certificate, service-account key, token file |
//! | `DIR/etcd/` | etcd data |
//! | `DIR/kwok-stages.yaml` | kwok's Stage configuration (pods start only once their volumes are attached) |
//!
//! Every process runs in its own process group, detached from the caller, so a cluster started by
//! `podha-sim up` keeps running after it returns; `down` SIGKILLs each group.
//!
//! # Addresses
//!
//! The control plane listens on 127.0.0.1 (ports chosen free at `up`). Node `node-k` is one kwok
//! process plus one sim-csi node agent. Its node IP (the `InternalIP` address) is
//! `127.0.0.<k+1>` and kwok's HTTP server listens there, on port 10250 when that is free (else a
//! free port), which kwok reports as `status.daemonEndpoints.kubeletEndpoint.Port`: a TCP probe to
//! `InternalIP:port` reaches a real listener while the node lives. Killing a node models a dead
//! machine: its processes die and its address stops answering (packets to it are dropped, see
//! `blackhole`), so a connect times out as it does against a powered-off host. Killing only the
//! node's kubelet ([`Cluster::kill_kubelet`]) leaves the host up: a connect is refused. Pod IPs
//! of `node-k` come from `10.244.<k>.0/24`.
//!
//! # Profiles
//!
//! [`Profile::Stock`] keeps upstream defaults everywhere: KCM `--node-monitor-period=5s`,
//! `--node-monitor-grace-period=50s`, `--node-startup-grace-period=1m`; API server
//! `--default-not-ready-toleration-seconds=300`, `--default-unreachable-toleration-seconds=300`.
//! Benchmarks use it.
//!
//! [`Profile::Fast`] shortens only those: `--node-monitor-period=1s`,
//! `--node-monitor-grace-period=20s` (kwok renews its 40 s lease every 10 s, so two renewals fit
//! in the grace period), `--node-startup-grace-period=20s`, and toleration seconds 10. A killed
//! node goes `Unknown` 10-20 s after its death and its pods get a deletionTimestamp about 10 s
//! later. Tests use it. Nothing else differs: the attach/detach controller's 6 minute
//! force-detach wait is hard-coded in Kubernetes and applies to both.
//!
//! # Real nodes
//!
//! With [`ClusterOptions::real_nodes`], nodes after the kwok ones run a real kubelet and
//! containerd, each in a network namespace, cgroup tree and mount namespace of its own; see
//! `realnode`.
//!
//! With kwok leases, nodes are `node-1`..`node-N`, each with labels `kubernetes.io/hostname`,
//! `kubernetes.io/os=linux`, `kubernetes.io/arch=amd64`, `type=kwok` and the annotation
//! `volumes.kubernetes.io/controller-managed-attach-detach=true` (a kubelet sets it; without it
//! the attach/detach controller ignores the node).

pub mod agents;
mod apiserver;
pub mod audit;
mod bins;
mod blackhole;
pub mod bmc;
mod boot;
mod fleet;
mod node_ops;
mod options;
mod pki;
pub(crate) mod ports;
pub mod process;
pub mod realnode;
pub mod redfish;
mod state;
mod up;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub use bins::{BINARIES, default_bin_dir, k8s_version};
pub use fleet::{FLEET_GROUP_LABEL, FleetGroup};
use process::ProcRecord;
pub use realnode::PAUSE_IMAGE;
pub use state::Agents;
use state::{NodeRecord, Ports, RealNodes, State};

pub use options::{ClusterOptions, Error, Profile, Result};

/// Port kwok serves on (as a kubelet would) when it is free on the node's IP.
pub const KUBELET_PORT: u16 = 10250;
/// kwok's node lease duration; kwok renews every quarter of it (10 s), as a kubelet does.
pub const NODE_LEASE_DURATION_SECONDS: u32 = 40;

const ETCD: &str = "etcd";
const APISERVER: &str = "kube-apiserver";
const CONTROLLER_MANAGER: &str = "kube-controller-manager";
const SCHEDULER: &str = "kube-scheduler";
const KWOK_STAGES: &str = include_str!("kwok-stages.yaml");

fn kwok_proc(node: &str) -> String {
    format!("kwok-{node}")
}

fn csi_node_proc(node: &str) -> String {
    format!("csi-node-{node}")
}

/// The podha agent of a kwok node (see `agents`).
fn agent_proc(node: &str) -> String {
    format!("podha-agent-{node}")
}

/// A real node's boot script, which becomes its kubelet (see `realnode`).
fn kubelet_proc(node: &str) -> String {
    format!("kubelet-{node}")
}

/// A node of the sim cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The node's InternalIP, `127.0.0.<k+1>` for `node-k`.
    pub ip: Ipv4Addr,
    /// kwok's server port, reported as `status.daemonEndpoints.kubeletEndpoint.Port`.
    pub kubelet_port: u16,
    /// Whether its kwok process (a real node: its kubelet) runs (false after
    /// [`Cluster::kill_node`]).
    pub running: bool,
    /// A real node (kubelet and containerd) rather than a kwok one.
    pub real: bool,
}

/// A process of the sim cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: i32,
    pub alive: bool,
    pub log: PathBuf,
}

/// Handle on a sim cluster. Dropping a handle returned by [`Cluster::up`] takes the cluster down
/// (best effort; see [`Cluster::keep_running`]); dropping one from [`Cluster::attach`] does not.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    state: Mutex<State>,
    down_on_drop: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.down_on_drop
            && let Err(e) = self.down()
        {
            warn!(error = %e, dir = %self.dir.display(), "sim cluster: down on drop failed");
        }
    }
}

fn free_port(ip: Ipv4Addr) -> Result<u16> {
    ports::free_port(ip).map_err(|e| Error::io(format!("find a free port on {ip}"), e))
}

fn node_record(index: u8) -> Result<NodeRecord> {
    if index == 0 || index > 250 {
        return Err(Error::Other(format!(
            "node index {index} out of range 1..=250"
        )));
    }
    let ip = Ipv4Addr::new(127, 0, 0, index + 1);
    let port = if ports::port_is_free(ip, KUBELET_PORT) {
        KUBELET_PORT
    } else {
        free_port(ip)?
    };
    Ok(NodeRecord {
        name: format!("node-{index}"),
        index,
        ip,
        port,
        real: false,
        agent_port: None,
        agent_cut: false,
        boot_id: None,
        system_uuid: None,
    })
}

impl Cluster {
    /// A handle on the cluster already running in `dir` (started by another process).
    pub fn attach(dir: impl AsRef<Path>) -> Result<Cluster> {
        let dir = dir.as_ref();
        let dir = dir
            .canonicalize()
            .map_err(|_| Error::NoCluster(dir.to_path_buf()))?;
        let state = State::load(&dir)?.ok_or_else(|| Error::NoCluster(dir.clone()))?;
        Ok(Cluster {
            dir,
            state: Mutex::new(state),
            down_on_drop: false,
        })
    }

    /// Lets the cluster outlive this handle (for `podha-sim up`).
    pub fn keep_running(mut self) {
        self.down_on_drop = false;
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// The requests the API server answered, as its audit log records them (pod deletions
    /// and Node writes; see [`audit`]).
    pub fn audited_requests(&self) -> Result<Vec<audit::Request>> {
        audit::answered(&audit::log_path(&self.dir))
    }

    pub fn profile(&self) -> Profile {
        self.lock().profile
    }

    /// `https://127.0.0.1:<port>`.
    pub fn apiserver_url(&self) -> String {
        format!("https://{}", self.apiserver_addr())
    }

    pub fn apiserver_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.lock().ports.apiserver))
    }

    /// The directory holding kubectl and the other control-plane binaries.
    pub fn bin_dir(&self) -> PathBuf {
        self.lock().bin_dir.clone()
    }

    /// A new admin client (each call builds its own, so it may be used from any tokio runtime).
    pub async fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.config().await?).map_err(|e| Error::kube("build client", e))
    }

    /// The admin's client configuration (to derive other users' from: another token, an
    /// impersonation).
    pub async fn config(&self) -> Result<kube::Config> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig_path())?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// Every node, in index order.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let st = self.reload();
        st.nodes.iter().map(|n| node_info(&st, n)).collect()
    }

    pub fn node(&self, name: &str) -> Result<NodeInfo> {
        let st = self.reload();
        Ok(node_info(&st, st.node(name)?))
    }

    /// The InternalIP of `name`.
    pub fn node_ip(&self, name: &str) -> Result<Ipv4Addr> {
        Ok(self.node(name)?.ip)
    }

    /// Every process the cluster started, with whether it still runs.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        let st = self.reload();
        st.processes
            .iter()
            .map(|(name, r)| ProcessInfo {
                name: name.clone(),
                pid: r.pid,
                alive: process::is_alive(r),
                log: self.log_path(name),
            })
            .collect()
    }

    /// SIGKILLs every process the cluster started (each whole process group) and waits for them
    /// to be gone. Idempotent. Logs and data stay in the directory.
    pub fn down(&self) -> Result<()> {
        let mut st = self.lock_reloaded();
        let mut first_err = None;
        // Real nodes first: their cgroup trees hold processes (shims, containers) that are in
        // no recorded process group.
        for rec in st.nodes.iter().filter(|n| n.real) {
            if let Err(e) = realnode::remove(&self.real_node_of(rec)) {
                first_err.get_or_insert(e);
            }
        }
        if st.real_nodes.is_some()
            && let Err(e) = realnode::remove_host_network(&self.dir)
        {
            first_err.get_or_insert(e);
        }
        let procs: Vec<(String, ProcRecord)> =
            st.processes.iter().map(|(n, r)| (n.clone(), *r)).collect();
        for (name, rec) in procs {
            match process::kill(&name, &rec) {
                Ok(()) => {
                    st.processes.remove(&name);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        st.save(&self.dir)?;
        if let Err(e) = blackhole::clear(&self.dir) {
            first_err.get_or_insert(e);
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    // ---- internals ----

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state as another process may have left it.
    fn lock_reloaded(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.lock();
        match State::load(&self.dir) {
            Ok(Some(fresh)) => *st = fresh,
            Ok(None) => {}
            Err(e) => warn!(error = %e, "keeping the in-memory sim cluster state"),
        }
        st
    }

    fn reload(&self) -> State {
        self.lock_reloaded().clone()
    }

    /// A [`Error::ProcessExited`] for the first of `names` that was started and has exited,
    /// with the tail of its log.
    fn exited(&self, names: &[&str]) -> Option<Error> {
        let st = self.reload();
        let name = names.iter().find(|name| {
            st.processes
                .get(**name)
                .is_some_and(|rec| !process::is_alive(rec))
        })?;
        let log = self.log_path(name);
        Some(Error::ProcessExited {
            name: name.to_string(),
            tail: process::log_tail(&log, 20),
            log,
        })
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.logs_dir().join(format!("{name}.log"))
    }

    fn spawn(&self, st: &mut State, name: &str, cmd: Command) -> Result<()> {
        if let Some(old) = st.processes.get(name).copied() {
            process::kill(name, &old)?;
        }
        info!(process = name, "starting");
        let rec = process::spawn(name, cmd, &self.log_path(name))?;
        st.processes.insert(name.to_string(), rec);
        st.save(&self.dir)
    }

    fn bin(st: &State, name: &str) -> Command {
        Command::new(st.bin_dir.join(name))
    }
}

fn node_info(st: &State, n: &NodeRecord) -> NodeInfo {
    NodeInfo {
        name: n.name.clone(),
        ip: n.ip,
        kubelet_port: n.port,
        running: st
            .processes
            .get(&if n.real {
                kubelet_proc(&n.name)
            } else {
                kwok_proc(&n.name)
            })
            .is_some_and(process::is_alive),
        real: n.real,
    }
}

/// True when the node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Creates the Node object of kwok node `rec`; returns its boot ID.
async fn create_node(client: &kube::Client, rec: &NodeRecord) -> Result<String> {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": rec.name,
            "labels": {
                "kubernetes.io/hostname": rec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
            "annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "node.alpha.kubernetes.io/ttl": "0",
                "kwok.x-k8s.io/node": "fake",
            },
        },
    }))
    .map_err(|e| Error::Other(format!("node object: {e}")))?;
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("create node {}", rec.name), e)),
    }
    if let Some(uuid) = &rec.system_uuid {
        let patch = serde_json::json!({ "status": { "nodeInfo": { "systemUUID": uuid } } });
        nodes
            .patch_status(&rec.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Error::kube(format!("set systemUUID of {}", rec.name), e))?;
    }
    set_boot_id(client, &rec.name).await
}

/// Gives the node a fresh `status.nodeInfo.bootID`, as a (re)booted kubelet reports (kwok
/// keeps whatever value is there); returns it.
async fn set_boot_id(client: &kube::Client, name: &str) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let boot_id = pki::random_uuid()?;
    let patch = serde_json::json!({ "status": { "nodeInfo": { "bootID": boot_id } } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("set bootID of {name}"), e))?;
    Ok(boot_id)
}

/// Server-side applies sim-csi's cluster objects (CSIDrivers, StorageClasses).
async fn apply_csi_objects(client: &kube::Client) -> Result<()> {
    apply(client, &crate::csi::cluster_objects()).await
}

/// Server-side applies `objects` (manifests as JSON, cluster-scoped or with a namespace), in
/// order, as field manager `podha-sim`.
pub(in crate::cluster) async fn apply(
    client: &kube::Client,
    objects: &[serde_json::Value],
) -> Result<()> {
    use kube::core::{DynamicObject, GroupVersionKind};
    use kube::discovery::{Scope, pinned_kind};
    for obj in objects {
        let (Some(api_version), Some(kind), Some(name)) = (
            obj["apiVersion"].as_str(),
            obj["kind"].as_str(),
            obj["metadata"]["name"].as_str(),
        ) else {
            return Err(Error::Other(format!(
                "a manifest object without apiVersion, kind or name: {obj}"
            )));
        };
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = pinned_kind(client, &gvk)
            .await
            .map_err(|e| Error::kube(format!("discover {api_version} {kind}"), e))?;
        let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            name,
            &PatchParams::apply("podha-sim").force(),
            &Patch::Apply(obj),
        )
        .await
        .map_err(|e| Error::kube(format!("apply {kind} {name}"), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_k_gets_ip_k_plus_one() {
        let rec = node_record(3).unwrap();
        assert_eq!(rec.name, "node-3");
        assert_eq!(rec.ip, Ipv4Addr::new(127, 0, 0, 4));
        assert!(node_record(0).is_err());
        assert!(node_record(251).is_err());
    }

    #[test]
    fn profiles_parse_and_differ() {
        assert_eq!("fast".parse::<Profile>().unwrap(), Profile::Fast);
        assert_eq!("stock".parse::<Profile>().unwrap(), Profile::Stock);
        assert!("slow".parse::<Profile>().is_err());
        assert!(Profile::Stock.controller_manager_args().is_empty());
        assert!(
            Profile::Fast
                .controller_manager_args()
                .contains(&"--node-monitor-grace-period=20s")
        );
    }

    #[test]
    fn attach_to_empty_dir_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("podha-sim-attach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Cluster::attach(&dir).unwrap_err();
        assert!(err.to_string().contains("no sim cluster"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
