//! `fencing.proof: AgentAcknowledged` with the chart's own image, which has no shell, on real
//! nodes. The agents are upgraded (`helm upgrade`, as a user changes `agent.fence`) to a fence
//! that leaves them running: the node's BestEffort pods killed through their cgroup
//! (`write:<cgroup>/kubepods/besteffort/cgroup.kill=1`), confirmed once that cgroup is empty
//! (`read:<cgroup>/kubepods/besteffort/cgroup.events=populated 0`); the agent's own pod is
//! Burstable and lives on.
//!
//! - A writer's node loses its kubelet (killed and not restarted: its containers run on and
//!   write). podha judges the node dead by its Lease and asks its agent for a fence; the agent
//!   kills the writer, sees the cgroup empty and acknowledges. The writer was frozen before
//!   (a SIGKILL waits until it thaws): for 8 s after the request, while its processes are
//!   still there, nothing is acknowledged nor tainted; then it thaws and dies. Only then does
//!   podha taint the node (the taint's event names `AgentAcknowledged`), and the volume moves. On storage that
//!   does not fence, the write log shows no split-brain write, and the old writer has no
//!   process left.
//! - At the same time, another node's likewise under `anyOf: [AgentAcknowledged, BMC]`, its
//!   BMC unreachable (its Secret names an address nothing answers): podha asks both at once,
//!   the BMC's power-off fails with a Warning naming the cause, the agent's acknowledgement
//!   proves the fence.
//!
//! The agents live through their fences (the same processes). The two nodes are left without
//! a kubelet: a later scenario starts them again.

use super::*;
use fencing::{Moved, start_writer, uid};

pub(super) const NS: &str = "acknowledged";
/// The policies of the two nodes whose kubelets die: `AgentAcknowledged` alone, and
/// `anyOf: [AgentAcknowledged, BMC]`.
const ALONE_POLICY: &str = "acknowledged-alone";
const ANY_OF_POLICY: &str = "acknowledged-any-of";
pub(super) const POLICY_NAMES: [&str; 2] = [ALONE_POLICY, ANY_OF_POLICY];
/// How long the first writer stays frozen after podha asked for its node's fence.
const WRITER_FROZEN: std::time::Duration = std::time::Duration::from_secs(8);
/// The address of the second node's BMC, which nothing answers.
const BMC_ADDRESS_NOBODY_ANSWERS: &str = "https://127.0.0.1:1";

/// Whether the chart's agents fence through the node's BMC without a confirmation check, as
/// the realnode scenarios install them.
pub(super) async fn agents_fence_through_bmc(ctx: &Ctx<'_>) -> anyhow::Result<bool> {
    let values = SHORTEST_AGENT_TIMINGS.sim_values().values();
    let bmc_fence = format!(
        "--fence={}",
        values["agent"]["fence"].as_str().unwrap_or_default()
    );
    let args = chart_install::agent_args(&ctx.client).await?;
    Ok(args.contains(&bmc_fence) && !args.iter().any(|a| a.starts_with("--fence-confirm")))
}

/// The policy of the writer on `node`: fast detection on the kubelet's Lease alone (not the
/// kubelet's port, which the host's kernel still refuses, a host that is up; nor the agent's
/// heartbeat, which podha hears throughout), the taint, `fencing`.
async fn apply_acknowledged_policy(
    ctx: &Ctx<'_>,
    name: &str,
    node: &str,
    fencing: serde_json::Value,
) -> anyhow::Result<()> {
    apply_policy_spec(
        ctx,
        name,
        json!({
            "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": node } },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": NS } },
            "volumes": { "drivers": [podha_sim::csi::RWO_DRIVER] },
            "detection": {
                "signals": ["Lease"],
                "interval": "1s",
                "failureThreshold": 3,
                "leaseGracePeriod": "11s",
                "tcpTimeout": "500ms",
            },
            "action": "OutOfServiceTaint",
            "fencing": fencing,
            "safety": { "unhealthyWindow": "0s" },
        }),
    )
    .await
}

/// A BMC Secret for `node`, bound to it, whose address nothing answers.
async fn unreachable_bmc(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {
            "name": format!("bmc-{node}"),
            "namespace": chart_install::NAMESPACE,
            "labels": { podha::api::BMC_NODE_LABEL: node },
        },
        "stringData": {
            "address": BMC_ADDRESS_NOBODY_ANSWERS,
            "username": "podha",
            "password": "unused",
            "insecureSkipVerify": "true",
        },
    }))?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
    secrets
        .patch(
            &format!("bmc-{node}"),
            &PatchParams::apply("realnode-podha").force(),
            &Patch::Apply(&secret),
        )
        .await
        .with_context(|| format!("apply the BMC Secret of {node}"))?;
    Ok(())
}

