//! Failover time side by side (`make bench-failover`): one sim cluster on the `stock` profile,
//! one podha process, and per mode a group of three nodes and a policy selecting only them.
//! The modes run at once; within a mode the trials run one after another, each with a fresh
//! StatefulSet pod and one RWO volume on a node that is then SIGKILLed and restarted afterwards.
//!
//! Trial k of n kills its node (k - 1/2)/n of the 10 s Lease renew cycle after a renewal, so
//! that the trials sample the cycle evenly.
//!
//! The clock starts at the kill and stops when the replacement pod is Running on a healthy node
//! and its VolumeAttachment there is attached (see [`crate::failover::measure`]). Phases are
//! read from outside, through the API, by [`podha::chaos::timeline`] (see [`Phase`]): detect =
//! kill → podha's first action (taint or fence, pod marked NotReady by podha, or pod deleted);
//! act = that → old pod deleted; detach = old pod deleted → volume detached from the dead node;
//! recover = detach → replacement Running with its volume attached.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::json;

use crate::cluster::{Cluster, ClusterOptions, Profile};
use podha::chaos::timeline::{Phase, Timeline};

use super::operator::{self, PodhaUnderTest};
use crate::failover::{apply_policy, measure, subject_statefulset};

#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// Modes to run: none, iomesh-like, default, fast, agent, bmc (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,iomesh-like,default,fast"
    )]
    pub modes: Vec<Mode>,
    /// Trials per mode.
    #[arg(long, default_value_t = 3)]
    pub trials: usize,
    /// How long a trial may take before it counts as not recovered.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How long the `none` mode waits (nothing recovers it; a shorter wait keeps runs short).
    #[arg(long, default_value = "8m", value_parser = humantime::parse_duration)]
    pub none_timeout: Duration,
    /// Cluster directory.
    #[arg(long, default_value = ".sim-bench")]
    pub dir: PathBuf,
    /// Control-plane profile; the comparison is meant for `stock`.
    #[arg(long, default_value = "stock")]
    pub profile: Profile,
    /// The podha executable (a release build measures what users run).
    #[arg(long, default_value = "target/release/podha")]
    pub operator: PathBuf,
    #[arg(long, default_value = "crds/podha.io_podhapolicies.yaml")]
    pub crd: PathBuf,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench-failover.json")]
    pub out: PathBuf,
    /// Kinds of node every mode runs on: kwok, real (comma-separated). Real nodes run a real
    /// kubelet and containerd and the writer workload in a container (root; `make node-deps
    /// node-images`); kwok and real rows of one run share the cluster and the podha process.
    #[arg(long, value_delimiter = ',', default_value = "kwok")]
    pub nodes: Vec<Nodes>,
    /// The real kubelets' nodeStatusUpdateFrequency (default: the kubelet's, 10s). A cluster
    /// setting, not podha's: the kubelet mounts a replacement's volume only after reporting it
    /// in the Node's volumesInUse, on this cycle (docs/benchmarks.md).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub node_status_update_frequency: Option<Duration>,
}

/// What a mode's nodes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Nodes {
    /// kwok nodes: no containers; the storage node side simulated.
    Kwok,
    /// Real nodes: kubelet, containerd, podha-csi's node plugin, the writer in a container.
    Real,
}

impl Nodes {
    pub fn name(self) -> &'static str {
        match self {
            Nodes::Kwok => "kwok",
            Nodes::Real => "real",
        }
    }
}

/// One mode on one kind of node: a group of three nodes and a policy selecting only them.
#[derive(Clone, Debug)]
pub struct Group {
    pub mode: Mode,
    pub kind: Nodes,
    pub nodes: Vec<String>,
}

impl Group {
    /// Its trials' namespaces are `<name>-<k>`.
    fn name(&self) -> String {
        match self.kind {
            Nodes::Kwok => self.mode.name().to_string(),
            Nodes::Real => format!("{}-real", self.mode.name()),
        }
    }
}

