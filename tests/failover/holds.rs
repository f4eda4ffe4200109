//! What podha must not do: pods that must stay, a node back in time, too many unhealthy
//! nodes, its own view cut off from the API server, a dry run.

use kube::api::{Patch, PatchParams};

use super::*;

/// On one dead node: a bare pod with a claim, a pod of a driver the policy does not select, a
/// pod opted out by annotation, a pod that can only run on the dead node and a pod tolerating
/// every taint. `podha explain` says so of each before the death; none is deleted, and each
/// reason shows in the metrics.
pub(super) fn untouched_pods(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let dead = "node-7";
    scenario(shared, ops, "untouched", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        create_policy(
            &ctx.client,
            policy(
                &ns,
                &ns,
                &["node-7", "node-8"],
                json!({"action": "OutOfServiceTaint"}),
            ),
        )
        .await?;
        let pinned = [dead];
        // node-8 cordoned while the pods start, so that those that may also run there (the
        // mover, the tolerant one) start on the node that dies; uncordoned before the death, so
        // that they have somewhere to go.
        let cordon = |on: bool| {
            let nodes = ctx.nodes();
            async move {
                let patch = json!({"spec": {"unschedulable": on}});
                nodes
                    .patch("node-8", &PatchParams::default(), &Patch::Merge(patch))
                    .await
            }
        };
        cordon(true).await?;
        // A bare pod: no controller would recreate it.
        ctx.create::<PersistentVolumeClaim>(pvc("bare-data", podha_sim::csi::RWO_STORAGE_CLASS))
            .await?;
        let mut bare = deployment("bare", &pinned, Some("bare-data"))["spec"]["template"].clone();
        bare["apiVersion"] = json!("v1");
        bare["kind"] = json!("Pod");
        bare["metadata"]["name"] = json!("bare");
        ctx.create::<Pod>(bare).await?;
        // A StatefulSet on the other driver.
        let mut other_driver = statefulset("otherdrv", &pinned);
        other_driver["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] =
            json!(podha_sim::csi::OTHER_STORAGE_CLASS);
        ctx.create::<StatefulSet>(other_driver).await?;
        // Opted out.
        let mut opted_out = statefulset("optout", &["node-7", "node-8"]);
        opted_out["spec"]["template"]["metadata"]["annotations"] =
            json!({"podha.io/failover": "false"});
        opted_out["spec"]["template"]["spec"]["affinity"] =
            statefulset("x", &pinned)["spec"]["template"]["spec"]["affinity"].clone();
        ctx.create::<StatefulSet>(opted_out).await?;
        // Only the dead node fits.
        ctx.create::<StatefulSet>(statefulset("pinned", &pinned))
            .await?;
        // Tolerates the out-of-service taint: its replacement could be scheduled back onto the
        // dead node. It could run on node-8 (so the target check passes) and prefers the node
        // that dies (not the cordoned node-8, whose taint it does not tolerate).
        let mut tolerant = statefulset("tolerant", &["node-7", "node-8"]);
        tolerant["spec"]["template"]["spec"]["tolerations"] = json!([{
            "key": podha::api::OUT_OF_SERVICE_TAINT_KEY,
            "operator": "Exists",
            "effect": "NoExecute",
        }]);
        tolerant["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{
            "weight": 100,
            "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [dead]}
            ]}
        }]);
        ctx.create::<StatefulSet>(tolerant).await?;
        // One pod podha may move (it may run on either node, and prefers the one that dies):
        // its failover would taint the node out-of-service, which would remove the others.
        let mut mover = statefulset("mover", &["node-7", "node-8"]);
        mover["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{
            "weight": 100,
            "preference": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [dead]}
            ]}
        }]);
        ctx.create::<StatefulSet>(mover).await?;

        let mut uids = Vec::new();
        for (app, pod) in [
            ("bare", "bare"),
            ("otherdrv", "otherdrv-0"),
            ("optout", "optout-0"),
            ("pinned", "pinned-0"),
            ("tolerant", "tolerant-0"),
            ("mover", "mover-0"),
        ] {
            let p = wait_for(&format!("{pod} running on {dead}"), secs_(120), || async {
                Ok(ctx
                    .pods()
                    .get_opt(pod)
                    .await?
                    .filter(|p| running_ready(p) && node_of(p) == Some(dead)))
            })
            .await
            .with_context(|| format!("app {app}"))?;
            uids.push((pod, p.metadata.uid.clone().unwrap_or_default()));
        }
        cordon(false).await?;
        let (mover_uid, kept) = match uids.split_last() {
            Some(((_, uid), kept)) => (uid.clone(), kept.to_vec()),
            None => bail!("no pods"),
        };
        // Asked before the death, `podha explain` says which will move and why the others
        // will not; the death then confirms each verdict.
        for (pod, rule, word) in [
            ("bare", "owner", "NoControllerOwner"),
            ("otherdrv-0", "volumes", "DriverNotSelected"),
            ("optout-0", "owner", "OptedOut"),
            ("pinned-0", "target", "NoTargetNode"),
            ("tolerant-0", "tolerations", "ToleratesFence"),
        ] {
            explained_unprotected(&ctx, pod, rule, word)?;
        }
        // Protected, on the slow path: the pods that must stay would have the taint refused.
        let (protected, answer) = explain_answer(&ctx, "mover-0")?;
        let taint = explained_rule(&answer, "taint");
        if !protected || taint.is_none_or(|c| c["outcome"] != "slow") {
            bail!("podha explain: mover-0 should be protected on the slow path, got {answer}");
        }
        // The policy's status counts the same verdicts, by the same rules.
        let want = [
            "DriverNotSelected",
            "NoControllerOwner",
            "NoTargetNode",
            "OptedOut",
            "ToleratesFence",
        ];
        wait_for(
            "the status counts 1 pod protected (on the slow path), 5 not",
            secs_(60),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let reasons: Vec<(&str, i32)> = status
                    .unprotected_reasons
                    .iter()
                    .map(|r| (r.reason.as_str(), r.pods))
                    .collect();
                let counts = (
                    status.protected_pods,
                    status.slow_detach_pods,
                    status.unprotected_pods,
                );
                let counted = counts == (1, 1, 5) && reasons == want.map(|r| (r, 1));
                if !counted {
                    log(
                        &ns,
                        format!(
                            "status: {} protected ({} slowly), {} not: {reasons:?}",
                            status.protected_pods, status.slow_detach_pods, status.unprotected_pods
                        ),
                    );
                }
                Ok(counted.then_some(()))
            },
        )
        .await?;
        ctx.cluster.kill_node(dead)?;
        let leader = ops_leader(replicas).await?;
        wait_for("every skip reason in the metrics", secs_(90), || async {
            let text = scrape(leader)?;
            let all = [
                "NoControllerOwner",
                "DriverNotSelected",
                "OptedOut",
                "NoTargetNode",
                "ToleratesFence",
            ]
            .iter()
            .all(|reason| {
                metric(
                    &text,
                    "podha_pods_skipped_total",
                    &[("policy", ns.as_str()), ("reason", reason)],
                )
                .is_some_and(|v| v >= 1.0)
            });
            Ok(all.then_some(()))
        })
        .await?;
        // The eligible pod is deleted under the scheduling fence; the out-of-service taint,
        // which would remove every other pod there, is refused and the refusal reported.
        wait_for("mover-0 force-deleted", secs_(60), || async {
            Ok(gone(&ctx, "mover-0", &mover_uid).await?.then_some(()))
        })
        .await?;
        deleted_once(&ctx, "mover-0").await?;
        let n: Node = ctx.nodes().get(dead).await?;
        let taints: Vec<String> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        if taints.iter().any(|k| k == OUT_OF_SERVICE_TAINT_KEY) {
            bail!("{dead} was tainted out-of-service with pods on it that must stay: {taints:?}");
        }
        if !taints.iter().any(|k| k == podha::api::FENCE_TAINT_KEY) {
            bail!("{dead} was not fenced: {taints:?}");
        }
        let text = scrape(leader)?;
        let refused = metric(
            &text,
            "podha_actions_held_total",
            &[
                ("policy", ns.as_str()),
                ("reason", "OutOfServiceTaintRefused"),
            ],
        );
        if !refused.is_some_and(|v| v >= 1.0) {
            bail!("the refused out-of-service taint was not reported: {refused:?}");
        }
        acted_once(&ctx.client, "default", "OutOfServiceTaintRefused", dead).await?;
        holds_for("every other pod keeps its object", secs_(20), || async {
            for (pod, uid) in &kept {
                if gone(&ctx, pod, uid).await? {
                    return Ok(Err(format!("{pod} was deleted")));
                }
            }
            Ok(Ok(()))
        })
        .await?;
        let text = scrape(leader)?;
        let deleted = metric(
            &text,
            "podha_pods_deleted_total",
            &[("policy", ns.as_str()), ("owner_kind", "StatefulSet")],
        );
        if deleted != Some(1.0) {
            bail!("podha counted {deleted:?} deletions for this policy, want the mover's one");
        }
        Ok(())
    })
}

