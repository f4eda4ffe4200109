//! `fencing.proof: BMC` on the sim cluster, every node powered through Redfish (one system per
//! node on the `sushy-tools` emulator, which the node's BMC follows), podha running as the
//! chart's ServiceAccount with `rbac.bmcSecrets` (its only way to the BMC Secrets):
//!
//! - a StatefulSet's node is killed; its BMC Secret first points at a port where nothing
//!   listens, then at another node's system (whose UUID is not the node's `systemUUID`), then
//!   holds a wrong password: podha holds the node each time (nothing tainted) with a Warning
//!   `PowerOffFailed` naming the cause (unreachable, not the node's system, the BMC's 401), and
//!   the other node's machine stays on;
//! - the Secret is mended: podha, without a restart, has the BMC force the machine off and
//!   taints the node only once the system says `Off` (read by the test the moment the taint
//!   shows), the pod moves and runs with its volume on the other node;
//! - no other system was powered off;
//! - with `powerCycle`, podha powers the machine on once the failover is done: the node boots,
//!   and podha takes its taint off.
//!
//! Needs the control-plane binaries (`make k8s`), `make sushy-tools`, `make helm` and the
//! `podha-sim` executable (`cargo build -p podha-sim`); without them the test fails saying so.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use podha::chaos::timeline::wait_settled;
use podha::leader::LeaderConfig;
use podha::redfish::PowerState;
use podha_sim::cluster::Cluster;
use podha_sim::cluster::redfish::RedfishAccess;
use podha_sim::failover::{apply_policy, http_get, install_crd};
use podha_sim::testkit::{SharedCluster, create_namespace, statefulset, wait_for};
use serde_json::json;
use tokio::sync::watch;

/// podha's namespace: its Lease and the BMC Secrets.
const PODHA_NS: &str = "podha-system";
const APP_NS: &str = "bmc-fenced";
const PAIR: [&str; 2] = ["node-1", "node-2"];
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bmc-fence] {}", msg.as_ref());
}