/// The groups of a run: every mode on every kind, kwok nodes numbered first (as the sim names
/// them), three nodes each.
pub(super) fn groups(modes: &[Mode], kinds: &[Nodes]) -> Vec<Group> {
    let kwok_groups = if kinds.contains(&Nodes::Kwok) {
        modes.len()
    } else {
        0
    };
    let mut groups = Vec::new();
    for &kind in kinds {
        for (i, &mode) in modes.iter().enumerate() {
            let first = match kind {
                Nodes::Kwok => i * 3,
                Nodes::Real => (kwok_groups + i) * 3,
            };
            let nodes = (1..=3).map(|k| format!("node-{}", first + k)).collect();
            groups.push(Group { mode, kind, nodes });
        }
    }
    groups
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// No operator.
    None,
    /// podha configured like IOMesh Pod HA: Node Ready only, 3 probes × 30 s, delete pods.
    IomeshLike,
    /// podha with its defaults (`[Lease, AgentHeartbeat]` every 2 s, 3 failures, a 15 s lease
    /// grace; the agent's proof with a 4 s margin). On real nodes the agents keep the chart's
    /// own timings (a 14 s isolation timeout, a 6 s watchdog, 3 s surveys); on kwok nodes they
    /// run as in `agent`.
    Default,
    /// Lease and kubelet TCP, 1 s probes, 3 failures, an 11 s lease grace, out-of-service taint.
    Fast,
    /// `fast` with the agent: Lease and agent heartbeat, and the out-of-service taint only once
    /// the node's podha agent proved the fence (`fencing.proof: Agent`, a 2 s margin; agents
    /// with the shortest timings the agent accepts: an 8 s isolation timeout, a 4 s watchdog
    /// in each node's BMC, 1 s peer surveys). The price of safety, beside `fast`. On real
    /// nodes podha is installed by its chart, agents and all (`super::operator`).
    Agent,
    /// Judged on probes alone (kubelet TCP, 1 s, 3 failures: no wait for the Lease) and proven
    /// by the node's BMC (`fencing.proof: BMC`): the out-of-service taint once its Redfish
    /// system says `Off` after podha's `ForceOff`. The sim's BMCs are the sushy-tools
    /// emulator, which applies a reset 0–11 s after it answers: each trial reports that delay
    /// (podha's `power_off` phase) beside the failover. With `powerCycle`: podha powers the
    /// machine on after the failover, and the next trial waits for it.
    Bmc,
}

/// The agents' isolation timeout in the `agent` mode: the shortest the agent accepts.
pub const AGENT_ISOLATION_TIMEOUT: Duration = podha::agent::MIN_ISOLATION_TIMEOUT;
/// Their watchdog's timeout: half the isolation timeout, more than the check interval (1 s)
/// plus their longest survey (2.5 s).
pub const AGENT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(4);
/// Their survey timeout: a small cluster on loopback.
pub const AGENT_SURVEY_TIMEOUT: Duration = Duration::from_secs(1);
/// The three together.
pub const SHORTEST_AGENT_TIMINGS: crate::chart_install::AgentTimings =
    crate::chart_install::AgentTimings {
        isolation: AGENT_ISOLATION_TIMEOUT,
        watchdog: AGENT_WATCHDOG_TIMEOUT,
        survey: AGENT_SURVEY_TIMEOUT,
    };

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::IomeshLike => "iomesh-like",
            Mode::Default => "default",
            Mode::Fast => "fast",
            Mode::Agent => "agent",
            Mode::Bmc => "bmc",
        }
    }

    /// Whether the mode's policy asks for the BMC's proof, so that its nodes need Redfish
    /// BMCs and Secrets.
    pub fn needs_bmcs(self) -> bool {
        self == Mode::Bmc
    }

    /// Whether the mode's policy asks for the agent's proof, so that its nodes need agents.
    pub fn needs_agents(self) -> bool {
        matches!(self, Mode::Default | Mode::Agent)
    }

    /// The policy spec (without selectors), or none for the `none` mode.
    fn spec(self) -> Option<serde_json::Value> {
        match self {
            Mode::None => None,
            Mode::IomeshLike => Some(json!({
                "detection": { "signals": ["NodeReady"], "interval": "30s", "failureThreshold": 3 },
                "action": "DeletePods",
                "fencing": {"proof": "None"},
            })),
            Mode::Default => Some(json!({})),
            Mode::Fast => Some(json!({
                "detection": {
                    "signals": ["Lease", "KubeletTCP"],
                    "interval": "1s",
                    "failureThreshold": 3,
                    // The kubelet (kwok) renews every 10 s: silence past 11 s is a missed renewal.
                    "leaseGracePeriod": "11s",
                    "tcpTimeout": "500ms",
                },
                "action": "OutOfServiceTaint",
                // The taint on the judgement alone: the detection's time, beside `agent`.
                "fencing": {"proof": "None"},
            })),
            Mode::Agent => Some(json!({
                "detection": {
                    "signals": ["Lease", "AgentHeartbeat"],
                    "interval": "1s",
                    "failureThreshold": 3,
                    "leaseGracePeriod": "11s",
                    "tcpTimeout": "500ms",
                },
                "action": "OutOfServiceTaint",
                "fencing": {"proof": "Agent", "agentMargin": "2s"},
            })),
            Mode::Bmc => Some(json!({
                "detection": {
                    "signals": ["KubeletTCP"],
                    "interval": "1s",
                    "failureThreshold": 3,
                    "tcpTimeout": "500ms",
                },
                "action": "OutOfServiceTaint",
                // podha powers the machine on after the failover: the next trial needs it.
                "fencing": {"proof": "BMC", "bmc": {"secretName": "bmc-{node}", "powerCycle": true}},
            })),
        }
    }
}

