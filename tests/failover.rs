//! podha on the sim cluster's real control plane (profile `fast`): a dead node's stateful pods
//! come back on a healthy node, and what must not be touched is not.
//!
//! One cluster of 18 nodes serves every scenario; each scenario has its own namespace, its own
//! pair of nodes (pods pinned with node affinity) and its own PodHAPolicy selecting only those
//! nodes and that namespace, so the scenarios run in parallel. At most 7 of 18 nodes are dead at
//! once, below the node lifecycle controller's 55 % "partial disruption" threshold.
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

#[path = "failover/policy_edits.rs"]
mod policy_edits;
#[path = "failover/prometheus.rs"]
mod prometheus;

const NODES: usize = 20;
/// The attach/detach controller's force-detach wait (maxWaitForUnmountDuration), plus margin.
const STOCK_DETACH_WAIT: Duration = Duration::from_secs(8 * 60);

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // Every scenario mostly waits; run them all at once.
    args.test_threads.get_or_insert(8);
    let shared = Arc::new(SharedCluster::new(
        env!("CARGO_TARGET_TMPDIR"),
        "podha-failover",
        NODES,
        None,
    ));
    let operators = Arc::new(Operators::default());
    type Scenario = fn(&SharedCluster, &Operators) -> Result<(), Failed>;
    let scenarios: [(&str, Scenario); 10] = [
        (
            "api_server_rejects_bad_policies_with_clear_messages",
            bad_policies,
        ),
        (
            "statefulset_delete_pods_moves_the_pod_after_the_detach_wait",
            sts_delete_pods,
        ),
        (
            "statefulset_out_of_service_taint_detaches_at_once_and_is_removed",
            sts_taint,
        ),
        ("deployment_delete_pods_recovers", deployment_delete_pods),
        ("pods_that_must_not_move_keep_their_objects", untouched_pods),
        (
            "node_back_before_the_threshold_deletes_nothing",
            flapping_node,
        ),
        ("dry_run_deletes_nothing_and_says_what_it_would_do", dry_run),
        (
            "too_many_unhealthy_nodes_hold_every_action",
            too_many_unhealthy,
        ),
        (
            "prometheus_scrapes_a_failover_and_every_query_has_data",
            prometheus::prometheus_scrapes_a_failover,
        ),
        (
            "a_policy_switched_to_the_taint_mid_incident_acts_on_it",
            policy_edits::switched_to_the_taint_mid_incident,
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
    let last: [(&str, Scenario); 3] = [
        ("two_replicas_only_the_leader_writes", one_leader),
        (
            "api_server_blip_is_no_node_death_and_leaves_podha_watching",
            api_server_blip,
        ),
        (
            "leader_change_mid_failover_repeats_no_action",
            leader_change,
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
            let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podha");
            let mut config = podha_sim::chart_rbac::service_account_config(
                cluster,
                &podha_sim::chart_rbac::helm_path()?,
                &chart,
                "default",
                podha::leader::DEFAULT_LEASE_NAME,
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
/// TCP, 1s probes, 3 failures, a lease grace just above the 10s renew interval).
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

/// DeletePods: podha force-deletes the dead node's StatefulSet pod; the replacement runs on the
/// other node once the attach/detach controller's own 6-minute wait ends.
fn sts_delete_pods(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-1", "node-2"];
    scenario(shared, ops, "sts-delete", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        // A detach timeout well below the attach/detach controller's 6 minutes: reported.
        let (pod, node, uid, pv) = policy_and_db(
            &ctx,
            &pair,
            json!({"action": "DeletePods", "detachTimeout": "30s"}),
        )
        .await?;
        let target = other(&pair, &node);
        log(&ns, format!("{} on {node}; killing it", name_of(&pod)));
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted by podha", secs_(60), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        log(
            &ns,
            format!("db-0 deleted {:.1?} after the kill", killed.elapsed()),
        );
        if has_podha_taint(&ctx, &node).await? {
            bail!("DeletePods must not taint {node} out-of-service");
        }
        let fenced = ctx
            .nodes()
            .get(&node)
            .await?
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == podha::api::FENCE_TAINT_KEY && t.effect == "NoSchedule")
            });
        if !fenced {
            bail!("DeletePods must fence {node} so the replacement is not scheduled back onto it");
        }
        wait_for(
            "the Degraded condition for the stuck detach",
            secs_(90),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let degraded = status.conditions.iter().any(|c| {
                    c.type_ == "Degraded" && c.status == "True" && c.reason == "DetachTimeout"
                });
                Ok(degraded.then_some(()))
            },
        )
        .await?;
        let leader = ops_leader(replicas).await?;
        let timeouts = metric(
            &scrape(leader)?,
            "podha_detach_timeouts_total",
            &[("policy", ns.as_str())],
        );
        if timeouts != Some(1.0) {
            bail!("podha_detach_timeouts_total is {timeouts:?}, expected 1");
        }
        wait_recovered(&ctx, "db", &pv, target, &node, STOCK_DETACH_WAIT).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the kill",
                killed.elapsed()
            ),
        );
        Ok(())
    })
}

