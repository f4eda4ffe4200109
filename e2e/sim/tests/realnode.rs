//! A real node beside kwok nodes: the sim cluster's real kubelet and containerd (see
//! `cluster/realnode`) register the node, run a pod's containers (the project's own pause
//! image, imported without a registry), and go through the faults a machine has:
//!
//! - kill: every process of the node SIGKILLed, containers included; the node goes `Unknown`,
//!   its address stops answering; a reboot brings it back Ready with a new boot ID, and the
//!   workload runs there again in new containers;
//! - freeze: the node's processes stop (a hung machine): the node goes `Unknown` while every
//!   process is still there; thawed, it is Ready again with the same boot ID and the same
//!   containers;
//! - partition: the node's packets to the API server are dropped: the node goes `Unknown`
//!   while its kubelet and containers run (and its kubelet port answers); healed, it is Ready
//!   again with the same containers;
//! - power off through the BMC: the node reports its BMC's system's UUID as its `systemUUID`;
//!   the Redfish service answers on the node's own network (where podha installed by its
//!   chart reaches it);
//!   frozen, its Redfish system (the cluster's sushy-tools emulator) sent `ForceOff`: once the system reports `Off`, the node's BMC kills every
//!   process of it; `On` boots it with a new boot ID.
//!   Then the sim's own processes' log files carry no colour escapes.
//!
//! Needs root, `make k8s csi-sidecars node-deps node-images sushy-tools` (`make real-node-test`
//! does it);
//! without them the tests fail and say which target to run.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use libtest_mimic::Arguments;
use podha::redfish::{PowerState, ResetType};
use podha_sim::cluster::PAUSE_IMAGE;
use podha_sim::cluster::bmc::REDFISH_OFF_REASON;
use podha_sim::cluster::process::{ProcRecord, is_alive};
use podha_sim::testkit::*;
use serde_json::json;

const KWOK_NODES: usize = 2;
/// The real node comes after the kwok ones.
const REAL_NODE: &str = "node-3";

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // The scenarios break the same node: one at a time.
    args.test_threads = Some(1);
    let shared = Arc::new(
        SharedCluster::new(
            env!("CARGO_TARGET_TMPDIR"),
            "podha-sim-realnode",
            KWOK_NODES,
            Some(env!("CARGO_BIN_EXE_podha-sim").into()),
        )
        .with_real_nodes(1)
        .with_redfish_bmcs(),
    );
    let scenarios: [Scenario; 4] = [
        (
            "a_killed_real_node_loses_every_process_and_reboots",
            kill_and_reboot,
        ),
        (
            "a_frozen_real_node_goes_unknown_and_comes_back",
            freeze_and_thaw,
        ),
        (
            "a_partitioned_real_node_goes_unknown_while_its_containers_run",
            partition_and_heal,
        ),
        (
            "a_frozen_real_node_is_powered_off_through_its_bmc_and_on_again",
            power_off_and_on,
        ),
    ];
    run_trials(&args, &shared, scenarios.into())
}

