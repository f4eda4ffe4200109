//! podha on the sim cluster's real control plane (profile `fast`): a dead node's stateful pods
//! come back on a healthy node, and what must not be touched is not.
//!
//! One cluster of 28 nodes, each with a podha agent, serves every scenario; each scenario has
//! its own namespace, its own pair of nodes (pods pinned with node affinity) and its own
//! PodHAPolicy selecting only those nodes and that namespace, so the scenarios run in parallel.
//! At most 15 of 28 nodes can be dead at once (one per scenario, two in one), below the node
//! lifecycle controller's 55 % "partial disruption" threshold. A pair freed by a finished
//! scenario is watched, healthy, through the scenarios that disturb podha's leader and cut podha
//! off from the API server.
//!
//! Two operator replicas run in this process against the cluster (leader election on a Lease):
//! only the leader writes. They authenticate as the chart's ServiceAccount, bound to the chart's
//! ClusterRole and Roles as `helm template` renders them (`$PODHA_HELM`, built by `make helm`),
//! so a verb the chart lacks fails the scenario that needs it. The binaries must have been built with `make k8s` and the
//! `podha-sim` executable with `cargo build -p podha-sim` (`make test` does both); without them
//! every test fails saying so.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use libtest_mimic::{Arguments, Failed, Trial};
use podha::api::{OUT_OF_SERVICE_TAINT_KEY, PodHAPolicy, TAINT_MARKER_ANNOTATION};
use podha::leader::LeaderConfig;
use podha_sim::failover::{http_get, install_crd};
use podha_sim::relay::Relay;
use podha_sim::testkit::*;
use serde_json::json;
use tokio::sync::watch;

#[path = "failover/agent.rs"]
mod agent;
#[path = "failover/examples.rs"]
mod examples;
#[path = "failover/faults_without_heartbeat.rs"]
mod faults_without_heartbeat;
#[path = "failover/fencing.rs"]
mod fencing;
#[path = "failover/heartbeats.rs"]
mod heartbeats;
#[path = "failover/holds.rs"]
mod holds;
#[path = "failover/moves.rs"]
mod moves;
#[path = "failover/pause.rs"]
mod pause;
#[path = "failover/pod_security.rs"]
mod pod_security;
#[path = "failover/policy_edits.rs"]
mod policy_edits;
#[path = "failover/prometheus.rs"]
mod prometheus;
#[path = "failover/replicas.rs"]
mod replicas;

