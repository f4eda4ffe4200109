//! `fencing.proof: BMC` on the sim cluster, every node powered through Redfish (one system per
//! node on the `sushy-tools` emulator, which the node's BMC follows), podha running in this
//! process as the chart's ServiceAccount with `rbac.bmcSecrets` (its only way to the BMC
//! Secrets). Three kwok nodes and two real ones (kubelet and containerd, the machine's SMBIOS
//! UUID reported as its `systemUUID`):
//!
//! - a killed kwok node whose BMC is first unreachable, then another node's, then refuses
//!   podha's password, is held with a Warning naming each cause; mended, it is powered off and
//!   only then tainted, and powered on again after the failover (`killed_kwok_node`);
//! - a frozen real node is powered off through its BMC before its writer's volume moves, the
//!   write log clean on storage that does not fence; powered on again, it boots and podha takes
//!   its taint off (`frozen_real_node`).
//!
//! Needs root, `make k8s csi-sidecars node-deps node-images helm sushy-tools` and the
//! `podha-sim` executable (`cargo build -p podha-sim`); without them the test fails saying so.

#[path = "bmc_fence/frozen_real_node.rs"]
mod frozen_real_node;
#[path = "bmc_fence/killed_kwok_node.rs"]
mod killed_kwok_node;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use libtest_mimic::Arguments;
use podha::leader::LeaderConfig;
use podha::redfish::PowerState;
use podha_sim::cluster::Cluster;
use podha_sim::cluster::redfish::RedfishAccess;
use podha_sim::failover::{apply_policy, http_get, install_crd};
use podha_sim::testkit::{
    Ctx, Scenario, SharedCluster, create_namespace, log, run_scenario, run_trials, secs, wait_for,
};
use serde_json::json;
use tokio::sync::watch;

/// podha's namespace: its Lease and the BMC Secrets.
const PODHA_NS: &str = "podha-system";
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
const KWOK_NODES: usize = 3;
/// The real nodes, after the kwok ones.
const REAL_NODES: [&str; 2] = ["node-4", "node-5"];

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // One podha at a time leads, and each scenario starts its own.
    args.test_threads = Some(1);
    let shared = Arc::new(
        SharedCluster::new(
            env!("CARGO_TARGET_TMPDIR"),
            "podha-bmc-fence",
            KWOK_NODES,
            None,
        )
        .with_real_nodes(REAL_NODES.len())
        .with_redfish_bmcs(),
    );
    let scenarios: [Scenario; 2] = [
        (
            "a_dead_node_is_powered_off_through_its_bmc_before_podha_taints_it",
            killed_kwok_node::held_then_powered_off,
        ),
        (
            "a_frozen_real_node_is_powered_off_through_its_bmc_before_its_volume_moves",
            frozen_real_node::powered_off_before_its_volume_moves,
        ),
    ];
    run_trials(&args, &shared, scenarios.into())
}

/// What a scenario starts from: the CRD, podha's namespace, podha leading in it, and a Secret
/// for each of `nodes`, bound to it, leading to its system.
async fn start_podha(
    ctx: &Ctx<'_>,
    nodes: &[&str],
) -> anyhow::Result<(RedfishAccess, Api<Secret>, Podha)> {
    let access = ctx
        .cluster
        .redfish()
        .context("the cluster's nodes have no Redfish BMCs")?;
    install_crd(
        &ctx.client,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/podha.io_podhapolicies.yaml"),
    )
    .await?;
    create_namespace(&ctx.client, PODHA_NS).await?;
    let podha = Podha::start(ctx.cluster).await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), PODHA_NS);
    for node in nodes {
        replace_secret(&secrets, bmc_secret(&access, node, node)?).await?;
    }
    Ok((access, secrets, podha))
}