/// A node dead long enough for podha to count failed probes, and back before
/// `failureThreshold` of them: it is Suspect for a while, then Healthy, and nothing happens.
pub(super) fn flapping_node(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-9", "node-10"];
    scenario(shared, ops, "flap", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        // 8 failed probes 1 s apart: room to bring the node back once podha suspects it.
        let spec = json!({
            "action": "OutOfServiceTaint",
            "detection": {"interval": "1s", "failureThreshold": 8, "signals": ["Lease", "KubeletTCP"],
                          "leaseGracePeriod": "12s", "tcpTimeout": "500ms"},
        });
        let (_, node, uid, _) = policy_and_db(&ctx, &pair, spec).await?;
        ctx.cluster.kill_node(&node)?;
        let killed = Instant::now();
        wait_for("podha to suspect the killed node", secs_(40), || async {
            let status = policy_status(&ctx.client, &ns).await?;
            Ok((status.suspect_nodes == 1).then_some(()))
        })
        .await?;
        log(
            &ns,
            format!("{node} suspect {:.1?} after the kill", killed.elapsed()),
        );
        ctx.cluster.start_node(&node).await?;
        wait_for("podha to see the node healthy again", secs_(30), || async {
            let status = policy_status(&ctx.client, &ns).await?;
            Ok((status.suspect_nodes == 0 && status.failed_nodes == 0).then_some(()))
        })
        .await?;
        untouched_for(&ctx, &uid, &node, secs_(15), "").await?;
        let text = scrape(ops_leader(replicas).await?)?;
        if metric(
            &text,
            "podha_node_failures_total",
            &[("policy", ns.as_str())],
        )
        .is_some_and(|v| v > 0.0)
        {
            bail!("podha judged the flapping node dead");
        }
        Ok(())
    })
}

