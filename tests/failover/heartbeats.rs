//! Judged on heartbeats alone, proven only by a fence the agent reports done
//! (`detection.signals: [AgentHeartbeat]`, `fencing.proof: AgentAcknowledged`): podha is cut
//! off from a running node's agent (its probes dropped), a fault between podha and the node
//! alone, the kubelet renewing its Lease throughout. Asked every second, the agent's silence
//! has podha judge the node dead without waiting for a Lease grace; podha asks for the fence on
//! the Node, and the agent, still reaching the API server, fences, confirms and acknowledges:
//! only then the out-of-service taint, and db moves. The wrong judgement of a healthy node cost
//! a fence, never a write by two. Back, the node is untainted.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::agent::{agent_lease_holder, fence_annotations, heard_within, said_proof, untainted};
use super::{
    Failed, Operators, SharedCluster, acted_once, has_podha_taint, log, other, policy_and_db,
    scenario, secs_, wait_recovered,
};
use podha_sim::testkit::*;

/// The scenario's nodes, whose agent podha is cut off from.
pub const PAIR: [&str; 2] = ["node-27", "node-28"];

pub fn acknowledged_fence_follows_a_heartbeat_judgement(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = PAIR;
    scenario(shared, ops, "heartbeats", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        let spec = json!({
            "detection": {
                "signals": ["AgentHeartbeat"],
                "interval": "1s",
                "failureThreshold": 3,
                "tcpTimeout": "500ms",
            },
            "fencing": {"proof": "AgentAcknowledged"},
            "safety": {"unhealthyWindow": "0s"},
        });
        let (_, node, _, pv) = policy_and_db(&ctx, &pair, spec).await?;
        let target = other(&pair, &node);
        for n in pair {
            wait_for(&format!("{n}'s agent Lease"), secs_(30), || async {
                Ok(agent_lease_holder(&ctx, n).await?.filter(|h| h == n))
            })
            .await?;
            heard_within(&ctx, n, Duration::from_secs(3), secs_(30)).await?;
        }

        ctx.cluster.cut_agent_off(&node, true)?;
        let cut = Instant::now();
        let tainted = async {
            acted_once(&ctx.client, "default", "FenceRequested", &node).await?;
            wait_for(
                "the taint after the agent's acknowledgement",
                secs_(60),
                || async { Ok(has_podha_taint(&ctx, &node).await?.then_some(())) },
            )
            .await
        }
        .await;
        // podha hears the agent again, before it could fence its node on its own as well.
        ctx.cluster.cut_agent_off(&node, false)?;
        tainted?;
        let after = cut.elapsed();
        let (request, ack) = fence_annotations(&ctx, &node).await?;
        if request.is_none() || request != ack {
            bail!("{node}: fence request {request:?}, acknowledgement {ack:?}");
        }
        let fences = ctx.cluster.fences()?;
        if !fences
            .iter()
            .any(|f| f.node == node && f.reason.contains("asked"))
        {
            bail!("{node} tainted without the fence podha asked for: {fences:?}");
        }
        said_proof(&ctx, &node, "AgentAcknowledged").await?;
        log(
            &ns,
            format!(
                "{node}: agent unheard, judged dead, fenced on request and tainted {after:.1?} \
                 after podha was cut off from it"
            ),
        );
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        ctx.cluster.start_node(&node).await?;
        untainted(&ctx, &node).await?;
        log(&ns, format!("{node} back and untainted"));
        Ok(())
    })
}
