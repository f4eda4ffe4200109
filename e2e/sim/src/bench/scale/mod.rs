//! The operator at 1,000+ nodes (`make bench-scale`).
//!
//! One run, on a `stock` sim cluster whose nodes are a *fleet* (see `cluster::fleet`): groups of
//! `--group-size` nodes, each group one kwok process, so a whole group dies at once. podha runs
//! as a child process under its own ServiceAccount (`podha-bench/podha`), matched by its own
//! FlowSchema, so the API server counts its requests apart from everyone else's
//! (`apiserver_flowcontrol_dispatched_requests_total{flow_schema="podha-bench"}`).
//!
//! Steps:
//! 1. `base`: the control plane and one normal node, no workload; podha idle.
//! 2. `half`: half the groups and half the pods; all pods Ready, volumes attached; settle;
//!    measure over a window (podha's RSS and CPU from `/proc`, its request rate from the API
//!    server's metrics, the whole sim's CPU for context).
//! 3. `full`: the rest; the same measurement.
//! 4. `failover`: group 0 is SIGKILLed; podha's log gives the instant it judged each node dead
//!    (its threshold), a pod watch gives the instant each eligible pod disappeared.
//!
//! Pods: `--stateful-percent` of them belong to StatefulSets with one `sim-rwo`
//! (ReadWriteOnce, CSI) volume each: the pods podha moves. The rest belong to Deployments
//! without volumes: podha watches them and leaves them alone. Fleet nodes run no sim-csi node
//! agent, so pod templates carry `sim.podha.io/volumes-ready=true` and start without waiting for
//! their attachment (which the sim-csi controller still performs: the bench waits for every
//! VolumeAttachment to be attached before measuring).
//!
//! The bench prints figures; it asserts nothing. The cluster is taken down at the end, also on
//! error or when `--max-runtime` runs out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;

use crate::cluster::{Cluster, ClusterOptions, FleetGroup, Profile};
use crate::csi::RWO_STORAGE_CLASS;
use crate::failover::{Operator, apply_policy, install_crd};

mod failover;
mod identity;
mod report;
mod rest;
mod workloads;

use failover::{ActionTiming, failover};
use identity::{PodhaFlow, podha_identity};
use report::render;
use rest::{Size, measure_rest};
pub(super) use rest::{machine, status_kib};
use workloads::Workloads;

const BENCH_LABEL: &str = "podha-bench/scale";
const KIND_LABEL: &str = "podha-bench/kind";
const STATEFUL: &str = "stateful";
const STATELESS: &str = "stateless";
/// podha's identity: namespace, ServiceAccount and FlowSchema name.
const PODHA_NS: &str = "podha-bench";
const PODHA_SA: &str = "podha";
const FLOW_SCHEMA: &str = "podha-bench";
const POLICY: &str = "scale";
/// `safety.maxUnhealthy` of the bench policy: a 50-node group must not be held on a small fleet.
const MAX_UNHEALTHY: &str = "50%";

