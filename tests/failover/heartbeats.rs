//! Judged on heartbeats alone, proven only by a fence the agent reports done
//! (`detection.signals: [AgentHeartbeat]`, `fencing.proof: AgentAcknowledged`).
//!
//! 1. podha is cut off from a running node's agent (its probes dropped), a fault between podha
//!    and the node alone, the kubelet renewing its Lease throughout. Asked every second, the
//!    agent's silence has podha judge the node dead without waiting for a Lease grace, but the
//!    renewal after the silence holds it (`NodeLeaseRenewing`): no fence is asked, nothing is
//!    tainted. The cut ends before the agent's own isolation timeout.
//! 2. The kubelet dies and the machine runs on; once its Lease missed a renewal, podha is cut
//!    off from the agent again: judged dead, podha asks for the fence on the Node, and the
//!    agent, still reaching the API server, fences, confirms and acknowledges: only then the
//!    out-of-service taint, and db moves. Back, the node is untainted.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::agent::{agent_lease_holder, heard_within, said_proof, untainted};
use super::{
    Failed, Operators, SharedCluster, acted_once, has_podha_taint, log, other, policy_and_db,
    scenario, secs_, times_acted, wait_recovered,
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

        // 1. Cut off from podha alone: held while the kubelet renews, nothing asked. The cut
        // starts 6 s after a renewal, so that the next one (every 10 s) comes after the probes
        // went silent and after the judgement (three 1 s probes), and ends soon after it, long
        // before the agent's isolation timeout (15 s) would have it fence its node on its own.
        let before = lease_renew_time(&ctx, &node).await?;
        let renewal = |than: Option<String>| {
            let ctx = &ctx;
            let node = &node;
            async move {
                let now = lease_renew_time(ctx, node).await?;
                Ok((now != than).then_some(now))
            }
        };
        let last = wait_for(&format!("a renewal of {node}'s Lease"), secs_(15), || {
            renewal(before.clone())
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(6)).await;
        ctx.cluster.cut_agent_off(&node, true)?;
        let cut = Instant::now();
        let renewed = wait_for(
            &format!("{node}'s kubelet to renew its Lease while podha is cut off"),
            secs_(8),
            || renewal(last.clone()),
        )
        .await;
        tokio::time::sleep(
            Duration::from_secs(6)
                .saturating_sub(cut.elapsed())
                .max(Duration::from_millis(1500)),
        )
        .await;
        ctx.cluster.cut_agent_off(&node, false)?;
        renewed?;
        wait_for("podha's NodeLeaseRenewing event", secs_(30), || async {
            let held = times_acted(&ctx.client, "default", "NodeLeaseRenewing", &node).await?;
            Ok((held > 0).then_some(()))
        })
        .await?;
        let asked = times_acted(&ctx.client, "default", "FenceRequested", &node).await?;
        let (request, _) = ctx.fence_annotations(&node).await?;
        let fenced: Vec<_> = ctx
            .cluster
            .fences()?
            .into_iter()
            .filter(|f| f.node == node)
            .collect();
        if asked > 0
            || request.is_some()
            || !fenced.is_empty()
            || has_podha_taint(&ctx, &node).await?
        {
            bail!(
                "{node}, cut off from podha while its kubelet renewed: {asked} FenceRequested \
                 events, request {request:?}, fences {fenced:?} (expected none, and no taint)"
            );
        }
        heard_within(&ctx, &node, Duration::from_secs(3), secs_(30)).await?;
        log(
            &ns,
            format!("{node}: cut off from podha while renewing: held, no fence asked, heard again"),
        );

        // 2. The kubelet dies, the machine runs on; once the Lease missed a renewal (a renew
        // interval and the slack), podha is cut off from the agent again.
        ctx.cluster.kill_kubelet(&node)?;
        tokio::time::sleep(Duration::from_secs(14)).await;
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
        let (request, ack) = ctx.fence_annotations(&node).await?;
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
                "{node}: kubelet dead, agent unheard, judged dead, fenced on request and \
                 tainted {after:.1?} after podha was cut off from it"
            ),
        );
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        ctx.cluster.start_node(&node).await?;
        untainted(&ctx, &node).await?;
        log(&ns, format!("{node} back and untainted"));
        Ok(())
    })
}

/// The `renewTime` of `node`'s Lease, as the API server has it.
async fn lease_renew_time(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<Option<String>> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let lease = leases.get(node).await?;
    Ok(lease
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0.to_string()))
}