/// OutOfServiceTaint: the taint detaches at once, the replacement runs, the failover phases
/// show in the metrics, and the taint is removed once the node is back and holds no volume.
fn sts_taint(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-3", "node-4"];
    scenario(shared, ops, "sts-taint", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, pv) =
            policy_and_db(&ctx, &pair, json!({"action": "OutOfServiceTaint"})).await?;
        let target = other(&pair, &node);
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("podha's out-of-service taint", secs_(60), || async {
            Ok(has_podha_taint(&ctx, &node).await?.then_some(()))
        })
        .await?;
        wait_for("db-0 force-deleted", secs_(30), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the kill",
                killed.elapsed()
            ),
        );

        let leader = ops_leader(replicas).await?;
        wait_for(
            "every failover phase in the leader's metrics",
            secs_(30),
            || async {
                let text = scrape(leader)?;
                let all = ["detect", "act", "detach", "recover", "total"]
                    .iter()
                    .all(|phase| {
                        metric(
                            &text,
                            "podha_failover_phase_duration_seconds_count",
                            &[("policy", ns.as_str()), ("phase", phase)],
                        )
                        .is_some_and(|v| v >= 1.0)
                    });
                let deleted = metric(
                    &text,
                    "podha_pods_deleted_total",
                    &[("policy", ns.as_str()), ("owner_kind", "StatefulSet")],
                );
                let tainted = metric(
                    &text,
                    "podha_taints_total",
                    &[("policy", ns.as_str()), ("operation", "add")],
                );
                // podha deletes the pod right after its taint lands: taint eviction then only
                // marks it (podha's force delete still goes through), and pod GC, which could
                // remove it first, runs every 20 s.
                Ok((all && deleted == Some(1.0) && tainted == Some(1.0)).then_some(()))
            },
        )
        .await?;
        // Two replicas watch; exactly one acted, once.
        acted_once(&ctx.client, "default", "OutOfServiceTaintAdded", &node).await?;
        acted_once(&ctx.client, &ns, "PodForceDeleted", "db-0").await?;
        wait_for(
            "the recovered failover in the policy status",
            secs_(30),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let recorded = status.recent_failovers.first().is_some_and(|f| {
                    f.node == node
                        && f.phase == podha::api::FailoverPhase::Recovered
                        && f.pods == [format!("{ns}/db-0")]
                        && f.acted_at.is_some()
                        && f.detached_at.is_some()
                        && f.recovered_at.is_some()
                });
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Ok((recorded && ready && status.watched_nodes == 2).then_some(()))
            },
        )
        .await?;

        ctx.cluster.start_node(&node).await?;
        wait_for(
            "podha's taint removed from the returned node",
            secs_(60),
            || async { Ok((!has_podha_taint(&ctx, &node).await?).then_some(())) },
        )
        .await?;
        let n: Node = ctx.nodes().get(&node).await?;
        if n.spec
            .and_then(|s| s.taints)
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY))
        {
            bail!("the out-of-service taint is still on {node}");
        }
        Ok(())
    })
}

