//! podha agent and `fencing.proof: Agent` (issue 15): the out-of-service taint only once the
//! node's agent proved the node fenced. Every kwok node of the suite's cluster runs an agent
//! (`podha agent`, fencing through `podha-sim node fence`, which records each fence).
//!
//! 1. The kubelet dies and the machine runs on (kwok killed, agent alive): podha asks the
//!    agent, which fences and acknowledges; then the taint and the failover.
//! 2. The machine dies with its agent: podha asks, nobody answers; the taint waits until the
//!    agent has been silent for its isolation timeout plus the policy's margin. Restarted, the
//!    node's new agent finds the request of its earlier boot and answers without fencing.
//!
//! And over the whole suite (a trial after the scenarios that stop the leading replica and cut
//! podha off the API server): no agent fenced its node but the one podha asked.

use std::time::{Duration, Instant};

use anyhow::bail;
use podha::agent::{FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION};
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, acted_once, action_events, has_podha_taint, log, other,
    policy_and_db, scenario, secs_, wait_recovered,
};
use podha_sim::testkit::*;

/// The agents' isolation timeout in this suite: longer than podha takes to judge a node dead
/// on its Lease (12 s grace, 3 probes), so the silence proof is what the taint waits for.
pub const ISOLATION_TIMEOUT: Duration = Duration::from_secs(15);
const MARGIN: Duration = Duration::from_secs(2);

pub fn fences_before_the_taint(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-23", "node-24"];
    scenario(shared, ops, "agent", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        let spec = json!({
            "detection": {
                "signals": ["Lease"],
                "interval": "1s",
                "failureThreshold": 3,
                "leaseGracePeriod": "12s",
                "tcpTimeout": "500ms",
            },
            "fencing": {"proof": "Agent", "agentMargin": "2s"},
            // Its two nodes die one after the other: the second is no sign of a partition.
            "safety": {"unhealthyWindow": "0s"},
        });
        let (_, node, _, pv) = policy_and_db(&ctx, &pair, spec).await?;
        let target = other(&pair, &node);
        let boot = boot_id(&ctx, &node).await?;

        // 1. Kubelet dead, machine and agent up.
        ctx.cluster.kill_kubelet(&node)?;
        acted_once(&ctx.client, "default", "FenceRequested", &node).await?;
        wait_for(
            "the taint after the agent's acknowledgement",
            secs_(60),
            || async { Ok(has_podha_taint(&ctx, &node).await?.then_some(())) },
        )
        .await?;
        let (request, ack) = fence_annotations(&ctx, &node).await?;
        if request.is_none() || request != ack || !request.as_deref().unwrap_or("").ends_with(&boot)
        {
            bail!("{node}: fence request {request:?}, acknowledgement {ack:?}, boot {boot}");
        }
        let fences = ctx.cluster.fences()?;
        if fences.len() != 1 || fences[0].node != node || !fences[0].reason.contains("asked") {
            bail!("expected the one fence podha asked of {node}, fences.log has {fences:?}");
        }
        said_proof(&ctx, &node, "AgentAcknowledged").await?;
        log(
            &ns,
            format!("{node} fenced by its agent on request {request:?}, then tainted"),
        );
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        ctx.cluster.start_node(&node).await?;
        untainted(&ctx, &node).await?;

        // 2. The machine dies with its agent.
        let killed = Instant::now();
        ctx.cluster.kill_node(target)?;
        acted_once(&ctx.client, "default", "FenceRequested", target).await?;
        wait_for("the taint after the agent's silence", secs_(90), || async {
            Ok(has_podha_taint(&ctx, target).await?.then_some(()))
        })
        .await?;
        let waited = killed.elapsed();
        if waited < ISOLATION_TIMEOUT + MARGIN {
            bail!(
                "{target} tainted {waited:.1?} after its agent died, before the agent's \
                 isolation timeout ({ISOLATION_TIMEOUT:?}) and the margin ({MARGIN:?})"
            );
        }
        said_proof(&ctx, target, "AgentSilent").await?;
        log(
            &ns,
            format!("{target} tainted {waited:.1?} after the kill (agent silent)"),
        );
        wait_recovered(&ctx, "db", &pv, &node, target, secs_(90)).await?;
        // Back with a new boot: its agent answers the request of the old boot, no fence.
        ctx.cluster.start_node(target).await?;
        wait_for(
            "the new boot's agent to answer the old request",
            secs_(30),
            || async {
                let (request, ack) = fence_annotations(&ctx, target).await?;
                Ok((request.is_some() && request == ack).then_some(()))
            },
        )
        .await?;
        untainted(&ctx, target).await?;
        let fences = ctx.cluster.fences()?;
        if fences.iter().any(|f| f.node == target) {
            bail!("{target} was fenced after it rebooted: {fences:?}");
        }
        log(
            &ns,
            format!("{target} back; the old request answered without a fence"),
        );
        Ok(())
    })
}

/// Over the whole suite, after the scenarios that stop the leader and cut podha off: the only
/// fences are those podha asked for.
pub fn no_agent_fenced_a_node_podha_hears(
    shared: &SharedCluster,
    _ops: &Operators,
) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let fences = cluster.fences().map_err(|e| e.to_string())?;
    let unasked: Vec<_> = fences
        .iter()
        .filter(|f| !f.reason.contains("asked"))
        .collect();
    if !unasked.is_empty() {
        return Err(format!("agents fenced their nodes on their own: {unasked:?}").into());
    }
    if fences.len() != 1 {
        return Err(format!("expected the one fence podha asked for, got {fences:?}").into());
    }
    Ok(())
}

async fn boot_id(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<String> {
    let n = ctx.nodes().get(node).await?;
    Ok(n.status
        .and_then(|s| s.node_info)
        .map(|i| i.boot_id)
        .unwrap_or_default())
}

async fn fence_annotations(
    ctx: &Ctx<'_>,
    node: &str,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let n = ctx.nodes().get(node).await?;
    let a = n.metadata.annotations.unwrap_or_default();
    Ok((
        a.get(FENCE_REQUEST_ANNOTATION).cloned(),
        a.get(FENCE_ACK_ANNOTATION).cloned(),
    ))
}

async fn untainted(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    wait_for(&format!("podha's taint off {node}"), secs_(60), || async {
        Ok((!has_podha_taint(ctx, node).await?).then_some(()))
    })
    .await
}

/// The taint's event names the proof it rested on.
async fn said_proof(ctx: &Ctx<'_>, node: &str, proof: &str) -> anyhow::Result<()> {
    let what = format!("the OutOfServiceTaintAdded event of {node} naming {proof}");
    let wanted = format!("fencing proof: {proof}");
    wait_for(&what, secs_(30), || async {
        let events = action_events(&ctx.client, "default", "OutOfServiceTaintAdded", node).await?;
        Ok(events
            .iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&wanted)))
            .then_some(()))
    })
    .await
}
