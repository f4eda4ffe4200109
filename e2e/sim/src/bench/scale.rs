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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{Cluster, ClusterOptions, FLEET_GROUP_LABEL, FleetGroup, Profile};
use crate::csi::{RWO_STORAGE_CLASS, VOLUMES_READY_ANNOTATION};
use crate::failover::{Operator, apply_policy, install_crd, metric_in};
use crate::testkit::create_namespace;

/// Label on every workload and pod the bench creates; pods also get [`KIND_LABEL`].
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
    install_crd(&client, &args.crd).await?;
    let kubeconfig = podha_identity(cluster, &client).await?;
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
        &client,
        POLICY,
        json!({ "safety": { "maxUnhealthy": MAX_UNHEALTHY } }),
    )
    .await?;
    say(format!(
        "podha (pid {}) leads; policy {POLICY} with safety.maxUnhealthy {MAX_UNHEALTHY}",
        podha.pid()
    ));
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

// ---- podha's own identity, so the API server counts its requests apart ----

/// A ServiceAccount bound to cluster-admin, a FlowSchema matching it, and a kubeconfig with a
/// token of it (TokenRequest, 24 h).
async fn podha_identity(cluster: &Cluster, client: &Client) -> anyhow::Result<PathBuf> {
    create_namespace(client, PODHA_NS).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), PODHA_NS);
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": PODHA_SA } }))?;
    create_ok(sas.create(&PostParams::default(), &sa).await)?;
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": FLOW_SCHEMA },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": PODHA_SA, "namespace": PODHA_NS }],
    }))?;
    create_ok(
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &crb)
            .await,
    )?;
    let fs: FlowSchema = serde_json::from_value(json!({
        "metadata": { "name": FLOW_SCHEMA },
        "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": { "name": "workload-high" },
            "distinguisherMethod": { "type": "ByUser" },
            "rules": [{
                "subjects": [{
                    "kind": "ServiceAccount",
                    "serviceAccount": { "name": PODHA_SA, "namespace": PODHA_NS },
                }],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "clusterScope": true, "namespaces": ["*"],
                }],
                "nonResourceRules": [{ "verbs": ["*"], "nonResourceURLs": ["*"] }],
            }],
        },
    }))?;
    create_ok(
        Api::<FlowSchema>::all(client.clone())
            .create(&PostParams::default(), &fs)
            .await,
    )?;
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": { "audiences": [], "expirationSeconds": 86_400 },
    }))?;
    let token = sas
        .create_token_request(PODHA_SA, &PostParams::default(), &request)
        .await
        .context("TokenRequest for podha")?
        .status
        .ok_or_else(|| anyhow!("TokenRequest without status"))?
        .token;
    let path = cluster.dir().join("podha.kubeconfig");
    let ca = cluster.dir().join("pki").join("ca.crt");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n    \
         certificate-authority: {}\nusers:\n- name: podha\n  user:\n    token: {token}\n\
         contexts:\n- name: podha\n  context:\n    cluster: sim\n    user: podha\n\
         current-context: podha\n",
        cluster.apiserver_url(),
        ca.display()
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn create_ok<T>(r: Result<T, kube::Error>) -> anyhow::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Requests of podha dispatched by the API server so far (all verbs, watches counted when
/// they start).
async fn podha_requests(client: &Client) -> anyhow::Result<f64> {
    Ok(PodhaFlow::read(client).await?.dispatched)
}

/// What the API server's Priority and Fairness filter counted for podha's FlowSchema so far.
/// Control-plane components of the sim authenticate as `system:masters` (the `exempt` level),
/// so podha's flow is the only one APF queues here.
#[derive(Debug, Clone, Copy, Default)]
struct PodhaFlow {
    dispatched: f64,
    /// Requests that waited in an APF queue and then ran, and their total wait.
    waited: f64,
    wait_seconds: f64,
    /// Non-watch requests executed, and their total execution time.
    executed: f64,
    execution_seconds: f64,
}

impl PodhaFlow {
    async fn read(client: &Client) -> anyhow::Result<Self> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        let text = client.request_text(req).await?;
        let flow = format!("flow_schema=\"{FLOW_SCHEMA}\"");
        let sum = |name: &str, extra: &str| metric_in(&text, name, &[&flow, extra]).unwrap_or(0.0);
        const WAIT: &str = "apiserver_flowcontrol_request_wait_duration_seconds";
        const EXEC: &str = "apiserver_flowcontrol_request_execution_seconds";
        Ok(Self {
            dispatched: sum("apiserver_flowcontrol_dispatched_requests_total", ""),
            waited: sum(&format!("{WAIT}_count"), "execute=\"true\""),
            wait_seconds: sum(&format!("{WAIT}_sum"), "execute=\"true\""),
            executed: sum(&format!("{EXEC}_count"), "type=\"regular\""),
            execution_seconds: sum(&format!("{EXEC}_sum"), "type=\"regular\""),
        })
    }

    /// What was counted between `earlier` and `self`.
    fn since(self, earlier: Self) -> Self {
        Self {
            dispatched: self.dispatched - earlier.dispatched,
            waited: self.waited - earlier.waited,
            wait_seconds: self.wait_seconds - earlier.wait_seconds,
            executed: self.executed - earlier.executed,
            execution_seconds: self.execution_seconds - earlier.execution_seconds,
        }
    }

    fn mean_wait(self) -> Option<f64> {
        (self.waited > 0.0).then(|| self.wait_seconds / self.waited)
    }

    fn mean_execution(self) -> Option<f64> {
        (self.executed > 0.0).then(|| self.execution_seconds / self.executed)
    }
}

