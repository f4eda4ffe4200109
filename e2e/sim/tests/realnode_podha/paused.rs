//! A real node paused for maintenance and cut off from everything: podha's heartbeat told its
//! agent that podha holds the node, so the agent fences nothing on isolation and its watchdog
//! is disarmed, also after the agent crashed and was replaced (docs/agent.md, "Fences nothing
//! on isolation while podha holds its node", "Arms its watchdog only while podha may count its
//! silence").

use kube::ResourceExt as _;

use super::*;
use fencing::{fences_since, has_out_of_service_taint};

/// Real node `node` paused for maintenance (`podha.io/paused`) and cut off from everything
/// for its agent's isolation timeout, its watchdog's and more: podha holds the node, and told
/// its agent so before the cut, so the agent disarms its watchdog and stays up; its agent
/// crashes before the cut, and the one its supervisor starts goes on held from the hearing
/// file, its watchdog disarmed. That agent is frozen for the first part of the cut (a watchdog
/// still armed would reset the node), then runs on unheard past its isolation timeout (an
/// agent not held would fence): no fence, no reset, the same boot. (The isolated node of
/// `frozen_and_cut_off_nodes`, not paused, is fenced by the same fault.) Back and no longer
/// paused, its agent arms its watchdog and counts its silence again.
pub(super) async fn paused_node_cut_off(
    ctx: &Ctx<'_>,
    node: &str,
    fences_before: usize,
) -> anyhow::Result<()> {
    let boot = boot_id(&ctx.nodes().get(node).await?);
    let (disarmed_before, armed_before) = (said(ctx, node, DISARMED)?, said(ctx, node, ARMED)?);
    set_paused(ctx, node, true).await?;
    wait_for(
        &format!("{node}'s agent to take its node as held (its Lease no longer says it counts its silence) and disarm its watchdog"),
        secs(30),
        || async {
            let disarmed = said(ctx, node, DISARMED)? > disarmed_before;
            Ok((disarmed && !lease_counts_silence(ctx, node).await?).then_some(()))
        },
    )
    .await?;
    let (resumed_before, disarmed) = (said(ctx, node, RESUMED_HELD)?, said(ctx, node, DISARMED)?);
    let crashed = chart_install::crash_agent(ctx.cluster, node)?;
    wait_for(
        &format!("{node}'s agent supervisor to replace its crashed agent (pid {crashed}) with one going on held, its watchdog disarmed"),
        secs(10),
        || async {
            let resumed = said(ctx, node, RESUMED_HELD)? > resumed_before;
            Ok((resumed && said(ctx, node, DISARMED)? > disarmed).then_some(())) },
    )
    .await?;
    // Frozen, the agent pets nothing: only a watchdog really disarmed leaves the node up. Thawed
    // while still cut off, unheard past its isolation timeout: only the hold keeps it from
    // fencing.
    ctx.cluster.isolate_node(node, true)?;
    let frozen = chart_install::freeze_agent(ctx.cluster, node, true)?;
    let frozen_for = WATCHDOG_TIMEOUT + secs(4);
    let cut_for = ISOLATION_TIMEOUT + WATCHDOG_TIMEOUT + secs(8);
    log(
        &ctx.ns,
        format!(
            "{node} paused and cut off from everything for {cut_for:?}, its agent (pid {frozen}) \
             frozen for the first {frozen_for:?}"
        ),
    );
    tokio::time::sleep(frozen_for).await;
    chart_install::freeze_agent(ctx.cluster, node, false)?;
    tokio::time::sleep(cut_for - frozen_for).await;
    ctx.cluster.isolate_node(node, false)?;
    let fences = fences_since(ctx, fences_before)?;
    ensure!(
        fences.iter().all(|f| f.node != node),
        "the paused {node} was fenced while cut off: {fences:?}"
    );
    ctx.wait_ready(node, secs(90)).await?;
    let node_now = ctx.nodes().get(node).await?;
    ensure!(
        boot_id(&node_now) == boot,
        "the paused {node} booted again ({boot:?} → {:?})",
        boot_id(&node_now)
    );
    ensure!(
        !has_out_of_service_taint(&node_now),
        "the paused {node} was tainted out of service"
    );
    ensure!(
        said(ctx, node, ARMED)? == armed_before,
        "the paused {node}'s agent armed its watchdog (see its log in nodes/{node}/pod-logs/)"
    );
    set_paused(ctx, node, false).await?;
    wait_for(
        &format!("{node}'s agent to arm its watchdog and count its silence again, no longer held"),
        secs(30),
        || async {
            let armed = said(ctx, node, ARMED)? > armed_before;
            Ok((armed && lease_counts_silence(ctx, node).await?).then_some(()))
        },
    )
    .await?;
    log(
        &ctx.ns,
        format!(
            "{node}: paused, its watchdog disarmed, its agent crashed and replaced held, cut \
             off: not fenced nor reset; unpaused, its agent armed again"
        ),
    );
    Ok(())
}

/// What the agent logs as it disarms its watchdog, as it arms it, and as it starts held.
const DISARMED: &str = "watchdog disarmed: podha holds this node";
const ARMED: &str = "watchdog armed: podha hears this node";
const RESUMED_HELD: &str = "podha holds this node, and its watchdog is disarmed";

/// How often real node `node`'s agents logged `what`.
fn said(ctx: &Ctx<'_>, node: &str, what: &str) -> anyhow::Result<usize> {
    Ok(chart_install::agent_log(ctx.cluster, node)?
        .matches(what)
        .count())
}

pub(super) fn boot_id(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    Some(node.status.as_ref()?.node_info.as_ref()?.boot_id.clone())
}

/// Puts `podha.io/paused` on real node `node`, or takes it off.
async fn set_paused(ctx: &Ctx<'_>, node: &str, paused: bool) -> anyhow::Result<()> {
    let value = if paused { json!("true") } else { json!(null) };
    let patch = json!({ "metadata": { "annotations": { podha::api::PAUSE_ANNOTATION: value } } });
    ctx.nodes()
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotate {node}"))?;
    Ok(())
}

/// Whether real node `node`'s agent Lease says podha heard it in this boot, which it says only
/// while podha does not hold the node.
pub(super) async fn lease_counts_silence(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<bool> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
    let lease = leases.get(&podha::contract::agent_lease_name(node)).await?;
    Ok(lease
        .annotations()
        .contains_key(podha::contract::AGENT_HEARD_IN_BOOT_ANNOTATION))
}
