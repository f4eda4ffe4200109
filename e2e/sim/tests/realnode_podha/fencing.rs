//! podha's fencing on real nodes, with storage that does not fence (podha-csi's `fencing: off`
//! class: a node keeps the access it once had), so podha's own fencing is what keeps the data
//! whole. Every real node runs `podha agent` (the chart's DaemonSet), fencing through the
//! node's BMC and petting the BMC's watchdog; the policy asks for the agent's proof before the
//! out-of-service taint.
//!
//! At once, for 90 s:
//! - one writer's node **freezes** (a hung machine: its agent frozen too). The agent stops
//!   petting, the watchdog powers the node off; only then does podha's silence proof hold and
//!   the volume move. Thawing the node afterwards wakes nothing: it was reset.
//! - another writer's node is **cut off from everything** (its link down: no packet in or
//!   out), its processes and its writer running on. Its agent, hearing neither podha nor a
//!   peer, cannot show half of its peers unheard: it stops petting and fences (its own decision
//!   or its watchdog, through the BMC) before podha's silence proof holds and the volume moves.
//!   Meanwhile a process on that node forges podha's words to its own agent, 50 requests a
//!   second: heartbeats saying podha just heard it (unsigned, or signed with random bytes) and
//!   randomly signed peer surveys. The agent answers every one 401 and they keep nothing up:
//!   the node is still fenced before its volume moves.
//! - another writer's node is **cut off from the API server**. Its policy is a `DeletePods`
//!   one with the default detection (`Lease` and `AgentHeartbeat`) and the default proof (the
//!   agent's): its Lease goes silent, but podha still hears its agent, so the node is never
//!   judged dead (no `NodeFailed`) and is left alone: no fence, no taint, its writer not
//!   deleted, and it keeps writing (Kubernetes evicts it meanwhile, but its kubelet hears of
//!   that only once the partition heals, and the replacement waits for the volume).
//! - the isolated node's agent is **stopped (SIGTERM) right after the cut**, as the kubelet stops
//!   a container: it cannot withdraw its advert, so it keeps its watchdog armed and petted by the
//!   usual rules, and the node is still fenced before its volume moves.
//!
//! - an **unprivileged pod floods a replica node's agent port** for 60 s (`flood.rs`): the
//!   agent closes and counts what is over its limits, podha hears it throughout (its quorum
//!   needs it), and its node is not fenced.
//!
//! Then: the write logs show no split-brain write and no lost acknowledged write, the frozen and
//! isolated nodes boot again and podha takes their taints off, and no other node was fenced.

use kube::ResourceExt as _;

use super::*;
use flood::Flood;

/// Where the frozen and cut-off writers run, and the outage scenario's; the policy selects
/// both.
const NS: &str = "fencing";
const OUTAGE_NS: &str = "outage";
pub(super) const POLICY_NAME: &str = "fenced-real-nodes";
/// The cut-off node's own policy, before `POLICY_NAME` in name order, so that it governs that
/// node.
pub(super) const CUT_POLICY_NAME: &str = "cut-off-delete-pods";
/// How long the two faults last.
const FAULT: std::time::Duration = std::time::Duration::from_secs(90);
/// How long a pod floods a replica node's agent port, during the faults.
const FLOOD: std::time::Duration = std::time::Duration::from_secs(60);
/// How long the process on the isolated node forges podha's words: the fault but its last
/// seconds, so it has ended by itself when the fault does.
const FORGING: std::time::Duration = std::time::Duration::from_secs(85);