// ---- /proc ----

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: i32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// CPU ticks of the sim cluster's processes, by kind (`kwok` sums every kwok).
fn cluster_ticks(cluster: &Cluster) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in cluster.processes().into_iter().filter(|p| p.alive) {
        let kind = if p.name.starts_with("kwok") {
            "kwok".to_string()
        } else if p.name.starts_with("csi-node") {
            "csi-node".to_string()
        } else {
            p.name.clone()
        };
        *out.entry(kind).or_default() += cpu_ticks(p.pid).unwrap_or(0);
    }
    out
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("{cpus} CPUs, {:.1} GiB RAM", mem as f64 / 1024.0 / 1024.0)
}

// ---- at rest ----

/// Where the run stands when it measures at rest.
struct Size {
    step: &'static str,
    fleet_nodes: usize,
    pods: usize,
    built_in: Duration,
}

async fn measure_rest(
    cluster: &Cluster,
    client: &Client,
    podha: &Operator,
    size: Size,
    args: &ScaleArgs,
) -> anyhow::Result<RestSample> {
    let Size {
        step,
        fleet_nodes,
        pods,
        built_in,
    } = size;
    say(format!(
        "{step}: settling {}, then measuring over {}",
        humantime::format_duration(args.settle),
        humantime::format_duration(args.window)
    ));
    tokio::time::sleep(args.settle).await;
    let pid = podha.pid();
    let hz = clock_ticks();
    let (cpu0, req0, cl0, t0) = (
        cpu_ticks(pid).ok_or_else(|| anyhow!("podha is gone"))?,
        podha_requests(client).await?,
        cluster_ticks(cluster),
        Instant::now(),
    );
    tokio::time::sleep(args.window).await;
    let (cpu1, req1, cl1, window) = (
        cpu_ticks(pid).ok_or_else(|| anyhow!("podha is gone"))?,
        podha_requests(client).await?,
        cluster_ticks(cluster),
        t0.elapsed(),
    );
    let secs = window.as_secs_f64();
    let cluster_cpu_percent = cl1
        .iter()
        .map(|(k, v)| {
            let before = cl0.get(k).copied().unwrap_or(0);
            (
                k.clone(),
                v.saturating_sub(before) as f64 / hz / secs * 100.0,
            )
        })
        .collect();
    Ok(RestSample {
        step,
        fleet_nodes,
        pods,
        podha_nodes: podha.metric("podha_nodes", &[]),
        rss_kib: status_kib(pid, "VmRSS").unwrap_or(0),
        hwm_kib: status_kib(pid, "VmHWM").unwrap_or(0),
        cpu_percent: (cpu1 - cpu0) as f64 / hz / secs * 100.0,
        requests: req1 - req0,
        requests_per_s: (req1 - req0) / secs,
        window,
        cluster_cpu_percent,
        built_in,
    })
}

