//! `podha-sim`: start, break and stop the sim cluster (see `e2e/sim/README.md`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use podha_sim::cluster::{Cluster, ClusterOptions, Profile, node_is_ready};

#[derive(Parser)]
#[command(
    name = "podha-sim",
    version,
    about = "A real Kubernetes control plane on one machine, for podha's tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Args)]
struct DirArg {
    /// Directory of the sim cluster (state, kubeconfig, logs).
    #[arg(long)]
    dir: PathBuf,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster in DIR; returns once every node is Ready. Processes keep running.
    Up {
        #[command(flatten)]
        dir: DirArg,
        /// Number of kwok nodes, named node-1..node-N.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Number of real nodes (kubelet + containerd in a network namespace), named after the
        /// kwok ones; needs `make node-deps node-images` and root.
        #[arg(long, default_value_t = 0)]
        real_nodes: usize,
        /// `fast` (short grace periods, for tests) or `stock` (upstream defaults).
        #[arg(long, default_value = "fast")]
        profile: Profile,
        /// podha-csi's ControllerPublishVolume time.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        attach_delay: Duration,
        /// podha-csi's ControllerUnpublishVolume time.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        detach_delay: Duration,
        /// Control-plane binaries (default: $PODHA_SIM_BIN_DIR, else the `make k8s` cache).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// API server port on 127.0.0.1 (default: a free port).
        #[arg(long)]
        apiserver_port: Option<u16>,
        /// The real kubelets' nodeStatusUpdateFrequency (default: the kubelet's, 10s). A kubelet
        /// mounts a new pod's volume only after reporting it in the Node's volumesInUse on
        /// this cycle.
        #[arg(long, value_parser = humantime::parse_duration)]
        node_status_update_frequency: Option<Duration>,
        /// Power every node through Redfish: a sushy-tools emulator with a system per node,
        /// which each node's BMC follows (`make sushy-tools`).
        #[arg(long)]
        redfish_bmcs: bool,
    },
    /// The main job on the embedded default: a sim cluster, podha, a StatefulSet with an RWO
    /// volume, a node killed, and the failover timeline. Everything is torn down at the end.
    Demo {
        /// Directory of the demo's cluster.
        #[arg(long, default_value = ".sim-demo")]
        dir: PathBuf,
        /// `stock` (upstream Kubernetes defaults) or `fast`.
        #[arg(long, default_value = "stock")]
        profile: Profile,
        /// The podha executable.
        #[arg(long, default_value = "target/debug/podha")]
        operator: PathBuf,
        /// The PodHAPolicy CRD manifest.
        #[arg(long, default_value = "crds/podha.io_podhapolicies.yaml")]
        crd: PathBuf,
        /// Leave the cluster running afterwards (take it down with `podha-sim down --dir DIR`).
        #[arg(long)]
        keep: bool,
        /// kwok nodes, podha as a process here, even where real nodes could run (as root).
        #[arg(long)]
        kwok: bool,
        /// What fails over: podha-csi's writer, or PostgreSQL checked by itself (real nodes).
        #[arg(long, value_enum, default_value_t = podha_sim::demo::Workload::Writer)]
        workload: podha_sim::demo::Workload,
    },
    /// Kill every process of the cluster in DIR.
    Down {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Kill, restart or add nodes.
    Node {
        #[command(subcommand)]
        command: NodeCmd,
    },
    /// A node's BMC (started by the sim with every real node, with kwok nodes whose agents have
    /// a watchdog, and with every node whose power comes through Redfish): its watchdog and
    /// power control, until it powers the node off (with Redfish: until it boots it again).
    Bmc {
        /// The node.
        name: String,
        /// The watchdog's timeout; without it the node has no watchdog.
        #[arg(long, value_parser = humantime::parse_duration)]
        watchdog_timeout: Option<std::time::Duration>,
        #[command(flatten)]
        dir: DirArg,
    },
    /// The kind kit's BMCs (e2e/kind/): each node's watchdog and power control, read from the
    /// FIFOs in DIR/<node>/ (mounted into the node at /podha-bmc), powering a node off by
    /// cutting its networks and `docker kill` (the client `$DOCKER`, else `docker`); each
    /// power-off appended to DIR/fences.log. Runs until killed.
    KindBmc {
        /// The nodes' containers.
        #[arg(required = true)]
        nodes: Vec<String>,
        /// The watchdogs' timeout.
        #[arg(long, value_parser = humantime::parse_duration)]
        watchdog_timeout: std::time::Duration,
        /// Where the nodes' FIFOs are made, and the fence log kept.
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// Container images without a registry: `docker save` archives loaded into the real nodes.
    Image {
        #[command(subcommand)]
        command: ImageCmd,
    },
    /// Forged heartbeats and peer surveys (unsigned, or signed with random bytes) to one podha
    /// agent, at most `--rate` a second; prints the answers by HTTP status as one JSON line
    /// when it stops. Run it in a node's network namespace to play a process on that node.
    ForgeHeartbeats(podha_sim::forge::ForgeArgs),
    /// Show the cluster's processes and nodes.
    Status {
        #[command(flatten)]
        dir: DirArg,
    },
    /// podha-csi's Controller service for one driver, on a unix socket, behind the real
    /// csi-provisioner and csi-attacher; started by `up`.
    #[command(hide = true)]
    CsiPlugin {
        #[arg(long)]
        driver: String,
        #[arg(long)]
        socket: PathBuf,
        /// The shared volume store.
        #[arg(long)]
        store: PathBuf,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        attach_delay: Duration,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        detach_delay: Duration,
    },
    /// CSI node agent (the simulated kubelet's storage half) of one node; started by `up` and `node start`.
    #[command(hide = true)]
    CsiNode {
        #[arg(long)]
        kubeconfig: PathBuf,
        #[arg(long)]
        node: String,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Import an image tar into every real node's containerd (`kind load` for the sim).
    Load {
        tar: PathBuf,
        #[command(flatten)]
        dir: DirArg,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// The node's machine dies: SIGKILL its kwok and sim-csi node agent, and drop packets to
    /// its address (a connect times out, as against a powered-off host).
    Kill {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Only the node's kubelet dies: SIGKILL its kwok and node agent; the host stays up (a
    /// connect to the kubelet port is refused).
    KillKubelet {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// What a kwok node's podha agent runs to fence it: SIGKILL its kwok and node agent (the
    /// host and the podha agent stay up), and record the fence in the cluster's fences.log.
    /// The agent gives the reason in $PODHA_FENCE_REASON.
    Fence {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// What a kwok node's podha agent runs to confirm its fence (`--fence-confirm`): exits 0
    /// once the node's kwok and node agent are gone (its "power" is off), 1 while either runs.
    Fenced {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Restart a killed node; returns once it is Ready.
    Start {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Freeze every process of a real node (a hung machine).
    Freeze {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Thaw a frozen real node.
    Thaw {
        name: String,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Drop a real node's traffic to the API server (its containers keep running); `--heal`
    /// lets it through again.
    Partition {
        name: String,
        #[arg(long)]
        heal: bool,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Cut a real node off from everything (its address silent both ways, its processes and
    /// containers running on, as on a machine whose network failed); `--heal` lets it back.
    Isolate {
        name: String,
        #[arg(long)]
        heal: bool,
        #[command(flatten)]
        dir: DirArg,
    },
    /// Add kwok node node-<N+1>; prints its name once it is Ready.
    Add {
        #[command(flatten)]
        dir: DirArg,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The user-facing commands poll the API server while it starts; kube's client logs every
    // refused connection and 500 as an error, which is noise there. The CSI processes keep them.
    let default_filter = match cli.command {
        Cmd::CsiPlugin { .. } | Cmd::CsiNode { .. } => "info",
        _ => "info,kube_client=off",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: the cluster's processes log to files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podha-sim: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Up {
            dir,
            nodes,
            real_nodes,
            profile,
            attach_delay,
            detach_delay,
            bin_dir,
            apiserver_port,
            node_status_update_frequency,
            redfish_bmcs,
        } => {
            let opts = ClusterOptions {
                nodes,
                real_nodes,
                profile,
                attach_delay,
                detach_delay,
                bin_dir,
                apiserver_port,
                node_status_update_frequency,
                redfish_bmcs,
                ..ClusterOptions::new(dir.dir)
            };
            up(opts).await?;
        }
        Cmd::Demo {
            dir,
            profile,
            operator,
            crd,
            keep,
            kwok,
            workload,
        } => podha_sim::demo::run(&dir, profile, &operator, &crd, keep, kwok, workload).await?,
        Cmd::Down { dir } => {
            let cluster = Cluster::attach(&dir.dir)?;
            let n = cluster.processes().iter().filter(|p| p.alive).count();
            cluster.down()?;
            println!(
                "sim cluster in {} is down ({n} processes killed)",
                cluster.dir().display()
            );
        }
        Cmd::Bmc {
            name,
            watchdog_timeout,
            dir,
        } => {
            let reason = Cluster::attach(&dir.dir)?
                .run_bmc(&name, watchdog_timeout)
                .await?;
            println!("{name} powered off: {reason}");
        }
        Cmd::KindBmc {
            nodes,
            watchdog_timeout,
            dir,
        } => {
            let docker = podha_sim::kind_bmc::docker_client();
            podha_sim::kind_bmc::run(&dir, watchdog_timeout, &docker, &nodes).await?;
        }
        Cmd::Node { command } => node(command).await?,
        Cmd::Image { command } => image(command)?,
        Cmd::Status { dir } => status(&dir.dir).await?,
        Cmd::ForgeHeartbeats(args) => {
            let summary = podha_sim::forge::run(&args).await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
        Cmd::CsiPlugin {
            driver,
            socket,
            store,
            attach_delay,
            detach_delay,
        } => {
            let cfg = podha_sim::csi::ControllerConfig {
                attach_delay,
                detach_delay,
            };
            podha_sim::csi::run_plugin(&driver, &socket, &store, cfg).await?;
        }
        Cmd::CsiNode { kubeconfig, node } => {
            let client = client_from(&kubeconfig).await?;
            podha_sim::csi::run_node_agent(client, node).await?;
        }
    }
    Ok(())
}

/// `podha-sim up`: the cluster is left running, and how to reach it is printed.
async fn up(opts: ClusterOptions) -> anyhow::Result<()> {
    let cluster = Cluster::up(opts).await?;
    println!("sim cluster up in {}", cluster.dir().display());
    println!(
        "export KUBECONFIG={}; {}/kubectl get nodes",
        cluster.kubeconfig_path().display(),
        cluster.bin_dir().display()
    );
    cluster.keep_running();
    Ok(())
}

/// `podha-sim node …`: one node's fault, repair or addition, on a running cluster.
async fn node(cmd: NodeCmd) -> anyhow::Result<()> {
    match cmd {
        NodeCmd::Kill { name, dir } => {
            Cluster::attach(&dir.dir)?.kill_node(&name)?;
            println!("{name} killed");
        }
        NodeCmd::KillKubelet { name, dir } => {
            Cluster::attach(&dir.dir)?.kill_kubelet(&name)?;
            println!("{name}: kubelet killed, host up");
        }
        NodeCmd::Fence { name, dir } => {
            let reason = std::env::var("PODHA_FENCE_REASON").unwrap_or_default();
            Cluster::attach(&dir.dir)?.fence_node(&name, &reason)?;
            println!("{name} fenced");
        }
        NodeCmd::Fenced { name, dir } => {
            if !Cluster::attach(&dir.dir)?.node_fenced(&name)? {
                anyhow::bail!("{name} is not fenced: its kwok or node agent runs");
            }
            println!("{name} is fenced");
        }
        NodeCmd::Start { name, dir } => {
            Cluster::attach(&dir.dir)?.start_node(&name).await?;
            println!("{name} is Ready");
        }
        NodeCmd::Freeze { name, dir } => {
            Cluster::attach(&dir.dir)?.freeze_node(&name)?;
            println!("{name} frozen");
        }
        NodeCmd::Thaw { name, dir } => {
            Cluster::attach(&dir.dir)?.thaw_node(&name)?;
            println!("{name} thawed");
        }
        NodeCmd::Partition { name, heal, dir } => {
            Cluster::attach(&dir.dir)?.partition_node(&name, !heal)?;
            println!(
                "{name} {}",
                if heal { "reconnected" } else { "partitioned" }
            );
        }
        NodeCmd::Isolate { name, heal, dir } => {
            Cluster::attach(&dir.dir)?.isolate_node(&name, !heal)?;
            println!("{name} {}", if heal { "reconnected" } else { "isolated" });
        }
        NodeCmd::Add { dir } => {
            let name = Cluster::attach(&dir.dir)?.add_node().await?;
            println!("{name}");
        }
    }
    Ok(())
}

/// `podha-sim image load`: an image tar (`docker save`) loaded into the nodes.
fn image(cmd: ImageCmd) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Load { tar, dir } => {
            for node in Cluster::attach(&dir.dir)?.load_image(&tar)? {
                println!("{} loaded into {node}", tar.display());
            }
        }
    }
    Ok(())
}

async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

async fn status(dir: &Path) -> anyhow::Result<()> {
    let cluster = Cluster::attach(dir)?;
    println!("dir:        {}", cluster.dir().display());
    println!("profile:    {}", cluster.profile());
    println!("apiserver:  {}", cluster.apiserver_url());
    println!("kubeconfig: {}", cluster.kubeconfig_path().display());
    println!();
    println!("{:<28} {:>8}  STATE", "PROCESS", "PID");
    for p in cluster.processes() {
        println!(
            "{:<28} {:>8}  {}",
            p.name,
            p.pid,
            if p.alive { "running" } else { "dead" }
        );
    }
    // Node conditions come from the API server, if it answers.
    let ready = async {
        let client = cluster.client().await.ok()?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let list = tokio::time::timeout(Duration::from_secs(5), nodes.list(&Default::default()))
            .await
            .ok()?
            .ok()?;
        Some(
            list.items
                .into_iter()
                .map(|n| {
                    (
                        n.metadata.name.clone().unwrap_or_default(),
                        node_is_ready(&n),
                    )
                })
                .collect::<std::collections::HashMap<_, _>>(),
        )
    }
    .await;
    println!();
    println!(
        "{:<10} {:<5} {:<15} {:>6}  {:<8} READY",
        "NODE", "KIND", "IP", "PORT", "PROCS"
    );
    for n in cluster.nodes() {
        let r = match &ready {
            Some(map) => match map.get(&n.name) {
                Some(true) => "True",
                Some(false) => "False",
                None => "missing",
            },
            None => "unknown (API server unreachable)",
        };
        let procs = if n.running { "running" } else { "killed" };
        let kind = if n.real { "real" } else { "kwok" };
        println!(
            "{:<10} {:<5} {:<15} {:>6}  {:<8} {r}",
            n.name, kind, n.ip, n.kubelet_port, procs
        );
    }
    Ok(())
}