/// More nodes dead than `safety.maxUnhealthy` allows: podha holds every action of the policy,
/// says so (metric, Degraded condition) and deletes and taints nothing.
pub(super) fn too_many_unhealthy(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-15", "node-16"];
    scenario(
        shared,
        ops,
        "max-unhealthy",
        |ctx, _, replicas| async move {
            let ns = ctx.ns.clone();
            let (_, node, uid, _) = policy_and_db(
                &ctx,
                &pair,
                json!({"action": "OutOfServiceTaint", "safety": {"maxUnhealthy": 1}}),
            )
            .await?;
            // Both nodes cut off at once, the db's first: its grace runs out before the empty
            // node's may, and the empty node is not yet Suspect when the db's node is judged
            // dead. podha must wait until it has heard from the empty node (it never does),
            // and hold once both are unhealthy.
            ctx.cluster.kill_node(&node)?;
            ctx.cluster.kill_node(other(&pair, &node))?;
            wait_for("both nodes judged dead", secs_(60), || async {
                let status = policy_status(&ctx.client, &ns).await?;
                Ok((status.failed_nodes == 2).then_some(()))
            })
            .await?;
            untouched_for(&ctx, &uid, &node, secs_(15), " while held").await?;
            let text = scrape(ops_leader(replicas).await?)?;
            let held = metric(
                &text,
                "podha_actions_held_total",
                &[("policy", ns.as_str()), ("reason", "TooManyUnhealthyNodes")],
            );
            if !held.is_some_and(|v| v > 0.0) {
                bail!("no TooManyUnhealthyNodes hold in the metrics: {held:?}");
            }
            let status = wait_for("the Degraded condition", secs_(15), || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let degraded = status.conditions.iter().any(|c| {
                    c.type_ == "Degraded"
                        && c.status == "True"
                        && c.reason == "TooManyUnhealthyNodes"
                });
                Ok(degraded.then_some(status))
            })
            .await?;
            log(&ns, format!("held; status {:?}", status.conditions));
            for dead in pair {
                ctx.cluster.start_node(dead).await?;
            }
            Ok(())
        },
    )
}

