//! The actions move pods: DeletePods and OutOfServiceTaint on a StatefulSet and a Deployment.

use super::*;

/// DeletePods: podha force-deletes the dead node's StatefulSet pod; the replacement runs on the
/// other node once the attach/detach controller's own 6-minute wait ends.
pub(super) fn sts_delete_pods(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-1", "node-2"];
    scenario(shared, ops, "sts-delete", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        // A detach timeout well below the attach/detach controller's 6 minutes: reported.
        let (pod, node, uid, pv) = policy_and_db(
            &ctx,
            &pair,
            json!({"action": "DeletePods", "detachTimeout": "30s"}),
        )
        .await?;
        let target = other(&pair, &node);
        log(&ns, format!("{} on {node}; killing it", name_of(&pod)));
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted by podha", secs_(60), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        log(
            &ns,
            format!("db-0 deleted {:.1?} after the kill", killed.elapsed()),
        );
        if has_podha_taint(&ctx, &node).await? {
            bail!("DeletePods must not taint {node} out-of-service");
        }
        let fenced = ctx
            .nodes()
            .get(&node)
            .await?
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == podha::api::FENCE_TAINT_KEY && t.effect == "NoSchedule")
            });
        if !fenced {
            bail!("DeletePods must fence {node} so the replacement is not scheduled back onto it");
        }
        wait_for(
            "the Degraded condition for the stuck detach",
            secs_(90),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let degraded = status.conditions.iter().any(|c| {
                    c.type_ == "Degraded" && c.status == "True" && c.reason == "DetachTimeout"
                });
                Ok(degraded.then_some(()))
            },
        )
        .await?;
        let leader = ops_leader(replicas).await?;
        let timeouts = metric(
            &scrape(leader)?,
            "podha_detach_timeouts_total",
            &[("policy", ns.as_str())],
        );
        if timeouts != Some(1.0) {
            bail!("podha_detach_timeouts_total is {timeouts:?}, expected 1");
        }
        wait_recovered(&ctx, "db", &pv, target, &node, STOCK_DETACH_WAIT).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the kill",
                killed.elapsed()
            ),
        );
        Ok(())
    })
}

/// OutOfServiceTaint: the taint detaches at once, the replacement runs, the failover phases
/// show in the metrics, and the taint is removed once the node is back and holds no volume.
pub(super) fn sts_taint(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = ["node-3", "node-4"];
    scenario(shared, ops, "sts-taint", |ctx, _, replicas| async move {
        let ns = ctx.ns.clone();
        let owners = json!(["StatefulSet", CUSTOM_OWNER]);
        let spec = json!({"action": "OutOfServiceTaint", "owners": owners});
        let (_, node, uid, pv) = policy_and_db(&ctx, &pair, spec).await?;
        let database = custom_owned_pod(&ctx, &node).await?;
        let target = other(&pair, &node);
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("podha's out-of-service taint", secs_(60), || async {
            Ok(has_podha_taint(&ctx, &node).await?.then_some(()))
        })
        .await?;
        wait_for("db-0 and pg-0 force-deleted", secs_(30), || async {
            let both =
                gone(&ctx, "db-0", &uid).await? && gone(&ctx, "pg-0", &database.pod_uid).await?;
            Ok(both.then_some(()))
        })
        .await?;
        // The Database's controller, played by the test: it recreates its pod on the other node.
        create_database_pod(&ctx, target, &database.uid).await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(60)).await?;
        wait_recovered(&ctx, "pg", &database.pv, target, &node, secs_(60)).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the kill",
                killed.elapsed()
            ),
        );

        let leader = ops_leader(replicas).await?;
        wait_for(
            "every failover phase in the leader's metrics",
            secs_(30),
            || async {
                let text = scrape(leader)?;
                let all = ["detect", "act", "detach", "recover", "total"]
                    .iter()
                    .all(|phase| {
                        metric(
                            &text,
                            "podha_failover_phase_duration_seconds_count",
                            &[("policy", ns.as_str()), ("phase", phase)],
                        )
                        .is_some_and(|v| v >= 1.0)
                    });
                let deleted = metric(
                    &text,
                    "podha_pods_deleted_total",
                    &[("policy", ns.as_str()), ("owner_kind", "StatefulSet")],
                );
                let custom = metric(
                    &text,
                    "podha_pods_deleted_total",
                    &[("policy", ns.as_str()), ("owner_kind", CUSTOM_OWNER)],
                );
                let tainted = metric(
                    &text,
                    "podha_taints_total",
                    &[("policy", ns.as_str()), ("operation", "add")],
                );
                // podha deletes the pod right after its taint lands: taint eviction then only
                // marks it (podha's force delete still goes through), and pod GC, which could
                // remove it first, runs every 20 s.
                let counted = deleted == Some(1.0) && custom == Some(1.0);
                Ok((all && counted && tainted == Some(1.0)).then_some(()))
            },
        )
        .await?;
        // Two replicas watch; exactly one acted, once.
        acted_once(&ctx.client, "default", "OutOfServiceTaintAdded", &node).await?;
        acted_once(&ctx.client, &ns, "PodForceDeleted", "db-0").await?;
        wait_for(
            "the recovered failover in the policy status",
            secs_(30),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                let recorded = status.recent_failovers.first().is_some_and(|f| {
                    f.node == node
                        && f.phase == podha::api::FailoverPhase::Recovered
                        && {
                            let mut pods = f.pods.clone();
                            pods.sort();
                            pods == [format!("{ns}/db-0"), format!("{ns}/pg-0")]
                        }
                        && f.acted_at.is_some()
                        && f.detached_at.is_some()
                        && f.recovered_at.is_some()
                });
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Ok((recorded && ready && status.watched_nodes == 2).then_some(()))
            },
        )
        .await?;

        ctx.cluster.start_node(&node).await?;
        wait_for(
            "podha's taint removed from the returned node",
            secs_(60),
            || async { Ok((!has_podha_taint(&ctx, &node).await?).then_some(())) },
        )
        .await?;
        let n: Node = ctx.nodes().get(&node).await?;
        if n.spec
            .and_then(|s| s.taints)
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY))
        {
            bail!("the out-of-service taint is still on {node}");
        }
        Ok(())
    })
}