const NODES: usize = 28;
/// The attach/detach controller's force-detach wait (maxWaitForUnmountDuration), plus margin.
const STOCK_DETACH_WAIT: Duration = Duration::from_secs(8 * 60);

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // Every scenario mostly waits; run them all at once.
    args.test_threads.get_or_insert(8);
    let shared = Arc::new(
        SharedCluster::new(env!("CARGO_TARGET_TMPDIR"), "podha-failover", NODES, None).with_agents(
            env!("CARGO_BIN_EXE_podha"),
            agent::ISOLATION_TIMEOUT,
            agent::WATCHDOG_TIMEOUT,
            agent::SURVEY_TIMEOUT,
        ),
    );
    let operators = Arc::new(Operators::default());
    type Scenario = fn(&SharedCluster, &Operators) -> Result<(), Failed>;
    let scenarios: [(&str, Scenario); 16] = [
        (
            "api_server_rejects_bad_policies_with_clear_messages",
            bad_policies,
        ),
        (
            "every_policy_in_examples_is_accepted_by_the_api_server_as_written",
            examples::accepted_as_written,
        ),
        (
            "the_chart_refuses_a_namespace_whose_pod_security_refuses_the_agent",
            pod_security::refused_where_the_agent_cannot_run,
        ),
        (
            "statefulset_delete_pods_moves_the_pod_after_the_detach_wait",
            moves::sts_delete_pods,
        ),
        (
            "statefulset_out_of_service_taint_detaches_at_once_and_is_removed",
            moves::sts_taint,
        ),
        (
            "deployment_delete_pods_recovers",
            moves::deployment_delete_pods,
        ),
        (
            "pods_that_must_not_move_keep_their_objects",
            holds::untouched_pods,
        ),
        (
            "node_back_before_the_threshold_deletes_nothing",
            holds::flapping_node,
        ),
        (
            "dry_run_deletes_nothing_and_says_what_it_would_do",
            holds::dry_run,
        ),
        (
            "too_many_unhealthy_nodes_hold_every_action",
            holds::too_many_unhealthy,
        ),
        (
            "prometheus_scrapes_a_failover_and_every_query_has_data",
            prometheus::prometheus_scrapes_a_failover,
        ),
        (
            "a_policy_switched_to_the_taint_mid_incident_acts_on_it",
            policy_edits::switched_to_the_taint_mid_incident,
        ),
        (
            "a_node_is_held_until_the_cloud_or_an_external_fence_proves_it_off",
            fencing::held_until_the_cloud_reports_the_node_shut_down,
        ),
        (
            "the_agent_fences_before_the_out_of_service_taint",
            agent::fences_before_the_taint,
        ),
        (
            "a_paused_policy_and_a_paused_node_act_only_once_unpaused",
            pause::paused_policy_and_node,
        ),
        (
            "judged_on_heartbeats_alone_a_node_moves_only_once_its_agent_acknowledged_the_fence",
            heartbeats::acknowledged_fence_follows_a_heartbeat_judgement,
        ),
    ];
    let trials = scenarios
        .into_iter()
        .map(|(name, f)| {
            let (shared, operators) = (shared.clone(), operators.clone());
            Trial::test(name, move || f(&shared, &operators))
        })
        .collect();
    let mut failed = libtest_mimic::run(&args, trials).has_failed();
    // These disturb every scenario's leader, or read what the others did, so they run after
    // the others, one at a time.
    let last: [(&str, Scenario); 6] = [
        (
            "judged_on_probes_alone_a_healthy_pair_is_watched_through_the_faults_that_follow",
            faults_without_heartbeat::watch_a_healthy_pair,
        ),
        ("two_replicas_only_the_leader_writes", replicas::one_leader),
        (
            "api_server_blip_is_no_node_death_and_leaves_podha_watching",
            holds::api_server_blip,
        ),
        (
            "leader_change_mid_failover_repeats_no_action",
            replicas::leader_change,
        ),
        (
            "judged_on_probes_alone_no_healthy_node_is_touched_through_leader_and_api_server_faults",
            faults_without_heartbeat::nothing_done_to_the_healthy_pair,
        ),
        (
            "no_agent_fenced_a_node_podha_hears",
            agent::no_agent_fenced_a_node_podha_hears,
        ),
    ];
    for (name, f) in last {
        let (shared, operators) = (shared.clone(), operators.clone());
        let trial = Trial::test(name, move || f(&shared, &operators));
        failed |= libtest_mimic::run(&args, vec![trial]).has_failed();
    }
    // Last: whatever the scenarios made podha do, the chart's RBAC allowed it.
    let (shared_c, operators_c) = (shared.clone(), operators.clone());
    let trial = Trial::test("chart_rbac_allows_every_request_podha_made", move || {
        chart_rbac_allowed_everything(&shared_c, &operators_c)
    });
    failed |= libtest_mimic::run(&args, vec![trial]).has_failed();
    operators.stop();
    shared.teardown(failed);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The replicas' log (every failed request is logged with the API server's message) holds no