/// The policy: the agent's heartbeat beside the Lease, the agent's proof before the taint.
async fn apply_fencing_policy(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    // The first scenario's policy (no fencing proof) must not act on these nodes, nor the
    // cut-off node's policy of an earlier scenario.
    let others = [POLICY, CUT_POLICY_NAME].into_iter();
    delete_policies(ctx, others.chain(acknowledged::POLICY_NAMES)).await?;
    apply_policy_spec(
        ctx,
        POLICY_NAME,
        json!({
            "nodeSelector": { "matchLabels": { "type": "real" } },
            "namespaceSelector": { "matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": [NS, OUTAGE_NS],
            }] },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "detection": {
                "signals": ["Lease", "AgentHeartbeat"],
                "interval": "1s",
                "failureThreshold": 3,
                "leaseGracePeriod": "11s",
                "tcpTimeout": "500ms",
            },
            "action": "OutOfServiceTaint",
            "fencing": { "proof": "Agent", "agentMargin": "2s" },
            "safety": { "maxUnhealthy": 3, "unhealthyWindow": "0s" },
        }),
    )
    .await
}

/// `node`'s own policy: `DeletePods`, the default detection (`Lease` and `AgentHeartbeat`) and
/// the default proof (the agent's).
async fn apply_delete_pods_policy(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    apply_policy_spec(
        ctx,
        CUT_POLICY_NAME,
        json!({
            "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": node } },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": NS } },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "action": "DeletePods",
        }),
    )
    .await
}

/// No workload of another scenario left (a pod this policy does not select would keep the
/// out-of-service taint off its node), every real node Ready (the first scenario leaves its
/// leader's node dead), podha's two replicas running with a leader (installed by the chart
/// if the first scenario did not run) and the agents fencing through the BMC (as installed:
/// `acknowledged.rs` changes their fence).
pub(super) async fn every_real_node_up(ctx: &Ctx<'_>, real: &[&str]) -> anyhow::Result<()> {
    for ns in [WRITERS, NS, OUTAGE_NS, acknowledged::NS] {
        if ns != ctx.ns {
            let other = Ctx {
                cluster: ctx.cluster,
                client: ctx.client.clone(),
                ns: ns.to_string(),
            };
            other.remove_workloads(secs(180)).await?;
        }
    }
    let helm = podha_sim::chart_rbac::helm_path()?;
    if chart_install::podha_pods(&ctx.client).await?.is_empty() {
        install(ctx, &helm, &real[..2]).await?;
    } else if !acknowledged::agents_fence_through_bmc(ctx).await? {
        chart_install::upgrade(
            ctx.cluster,
            &helm,
            &SHORTEST_AGENT_TIMINGS.sim_values(),
            &[],
        )?;
    }
    for node in real {
        let ready = ctx
            .nodes()
            .get(node)
            .await
            .ok()
            .and_then(|n| ready_status(&n))
            .is_some_and(|s| s == "True");
        if !ready {
            ctx.cluster.start_node(node).await?;
        }
    }
    let pods = chart_install::wait_replicas(&ctx.client, 2, secs(180)).await?;
    chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
    wait_agents(ctx).await?;
    Ok(())
}

/// A writer Deployment `app` on its own claim of the unfenced class, started on `on` (the other
/// `nodes` cordoned meanwhile); returns the running pod and its volume handle.
pub(super) async fn start_writer(
    ctx: &Ctx<'_>,
    app: &str,
    on: &str,
    nodes: &[&str],
) -> anyhow::Result<(Pod, String)> {
    let claim = format!("{app}-data");
    ctx.create::<PersistentVolumeClaim>(pvc(&claim, podha_sim::csi::UNFENCED_STORAGE_CLASS))
        .await?;
    let others: Vec<&str> = nodes.iter().copied().filter(|n| *n != on).collect();
    for node in &others {
        ctx.cordon(node, true).await?;
    }
    ctx.create::<Deployment>(workload::writer_deployment(app, nodes, &claim)?)
        .await?;
    let pod = ctx.wait_app_running(app, secs(120)).await;
    for node in &others {
        ctx.cordon(node, false).await?;
    }
    let pod = pod?;
    ensure!(node_of(&pod) == Some(on), "{app} does not run on {on}");
    ctx.wait_writes(&pod, WRITES).await?;
    let handle = podha_sim::csi::writer::volume_handle(&ctx.client, &ctx.ns, &pod).await?;
    Ok((pod, handle))
}

pub(super) fn has_out_of_service_taint(node: &k8s_openapi::api::core::v1::Node) -> bool {
    has_taint(node, OUT_OF_SERVICE)
}

