//! Two replicas: one leader writes, and a leader change mid-failover repeats nothing.

use super::*;

/// Two replicas: never two leaders at once, and one leads in the end.
pub(super) fn one_leader(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let cluster = shared.get()?;
    let replicas = ops.get(cluster)?;
    // Run after the parallel scenarios, which failed nodes over without a leader change: every
    // write of theirs went through the one leader, and the other replica, which planned the
    // same intents, sent none.
    let writes = |r: &Replica| -> anyhow::Result<(f64, f64)> {
        let text = scrape(r)?;
        Ok((
            metric_sum(&text, "podha_action_request_duration_seconds_count"),
            metric_sum(&text, "podha_intents_dropped_total"),
        ))
    };
    let leader = match leaders(replicas).as_slice() {
        [one] => one.to_string(),
        other => return Err(format!("expected exactly one leader, found {other:?}").into()),
    };
    for r in replicas {
        let (sent, dropped) = writes(r).map_err(|e| e.to_string())?;
        eprintln!(
            "[one-leader] {}: {sent} action requests, {dropped} intents dropped",
            r.identity
        );
        if r.identity == leader && sent < 1.0 {
            return Err(format!("the leader {leader} sent no action at all").into());
        }
        if r.identity != leader && (sent > 0.0 || dropped < 1.0) {
            return Err(format!(
                "standby {} sent {sent} action requests and dropped {dropped} intents: \
                 want none sent, some dropped",
                r.identity
            )
            .into());
        }
    }
    Ok(())
}

/// The sum of every sample of `name` (all label values).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric_name = series.split_once('{').map_or(series, |(n, _)| n);
            (metric_name == name)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .fold(0.0, |sum, v| sum + v)
}

/// The leader stops right after it acted on a dead node; the other replica takes over and
/// finishes the failover without doing anything twice.
pub(super) fn leader_change(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-13", "node-14"];
    scenario(shared, ops, "handover", |ctx, ops, replicas| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, pv) =
            policy_and_db(&ctx, &pair, json!({"action": "OutOfServiceTaint"})).await?;
        let target = other(&pair, &node);
        ctx.cluster.kill_node(&node)?;
        wait_for("podha's out-of-service taint", secs_(60), || async {
            Ok(has_podha_taint(&ctx, &node).await?.then_some(()))
        })
        .await?;
        let old = ops_leader(replicas).await?;
        ops.stop_replica(old).await?;
        log(
            &ns,
            format!("stopped the leader {} right after the taint", old.identity),
        );
        wait_for("the other replica to lead", secs_(20), || async {
            Ok(leaders(replicas)
                .iter()
                .any(|l| *l != old.identity)
                .then_some(()))
        })
        .await?;
        wait_for("db-0 force-deleted", secs_(30), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        // One taint and at most one delete in all, whichever replica sent them: the new leader
        // repeated nothing the old one did, and left nothing undone. Counted in the API
        // server's audit log: the stopped replica's Events may never have been sent. The delete
        // may be Kubernetes' own: with the out-of-service taint on, the taint-eviction
        // controller marks the pod for deletion and pod GC (every 20 s) removes it, sometimes
        // before the new leader has judged the node itself.
        let podha_deleted = deleted_at_most_once(&ctx, "db-0")?;
        log(
            &ns,
            format!(
                "old db-0 deleted by {}",
                if podha_deleted {
                    "podha"
                } else {
                    "Kubernetes' pod GC"
                }
            ),
        );
        // Either way the new leader's failover is done, not left open in Acting.
        let leader = ops_leader(replicas).await?;
        wait_for(
            "the new leader's failover to be over",
            secs_(30),
            || async {
                let text = scrape(leader)?;
                let open = text
                    .lines()
                    .filter(|l| {
                        l.starts_with("podha_failovers_open{") && l.contains(r#"policy="handover""#)
                    })
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                    .sum::<f64>();
                Ok((open == 0.0).then_some(()))
            },
        )
        .await?;
        let patches = podha_requests(ctx.cluster, "patch", "nodes", None, &node)?;
        let done = patches.iter().filter(|r| r.code() == Some(200)).count();
        if done != 1 {
            let codes: Vec<Option<u16>> = patches.iter().map(|r| r.code()).collect();
            bail!("podha's patches of {node} (its taint): {codes:?}, expected one done");
        }
        ops.restart_replica(old)?;
        Ok(())
    })
}