/// One trial's figures, seconds from the kill.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Trial {
    pub mode: Mode,
    pub nodes: Nodes,
    pub trial: usize,
    pub node: String,
    pub recovered_s: Option<f64>,
    pub waited_s: f64,
    pub detect_s: Option<f64>,
    pub act_s: Option<f64>,
    pub detach_s: Option<f64>,
    pub recover_s: Option<f64>,
    /// With the BMC's proof: the BMC's own delay, from accepting podha's `ForceOff` to saying
    /// `Off` (podha's `power_off` phase).
    pub bmc_apply_s: Option<f64>,
    /// Pods of the subject's name the controller manager deleted after podha deleted the
    /// subject: replacements (the API server's audit log, `audit::replacements_deleted`).
    pub replacements_deleted: usize,
    /// The fencing proof the out-of-service taint of this trial named (its
    /// `OutOfServiceTaintAdded` event), if it had one.
    pub proof: Option<String>,
    pub steps: Vec<(String, f64)>,
}

impl Trial {
    fn from_timeline(group: &Group, trial: usize, t: &Timeline) -> Self {
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        Trial {
            mode: group.mode,
            nodes: group.kind,
            trial,
            node: t.node.clone(),
            recovered_s: secs(t.recovered),
            waited_s: t.waited.as_secs_f64(),
            detect_s: secs(t.phase(Phase::Detect)),
            act_s: secs(t.phase(Phase::Act)),
            detach_s: secs(t.phase(Phase::Detach)),
            recover_s: secs(t.phase(Phase::Recover)),
            bmc_apply_s: None,
            replacements_deleted: 0,
            proof: None,
            steps: t
                .steps
                .iter()
                .map(|s| (s.what.clone(), s.at.as_secs_f64()))
                .collect(),
        }
    }
}

