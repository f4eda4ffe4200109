//! podha installed by its own chart onto real nodes, as docs/install.md tells a user (the image
//! loaded into the nodes' containerd instead of pulled, like `kind load`), failing over pods
//! that write through podha-csi volumes (the node plugin is podha-csi's DaemonSet, registered
//! with the real kubelets):
//!
//! - both replicas run on the real nodes, Ready, as the chart's ServiceAccount, reaching the API
//!   server through the `kubernetes` Service; one holds the leader Lease and says so on
//!   `/metrics` (read from inside its node's network namespace), the other says it does not;
//! - the chart's agent DaemonSet runs `podha agent` on every real node, as its own
//!   ServiceAccount, each advertising itself on its Node (values as a user with BMCs would
//!   write them: `chart_install::sim_agent_values`);
//! - every command the release's NOTES show, and every `kubectl` command of the README, runs as
//!   a user pastes it, in bash with the sim's kubectl (an example policy as a server-side dry
//!   run, the metrics through a port-forward);
//! - a PodHAPolicy is reported `Ready=True`;
//! - the policy asks for the default proof, the agent's: a killed node is fenced by its
//!   agent's silence before its volume moves;
//! - the node running the leading replica and PostgreSQL (`podha_sim::postgres`: on a volume of
//!   the class that does not fence, beside podha-csi's writer, a client committing numbered
//!   transactions through its Service from the other replica's node) is killed: the other
//!   replica takes the Lease and, though it never heard that node's agent, counts its silence
//!   (the agent's Lease says the last leader heard it in this boot) from its own first
//!   unanswered probe, and completes the failover under the agent's proof without a person,
//!   the replacement on another node with its volume attached there and no longer on the
//!   dead one, the write log without a split-brain write or a lost acknowledged write; the
//!   client goes on through the Service, and PostgreSQL's own check (`e2e/postgres/check.sh`)
//!   finds every acknowledged transaction, clean checksums and `pg_amcheck`, one crash
//!   recovery and never two servers at once;
//! - `podha chaos`, as a user runs it, kills the database's node again, with that check as
//!   its `--check`: the replacement runs elsewhere, podha-csi's data check and PostgreSQL's
//!   are clean (two crash recoveries by then), the node boots again and podha takes its taint
//!   off (the demo, `make demo` in CI, kills a node of a cluster of the chart's defaults);
//! - a new leader whose node cannot reach two of the five agents: no node reboots, both agents
//!   stay up as the new leader never heard them, and podha reports them unreachable
//!   (`new_leader.rs`);
//! - podha's own path to three healthy nodes down for 60 s, their kubelets renewing, judged on
//!   podha's probes alone: no fence asked, no reboot, each reported; then again under the
//!   agents' silence proof: their agents renew their Leases and stay up (`path_fault.rs`);
//! - `AgentAcknowledged` with the chart's image: the agents upgraded to kill their node's
//!   BestEffort pods' cgroup and confirm it empty; a writer's node whose kubelet died is fenced
//!   by its agent, which acknowledges, alone and under `anyOf: [AgentAcknowledged, BMC]` with
//!   the BMC unreachable (`acknowledged.rs`).
//!
//! Needs root, `make k8s csi-sidecars node-deps node-images helm image` (`make real-node-test`
//! does it; `node-images` builds PostgreSQL's image too); without them the test fails and says
//! which target to run.

#[path = "realnode_podha/acknowledged.rs"]
mod acknowledged;
#[path = "realnode_podha/fencing.rs"]
mod fencing;
#[path = "realnode_podha/flood.rs"]
mod flood;
#[path = "realnode_podha/forged_words.rs"]
mod forged_words;
#[path = "realnode_podha/new_leader.rs"]
mod new_leader;
#[path = "realnode_podha/path_fault.rs"]
mod path_fault;
#[path = "realnode_podha/paused.rs"]
mod paused;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use libtest_mimic::Arguments;
use podha_sim::chart_install::{self, RELEASE};
use podha_sim::csi::workload;
use podha_sim::postgres;
use podha_sim::testkit::*;
use serde_json::json;