// ---- workloads ----

#[derive(Default)]
struct Workloads {
    next: usize,
    statefulsets: usize,
    deployments: usize,
    stateful_pods: usize,
    pods: usize,
    namespaces: BTreeSet<String>,
}

impl Workloads {
    /// Creates StatefulSets holding `stateful` pods and Deployments holding `stateless` pods.
    async fn create(
        &mut self,
        client: &Client,
        args: &ScaleArgs,
        stateful: usize,
        stateless: usize,
    ) -> anyhow::Result<()> {
        let mut objects: Vec<(String, serde_json::Value)> = Vec::new();
        for (total, per, kind) in [
            (stateful, args.sts_replicas.max(1) as usize, STATEFUL),
            (stateless, args.deploy_replicas.max(1) as usize, STATELESS),
        ] {
            let mut left = total;
            while left > 0 {
                let replicas = left.min(per);
                left -= replicas;
                let k = self.next;
                self.next += 1;
                let ns = format!("scale-{}", k % args.namespaces.max(1));
                let obj = if kind == STATEFUL {
                    self.statefulsets += 1;
                    statefulset(&format!("db-{k}"), replicas)
                } else {
                    self.deployments += 1;
                    deployment(&format!("web-{k}"), replicas)
                };
                objects.push((ns, obj));
            }
        }
        for (ns, _) in &objects {
            if self.namespaces.insert(ns.clone()) {
                create_namespace(client, ns).await?;
            }
        }
        let c = client;
        futures::stream::iter(objects.into_iter().map(|(ns, obj)| async move {
            let pp = PostParams::default();
            if obj["kind"] == "StatefulSet" {
                let sts: StatefulSet = serde_json::from_value(obj)?;
                create_ok(
                    Api::<StatefulSet>::namespaced(c.clone(), &ns)
                        .create(&pp, &sts)
                        .await,
                )
            } else {
                let d: Deployment = serde_json::from_value(obj)?;
                create_ok(
                    Api::<Deployment>::namespaced(c.clone(), &ns)
                        .create(&pp, &d)
                        .await,
                )
            }
        }))
        .buffer_unordered(8)
        .collect::<Vec<anyhow::Result<()>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
        self.stateful_pods += stateful;
        self.pods += stateful + stateless;
        Ok(())
    }

    /// Waits until every pod is Ready and every StatefulSet volume attached.
    async fn wait_ready(&self, client: &Client, podha: &mut Operator) -> anyhow::Result<()> {
        let lp = ListParams::default().labels(BENCH_LABEL);
        let sts: Api<StatefulSet> = Api::all(client.clone());
        let deps: Api<Deployment> = Api::all(client.clone());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let started = Instant::now();
        let mut last_say = Instant::now();
        loop {
            let ready_sts: i64 = sts
                .list(&lp)
                .await?
                .items
                .iter()
                .map(|s| {
                    s.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0) as i64
                })
                .sum();
            let ready_deps: i64 = deps
                .list(&lp)
                .await?
                .items
                .iter()
                .map(|d| {
                    d.status
                        .as_ref()
                        .and_then(|s| s.ready_replicas)
                        .unwrap_or(0) as i64
                })
                .sum();
            let attached = vas
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                .count();
            let ready = (ready_sts + ready_deps) as usize;
            if ready >= self.pods && attached >= self.stateful_pods {
                say(format!(
                    "{ready} pods Ready, {attached} volumes attached after {:.0}s",
                    started.elapsed().as_secs_f64()
                ));
                return Ok(());
            }
            if last_say.elapsed() > Duration::from_secs(30) {
                last_say = Instant::now();
                say(format!(
                    "  {ready}/{} pods Ready, {attached}/{} volumes attached ({:.0}s)",
                    self.pods,
                    self.stateful_pods,
                    started.elapsed().as_secs_f64()
                ));
            }
            podha.alive()?;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

fn pod_template(name: &str, kind: &str) -> serde_json::Value {
    json!({
        "metadata": {
            "labels": { "app": name, BENCH_LABEL: "1", KIND_LABEL: kind },
            // No sim-csi node agent on fleet nodes: start without waiting for the attachment.
            "annotations": { VOLUMES_READY_ANNOTATION: "true" },
        },
        "spec": {
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": FLEET_GROUP_LABEL, "operator": "Exists" },
                ] }],
            } } },
            "containers": [{
                "name": "app",
                "image": "registry.invalid/podha/app:1",
                "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } },
            }],
        },
    })
}