/// `podha-bench scale`: podha on a fleet of kwok nodes; memory, CPU and request rate at rest
/// at two sizes, then the time to handle a whole group of nodes dying at once.
#[derive(clap::Args, Debug)]
pub struct ScaleArgs {
    /// Fleet nodes at full size (rounded up to whole groups).
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Pods at full size.
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
    /// Nodes per kwok process; the failover kills one group.
    #[arg(long, default_value_t = 50)]
    pub group_size: usize,
    /// Share of pods in StatefulSets with one sim-rwo volume each (the pods podha moves); the
    /// rest are Deployment pods without volumes.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub stateful_percent: u32,
    #[arg(long, default_value_t = 10)]
    pub sts_replicas: u32,
    #[arg(long, default_value_t = 50)]
    pub deploy_replicas: u32,
    /// Namespaces the workloads are spread over.
    #[arg(long, default_value_t = 10)]
    pub namespaces: usize,
    /// Sim cluster directory (wiped at start).
    #[arg(long, default_value = "target/bench-scale-sim")]
    pub dir: PathBuf,
    /// The podha executable; default: `podha` next to this executable.
    #[arg(long)]
    pub operator: Option<PathBuf>,
    #[arg(long, default_value = "crds/podha.io_podhapolicies.yaml")]
    pub crd: PathBuf,
    /// Where the figures go as JSON.
    #[arg(long, default_value = "target/bench-scale.json")]
    pub out: PathBuf,
    /// Quiet time after the cluster reached a size, before measuring.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub settle: Duration,
    /// Measurement window at rest.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub window: Duration,
    /// How long to wait for the dead group's eligible pods to be deleted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub failover_timeout: Duration,
    /// Hard cap on the whole run; the cluster is taken down when it runs out.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "80m")]
    pub max_runtime: Duration,
    /// Client QPS of the controller manager and the scheduler during the run (burst twice
    /// that); 0 keeps the upstream 20 and 50. Only speeds up building the cluster.
    #[arg(long, default_value_t = 300)]
    pub client_qps: u32,
    /// sim-csi's simulated ControllerPublish time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub attach_delay: Duration,
    /// Directory of the control-plane binaries (default as `podha-sim up`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

/// Runs the benchmark, prints the table and writes the JSON file.
pub async fn run(args: ScaleArgs) -> anyhow::Result<()> {
    if args.group_size == 0 || args.nodes < args.group_size {
        bail!("--nodes must be at least --group-size (one group)");
    }
    let operator = match &args.operator {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("podha"))
            .ok_or_else(|| anyhow!("cannot locate podha; pass --operator"))?,
    };
    if !operator.is_file() {
        bail!(
            "podha not found at {} (build it: cargo build --release -p podha)",
            operator.display()
        );
    }
    std::fs::create_dir_all(&args.dir)?;
    let mut opts = ClusterOptions::new(&args.dir);
    opts.nodes = 1;
    opts.profile = Profile::Stock;
    opts.bin_dir = args.bin_dir.clone();
    opts.attach_delay = args.attach_delay;
    opts.detach_delay = args.attach_delay;
    say(format!(
        "starting a stock sim cluster in {}",
        args.dir.display()
    ));
    let started = Instant::now();
    let cluster = Cluster::up(opts)
        .await
        .context("starting the sim cluster")?;
    let outcome = tokio::time::timeout(args.max_runtime, bench(&cluster, &args, &operator)).await;
    say("taking the sim cluster down".to_string());
    let down = cluster.down();
    let report = match outcome {
        Ok(r) => r?,
        Err(_) => bail!(
            "--max-runtime {} ran out; figures so far are above",
            humantime::format_duration(args.max_runtime)
        ),
    };
    down.context("taking the sim cluster down")?;
    let text = render(&report);
    println!("{text}");
    let mut json = report.to_json(&args);
    json["run_seconds"] = json!(started.elapsed().as_secs());
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("written: {}", args.out.display());
    Ok(())
}

fn say(msg: String) {
    eprintln!("bench-scale: {msg}");
}

// ---- the run ----

#[derive(Debug, Clone)]
struct RestSample {
    step: &'static str,
    fleet_nodes: usize,
    pods: usize,
    podha_nodes: Option<f64>,
    rss_kib: u64,
    hwm_kib: u64,
    cpu_percent: f64,
    requests_per_s: f64,
    requests: f64,
    window: Duration,
    cluster_cpu_percent: BTreeMap<String, f64>,
    built_in: Duration,
    coverage: CoverageSample,
}

/// podha's coverage at rest: the pods it counts (`podha_pods`) at the end of the window, and
/// its workings-out during it (`podha_coverage_duration_seconds`).
#[derive(Debug, Clone, Default)]
struct CoverageSample {
    protected: Option<f64>,
    unprotected: Option<f64>,
    worked_out: f64,
    mean_seconds: Option<f64>,
    /// PodHAPolicy status writes in the window (the API server's count).
    status_writes: f64,
}

#[derive(Debug, Clone, Default)]
struct FailoverSample {
    group: String,
    nodes: usize,
    eligible: usize,
    others: usize,
    deleted: usize,
    others_deleted: usize,
    failed_seen: usize,
    held: bool,
    kill_to_first_failed: Option<f64>,
    kill_to_last_failed: Option<f64>,
    /// Per node with eligible pods: its last eligible pod gone minus its Failed instant.
    per_node: Vec<f64>,
    last_failed_to_last_deleted: Option<f64>,
    first_failed_to_last_deleted: Option<f64>,
    podha_act_mean: Option<f64>,
    /// Per kind of action: mean time in its API requests, and from podha's loop sending it to
    /// handling its result.
    action_timings: Vec<ActionTiming>,
    /// podha's requests at the API server from the kill to the end of the failover.
    apf: PodhaFlow,
    rss_after_kib: u64,
}