const KWOK_NODES: usize = 1;
const REAL_NODES: usize = 5;
/// Where the writers run (the policy selects it).
const WRITERS: &str = "writers";
const POLICY: &str = "real-nodes";
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
/// Acknowledged writes a writer must have before its node is killed, and its replacement
/// after (10 per second).
const WRITES: usize = 20;
/// PostgreSQL's client (`podha_sim::postgres`), and how many transactions it must have seen
/// acknowledged before the database's node is killed, and again after the failover.
const DB_CLIENT: &str = "db-client";
const TRANSACTIONS: usize = 30;

/// The real nodes' podha agents (the chart's DaemonSet): how long podha may not hear one before
/// it fences its node, the timeout of the watchdog (the node's BMC's) each pets, and how long
/// their peer surveys may take: the shortest set the agent accepts (docs/agent.md, "Timing"),
/// the one `make bench-failover`'s agent mode measures.
use podha_sim::bench::failover::{
    AGENT_ISOLATION_TIMEOUT as ISOLATION_TIMEOUT, AGENT_WATCHDOG_TIMEOUT as WATCHDOG_TIMEOUT,
    SHORTEST_AGENT_TIMINGS,
};

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let shared = Arc::new(
        SharedCluster::new(
            env!("CARGO_TARGET_TMPDIR"),
            "podha-sim-realnode-podha",
            KWOK_NODES,
            Some(env!("CARGO_BIN_EXE_podha-sim").into()),
        )
        .with_real_nodes(REAL_NODES)
        .with_real_node_watchdog(WATCHDOG_TIMEOUT),
    );
    let scenarios: [Scenario; 4] = [
        (
            "podha_installed_by_its_chart_fails_writers_over_on_real_nodes",
            installed_by_chart,
        ),
        (
            "frozen_and_isolated_nodes_are_fenced_before_their_volumes_move_one_cut_off_the_api_server_is_left_alone",
            fencing::frozen_and_cut_off_nodes,
        ),
        (
            "crashed_podha_processes_and_an_api_server_hung_or_stopped_for_60s_fence_no_node",
            fencing::control_plane_faults,
        ),
        (
            "a_node_whose_kubelet_died_is_fenced_by_its_agent_which_acknowledges_with_the_charts_image",
            acknowledged::kubelet_down_fenced_by_its_agent,
        ),
    ];
    run_trials(&args, &shared, scenarios.into())
}

fn leader_gauge(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("podha_leader "))
        .map(str::trim)
}

/// Waits (10 s) until the pod's `/metrics` shows `podha_leader <value>`: the gauge follows the
/// Lease a moment later.
async fn wait_leader_gauge(ctx: &Ctx<'_>, pod: &Pod, value: &str) -> anyhow::Result<()> {
    let mut last = None;
    let what = format!("{}'s /metrics to say podha_leader {value}", name_of(pod));
    let res = wait_for(&what, secs(10), || {
        let text = chart_install::pod_metrics(ctx.cluster, pod);
        let seen = text
            .as_deref()
            .ok()
            .and_then(leader_gauge)
            .map(str::to_string);
        let done = seen.as_deref() == Some(value);
        last = Some(text.map(|_| seen));
        async move { Ok(done.then_some(())) }
    })
    .await;
    res.with_context(|| format!("last seen: {last:?}"))
}

async fn label_node(ctx: &Ctx<'_>, node: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let patch = json!({ "metadata": { "labels": { key: value } } });
    ctx.nodes()
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("label {node}"))?;
    Ok(())
}

/// docs/install.md §2, with the image the nodes already have (chart default
/// podha:<appVersion>, pullPolicy IfNotPresent), the replicas kept to `replica_nodes`, and
/// docs/agent.md's agent on every real node; waits until an agent runs on each.
async fn install(
    ctx: &Ctx<'_>,
    helm: &std::path::Path,
    replica_nodes: &[&str],
) -> anyhow::Result<()> {
    for node in replica_nodes {
        label_node(ctx, node, "podha-test/replicas", "yes").await?;
    }
    let agent = SHORTEST_AGENT_TIMINGS.sim_values();
    chart_install::install(
        ctx.cluster,
        helm,
        &agent,
        &["nodeSelector.podha-test/replicas=yes"],
    )
}