/// Either of podha's taints: the out-of-service one, or its fence for the scheduler.
fn has_podha_taint(node: &k8s_openapi::api::core::v1::Node) -> bool {
    has_out_of_service_taint(node) || has_taint(node, podha::api::FENCE_TAINT_KEY)
}

fn has_taint(node: &k8s_openapi::api::core::v1::Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

pub(super) fn frozen_and_cut_off_nodes(
    shared: &SharedCluster,
) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, NS, |ctx| async move {
        let real = real_nodes();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        let (replica_nodes, app_nodes) = real.split_at(2);
        let (frozen, cut, isolated) = (app_nodes[0], app_nodes[1], app_nodes[2]);
        every_real_node_up(&ctx, &real).await?;
        apply_fencing_policy(&ctx).await?;
        apply_delete_pods_policy(&ctx, cut).await?;
        let fences_before = ctx.cluster.fences()?.len();
        let cut_failed_before = node_reports(&ctx, "NodeFailed", &[cut]).await?;

        let frozen_writer =
            start_writer(&ctx, "frozen", frozen, &[frozen, replica_nodes[0]]).await?;
        let frozen_writer = Moved::start(frozen_writer, replica_nodes[0]);
        let isolated_writer =
            start_writer(&ctx, "isolated", isolated, &[isolated, replica_nodes[1]]).await?;
        let isolated_writer = Moved::start(isolated_writer, replica_nodes[1]);
        // A node it could move to: without one, it would stay for want of a target alone.
        let (cut_pod, cut_volume) =
            start_writer(&ctx, "cut", cut, &[cut, replica_nodes[0]]).await?;
        let cut_acks = workload::acknowledged(ctx.cluster.dir(), &uid(&cut_pod)?)?;
        log(
            &ctx.ns,
            format!(
                "writers on {frozen}, {isolated} and {cut}; freezing {frozen}, cutting \
                 {isolated} off from everything (and stopping its agent) and {cut} off the API \
                 server for {FAULT:?}"
            ),
        );

        // Meanwhile an unprivileged pod floods a replica node's agent port: podha must hear
        // that agent throughout (its quorum needs it), and its node must not be fenced.
        let flood_target = replica_nodes[1];
        let flood = Flood::start(&ctx, replica_nodes[0], flood_target, FLOOD).await?;
        let isolated_agent = forged_words::agent_address(&ctx, isolated).await?;
        ctx.cluster.freeze_node(frozen)?;
        ctx.cluster.isolate_node(isolated, true)?;
        let stopped_agent = chart_install::stop_agent(ctx.cluster, isolated)?;
        log(
            &ctx.ns,
            format!("{isolated}'s agent (pid {stopped_agent}) sent SIGTERM while cut off"),
        );
        let forger =
            forged_words::Forger::start(&ctx, isolated, isolated_agent, replica_nodes[0], FORGING)?;
        ctx.cluster.partition_node(cut, true)?;
        let started = Instant::now();
        let during = async {
            let frozen_new = frozen_writer.replacement(&ctx, "frozen", started).await?;
            let isolated_new = isolated_writer
                .replacement(&ctx, "isolated", started)
                .await?;
            // podha must leave the cut-off node alone until the faults end.
            let cut_node = ctx.nodes().get(cut).await?;
            ensure!(
                !has_podha_taint(&cut_node),
                "podha tainted the cut-off {cut}"
            );
            anyhow::Ok((frozen_new, isolated_new))
        }
        .await;
        let left = FAULT.saturating_sub(started.elapsed());
        if during.is_ok() {
            tokio::time::sleep(left).await;
        }
        // Its Lease silent, its agent heard: never judged dead.
        let cut_judged_dead =
            node_reports(&ctx, "NodeFailed", &[cut]).await?[0] - cut_failed_before[0];
        // Its writer was not deleted: the attach/detach controller would have force-detached
        // its volume from the node 6 minutes later, whatever the node still ran.
        let cut_writer_kept = ctx
            .pods()
            .get_opt(name_of(&cut_pod))
            .await?
            .is_some_and(|p| p.metadata.uid == cut_pod.metadata.uid);
        let cut_node = ctx.nodes().get(cut).await?;
        let healed_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis();
        ctx.cluster.thaw_node(frozen)?;
        ctx.cluster.isolate_node(isolated, false)?;
        ctx.cluster.partition_node(cut, false)?;
        let (frozen_new, isolated_new) = during?;
        ensure!(
            cut_judged_dead == 0,
            "podha judged the cut-off {cut} dead ({cut_judged_dead} NodeFailed) while its agent \
             answered"
        );
        ensure!(
            cut_writer_kept,
            "podha deleted the writer of the cut-off {cut} without the proof"
        );
        ensure!(
            !has_podha_taint(&cut_node),
            "podha tainted the cut-off {cut}"
        );
        log(
            &ctx.ns,
            format!("{FAULT:?} later: {frozen} thawed, {isolated} and {cut} back in touch"),
        );
        let (flooded, refused) = flood.finish(&ctx).await?;
        log(
            &ctx.ns,
            format!(
                "a pod flooded {}'s agent for {FLOOD:?}: {} connections opened, {} closed by \
                 the agent, {refused} of them for its limits (evicted or refused, counted)",
                flood_target, flooded.opened, flooded.closed_by_target
            ),
        );
        let forged = forger.all_refused(secs(30)).await?;
        log(
            &ctx.ns,
            format!(
                "a process on {isolated} forged {} heartbeats and surveys to its agent at \
                 {isolated_agent}: {} answered, all 401; {} got no HTTP answer",
                forged.sent,
                forged.answered(),
                forged.errors
            ),
        );

        // Each failed node fenced (through its BMC) before its volume moved: the frozen one by
        // its watchdog, the isolated one by its agent's decision or its watchdog, the forged
        // heartbeats notwithstanding.
        let fences = fences_since(&ctx, fences_before)?;
        let fence = frozen_writer.fenced_first(&ctx, frozen, &frozen_new, &fences)?;
        ensure!(
            fence.reason.starts_with("watchdog"),
            "{frozen}'s fence was not its watchdog's: {fence:?}"
        );
        isolated_writer.fenced_first(&ctx, isolated, &isolated_new, &fences)?;

        // The cut-off node: never fenced nor tainted during the fault, its writer wrote through
        // the partition. Back in touch, its agent may see podha's request before podha, which
        // sees the node alive again, withdraws it, and fence the node then: late, moving
        // nothing. Either settles before the next scenario.
        let cut_fenced_late = wait_for(
            &format!("podha's fence request on {cut} withdrawn, or {cut} fenced"),
            secs(120),
            || async {
                let fenced = fences_since(&ctx, fences_before)?
                    .iter()
                    .any(|f| f.node == cut);
                let requested = ctx
                    .nodes()
                    .get(cut)
                    .await?
                    .annotations()
                    .contains_key(podha::contract::FENCE_REQUEST_ANNOTATION);
                Ok((fenced || !requested).then_some(fenced))
            },
        )
        .await?;
        // A fence the agent began as the request was withdrawn reaches the BMC within a moment.
        tokio::time::sleep(secs(3)).await;
        let fences = fences_since(&ctx, fences_before)?;
        let cut_fenced_late = cut_fenced_late || fences.iter().any(|f| f.node == cut);
        ensure!(
            fences.iter().all(|f| f.node == frozen
                || f.node == isolated
                || (f.node == cut && f.at_ms >= healed_ms)),
            "a node other than {frozen} and {isolated} was fenced during the fault: {fences:?}"
        );
        if cut_fenced_late {
            log(
                &ctx.ns,
                format!("{cut} fenced after the partition healed, by the request podha had left"),
            );
            ctx.cluster.start_node(cut).await?;
        }
        ctx.wait_ready(cut, secs(90)).await?;
        let acks_now = workload::acknowledged(ctx.cluster.dir(), &uid(&cut_pod)?)?;
        ensure!(
            acks_now > cut_acks + 100,
            "the cut-off writer should have written on (acknowledged {cut_acks} → {acks_now})"
        );
        let report = workload::check(ctx.cluster.dir(), &cut_volume)?;
        ensure!(report.clean(), "the cut-off writer's volume: {report:?}");
        ensure!(
            !has_podha_taint(&ctx.nodes().get(cut).await?),
            "podha tainted the cut-off {cut}"
        );
        log(
            &ctx.ns,
            format!(
                "{cut}: held for the proof (DeletePods), not fenced during the fault, not \
                 tainted, its writer not deleted, {} writes meanwhile",
                acks_now - cut_acks
            ),
        );

        // The fenced nodes boot again; podha takes their taints off.
        for node in [frozen, isolated] {
            ctx.cluster.start_node(node).await?;
        }
        for node in [frozen, isolated] {
            wait_for(
                &format!("podha to take its taint off {node}"),
                secs(60),
                || async {
                    let n = ctx.nodes().get(node).await?;
                    Ok((!has_out_of_service_taint(&n)).then_some(()))
                },
            )
            .await?;
        }
        log(
            &ctx.ns,
            format!("{frozen} and {isolated} back, podha's taints gone"),
        );
        ctx.remove_workloads(secs(180)).await?;
        Ok(())
    })
}