fn statefulset(name: &str, replicas: usize) -> serde_json::Value {
    let mut template = pod_template(name, STATEFUL);
    template["spec"]["containers"][0]["volumeMounts"] =
        json!([{ "name": "data", "mountPath": "/data" }]);
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name, "labels": { BENCH_LABEL: "1" } },
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": { "app": name } },
            "template": template,
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": RWO_STORAGE_CLASS,
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    })
}

fn deployment(name: &str, replicas: usize) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "labels": { BENCH_LABEL: "1" } },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": pod_template(name, STATELESS),
        },
    })
}

// ---- the failover ----

struct Victim {
    node: String,
    stateful: bool,
}

async fn failover(
    cluster: &Cluster,
    client: &Client,
    podha: &mut Operator,
    group: &FleetGroup,
    args: &ScaleArgs,
) -> anyhow::Result<FailoverSample> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut victims: HashMap<String, Victim> = HashMap::new();
    for node in &group.nodes {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        for p in pods.list(&lp).await?.items {
            let (Some(uid), labels) = (p.metadata.uid.clone(), p.metadata.labels.as_ref()) else {
                continue;
            };
            let Some(kind) = labels.and_then(|l| l.get(KIND_LABEL)) else {
                continue;
            };
            victims.insert(
                uid,
                Victim {
                    node: node.clone(),
                    stateful: kind == STATEFUL,
                },
            );
        }
    }
    let eligible = victims.values().filter(|v| v.stateful).count();
    let others = victims.len() - eligible;
    say(format!(
        "failover: group {} ({} nodes) holds {eligible} StatefulSet pods and {others} others",
        group.label,
        group.nodes.len()
    ));

    // Every bench pod, so that a deleted Deployment pod would show too.
    let cfg = watcher::Config::default().labels(BENCH_LABEL);
    let mut events = watcher(pods.clone(), cfg).boxed();
    let synced_by = Instant::now() + Duration::from_secs(120);
    loop {
        match tokio::time::timeout_at(synced_by.into(), events.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => break,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => bail!("pod watch: {e}"),
            Ok(None) | Err(_) => bail!("pod watch did not sync within 120s"),
        }
    }

    let flow_before = PodhaFlow::read(client).await?;
    let killed = SystemTime::now();
    cluster.kill_fleet_group(group)?;
    say(format!(
        "failover: {} SIGKILLed; waiting up to {} for podha",
        group.process_name(),
        humantime::format_duration(args.failover_timeout)
    ));
    let deadline = Instant::now() + args.failover_timeout;
    let mut gone: HashMap<String, SystemTime> = HashMap::new();
    let mut last_say = Instant::now();
    while victims
        .iter()
        .any(|(uid, v)| v.stateful && !gone.contains_key(uid))
    {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        match next {
            Err(_) => break,
            Ok(None) => bail!("pod watch ended"),
            Ok(Some(Err(e))) => say(format!("pod watch error (kube-rs retries): {e}")),
            Ok(Some(Ok(watcher::Event::Delete(p)))) => {
                if let Some(uid) = p.metadata.uid
                    && victims.contains_key(&uid)
                {
                    gone.entry(uid).or_insert_with(SystemTime::now);
                }
            }
            Ok(Some(Ok(_))) => {}
        }
        if last_say.elapsed() > Duration::from_secs(15) {
            last_say = Instant::now();
            podha.alive()?;
            let deleted = gone
                .keys()
                .filter(|uid| victims.get(*uid).is_some_and(|v| v.stateful))
                .count();
            say(format!(
                "  {:.0}s after the kill: {deleted}/{eligible} StatefulSet pods deleted",
                since(killed, SystemTime::now()),
            ));
        }
    }
    // A few seconds more, so a wrongly deleted Deployment pod would be seen.
    let grace = Instant::now() + Duration::from_secs(5);
    while let Ok(Some(ev)) = tokio::time::timeout_at(grace.into(), events.next()).await {
        if let Ok(watcher::Event::Delete(p)) = ev
            && let Some(uid) = p.metadata.uid
            && victims.contains_key(&uid)
        {
            gone.entry(uid).or_insert_with(SystemTime::now);
        }
    }
    drop(events);
    let apf = PodhaFlow::read(client).await?.since(flow_before);

    let log = podha_log(&podha.log)?;
    let mut failed_at: BTreeMap<String, SystemTime> = BTreeMap::new();
    let mut held = false;
    for line in &log {
        let msg = line.message.as_str();
        if msg == "node judged dead"
            && let Some(node) = line.field("node")
            && group.nodes.iter().any(|n| n == node)
        {
            failed_at.entry(node.to_string()).or_insert(line.at);
        }
        if msg == "action held" && line.at > killed {
            held = true;
        }
    }
    let mut last_gone_by_node: BTreeMap<&str, SystemTime> = BTreeMap::new();
    for (uid, at) in &gone {
        if let Some(v) = victims.get(uid)
            && v.stateful
        {
            let e = last_gone_by_node.entry(v.node.as_str()).or_insert(*at);
            *e = (*e).max(*at);
        }
    }
    let mut per_node: Vec<f64> = last_gone_by_node
        .iter()
        .filter_map(|(node, at)| Some(since(*failed_at.get(*node)?, *at)))
        .collect();
    per_node.sort_by(f64::total_cmp);
    let first_failed = failed_at.values().min().copied();
    let last_failed = failed_at.values().max().copied();
    let last_gone = last_gone_by_node.values().max().copied();
    let deleted = gone
        .keys()
        .filter(|u| victims.get(*u).is_some_and(|v| v.stateful))
        .count();
    Ok(FailoverSample {
        group: group.label.clone(),
        nodes: group.nodes.len(),
        eligible,
        others,
        deleted,
        others_deleted: gone.len() - deleted,
        failed_seen: failed_at.len(),
        held,
        kill_to_first_failed: first_failed.map(|t| since(killed, t)),
        kill_to_last_failed: last_failed.map(|t| since(killed, t)),
        per_node,
        last_failed_to_last_deleted: last_failed.zip(last_gone).map(|(a, b)| since(a, b)),
        first_failed_to_last_deleted: first_failed.zip(last_gone).map(|(a, b)| since(a, b)),
        podha_act_mean: podha.phase_mean(POLICY, "act"),
        action_timings: action_timings(podha),
        apf,
        rss_after_kib: status_kib(podha.pid(), "VmRSS").unwrap_or(0),
    })
}

