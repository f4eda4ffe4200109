//! What `Cluster::up` is asked for (options, profiles) and what the cluster's operations fail with.

use super::*;

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
    pub(in crate::cluster) fn apiserver_args(self) -> &'static [&'static str] {
        match self {
            Profile::Fast => &[
                "--default-not-ready-toleration-seconds=10",
                "--default-unreachable-toleration-seconds=10",
            ],
            Profile::Stock => &[],
        }
    }

    pub(in crate::cluster) fn controller_manager_args(self) -> &'static [&'static str] {
        match self {
            Profile::Fast => &[
                "--node-monitor-period=1s",
                "--node-monitor-grace-period=20s",
                "--node-startup-grace-period=20s",
            ],
            Profile::Stock => &[],
        }
    }

    pub(in crate::cluster) fn scheduler_args(self) -> &'static [&'static str] {
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
    /// The directory of the real nodes' images (`podha-pause.tar`, `podha-csi.tar`, saved by
    /// Docker); default `$PODHA_NODE_IMAGES_DIR`, else where `make node-images` saves them
    /// (found from the podha-sim executable).
    pub node_images_dir: Option<PathBuf>,
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
    /// Run a podha agent beside every kwok node (see `agents`); `None`: no agents.
    pub agents: Option<Agents>,
    /// The timeout of the watchdog each real node's BMC keeps (a podha agent installed by the
    /// chart pets it); `None`: no watchdog.
    pub real_node_watchdog: Option<Duration>,
    /// The real kubelets' `nodeStatusUpdateFrequency`; `None`: the kubelet's default (10 s).
    /// It sets how soon a kubelet reports a new pod's volume in `status.volumesInUse`, which it
    /// waits for before it mounts the volume (see `realnode::files::kubelet_config`).
    pub node_status_update_frequency: Option<Duration>,
    /// Every node's BMC gets its power from a Redfish service (see `redfish`): one sushy-tools
    /// emulator with a system per node, which the BMC reads (`make sushy-tools`).
    pub redfish_bmcs: bool,
}

impl ClusterOptions {
    /// Three nodes, profile fast, 1 s attach and detach delays.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ClusterOptions {
            dir: dir.into(),
            nodes: 3,
            real_nodes: 0,
            node_bin_dir: None,
            node_images_dir: None,
            profile: Profile::Fast,
            bin_dir: None,
            sim_exe: None,
            apiserver_port: None,
            attach_delay: Duration::from_secs(1),
            detach_delay: Duration::from_secs(1),
            agents: None,
            real_node_watchdog: None,
            node_status_update_frequency: None,
            redfish_bmcs: false,
        }
    }
}

/// Errors of the sim cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sim cluster binaries not found in {} (missing: {}): run `make k8s`", dir.display(), missing.join(", "))]
    MissingBinaries { dir: PathBuf, missing: Vec<String> },
    #[error("the sushy-tools Redfish emulator was not found at {}: run `make sushy-tools` or set PODHA_SUSHY_EMULATOR", .0.display())]
    MissingSushyEmulator(PathBuf),
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
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(in crate::cluster) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
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
            Error::MissingSushyEmulator(_) => "missing_sushy_emulator",
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