struct Report {
    rest: Vec<RestSample>,
    failover: Option<FailoverSample>,
    machine: String,
}

async fn bench(cluster: &Cluster, args: &ScaleArgs, operator: &Path) -> anyhow::Result<Report> {
    let client = cluster.client().await?;
    if args.client_qps > 0 {
        cluster
            .raise_client_qps(args.client_qps, args.client_qps * 2)
            .await?;
    }
    let mut podha = start_podha(cluster, &client, args, operator).await?;
    let mut report = Report {
        rest: Vec::new(),
        failover: None,
        machine: machine(),
    };

    let groups_full = args.nodes.div_ceil(args.group_size);
    let groups_half = groups_full / 2;
    let mut steps: Vec<(&'static str, usize, usize)> = vec![("base", 0, 0)];
    if groups_half > 0 {
        steps.push(("half", groups_half, args.pods * groups_half / groups_full));
    }
    steps.push(("full", groups_full, args.pods));

    let mut groups: Vec<FleetGroup> = Vec::new();
    let mut pods_now = 0;
    let mut workloads = Workloads::default();
    for (step, want_groups, want_pods) in steps {
        let t = Instant::now();
        if want_groups > groups.len() {
            say(format!(
                "{step}: adding {} nodes in {} groups",
                (want_groups - groups.len()) * args.group_size,
                want_groups - groups.len()
            ));
            let added = cluster
                .add_fleet(groups.len(), want_groups - groups.len(), args.group_size)
                .await?;
            groups.extend(added);
        }
        if want_pods > pods_now {
            let more = want_pods - pods_now;
            let stateful = more * args.stateful_percent as usize / 100;
            say(format!(
                "{step}: adding {more} pods ({stateful} StatefulSet pods with a {RWO_STORAGE_CLASS} volume)"
            ));
            workloads
                .create(&client, args, stateful, more - stateful)
                .await?;
            pods_now = want_pods;
            workloads.wait_ready(&client, &mut podha).await?;
        }
        let built_in = t.elapsed();
        let size = Size {
            step,
            fleet_nodes: groups.len() * args.group_size,
            pods: pods_now,
            built_in,
        };
        let sample = measure_rest(cluster, &client, &podha, size, args).await?;
        say(format!(
            "{step}: podha RSS {:.1} MiB, CPU {:.2} % of a core, {:.2} requests/s",
            sample.rss_kib as f64 / 1024.0,
            sample.cpu_percent,
            sample.requests_per_s
        ));
        report.rest.push(sample);
    }

    let victim = groups
        .first()
        .ok_or_else(|| anyhow!("no fleet group to kill"))?
        .clone();
    report.failover = Some(failover(cluster, &client, &mut podha, &victim, args).await?);
    drop(podha);
    Ok(report)
}

/// podha under its own identity, leading, with the benchmark's policy applied.
async fn start_podha(
    cluster: &Cluster,
    client: &kube::Client,
    args: &ScaleArgs,
    operator: &Path,
) -> anyhow::Result<Operator> {
    install_crd(client, &args.crd).await?;
    let kubeconfig = podha_identity(cluster, client).await?;
    let mut podha = Operator::start_as(
        operator,
        cluster,
        &kubeconfig,
        PODHA_NS,
        "podha-scale",
        &["--log-json"],
    )?;
    podha.wait_ready(Duration::from_secs(120)).await?;
    apply_policy(
        client,
        POLICY,
        // kwok nodes run no agent: the taint on the judgement alone, chosen explicitly.
        json!({
            "safety": { "maxUnhealthy": MAX_UNHEALTHY },
            "fencing": { "proof": "None" },
        }),
    )
    .await?;
    say(format!(
        "podha (pid {}) leads; policy {POLICY} with safety.maxUnhealthy {MAX_UNHEALTHY}",
        podha.pid()
    ));
    Ok(podha)
}