/// podha's timing of one kind of action over the run.
#[derive(Debug, Clone)]
struct ActionTiming {
    kind: &'static str,
    requests_mean: Option<f64>,
    latency_mean: Option<f64>,
}

fn action_timings(podha: &Operator) -> Vec<ActionTiming> {
    ["taint_node", "mark_pod_not_ready", "delete_pod"]
        .into_iter()
        .map(|kind| {
            let filter = format!("kind=\"{kind}\"");
            let mean = |name| podha.histogram_mean(name, &[filter.as_str()]);
            ActionTiming {
                kind,
                requests_mean: mean("podha_action_request_duration_seconds"),
                latency_mean: mean("podha_action_latency_seconds"),
            }
        })
        .collect()
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
fn since(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// One line of podha's JSON log.
struct LogLine {
    at: SystemTime,
    message: String,
    fields: serde_json::Value,
}

impl LogLine {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name)?.as_str()
    }
}

fn podha_log(path: &Path) -> anyhow::Result<Vec<LogLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let ts: k8s_openapi::jiff::Timestamp = v.get("timestamp")?.as_str()?.parse().ok()?;
            let fields = v.get("fields")?.clone();
            Some(LogLine {
                at: SystemTime::from(ts),
                message: fields.get("message")?.as_str()?.to_string(),
                fields,
            })
        })
        .collect())
}