/// A writer whose node is about to fail, and where its replacement must run.
pub(super) struct Moved<'a> {
    pub(super) old: Pod,
    pub(super) volume: String,
    pub(super) refuge: &'a str,
}

impl<'a> Moved<'a> {
    pub(super) fn start((old, volume): (Pod, String), refuge: &'a str) -> Self {
        Self {
            old,
            volume,
            refuge,
        }
    }

    /// The replacement of `app`'s writer, Running on the refuge and writing.
    pub(super) async fn replacement(
        &self,
        ctx: &Ctx<'_>,
        app: &str,
        started: Instant,
    ) -> anyhow::Result<Pod> {
        let replacement = wait_for(
            &format!("the {app} writer's replacement Running on another node"),
            secs(110),
            || async {
                let pods = ctx.app_pods(app).await?;
                Ok(pods.into_iter().find(|p| {
                    p.metadata.uid != self.old.metadata.uid && running_ready(p) && !terminating(p)
                }))
            },
        )
        .await?;
        ensure!(
            node_of(&replacement) == Some(self.refuge),
            "the {app} replacement runs on {:?}, not {}",
            node_of(&replacement),
            self.refuge
        );
        log(
            &ctx.ns,
            format!(
                "{} Running on {} {:.1?} after the fault",
                name_of(&replacement),
                self.refuge,
                started.elapsed()
            ),
        );
        ctx.wait_writes(&replacement, WRITES).await?;
        Ok(replacement)
    }

