//! podha agent and `fencing.proof: Agent`: the out-of-service taint only once the
//! node's agent proved the node fenced. Every kwok node of the suite's cluster runs an agent
//! (`podha agent`, fencing through `podha-sim node fence`, which records each fence).
//!
//! 1. The kubelet dies and the machine runs on (kwok killed, agent alive): podha asks the
//!    agent, which fences, confirms the fence (`--fence-confirm`) and acknowledges; then the
//!    taint and the failover. The node boots again with its agent's port blocked: through
//!    the next step its agent, never heard, does not fence it, and podha reports it
//!    unreachable (`AgentUnreachable`).
//! 2. The machine dies with its agent: podha asks, nobody answers; the taint waits until the
//!    agent has been silent for its isolation timeout plus the policy's margin. Restarted, the
//!    node's new agent finds the request of its earlier boot and answers without fencing.
//! 3. podha is cut off from a running node's agent (its probes dropped) while the agent
//!    reaches the API server: it renews its Lease, from which podha counts its silence, and
//!    stays up past its isolation timeout (no fence). Then the agent crashes and is restarted
//!    cut off from the API server too: the new agent goes on from its hearing file (podha last
//!    heard the node more than an isolation timeout ago), renews nothing, and fences the node
//!    at once, not an isolation timeout after its own start.
//!
//! 4. A node's agent is stopped for good (SIGTERM, as an uninstall stops it): it takes its
//!    advert off the Node and deletes its Lease; the node then dies with db on it, and podha
//!    holds it, unproven, past the time the agent advertised and the margin.
//!
//! And over the whole suite (a trial after the scenarios that stop the leading replica and cut
//! podha off the API server): no agent fenced its node but those podha asked and those podha
//! was cut off from.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, acted_once, action_events, explain_pod,
    explained_unprotected, has_podha_taint, heartbeats, log, other, policy_and_db, scenario, secs_,
    times_acted, untouched_for, wait_recovered,
};
use podha_sim::testkit::*;

/// The agents' isolation timeout in this suite: longer than podha takes to judge a node dead
/// on its Lease (12 s grace, 3 probes), so the silence proof is what the taint waits for.
pub const ISOLATION_TIMEOUT: Duration = Duration::from_secs(15);
/// The watchdog of each node's BMC, which its agent pets: more than a check (1 s) and the
/// longest survey (2.5 s), at most half the isolation timeout.
pub const WATCHDOG_TIMEOUT: Duration = Duration::from_secs(5);
/// The agents' peer surveys: a small cluster on loopback.
pub const SURVEY_TIMEOUT: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(2);
/// How long an agent podha is cut off from, renewing its Lease, is watched staying up: past its
/// isolation timeout, and the watchdog's timeout after that.
const STAYS_UP_FOR: Duration = ISOLATION_TIMEOUT.saturating_add(WATCHDOG_TIMEOUT);
/// The scenario's nodes: the only ones whose agents fence (the second one's on its own, 3.).
const PAIR: [&str; 2] = ["node-23", "node-24"];