/// DeletePods with a Deployment: the old pod is deleted and the replacement, stuck on the
/// Multi-Attach error until the detach, runs on the other node.
fn deployment_delete_pods(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-5", "node-6"];
    scenario(shared, ops, "deploy", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        create_policy(
            &ctx.client,
            policy(&ns, &ns, &pair, json!({"action": "DeletePods"})),
        )
        .await?;
        ctx.create::<PersistentVolumeClaim>(pvc("web-data", podha_sim::csi::RWO_STORAGE_CLASS))
            .await?;
        ctx.create::<k8s_openapi::api::apps::v1::Deployment>(deployment(
            "web",
            &pair,
            Some("web-data"),
        ))
        .await?;
        let (pod, node, uid, pv) = running_app(&ctx, "web", "web-data").await?;
        let target = other(&pair, &node);
        let name = name_of(&pod).to_string();
        ctx.cluster.kill_node(&node)?;
        wait_for("the old web pod force-deleted", secs_(60), || async {
            Ok(gone(&ctx, &name, &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "web", &pv, target, &node, STOCK_DETACH_WAIT).await?;
        Ok(())
    })
}

/// On one dead node: a bare pod with a claim, a pod of a driver the policy does not select, a
/// pod opted out by annotation and a pod that can only run on the dead node. None is deleted,
/// and each reason shows in the metrics.
fn untouched_pods(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let dead = "node-7";
    scenario(shared, ops, "untouched", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        create_policy(
            &ctx.client,
            policy(
                &ns,
                &ns,
                &["node-7", "node-8"],
                json!({"action": "OutOfServiceTaint"}),
            ),
        )
        .await?;
        let pinned = [dead];
        // A bare pod: no controller would recreate it.
        ctx.create::<PersistentVolumeClaim>(pvc("bare-data", podha_sim::csi::RWO_STORAGE_CLASS))
            .await?;
        let mut bare = deployment("bare", &pinned, Some("bare-data"))["spec"]["template"].clone();
        bare["apiVersion"] = json!("v1");
        bare["kind"] = json!("Pod");
        bare["metadata"]["name"] = json!("bare");
        ctx.create::<Pod>(bare).await?;
        // A StatefulSet on the other driver.
        let mut other_driver = statefulset("otherdrv", &pinned);
        other_driver["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] =
            json!(podha_sim::csi::OTHER_STORAGE_CLASS);
        ctx.create::<StatefulSet>(other_driver).await?;
        // Opted out.
        let mut opted_out = statefulset("optout", &["node-7", "node-8"]);
        opted_out["spec"]["template"]["metadata"]["annotations"] =
            json!({"podha.io/failover": "false"});
        opted_out["spec"]["template"]["spec"]["affinity"] =
            statefulset("x", &pinned)["spec"]["template"]["spec"]["affinity"].clone();
        ctx.create::<StatefulSet>(opted_out).await?;
        // Only the dead node fits.
        ctx.create::<StatefulSet>(statefulset("pinned", &pinned))
            .await?;
        // One pod podha may move (it may run on either node, and prefers the one that dies):
        // its failover would taint the node out-of-service, which would remove the others.
        let mut mover = statefulset("mover", &["node-7", "node-8"]);
        mover["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{
            "weight": 100,
            "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [dead]}
            ]}
        }]);
        ctx.create::<StatefulSet>(mover).await?;

        let mut uids = Vec::new();
        for (app, pod) in [
            ("bare", "bare"),
            ("otherdrv", "otherdrv-0"),
            ("optout", "optout-0"),
            ("pinned", "pinned-0"),
            ("mover", "mover-0"),
        ] {
            let p = wait_for(&format!("{pod} running on {dead}"), secs_(120), || async {
                Ok(ctx
                    .pods()
                    .get_opt(pod)
                    .await?
                    .filter(|p| running_ready(p) && node_of(p) == Some(dead)))
            })
            .await
            .with_context(|| format!("app {app}"))?;
            uids.push((pod, p.metadata.uid.clone().unwrap_or_default()));
        }
        let (mover_uid, kept) = match uids.split_last() {
            Some(((_, uid), kept)) => (uid.clone(), kept.to_vec()),
            None => bail!("no pods"),
        };
        ctx.cluster.kill_node(dead)?;
        let leader = ops_leader(replicas).await?;
        wait_for("every skip reason in the metrics", secs_(90), || async {
            let text = scrape(leader)?;
            let all = [
                "NoControllerOwner",
                "DriverNotSelected",
                "OptedOut",
                "NoTargetNode",
            ]
            .iter()
            .all(|reason| {
                metric(
                    &text,
                    "podha_pods_skipped_total",
                    &[("policy", ns.as_str()), ("reason", reason)],
                )
                .is_some_and(|v| v >= 1.0)
            });
            Ok(all.then_some(()))
        })
        .await?;
        // The eligible pod is deleted under the scheduling fence; the out-of-service taint,
        // which would remove every other pod there, is refused and the refusal reported.
        wait_for("mover-0 force-deleted", secs_(60), || async {
            Ok(gone(&ctx, "mover-0", &mover_uid).await?.then_some(()))
        })
        .await?;
        acted_once(&ctx.client, &ns, "PodForceDeleted", "mover-0").await?;
        let n: Node = ctx.nodes().get(dead).await?;
        let taints: Vec<String> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        if taints.iter().any(|k| k == OUT_OF_SERVICE_TAINT_KEY) {
            bail!("{dead} was tainted out-of-service with pods on it that must stay: {taints:?}");
        }
        if !taints.iter().any(|k| k == podha::api::FENCE_TAINT_KEY) {
            bail!("{dead} was not fenced: {taints:?}");
        }
        let text = scrape(leader)?;
        let refused = metric(
            &text,
            "podha_actions_held_total",
            &[
                ("policy", ns.as_str()),
                ("reason", "OutOfServiceTaintRefused"),
            ],
        );
        if !refused.is_some_and(|v| v >= 1.0) {
            bail!("the refused out-of-service taint was not reported: {refused:?}");
        }
        acted_once(&ctx.client, "default", "OutOfServiceTaintRefused", dead).await?;
        holds_for("every other pod keeps its object", secs_(20), || async {
            for (pod, uid) in &kept {
                if gone(&ctx, pod, uid).await? {
                    return Ok(Err(format!("{pod} was deleted")));
                }
            }
            Ok(Ok(()))
        })
        .await?;
        let text = scrape(leader)?;
        let deleted = metric(
            &text,
            "podha_pods_deleted_total",
            &[("policy", ns.as_str()), ("owner_kind", "StatefulSet")],
        );
        if deleted != Some(1.0) {
            bail!("podha counted {deleted:?} deletions for this policy, want the mover's one");
        }
        Ok(())
    })
}

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