/// A one-replica Deployment of the pause image, pinned to the real node; `stay` tolerates
/// the node's unreachable taint forever (no eviction while it is away).
fn pause_deployment(name: &str, stay: bool) -> serde_json::Value {
    let tolerations = if stay {
        json!([
            { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute" },
            { "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute" },
        ])
    } else {
        json!([])
    };
    deployment_of(
        name,
        json!({
            "nodeSelector": { "kubernetes.io/hostname": REAL_NODE },
            "terminationGracePeriodSeconds": 1,
            "tolerations": tolerations,
            "containers": [{
                "name": "pause",
                "image": PAUSE_IMAGE,
                "imagePullPolicy": "Never",
            }],
        }),
    )
}

/// The container ID of a pod whose only container runs and has started (per the CRI).
fn started_container(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let running = status.state.as_ref()?.running.is_some();
    (running && status.started == Some(true) && status.ready)
        .then(|| status.container_id.clone())?
}

/// The live pod of `app` on the real node, once it is Ready and its container runs, in a
/// container other than `not` (a status the dead kubelet left reads as running); returns the
/// pod and the container ID.
async fn wait_started_on_real_node(
    ctx: &Ctx<'_>,
    app: &str,
    not: Option<&str>,
) -> anyhow::Result<(Pod, String)> {
    let what = match not {
        Some(old) => {
            format!("a pod of {app} running on {REAL_NODE} in a container other than {old}")
        }
        None => format!("a pod of {app} running on {REAL_NODE}"),
    };
    wait_for(&what, secs(90), || async {
        Ok(ctx.app_pods(app).await?.into_iter().find_map(|p| {
            let live = node_of(&p) == Some(REAL_NODE) && !terminating(&p) && running_ready(&p);
            let id = started_container(&p).filter(|id| live && Some(id.as_str()) != not)?;
            Some((p, id))
        }))
    })
    .await
}

fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

/// The node's processes by command name, as recorded now.
fn node_processes(ctx: &Ctx<'_>) -> anyhow::Result<Vec<(String, ProcRecord)>> {
    Ok(ctx
        .cluster
        .node_pids(REAL_NODE)?
        .into_iter()
        .filter_map(|pid| Some((comm(pid), ProcRecord::of(pid)?)))
        .collect())
}

fn names(procs: &[(String, ProcRecord)]) -> BTreeSet<&str> {
    procs.iter().map(|(n, _)| n.as_str()).collect()
}

/// What the real node is before a fault: a containerd node, Ready, labelled, on its own
/// address, running the kubelet, containerd, a shim and the pod's pause processes.
async fn check_real_node(ctx: &Ctx<'_>) -> anyhow::Result<(Node, Vec<(String, ProcRecord)>)> {
    let node = ctx.nodes().get(REAL_NODE).await?;
    let info = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.clone())
        .unwrap_or_default();
    anyhow::ensure!(
        info.container_runtime_version.starts_with("containerd://"),
        "{REAL_NODE} runs {:?}, not containerd",
        info.container_runtime_version
    );
    anyhow::ensure!(
        ready_status(&node).as_deref() == Some("True"),
        "{REAL_NODE} is not Ready"
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    anyhow::ensure!(
        labels.get("type").map(String::as_str) == Some("real"),
        "labels {labels:?}"
    );
    let ip = ctx.cluster.node_ip(REAL_NODE)?;
    anyhow::ensure!(
        ip.octets()[..2] == [172, 31],
        "{REAL_NODE} has address {ip}"
    );
    let procs = node_processes(ctx)?;
    let seen = names(&procs);
    for expected in ["kubelet", "containerd", "containerd-shim", "pause"] {
        anyhow::ensure!(
            seen.contains(expected),
            "no {expected} among the node's processes {seen:?}"
        );
    }
    Ok((node, procs))
}

fn kill_and_reboot(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "realnode-kill", |ctx| async move {
        let ns = ctx.ns.clone();
        ctx.create::<Deployment>(pause_deployment("sleeper", false))
            .await?;
        let (pod, container) = wait_started_on_real_node(&ctx, "sleeper", None).await?;
        log(&ns, format!("{} runs container {container}", name_of(&pod)));
        let (node, before) = check_real_node(&ctx).await?;
        let old_boot = boot_id(&node);
        let kubelet_port = ctx.cluster.node(REAL_NODE)?.kubelet_port;
        let endpoint = SocketAddr::from((ctx.cluster.node_ip(REAL_NODE)?, kubelet_port));
        anyhow::ensure!(
            TcpStream::connect_timeout(&endpoint, secs(2)).is_ok(),
            "the live kubelet does not accept connections on {endpoint}"
        );

        ctx.cluster.kill_node(REAL_NODE)?;
        let survivors: Vec<&(String, ProcRecord)> =
            before.iter().filter(|(_, r)| is_alive(r)).collect();
        anyhow::ensure!(
            survivors.is_empty(),
            "processes of the killed node still run: {survivors:?}"
        );
        let left = ctx.cluster.node_pids(REAL_NODE)?;
        anyhow::ensure!(
            left.is_empty(),
            "the killed node's cgroup still holds pids {left:?}"
        );
        anyhow::ensure!(
            TcpStream::connect_timeout(&endpoint, secs(1)).is_err(),
            "the killed node's kubelet port still answers"
        );
        let status = ctx.wait_not_ready(REAL_NODE, secs(60)).await?;
        anyhow::ensure!(
            status == "Unknown",
            "killed node's Ready is {status}, not Unknown"
        );
        log(&ns, "node killed: every process gone, Ready Unknown");

        ctx.cluster.start_node(REAL_NODE).await?;
        let node = ctx.nodes().get(REAL_NODE).await?;
        let new_boot = boot_id(&node);
        anyhow::ensure!(
            !new_boot.is_empty() && new_boot != old_boot,
            "boot ID {old_boot} did not change on reboot (now {new_boot:?})"
        );
        // A timeout here means the old container's status is all there is.
        let (pod, new_container) =
            wait_started_on_real_node(&ctx, "sleeper", Some(&container)).await?;
        log(
            &ns,
            format!(
                "rebooted (boot ID {new_boot}); {} runs {new_container}",
                name_of(&pod)
            ),
        );
        check_real_node(&ctx).await?;
        remove_app(&ctx, "sleeper").await
    })
}