// ---- output ----

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(i).copied()
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2}s"))
}

fn render(r: &Report) -> String {
    let mut out = format!(
        "\npodha at scale (sim cluster, stock profile; {})\n\n",
        r.machine
    );
    out.push_str(
        "step   fleet nodes   pods    podha sees  podha RSS  podha CPU    podha req/s  \
         apiserver CPU  all sim CPU\n",
    );
    for s in &r.rest {
        let api = s
            .cluster_cpu_percent
            .get("kube-apiserver")
            .copied()
            .unwrap_or(0.0);
        let all: f64 = s.cluster_cpu_percent.values().sum();
        out.push_str(&format!(
            "{:<6} {:>11}  {:>6}  {:>10}  {:>6.1} MiB  {:>6.2} %  {:>12.2}  {:>11.0} %  {:>9.0} %\n",
            s.step,
            s.fleet_nodes,
            s.pods,
            s.podha_nodes.map_or("-".into(), |n| format!("{n:.0} nodes")),
            s.rss_kib as f64 / 1024.0,
            s.cpu_percent,
            s.requests_per_s,
            api,
            all,
        ));
    }
    if let Some(w) = r.rest.first() {
        out.push_str(&format!(
            "(at rest: {:.0} s window after settling; CPU in % of one core; requests counted by \
             the API server for podha's ServiceAccount)\n",
            w.window.as_secs_f64()
        ));
    }
    if let Some(f) = &r.failover {
        out.push_str(&format!(
            "\nfailover: group {} ({} nodes, one kwok) SIGKILLed; {} eligible StatefulSet pods \
             (one {RWO_STORAGE_CLASS} volume each), {} Deployment pods without volumes\n",
            f.group, f.nodes, f.eligible, f.others
        ));
        let mut rows = vec![
            (
                "nodes judged dead by podha".to_string(),
                format!("{}/{}", f.failed_seen, f.nodes),
            ),
            (
                "kill -> first node Failed".to_string(),
                secs(f.kill_to_first_failed),
            ),
            (
                "kill -> last node Failed".to_string(),
                secs(f.kill_to_last_failed),
            ),
            (
                "threshold -> node's eligible pods deleted, median".to_string(),
                secs(quantile(&f.per_node, 0.5)),
            ),
            (
                "threshold -> node's eligible pods deleted, p90".to_string(),
                secs(quantile(&f.per_node, 0.9)),
            ),
            (
                "threshold -> node's eligible pods deleted, max".to_string(),
                secs(f.per_node.last().copied()),
            ),
            (
                "last Failed -> last eligible pod deleted".to_string(),
                secs(f.last_failed_to_last_deleted),
            ),
            (
                "first Failed -> last eligible pod deleted".to_string(),
                secs(f.first_failed_to_last_deleted),
            ),
            (
                "podha's own act phase (mean)".to_string(),
                secs(f.podha_act_mean),
            ),
        ];
        for t in &f.action_timings {
            rows.push((
                format!("{}: API requests / sent->handled (mean)", t.kind),
                format!("{} / {}", secs(t.requests_mean), secs(t.latency_mean)),
            ));
        }
        rows.extend([
            (
                "podha's requests at the API server (non-watch)".to_string(),
                format!("{:.0}", f.apf.executed),
            ),
            (
                "  APF queue wait / execution (mean)".to_string(),
                format!(
                    "{} / {}",
                    secs(f.apf.mean_wait()),
                    secs(f.apf.mean_execution())
                ),
            ),
            (
                "eligible pods deleted".to_string(),
                format!("{}/{}", f.deleted, f.eligible),
            ),
            (
                "other pods deleted".to_string(),
                f.others_deleted.to_string(),
            ),
            (
                "actions held".to_string(),
                if f.held { "yes" } else { "no" }.to_string(),
            ),
            (
                "podha RSS after the failover".to_string(),
                format!("{:.1} MiB", f.rss_after_kib as f64 / 1024.0),
            ),
        ]);
        for (k, v) in rows {
            out.push_str(&format!("  {k:<50} {v:>10}\n"));
        }
    }
    out
}