/// A node dead long enough for podha to count failed probes, and back before
/// `failureThreshold` of them: it is Suspect for a while, then Healthy, and nothing happens.
fn flapping_node(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-9", "node-10"];
    scenario(shared, ops, "flap", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        // 8 failed probes 1 s apart: room to bring the node back once podha suspects it.
        let spec = json!({
            "action": "OutOfServiceTaint",
            "detection": {"interval": "1s", "failureThreshold": 8, "signals": ["Lease", "KubeletTCP"],
                          "leaseGracePeriod": "12s", "tcpTimeout": "500ms"},
        });
        let (_, node, uid, _) = policy_and_db(&ctx, &pair, spec).await?;
        ctx.cluster.kill_node(&node)?;
        let killed = Instant::now();
        wait_for("podha to suspect the killed node", secs_(40), || async {
            let status = policy_status(&ctx.client, &ns).await?;
            Ok((status.suspect_nodes == 1).then_some(()))
        })
        .await?;
        log(
            &ns,
            format!("{node} suspect {:.1?} after the kill", killed.elapsed()),
        );
        ctx.cluster.start_node(&node).await?;
        wait_for("podha to see the node healthy again", secs_(30), || async {
            let status = policy_status(&ctx.client, &ns).await?;
            Ok((status.suspect_nodes == 0 && status.failed_nodes == 0).then_some(()))
        })
        .await?;
        untouched_for(&ctx, &uid, &node, secs_(15), "").await?;
        let text = scrape(ops_leader(replicas).await?)?;
        if metric(
            &text,
            "podha_node_failures_total",
            &[("policy", ns.as_str())],
        )
        .is_some_and(|v| v > 0.0)
        {
            bail!("podha judged the flapping node dead");
        }
        Ok(())
    })
}

/// More nodes dead than `safety.maxUnhealthy` allows: podha holds every action of the policy,
/// says so (metric, Degraded condition) and deletes and taints nothing.
fn too_many_unhealthy(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-15", "node-16"];
    scenario(
        shared,
        ops,
        "max-unhealthy",
        |ctx, _, replicas| async move {
            let ns = ctx.ns.clone();
            let (_, node, uid, _) = policy_and_db(
                &ctx,
                &pair,
                json!({"action": "OutOfServiceTaint", "safety": {"maxUnhealthy": 1}}),
            )
            .await?;
            // Both nodes cut off at once, the db's first: its grace runs out before the empty
            // node's may, and the empty node is not yet Suspect when the db's node is judged
            // dead. podha must wait until it has heard from the empty node (it never does),
            // and hold once both are unhealthy.
            ctx.cluster.kill_node(&node)?;
            ctx.cluster.kill_node(other(&pair, &node))?;
            wait_for("both nodes judged dead", secs_(60), || async {
                let status = policy_status(&ctx.client, &ns).await?;
                Ok((status.failed_nodes == 2).then_some(()))
            })
            .await?;
            untouched_for(&ctx, &uid, &node, secs_(15), " while held").await?;
            let text = scrape(ops_leader(replicas).await?)?;
            let held = metric(
                &text,
                "podha_actions_held_total",
                &[("policy", ns.as_str()), ("reason", "TooManyUnhealthyNodes")],
            );
            if !held.is_some_and(|v| v > 0.0) {
                bail!("no TooManyUnhealthyNodes hold in the metrics: {held:?}");
            }
            let status = wait_for("the Degraded condition", secs_(15), || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let degraded = status.conditions.iter().any(|c| {
                    c.type_ == "Degraded"
                        && c.status == "True"
                        && c.reason == "TooManyUnhealthyNodes"
                });
                Ok(degraded.then_some(status))
            })
            .await?;
            log(&ns, format!("held; status {:?}", status.conditions));
            for dead in pair {
                ctx.cluster.start_node(dead).await?;
            }
            Ok(())
        },
    )
}