/// The process running `node`'s agent (its worker), read on the node: the Pod's status says
/// nothing once the kubelet is dead.
fn agent_process(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<i32> {
    chart_install::agent_worker(ctx.cluster, node)?
        .with_context(|| format!("no podha agent runs on {node}"))
}

/// podha's taint on `node`, under `policy`, and its event naming `proof`.
async fn tainted_with_proof(
    ctx: &Ctx<'_>,
    node: &str,
    policy: &str,
    proof: &str,
) -> anyhow::Result<()> {
    let wanted = format!("policy {policy}; fencing proof: {proof}");
    wait_for(
        &format!("the OutOfServiceTaintAdded event of {node} naming {proof}"),
        secs(30),
        || async {
            let events =
                podha_events(&ctx.client, "default", "OutOfServiceTaintAdded", node).await?;
            Ok(events
                .iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&wanted)))
                .then_some(()))
        },
    )
    .await
}

/// A writer on `node` whose kubelet is about to die, and where its replacement must run.
struct KubeletDeath<'a> {
    app: &'a str,
    node: &'a str,
    policy: &'a str,
    moved: Moved<'a>,
    /// The agent's process before the fault.
    agent: i32,
}

impl<'a> KubeletDeath<'a> {
    /// `app`'s writer started on `node` (`refuge` cordoned meanwhile), `policy` its node's.
    async fn start(
        ctx: &Ctx<'_>,
        app: &'a str,
        node: &'a str,
        policy: &'a str,
        refuge: &'a str,
    ) -> anyhow::Result<Self> {
        let moved = Moved::start(start_writer(ctx, app, node, &[node, refuge]).await?, refuge);
        let pids = ctx.cluster.pod_pids(node, &uid(&moved.old)?)?;
        ensure!(
            !pids.is_empty(),
            "no process of the {app} writer found in {node}'s cgroups"
        );
        Ok(Self {
            app,
            node,
            policy,
            moved,
            agent: agent_process(ctx, node)?,
        })
    }

    /// The writer's processes frozen before the kubelet died (a SIGKILL waits until they
    /// thaw): podha asks for the fence, the agent kills, but its check sees the cgroup
    /// populated, so nothing is acknowledged nor tainted for `frozen`; then they thaw.
    async fn held_while_its_writer_lives(
        &self,
        ctx: &Ctx<'_>,
        frozen: std::time::Duration,
    ) -> anyhow::Result<()> {
        let node = self.node;
        wait_for(
            &format!("podha's fence request on {node}"),
            secs(60),
            || async { Ok(ctx.fence_annotations(node).await?.0) },
        )
        .await?;
        let until = Instant::now() + frozen;
        while Instant::now() < until {
            let (request, ack) = ctx.fence_annotations(node).await?;
            let tainted = fencing::has_out_of_service_taint(&ctx.nodes().get(node).await?);
            ensure!(
                ack.is_none() && !tainted,
                "{node} acknowledged ({ack:?} for {request:?}) or tainted ({tainted}) while its \
                 writer's processes were still there"
            );
            tokio::time::sleep(secs(1)).await;
        }
        let uid = uid(&self.moved.old)?;
        let pids = ctx.cluster.pod_pids(node, &uid)?;
        ensure!(
            !pids.is_empty(),
            "the frozen {} writer died before it thawed",
            self.app
        );
        ctx.cluster.freeze_pod(node, &uid, false)?;
        log(
            &ctx.ns,
            format!(
                "{node}: fence asked, its writer frozen (pids {pids:?}): no acknowledgement nor \
                 taint for {frozen:?}; thawed"
            ),
        );
        Ok(())
    }

