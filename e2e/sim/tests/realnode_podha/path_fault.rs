//! podha's own path to three healthy real nodes fails for 60 s (the leader's node drops every
//! packet to them: a firewall, a switch between podha and a rack), while their kubelets renew
//! their Leases through the API server throughout. The policy judges on podha's own probes
//! alone (`detection.signals: [AgentHeartbeat]`, proof `AgentAcknowledged`), so all three are
//! judged dead within seconds, but their Leases keep renewing after the probes went silent:
//! podha asks no fence of them (no fence request on the Node), moves nothing, and reports each
//! (`NodeLeaseRenewing`). No policy asks for the agents' silence proof then, so podha's
//! heartbeats hold every agent (none fences on isolation; the step waits for their Leases to
//! say so before the cut): a fence of these nodes could only come from a request of podha's.
//! None is fenced, none boots again, nothing is tainted.
//!
//! Then the same cut under the policy's own proof (`Agent`, judged on the Lease beside the
//! agents' heartbeat): podha judges nothing (the Leases renew), and counts the agents' silence,
//! so they are not held: each is unheard past its isolation timeout and the watchdog's, with
//! enough peers heard for podha to prove a silence. Each renews its Lease through the API
//! server, from which podha counts its silence, and so stays up: none is fenced, none boots
//! again.

use std::time::Duration;

use super::*;
use fencing::{fences_since, has_out_of_service_taint};
use new_leader::boots_of;
use podha::contract::FENCE_REQUEST_ANNOTATION;

/// How long podha's path to the three nodes is down.
const CUT: Duration = Duration::from_secs(60);
/// How long it is down again under the agents' silence proof: past their isolation timeout
/// and the watchdog's after it, with room for a fence to be seen.
const CUT_UNDER_SILENCE_PROOF: Duration = ISOLATION_TIMEOUT
    .saturating_add(WATCHDOG_TIMEOUT)
    .saturating_add(Duration::from_secs(8));

pub(super) async fn podha_cut_off_from_three_healthy_nodes(
    ctx: &Ctx<'_>,
    real: &[&str],
    policy: &str,
    fences_before: usize,
) -> anyhow::Result<()> {
    let pods = chart_install::wait_replicas(&ctx.client, 2, secs(90)).await?;
    let leader = chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
    let leader_pod = pods
        .iter()
        .find(|p| name_of(p) == leader)
        .context("the leader's pod")?;
    let leader_node = node_of(leader_pod).context("leader not bound")?;
    let standby_node = pods
        .iter()
        .find(|p| name_of(p) != leader)
        .and_then(|p| node_of(p))
        .context("the standby's node")?;
    let cut: Vec<&str> = real
        .iter()
        .copied()
        .filter(|n| *n != leader_node && *n != standby_node)
        .collect();
    ensure!(
        cut.len() == 3,
        "three real nodes besides {leader_node} and {standby_node}, got {cut:?}"
    );
    judge_on_probes_alone(ctx, policy, true).await?;
    let outcome = cut_off(ctx, &leader, leader_node, &cut, real, fences_before).await;
    let restored = judge_on_probes_alone(ctx, policy, false).await;
    let started = outcome?;
    restored?;
    log(
        &ctx.ns,
        format!(
            "podha's path to {cut:?} down for {CUT:?} (from {:.1?} ago): judged dead on probes \
             alone, held while their Leases renewed (NodeLeaseRenewing each), no fence asked, \
             no reboot, no taint",
            started.elapsed()
        ),
    );
    cut_off_under_silence_proof(ctx, leader_node, &cut, real, fences_before).await
}