/// Per-mode summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub mode: Mode,
    pub nodes: Nodes,
    pub trials: usize,
    pub recovered: usize,
    pub min_s: Option<f64>,
    pub median_s: Option<f64>,
    pub max_s: Option<f64>,
    pub detect_median_s: Option<f64>,
    pub act_median_s: Option<f64>,
    pub detach_median_s: Option<f64>,
    pub recover_median_s: Option<f64>,
    /// With the BMC's proof: the median of the BMC's own delay, and of each trial's failover
    /// without it.
    pub bmc_apply_median_s: Option<f64>,
    pub without_bmc_apply_median_s: Option<f64>,
    /// iomesh-like median / this mode's median, on the same kind of node.
    pub speedup_vs_iomesh_like: Option<f64>,
    pub not_recovered_within_s: Option<f64>,
    /// Replacements the controller manager deleted, over every trial.
    pub replacements_deleted: usize,
    /// How many trials' taints named each fencing proof, e.g. `AgentSilent 5`.
    pub proofs: String,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn summarize(trials: &[Trial], rows: &[(Mode, Nodes)]) -> Vec<Summary> {
    let mut out: Vec<Summary> = rows
        .iter()
        .map(|&(mode, nodes)| {
            let of: Vec<&Trial> = trials
                .iter()
                .filter(|t| t.mode == mode && t.nodes == nodes)
                .collect();
            let totals: Vec<f64> = of.iter().filter_map(|t| t.recovered_s).collect();
            let phase =
                |f: fn(&Trial) -> Option<f64>| median(of.iter().filter_map(|t| f(t)).collect());
            let all_recovered = totals.len() == of.len() && !of.is_empty();
            Summary {
                mode,
                nodes,
                trials: of.len(),
                recovered: totals.len(),
                min_s: totals.iter().copied().reduce(f64::min),
                median_s: if all_recovered {
                    median(totals.clone())
                } else {
                    None
                },
                max_s: if all_recovered {
                    totals.iter().copied().reduce(f64::max)
                } else {
                    None
                },
                detect_median_s: phase(|t| t.detect_s),
                act_median_s: phase(|t| t.act_s),
                detach_median_s: phase(|t| t.detach_s),
                recover_median_s: phase(|t| t.recover_s),
                bmc_apply_median_s: phase(|t| t.bmc_apply_s),
                without_bmc_apply_median_s: phase(|t| {
                    t.recovered_s.zip(t.bmc_apply_s).map(|(r, b)| r - b)
                }),
                speedup_vs_iomesh_like: None,
                not_recovered_within_s: (!all_recovered)
                    .then(|| {
                        of.iter()
                            .filter(|t| t.recovered_s.is_none())
                            .map(|t| t.waited_s)
                            .reduce(f64::min)
                    })
                    .flatten(),
                replacements_deleted: of.iter().map(|t| t.replacements_deleted).sum(),
                proofs: proofs_named(&of),
            }
        })
        .collect();
    let bases: Vec<(Nodes, Option<f64>)> = out
        .iter()
        .filter(|s| s.mode == Mode::IomeshLike)
        .map(|s| (s.nodes, s.median_s))
        .collect();
    for s in &mut out {
        let base = bases.iter().find(|(n, _)| *n == s.nodes).and_then(|b| b.1);
        s.speedup_vs_iomesh_like = base.zip(s.median_s).map(|(b, m)| b / m);
    }
    out
}

/// `AgentSilent 5`: how many of `trials` had their taint behind each proof; `-` for none.
fn proofs_named(trials: &[&Trial]) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for t in trials {
        if let Some(p) = &t.proof {
            *counts.entry(p.as_str()).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return "-".to_string();
    }
    counts
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn render(summaries: &[Summary]) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut out = String::from(
        "| mode | nodes | trials | recovered | min s | median s | max s | detect | act | detach | recover | BMC apply | median without it | vs iomesh-like | replacements deleted | taint's proof |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let median = match (s.median_s, s.not_recovered_within_s) {
            (Some(m), _) => format!("{m:.1}"),
            (None, Some(t)) => format!("not recovered within {t:.0}s"),
            (None, None) => "-".to_string(),
        };
        let ratio = s
            .speedup_vs_iomesh_like
            .map_or("-".to_string(), |r| format!("{r:.1}x"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.mode.name(),
            s.nodes.name(),
            s.trials,
            s.recovered,
            f(s.min_s),
            median,
            f(s.max_s),
            f(s.detect_median_s),
            f(s.act_median_s),
            f(s.detach_median_s),
            f(s.recover_median_s),
            f(s.bmc_apply_median_s),
            f(s.without_bmc_apply_median_s),
            ratio,
            s.replacements_deleted,
            s.proofs
        ));
    }
    out
}

/// The fencing proof podha's latest `OutOfServiceTaintAdded` event of `node` since `since`
/// names (`...; fencing proof: AgentSilent)`), if any.
async fn taint_proof(
    client: &kube::Client,
    node: &str,
    since: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<Option<String>> {
    let events =
        crate::testkit::podha_events(client, "default", "OutOfServiceTaintAdded", node).await?;
    let latest = events
        .iter()
        .filter_map(|e| {
            let at = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0))?;
            (at >= since).then_some((at, e.note.as_deref().unwrap_or_default()))
        })
        .max_by_key(|(at, _)| *at);
    Ok(latest.and_then(|(_, note)| {
        let proof = note.split("fencing proof: ").nth(1)?;
        Some(proof.trim_end_matches(')').to_string())
    }))
}

/// The kubelet's (kwok's) Lease renew interval: a quarter of the 40 s lease.
const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// How long after a Lease renewal trial `k` of `n` kills its node: the middles of `n` equal
/// slices of the renew cycle, so that the trials sample where in the cycle a node can die
/// evenly (detection by Lease takes the grace minus the time since the last renewal) instead of
/// all landing at the same point.
fn kill_phase(k: usize, n: usize) -> Duration {
    RENEW_INTERVAL.mul_f64((k as f64 - 0.5) / n.max(1) as f64)
}