pub fn fences_before_the_taint(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = PAIR;
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
        for n in pair {
            wait_for(&format!("{n}'s agent Lease"), secs_(30), || async {
                Ok(agent_lease_holder(&ctx, n).await?.filter(|h| h == n))
            })
            .await?;
        }
        // Its agent heard, petting a watchdog: `podha explain` counts db-0 protected.
        match explain_pod(&ctx, "db-0")? {
            (true, None) => {}
            other => bail!("podha explain: db-0 should be protected by its agent, got {other:?}"),
        }

        // 1. Kubelet dead, machine and agent up.
        ctx.cluster.kill_kubelet(&node)?;
        acted_once(&ctx.client, "default", "FenceRequested", &node).await?;
        wait_for(
            "the taint after the agent's acknowledgement",
            secs_(60),
            || async { Ok(has_podha_taint(&ctx, &node).await?.then_some(())) },
        )
        .await?;
        let (request, ack) = ctx.fence_annotations(&node).await?;
        if request.is_none() || request != ack || !request.as_deref().unwrap_or("").ends_with(&boot)
        {
            bail!("{node}: fence request {request:?}, acknowledgement {ack:?}, boot {boot}");
        }
        let fences = pair_fences(&ctx)?;
        if fences.len() != 1 || fences[0].node != node || !fences[0].reason.contains("asked") {
            bail!("expected the one fence podha asked of {node}, fences.log has {fences:?}");
        }
        said_proof(&ctx, &node, "AgentAcknowledged").await?;
        log(
            &ns,
            format!("{node} fenced by its agent on request {request:?}, then tainted"),
        );
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        // Back, its agent's port blocked from boot (as by a NetworkPolicy).
        let fences_before_boot = pair_fences(&ctx)?.len();
        ctx.cluster.cut_agent_off(&node, true)?;
        ctx.cluster.start_node(&node).await?;
        untainted(&ctx, &node).await?;

        // 2. The machine dies with its agent.
        let fenced_within = advertised_fenced_within(&ctx, target).await?;
        let killed = Instant::now();
        ctx.cluster.kill_node(target)?;
        acted_once(&ctx.client, "default", "FenceRequested", target).await?;
        wait_for("the taint after the agent's silence", secs_(90), || async {
            Ok(has_podha_taint(&ctx, target).await?.then_some(()))
        })
        .await?;
        let waited = killed.elapsed();
        // podha last heard the agent at most a probe interval (1 s) before the kill.
        if waited + Duration::from_secs(1) < fenced_within + MARGIN {
            bail!(
                "{target} tainted {waited:.1?} after its agent died, before the time the agent \
                 advertised ({fenced_within:?}) and the margin ({MARGIN:?})"
            );
        }
        said_proof(&ctx, target, "AgentSilent").await?;
        log(
            &ns,
            format!("{target} tainted {waited:.1?} after the kill (agent silent)"),
        );
        wait_recovered(&ctx, "db", &pv, &node, target, secs_(90)).await?;
        // Back with a new boot: its agent answers the request of the old boot without a
        // fence, or podha withdraws it first (the node is back, its incident over).
        ctx.cluster.start_node(target).await?;
        wait_for(
            "the old request answered by the new boot's agent, or withdrawn",
            secs_(60),
            || async {
                let (request, ack) = ctx.fence_annotations(target).await?;
                Ok((request.is_none() || request == ack).then_some(()))
            },
        )
        .await?;
        untainted(&ctx, target).await?;
        let fences = pair_fences(&ctx)?;
        if fences.iter().any(|f| f.node == target) {
            bail!("{target} was fenced after it rebooted: {fences:?}");
        }
        // Meanwhile (over a minute): the agent podha never heard stayed up, and was reported.
        if fences.len() != fences_before_boot {
            bail!("{node}, its agent never heard since it booted, was fenced: {fences:?}");
        }
        wait_for(
            &format!("the AgentUnreachable event of {node}"),
            secs_(30),
            || async {
                let events = action_events(&ctx.client, "default", "AgentUnreachable", &node);
                Ok((!events.await?.is_empty()).then_some(()))
            },
        )
        .await?;
        ctx.cluster.cut_agent_off(&node, false)?;
        log(
            &ns,
            format!("{node}'s agent, blocked from boot, fenced nothing and was reported"),
        );
        log(
            &ns,
            format!("{target} back; the old request answered without a fence, or withdrawn"),
        );

        // 3. podha cut off from a running agent, which renews its Lease and stays up; then
        // restarted without the API server. First podha hears the agent the reboot started
        // (its first probe told it when podha last heard the node: before the kill).
        heard_within(&ctx, target, Duration::from_secs(4), secs_(30)).await?;
        ctx.cluster.cut_agent_off(target, true)?;
        let stayed = async {
            tokio::time::sleep(STAYS_UP_FOR).await;
            let fences = pair_fences(&ctx)?;
            ensure!(
                fences.iter().all(|f| f.node != target),
                "{target} fenced though its agent renewed its Lease: {fences:?}"
            );
            ctx.cluster.restart_agent_cut_from_api_server(target)?;
            anyhow::Ok(std::time::SystemTime::now())
        }
        .await;
        let restarted = match stayed {
            Ok(at) => at,
            Err(e) => {
                ctx.cluster.cut_agent_off(target, false)?;
                return Err(e);
            }
        };
        log(
            &ns,
            format!(
                "{target}'s agent cut off from podha, renewing its Lease: up {STAYS_UP_FOR:?} \
                 later (isolation timeout {ISOLATION_TIMEOUT:?}); restarted cut off from the \
                 API server"
            ),
        );
        let fence = wait_for(
            &format!("{target}'s agent to fence it"),
            secs_(60),
            || async {
                let fences = pair_fences(&ctx)?;
                Ok(fences.into_iter().find(|f| f.node == target))
            },
        )
        .await;
        ctx.cluster.cut_agent_off(target, false)?;
        let fence = fence?;
        let restarted_ms = restarted
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let after = Duration::from_millis(
            u64::try_from(fence.at_ms.saturating_sub(restarted_ms)).unwrap_or(u64::MAX),
        );
        // podha last heard the node more than the isolation timeout ago: the watchdog, petted
        // by the old agent until it was killed, fires within its timeout; the new agent's own
        // verdict holds 2 s after a check and a survey. One that counted from its own start
        // would have petted the watchdog on and fenced an isolation timeout later.
        let latest = WATCHDOG_TIMEOUT + Duration::from_secs(3);
        if fence.reason.contains("asked") || after > latest {
            bail!(
                "{target} fenced {after:.1?} after its agent was restarted cut off from podha \
                 and the API server ({fence:?}): expected its own fence (or its watchdog's) \
                 within {latest:?}"
            );
        }
        log(
            &ns,
            format!("{target} fenced by its restarted agent {after:.1?} after its restart"),
        );

        // 4. The other node's agent stopped for good (SIGTERM, as an uninstall stops it): it
        // withdraws its Lease and its advert; then that node dies with db on it: held, never
        // proven (no agent fences it any more), however long its agent is silent.
        ctx.cluster.start_node(target).await?;
        untainted(&ctx, target).await?;
        let fenced_within = advertised_fenced_within(&ctx, &node).await?;
        ctx.cluster.stop_agent(&node)?;
        wait_for(
            &format!("{node}'s agent Lease and advert withdrawn"),
            secs_(10),
            || async {
                let lease = agent_lease_holder(&ctx, &node).await?;
                let n = ctx.nodes().get(&node).await?;
                let advert = podha::contract::agent_addr(&n).is_some();
                Ok((lease.is_none() && !advert).then_some(()))
            },
        )
        .await?;
        // Without an agent, nothing can prove the node fenced: `podha explain` says so before
        // the death, which then holds it.
        explained_unprotected(&ctx, "db-0", "agent", "no agent")?;
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(ctx.client.clone(), &ns);
        let db = pods.get("db-0").await?;
        let uid = db.metadata.uid.clone().unwrap_or_default();
        if node_of(&db) != Some(node.as_str()) {
            bail!("db-0 runs on {:?}, not on {node}", node_of(&db));
        }
        let held_before = times_acted(&ctx.client, "default", "FencingPending", &node).await?;
        ctx.cluster.kill_node(&node)?;
        log(
            &ns,
            format!("{node}'s agent stopped (advert withdrawn), then {node} killed"),
        );
        untouched_for(
            &ctx,
            &uid,
            &node,
            fenced_within + MARGIN + Duration::from_secs(5),
            " though its agent had been stopped for good",
        )
        .await?;
        let held = times_acted(&ctx.client, "default", "FencingPending", &node).await?;
        if held <= held_before {
            bail!("{node} dead and untainted, but no FencingPending event said why");
        }
        log(
            &ns,
            format!("{node} held past its old agent's fenced-within time and the margin"),
        );
        ctx.cluster.start_node(&node).await?;
        untainted(&ctx, &node).await?;
        Ok(())
    })
}