/// The API server goes away for podha alone (its connections closed and refused for 20 s,
/// longer than the policy's lease grace plus its probes) while the nodes keep renewing their
/// Leases. podha must take the silence for a gap in its own view: no node judged dead, nothing
/// deleted or tainted, during the cut or after it. And it must not stay blind: a node killed
/// afterwards is failed over.
fn api_server_blip(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-9", "node-10"];
    scenario(shared, ops, "blip", |ctx, ops, replicas| async move {
        let ns = ctx.ns.clone();
        // Lease alone: the one signal a frozen view turns dead (the last Ready seen stays
        // True). maxUnhealthy 100 %, so that a hold cannot hide a misjudgement.
        let (_, node, uid, pv) = policy_and_db(
            &ctx,
            &pair,
            json!({
                "detection": {
                    "signals": ["Lease"],
                    "interval": "1s",
                    "failureThreshold": 3,
                    "leaseGracePeriod": "12s",
                    "tcpTimeout": "500ms",
                },
                "safety": {"maxUnhealthy": "100%"},
                "action": "OutOfServiceTaint",
            }),
        )
        .await?;
        let relay = ops.relay()?;
        relay.cut();
        log(&ns, "podha cut off the API server");
        let cut_off = wait_for("no replica leading while cut off", secs_(15), || async {
            Ok(leaders(replicas).is_empty().then_some(()))
        })
        .await;
        tokio::time::sleep(secs_(20)).await;
        relay.restore();
        log(&ns, "podha reconnected");
        cut_off?;
        let restored = Instant::now();
        ops_leader(replicas).await?;
        log(
            &ns,
            format!("a leader again {:.1?} after", restored.elapsed()),
        );
        // Past the lease grace and the probes again, counted from the reconnection.
        untouched_for(&ctx, &uid, &node, secs_(20), " after an API server blip").await?;
        for r in replicas {
            let failures = metric(
                &scrape(r)?,
                "podha_node_failures_total",
                &[("policy", ns.as_str())],
            );
            if failures.is_some_and(|v| v > 0.0) {
                bail!("{} judged a node dead during the blip", r.identity);
            }
        }
        // Still watching: a real death is failed over.
        let target = other(&pair, &node);
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted", secs_(60), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        log(
            &ns,
            format!("recovered {:.1?} after a kill", killed.elapsed()),
        );
        ctx.cluster.start_node(&node).await?;
        Ok(())
    })
}

/// dryRun: the pod keeps its object; the policy's events say what podha would have done.
fn dry_run(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-11", "node-12"];
    scenario(shared, ops, "dry-run", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, _) = policy_and_db(
            &ctx,
            &pair,
            json!({"action": "OutOfServiceTaint", "dryRun": true}),
        )
        .await?;
        ctx.cluster.kill_node(&node)?;
        let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), "default");
        let note = wait_for(
            "a DryRun event on the policy naming the pod",
            secs_(90),
            || async {
                let list = events.list(&ListParams::default()).await?;
                Ok(list.items.into_iter().find_map(|e| {
                    let about_policy =
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(ns.as_str());
                    let note = e.note.unwrap_or_default();
                    (about_policy
                        && e.reason.as_deref() == Some("DryRun")
                        && note.contains(&format!("{ns}/db-0")))
                    .then_some(note)
                }))
            },
        )
        .await?;
        log(&ns, format!("event: {note}"));
        untouched_for(&ctx, &uid, &node, secs_(20), " in a dry run").await?;
        let text = scrape(ops_leader(replicas).await?)?;
        if metric(
            &text,
            "podha_actions_held_total",
            &[("policy", ns.as_str()), ("reason", "DryRun")],
        )
        .is_none_or(|v| v < 1.0)
        {
            bail!("no DryRun hold counted");
        }
        Ok(())
    })
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
                "KubeletTCP cannot be the only signal",
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
                "Unsupported value: \"DaemonSet\"",
            ),
            (
                json!({"volumes": {"accessModes": []}}),
                "must list at least one access mode",
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
        if spec["detection"]["interval"] != "5s"
            || spec["detection"]["failureThreshold"] != 3
            || spec["action"] != "OutOfServiceTaint"
            || spec["safety"]["maxUnhealthy"] != "30%"
            || spec["detachTimeout"] != "6m30s"
        {
            bail!("defaults not applied by the API server: {spec}");
        }
        Ok(())
    })
}