/// request the chart's RBAC refused: a verb the chart lacks shows up here even when a scenario
/// still passes through a slower path (e.g. KCM marking a pod NotReady after 50 s).
fn chart_rbac_allowed_everything(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let cluster = shared.get()?;
    ops.get(cluster)?;
    let log = cluster.logs_dir().join("podha.log");
    let text = std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let who = format!(
        "User \"system:serviceaccount:default:{}\" cannot",
        podha_sim::chart_rbac::RELEASE
    );
    let denied: Vec<&str> = text.lines().filter(|l| l.contains(&who)).take(5).collect();
    if !denied.is_empty() {
        return Err(format!(
            "the chart's RBAC refused requests podha made (see {}):\n{}",
            log.display(),
            denied.join("\n")
        )
        .into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Two operator replicas in this process.

struct Replica {
    identity: String,
    http: SocketAddr,
    /// Its shutdown signal and task, replaced on restart.
    running: Mutex<Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>>,
}

#[derive(Default)]
struct Operators {
    started: OnceLock<Result<Vec<Replica>, String>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: OnceLock<tokio::runtime::Handle>,
    config: OnceLock<kube::Config>,
    /// The replicas reach the API server through this relay, so a scenario can cut them off.
    relay: OnceLock<Relay>,
}

/// Starts one podha replica on `handle`; it runs until its sender says stop.
fn launch(
    handle: &tokio::runtime::Handle,
    config: kube::Config,
    identity: &str,
    http: SocketAddr,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let mut leader = LeaderConfig::new("default", identity);
    leader.lease_duration = Duration::from_secs(4);
    leader.renew_grace = Duration::from_secs(2);
    let opts = podha::runtime::Options {
        http_addr: http,
        leader,
        controller_name: "podha".into(),
    };
    let name = identity.to_string();
    let task = handle.spawn(async move {
        let client = match kube::Client::try_from(config) {
            Ok(client) => client,
            Err(e) => return eprintln!("podha replica {name}: no client: {e}"),
        };
        let shutdown = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        if let Err(e) = podha::runtime::run(client, opts, shutdown).await {
            eprintln!("podha replica {name} stopped: {e}");
        }
    });
    (stop_tx, task)
}

impl Operators {
    /// Installs the CRD and starts both replicas, once.
    fn get(&self, cluster: &podha_sim::cluster::Cluster) -> Result<&[Replica], String> {
        self.started
            .get_or_init(|| {
                self.start(cluster)
                    .map_err(|e| format!("could not start podha: {e:#}"))
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    fn start(&self, cluster: &podha_sim::cluster::Cluster) -> anyhow::Result<Vec<Replica>> {
        let log = cluster.logs_dir().join("podha.log");
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,podha=debug"))
            .with_writer(Mutex::new(file))
            .with_ansi(false)
            .try_init();
        eprintln!("podha replicas log to {}", log.display());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let config = rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            // The committed manifest (a unit test keeps it equal to the generated one), as a
            // user would apply it.
            let manifest =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/podha.io_podhapolicies.yaml");
            install_crd(&kube::Client::try_from(config.clone())?, &manifest).await?;
            // The replicas run as the chart's ServiceAccount, under its rendered RBAC.
            let chart = podha_sim::chart_install::chart_dir();
            let mut config = podha_sim::chart_rbac::service_account_config(
                cluster,
                &podha_sim::chart_rbac::helm_path()?,
                &chart,
                "default",
                podha::leader::DEFAULT_LEASE_NAME,
                &[],
                &config,
            )?;
            let relay = Relay::start(cluster.apiserver_addr()).await?;
            config.cluster_url = relay.url().parse()?;
            anyhow::Ok((config, relay))
        })?;
        let (config, relay) = config;
        let _ = self.relay.set(relay);
        let mut replicas = Vec::new();
        for identity in ["podha-a", "podha-b"] {
            let http = free_port()?;
            let running = launch(rt.handle(), config.clone(), identity, http);
            replicas.push(Replica {
                identity: identity.to_string(),
                http,
                running: Mutex::new(Some(running)),
            });
        }
        let _ = self.handle.set(rt.handle().clone());
        let _ = self.config.set(config);
        *self.runtime.lock().map_err(|_| anyhow!("poisoned"))? = Some(rt);
        // Ready once caches are synced and one of them leads.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = replicas
                .iter()
                .all(|r| http_get(r.http, "/readyz").is_ok_and(|b| b.contains("ready")));
            if leaders(&replicas).len() == 1 && ready {
                return Ok(replicas);
            }
            if Instant::now() > deadline {
                bail!(
                    "podha replicas not ready with one leader within 60s (see {})",
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops one replica and waits until it has returned (its lease released).
    async fn stop_replica(&self, replica: &Replica) -> anyhow::Result<()> {
        let running = replica
            .running
            .lock()
            .map_err(|_| anyhow!("poisoned"))?
            .take();
        if let Some((stop, task)) = running {
            let _ = stop.send(true);
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .context("replica did not stop")??;
        }
        Ok(())
    }

    /// Starts a stopped replica again, same identity and port.
    fn restart_replica(&self, replica: &Replica) -> anyhow::Result<()> {
        let (Some(handle), Some(config)) = (self.handle.get(), self.config.get()) else {
            bail!("operators not started");
        };
        let mut running = replica.running.lock().map_err(|_| anyhow!("poisoned"))?;
        if running.is_none() {
            *running = Some(launch(
                handle,
                config.clone(),
                &replica.identity,
                replica.http,
            ));
        }
        Ok(())
    }

    fn relay(&self) -> anyhow::Result<&Relay> {
        self.relay.get().context("operators not started")
    }

    fn stop(&self) {
        if let Some(replicas) = self.started.get().and_then(|r| r.as_ref().ok()) {
            for r in replicas {
                if let Ok(running) = r.running.lock()
                    && let Some((stop, _)) = running.as_ref()
                {
                    let _ = stop.send(true);
                }
            }
        }
        if let Ok(mut rt) = self.runtime.lock()
            && let Some(rt) = rt.take()
        {
            rt.shutdown_timeout(Duration::from_secs(10));
        }
    }
}

/// Identities of the replicas that say they lead.
fn leaders(replicas: &[Replica]) -> Vec<&str> {
    replicas
        .iter()
        .filter(|r| metric(&scrape(r).unwrap_or_default(), "podha_leader", &[]) == Some(1.0))
        .map(|r| r.identity.as_str())
        .collect()
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn scrape(replica: &Replica) -> anyhow::Result<String> {
    http_get(replica.http, "/metrics")
}

/// The value of the sample `name{labels...}` (labels given must all match).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric_name, rest) = series.split_once('{').unwrap_or((series, ""));
            if metric_name != name {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse().ok())
                .flatten()
        })
}

// ---------------------------------------------------------------------------------------------
// Scenario helpers.

fn secs_(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn log(ns: &str, msg: impl AsRef<str>) {
    eprintln!("[{ns}] {}", msg.as_ref());
}

/// A policy for one scenario: its nodes and namespace only, fast detection (Lease and kubelet
/// TCP, 1s probes, 3 failures, a lease grace just above the 10s renew interval), no fencing
/// proof.
fn policy(name: &str, ns: &str, nodes: &[&str], extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "nodeSelector": { "matchExpressions": [
            { "key": "kubernetes.io/hostname", "operator": "In", "values": nodes }
        ]},
        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
        "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
        "detection": {
            "interval": "1s",
            "failureThreshold": 3,
            "signals": ["Lease", "KubeletTCP"],
            "leaseGracePeriod": "12s",
            "tcpTimeout": "500ms",
        },
        // kwok nodes run no agent but in the agent scenarios (which set the proof): the taint
        // on the judgement alone, chosen explicitly.
        "fencing": { "proof": "None" },
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "podha.io/v1alpha1",
        "kind": "PodHAPolicy",
        "metadata": { "name": name },
        "spec": spec,
    })
}

async fn create_policy(client: &kube::Client, obj: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<PodHAPolicy> = Api::all(client.clone());
    let policy: PodHAPolicy = serde_json::from_value(obj)?;
    api.create(&PostParams::default(), &policy)
        .await
        .context("creating the PodHAPolicy")?;
    Ok(())
}

async fn delete_policy(client: &kube::Client, name: &str) {
    let api: Api<PodHAPolicy> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// Runs a scenario with the operators up; deletes its policy afterwards.
fn scenario<'a, F, Fut>(
    shared: &'a SharedCluster,
    operators: &'a Operators,
    ns: &str,
    body: F,
) -> Result<(), Failed>
where
    F: FnOnce(Ctx<'a>, &'a Operators, &'a [Replica]) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let cluster = shared.get()?;
    let replicas = operators.get(cluster)?;
    let policy = ns.to_string();
    run_scenario(shared, ns, |ctx| async move {
        let client = ctx.client.clone();
        let after = ctx.clone();
        let mut result = body(ctx, operators, replicas).await;
        delete_policy(&client, &policy).await;
        // Scenarios share nodes (one after another on the same pair): leave nothing behind.
        if result.is_ok() {
            result = after.remove_workloads(secs_(90)).await;
        }
        result.map_err(|e| {
            let metrics: String = replicas
                .iter()
                .map(|r| {
                    let text = scrape(r).unwrap_or_default();
                    let ours: Vec<&str> = text
                        .lines()
                        .filter(|l| l.contains(&format!("policy=\"{policy}\"")))
                        .collect();
                    format!(
                        "-- {} metrics for policy {policy}:\n{}\n",
                        r.identity,
                        ours.join("\n")
                    )
                })
                .collect();
            anyhow!("{e:#}\n{metrics}")
        })
    })
}

async fn policy_status(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<podha::api::PodHAPolicyStatus> {
    let api: Api<PodHAPolicy> = Api::all(client.clone());
    Ok(api.get(name).await?.status.unwrap_or_default())
}

fn other<'n>(pair: &[&'n str; 2], node: &str) -> &'n str {
    if pair[0] == node { pair[1] } else { pair[0] }
}

/// `podha explain pod NS/POD -o json`, run as a user runs it (the operators' Leases are in
/// `default`): whether it says the pod is protected (exit code 0 or 1, checked against the
/// answer) and the first rule that fails it, with its detail.
fn explain_pod(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<(bool, Option<(String, String)>)> {
    let (protected, answer) = explain_answer(ctx, pod)?;
    let failure = answer["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["outcome"] == "fail")
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (text("rule"), text("detail"))
        });
    Ok((protected, failure))
}

/// `podha explain pod NS/POD -o json`'s answer, and whether it says the pod is protected
/// (the exit code checked against it).
fn explain_answer(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<(bool, serde_json::Value)> {
    let subject = format!("{}/{pod}", ctx.ns);
    let podha = Path::new(env!("CARGO_BIN_EXE_podha"));
    podha_explain(podha, ctx.cluster, &["pod", &subject], "default")
}

/// `podha explain` says `pod` is not protected, first because of `rule`, with `word` in the
/// detail.
fn explained_unprotected(ctx: &Ctx<'_>, pod: &str, rule: &str, word: &str) -> anyhow::Result<()> {
    match explain_pod(ctx, pod)? {
        (false, Some((r, detail))) if r == rule && detail.contains(word) => {
            log(
                &ctx.ns,
                format!("podha explain: {pod} not protected: {r}: {detail}"),
            );
            Ok(())
        }
        other => bail!("podha explain pod {pod}: want rule {rule} ({word}), got {other:?}"),
    }
}

async fn gone(ctx: &Ctx<'_>, name: &str, uid: &str) -> anyhow::Result<bool> {
    Ok(ctx
        .pods()
        .get_opt(name)
        .await?
        .is_none_or(|p| p.metadata.uid.as_deref() != Some(uid)))
}

/// For `duration`, db-0 keeps its object (same UID) and `node` gets no out-of-service taint.
async fn untouched_for(
    ctx: &Ctx<'_>,
    uid: &str,
    node: &str,
    duration: Duration,
    context: &str,
) -> anyhow::Result<()> {
    holds_for(
        "db-0 untouched and its node untainted",
        duration,
        || async {
            if gone(ctx, "db-0", uid).await? {
                return Ok(Err(format!("db-0 was deleted{context}")));
            }
            if has_podha_taint(ctx, node).await? {
                return Ok(Err(format!("{node} was tainted{context}")));
            }
            Ok(Ok(()))
        },
    )
    .await
}

async fn has_podha_taint(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<bool> {
    let n: Node = ctx.nodes().get(node).await?;
    let tainted = n
        .spec
        .and_then(|s| s.taints)
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY));
    let marked = n
        .metadata
        .annotations
        .is_some_and(|a| a.contains_key(TAINT_MARKER_ANNOTATION));
    Ok(tainted && marked)
}

/// Waits until the app's replacement runs on `node` with the volume attached there and no
/// attachment of it left on `dead`.
async fn wait_recovered(
    ctx: &Ctx<'_>,
    app: &str,
    pv: &str,
    node: &str,
    dead: &str,
    timeout: Duration,
) -> anyhow::Result<Pod> {
    wait_for(
        &format!("{app} running on {node} with {pv} attached there and gone from {dead}"),
        timeout,
        || async {
            let pods = ctx.app_pods(app).await?;
            let Some(pod) = pods
                .into_iter()
                .find(|p| running_ready(p) && node_of(p) == Some(node))
            else {
                return Ok(None);
            };
            let vas = ctx.vas_of(pv).await?;
            let attached_here = vas
                .iter()
                .any(|v| v.spec.node_name == node && va_attached(v));
            let left_on_dead = vas.iter().any(|v| v.spec.node_name == dead);
            Ok((attached_here && !left_on_dead).then_some(pod))
        },
    )
    .await
}

/// The single pod of `app`, running, with its node and its PV attached there.
/// This scenario's policy (its namespace and `pair`, `spec` on top of the test defaults) and
/// a StatefulSet `db` with one RWO volume, running on one of `pair`.
async fn policy_and_db(
    ctx: &Ctx<'_>,
    pair: &[&str; 2],
    spec: serde_json::Value,
) -> anyhow::Result<(Pod, String, String, String)> {
    create_policy(&ctx.client, policy(&ctx.ns, &ctx.ns, pair, spec)).await?;
    ctx.create::<StatefulSet>(statefulset("db", pair)).await?;
    running_app(ctx, "db", "data-db-0").await
}

async fn running_app(
    ctx: &Ctx<'_>,
    app: &str,
    claim: &str,
) -> anyhow::Result<(Pod, String, String, String)> {
    let pod = ctx.wait_app_running(app, secs_(120)).await?;
    let node = node_of(&pod).unwrap_or_default().to_string();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let pv = pv_name(&ctx.wait_bound_pv(claim).await?);
    ctx.wait_attached(&pv, &node, secs_(60)).await?;
    Ok((pod, node, uid, pv))
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

/// The replica that leads. A leader whose own renewal is slow to show up drops its flag for a
/// moment (the safe direction), so this waits a little for exactly one.
async fn ops_leader(replicas: &[Replica]) -> anyhow::Result<&Replica> {
    let one = wait_for("exactly one podha leader", secs_(15), || async {
        Ok(match leaders(replicas).as_slice() {
            [one] => Some(one.to_string()),
            _ => None,
        })
    })
    .await?;
    replicas
        .iter()
        .find(|r| r.identity == one)
        .ok_or_else(|| anyhow!("{one} is gone"))
}

/// The CRD's validation, enforced by the real kube-apiserver: every bad spec is refused with a
/// message naming what is wrong; a good one is accepted with the documented defaults.
fn bad_policies(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    scenario(shared, ops, "validation", |ctx, _, _| async move {
        let api: Api<kube::core::DynamicObject> = Api::all_with(
            ctx.client.clone(),
            &kube::core::ApiResource::erase::<PodHAPolicy>(&()),
        );
        let cases = [
            (
                json!({"detection": {"failureThreshold": 0}}),
                "failureThreshold must be at least 1",
            ),
            (
                json!({"detection": {"interval": "500ms", "tcpTimeout": "100ms"}}),
                "interval must be at least 1s",
            ),
            (
                json!({"detection": {"signals": []}}),
                "must name at least one signal",
            ),
            (
                json!({"detection": {"signals": ["Ping"]}}),
                "Unsupported value: \"Ping\"",
            ),
            (
                json!({"detection": {"signals": ["KubeletTCP"]}}),
                "need action OutOfServiceTaint and a confirmed fencing proof",
            ),
            (
                json!({"detection": {"signals": ["AgentHeartbeat"]}, "action": "DeletePods",
                       "fencing": {"proof": "AgentAcknowledged"}}),
                "need action OutOfServiceTaint and a confirmed fencing proof",
            ),
            (
                json!({"detection": {"signals": ["Lease", "Lease"]}}),
                "Duplicate value",
            ),
            (
                json!({"detection": {"interval": "2s", "tcpTimeout": "2s"}}),
                "tcpTimeout must be shorter",
            ),
            (
                json!({"detection": {"interval": "5 seconds"}}),
                "should match",
            ),
            (
                json!({"safety": {"maxUnhealthy": "101%"}}),
                "maxUnhealthy must be a count of at least 1",
            ),
            (
                json!({"safety": {"maxUnhealthy": 0}}),
                "maxUnhealthy must be a count of at least 1",
            ),
            (json!({"action": "Reboot"}), "Unsupported value: \"Reboot\""),
            (
                json!({"owners": ["DaemonSet"]}),
                "another controller's kind with its API group, Kind.group",
            ),
            (
                json!({"owners": ["cluster.postgresql.cnpg.io"]}),
                "another controller's kind with its API group, Kind.group",
            ),
            (
                json!({"volumes": {"accessModes": []}}),
                "must list at least one access mode",
            ),
            (
                json!({"fencing": {"agentMargin": "2h"}}),
                "fencing.agentMargin must be at most 1h",
            ),
            // Past what a duration holds: the pattern alone let it in, and no replica could
            // list the policies afterwards.
            (
                json!({"fencing": {"agentMargin": "99999999999999999999h"}}),
                "agentMargin",
            ),
            (
                json!({"fencing": {"proof": "BMC"}}),
                "fencing.proof BMC needs fencing.bmc",
            ),
            (
                json!({"fencing": {"proof": "BMC", "bmc": {
                    "secretName": "bmc-{node}", "secretNameLabel": "example.com/bmc"}}}),
                "exactly one of secretName and secretNameLabel",
            ),
            (
                json!({"fencing": {"proof": "BMC", "bmc": {"secretName": "BMC_{node}"}}}),
                "fencing.bmc.secretName must be a Secret name",
            ),
            (
                json!({"fencing": {"proof": "BMC", "bmc": {"secretNameLabel": "a b"}}}),
                "fencing.bmc.secretNameLabel must be a label key",
            ),
        ];
        for (i, (spec, expected)) in cases.into_iter().enumerate() {
            let obj: kube::core::DynamicObject = serde_json::from_value(json!({
                "apiVersion": "podha.io/v1alpha1",
                "kind": "PodHAPolicy",
                "metadata": { "name": format!("bad-{i}") },
                "spec": spec,
            }))?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => bail!("spec {spec} was accepted"),
                Err(kube::Error::Api(status)) if status.code == 422 => {
                    if !status.message.contains(expected) {
                        bail!(
                            "spec {spec}: {:?} does not say {expected:?}",
                            status.message
                        );
                    }
                }
                Err(e) => bail!("spec {spec}: unexpected error {e}"),
            }
        }
        // An empty spec is valid and gets the defaults from the schema.
        let good: kube::core::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "podha.io/v1alpha1", "kind": "PodHAPolicy",
            "metadata": { "name": "validation-defaults" },
            "spec": { "nodeSelector": { "matchLabels": { "none": "none" } } },
        }))?;
        let created = api
            .create(&PostParams::default(), &good)
            .await
            .context("a good spec")?;
        let spec = &created.data["spec"];
        let _ = api
            .delete("validation-defaults", &DeleteParams::default())
            .await;
        if spec["detection"]["interval"] != "2s"
            || spec["detection"]["failureThreshold"] != 3
            || spec["detection"]["signals"] != json!(["Lease", "AgentHeartbeat"])
            || spec["detection"]["leaseGracePeriod"] != "15s"
            || spec["fencing"]["agentMargin"] != "4s"
            || spec["action"] != "OutOfServiceTaint"
            || spec["safety"]["maxUnhealthy"] != "30%"
            || spec["detachTimeout"] != "6m30s"
            || spec["fencing"]["proof"] != "Agent"
        {
            bail!("defaults not applied by the API server: {spec}");
        }
        Ok(())
    })
}