/// DeletePods with a Deployment: the old pod is deleted and the replacement, stuck on the
/// Multi-Attach error until the detach, runs on the other node.
pub(super) fn deployment_delete_pods(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = ["node-5", "node-6"];
    scenario(shared, ops, "deploy", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        create_policy(
            &ctx.client,
            policy(&ns, &ns, &pair, json!({"action": "DeletePods"})),
        )
        .await?;
        ctx.create::<PersistentVolumeClaim>(pvc("web-data", podha_sim::csi::RWO_STORAGE_CLASS))
            .await?;
        ctx.create::<k8s_openapi::api::apps::v1::Deployment>(deployment(
            "web",
            &pair,
            Some("web-data"),
        ))
        .await?;
        let (pod, node, uid, pv) = running_app(&ctx, "web", "web-data").await?;
        let target = other(&pair, &node);
        let name = name_of(&pod).to_string();
        ctx.cluster.kill_node(&node)?;
        wait_for("the old web pod force-deleted", secs_(60), || async {
            Ok(gone(&ctx, &name, &uid).await?.then_some(()))
        })
        .await?;
        wait_recovered(&ctx, "web", &pv, target, &node, STOCK_DETACH_WAIT).await?;
        Ok(())
    })
}

/// The custom controller kind the taint scenario's policy lists beside `StatefulSet`.
const CUSTOM_OWNER: &str = "Database.db.example.com";

/// A `Database` custom resource `pg` and its pod.
struct Database {
    uid: String,
    pod_uid: String,
    pv: String,
}

/// A pod `pg-0` on `node`, controlled by a `Database` custom resource `pg` (no controller runs
/// for it here: the test plays it), with its own RWO claim. `podha explain` must say it is
/// protected, naming the kind it matched.
async fn custom_owned_pod(ctx: &Ctx<'_>, node: &str) -> anyhow::Result<Database> {
    let crd = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "databases.db.example.com" },
        "spec": {
            "group": "db.example.com",
            "scope": "Namespaced",
            "names": { "plural": "databases", "singular": "database", "kind": "Database" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                }},
            }],
        },
    }))?;
    podha_sim::failover::create_crd(&ctx.client, &crd).await?;
    let gvk = kube::core::GroupVersionKind::gvk("db.example.com", "v1", "Database");
    let databases: Api<kube::core::DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &ctx.ns,
        &kube::core::ApiResource::from_gvk(&gvk),
    );
    let database = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1",
        "kind": "Database",
        "metadata": { "name": "pg" },
    }))?;
    let database = databases
        .create(&PostParams::default(), &database)
        .await
        .context("creating the Database pg")?;
    let uid = database.metadata.uid.unwrap_or_default();
    ctx.create::<PersistentVolumeClaim>(pvc("data-pg-0", podha_sim::csi::RWO_STORAGE_CLASS))
        .await?;
    create_database_pod(ctx, node, &uid).await?;
    let (pod, _, pod_uid, pv) = running_app(ctx, "pg", "data-pg-0").await?;
    let (protected, answer) = explain_answer(ctx, "pg-0")?;
    let owner = explained_rule(&answer, "owner");
    let said = owner.and_then(|c| c["detail"].as_str()).unwrap_or_default();
    if !protected || !said.starts_with(&format!("{CUSTOM_OWNER} pg")) {
        bail!("podha explain pod pg-0: want protected, owner {CUSTOM_OWNER} pg; got {answer}");
    }
    log(
        &ctx.ns,
        format!("podha explain: {}: owner: {said}", name_of(&pod)),
    );
    Ok(Database { uid, pod_uid, pv })
}

/// The Database `pg`'s pod `pg-0` on `node`, mounting `data-pg-0`.
async fn create_database_pod(ctx: &Ctx<'_>, node: &str, owner_uid: &str) -> anyhow::Result<()> {
    ctx.create::<Pod>(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pg-0",
            "labels": { "app": "pg" },
            "ownerReferences": [{
                "apiVersion": "db.example.com/v1", "kind": "Database", "name": "pg",
                "uid": owner_uid, "controller": true,
            }],
        },
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "app", "image": "registry.invalid/podha/app:1",
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
            }],
            "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "data-pg-0" } }],
        },
    }))
    .await?;
    Ok(())
}