/// The chart's agents: one Running on every real node as the agent's ServiceAccount, each
/// advertising its port and isolation timeout on its Node, and keeping its Lease in the
/// release namespace, owned by its pod.
async fn wait_agents(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let real = real_nodes();
    let real: Vec<&str> = real.iter().map(String::as_str).collect();
    let pods = chart_install::wait_agents(&ctx.client, &real, secs(120)).await?;
    for p in &pods {
        let sa = p
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref());
        ensure!(
            sa == Some(&format!("{RELEASE}-agent")),
            "{} runs as {sa:?}",
            name_of(p)
        );
    }
    let timeout = humantime::format_duration(ISOLATION_TIMEOUT).to_string();
    for node in &real {
        wait_for(
            &format!("{node}'s agent to advertise itself on the Node"),
            secs(30),
            || async {
                let n = ctx.nodes().get(node).await?;
                let a = n.metadata.annotations.unwrap_or_default();
                let port = a
                    .get(podha::contract::AGENT_PORT_ANNOTATION)
                    .map(String::as_str);
                // With a watchdog the node is fenced by the isolation timeout.
                let fenced_within = a.get(podha::contract::AGENT_FENCED_WITHIN_ANNOTATION);
                Ok((port == Some("9441") && fenced_within == Some(&timeout)).then_some(()))
            },
        )
        .await?;
        let pod = pods
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(*node))
            .with_context(|| format!("no agent pod on {node}"))?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
        let lease_name = podha::contract::agent_lease_name(node);
        let owned_by_pod = |lease: &k8s_openapi::api::coordination::v1::Lease| {
            let owners = lease
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default();
            owners
                .iter()
                .any(|o| o.kind == "Pod" && Some(&o.uid) == pod.metadata.uid.as_ref())
        };
        wait_for(
            &format!("{node}'s agent Lease, owned by its pod"),
            secs(30),
            || async {
                let lease = leases.get_opt(&lease_name).await?;
                Ok(lease
                    .filter(|l| {
                        owned_by_pod(l)
                            && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                                == Some(*node)
                    })
                    .map(|_| ()))
            },
        )
        .await?;
    }
    Ok(())
}

/// The real nodes, `node-<KWOK_NODES + 1>` on.
fn real_nodes() -> Vec<String> {
    (KWOK_NODES + 1..=KWOK_NODES + REAL_NODES)
        .map(|i| format!("node-{i}"))
        .collect()
}

/// How many podha events of `reason` each of `nodes` has had, with their repeats.
async fn node_reports(ctx: &Ctx<'_>, reason: &str, nodes: &[&str]) -> anyhow::Result<Vec<i32>> {
    let mut counts = Vec::new();
    for node in nodes {
        counts.push(podha_event_count(&ctx.client, "default", reason, node).await?);
    }
    Ok(counts)
}

fn policies(ctx: &Ctx<'_>) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("podha.io", "v1alpha1", "PodHAPolicy");
    Api::all_with(ctx.client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Deletes the PodHAPolicies `names` that exist: an earlier scenario's policy selecting the
/// same nodes would change what podha may do to them.
async fn delete_policies(
    ctx: &Ctx<'_>,
    names: impl IntoIterator<Item = &str>,
) -> anyhow::Result<()> {
    for name in names {
        match policies(ctx).delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("delete PodHAPolicy {name}")),
        }
    }
    Ok(())
}

/// Applies PodHAPolicy `name` with `spec` (server-side apply) and waits until it is Ready.
async fn apply_policy_spec(
    ctx: &Ctx<'_>,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "podha.io/v1alpha1",
        "kind": "PodHAPolicy",
        "metadata": { "name": name },
        "spec": spec,
    }))?;
    policies(ctx)
        .patch(
            name,
            &PatchParams::apply("realnode-podha").force(),
            &Patch::Apply(&policy),
        )
        .await
        .with_context(|| format!("apply PodHAPolicy {name}"))?;
    wait_policy_ready(ctx, name).await
}

/// Applies the policy: the real nodes, the writers' namespace, fast detection, the taint.
async fn apply_policy(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    apply_policy_spec(
        ctx,
        POLICY,
        json!({
            "nodeSelector": { "matchLabels": { "type": "real" } },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": WRITERS } },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "detection": {
                "signals": ["Lease", "KubeletTCP"],
                "interval": "1s",
                "failureThreshold": 3,
                "leaseGracePeriod": "11s",
                "tcpTimeout": "500ms",
            },
            "action": "OutOfServiceTaint",
            // Nodes die one after another, each failed over before the next (the leader's
            // node stays dead through the chaos trial): the recently-failed window would
            // rightly hold the later failovers (maxUnhealthy 30 %: one node of four).
            "safety": { "maxUnhealthy": 2, "unhealthyWindow": "0s" },
        }),
    )
    .await
}