    /// `node` was fenced before `replacement` first wrote, and the volume's write log is clean
    /// (no split-brain write, no lost acknowledged write, both writers wrote); returns the fence.
    fn fenced_first<'f>(
        &self,
        ctx: &Ctx<'_>,
        node: &str,
        replacement: &Pod,
        fences: &'f [podha_sim::cluster::agents::Fence],
    ) -> anyhow::Result<&'f podha_sim::cluster::agents::Fence> {
        let fence = fences
            .iter()
            .find(|f| f.node == node)
            .with_context(|| format!("{node} was never fenced: {fences:?}"))?;
        let log_entries = workload::write_log(ctx.cluster.dir(), &self.volume)?;
        let first_new = log_entries
            .iter()
            .find(|e| e.accepted && e.pod_uid == uid(replacement).unwrap_or_default())
            .context("the replacement's first write")?;
        let first_new_ms = u128::from(first_new.time_us / 1000);
        ensure!(
            first_new_ms > fence.at_ms,
            "the replacement wrote ({} µs) before {node} was fenced ({} ms)",
            first_new.time_us,
            fence.at_ms
        );
        let report = workload::check(ctx.cluster.dir(), &self.volume)?;
        ensure!(report.clean(), "{node}'s writer's volume: {report:?}");
        ensure!(
            report.writers.len() == 2,
            "both writers should have written: {report:?}"
        );
        let before = u64::try_from(first_new_ms.saturating_sub(fence.at_ms)).unwrap_or(0);
        log(
            &ctx.ns,
            format!(
                "{node} fenced ({}) {:.1?} before the replacement's first write; write log: {} \
                 accepted, 0 split-brain, 0 lost",
                fence.reason,
                std::time::Duration::from_millis(before),
                report.accepted_writes
            ),
        );
        Ok(fence)
    }
}