/// Over the whole suite, after the scenarios that stop the leader and cut podha off: the only
/// fences are the ones podha asked for (here and in `heartbeats`) and those of the agents podha
/// was cut off from.
pub fn no_agent_fenced_a_node_podha_hears(
    shared: &SharedCluster,
    _ops: &Operators,
) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let fences = cluster.fences().map_err(|e| e.to_string())?;
    // The agents podha was cut off from may have fenced their nodes on their own; nobody
    // else's did.
    let cut_off = |node: &str| PAIR.contains(&node) || heartbeats::PAIR.contains(&node);
    let unasked: Vec<_> = fences
        .iter()
        .filter(|f| !f.reason.contains("asked") && !cut_off(&f.node))
        .collect();
    if !unasked.is_empty() {
        return Err(format!("agents fenced their nodes on their own: {unasked:?}").into());
    }
    let here: Vec<_> = fences
        .iter()
        .filter(|f| PAIR.contains(&f.node.as_str()))
        .collect();
    if here.len() != 2 {
        return Err(format!(
            "expected the one fence podha asked for and the cut-off agent's, got {here:?}"
        )
        .into());
    }
    let asked: Vec<_> = fences
        .iter()
        .filter(|f| heartbeats::PAIR.contains(&f.node.as_str()) && f.reason.contains("asked"))
        .collect();
    if asked.len() != 1 {
        return Err(format!(
            "expected the one fence podha asked of the node judged on heartbeats, got {asked:?}"
        )
        .into());
    }
    Ok(())
}