async fn wait_policy_ready(ctx: &Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let policies = &policies(ctx);
    wait_for(
        &format!("PodHAPolicy {name}'s status Ready=True"),
        secs(60),
        || async move {
            let p = policies.get(name).await?;
            let conditions = p.data["status"]["conditions"].as_array().cloned();
            Ok(conditions
                .unwrap_or_default()
                .iter()
                .find_map(|c| (c["type"] == "Ready" && c["status"] == "True").then_some(())))
        },
    )
    .await
}

/// Waits (120 s) until PostgreSQL's client has seen `n` transactions acknowledged; returns
/// how many it has.
async fn wait_transactions(ctx: &Ctx<'_>, n: usize) -> anyhow::Result<usize> {
    postgres::wait_acknowledged(&ctx.client, &ctx.ns, DB_CLIENT, n, secs(120)).await
}

/// Kills the node of `app`'s writer and follows the failover: a replacement Running and Ready
/// on another node of `nodes`, its volume attached there and no longer on the dead node, `WRITES`
/// acknowledged writes from it; then checks the volume's write log. Returns the dead node.
async fn kill_and_follow(ctx: &Ctx<'_>, app: &str, nodes: &[&str]) -> anyhow::Result<String> {
    let old = ctx.wait_app_running(app, secs(120)).await?;
    let dead = node_of(&old).context("writer not bound")?.to_string();
    ctx.wait_writes(&old, WRITES).await?;
    let handle = podha_sim::csi::writer::volume_handle(&ctx.client, &ctx.ns, &old).await?;
    let pv = ctx
        .pvs()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.volume_handle.as_str())
                == Some(handle.as_str())
        })
        .context("the writer's PV")?;
    let pv = pv_name(&pv);

    ctx.cluster.kill_node(&dead)?;
    let killed = Instant::now();
    log(
        &ctx.ns,
        format!("{dead}, running {}, killed", name_of(&old)),
    );
    let old_uid = old.metadata.uid.clone();
    let replacement = wait_for(
        &format!("a replacement of {} Running on another node", name_of(&old)),
        secs(120),
        || async {
            let pods = ctx.app_pods(app).await?;
            Ok(pods
                .into_iter()
                .find(|p| p.metadata.uid != old_uid && running_ready(p) && !terminating(p)))
        },
    )
    .await?;
    let running_after = killed.elapsed();
    let node = node_of(&replacement)
        .context("replacement not bound")?
        .to_string();
    ensure!(
        node != dead && nodes.contains(&node.as_str()),
        "the replacement runs on {node}, not on another of {nodes:?}"
    );
    ctx.wait_attached(&pv, &node, secs(30)).await?;
    let on_dead = ctx
        .vas_of(&pv)
        .await?
        .into_iter()
        .filter(|va| va.spec.node_name == dead)
        .count();
    ensure!(
        on_dead == 0,
        "{pv} still has a VolumeAttachment on the dead {dead}"
    );
    ctx.wait_writes(&replacement, WRITES).await?;
    let report = workload::check(ctx.cluster.dir(), &handle)?;
    ensure!(
        report.split_brain_writes.is_empty() && report.lost_acknowledged_writes.is_empty(),
        "the write log of {handle} is not clean: {report:?}"
    );
    ensure!(
        report.writers.len() == 2,
        "the old and the new pod should both have written to {handle}: {report:?}"
    );
    log(
        &ctx.ns,
        format!(
            "{} Running on {node} {running_after:.1?} after the kill; write log: {} accepted, \
             {} refused, 0 split-brain, 0 lost",
            name_of(&replacement),
            report.accepted_writes,
            report.refused_writes
        ),
    );
    Ok(dead)
}