/// The Events podha published with `reason` about the object `name` (in `ns`, where
/// cluster-scoped objects' events live in `default`).
async fn action_events(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<Vec<K8sEvent>> {
    podha_sim::testkit::podha_events(client, ns, reason, name).await
}

/// How many times podha did this (its Events, counting repeats in a series).
async fn times_acted(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<i32> {
    podha_sim::testkit::podha_event_count(client, ns, reason, name).await
}

/// podha did this exactly once.
async fn acted_once(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<()> {
    // Events go out after the actions they report: give the first one time to arrive.
    let what = format!("podha's {reason} event about {name}");
    let _ = wait_for(&what, secs_(30), || async {
        Ok((times_acted(client, ns, reason, name).await? > 0).then_some(()))
    })
    .await;
    match times_acted(client, ns, reason, name).await? {
        1 => Ok(()),
        n => bail!("expected podha to {reason} {name} once, it did {n} times"),
    }
}

/// podha's requests (any replica's: the chart's ServiceAccount) to `verb` the object
/// `resource` `namespace/name`, as the API server's audit log recorded them once answered.
fn podha_requests(
    cluster: &podha_sim::cluster::Cluster,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: &str,
) -> anyhow::Result<Vec<podha_sim::cluster::audit::Request>> {
    let user = format!(
        "system:serviceaccount:default:{}",
        podha_sim::chart_rbac::RELEASE
    );
    Ok(cluster
        .audited_requests()?
        .into_iter()
        .filter(|r| r.user.username == user && r.is(verb, resource, namespace, name))
        .collect())
}

/// How many of podha's delete requests for `ns/pod` the API server answered 200; fails on a
/// second one or on any answer but 200 and 409 (see [`deleted_once`] for why).
fn podha_deletes_done(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<usize> {
    let ns = Some(ctx.ns.as_str());
    let requests = podha_requests(ctx.cluster, "delete", "pods", ns, pod)?;
    let codes: Vec<Option<u16>> = requests.iter().map(|r| r.code()).collect();
    let done = codes.iter().filter(|c| **c == Some(200)).count();
    let refused = codes.iter().filter(|c| **c == Some(409)).count();
    if done > 1 || done + refused != codes.len() {
        bail!(
            "podha's delete requests for {}/{pod}: {codes:?}, expected at most one answered 200 \
             (and only precondition conflicts besides)",
            ctx.ns
        );
    }
    Ok(done)
}

/// `ns/pod` was deleted, by podha at most once or else by someone else (Kubernetes' pod GC);
/// returns whether podha deleted it.
fn deleted_at_most_once(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<bool> {
    let done = podha_deletes_done(ctx, pod)?;
    if done == 0 {
        let ns = Some(ctx.ns.as_str());
        let others = ctx
            .cluster
            .audited_requests()?
            .into_iter()
            .filter(|r| r.is("delete", "pods", ns, pod) && r.code() == Some(200))
            .count();
        if others == 0 {
            bail!(
                "{}/{pod} is gone, but no delete of it is in the audit log",
                ctx.ns
            );
        }
    }
    Ok(done == 1)
}

/// podha deleted `ns/pod` exactly once: ground truth from the audit log, which no replica can
/// lose by stopping right after its request (its Event can be lost that way). A delete the API
/// server refused with 409 did nothing: podha deletes on a precondition, and the pod changing
/// under it (the taint manager marking it for deletion, say) makes it read again and retry.
/// Any other answer (a second 200, a 404 for a pod already gone) is a repeated action.
async fn deleted_once(ctx: &Ctx<'_>, pod: &str) -> anyhow::Result<()> {
    let ns = Some(ctx.ns.as_str());
    let what = format!("podha's delete of {}/{pod} in the audit log", ctx.ns);
    wait_for(&what, secs_(30), || async {
        Ok((!podha_requests(ctx.cluster, "delete", "pods", ns, pod)?.is_empty()).then_some(()))
    })
    .await?;
    if podha_deletes_done(ctx, pod)? != 1 {
        bail!(
            "podha's delete requests for {}/{pod} were all refused: expected one answered 200",
            ctx.ns
        );
    }
    Ok(())
}
