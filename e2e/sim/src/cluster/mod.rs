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

pub mod audit;
mod bins;
mod blackhole;
mod fleet;
mod pki;
pub mod process;
pub mod realnode;
mod state;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
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
use state::{NodeRecord, Ports, RealNodes, State};

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

/// A real node's boot script, which becomes its kubelet (see `realnode`).
fn kubelet_proc(node: &str) -> String {
    format!("kubelet-{node}")
}

/// Timing of the control plane; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Short KCM grace periods and toleration seconds, for tests.
    Fast,
    /// Upstream defaults, for benchmarks.
    Stock,
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Profile::Fast => "fast",
            Profile::Stock => "stock",
        })
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Profile::Fast),
            "stock" => Ok(Profile::Stock),
            other => Err(format!(
                "unknown profile {other:?} (expected fast or stock)"
            )),
        }
    }
}

impl Profile {
    fn apiserver_args(self) -> &'static [&'static str] {
        match self {
            Profile::Fast => &[
                "--default-not-ready-toleration-seconds=10",
                "--default-unreachable-toleration-seconds=10",
            ],
            Profile::Stock => &[],
        }
    }

    fn controller_manager_args(self) -> &'static [&'static str] {
        match self {
            Profile::Fast => &[
                "--node-monitor-period=1s",
                "--node-monitor-grace-period=20s",
                "--node-startup-grace-period=20s",
            ],
            Profile::Stock => &[],
        }
    }

    fn scheduler_args(self) -> &'static [&'static str] {
        match self {
            // A StatefulSet's claim is provisioned a moment after its pod's first scheduling
            // attempt; the scheduler sometimes misses the claim's binding and only retries the
            // pod when it flushes unschedulable pods (5 min by default), longer than a test waits.
            Profile::Fast => &["--pod-max-in-unschedulable-pods-duration=10s"],
            Profile::Stock => &[],
        }
    }
}

/// What [`Cluster::up`] starts.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Directory holding the cluster's state, logs, certificates and etcd data.
    pub dir: PathBuf,
    /// Number of kwok nodes (`node-1`..`node-N`).
    pub nodes: usize,
    /// Number of real nodes (kubelet + containerd, see `realnode`), named after the kwok ones
    /// (`node-<N+1>`...). They need `make node-deps` and `make node-images`.
    pub real_nodes: usize,
    /// Where the kubelet is; default `$PODHA_NODE_BIN_DIR`, else the `make node-deps` cache.
    pub node_bin_dir: Option<PathBuf>,
    /// The directory of the static binaries of the real nodes' images (`podha-pause`,
    /// `podha-csi`); default `$PODHA_STATIC_DIR`, else where `make node-images` builds them
    /// (found from the podha-sim executable).
    pub static_dir: Option<PathBuf>,
    pub profile: Profile,
    /// Where the control-plane binaries are; default [`default_bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// The `podha-sim` executable that runs the CSI plugins and node agents (`csi-plugin`, `csi-node`). Default:
    /// `$PODHA_SIM_EXE`, else the current executable if it is `podha-sim`, else `podha-sim` next
    /// to it or one directory up (where cargo puts it for test binaries in `target/*/deps`).
    pub sim_exe: Option<PathBuf>,
    /// API server port on 127.0.0.1; default a free port.
    pub apiserver_port: Option<u16>,
    /// sim-csi's simulated ControllerPublish time.
    pub attach_delay: Duration,
    /// sim-csi's simulated ControllerUnpublish time.
    pub detach_delay: Duration,
}

impl ClusterOptions {
    /// Three nodes, profile fast, 1 s attach and detach delays.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ClusterOptions {
            dir: dir.into(),
            nodes: 3,
            real_nodes: 0,
            node_bin_dir: None,
            static_dir: None,
            profile: Profile::Fast,
            bin_dir: None,
            sim_exe: None,
            apiserver_port: None,
            attach_delay: Duration::from_secs(1),
            detach_delay: Duration::from_secs(1),
        }
    }
}