/// The second cut: the agents counted (not held), unheard past their isolation timeout,
/// renewing their Leases. None fences its node.
async fn cut_off_under_silence_proof(
    ctx: &Ctx<'_>,
    leader_node: &str,
    cut: &[&str],
    real: &[&str],
    fences_before: usize,
) -> anyhow::Result<()> {
    wait_for(
        "the cut-off nodes' agents to be let go of (podha counts their silence)",
        secs(60),
        || async {
            for node in cut {
                if !paused::lease_counts_silence(ctx, node).await? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let boots = boots_of(ctx, real).await?;
    let (severed, severing) = sever(ctx, leader_node, cut);
    if severing.is_ok() {
        tokio::time::sleep(CUT_UNDER_SILENCE_PROOF).await;
    }
    mend(ctx, leader_node, &severed)?;
    severing?;
    let fences = fences_since(ctx, fences_before)?;
    ensure!(
        fences.is_empty(),
        "agents fenced their nodes while only podha's path to {cut:?} was down and their Leases \
         renewed: {fences:?}"
    );
    ensure!(
        boots_of(ctx, real).await? == boots,
        "a node booted again while only podha's path to {cut:?} was down"
    );
    log(
        &ctx.ns,
        format!(
            "podha's path to {cut:?} down again for {CUT_UNDER_SILENCE_PROOF:?} under the \
             agents' silence proof: their agents renewed their Leases and stayed up, no fence, \
             no reboot"
        ),
    );
    Ok(())
}

/// The cut itself, from `leader_node` to `cut`, and what must (not) happen meanwhile; the paths
/// come back whatever happens. Returns when the cut began.
async fn cut_off(
    ctx: &Ctx<'_>,
    leader: &str,
    leader_node: &str,
    cut: &[&str],
    real: &[&str],
    fences_before: usize,
) -> anyhow::Result<Instant> {
    // podha holds the agents now (no policy counts their silence): each says so on its Lease.
    wait_for(
        "the cut-off nodes' agents to take podha's hold",
        secs(60),
        || async {
            for node in cut {
                if paused::lease_counts_silence(ctx, node).await? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let boots = boots_of(ctx, real).await?;
    let held_before = lease_renewing_reports(ctx, cut).await?;
    let (severed, severing) = sever(ctx, leader_node, cut);
    let started = Instant::now();
    log(
        &ctx.ns,
        format!("{leader} on {leader_node} cut off from {cut:?} for {CUT:?}"),
    );
    let reported = match severing {
        Ok(()) => {
            let reported = wait_for(
                &format!("NodeLeaseRenewing events for {cut:?}"),
                CUT,
                || async {
                    let now = lease_renewing_reports(ctx, cut).await?;
                    Ok(now
                        .iter()
                        .zip(&held_before)
                        .all(|(n, b)| n > b)
                        .then_some(()))
                },
            )
            .await;
            tokio::time::sleep(CUT.saturating_sub(started.elapsed())).await;
            reported
        }
        Err(e) => Err(e),
    };
    mend(ctx, leader_node, &severed)?;
    reported?;
    // A watchdog let run near the end would fire within its timeout.
    tokio::time::sleep(WATCHDOG_TIMEOUT + secs(2)).await;
    let fences = fences_since(ctx, fences_before)?;
    ensure!(
        fences.is_empty(),
        "nodes fenced while podha's path to {cut:?} was down: {fences:?}"
    );
    ensure!(
        boots_of(ctx, real).await? == boots,
        "a node booted again while podha's path to {cut:?} was down"
    );
    for node in cut {
        let obj = ctx.nodes().get(node).await?;
        ensure!(
            !has_out_of_service_taint(&obj),
            "{node} tainted out of service while podha's path to it was down"
        );
        let request = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FENCE_REQUEST_ANNOTATION));
        ensure!(
            request.is_none(),
            "podha asked {node} for a fence while its kubelet renewed: {request:?}"
        );
    }
    Ok(started)
}

/// Has `policy` judge on podha's own probes alone, proven only by an acknowledged fence
/// (`judge`), or back on the Lease beside them with the agent's proof. A merge patch: the rest
/// of the policy stays.
async fn judge_on_probes_alone(ctx: &Ctx<'_>, policy: &str, judge: bool) -> anyhow::Result<()> {
    let (signals, proof) = if judge {
        (json!(["AgentHeartbeat"]), "AgentAcknowledged")
    } else {
        (json!(["Lease", "AgentHeartbeat"]), "Agent")
    };
    policies(ctx)
        .patch(
            policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "detection": {"signals": signals},
                "fencing": {"proof": proof},
            }})),
        )
        .await
        .with_context(|| format!("patch PodHAPolicy {policy}"))?;
    wait_policy_ready(ctx, policy).await?;
    // The leader's next look at the policy.
    tokio::time::sleep(secs(2)).await;
    Ok(())
}

/// How many `NodeLeaseRenewing` reports each of `nodes` has had.
async fn lease_renewing_reports(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<i32>> {
    node_reports(ctx, "NodeLeaseRenewing", nodes).await
}

/// Drops every packet between `leader_node` and each of `cut`. Returns the nodes cut off so far
/// (to mend whatever happens) and whether all were.
fn sever<'a>(
    ctx: &Ctx<'_>,
    leader_node: &str,
    cut: &[&'a str],
) -> (Vec<&'a str>, anyhow::Result<()>) {
    let mut severed = Vec::new();
    for node in cut {
        if let Err(e) = ctx.cluster.unreachable_from(leader_node, node, true) {
            return (severed, Err(e.into()));
        }
        severed.push(*node);
    }
    (severed, Ok(()))
}

/// Lets the packets between `leader_node` and each of `severed` through again.
fn mend(ctx: &Ctx<'_>, leader_node: &str, severed: &[&str]) -> anyhow::Result<()> {
    for node in severed {
        ctx.cluster.unreachable_from(leader_node, node, false)?;
    }
    Ok(())
}
