//! Judged on probes alone (`detection.signals: [AgentHeartbeat, KubeletTCP]`, proof
//! `AgentAcknowledged`), a healthy pair of nodes is watched through every fault of podha and of
//! its way to the control plane that the suite's last scenarios make: a leader stopped, podha
//! cut off from the API server for 20 s, a leader stopped mid-failover. None of them is a fault
//! of the nodes: podha must ask no fence of them, judge neither dead, and taint nothing. (The
//! same policy holds a node podha alone is cut off from while its kubelet renews, and fences
//! one whose kubelet died: `heartbeats`.) The pair is the
//! policy-edit scenario's, free once the scenarios that run in parallel are over.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::agent::heard_within;
use super::{
    Failed, Operators, SharedCluster, create_policy, delete_policy, has_podha_taint, log, metric,
    ops_leader, podha_requests, policy, scrape, secs_,
};
use podha_sim::testkit::*;

/// The healthy pair: the policy-edit scenario's, which is over by then (and started its node
/// again).
pub const PAIR: [&str; 2] = ["node-19", "node-20"];
const NS: &str = "probes-only";
/// What podha told or did to a node: the events it judges, fences or taints by.
const ACTS: [&str; 3] = ["NodeFailed", "FenceRequested", "OutOfServiceTaintAdded"];

/// What podha had told and done to the pair when the watch began (the policy-edit scenario
/// killed one of them before): only what comes after counts.
static BEFORE: Mutex<Option<Record>> = Mutex::new(None);

/// Per node of the pair: how often podha told each of [`ACTS`], its writes to the Node, the
/// fences of the node.
type Record = BTreeMap<String, (BTreeMap<String, i32>, usize, usize)>;

async fn record(ctx: &Ctx<'_>) -> anyhow::Result<Record> {
    let mut out = Record::new();
    let fences = ctx.cluster.fences()?;
    for node in PAIR {
        let mut told = BTreeMap::new();
        for reason in ACTS {
            let times = podha_event_count(&ctx.client, "default", reason, node).await?;
            told.insert(reason.to_string(), times);
        }
        let writes = podha_requests(ctx.cluster, "patch", "nodes", None, node)?.len();
        let fenced = fences.iter().filter(|f| f.node == node).count();
        out.insert(node.to_string(), (told, writes, fenced));
    }
    Ok(out)
}

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
        for node in PAIR {
            ctx.wait_ready(node, secs_(60)).await?;
        }
        create_policy(&ctx.client, policy(NS, NS, &PAIR, spec)).await?;
        ctx.create::<k8s_openapi::api::apps::v1::StatefulSet>(statefulset("db", &PAIR))
            .await?;
        ctx.wait_app_running("db", secs_(120)).await?;
        heard_both(&ctx).await?;
        let before = record(&ctx).await?;
        *BEFORE.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = Some(before);
        log(NS, "podha hears both agents of the healthy pair");
        Ok(())
    })
}

/// After the faults of the scenarios before: no fence asked of the pair, neither node judged
/// dead nor tainted, and podha hears both again.
pub fn nothing_done_to_the_healthy_pair(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let replicas = ops.get(cluster)?;
    run_scenario(shared, NS, |ctx| async move {
        let before = BEFORE
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .clone()
            .context("the watch was not set up (its scenario failed or did not run)")?;
        ops_leader(replicas).await?;
        heard_both(&ctx).await?;
        let after = record(&ctx).await?;
        if after != before {
            bail!(
                "podha acted on the healthy pair (per node: events by reason, writes to the \
                 Node, fences): before the faults {before:?}, after {after:?}"
            );
        }
        for node in PAIR {
            if has_podha_taint(&ctx, node).await? {
                bail!("podha tainted {node}, a healthy node");
            }
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
             the leader faults and podha's cut from the API server",
        );
        delete_policy(&ctx.client, NS).await;
        ctx.remove_workloads(secs_(90)).await
    })
}

/// Waits until podha hears the agents of both nodes of the pair (answered within 3 s).
async fn heard_both(ctx: &Ctx<'_>) -> anyhow::Result<()> {
    for node in PAIR {
        heard_within(ctx, node, Duration::from_secs(3), secs_(60))
            .await
            .with_context(|| format!("{node}'s agent unheard"))?;
    }
    Ok(())
}
