//! `fencing.proof: AgentAcknowledged` with the chart's own image, which has no shell, on real
//! nodes. The agents are upgraded (`helm upgrade`, as a user changes `agent.fence`) to a fence
//! that leaves them running: the node's BestEffort pods killed through their cgroup
//! (`write:<cgroup>/kubepods/besteffort/cgroup.kill=1`), confirmed once that cgroup is empty
//! (`read:<cgroup>/kubepods/besteffort/cgroup.events=populated 0`); the agent's own pod is
//! Burstable and lives on.
//!
//! - A writer's node loses its kubelet (killed and not restarted: its containers run on and
//!   write). podha judges the node dead by its Lease and asks its agent for a fence; the agent kills the writer, sees the cgroup empty and acknowledges. Only then does
//!   podha taint the node (the taint's event names `AgentAcknowledged`), and the volume moves.
//!   On storage that does not fence, the write log shows no split-brain write, and the old
//!   writer has no process left.
//! - The same under `anyOf: [AgentAcknowledged, BMC]`, the node's BMC unreachable (its Secret
//!   names an address nothing answers): podha asks both at once, the BMC's power-off fails with
//!   a Warning naming the cause, the agent's acknowledgement proves the fence.
//!
//! The agents live through their fences (the same pods, not restarted); both nodes boot again
//! and podha takes its taints off.

use super::*;
use fencing::{Moved, start_writer, uid};

pub(super) const NS: &str = "acknowledged";
pub(super) const POLICY_NAME: &str = "acknowledged-real-nodes";
/// Where podha's BMC Secrets live (`rbac.bmcSecrets` lets podha read them there).
const BMC_ADDRESS_NOBODY_ANSWERS: &str = "https://127.0.0.1:1";

/// Whether the chart's agents fence through the node's BMC, as the realnode scenarios install
/// them.
pub(super) async fn agents_fence_through_bmc(ctx: &Ctx<'_>) -> anyhow::Result<bool> {
    let bmc_fence = SHORTEST_AGENT_TIMINGS.sim_values().values()["agent"]["fence"].clone();
    Ok(agent_args(ctx).await?.iter().any(|a| {
        Some(a.as_str())
            == bmc_fence
                .as_str()
                .map(|f| format!("--fence={f}"))
                .as_deref()
    }))
}

/// The arguments of the agent DaemonSet's container.
async fn agent_args(ctx: &Ctx<'_>) -> anyhow::Result<Vec<String>> {
    let daemon_sets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
    let ds = daemon_sets.get(&format!("{RELEASE}-agent")).await?;
    Ok(ds
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default())
}

/// The policy of the writers here: the real nodes, fast detection on the kubelet's Lease alone
/// (not the kubelet's port, which the host's kernel still refuses, a host that is up; nor the
/// agent's heartbeat, which podha hears throughout), the taint, `fencing`.
async fn apply_acknowledged_policy(
    ctx: &Ctx<'_>,
    fencing: serde_json::Value,
) -> anyhow::Result<()> {
    apply_policy_spec(
        ctx,
        POLICY_NAME,
        json!({
            "nodeSelector": { "matchLabels": { "type": "real" } },
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
            "safety": { "maxUnhealthy": 2, "unhealthyWindow": "0s" },
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

/// The taint's event on `node` names `proof`.
async fn tainted_with_proof(ctx: &Ctx<'_>, node: &str, proof: &str) -> anyhow::Result<()> {
    let wanted = format!("fencing proof: {proof}");
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

/// `app`'s writer started on `node`, then `node`'s kubelet killed: the replacement runs on
/// `refuge` under the agent's acknowledgement, the old writer's processes gone, the write log
/// clean, the agent the same process as before.
async fn fenced_by_its_agent(
    ctx: &Ctx<'_>,
    app: &str,
    node: &str,
    refuge: &str,
) -> anyhow::Result<()> {
    let moved = Moved::start(start_writer(ctx, app, node, &[node, refuge]).await?, refuge);
    let agent = agent_process(ctx, node)?;
    ctx.cluster.kill_kubelet(node)?;
    let started = Instant::now();
    log(
        &ctx.ns,
        format!("{node}'s kubelet killed, its writer running on"),
    );
    let replacement = moved.replacement(ctx, app, started).await?;
    tainted_with_proof(ctx, node, "AgentAcknowledged").await?;
    let left = ctx.cluster.pod_pids(node, &uid(&moved.old)?)?;
    ensure!(
        left.is_empty(),
        "the old {app} writer still has processes on {node}: {left:?}"
    );
    let report = workload::check(ctx.cluster.dir(), &moved.volume)?;
    ensure!(report.clean(), "{node}'s writer's volume: {report:?}");
    ensure!(
        report.writers.len() == 2,
        "both writers should have written: {report:?}"
    );
    let agent_after = agent_process(ctx, node)?;
    ensure!(
        agent_after == agent,
        "{node}'s agent ran as pid {agent} before its fence and as {agent_after} after: the \
         fence took it down"
    );
    log(
        &ctx.ns,
        format!(
            "{} Running on {refuge} {:.1?} after {node}'s kubelet died, under its agent's \
             acknowledgement; the old writer killed, the agent up; write log: {} accepted, 0 \
             split-brain, 0 lost",
            name_of(&replacement),
            started.elapsed(),
            report.accepted_writes
        ),
    );
    Ok(())
}

pub(super) fn kubelet_down_fenced_by_its_agent(
    shared: &SharedCluster,
) -> Result<(), libtest_mimic::Failed> {
    let helm = podha_sim::chart_rbac::helm_path()?;
    run_scenario(shared, NS, |ctx| async move {
        let real = real_nodes();
        let real: Vec<&str> = real.iter().map(String::as_str).collect();
        let app_nodes = &real[2..];
        let (first, second, refuge) = (app_nodes[0], app_nodes[1], app_nodes[2]);
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
        for name in [POLICY, fencing::POLICY_NAME, fencing::CUT_POLICY_NAME] {
            match policies(&ctx).delete(name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("delete PodHAPolicy {name}")),
            }
        }

        apply_acknowledged_policy(&ctx, json!({ "proof": "AgentAcknowledged" })).await?;
        fenced_by_its_agent(&ctx, "acked", first, refuge).await?;

        unreachable_bmc(&ctx, second).await?;
        apply_acknowledged_policy(
            &ctx,
            json!({
                "proof": "AnyOf",
                "anyOf": ["AgentAcknowledged", "BMC"],
                "bmc": { "secretName": "bmc-{node}" },
            }),
        )
        .await?;
        fenced_by_its_agent(&ctx, "either", second, refuge).await?;
        let warned = podha_events(&ctx.client, "default", "PowerOffFailed", second).await?;
        ensure!(
            warned.iter().any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| n.contains("unreachable"))
            }),
            "no Warning PowerOffFailed naming the unreachable BMC of {second}: {warned:?}"
        );
        log(
            &ctx.ns,
            format!(
                "{second}: its BMC unreachable (Warning), its agent's acknowledgement proved the fence"
            ),
        );

        for node in [first, second] {
            ctx.cluster.start_node(node).await?;
        }
        for node in [first, second] {
            wait_for(
                &format!("podha to take its taint off {node}"),
                secs(90),
                || async {
                    let n = ctx.nodes().get(node).await?;
                    Ok((!fencing::has_out_of_service_taint(&n)).then_some(()))
                },
            )
            .await?;
        }
        log(
            &ctx.ns,
            format!("{first} and {second} back, podha's taints gone"),
        );
        ctx.remove_workloads(secs(180)).await?;
        Ok(())
    })
}