/// The policy of a scenario's nodes and namespace: the BMC's proof (powering the machine on
/// again after the failover), Lease and `signals`.
async fn apply_bmc_policy(
    client: &kube::Client,
    name: &str,
    node_selector: serde_json::Value,
    namespace: &str,
    signals: &[&str],
    any_of: Option<&[&str]>,
) -> anyhow::Result<()> {
    let mut fencing = json!({ "bmc": { "secretName": "bmc-{node}", "powerCycle": true } });
    match any_of {
        Some(proofs) => {
            fencing["proof"] = json!("AnyOf");
            fencing["anyOf"] = json!(proofs);
        }
        None => fencing["proof"] = json!("BMC"),
    }
    apply_policy(
        client,
        name,
        json!({
            "nodeSelector": node_selector,
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": namespace } },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "detection": {
                "interval": "1s",
                "failureThreshold": 3,
                "signals": signals,
                "leaseGracePeriod": "12s",
                "tcpTimeout": "500ms",
            },
            "fencing": fencing,
        }),
    )
    .await
}

/// podha's events about `node` with `reason`, oldest first.
async fn node_events(
    client: &kube::Client,
    node: &str,
    reason: &str,
) -> anyhow::Result<Vec<Event>> {
    podha_sim::testkit::podha_events(client, "default", reason, node).await
}

/// The events podha must have told about a node it powered off, and the taint's event naming
/// the proof.
async fn told_power_off(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    for reason in ["PowerOffRequested", "PoweredOff", "OutOfServiceTaintAdded"] {
        ensure!(
            !node_events(client, node, reason).await?.is_empty(),
            "no {reason} event about {node}"
        );
    }
    let taint_note = node_events(client, node, "OutOfServiceTaintAdded").await?[0]
        .note
        .clone()
        .unwrap_or_default();
    ensure!(
        taint_note.contains("BMCPoweredOff"),
        "the taint's event does not name the proof: {taint_note}"
    );
    Ok(())
}

/// Waits until podha taints `node` out of service and returns what its system said the moment
/// the taint showed.
async fn state_at_taint(
    client: &kube::Client,
    access: &RedfishAccess,
    node: &str,
    timeout: Duration,
) -> anyhow::Result<PowerState> {
    let system = access.system(node)?;
    wait_for(
        &format!("podha's out-of-service taint on {node}"),
        timeout,
        || async {
            if !has_taint(client, node).await? {
                return Ok(None);
            }
            Ok(Some(system.power_state().await?))
        },
    )
    .await
}

/// Every system but `off`'s says `On`.
async fn others_on(access: &RedfishAccess, off: &str) -> anyhow::Result<()> {
    let kwok = (1..=KWOK_NODES).map(|i| format!("node-{i}"));
    for node in kwok.chain(REAL_NODES.map(String::from)) {
        if node != off {
            ensure!(
                access.system(&node)?.power_state().await? == PowerState::On,
                "{node}'s system was powered off"
            );
        }
    }
    Ok(())
}

/// When podha asked `node`'s BMC to power it on (its `PowerOnRequested` event), which must be
/// after `ready_at`, when the failover was done.
async fn powered_on_after(
    client: &kube::Client,
    node: &str,
    ready_at: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<()> {
    let asked_at = node_events(client, node, "PowerOnRequested")
        .await?
        .first()
        .and_then(|e| e.event_time.as_ref())
        .map(|t| t.0)
        .with_context(|| format!("no PowerOnRequested event about {node}"))?;
    ensure!(
        ready_at <= asked_at,
        "{node} was powered on at {asked_at}, before its pod's replacement was Ready at {ready_at}"
    );
    Ok(())
}

/// When `pod` last turned Ready.
fn ready_since(pod: &Pod) -> anyhow::Result<k8s_openapi::jiff::Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .with_context(|| format!("{:?} is not Ready", pod.metadata.name))
}