    /// The node's kubelet died at `started`: the replacement runs on the refuge under the
    /// agent's acknowledgement, the old writer's processes gone, the write log clean, the agent
    /// the same process as before.
    async fn fenced_by_its_agent(&self, ctx: &Ctx<'_>, started: Instant) -> anyhow::Result<()> {
        let (app, node) = (self.app, self.node);
        let replacement = self.moved.replacement(ctx, app, started).await?;
        tainted_with_proof(ctx, node, self.policy, "AgentAcknowledged").await?;
        let (request, ack) = ctx.fence_annotations(node).await?;
        ensure!(
            request.is_some() && ack == request,
            "{node}: fence request {request:?}, acknowledgement {ack:?}"
        );
        let left = ctx.cluster.pod_pids(node, &uid(&self.moved.old)?)?;
        ensure!(
            left.is_empty(),
            "the old {app} writer still has processes on {node}: {left:?}"
        );
        let report = workload::check(ctx.cluster.dir(), &self.moved.volume)?;
        ensure!(report.clean(), "{node}'s writer's volume: {report:?}");
        ensure!(
            report.writers.len() == 2,
            "both writers should have written: {report:?}"
        );
        let agent = agent_process(ctx, node)?;
        ensure!(
            agent == self.agent,
            "{node}'s agent ran as pid {} before its fence and as {agent} after: the fence took \
             it down",
            self.agent
        );
        log(
            &ctx.ns,
            format!(
                "{} Running on {} {:.1?} after {node}'s kubelet died, under its agent's \
                 acknowledgement; the old writer killed, the agent up; write log: {} accepted, \
                 0 split-brain, 0 lost",
                name_of(&replacement),
                self.moved.refuge,
                started.elapsed(),
                report.accepted_writes
            ),
        );
        Ok(())
    }
}

pub(super) fn kubelet_down_fenced_by_its_agent(
    shared: &SharedCluster,
) -> Result<(), libtest_mimic::Failed> {
    let helm = podha_sim::chart_rbac::helm_path()?;
    run_scenario(shared, NS, |ctx| async move {
        let real = real_nodes();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        let app_nodes = &real[2..];
        let (alone, either, refuge) = (app_nodes[0], app_nodes[1], app_nodes[2]);
        fencing::every_real_node_up(&ctx, &real).await?;
        let agent = SHORTEST_AGENT_TIMINGS
            .sim_values()
            .fencing_best_effort_pods();
        chart_install::upgrade(ctx.cluster, &helm, &agent, &["rbac.bmcSecrets=true"])?;
        wait_agents(&ctx).await?;
        log(
            &ctx.ns,
            format!(
                "agents upgraded to fence {} and confirm {}",
                agent.values()["agent"]["fence"],
                agent.values()["agent"]["fenceConfirm"]
            ),
        );
        // Earlier scenarios' policies select these nodes too, with other proofs.
        delete_policies(
            &ctx,
            [POLICY, fencing::POLICY_NAME, fencing::CUT_POLICY_NAME],
        )
        .await?;
        apply_acknowledged_policy(
            &ctx,
            ALONE_POLICY,
            alone,
            json!({ "proof": "AgentAcknowledged" }),
        )
        .await?;
        unreachable_bmc(&ctx, either).await?;
        apply_acknowledged_policy(
            &ctx,
            ANY_OF_POLICY,
            either,
            json!({
                "proof": "AnyOf",
                "anyOf": ["AgentAcknowledged", "BMC"],
                "bmc": { "secretName": "bmc-{node}" },
            }),
        )
        .await?;

        let deaths = [
            KubeletDeath::start(&ctx, "acked", alone, ALONE_POLICY, refuge).await?,
            KubeletDeath::start(&ctx, "either", either, ANY_OF_POLICY, refuge).await?,
        ];
        // The confirmation is what lets the acknowledgement go: with the first writer frozen,
        // its cgroup stays populated after the kill.
        ctx.cluster
            .freeze_pod(alone, &uid(&deaths[0].moved.old)?, true)?;
        for death in &deaths {
            ctx.cluster.kill_kubelet(death.node)?;
        }
        let started = Instant::now();
        log(
            &ctx.ns,
            format!(
                "the kubelets of {alone} and {either} killed, their writers running on ({alone}'s \
                 frozen)"
            ),
        );
        let (a, b) = tokio::join!(
            async {
                deaths[0]
                    .held_while_its_writer_lives(&ctx, WRITER_FROZEN)
                    .await?;
                deaths[0].fenced_by_its_agent(&ctx, started).await
            },
            deaths[1].fenced_by_its_agent(&ctx, started)
        );
        a?;
        b?;
        let warned = podha_events(&ctx.client, "default", "PowerOffFailed", either).await?;
        ensure!(
            warned.iter().any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| n.contains("unreachable"))
            }),
            "no Warning PowerOffFailed naming the unreachable BMC of {either}: {warned:?}"
        );
        log(
            &ctx.ns,
            format!(
                "{either}: its BMC unreachable (Warning), its agent's acknowledgement proved the \
                 fence"
            ),
        );
        // The two nodes stay without a kubelet: a later scenario starts them again
        // (`fencing::every_real_node_up`).
        ctx.remove_workloads(secs(180)).await?;
        Ok(())
    })
}