/// How often real node `node`'s agent decided to stay up though unheard (its log says so once
/// per episode).
fn stays(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<usize> {
    Ok(chart_install::agent_log(ctx.cluster, node)?
        .matches("not heard; staying up")
        .count())
}

/// The fences carried out since the cluster had carried out `before`.
pub(super) fn fences_since(
    ctx: &Ctx<'_>,
    before: usize,
) -> anyhow::Result<Vec<podha_sim::cluster::agents::Fence>> {
    Ok(ctx.cluster.fences()?.into_iter().skip(before).collect())
}

pub(super) fn uid(pod: &Pod) -> anyhow::Result<String> {
    pod.metadata.uid.clone().context("pod uid")
}

/// The control plane fails in the three ways that leave every agent unheard at once, one after
/// another, with a writer running throughout:
/// - the leading podha replica crashes (SIGKILL of its process) and one agent with it, twice:
///   a replica takes the Lease again and probes, the agent's supervisor starts another each
///   time, which goes on from when podha last heard its node (its hearing file, kept in the
///   pod's emptyDir) and fences nothing; the container is not restarted;
/// - the API server hangs for 60 s (SIGSTOP: connections accepted, nothing answered) and
/// - is stopped for 60 s (killed: connections refused), then started again: every kubelet stops
///   renewing, podha's leader loses its Lease and stops probing, every agent goes unheard past
///   its isolation timeout.
///
/// Their peers show every agent unheard (podha can prove nothing): no agent fences, no watchdog resets its node, each
/// outage has every agent decide to stay up, and once the API server answers again every node is
/// Ready, nothing is tainted and the write log is clean. Then a node paused for maintenance is
/// cut off from everything: not fenced, not reset ([`paused::paused_node_cut_off`]). Then
/// podha's own path to three healthy nodes fails for 60 s, judged on its probes alone: held
/// while their Leases renew, no fence asked, no reboot
/// ([`path_fault::podha_cut_off_from_three_healthy_nodes`]).
pub(super) fn control_plane_faults(shared: &SharedCluster) -> Result<(), libtest_mimic::Failed> {
    run_scenario(shared, OUTAGE_NS, |ctx| async move {
        let real = real_nodes();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        let on = real[2];
        every_real_node_up(&ctx, &real).await?;
        apply_fencing_policy(&ctx).await?;
        // Every agent counted by podha (armed, not held), as the faults below assume: a hold
        // that the last scenario's faults left (an agent that could not reach half of its
        // peers while they were frozen, cut off or flooded) ends at a reach check that
        // reaches them again.
        wait_for(
            "every real node's agent Lease to say podha counts it",
            secs(150),
            || async {
                for node in &real {
                    if !paused::lease_counts_silence(&ctx, node).await? {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await?;
        let fences_before = ctx.cluster.fences()?.len();
        let claim = "steady-data";
        ctx.create::<PersistentVolumeClaim>(pvc(claim, podha_sim::csi::UNFENCED_STORAGE_CLASS))
            .await?;
        ctx.create::<Deployment>(workload::writer_deployment("steady", &[on], claim)?)
            .await?;
        let pod = ctx.wait_app_running("steady", secs(120)).await?;
        ctx.wait_writes(&pod, WRITES).await?;
        let handle = podha_sim::csi::writer::volume_handle(&ctx.client, &ctx.ns, &pod).await?;
        let acks = workload::acknowledged(ctx.cluster.dir(), &uid(&pod)?)?;

        // The leader crashes.
        let pods = chart_install::wait_replicas(&ctx.client, 2, secs(60)).await?;
        let leader = chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
        let leader_pod = pods
            .iter()
            .find(|p| name_of(p) == leader)
            .context("the leader's pod")?;
        // One agent crashes with it, then again: its supervisor replaces it at once each time,
        // the container stays. The agent the kubelet restarted most (a node reboot counts):
        // restarted by the kubelet, its second crash would wait out the CrashLoopBackOff
        // (10-25 s), longer than the watchdog lets a node run unpetted (docs/agent.md).
        let restarts = chart_install::agent_restarts(&ctx.client, &real).await?;
        let (agent_node, kubelet_restarts) = restarts
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(node, n)| (node.clone(), *n))
            .context("no agent pod on the real nodes")?;
        let agent_node = agent_node.as_str();
        let resumed_before = resumed_agents(&ctx, agent_node)?;
        let pid = chart_install::crash_replica(ctx.cluster, leader_pod)?;
        let agent_pid = chart_install::crash_agent(ctx.cluster, agent_node)?;
        let crashed = Instant::now();
        let replaced = agent_replaced(&ctx, agent_node, agent_pid, resumed_before + 1).await?;
        let last_renewal = lease_renewal(&ctx).await?;
        wait_for(
            "a podha replica to renew the Lease after the crash",
            secs(60),
            || async { Ok((lease_renewal(&ctx).await? != last_renewal).then_some(())) },
        )
        .await?;
        let holder = chart_install::lease_holder(&ctx.client).await?;
        log(
            &ctx.ns,
            format!(
                "{leader} (pid {pid}) and {agent_node}'s agent (pid {agent_pid}) crashed; \
                 {holder:?} leads {:.1?} later",
                crashed.elapsed()
            ),
        );
        let second_pid = chart_install::crash_agent(ctx.cluster, agent_node)?;
        let again = agent_replaced(&ctx, agent_node, second_pid, resumed_before + 2).await?;
        log(
            &ctx.ns,
            format!(
                "{agent_node}'s agent (its container restarted {kubelet_restarts} times by the \
                 kubelet) crashed twice; its supervisor had the next one going on from the \
                 hearing file {replaced:.1?} and {again:.1?} later"
            ),
        );
        chart_install::wait_agents(&ctx.client, &real, secs(60)).await?;
        outage_over(&ctx, &real, fences_before, None).await?;
        let restarts_now = chart_install::agent_restarts(&ctx.client, &[agent_node]).await?;
        ensure!(
            restarts_now.get(agent_node) == Some(&kubelet_restarts),
            "{agent_node}'s agent container was restarted ({kubelet_restarts} restarts before the \
             crashes, {restarts_now:?} after): its supervisor should have replaced the agent"
        );

        // The API server hangs, then stops.
        for stop in [false, true] {
            let stays_before = stays_on(&ctx, &real)?;
            let what = if stop { "stopped" } else { "hung" };
            if stop {
                ctx.cluster.stop_apiserver()?;
            } else {
                ctx.cluster.pause_apiserver(true)?;
            }
            log(&ctx.ns, format!("kube-apiserver {what} for 60 s"));
            tokio::time::sleep(secs(60)).await;
            if stop {
                ctx.cluster.start_apiserver().await?;
            } else {
                ctx.cluster.pause_apiserver(false)?;
            }
            let resumed = Instant::now();
            // After a stop the kubelets here took 58-90 s to report Ready again: Kubernetes'
            // recovery, waited for, not podha's.
            for node in &real {
                ctx.wait_ready(node, secs(180)).await?;
            }
            let ready = resumed.elapsed();
            let pods = chart_install::wait_replicas(&ctx.client, 2, secs(90)).await?;
            chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
            let restarts: i32 = pods
                .iter()
                .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            log(
                &ctx.ns,
                format!(
                    "API server back: every node Ready {ready:.1?} later, a podha leader {:.1?} \
                     later (podha containers restarted {restarts} times so far)",
                    resumed.elapsed()
                ),
            );
            outage_over(&ctx, &real, fences_before, Some(&stays_before)).await?;
        }

        new_leader::new_leader_cut_off_from_two_agents(&ctx, &real, fences_before).await?;
        paused::paused_node_cut_off(&ctx, real[3], fences_before).await?;
        path_fault::podha_cut_off_from_three_healthy_nodes(&ctx, &real, POLICY_NAME, fences_before)
            .await?;

        // Whether the writer lived through it is Kubernetes' call (the node lifecycle controller
        // may mark the nodes unreachable before their kubelets renew); podha's part is that no
        // node was fenced or tainted, and the volume was written by one node at a time.
        let acks_now = workload::acknowledged(ctx.cluster.dir(), &uid(&pod)?)?;
        let report = workload::check(ctx.cluster.dir(), &handle)?;
        ensure!(report.clean(), "{report:?}");
        log(
            &ctx.ns,
            format!(
                "no fence, no taint; the writer acknowledged {} writes since the leader crashed, \
                 write log clean ({} writer(s))",
                acks_now - acks,
                report.writers.len()
            ),
        );
        ctx.remove_workloads(secs(180)).await?;
        Ok(())
    })
}

/// When podha's leader Lease was last renewed, as the Lease says.
async fn lease_renewal(ctx: &Ctx<'_>) -> anyhow::Result<Option<String>> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
    let lease = leases.get(chart_install::LEASE).await?;
    Ok(lease
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| format!("{t:?}")))
}

/// Waits until real node `node`'s agent that replaced the crashed `pid` has gone on from its
/// hearing file (the `resumed`-th time on that node); returns how long after now.
async fn agent_replaced(
    ctx: &Ctx<'_>,
    node: &str,
    pid: i32,
    resumed: usize,
) -> anyhow::Result<std::time::Duration> {
    let since = Instant::now();
    wait_for(
        &format!("{node}'s agent supervisor to replace its crashed agent (pid {pid})"),
        secs(10),
        || async {
            let worker = chart_install::agent_worker(ctx.cluster, node)?;
            let going_on = resumed_agents(ctx, node)? >= resumed;
            Ok((worker.is_some_and(|w| w != pid) && going_on).then_some(()))
        },
    )
    .await?;
    Ok(since.elapsed())
}

/// How often an agent on real node `node` started where its predecessor stopped.
fn resumed_agents(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<usize> {
    Ok(chart_install::agent_log(ctx.cluster, node)?
        .matches("going on from the last agent")
        .count())
}

/// How often each of `nodes`' agents has decided to stay up though unheard.
fn stays_on(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<usize>> {
    nodes.iter().map(|n| stays(ctx, n)).collect()
}

/// After a fault that left every agent unheard: waits out the isolation timeout (a watchdog let
/// go fires within its timeout, an agent's verdict within the isolation timeout), then checks
/// that no node was fenced since `fences_before` nor tainted and, given the agents' earlier
/// `stays`, that every agent decided to stay up since (it was unheard past its timeout and
/// stayed because its peers showed half of its peers unheard: not by luck).
async fn outage_over(
    ctx: &Ctx<'_>,
    nodes: &[&str],
    fences_before: usize,
    stays: Option<&[usize]>,
) -> anyhow::Result<()> {
    tokio::time::sleep(ISOLATION_TIMEOUT).await;
    let fences = fences_since(ctx, fences_before)?;
    ensure!(fences.is_empty(), "nodes fenced over an outage: {fences:?}");
    if let Some(before) = stays {
        for ((node, before), now) in nodes.iter().zip(before).zip(stays_on(ctx, nodes)?) {
            ensure!(
                now > *before,
                "{node}'s agent never decided to stay up: was it unheard at all? (see its log \
                 in nodes/{node}/pod-logs/)"
            );
        }
    }
    for node in nodes {
        ensure!(
            !has_out_of_service_taint(&ctx.nodes().get(node).await?),
            "{node} tainted out of service after an outage"
        );
    }
    Ok(())
}