/// Errors of the sim cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sim cluster binaries not found in {} (missing: {}): run `make k8s`", dir.display(), missing.join(", "))]
    MissingBinaries { dir: PathBuf, missing: Vec<String> },
    #[error("CSI sidecars not found in {} (missing: {}): run `make csi-sidecars`", dir.display(), missing.join(", "))]
    MissingCsiSidecars { dir: PathBuf, missing: Vec<String> },
    #[error(
        "the podha-sim executable (it runs sim-csi) was not found ({0}): build it with `cargo build -p podha-sim` or set PODHA_SIM_EXE"
    )]
    SimExeNotFound(String),
    #[error("{} is in use by a running sim cluster ({running}): run `podha-sim down --dir {}` first", dir.display(), dir.display())]
    DirInUse { dir: PathBuf, running: String },
    #[error("no sim cluster in {} (no state.json): start one with `podha-sim up --dir {}`", .0.display(), .0.display())]
    NoCluster(PathBuf),
    #[error("unknown node {name:?}; this cluster's nodes: {}", known.join(", "))]
    UnknownNode { name: String, known: Vec<String> },
    #[error("node {0} is already running")]
    NodeRunning(String),
    #[error("port {port} on {ip} is already in use")]
    PortTaken { ip: Ipv4Addr, port: u16 },
    #[error("{name} exited; last lines of {}:\n{tail}", log.display())]
    ProcessExited {
        name: String,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {secs} s waiting for {what}; logs are in {}", logs.display())]
    Timeout {
        what: String,
        secs: u64,
        logs: PathBuf,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("certificates: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("{0}")]
    Other(String),
}

impl Error {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            context: context.into(),
            source,
        }
    }

    /// A short stable name per variant (for logs and metrics).
    pub fn label(&self) -> &'static str {
        match self {
            Error::MissingBinaries { .. } => "missing_binaries",
            Error::MissingCsiSidecars { .. } => "missing_csi_sidecars",
            Error::SimExeNotFound(_) => "sim_exe_not_found",
            Error::DirInUse { .. } => "dir_in_use",
            Error::NoCluster(_) => "no_cluster",
            Error::UnknownNode { .. } => "unknown_node",
            Error::NodeRunning(_) => "node_running",
            Error::PortTaken { .. } => "port_taken",
            Error::ProcessExited { .. } => "process_exited",
            Error::Timeout { .. } => "timeout",
            Error::Io { .. } => "io",
            Error::Kube { .. } => "kube",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Pki(_) => "pki",
            Error::Other(_) => "other",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    let l = TcpListener::bind((ip, 0))
        .map_err(|e| Error::io(format!("find a free port on {ip}"), e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("local_addr", e))
}

fn port_is_free(ip: Ipv4Addr, port: u16) -> bool {
    TcpListener::bind((ip, port)).is_ok()
}

fn resolve_sim_exe(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(Error::SimExeNotFound(format!(
                "{} does not exist",
                p.display()
            )))
        };
    }
    if let Some(p) = std::env::var_os("PODHA_SIM_EXE").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::SimExeNotFound(format!(
                "PODHA_SIM_EXE={} does not exist",
                p.display()
            )))
        };
    }
    let me = std::env::current_exe().map_err(|e| Error::io("current_exe", e))?;
    if me.file_name().is_some_and(|n| n == "podha-sim") {
        return Ok(me);
    }
    let candidates: Vec<PathBuf> = me
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("podha-sim"))
        .collect();
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| {
            Error::SimExeNotFound(format!(
                "looked for {}",
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn node_record(index: u8) -> Result<NodeRecord> {
    if index == 0 || index > 250 {
        return Err(Error::Other(format!(
            "node index {index} out of range 1..=250"
        )));
    }
    let ip = Ipv4Addr::new(127, 0, 0, index + 1);
    let port = if port_is_free(ip, KUBELET_PORT) {
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
    })
}

fn real_node_record(index: u8, subnet: u8) -> Result<NodeRecord> {
    if index == 0 || index > 250 {
        return Err(Error::Other(format!(
            "node index {index} out of range 1..=250"
        )));
    }
    Ok(NodeRecord {
        name: format!("node-{index}"),
        index,
        ip: realnode::net::node_ip(subnet, index),
        port: realnode::KUBELET_PORT,
        real: true,
    })
}

fn remove_path(p: &Path) -> Result<()> {
    let res = if p.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    match res {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", p.display()), e)),
    }
}

/// Names of the recorded processes that still run.
fn running(state: &State) -> Vec<(String, ProcRecord)> {
    state
        .processes
        .iter()
        .filter(|(_, r)| process::is_alive(r))
        .map(|(n, r)| (n.clone(), *r))
        .collect()
}

impl Cluster {
    /// Starts a new cluster in `opts.dir` and returns once every node is Ready, every node's
    /// CSINode lists the sim-csi drivers and the controller manager has created the `default`
    /// service account. On error, whatever was started is killed again (logs stay in
    /// `DIR/logs`).
    pub async fn up(opts: ClusterOptions) -> Result<Cluster> {
        let bin_dir = opts.bin_dir.clone().unwrap_or_else(default_bin_dir);
        bins::check(&bin_dir)?;
        let sidecar_dir = crate::csi::sidecars::default_bin_dir();
        let missing = crate::csi::sidecars::missing(&sidecar_dir);
        if !missing.is_empty() {
            return Err(Error::MissingCsiSidecars {
                dir: sidecar_dir,
                missing,
            });
        }
        let sim_exe = resolve_sim_exe(opts.sim_exe.as_deref())?;
        let total = opts.nodes + opts.real_nodes;
        if total == 0 || total > 250 {
            return Err(Error::Other(format!(
                "--nodes plus --real-nodes must be 1..=250, got {total}"
            )));
        }
        let node_bin_dir = opts
            .node_bin_dir
            .clone()
            .unwrap_or_else(realnode::default_node_bin_dir);
        let static_dir = opts
            .static_dir
            .clone()
            .unwrap_or_else(|| realnode::default_static_dir(&sim_exe));
        if opts.real_nodes > 0 {
            realnode::check_host(&node_bin_dir, &static_dir)?;
        }
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| Error::io(format!("create {}", opts.dir.display()), e))?;
        let dir = opts
            .dir
            .canonicalize()
            .map_err(|e| Error::io(format!("resolve {}", opts.dir.display()), e))?;
        if let Some(old) = State::load(&dir)? {
            let alive = running(&old);
            if !alive.is_empty() {
                let running = alive
                    .iter()
                    .map(|(n, r)| format!("{n} pid {}", r.pid))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(Error::DirInUse { dir, running });
            }
        }
        for stale in [
            "etcd",
            "pki",
            "logs",
            "kwok-home",
            "kubeconfig",
            "kwok-stages.yaml",
            "nodes",
            "images",
        ] {
            remove_path(&dir.join(stale))?;
        }
        remove_path(&state::path(&dir))?;
        for sub in ["logs", "kwok-home"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| Error::io(format!("create {}", dir.join(sub).display()), e))?;
        }

        let localhost = Ipv4Addr::LOCALHOST;
        let apiserver = match opts.apiserver_port {
            Some(p) if !port_is_free(localhost, p) => {
                return Err(Error::PortTaken {
                    ip: localhost,
                    port: p,
                });
            }
            Some(p) => p,
            None => free_port(localhost)?,
        };
        let ports = Ports {
            etcd_client: free_port(localhost)?,
            etcd_peer: free_port(localhost)?,
            apiserver,
            controller_manager: free_port(localhost)?,
            scheduler: free_port(localhost)?,
        };
        let token = pki::generate(&dir)?;
        pki::write_kubeconfig(
            &dir.join("kubeconfig"),
            &pki::Pki::paths(&dir).ca_cert,
            ports.apiserver,
            &token,
        )?;
        std::fs::write(dir.join("kwok-stages.yaml"), KWOK_STAGES)
            .map_err(|e| Error::io("write kwok-stages.yaml", e))?;
        let mut nodes = (1..=opts.nodes as u8)
            .map(node_record)
            .collect::<Result<Vec<_>>>()?;
        let real_nodes = if opts.real_nodes > 0 {
            let seed = u8::from_str_radix(&realnode::cluster_id(&dir)[..2], 16).unwrap_or(0);
            let subnet = realnode::net::free_subnet(seed)?;
            for index in opts.nodes + 1..=total {
                nodes.push(real_node_record(index as u8, subnet)?);
            }
            realnode::build_node_images(&dir, &static_dir)?;
            Some(RealNodes {
                subnet,
                node_bin_dir,
            })
        } else {
            None
        };
        let state = State {
            profile: opts.profile,
            bin_dir,
            sim_exe,
            attach_delay: opts.attach_delay,
            detach_delay: opts.detach_delay,
            ports,
            nodes,
            real_nodes,
            processes: Default::default(),
        };
        state.save(&dir)?;
        // From here on an error drops `cluster`, which kills what was started.
        let cluster = Cluster {
            dir,
            state: Mutex::new(state),
            down_on_drop: true,
        };
        cluster.boot().await?;
        Ok(cluster)
    }

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
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig_path())?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        kube::Client::try_from(config).map_err(|e| Error::kube("build client", e))
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

    /// The node's machine dies: its kwok and sim-csi node agent are SIGKILLed (its lease stops
    /// being renewed, its status and `volumesInUse` freeze) and its address stops answering
    /// (packets to its kubelet endpoint are dropped: a connect times out, as against a host that
    /// is off).
    ///
    /// A real node: every process in its cgroup tree (containerd, shims, containers, kubelet)
    /// is SIGKILLed and its veth goes down.
    pub fn kill_node(&self, name: &str) -> Result<()> {
        let rec = self.node(name)?;
        if rec.real {
            realnode::kill(&self.real_node(name, "killed")?)?;
        } else {
            blackhole::silence(&self.dir, rec.ip, rec.kubelet_port)?;
        }
        self.kill_node_processes(name)?;
        info!(node = name, "node killed");
        Ok(())
    }

    /// Only the node's kubelet dies (kwok and the sim-csi node agent are SIGKILLed): the host
    /// stays up, so its kernel refuses connects to the kubelet port. Containers of a real node
    /// would go on running.
    ///
    /// A real node: only its kubelet is SIGKILLed; containerd and the containers run on.
    pub fn kill_kubelet(&self, name: &str) -> Result<()> {
        if self.node(name)?.real {
            let proc_name = kubelet_proc(name);
            let mut st = self.lock_reloaded();
            if let Some(rec) = st.processes.get(&proc_name).copied() {
                process::kill_leader(&proc_name, &rec)?;
                st.processes.remove(&proc_name);
                st.save(&self.dir)?;
            }
            info!(node = name, "kubelet killed, containers running");
            return Ok(());
        }
        self.kill_node_processes(name)?;
        info!(node = name, "kubelet killed, host up");
        Ok(())
    }

    fn kill_node_processes(&self, name: &str) -> Result<()> {
        let mut st = self.lock_reloaded();
        let names = if st.node(name)?.real {
            vec![kubelet_proc(name)]
        } else {
            vec![kwok_proc(name), csi_node_proc(name)]
        };
        let mut result = Ok(());
        for proc_name in names {
            if let Some(rec) = st.processes.get(&proc_name).copied() {
                match process::kill(&proc_name, &rec) {
                    Ok(()) => {
                        st.processes.remove(&proc_name);
                    }
                    Err(e) => result = Err(e),
                }
            }
        }
        st.save(&self.dir)?;
        result
    }

    /// Restarts a killed node's kwok and node agent as a rebooted machine would come back: a
    /// new `nodeInfo.bootID`, the stale lease dropped so that the new kwok (which has a new
    /// holder identity, unlike a kubelet) takes it over at once. Returns once the node is Ready.
    ///
    /// A real node reboots: whatever still runs of it is killed, then it boots with a new boot
    /// ID (which its kubelet reports); returns once it is Ready with that boot ID.
    pub async fn start_node(&self, name: &str) -> Result<()> {
        if self.node(name)?.real {
            return self.reboot_real_node(name).await;
        }
        {
            let st = self.lock_reloaded();
            st.node(name)?;
            let kwok_alive = st
                .processes
                .get(&kwok_proc(name))
                .is_some_and(process::is_alive);
            let agent_alive = st
                .processes
                .get(&csi_node_proc(name))
                .is_some_and(process::is_alive);
            if kwok_alive && agent_alive {
                return Err(Error::NodeRunning(name.to_string()));
            }
        }
        let client = self.client().await?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        match leases.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("delete lease of {name}"), e)),
        }
        set_boot_id(&client, name).await?;
        {
            let mut st = self.lock_reloaded();
            let mut rec = st.node(name)?.clone();
            blackhole::restore(&self.dir, rec.ip, rec.port)?;
            // Another process may have taken the node's port while it was down (a second sim
            // cluster shares the loopback addresses): take a free one; kwok reports it in the
            // Node's daemonEndpoints, where probes read it.
            if !port_is_free(rec.ip, rec.port) {
                rec.port = free_port(rec.ip)?;
                if let Some(stored) = st.nodes.iter_mut().find(|n| n.name == name) {
                    stored.port = rec.port;
                }
            }
            self.spawn_node(&mut st, &rec)?;
        }
        self.wait_nodes_ready(&client, &[name.to_string()], Duration::from_secs(120))
            .await?;
        info!(node = name, "node started");
        Ok(())
    }

    /// Adds kwok node `node-<N+1>` and returns its name once it is Ready.
    pub async fn add_node(&self) -> Result<String> {
        let rec = {
            let mut st = self.lock_reloaded();
            let index = st
                .nodes
                .iter()
                .map(|n| n.index)
                .max()
                .unwrap_or(0)
                .checked_add(1);
            let rec = node_record(index.unwrap_or(0))?;
            st.nodes.push(rec.clone());
            st.save(&self.dir)?;
            rec
        };
        let client = self.client().await?;
        create_node(&client, &rec).await?;
        {
            let mut st = self.lock_reloaded();
            self.spawn_node(&mut st, &rec)?;
        }
        self.wait_nodes_ready(
            &client,
            std::slice::from_ref(&rec.name),
            Duration::from_secs(120),
        )
        .await?;
        info!(node = %rec.name, "node added");
        Ok(rec.name)
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

    async fn boot(&self) -> Result<()> {
        let dir = self.dir.clone();
        let kubeconfig = self.kubeconfig_path();
        let pki = pki::Pki::paths(&dir);

        // etcd
        {
            let mut st = self.lock();
            let p = st.ports.clone();
            let mut cmd = Self::bin(&st, "etcd");
            cmd.arg("--name=sim")
                .arg(format!("--data-dir={}", dir.join("etcd").display()))
                .arg(format!(
                    "--listen-client-urls=http://127.0.0.1:{}",
                    p.etcd_client
                ))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{}",
                    p.etcd_client
                ))
                .arg(format!(
                    "--listen-peer-urls=http://127.0.0.1:{}",
                    p.etcd_peer
                ))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                    p.etcd_peer
                ))
                .arg(format!(
                    "--initial-cluster=sim=http://127.0.0.1:{}",
                    p.etcd_peer
                ))
                .arg("--unsafe-no-fsync=true")
                .arg("--log-level=warn");
            self.spawn(&mut st, ETCD, cmd)?;
        }
        let etcd_port = self.lock().ports.etcd_client;
        self.wait_until(
            "etcd to accept connections",
            Duration::from_secs(30),
            &[ETCD],
            || async move {
                Ok(TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, etcd_port)),
                    Duration::from_millis(200),
                )
                .is_ok())
            },
        )
        .await?;

        // kube-apiserver
        {
            let audit_policy = audit::write_policy(&self.dir)?;
            let mut st = self.lock();
            let p = st.ports.clone();
            let mut cmd = Self::bin(&st, "kube-apiserver");
            // With real nodes the `kubernetes` Service's endpoint is the bridge's host address,
            // which the DNAT sends to 127.0.0.1: in-cluster clients on real nodes reach the API
            // server through the Service (kube-proxy); the lease reconciler keeps the endpoint.
            // Without them it cannot have one: a loopback endpoint is invalid, and nothing
            // reaches the API server through the Service.
            let (advertise, reconciler) = match &st.real_nodes {
                Some(real) => (realnode::net::host_ip(real.subnet), "lease"),
                None => (Ipv4Addr::LOCALHOST, "none"),
            };
            cmd.arg(format!("--etcd-servers=http://127.0.0.1:{}", p.etcd_client))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--advertise-address={advertise}"))
                .arg(format!("--endpoint-reconciler-type={reconciler}"))
                .arg(format!("--secure-port={}", p.apiserver))
                .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
                .arg(format!(
                    "--tls-private-key-file={}",
                    pki.serving_key.display()
                ))
                .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
                .arg(format!("--token-auth-file={}", pki.tokens.display()))
                .arg("--authorization-mode=Node,RBAC")
                // Real nodes' hostnames resolve nowhere: reach kubelets (logs, exec) by address.
                .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
                .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
                .arg(format!(
                    "--service-account-key-file={}",
                    pki.sa_pub.display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    pki.sa_key.display()
                ))
                .arg("--service-cluster-ip-range=10.96.0.0/16")
                .arg("--allow-privileged=true")
                .arg(format!("--audit-policy-file={}", audit_policy.display()))
                .arg(format!(
                    "--audit-log-path={}",
                    audit::log_path(&self.dir).display()
                ))
                .arg("--audit-log-format=json")
                .args(st.profile.apiserver_args());
            self.spawn(&mut st, APISERVER, cmd)?;
        }
        let client = self.client().await?;
        let c = &client;
        self.wait_until(
            "kube-apiserver /readyz",
            Duration::from_secs(180),
            &[ETCD, APISERVER],
            || async move {
                let req = http::Request::get("/readyz").body(Vec::new());
                match req {
                    Ok(req) => Ok(c.request_text(req).await.is_ok_and(|body| body == "ok")),
                    Err(e) => Err(Error::Other(format!("build /readyz request: {e}"))),
                }
            },
        )
        .await?;

        apply_csi_objects(&client).await?;

        // kube-controller-manager and kube-scheduler
        {
            let mut st = self.lock();
            let p = st.ports.clone();
            let mut cmd = Self::bin(&st, "kube-controller-manager");
            cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", p.controller_manager))
                .arg("--leader-elect=false")
                .arg("--controllers=*")
                .arg("--use-service-account-credentials=false")
                .arg(format!(
                    "--service-account-private-key-file={}",
                    pki.sa_key.display()
                ))
                .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
                .arg(format!(
                    "--cluster-signing-cert-file={}",
                    pki.ca_cert.display()
                ))
                .arg(format!(
                    "--cluster-signing-key-file={}",
                    pki.ca_key.display()
                ))
                .arg("--allocate-node-cidrs=false")
                .arg("--cluster-name=podha-sim")
                .args(st.profile.controller_manager_args());
            self.spawn(&mut st, CONTROLLER_MANAGER, cmd)?;

            let mut cmd = Self::bin(&st, "kube-scheduler");
            cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", p.scheduler))
                .arg("--leader-elect=false")
                .args(st.profile.scheduler_args());
            self.spawn(&mut st, SCHEDULER, cmd)?;
        }

        // nodes
        let (real, nodes): (Vec<NodeRecord>, Vec<NodeRecord>) =
            self.lock().nodes.iter().cloned().partition(|n| n.real);
        for rec in &nodes {
            create_node(&client, rec).await?;
        }
        let real_boots = self.boot_real_nodes(&real)?;
        {
            let mut st = self.lock();
            for rec in &nodes {
                self.spawn_node(&mut st, rec)?;
            }
            let cfg = crate::csi::ControllerConfig {
                attach_delay: st.attach_delay,
                detach_delay: st.detach_delay,
            };
            let layout = crate::csi::sidecars::Layout::new(&self.dir);
            let sidecar_dir = crate::csi::sidecars::default_bin_dir();
            for (name, cmd) in crate::csi::sidecars::controller_processes(
                &st.sim_exe,
                &sidecar_dir,
                &layout,
                &kubeconfig,
                cfg,
            ) {
                self.spawn(&mut st, &name, cmd)?;
            }
        }

        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        self.wait_nodes_ready(&client, &names, Duration::from_secs(180))
            .await?;
        self.wait_real_nodes_ready(&client, &real_boots, Duration::from_secs(180))
            .await?;
        if !real.is_empty() {
            let names: Vec<String> = real.iter().map(|n| n.name.clone()).collect();
            realnode::csi::install_node_plugin(&client, &names, Duration::from_secs(120)).await?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let sas = &sas;
        self.wait_until(
            "the controller manager to create the default service account",
            Duration::from_secs(60),
            &[CONTROLLER_MANAGER],
            || async move { Ok(sas.get_opt("default").await.ok().flatten().is_some()) },
        )
        .await?;
        let dead: Vec<String> = self
            .processes()
            .into_iter()
            .filter(|p| !p.alive)
            .map(|p| p.name)
            .collect();
        if let Some(name) = dead.first() {
            let log = self.log_path(name);
            return Err(Error::ProcessExited {
                name: name.clone(),
                tail: process::log_tail(&log, 20),
                log,
            });
        }
        info!(dir = %self.dir.display(), nodes = names.len(), real_nodes = real.len(), "sim cluster up");
        Ok(())
    }

    fn spawn_node(&self, st: &mut State, rec: &NodeRecord) -> Result<()> {
        let kubeconfig = self.kubeconfig_path();
        let mut kwok = Self::bin(st, "kwok");
        kwok.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--config={}",
                self.dir.join("kwok-stages.yaml").display()
            ))
            .arg(format!("--manage-single-node={}", rec.name))
            .arg(format!("--node-name={}", rec.name))
            .arg(format!("--node-ip={}", rec.ip))
            .arg(format!("--node-port={}", rec.port))
            .arg(format!("--server-address={}:{}", rec.ip, rec.port))
            .arg(format!(
                "--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}"
            ))
            .arg(format!("--cidr=10.244.{}.0/24", rec.index))
            // kwok also loads ~/.kwok/kwok.yaml when it exists: keep the user's out.
            .env("HOME", self.dir.join("kwok-home"));
        self.spawn(st, &kwok_proc(&rec.name), kwok)?;
        let mut agent = Command::new(&st.sim_exe);
        agent
            .arg("csi-node")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node={}", rec.name));
        self.spawn(st, &csi_node_proc(&rec.name), agent)
    }

    /// Polls `check` every 250 ms until it returns true; fails early if one of `watched`
    /// processes exits.
    async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        watched: &[&str],
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check().await? {
                return Ok(());
            }
            let st = self.reload();
            for name in watched {
                if let Some(rec) = st.processes.get(*name)
                    && !process::is_alive(rec)
                {
                    let log = self.log_path(name);
                    return Err(Error::ProcessExited {
                        name: name.to_string(),
                        tail: process::log_tail(&log, 20),
                        log,
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    secs: timeout.as_secs(),
                    logs: self.logs_dir(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every named node is Ready and its CSINode lists both sim-csi drivers.
    async fn wait_nodes_ready(
        &self,
        client: &kube::Client,
        names: &[String],
        timeout: Duration,
    ) -> Result<()> {
        let mut watched: Vec<String> = vec![APISERVER.into()];
        for n in names {
            watched.push(kwok_proc(n));
            watched.push(csi_node_proc(n));
        }
        let watched: Vec<&str> = watched.iter().map(String::as_str).collect();
        let nodes: Api<Node> = Api::all(client.clone());
        let csinodes: Api<CSINode> = Api::all(client.clone());
        let what = format!(
            "nodes {} to be Ready with sim-csi registered",
            names.join(", ")
        );
        let (nodes, csinodes) = (&nodes, &csinodes);
        self.wait_until(&what, timeout, &watched, || async move {
            for name in names {
                let Some(node) = nodes.get_opt(name).await.ok().flatten() else {
                    return Ok(false);
                };
                if !node_is_ready(&node) {
                    return Ok(false);
                }
                let Some(csinode) = csinodes.get_opt(name).await.ok().flatten() else {
                    return Ok(false);
                };
                let registered: Vec<&str> = csinode
                    .spec
                    .drivers
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect();
                if !crate::csi::DRIVERS.iter().all(|d| registered.contains(d)) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await
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

async fn create_node(client: &kube::Client, rec: &NodeRecord) -> Result<()> {
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
    set_boot_id(client, &rec.name).await
}

/// Gives the node a fresh `status.nodeInfo.bootID`, as a (re)booted kubelet reports; kwok keeps
/// whatever value is there.
async fn set_boot_id(client: &kube::Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let boot_id = pki::random_uuid()?;
    let patch = serde_json::json!({ "status": { "nodeInfo": { "bootID": boot_id } } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("set bootID of {name}"), e))?;
    Ok(())
}

/// Server-side applies sim-csi's cluster objects (CSIDrivers, StorageClasses).
async fn apply_csi_objects(client: &kube::Client) -> Result<()> {
    use kube::core::{DynamicObject, GroupVersionKind};
    use kube::discovery::pinned_kind;
    for obj in crate::csi::cluster_objects() {
        let value =
            serde_json::to_value(&obj).map_err(|e| Error::Other(format!("sim-csi object: {e}")))?;
        let api_version = value["apiVersion"].as_str().unwrap_or_default();
        let kind = value["kind"].as_str().unwrap_or_default();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _caps) = pinned_kind(client, &gvk)
            .await
            .map_err(|e| Error::kube(format!("discover {api_version} {kind}"), e))?;
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        api.patch(
            &name,
            &PatchParams::apply("podha-sim").force(),
            &Patch::Apply(&value),
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