/// Deletes the Deployment `app` and waits for its pods to leave the real node, so the next
/// scenario finds no process of this one there.
async fn remove_app(ctx: &Ctx<'_>, app: &str) -> anyhow::Result<()> {
    Api::<Deployment>::namespaced(ctx.client.clone(), &ctx.ns)
        .delete(app, &DeleteParams::foreground())
        .await?;
    only_pods_of(ctx, &format!("{app}-deleted")).await
}

/// Waits until every pod on the real node belongs to `app` of this scenario's namespace (none
/// when there is no such app), apart from the node's DaemonSet pods (podha-csi's node plugin,
/// which every real node runs): processes of other scenarios' pods may come and go.
async fn only_pods_of(ctx: &Ctx<'_>, app: &str) -> anyhow::Result<()> {
    let all: Api<Pod> = Api::all(ctx.client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={REAL_NODE}"));
    let ns = ctx.ns.as_str();
    wait_for(
        &format!("{REAL_NODE} to run pods of {ns}/{app} only"),
        secs(60),
        || async {
            let pods = all.list(&on_node).await?.items;
            Ok(pods
                .iter()
                .filter(|p| !owned_by_daemonset(p))
                .all(|p| {
                    let labels = p.metadata.labels.clone().unwrap_or_default();
                    p.metadata.namespace.as_deref() == Some(ns)
                        && labels.get("app").map(String::as_str) == Some(app)
                })
                .then_some(()))
        },
    )
    .await
}

fn owned_by_daemonset(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

fn freeze_and_thaw(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "realnode-freeze", |ctx| async move {
        let ns = ctx.ns.clone();
        ctx.create::<Deployment>(pause_deployment("hung", true))
            .await?;
        let (_, container) = wait_started_on_real_node(&ctx, "hung", None).await?;
        only_pods_of(&ctx, "hung").await?;
        let (node, before) = check_real_node(&ctx).await?;
        let old_boot = boot_id(&node);

        ctx.cluster.freeze_node(REAL_NODE)?;
        let thaw_on_error = async {
            let status = ctx.wait_not_ready(REAL_NODE, secs(60)).await?;
            anyhow::ensure!(
                status == "Unknown",
                "frozen node's Ready is {status}, not Unknown"
            );
            let gone: Vec<&(String, ProcRecord)> =
                before.iter().filter(|(_, r)| !is_alive(r)).collect();
            anyhow::ensure!(gone.is_empty(), "a frozen node lost processes: {gone:?}");
            log(&ns, "node frozen: Ready Unknown, every process still there");
            Ok(())
        }
        .await;
        ctx.cluster.thaw_node(REAL_NODE)?;
        thaw_on_error?;

        ctx.wait_ready(REAL_NODE, secs(60)).await?;
        let node = ctx.nodes().get(REAL_NODE).await?;
        anyhow::ensure!(
            boot_id(&node) == old_boot,
            "a thawed node has a new boot ID"
        );
        let (_, after) = wait_started_on_real_node(&ctx, "hung", None).await?;
        let gone: Vec<&(String, ProcRecord)> =
            before.iter().filter(|(_, r)| !is_alive(r)).collect();
        anyhow::ensure!(gone.is_empty(), "a thawed node lost processes: {gone:?}");
        anyhow::ensure!(
            after == container,
            "the container changed from {container} to {after}"
        );
        log(&ns, "thawed: Ready, same boot ID, same container");
        remove_app(&ctx, "hung").await
    })
}

fn partition_and_heal(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "realnode-partition", |ctx| async move {
        let ns = ctx.ns.clone();
        ctx.create::<Deployment>(pause_deployment("cut-off", true))
            .await?;
        let (_, container) = wait_started_on_real_node(&ctx, "cut-off", None).await?;
        only_pods_of(&ctx, "cut-off").await?;
        let (node, before) = check_real_node(&ctx).await?;
        let endpoint = SocketAddr::from((
            ctx.cluster.node_ip(REAL_NODE)?,
            ctx.cluster.node(REAL_NODE)?.kubelet_port,
        ));

        ctx.cluster.partition_node(REAL_NODE, true)?;
        let heal_on_error = async {
            let status = ctx.wait_not_ready(REAL_NODE, secs(60)).await?;
            anyhow::ensure!(
                status == "Unknown",
                "cut-off node's Ready is {status}, not Unknown"
            );
            let gone: Vec<&(String, ProcRecord)> =
                before.iter().filter(|(_, r)| !is_alive(r)).collect();
            anyhow::ensure!(gone.is_empty(), "a cut-off node lost processes: {gone:?}");
            anyhow::ensure!(
                TcpStream::connect_timeout(&endpoint, secs(2)).is_ok(),
                "a cut-off node's kubelet port stopped answering the host"
            );
            log(
                &ns,
                "node cut off: Ready Unknown, processes running, kubelet port answering",
            );
            Ok(())
        }
        .await;
        ctx.cluster.partition_node(REAL_NODE, false)?;
        heal_on_error?;

        ctx.wait_ready(REAL_NODE, secs(60)).await?;
        let (_, after) = wait_started_on_real_node(&ctx, "cut-off", None).await?;
        anyhow::ensure!(
            after == container,
            "the container changed from {container} to {after}"
        );
        let node_now = ctx.nodes().get(REAL_NODE).await?;
        anyhow::ensure!(
            boot_id(&node_now) == boot_id(&node),
            "a healed node has a new boot ID"
        );
        log(&ns, "healed: Ready, same container");
        remove_app(&ctx, "cut-off").await
    })
}