/// Runs the trials of one mode, one after another. A trial that fails to run (not a failover
/// that does not recover: that is a result) ends the mode; what was measured is kept.
async fn run_group(
    cluster: &Cluster,
    client: &kube::Client,
    podha: &PodhaUnderTest,
    group: &Group,
    args: &FailoverArgs,
) -> (Vec<Trial>, Option<anyhow::Error>) {
    let timeout = if group.mode == Mode::None {
        args.none_timeout
    } else {
        args.timeout
    };
    let mut trials = Vec::new();
    for k in 1..=args.trials {
        let ns = format!("{}-{k}", group.name());
        let started = Instant::now();
        let subject = match subject_statefulset("db", &group.nodes, group.kind == Nodes::Real) {
            Ok(s) => s,
            Err(e) => return (trials, Some(e)),
        };
        let power_off_before = power_off_phase(cluster, podha, group);
        let before_kill = k8s_openapi::jiff::Timestamp::now();
        let t = match measure(
            cluster,
            client,
            &ns,
            subject,
            timeout,
            Some(kill_phase(k, args.trials)),
            &|_| Ok(()),
        )
        .await
        {
            Ok(t) => t,
            Err(e) => return (trials, Some(e.context(ns))),
        };
        let mut trial = Trial::from_timeline(group, k, &t);
        if group.mode.needs_bmcs() {
            trial.bmc_apply_s = bmc_apply(power_off_before, power_off_phase(cluster, podha, group));
        }
        trial.proof = match taint_proof(client, &t.node, before_kill).await {
            Ok(proof) => proof,
            Err(e) => return (trials, Some(e.context("the taint's event"))),
        };
        trial.replacements_deleted = match cluster.audited_requests() {
            Ok(requests) => crate::cluster::audit::replacements_deleted(&requests, &ns, "db-0"),
            Err(e) => {
                return (
                    trials,
                    Some(anyhow::Error::from(e).context("the audit log")),
                );
            }
        };
        eprintln!(
            "[{ns}] {} after {:.1?}; the taint's proof: {}; replacements deleted by the \
             controller manager: {}",
            trial
                .recovered_s
                .map_or("not recovered".to_string(), |s| format!(
                    "recovered in {s:.1}s"
                )),
            started.elapsed(),
            trial.proof.as_deref().unwrap_or("none"),
            trial.replacements_deleted
        );
        trials.push(trial);
        if k < args.trials {
            // The next trial needs the group whole again: podha powers a BMC-fenced machine
            // on itself (powerCycle), and takes its taint off once it is back.
            let whole = if group.mode.needs_bmcs() {
                back_from_power_cycle(client, &t.node).await
            } else {
                let since = k8s_openapi::jiff::Timestamp::now();
                match cluster.start_node(&t.node).await {
                    Ok(()) => podha.agent_back(client, &t.node, since).await,
                    Err(e) => Err(e.into()),
                }
            };
            if let Err(e) = whole {
                return (trials, Some(e.context(format!("restarting {}", t.node))));
            }
            let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                kube::Api::all(client.clone());
            let _ = namespaces.delete(&ns, &Default::default()).await;
        }
    }
    (trials, None)
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    let mut modes = args.modes.clone();
    modes.sort();
    modes.dedup();
    let mut kinds = args.nodes.clone();
    kinds.sort();
    kinds.dedup();
    if args.trials == 0 {
        bail!("--trials must be at least 1");
    }
    if kinds.is_empty() {
        bail!("--nodes needs kwok, real or both");
    }
    operator::check_run(&modes, &kinds)?;
    let groups = groups(&modes, &kinds);
    let opts = cluster_options(&args, &groups)?;
    let status_update = kubelet_status_update(args.node_status_update_frequency);
    eprintln!(
        "starting a sim cluster of {} kwok and {} real nodes (profile {}; real kubelets' \
         nodeStatusUpdateFrequency {status_update}) in {}",
        opts.nodes,
        opts.real_nodes,
        args.profile,
        args.dir.display()
    );
    let cluster = Cluster::up(opts).await?;
    let result = async {
        let client = cluster.client().await?;
        let podha = PodhaUnderTest::start(&args, &cluster, &client, &groups).await?;
        for group in &groups {
            if let Some(spec) = group_policy(group, args.trials) {
                apply_policy(&client, &group.name(), spec).await?;
            }
        }
        bmc_secrets(&cluster, &client, &groups, &podha).await?;
        let runs = groups
            .iter()
            .map(|group| run_group(&cluster, &client, &podha, group, &args));
        let mut trials = Vec::new();
        let mut errors = Vec::new();
        for (measured, error) in futures::future::join_all(runs).await {
            trials.extend(measured);
            errors.extend(error);
        }
        anyhow::Ok((trials, errors))
    }
    .await;
    cluster.down()?;
    let (trials, errors) = result?;
    let rows: Vec<(Mode, Nodes)> = groups.iter().map(|g| (g.mode, g.kind)).collect();
    let summaries = summarize(&trials, &rows);
    let table = render(&summaries);
    println!("{table}");
    if kinds.contains(&Nodes::Real) {
        println!("real nodes: the kubelets' nodeStatusUpdateFrequency was {status_update}");
    }
    let json = json!({
        "profile": args.profile.to_string(),
        "kubelet_node_status_update_frequency": status_update,
        "trials": trials,
        "summary": summaries,
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("results written to {}", args.out.display());
    match errors.into_iter().next() {
        Some(e) => Err(e.context("some trials could not run; the figures above cover the others")),
        None => Ok(()),
    }
}

/// A cluster with three nodes per group, agents on the kwok nodes when a group needs them, and
/// what podha installed by its chart needs (`operator::cluster_options`).
fn cluster_options(args: &FailoverArgs, groups: &[Group]) -> anyhow::Result<ClusterOptions> {
    let mut opts = ClusterOptions::new(&args.dir);
    opts.profile = args.profile;
    let count = |kind| groups.iter().filter(|g| g.kind == kind).count() * 3;
    opts.nodes = count(Nodes::Kwok);
    opts.real_nodes = count(Nodes::Real);
    opts.node_status_update_frequency = args.node_status_update_frequency;
    opts.redfish_bmcs = groups.iter().any(|g| g.mode.needs_bmcs());
    if groups
        .iter()
        .any(|g| g.mode.needs_agents() && g.kind == Nodes::Kwok)
    {
        opts.agents = Some(crate::cluster::Agents {
            exe: args.operator.clone(),
            isolation_timeout: AGENT_ISOLATION_TIMEOUT,
            survey_timeout: Some(AGENT_SURVEY_TIMEOUT),
            watchdog_timeout: Some(AGENT_WATCHDOG_TIMEOUT),
        });
    }
    operator::cluster_options(&mut opts, groups)?;
    Ok(opts)
}

/// A BMC Secret for each node of a group whose mode asks for the BMC's proof, leading to its
/// system on the cluster's Redfish service, in podha's namespace, at the address podha reaches
/// it from where it runs (this machine, or a real node).
async fn bmc_secrets(
    cluster: &Cluster,
    client: &kube::Client,
    groups: &[Group],
    podha: &PodhaUnderTest,
) -> anyhow::Result<()> {
    let nodes: Vec<&String> = groups
        .iter()
        .filter(|g| g.mode.needs_bmcs())
        .flat_map(|g| &g.nodes)
        .collect();
    if nodes.is_empty() {
        return Ok(());
    }
    let access = cluster
        .redfish()
        .context("the cluster was started without Redfish BMCs")?;
    let access = match podha {
        PodhaUnderTest::Process(_) => access,
        PodhaUnderTest::Chart { .. } => access.from_nodes()?,
    };
    let namespace = podha.namespace();
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    for node in nodes {
        let secret = access.secret(node, node, namespace)?;
        secrets
            .create(&Default::default(), &secret)
            .await
            .with_context(|| format!("creating the BMC Secret of {node}"))?;
    }
    Ok(())
}

/// The sum and count of podha's `power_off` phase for the group's policy: the BMCs' delays so
/// far.
fn power_off_phase(cluster: &Cluster, podha: &PodhaUnderTest, group: &Group) -> (f64, f64) {
    let policy = format!("policy=\"{}\"", group.name());
    let filters = [policy.as_str(), "phase=\"power_off\""];
    let metrics = podha.metrics(cluster).unwrap_or_default();
    let of = |name: &str| crate::failover::metric_in(&metrics, name, &filters);
    (
        of("podha_failover_phase_duration_seconds_sum").unwrap_or(0.0),
        of("podha_failover_phase_duration_seconds_count").unwrap_or(0.0),
    )
}

/// Waits until podha powered `node` on again after its failover (`powerCycle`) and took its
/// taint off: the node Ready, untainted.
async fn back_from_power_cycle(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    use podha::api::NodeTaint;
    use podha::health::ReadyStatus;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let what = format!(
        "{node} back after its failover (Ready, untainted): podha powers it on (powerCycle)"
    );
    crate::testkit::wait_for(&what, Duration::from_secs(240), || async {
        let n = nodes.get(node).await?;
        let back =
            ReadyStatus::from_node(&n) == ReadyStatus::True && !NodeTaint::OutOfService.on(&n);
        Ok(back.then_some(()))
    })
    .await
}

/// A trial's BMC delay: what the `power_off` phase gained during it, when it gained exactly one
/// sample (a `ForceOff` podha sent and saw applied).
fn bmc_apply((sum0, count0): (f64, f64), (sum1, count1): (f64, f64)) -> Option<f64> {
    (count1 - count0 == 1.0).then_some(sum1 - sum0)
}

/// The policy of a group's mode (none for `none`), limited to the group's nodes and its trials'
/// namespaces.
fn group_policy(group: &Group, trials: usize) -> Option<serde_json::Value> {
    let mut spec = group.mode.spec()?;
    let namespaces: Vec<String> = (1..=trials)
        .map(|k| format!("{}-{k}", group.name()))
        .collect();
    spec["nodeSelector"] = json!({"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": group.nodes}
    ]});
    spec["namespaceSelector"] = json!({"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
    ]});
    // Trials kill the group's nodes one after another, each back before the next: with a
    // 3-node group, the recently-failed window would hold every trial after the first
    // (maxUnhealthy 30 % of 3 is 1). The benchmark measures one failover at a time; the window
    // is a safety rule tested on its own.
    spec["safety"] = json!({"unhealthyWindow": "0s"});
    Some(spec)
}