/// The fences of this scenario's nodes (other scenarios fence theirs meanwhile).
fn pair_fences(ctx: &Ctx<'_>) -> anyhow::Result<Vec<podha_sim::cluster::agents::Fence>> {
    Ok(ctx
        .cluster
        .fences()?
        .into_iter()
        .filter(|f| PAIR.contains(&f.node.as_str()))
        .collect())
}

/// Waits up to `timeout` until podha hears `node`'s agent: its hearing file says podha heard
/// it less than `within` ago.
pub(super) async fn heard_within(
    ctx: &Ctx<'_>,
    node: &str,
    within: Duration,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait_for(
        &format!("podha to hear {node}'s agent"),
        timeout,
        || async {
            Ok(heard_ago(ctx, node)
                .await?
                .filter(|ago| *ago < within)
                .map(|_| ()))
        },
    )
    .await
}

/// How long ago podha last heard `node` in its current boot, as its agent's hearing file says
/// (written every second; the agent answers only signed questions).
pub(super) async fn heard_ago(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<Option<Duration>> {
    let boot = boot_id(ctx, node).await?;
    let Ok(text) = std::fs::read_to_string(ctx.cluster.agent_hearing_file(node)) else {
        return Ok(None);
    };
    let mut lines = text.lines();
    if lines.next() != Some(format!("boot={boot}").as_str()) {
        return Ok(None);
    }
    let Some(ms) = lines
        .next()
        .and_then(|l| l.strip_prefix("heard="))
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return Ok(None);
    };
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Ok(std::time::SystemTime::now().duration_since(at).ok())
}

async fn boot_id(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<String> {
    let n = ctx.nodes().get(node).await?;
    Ok(n.status
        .and_then(|s| s.node_info)
        .map(|i| i.boot_id)
        .unwrap_or_default())
}

/// The holder of node `node`'s agent Lease in podha's namespace, if there is one.
pub(super) async fn agent_lease_holder(
    ctx: &Ctx<'_>,
    node: &str,
) -> anyhow::Result<Option<String>> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(ctx.client.clone(), "default");
    let lease = leases
        .get_opt(&podha::contract::agent_lease_name(node))
        .await?;
    Ok(lease.and_then(|l| l.spec?.holder_identity))
}

pub(super) async fn untainted(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<()> {
    wait_for(&format!("podha's taint off {node}"), secs_(60), || async {
        Ok((!has_podha_taint(ctx, node).await?).then_some(()))
    })
    .await
}

/// The taint's event names the proof it rested on.
pub(super) async fn said_proof(ctx: &Ctx<'_>, node: &str, proof: &str) -> anyhow::Result<()> {
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

/// How long after podha last heard it node `node`'s agent says its node is fenced at the
/// latest (its annotation): with a watchdog, its isolation timeout.
async fn advertised_fenced_within(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<Duration> {
    let n = ctx.nodes().get(node).await?;
    let value = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(podha::contract::AGENT_FENCED_WITHIN_ANNOTATION))
        .with_context(|| format!("{node}'s agent advertised no fenced-within time"))?;
    let fenced_within = humantime::parse_duration(value)?;
    if fenced_within != ISOLATION_TIMEOUT {
        bail!(
            "{node}'s agent pets a watchdog but advertised {value}, not its isolation timeout \
             ({ISOLATION_TIMEOUT:?})"
        );
    }
    Ok(fenced_within)
}