/// Every command the release's NOTES show, and every `kubectl` command of the README, run as a
/// user pastes it (an example policy's `kubectl apply` as a server-side dry run: the API server
/// checks it, the test's policies stay the only ones).
fn shown_commands_run(ctx: &Ctx<'_>, helm: &std::path::Path) -> anyhow::Result<()> {
    use podha_sim::chart_notes::{readme_commands, release_notes, run_shown, shown_commands};
    let notes = release_notes(ctx.cluster, helm)?;
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).context("reading README.md")?;
    for (source, commands, at_least) in [
        ("NOTES", shown_commands(&notes)?, 5),
        ("README", readme_commands(&readme)?, 5),
    ] {
        ensure!(
            commands.len() >= at_least,
            "the {source} show {} commands: {commands:?}",
            commands.len()
        );
        for command in &commands {
            let ran = run_shown(ctx.cluster, &repo, command, true)?;
            let first = ran.command.lines().next().unwrap_or_default();
            log(
                &ctx.ns,
                format!(
                    "{source}: `{first}` ran in {:.1?}: {} lines",
                    ran.took,
                    ran.stdout.lines().count()
                ),
            );
        }
    }
    Ok(())
}

fn installed_by_chart(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    let helm = podha_sim::chart_rbac::helm_path()?;
    run_scenario(shared, WRITERS, |ctx| async move {
        let real = real_nodes();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        let (replica_nodes, app_nodes) = real.split_at(2);
        install(&ctx, &helm, replica_nodes).await?;
        log(&ctx.ns, "helm install done");

        let pods = chart_install::wait_replicas(&ctx.client, 2, secs(120)).await?;
        wait_agents(&ctx).await?;
        log(&ctx.ns, "podha agent running on every real node");
        let mut nodes: Vec<&str> = pods.iter().filter_map(node_of).collect();
        nodes.sort();
        ensure!(
            nodes == replica_nodes,
            "the replicas run on {nodes:?}, not one on each of {replica_nodes:?} (the chart's \
             anti-affinity)"
        );
        for p in &pods {
            let sa = p
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref());
            ensure!(sa == Some(RELEASE), "{} runs as {sa:?}", name_of(p));
        }
        let leader = chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
        let leader_pod = pods
            .iter()
            .find(|p| name_of(p) == leader)
            .context("leader")?;
        let follower_pod = pods
            .iter()
            .find(|p| name_of(p) != leader)
            .context("follower")?;
        wait_leader_gauge(&ctx, leader_pod, "1").await?;
        wait_leader_gauge(&ctx, follower_pod, "0").await?;
        log(
            &ctx.ns,
            format!("{leader} leads (Lease and /metrics), the other follows"),
        );
        shown_commands_run(&ctx, &helm)?;
        apply_policy(&ctx).await?;
        log(&ctx.ns, "policy Ready=True");

        // The leader's node dies with PostgreSQL on it, on a volume of the class that does not
        // fence: only podha's proof keeps a second server off its data directory.
        let leader_node = node_of(leader_pod).context("leader node")?.to_string();
        let follower_node = node_of(follower_pod).context("follower node")?.to_string();
        let mut db_nodes = vec![leader_node.as_str()];
        db_nodes.extend_from_slice(app_nodes);
        postgres::load_image(ctx.cluster)?;
        for node in app_nodes {
            ctx.cordon(node, true).await?;
        }
        ctx.create::<StatefulSet>(postgres::statefulset(
            "db",
            &db_nodes,
            podha_sim::csi::UNFENCED_STORAGE_CLASS,
        )?)
        .await?;
        let db = ctx.wait_app_running("db", secs(120)).await?;
        ensure!(
            node_of(&db) == Some(leader_node.as_str()),
            "db-0 is not on the leader's node"
        );
        for node in app_nodes {
            ctx.cordon(node, false).await?;
        }
        postgres::serve(&ctx.client, &ctx.ns, "db", DB_CLIENT, &follower_node).await?;
        let before = wait_transactions(&ctx, TRANSACTIONS).await?;
        let verdict = postgres::check(ctx.cluster, &ctx.ns, "db", DB_CLIENT)?;
        log(&ctx.ns, format!("PostgreSQL before the kill: {verdict}"));
        let follower = name_of(follower_pod).to_string();
        let killed = Instant::now();
        // Under the policy's own proof, the agent's: the new leader never heard db-0's
        // node's agent, whose Lease says the last leader heard it in this boot.
        kill_and_follow(&ctx, "db", &db_nodes).await?;
        ensure!(
            chart_install::lease_holder(&ctx.client).await?.as_deref() == Some(follower.as_str()),
            "{follower} should lead after {leader}'s node died"
        );
        wait_leader_gauge(&ctx, follower_pod, "1").await?;
        log(
            &ctx.ns,
            format!(
                "{follower} took over and failed db-0 over, {:.1?} after the kill",
                killed.elapsed()
            ),
        );
        // The client reaches the new server through the Service and goes on.
        wait_transactions(&ctx, before + TRANSACTIONS).await?;
        let verdict = postgres::check(ctx.cluster, &ctx.ns, "db", DB_CLIENT)?;
        ensure!(
            verdict.count("crash_recoveries")? == 1,
            "PostgreSQL should have recovered from one crash: {verdict}"
        );
        log(&ctx.ns, format!("PostgreSQL after the kill: {verdict}"));

        // `podha chaos` as a user runs it against these real nodes: the database's node killed
        // and rebooted, the write log checked by podha-csi, the database by check.sh.
        chaos_trial(&ctx).await?;
        // Every node ran a podha agent throughout (each killed node's restarted with it), the
        // leader's node died: none fenced (a kill is not a fence).
        let fences = ctx.cluster.fences()?;
        ensure!(fences.is_empty(), "agents fenced nodes: {fences:?}");
        // A leftover pod with a volume is one a later scenario's policy must leave alone,
        // which changes what podha may do to its node (no out-of-service taint beside it).
        ctx.remove_workloads(secs(180)).await?;
        Ok(())
    })
}

