//! A new leader that cannot reach two of the five real nodes' agents: their agents, which the
//! last leader heard, stay up while their Lease renewals show the new leader they run, and the
//! new leader, which never heard them, counts no silence of theirs: no node reboots, and podha
//! reports both agents unreachable (docs/agent.md, "A new leader that cannot reach an agent").

use std::time::Duration;

use super::*;
use fencing::{fences_since, has_out_of_service_taint};
use paused::boot_id;

/// The standby replica's node gets both nodes' addresses dropped (the node and its pods:
/// podha's heartbeats, its agent's surveys), then the leader is deleted: the standby takes the
/// Lease at its release and leads a new term from a node that reaches three of the five agents.
/// Past the isolation timeout, the watchdog's and more: no fence, no reset, the same boots, no
/// taint; both agents said they stayed up as the new leader never heard them, and podha reports
/// both unreachable (event and gauge). The paths come back at the end.
pub(super) async fn new_leader_cut_off_from_two_agents(
    ctx: &Ctx<'_>,
    real: &[&str],
    fences_before: usize,
) -> anyhow::Result<()> {
    let pods = chart_install::wait_replicas(&ctx.client, 2, secs(60)).await?;
    let leader = chart_install::wait_leader(&ctx.client, &pods, secs(60)).await?;
    let (leading, standby): (Vec<&Pod>, Vec<&Pod>) =
        pods.iter().partition(|p| name_of(p) == leader);
    let (leading, standby) = (leading[0], standby[0]);
    let standby_node = node_of(standby).context("standby not bound")?;
    let leader_node = node_of(leading).context("leader not bound")?;
    let cut: Vec<&str> = real
        .iter()
        .copied()
        .filter(|n| *n != standby_node && *n != leader_node)
        .take(2)
        .collect();
    ensure!(
        cut.len() == 2,
        "two real nodes besides {standby_node} and {leader_node}"
    );
    let boots = boots_of(ctx, real).await?;
    let stayed_before = new_leader_stays(ctx, &cut)?;
    let unpetted_before = unpetted_stretches(ctx, &cut)?;
    let reported_before = unreachable_reports(ctx, &cut).await?;
    for node in &cut {
        ctx.cluster.unreachable_from(standby_node, node, true)?;
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), chart_install::NAMESPACE);
    pods_api.delete(&leader, &Default::default()).await?;
    let new_leader = name_of(standby).to_string();
    wait_for(
        &format!("{new_leader} to take the Lease {leader} released"),
        secs(30),
        || async {
            let holder = chart_install::lease_holder(&ctx.client).await?;
            Ok((holder.as_deref() == Some(new_leader.as_str())).then_some(()))
        },
    )
    .await?;
    let led = Instant::now();
    log(
        &ctx.ns,
        format!("{new_leader} leads from {standby_node}, which cannot reach {cut:?}"),
    );
    // podha reports an agent it has not heard for 30 s of its term.
    let reported = wait_for(
        &format!("AgentUnreachable events for {cut:?}"),
        secs(60),
        || async {
            let now = unreachable_reports(ctx, &cut).await?;
            let more = now.iter().zip(&reported_before).all(|(n, b)| n > b);
            Ok(more.then_some(()))
        },
    )
    .await;
    if let Err(e) = reported {
        // podha reports only agents of Ready nodes: was one of them reset meanwhile?
        let fences = fences_since(ctx, fences_before)?;
        let unpetted = unpetted_stretches(ctx, &cut)?;
        return Err(e.context(format!(
            "fences since the outage began: {fences:?}; the cut-off agents' watchdogs went \
             unpetted for {unpetted:?} (see their logs in nodes/<node>/pod-logs/)"
        )));
    }
    let unreachable = agents_unreachable(ctx, standby)?;
    let waited = ISOLATION_TIMEOUT + WATCHDOG_TIMEOUT + secs(10);
    tokio::time::sleep(waited.saturating_sub(led.elapsed())).await;
    let stayed = new_leader_stays(ctx, &cut)?;
    let unpetted: Vec<Vec<Duration>> = unpetted_stretches(ctx, &cut)?
        .into_iter()
        .zip(&unpetted_before)
        // A log shorter than before (the agent's pod replaced): all of it is new.
        .map(|(all, before)| {
            all.get(before.len()..)
                .map_or_else(|| all.clone(), <[_]>::to_vec)
        })
        .collect();
    for node in &cut {
        ctx.cluster.unreachable_from(standby_node, node, false)?;
    }
    let fences = fences_since(ctx, fences_before)?;
    ensure!(
        fences.is_empty(),
        "nodes fenced while a new leader could not reach {cut:?}: {fences:?}"
    );
    ensure!(
        boots_of(ctx, real).await? == boots,
        "a node booted again while a new leader could not reach {cut:?}"
    );
    for ((node, before), now) in cut.iter().zip(&stayed_before).zip(&stayed) {
        ensure!(
            now > before,
            "{node}'s agent never said it stays up as the new leader has not heard it (see its \
             log in nodes/{node}/pod-logs/)"
        );
    }
    ensure!(
        unreachable.is_some_and(|n| n >= 2.0),
        "podha_agents_unreachable on {new_leader}: {unreachable:?}, not the two cut off"
    );
    for node in real {
        ensure!(
            !has_out_of_service_taint(&ctx.nodes().get(node).await?),
            "{node} tainted out of service while a new leader could not reach {cut:?}"
        );
    }
    log(
        &ctx.ns,
        format!(
            "{new_leader} could not reach {cut:?} for {:.1?}: no fence, no reboot, both \
             reported unreachable ({unreachable:?} on the gauge); their watchdogs went \
             unpetted for {unpetted:?} of the {WATCHDOG_TIMEOUT:?} they allow before the \
             new leader's term kept them up",
            led.elapsed()
        ),
    );
    chart_install::wait_replicas(&ctx.client, 2, secs(90)).await?;
    Ok(())
}