/// `node`'s BMC Secret, bound (label `podha.io/bmc-node`) to `bound_to`.
/// `podha explain node NODE -o json`, run as a user runs it: whether it says the node is
/// protected (its exit code checked against the answer), and its `bmc` rule's outcome and
/// detail.
fn explained_bmc(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<(bool, String, String)> {
    let podha = std::path::Path::new(env!("CARGO_BIN_EXE_podha"));
    let (protected, answer) =
        podha_sim::testkit::podha_explain(podha, ctx.cluster, &["node", node], PODHA_NS)?;
    let bmc = podha_sim::testkit::explained_rule(&answer, "bmc")
        .with_context(|| format!("podha explain node {node} asked no BMC: {answer}"))?;
    let text = |k: &str| bmc[k].as_str().unwrap_or_default().to_string();
    Ok((protected, text("outcome"), text("detail")))
}

/// `podha explain node NODE`'s `bmc` rule came out `outcome`, its detail saying `word`.
fn bmc_explained(ctx: &Ctx<'_>, node: &str, outcome: &str, word: &str) -> anyhow::Result<bool> {
    let (protected, found, detail) = explained_bmc(ctx, node)?;
    ensure!(
        found == outcome && detail.contains(word),
        "podha explain node {node}: want the bmc rule {outcome} saying {word:?}, got {found}: \
         {detail}"
    );
    log(
        ctx.ns.as_str(),
        format!("podha explain node {node}: bmc {found}: {detail}"),
    );
    Ok(protected)
}

fn bmc_secret(access: &RedfishAccess, node: &str, bound_to: &str) -> anyhow::Result<Secret> {
    Ok(access.secret(node, bound_to, PODHA_NS)?)
}

fn set_key(secret: &mut Secret, key: &str, value: &str) {
    secret
        .string_data
        .get_or_insert_default()
        .insert(key.to_string(), value.to_string());
}

async fn replace_secret(secrets: &Api<Secret>, secret: Secret) -> anyhow::Result<()> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let params = PatchParams::apply("bmc-fence-test").force();
    secrets
        .patch(&name, &params, &Patch::Apply(&secret))
        .await
        .with_context(|| format!("apply Secret {name}"))?;
    Ok(())
}

/// Waits for podha's Warning `PowerOffFailed` about `node` whose note names `cause`.
async fn warned(
    client: &kube::Client,
    node: &str,
    cause: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_for(
        &format!("podha's PowerOffFailed event about {node} naming {cause}"),
        timeout,
        || async {
            let events = node_events(client, node, "PowerOffFailed").await?;
            Ok(events
                .iter()
                .any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.note.as_deref().is_some_and(|n| n.contains(cause))
                })
                .then_some(()))
        },
    )
    .await
}

async fn has_taint(client: &kube::Client, node: &str) -> anyhow::Result<bool> {
    let node: Node = Api::all(client.clone()).get(node).await?;
    Ok(node
        .spec
        .and_then(|s| s.taints)
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE)))
}

async fn untainted_for(client: &kube::Client, node: &str, span: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + span;
    while Instant::now() < until {
        ensure!(
            !has_taint(client, node).await?,
            "{node} was tainted before its BMC said Off"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// podha run in this process as the chart's ServiceAccount, under the chart's RBAC with
/// `rbac.bmcSecrets=true`, leading in [`PODHA_NS`].
struct Podha {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Podha {
    async fn start(cluster: &Cluster) -> anyhow::Result<Self> {
        let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
        let admin = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let chart = podha_sim::chart_install::chart_dir();
        let config = podha_sim::chart_rbac::service_account_config(
            cluster,
            &podha_sim::chart_rbac::helm_path()?,
            &chart,
            PODHA_NS,
            podha::leader::DEFAULT_LEASE_NAME,
            &["rbac.bmcSecrets=true"],
            &admin,
        )?;
        let http = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        // Appended to: each scenario starts a podha, and the first one's log stays.
        let log = cluster.logs_dir().join("podha.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,podha=debug"))
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .try_init();
        let opts = podha::runtime::Options {
            http_addr: http,
            leader: LeaderConfig::new(PODHA_NS, "podha-bmc-test"),
            controller_name: "podha".into(),
        };
        let (stop, mut stopped) = watch::channel(false);
        let client = kube::Client::try_from(config)?;
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = podha::runtime::run(client, opts, shutdown).await {
                eprintln!("podha stopped: {e}");
            }
        });
        wait_for("podha ready and leading", secs(60), || async {
            let ready = http_get(http, "/readyz").is_ok_and(|b| b.contains("ready"));
            let leading = http_get(http, "/metrics")
                .is_ok_and(|m| m.lines().any(|l| l.trim() == "podha_leader 1"));
            Ok((ready && leading).then_some(()))
        })
        .await
        .with_context(|| format!("see {}", log.display()))?;
        Ok(Self { stop, task })
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        tokio::time::timeout(secs(30), self.task)
            .await
            .context("podha did not stop within 30s")??;
        Ok(())
    }
}