/// One `podha chaos` trial on the Deployment: sim-kill, the data check on podha-csi's log.
async fn chaos_trial(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let podha_sim = std::path::PathBuf::from(env!("CARGO_BIN_EXE_podha-sim"));
    let podha_csi = podha_sim.with_file_name("podha-csi");
    ensure!(
        podha_csi.is_file(),
        "{} is missing: build it with `cargo build -p podha-csi` (make test builds every binary)",
        podha_csi.display()
    );
    let out = ctx.cluster.dir().join("chaos-real.json");
    let args = podha::chaos::ChaosArgs {
        context: None,
        yes: true,
        kubeconfig: Some(ctx.cluster.kubeconfig_path()),
        namespace: WRITERS.to_string(),
        statefulset: Some("db".to_string()),
        deployment: None,
        trials: 1,
        fault: "sim-kill".to_string(),
        restore: None,
        data_check: Some("podha-csi-sim".to_string()),
        check: Some(postgres::check_command(
            ctx.cluster,
            WRITERS,
            "db",
            DB_CLIENT,
        )),
        check_timeout: std::time::Duration::from_secs(300),
        data_settle: std::time::Duration::from_secs(3),
        podha_csi: podha_csi.display().to_string(),
        sim_dir: Some(ctx.cluster.dir().to_path_buf()),
        podha_sim: podha_sim.display().to_string(),
        expect: podha::chaos::Expect::Moved,
        hold: secs(60),
        timeout: secs(120),
        settle_timeout: secs(120),
        out: out.clone(),
        svg: None,
        podha_namespace: None,
        leader_lease: podha::leader::DEFAULT_LEASE_NAME.to_string(),
    };
    let mut progress = |line: &str| log(WRITERS, format!("chaos: {line}"));
    let outcome = podha::chaos::execute(&args, &mut progress).await;
    if let Some(e) = outcome.error {
        anyhow::bail!("podha chaos could not run: {e}");
    }
    let violations = outcome.run.violations();
    ensure!(
        violations.is_empty(),
        "podha chaos on real nodes: {violations:?}"
    );
    let record = outcome.run.records.first().context("one trial")?;
    let data = record.data.as_ref().context("the data check ran")?;
    let report = data.result.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        report.accepted_writes.unwrap_or(0) > 0,
        "the data check saw no write: {data:?}"
    );
    ensure!(
        record
            .restore
            .as_ref()
            .is_some_and(|r| r.taint_gone.is_some()),
        "{record:?}"
    );
    let after = record.checks.last().context("the check after the trial")?;
    let verdict = postgres::Verdict::parse(after.result.as_deref().unwrap_or_default())?;
    ensure!(
        verdict.count("crash_recoveries")? == 2,
        "PostgreSQL should have recovered from two crashes by now: {verdict}"
    );
    podha::chaos::write_outputs(&args, &outcome.run)?;
    log(
        WRITERS,
        format!(
            "podha chaos on real nodes:\n{}",
            podha::chaos::report::table(&outcome.run)
        ),
    );
    Ok(())
}