/// The API server goes away for podha alone (its connections closed and refused for 20 s,
/// longer than the policy's lease grace plus its probes) while the nodes keep renewing their
/// Leases. podha must take the silence for a gap in its own view: no node judged dead, nothing
/// deleted or tainted, during the cut or after it. And it must not stay blind: a node killed
/// afterwards is failed over.
pub(super) fn api_server_blip(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-9", "node-10"];
    scenario(shared, ops, "blip", |ctx, ops, replicas| async move {
        let ns = ctx.ns.clone();
        // Lease alone: the one signal a frozen view turns dead (the last Ready seen stays
        // True). maxUnhealthy 100 %, so that a hold cannot hide a misjudgement.
        let (_, node, uid, pv) = policy_and_db(
            &ctx,
            &pair,
            json!({
                "detection": {
                    "signals": ["Lease"],
                    "interval": "1s",
                    "failureThreshold": 3,
                    "leaseGracePeriod": "12s",
                    "tcpTimeout": "500ms",
                },
                "safety": {"maxUnhealthy": "100%"},
                "action": "OutOfServiceTaint",
            }),
        )
        .await?;
        let relay = ops.relay()?;
        relay.cut();
        log(&ns, "podha cut off the API server");
        let cut_off = wait_for("no replica leading while cut off", secs_(15), || async {
            Ok(leaders(replicas).is_empty().then_some(()))
        })
        .await;
        tokio::time::sleep(secs_(20)).await;
        relay.restore();
        log(&ns, "podha reconnected");
        cut_off?;
        let restored = Instant::now();
        ops_leader(replicas).await?;
        log(
            &ns,
            format!("a leader again {:.1?} after", restored.elapsed()),
        );
        // Past the lease grace and the probes again, counted from the reconnection.
        untouched_for(&ctx, &uid, &node, secs_(20), " after an API server blip").await?;
        for r in replicas {
            let failures = metric(
                &scrape(r)?,
                "podha_node_failures_total",
                &[("policy", ns.as_str())],
            );
            if failures.is_some_and(|v| v > 0.0) {
                bail!("{} judged a node dead during the blip", r.identity);
            }
        }
        // Still watching: a real death is failed over.
        let target = other(&pair, &node);
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted", secs_(60), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        log(
            &ns,
            format!("recovered {:.1?} after a kill", killed.elapsed()),
        );
        ctx.cluster.start_node(&node).await?;
        Ok(())
    })
}

/// dryRun: the pod keeps its object; the policy's events say what podha would have done.
pub(super) fn dry_run(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-11", "node-12"];
    scenario(shared, ops, "dry-run", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, _) = policy_and_db(
            &ctx,
            &pair,
            json!({"action": "OutOfServiceTaint", "dryRun": true}),
        )
        .await?;
        ctx.cluster.kill_node(&node)?;
        let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), "default");
        let note = wait_for(
            "a DryRun event on the policy naming the pod",
            secs_(90),
            || async {
                let list = events.list(&ListParams::default()).await?;
                Ok(list.items.into_iter().find_map(|e| {
                    let about_policy =
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(ns.as_str());
                    let note = e.note.unwrap_or_default();
                    (about_policy
                        && e.reason.as_deref() == Some("DryRun")
                        && note.contains(&format!("{ns}/db-0")))
                    .then_some(note)
                }))
            },
        )
        .await?;
        log(&ns, format!("event: {note}"));
        untouched_for(&ctx, &uid, &node, secs_(20), " in a dry run").await?;
        let text = scrape(ops_leader(replicas).await?)?;
        let held = metric(
            &text,
            "podha_actions_held_total",
            &[("policy", ns.as_str()), ("reason", "DryRun")],
        )
        .unwrap_or(0.0);
        if held < 1.0 {
            bail!("no DryRun hold counted");
        }
        // Each hold (the node's fence request or taint, the pod's mark or deletion) says what
        // it would have done in its own event: none is folded into another's.
        let notes = wait_for(
            &format!("{held} DryRun events with distinct notes on the policy"),
            secs_(30),
            || async {
                let list = events.list(&ListParams::default()).await?;
                let notes: std::collections::BTreeSet<String> = list
                    .items
                    .into_iter()
                    .filter(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(ns.as_str())
                            && e.reason.as_deref() == Some("DryRun")
                    })
                    .filter_map(|e| e.note)
                    .collect();
                Ok((notes.len() as f64 >= held).then_some(notes))
            },
        )
        .await?;
        log(&ns, format!("{} DryRun events: {notes:?}", notes.len()));
        Ok(())
    })
}