/// The real kubelets' status cycle as the results name it.
fn kubelet_status_update(frequency: Option<Duration>) -> String {
    match frequency {
        Some(every) => humantime::format_duration(every).to_string(),
        None => "10s (the kubelet's default)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_phases_are_the_middles_of_equal_slices_of_the_renew_cycle() {
        let phases: Vec<u128> = (1..=3).map(|k| kill_phase(k, 3).as_millis()).collect();
        assert_eq!(phases, [1666, 5000, 8333]);
        assert_eq!(kill_phase(1, 1), Duration::from_secs(5));
    }

    fn trial(mode: Mode, recovered: Option<f64>) -> Trial {
        Trial {
            mode,
            nodes: Nodes::Kwok,
            trial: 1,
            node: "n".into(),
            recovered_s: recovered,
            waited_s: 480.0,
            detect_s: recovered.map(|r| r / 2.0),
            act_s: Some(0.1),
            detach_s: None,
            recover_s: None,
            bmc_apply_s: None,
            replacements_deleted: 0,
            proof: None,
            steps: Vec::new(),
        }
    }

    #[test]
    fn the_summary_counts_the_proof_each_taint_named() {
        let with = |proof: Option<&str>| Trial {
            proof: proof.map(str::to_string),
            ..trial(Mode::Default, Some(20.0))
        };
        let trials = vec![
            with(Some("AgentSilent")),
            with(Some("AgentSilent")),
            with(Some("AgentAcknowledged")),
            with(None),
        ];
        let s = summarize(&trials, &[(Mode::Default, Nodes::Kwok)]);
        assert_eq!(s[0].proofs, "AgentAcknowledged 1, AgentSilent 2");
        assert!(render(&s).contains("| AgentAcknowledged 1, AgentSilent 2 |"));
        let none = summarize(&[with(None)], &[(Mode::Default, Nodes::Kwok)]);
        assert_eq!(none[0].proofs, "-");
    }

    #[test]
    fn the_bmc_mode_reports_the_bmcs_delay_and_the_failover_without_it() {
        let with = |recovered: f64, apply: f64| Trial {
            bmc_apply_s: Some(apply),
            ..trial(Mode::Bmc, Some(recovered))
        };
        let trials = vec![with(12.0, 7.0), with(9.0, 2.0), with(16.0, 10.5)];
        let s = summarize(&trials, &[(Mode::Bmc, Nodes::Kwok)]);
        assert_eq!(s[0].median_s, Some(12.0));
        assert_eq!(s[0].bmc_apply_median_s, Some(7.0));
        assert_eq!(s[0].without_bmc_apply_median_s, Some(5.5));
        assert!(
            render(&s).contains(
                "| bmc | kwok | 3 | 3 | 9.0 | 12.0 | 16.0 | 6.0 | 0.1 | - | - | 7.0 | 5.5 |"
            ),
            "{}",
            render(&s)
        );
        // A trial's delay: what the power_off phase gained, when it gained one sample.
        assert_eq!(bmc_apply((3.5, 1.0), (10.0, 2.0)), Some(6.5));
        assert_eq!(bmc_apply((3.5, 1.0), (3.5, 1.0)), None);
        assert_eq!(bmc_apply((3.5, 1.0), (12.0, 3.0)), None);
    }

    #[test]
    fn medians_ratios_and_honest_non_recovery() {
        let trials = vec![
            trial(Mode::None, None),
            trial(Mode::None, None),
            trial(Mode::IomeshLike, Some(450.0)),
            trial(Mode::IomeshLike, Some(470.0)),
            trial(Mode::IomeshLike, Some(460.0)),
            trial(Mode::Fast, Some(9.0)),
            trial(Mode::Fast, Some(11.0)),
            trial(Mode::Fast, Some(10.0)),
        ];
        let rows = [Mode::None, Mode::IomeshLike, Mode::Fast].map(|m| (m, Nodes::Kwok));
        let s = summarize(&trials, &rows);
        assert_eq!(s[0].median_s, None);
        assert_eq!(s[0].not_recovered_within_s, Some(480.0));
        assert_eq!(s[1].median_s, Some(460.0));
        assert_eq!(
            (s[2].min_s, s[2].median_s, s[2].max_s),
            (Some(9.0), Some(10.0), Some(11.0))
        );
        assert_eq!(s[2].speedup_vs_iomesh_like, Some(46.0));
        assert_eq!(s[2].detect_median_s, Some(5.0));
        let table = render(&s);
        assert!(table.contains("not recovered within 480s"), "{table}");
        assert!(
            table.contains("| fast | kwok | 3 | 3 | 9.0 | 10.0 | 11.0 |"),
            "{table}"
        );
        assert!(table.contains("46.0x"), "{table}");
    }

    #[test]
    fn kwok_and_real_groups_take_their_own_nodes_and_rows() {
        let g = groups(&[Mode::Default, Mode::Fast], &[Nodes::Kwok, Nodes::Real]);
        let names: Vec<String> = g.iter().map(Group::name).collect();
        assert_eq!(names, ["default", "fast", "default-real", "fast-real"]);
        assert_eq!(g[1].nodes, ["node-4", "node-5", "node-6"]);
        assert_eq!(g[2].nodes, ["node-7", "node-8", "node-9"]);
        let real_only = groups(&[Mode::Fast], &[Nodes::Real]);
        assert_eq!(real_only[0].nodes, ["node-1", "node-2", "node-3"]);

        let mut real = trial(Mode::Fast, Some(14.0));
        real.nodes = Nodes::Real;
        let trials = vec![trial(Mode::Fast, Some(10.0)), real];
        let s = summarize(
            &trials,
            &[(Mode::Fast, Nodes::Kwok), (Mode::Fast, Nodes::Real)],
        );
        assert_eq!(s[0].median_s, Some(10.0));
        assert_eq!(s[1].median_s, Some(14.0));
        assert!(render(&s).contains("| fast | real | 1 | 1 | 14.0 | 14.0 | 14.0 |"));
    }

    #[test]
    fn a_mode_with_one_unrecovered_trial_has_no_median() {
        let trials = vec![trial(Mode::Default, Some(60.0)), trial(Mode::Default, None)];
        let s = summarize(&trials, &[(Mode::Default, Nodes::Kwok)]);
        assert_eq!(s[0].median_s, None);
        assert_eq!(s[0].recovered, 1);
        assert_eq!(s[0].not_recovered_within_s, Some(480.0));
    }
}