/// Two replicas: never two leaders at once, and one leads in the end.
fn one_leader(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let replicas = ops.get(cluster)?;
    // Run after the parallel scenarios, which failed nodes over without a leader change: every
    // write of theirs went through the one leader, and the other replica, which planned the
    // same intents, sent none.
    let writes = |r: &Replica| -> anyhow::Result<(f64, f64)> {
        let text = scrape(r)?;
        Ok((
            metric_sum(&text, "podha_action_request_duration_seconds_count"),
            metric_sum(&text, "podha_intents_dropped_total"),
        ))
    };
    let leader = match leaders(replicas).as_slice() {
        [one] => one.to_string(),
        other => return Err(format!("expected exactly one leader, found {other:?}").into()),
    };
    for r in replicas {
        let (sent, dropped) = writes(r).map_err(|e| e.to_string())?;
        eprintln!(
            "[one-leader] {}: {sent} action requests, {dropped} intents dropped",
            r.identity
        );
        if r.identity == leader && sent < 1.0 {
            return Err(format!("the leader {leader} sent no action at all").into());
        }
        if r.identity != leader && (sent > 0.0 || dropped < 1.0) {
            return Err(format!(
                "standby {} sent {sent} action requests and dropped {dropped} intents: \
                 want none sent, some dropped",
                r.identity
            )
            .into());
        }
    }
    Ok(())
}

/// The sum of every sample of `name` (all label values).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric_name = series.split_once('{').map_or(series, |(n, _)| n);
            (metric_name == name)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .fold(0.0, |sum, v| sum + v)
}

/// The Events podha published with `reason` about the object `name` (in `ns`, where
/// cluster-scoped objects' events live in `default`).
async fn action_events(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<Vec<K8sEvent>> {
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.reporting_controller.as_deref() == Some("podha")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect())
}

/// How many times podha did this (its Events, counting repeats in a series).
async fn times_acted(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<i32> {
    let events = action_events(client, ns, reason, name).await?;
    Ok(events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum())
}

/// podha did this exactly once.
async fn acted_once(
    client: &kube::Client,
    ns: &str,
    reason: &str,
    name: &str,
) -> anyhow::Result<()> {
    match times_acted(client, ns, reason, name).await? {
        1 => Ok(()),
        n => bail!("expected podha to {reason} {name} once, it did {n} times"),
    }
}

/// The leader stops right after it acted on a dead node; the other replica takes over and
/// finishes the failover without doing anything twice.
fn leader_change(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-13", "node-14"];
    scenario(shared, ops, "handover", |ctx, ops, replicas| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, pv) =
            policy_and_db(&ctx, &pair, json!({"action": "OutOfServiceTaint"})).await?;
        let target = other(&pair, &node);
        ctx.cluster.kill_node(&node)?;
        wait_for("podha's out-of-service taint", secs_(60), || async {
            Ok(has_podha_taint(&ctx, &node).await?.then_some(()))
        })
        .await?;
        let old = ops_leader(replicas).await?;
        ops.stop_replica(old).await?;
        log(
            &ns,
            format!("stopped the leader {} right after the taint", old.identity),
        );
        wait_for("the other replica to lead", secs_(20), || async {
            Ok(leaders(replicas)
                .iter()
                .any(|l| *l != old.identity)
                .then_some(()))
        })
        .await?;
        wait_for("db-0 force-deleted", secs_(30), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        // One taint and one delete in all, whichever replica sent them: the new leader repeated
        // nothing the old one did, and left nothing undone.
        acted_once(&ctx.client, "default", "OutOfServiceTaintAdded", &node).await?;
        acted_once(&ctx.client, &ns, "PodForceDeleted", "db-0").await?;
        ops.restart_replica(old)?;
        Ok(())
    })
}