/// The Redfish service answers on the real node's own network, at the nodes' bridge address,
/// its certificate valid for that address and its credentials taken: where podha installed
/// by its chart (a pod on a real node) reaches the BMCs.
fn reached_from_the_node(
    ctx: &Ctx<'_>,
    access: &podha_sim::cluster::redfish::RedfishAccess,
) -> anyhow::Result<()> {
    let from_nodes = access.from_nodes()?;
    let systems = podha_sim::chart_install::curl_in_node(
        ctx.cluster,
        REAL_NODE,
        [
            "--fail".into(),
            "--cacert".into(),
            from_nodes.ca_file.clone().into_os_string(),
            "--user".into(),
            format!("{}:{}", from_nodes.username, from_nodes.password).into(),
            format!("{}/redfish/v1/Systems", from_nodes.address).into(),
        ],
    )?;
    let listed: serde_json::Value = serde_json::from_str(&systems)?;
    let count = listed["Members@odata.count"].as_u64();
    anyhow::ensure!(
        count == Some(ctx.cluster.nodes().len() as u64),
        "from {REAL_NODE}'s network, {} listed {count:?} systems: {systems}",
        from_nodes.address
    );
    Ok(())
}

fn power_off_and_on(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, "realnode-bmc", |ctx| async move {
        let ns = ctx.ns.clone();
        ctx.create::<Deployment>(pause_deployment("powered", true))
            .await?;
        let (_, container) = wait_started_on_real_node(&ctx, "powered", None).await?;
        let (node, before) = check_real_node(&ctx).await?;
        let old_boot = boot_id(&node);
        let access = ctx
            .cluster
            .redfish()
            .ok_or_else(|| anyhow::anyhow!("the cluster's nodes have no Redfish BMCs"))?;
        let bmc = access.system(REAL_NODE)?;
        let reading = bmc.read().await?;
        anyhow::ensure!(reading.power == PowerState::On);
        // The machine's identity: the UUID its kubelet reports is its BMC's system's.
        let reported = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.system_uuid.clone())
            .unwrap_or_default();
        let system_uuid = reading.uuid.clone().unwrap_or_default();
        anyhow::ensure!(
            !system_uuid.is_empty()
                && podha::api::canonical_uuid(&reported)
                    == podha::api::canonical_uuid(&system_uuid),
            "{REAL_NODE} reports systemUUID {reported:?}, its BMC's system says UUID {system_uuid:?}"
        );

        reached_from_the_node(&ctx, &access)?;

        ctx.cluster.freeze_node(REAL_NODE)?;
        let fences_before = ctx.cluster.fences()?.len();
        bmc.reset(ResetType::ForceOff).await?;
        // The emulator applies the reset 0-11 s after it, when the BMC next reads the system.
        let powered_off = wait_for(
            "the frozen node powered off by its BMC",
            secs(30),
            || async {
                let fenced = ctx
                    .cluster
                    .fences()?
                    .into_iter()
                    .skip(fences_before)
                    .find(|f| f.node == REAL_NODE && f.reason == REDFISH_OFF_REASON);
                Ok(fenced.filter(|_| before.iter().all(|(_, r)| !is_alive(r))))
            },
        )
        .await;
        if powered_off.is_err() {
            // Leave no frozen node to the next run's reader of the logs.
            ctx.cluster.thaw_node(REAL_NODE)?;
        }
        powered_off?;
        anyhow::ensure!(
            ctx.cluster.node_pids(REAL_NODE)?.is_empty(),
            "the powered-off node's cgroup still holds processes"
        );
        // Off stays off: nothing boots the node while its system says so.
        tokio::time::sleep(secs(3)).await;
        anyhow::ensure!(bmc.power_state().await? == PowerState::Off);
        anyhow::ensure!(
            ctx.cluster.node_pids(REAL_NODE)?.is_empty(),
            "the node runs again while its system says Off"
        );
        log(
            &ns,
            "powered off through Redfish: every process of the frozen node gone",
        );

        bmc.reset(ResetType::On).await?;
        wait_for(
            "the node booted again with a new boot ID",
            secs(120),
            || async {
                let node = ctx.nodes().get(REAL_NODE).await?;
                let booted =
                    boot_id(&node) != old_boot && ready_status(&node).as_deref() == Some("True");
                Ok(booted.then_some(()))
            },
        )
        .await?;
        let (_, after) = wait_started_on_real_node(&ctx, "powered", Some(&container)).await?;
        log(
            &ns,
            format!("powered on through Redfish: booted, the pod runs {after}"),
        );
        check_real_node(&ctx).await?;
        plain_logs(&ctx)?;
        remove_app(&ctx, "powered").await
    })
}

/// The sim's own processes (the BMC stand-ins, the power-on, the CSI plugins) write their
/// logs to files, and files get no colour escapes: they are read in editors, grepped and
/// kept by CI.
fn plain_logs(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let dir = ctx.cluster.dir().join("logs");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !["bmc-", "power-on-", "csi-plugin-"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            continue;
        }
        let text = std::fs::read(&path)?;
        anyhow::ensure!(
            !text.contains(&0x1b),
            "{} holds colour escapes",
            path.display()
        );
        read += 1;
    }
    anyhow::ensure!(
        read >= 3,
        "found {read} logs of the sim's own processes in {}",
        dir.display()
    );
    Ok(())
}
