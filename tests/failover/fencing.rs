//! Fencing proofs a user's cluster supplies: a node that stops heartbeating is held,
//! not tainted, until
//! - `CloudShutdownTaint`: the cloud provider says the instance is shut down (what a cloud's
//!   node lifecycle controller does is done here by the test: it adds the
//!   `node.cloudprovider.kubernetes.io/shutdown` taint to the dead node);
//! - `External`: the user's fence controller acknowledges podha's fence request on the Node
//!   (the test plays the controller: it reads `podha.io/fence-request` and writes
//!   `podha.io/fence-ack`);
//!
//! then the failover follows at once.

use std::time::Instant;

use k8s_openapi::api::core::v1::Taint;
use kube::Api;
use kube::api::{Patch, PatchParams};
use podha::api::{CLOUD_SHUTDOWN_TAINT_KEY, PodHAPolicy};
use podha::contract::{FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION};
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, acted_once, has_podha_taint, log, other, policy_and_db,
    running_app, scenario, secs_, untouched_for, wait_recovered,
};
use podha_sim::testkit::*;

pub fn held_until_the_cloud_reports_the_node_shut_down(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = ["node-21", "node-22"];
    scenario(shared, ops, "fenced", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        // The pair's nodes die one after the other: without `unhealthyWindow: 0s` the first,
        // back by then, still counts as recently failed and the second death is held
        // (TooManyUnhealthyNodes), as a user would set a two-node policy.
        let spec = json!({
            "fencing": {"proof": "CloudShutdownTaint"},
            "safety": {"unhealthyWindow": "0s"},
        });
        let (_, node, uid, pv) = policy_and_db(&ctx, &pair, spec).await?;
        let target = other(&pair, &node);
        ctx.cluster.kill_node(&node)?;
        // Judged dead, and held for want of the proof: said once, and nothing done.
        acted_once(&ctx.client, "default", "FencingPending", &node).await?;
        untouched_for(&ctx, &uid, &node, secs_(10), " without the shutdown proof").await?;
        log(&ns, format!("{node} held: FencingPending, untouched"));

        let proven = Instant::now();
        ctx.add_taint(
            &node,
            Taint {
                key: CLOUD_SHUTDOWN_TAINT_KEY.to_string(),
                effect: "NoSchedule".to_string(),
                ..Taint::default()
            },
        )
        .await?;
        wait_for(
            "the out-of-service taint after the proof",
            secs_(30),
            || async { Ok(has_podha_taint(&ctx, &node).await?.then_some(())) },
        )
        .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the proof",
                proven.elapsed()
            ),
        );

        // The node comes back (the cloud lifts its taint); the policy now wants an external
        // fence, and db-0's new node dies.
        ctx.remove_taint(&node, CLOUD_SHUTDOWN_TAINT_KEY).await?;
        ctx.cluster.start_node(&node).await?;
        wait_for(
            &format!("podha to take its taint off {node}"),
            secs_(60),
            || async { Ok((!has_podha_taint(&ctx, &node).await?).then_some(())) },
        )
        .await?;
        let policies: Api<PodHAPolicy> = Api::all(ctx.client.clone());
        policies
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"fencing": {"proof": "External"}}})),
            )
            .await?;
        let (_, on, uid, pv) = running_app(&ctx, "db", "data-db-0").await?;
        anyhow::ensure!(on == target, "db-0 moved from {target} to {on} by itself");
        ctx.cluster.kill_node(target)?;
        let request = wait_for(
            &format!("podha's fence request on {target}"),
            secs_(60),
            || async {
                let n = ctx.nodes().get(target).await?;
                Ok(n.metadata
                    .annotations
                    .and_then(|a| a.get(FENCE_REQUEST_ANNOTATION).cloned())
                    .filter(|r| r.starts_with(&format!("{ns}/"))))
            },
        )
        .await?;
        acted_once(&ctx.client, "default", "FenceRequested", target).await?;
        untouched_for(&ctx, &uid, target, secs_(5), " before the external fence").await?;
        log(&ns, format!("{target} held; fence requested: {request}"));

        // The user's fence controller powered the node off: it acknowledges.
        let proven = Instant::now();
        ctx.nodes()
            .patch(
                target,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {FENCE_ACK_ANNOTATION: &request}}}),
                ),
            )
            .await?;
        wait_for(
            "the out-of-service taint after the acknowledgement",
            secs_(30),
            || async { Ok(has_podha_taint(&ctx, target).await?.then_some(())) },
        )
        .await?;
        wait_recovered(&ctx, "db", &pv, &node, target, secs_(90)).await?;
        log(
            &ns,
            format!(
                "recovered on {node} {:.1?} after the external fence's acknowledgement",
                proven.elapsed()
            ),
        );
        Ok(())
    })
}