#[test]
fn a_dead_node_is_powered_off_through_its_bmc_before_podha_taints_it() {
    let shared = SharedCluster::new(env!("CARGO_TARGET_TMPDIR"), "podha-bmc-fence", 3, None)
        .with_redfish_bmcs();
    let result = (|| -> anyhow::Result<()> {
        let cluster = shared.get().map_err(anyhow::Error::msg)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(scenario(cluster))
    })();
    shared.teardown(result.is_err());
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

async fn scenario(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.client().await?;
    let access = cluster
        .redfish()
        .context("the cluster's nodes have no Redfish BMCs")?;
    install_crd(
        &admin,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/podha.io_podhapolicies.yaml"),
    )
    .await?;
    create_namespace(&admin, PODHA_NS).await?;
    create_namespace(&admin, APP_NS).await?;
    let podha = Podha::start(cluster).await?;

    let secrets: Api<Secret> = Api::namespaced(admin.clone(), PODHA_NS);
    for node in PAIR {
        secrets
            .create(&PostParams::default(), &bmc_secret(&access, node, node)?)
            .await?;
    }
    apply_policy(
        &admin,
        "bare-metal",
        json!({
            "nodeSelector": { "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": PAIR }
            ]},
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": APP_NS } },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "detection": {
                "interval": "1s",
                "failureThreshold": 3,
                "signals": ["Lease", "KubeletTCP"],
                "leaseGracePeriod": "12s",
                "tcpTimeout": "500ms",
            },
            "fencing": {
                "proof": "BMC",
                "bmc": { "secretName": "bmc-{node}", "powerCycle": true },
            },
        }),
    )
    .await?;
    let sts: StatefulSet = serde_json::from_value(statefulset("db", &PAIR))?;
    Api::<StatefulSet>::namespaced(admin.clone(), APP_NS)
        .create(&PostParams::default(), &sts)
        .await?;
    let subject = wait_settled(&admin, APP_NS, "app=db", secs(180))
        .await?
        .context("db-0 did not run with its volume attached within 180s")?;
    let dead = subject.node.clone();
    let refuge = PAIR.into_iter().find(|n| *n != dead).unwrap_or("node-2");
    log(format!("db-0 runs on {dead}"));

    // A BMC nobody answers at: held, with the cause.
    let mut unreachable = bmc_secret(&access, &dead, &dead)?;
    set_key(&mut unreachable, "address", "https://127.0.0.1:1");
    replace_secret(&secrets, unreachable).await?;
    cluster.kill_node(&dead)?;
    let killed = Instant::now();
    warned(&admin, &dead, "unreachable", secs(60)).await?;
    untainted_for(&admin, &dead, secs(3)).await?;
    log(format!(
        "{dead} held {:.1?} after its death: BMC unreachable",
        killed.elapsed()
    ));

    // Another machine's BMC (node-3's system) in the dead node's Secret: its UUID is not the
    // node's, so podha refuses it, and node-3 is not powered off.
    let mut elsewhere = bmc_secret(&access, &dead, &dead)?;
    set_key(&mut elsewhere, "systemId", "node-3");
    replace_secret(&secrets, elsewhere).await?;
    warned(&admin, &dead, "not node", secs(60)).await?;
    untainted_for(&admin, &dead, secs(3)).await?;
    ensure!(
        access.system("node-3")?.power_state().await? == PowerState::On,
        "node-3's system was powered off through {dead}'s Secret"
    );
    log(format!("{dead} held: its Secret leads to node-3's system"));

    // A BMC that refuses podha's credentials (401): held, with the cause.
    let mut refused = bmc_secret(&access, &dead, &dead)?;
    set_key(&mut refused, "password", "not-the-password");
    replace_secret(&secrets, refused).await?;
    warned(&admin, &dead, "HTTP 401", secs(60)).await?;
    untainted_for(&admin, &dead, secs(3)).await?;
    ensure!(
        access.system(&dead)?.power_state().await? == PowerState::On,
        "{dead}'s system was powered off though podha could not log in"
    );
    log(format!("{dead} held: BMC answers 401"));

    // Mended: podha powers the machine off, and only then taints the node.
    replace_secret(&secrets, bmc_secret(&access, &dead, &dead)?).await?;
    let mended = Instant::now();
    let system = access.system(&dead)?;
    let state_at_taint = wait_for(
        &format!("podha's out-of-service taint on {dead}"),
        secs(90),
        || async {
            if !has_taint(&admin, &dead).await? {
                return Ok(None);
            }
            Ok(Some(system.power_state().await?))
        },
    )
    .await?;
    ensure!(
        state_at_taint == PowerState::Off,
        "{dead} was tainted while its system said {state_at_taint}"
    );
    log(format!(
        "{dead} powered off and tainted {:.1?} after its Secret was mended",
        mended.elapsed()
    ));
    for reason in ["PowerOffRequested", "PoweredOff", "OutOfServiceTaintAdded"] {
        ensure!(
            !node_events(&admin, &dead, reason).await?.is_empty(),
            "no {reason} event about {dead}"
        );
    }
    let taint_note = node_events(&admin, &dead, "OutOfServiceTaintAdded").await?[0]
        .note
        .clone()
        .unwrap_or_default();
    ensure!(
        taint_note.contains("BMCPoweredOff"),
        "the taint's event does not name the proof: {taint_note}"
    );
    wait_for(
        &format!("db-0 running on {refuge} with its volume"),
        secs(120),
        || async {
            Ok(wait_settled(&admin, APP_NS, "app=db", secs(1))
                .await?
                .filter(|s| s.node == refuge && s.uid != subject.uid))
        },
    )
    .await?;
    log(format!("db-0 recovered on {refuge}"));
    for node in ["node-1", "node-2", "node-3"]
        .into_iter()
        .filter(|n| *n != dead)
    {
        ensure!(
            access.system(node)?.power_state().await? == PowerState::On,
            "{node}'s system was powered off"
        );
    }

    // powerCycle: podha powers the machine on again; the node boots and podha takes its taint
    // off.
    wait_for(
        &format!("podha to take its taint off {dead}"),
        secs(120),
        || async { Ok((!has_taint(&admin, &dead).await?).then_some(())) },
    )
    .await?;
    // On only once the failover was done: after the replacement was Ready.
    let powered_on = node_events(&admin, &dead, "PowerOnRequested").await?;
    let asked_at = powered_on
        .first()
        .and_then(|e| e.event_time.as_ref())
        .map(|t| t.0)
        .with_context(|| format!("no PowerOnRequested event about {dead}"))?;
    let replacement: Pod = Api::namespaced(admin.clone(), APP_NS).get("db-0").await?;
    let ready_at = replacement
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| {
            c.into_iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time)
        .map(|t| t.0)
        .context("the replacement db-0 is not Ready")?;
    ensure!(
        ready_at <= asked_at,
        "{dead} was powered on at {asked_at}, before its pod's replacement was Ready at {ready_at}"
    );
    ensure!(system.power_state().await? == PowerState::On);
    log(format!("{dead} powered on by podha, booted and untainted"));
    podha.stop().await
}

/// `node`'s BMC Secret, bound (label `podha.io/bmc-node`) to `bound_to`.
fn bmc_secret(access: &RedfishAccess, node: &str, bound_to: &str) -> anyhow::Result<Secret> {
    let ca = std::fs::read_to_string(&access.ca_file)
        .with_context(|| format!("read {}", access.ca_file.display()))?;
    let data: BTreeMap<String, String> = [
        ("address", access.address.clone()),
        ("username", access.username.clone()),
        ("password", access.password.clone()),
        ("systemId", node.to_string()),
        ("ca.crt", ca),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": format!("bmc-{node}"),
            "namespace": PODHA_NS,
            "labels": { podha::api::BMC_NODE_LABEL: bound_to },
        },
        "stringData": data,
    }))?)
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

async fn node_events(
    client: &kube::Client,
    node: &str,
    reason: &str,
) -> anyhow::Result<Vec<Event>> {
    podha_sim::testkit::podha_events(client, "default", reason, node).await
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
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/podha");
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
        let log = cluster.logs_dir().join("podha.log");
        let file = std::fs::File::create(&log)?;
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