pub(super) async fn boots_of(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<Option<String>>> {
    let mut boots = Vec::new();
    for node in nodes {
        boots.push(boot_id(&ctx.nodes().get(node).await?));
    }
    Ok(boots)
}

/// How often each of `nodes`' agents decided to stay up because a new leader never heard it.
fn new_leader_stays(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<usize>> {
    nodes
        .iter()
        .map(|n| {
            Ok(chart_install::agent_log(ctx.cluster, n)?
                .matches("the new leader has not heard it")
                .count())
        })
        .collect()
}

/// For each of `nodes`' agents, every stretch its watchdog went unpetted before the agent
/// petted it again, oldest first, from its log.
fn unpetted_stretches(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<Vec<Duration>>> {
    nodes
        .iter()
        .map(|n| {
            let log = chart_install::agent_log(ctx.cluster, n)?;
            // Text logs say `unpetted_ms=1234`, JSON logs `"unpetted_ms":1234`.
            Ok(log
                .split("unpetted_ms")
                .skip(1)
                .map(|rest| rest.trim_start_matches(['=', '"', ':']))
                .filter_map(|rest| {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok().map(Duration::from_millis)
                })
                .collect())
        })
        .collect()
}

/// How many `AgentUnreachable` reports each of `nodes` has had.
async fn unreachable_reports(ctx: &Ctx<'_>, nodes: &[&str]) -> anyhow::Result<Vec<i32>> {
    node_reports(ctx, "AgentUnreachable", nodes).await
}

/// `podha_agents_unreachable` on `pod`'s `/metrics`.
fn agents_unreachable(ctx: &Ctx<'_>, pod: &Pod) -> anyhow::Result<Option<f64>> {
    let text = chart_install::pod_metrics(ctx.cluster, pod)?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("podha_agents_unreachable "))
        .and_then(|v| v.trim().parse().ok()))
}
