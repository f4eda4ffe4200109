//! Judged on probes alone (`detection.signals: [AgentHeartbeat, KubeletTCP]`, proof
//! `AgentAcknowledged`), a healthy pair of nodes is watched through every fault of podha and
//! the control plane the suite's last scenarios make: a leader stopped, podha cut off from the
//! API server, a leader stopped mid-failover; then the API server itself stopped for every
//! component. None of them is a fault of the nodes: podha must ask no fence of them, judge
//! neither dead, and taint nothing. (The same policy does fence a node podha is cut off from:
//! `heartbeats`.)

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::agent::heard_ago;
use super::{
    Failed, Operators, SharedCluster, create_policy, delete_policy, has_podha_taint, log, metric,
    ops_leader, podha_requests, policy, scrape, secs_,
};
use podha_sim::testkit::*;

/// The healthy pair, watched by no other scenario.
pub const PAIR: [&str; 2] = ["node-29", "node-30"];
const NS: &str = "probes-only";

/// Sets the watch up: the policy and a StatefulSet on the pair, both agents heard. Left in
/// place for the scenarios that follow; [`nothing_done_to_the_healthy_pair`] removes it.
pub fn watch_a_healthy_pair(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let cluster = shared.get()?;
    ops.get(cluster)?;
    run_scenario(shared, NS, |ctx| async move {
        let spec = json!({
            "detection": {
                "signals": ["AgentHeartbeat", "KubeletTCP"],
                "interval": "1s",
                "failureThreshold": 3,
                "tcpTimeout": "500ms",
            },
            "fencing": {"proof": "AgentAcknowledged"},
            // Nothing held by a count of unhealthy nodes: a misjudgement would show.
            "safety": {"maxUnhealthy": "100%", "unhealthyWindow": "0s"},
        });
        create_policy(&ctx.client, policy(NS, NS, &PAIR, spec)).await?;
        ctx.create::<k8s_openapi::api::apps::v1::StatefulSet>(statefulset("db", &PAIR))
            .await?;
        ctx.wait_app_running("db", secs_(120)).await?;
        heard_both(&ctx).await?;
        log(NS, "podha hears both agents of the healthy pair");
        Ok(())
    })
}

/// After the faults of the scenarios before, and the API server stopped for 20 s: no fence
/// asked of the pair, neither node judged dead nor tainted, and podha hears both again.
pub fn nothing_done_to_the_healthy_pair(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let replicas = ops.get(cluster)?;
    run_scenario(shared, NS, |ctx| async move {
        ctx.cluster.stop_apiserver()?;
        log(NS, "kube-apiserver stopped for 20 s");
        tokio::time::sleep(secs_(20)).await;
        ctx.cluster.start_apiserver().await?;
        ops_leader(replicas).await?;
        // Past the probes' threshold again, counted from the new leadership.
        tokio::time::sleep(secs_(10)).await;
        heard_both(&ctx).await?;
        for node in PAIR {
            for reason in ["NodeFailed", "FenceRequested", "OutOfServiceTaintAdded"] {
                let events = podha_events(&ctx.client, "default", reason, node).await?;
                if !events.is_empty() {
                    bail!("podha told {reason} of {node}, a healthy node: {events:?}");
                }
            }
            if has_podha_taint(&ctx, node).await? {
                bail!("podha tainted {node}, a healthy node");
            }
            let patches = podha_requests(ctx.cluster, "patch", "nodes", None, node)?;
            if !patches.is_empty() {
                bail!("podha wrote to {node}, a healthy node: {patches:?}");
            }
        }
        let fences: Vec<_> = ctx
            .cluster
            .fences()?
            .into_iter()
            .filter(|f| PAIR.contains(&f.node.as_str()))
            .collect();
        if !fences.is_empty() {
            bail!("the healthy pair was fenced: {fences:?}");
        }
        for r in replicas {
            let failures = metric(&scrape(r)?, "podha_node_failures_total", &[("policy", NS)]);
            if failures.is_some_and(|v| v > 0.0) {
                bail!("{} judged a node of the healthy pair dead", r.identity);
            }
        }
        log(
            NS,
            "no fence asked, no node judged dead, nothing tainted on the healthy pair through \
             the leader and API server faults",
        );
        delete_policy(&ctx.client, NS).await;
        ctx.remove_workloads(secs_(90)).await
    })
}

/// Waits until podha hears the agents of both nodes of the pair (answered within 3 s).
async fn heard_both(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    for node in PAIR {
        wait_for(
            &format!("podha to hear {node}'s agent"),
            secs_(60),
            || async {
                Ok(heard_ago(ctx, node)
                    .await?
                    .filter(|ago| *ago < Duration::from_secs(3))
                    .map(|_| ()))
            },
        )
        .await
        .with_context(|| format!("{node}'s agent unheard"))?;
    }
    Ok(())
}