impl Report {
    fn to_json(&self, args: &ScaleArgs) -> serde_json::Value {
        let rest: Vec<serde_json::Value> = self
            .rest
            .iter()
            .map(|s| {
                json!({
                    "step": s.step,
                    "fleet_nodes": s.fleet_nodes,
                    "pods": s.pods,
                    "podha_nodes": s.podha_nodes,
                    "podha_rss_mib": s.rss_kib as f64 / 1024.0,
                    "podha_peak_rss_mib": s.hwm_kib as f64 / 1024.0,
                    "podha_cpu_percent_of_core": s.cpu_percent,
                    "podha_requests": s.requests,
                    "podha_requests_per_second": s.requests_per_s,
                    "window_seconds": s.window.as_secs_f64(),
                    "sim_cpu_percent_of_core": s.cluster_cpu_percent,
                    "build_seconds": s.built_in.as_secs_f64(),
                })
            })
            .collect();
        let failover = self.failover.as_ref().map(|f| {
            json!({
                "group": f.group,
                "nodes": f.nodes,
                "eligible_pods": f.eligible,
                "other_pods": f.others,
                "eligible_deleted": f.deleted,
                "others_deleted": f.others_deleted,
                "nodes_failed_seen": f.failed_seen,
                "held": f.held,
                "kill_to_first_failed_seconds": f.kill_to_first_failed,
                "kill_to_last_failed_seconds": f.kill_to_last_failed,
                "threshold_to_deleted_per_node_seconds": f.per_node,
                "threshold_to_deleted_median_seconds": quantile(&f.per_node, 0.5),
                "threshold_to_deleted_p90_seconds": quantile(&f.per_node, 0.9),
                "threshold_to_deleted_max_seconds": f.per_node.last(),
                "last_failed_to_last_deleted_seconds": f.last_failed_to_last_deleted,
                "first_failed_to_last_deleted_seconds": f.first_failed_to_last_deleted,
                "podha_act_phase_mean_seconds": f.podha_act_mean,
                "podha_action_timings": f.action_timings.iter().map(|t| json!({
                    "kind": t.kind,
                    "api_requests_mean_seconds": t.requests_mean,
                    "sent_to_handled_mean_seconds": t.latency_mean,
                })).collect::<Vec<_>>(),
                "podha_apf": {
                    "dispatched": f.apf.dispatched,
                    "waited": f.apf.waited,
                    "wait_mean_seconds": f.apf.mean_wait(),
                    "executed_non_watch": f.apf.executed,
                    "execution_mean_seconds": f.apf.mean_execution(),
                },
                "podha_rss_after_mib": f.rss_after_kib as f64 / 1024.0,
            })
        });
        json!({
            "machine": self.machine,
            "profile": "stock",
            "args": {
                "nodes": args.nodes,
                "pods": args.pods,
                "group_size": args.group_size,
                "stateful_percent": args.stateful_percent,
                "sts_replicas": args.sts_replicas,
                "deploy_replicas": args.deploy_replicas,
                "namespaces": args.namespaces,
                "client_qps": args.client_qps,
                "settle_seconds": args.settle.as_secs_f64(),
                "window_seconds": args.window.as_secs_f64(),
            },
            "policy": { "name": POLICY, "safety.maxUnhealthy": MAX_UNHEALTHY, "detection": "defaults" },
            "rest": rest,
            "failover": failover,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_ranks() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.5), Some(3.0));
        assert_eq!(quantile(&v, 1.0), Some(5.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn json_log_lines_parse() {
        let dir = std::env::temp_dir().join(format!("podha-scale-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("podha.log");
        std::fs::write(
            &p,
            "{\"timestamp\":\"2025-01-02T03:04:05.123456Z\",\"level\":\"WARN\",\"fields\":\
             {\"message\":\"node judged dead\",\"policy\":\"scale\",\"node\":\"fleet-0-1\"}}\n\
             not json\n",
        )
        .unwrap();
        let lines = podha_log(&p).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].field("node"), Some("fleet-0-1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn since_is_signed() {
        let a = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let b = SystemTime::UNIX_EPOCH + Duration::from_secs(12);
        assert_eq!(since(a, b), 2.0);
        assert_eq!(since(b, a), -2.0);
    }
}
