//! `fencing.proof: CloudShutdownTaint` (issue 15): a node that stops heartbeating is held, not
//! tainted, until the cloud provider says the instance is shut down; then the failover follows
//! at once. What a cloud's node lifecycle controller does is done here by the test: it adds the
//! `node.cloudprovider.kubernetes.io/shutdown` taint to the dead node.

use std::time::Instant;

use k8s_openapi::api::core::v1::Taint;
use podha::api::CLOUD_SHUTDOWN_TAINT_KEY;
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, acted_once, has_podha_taint, log, other, policy_and_db,
    scenario, secs_, untouched_for, wait_recovered,
};
use podha_sim::testkit::*;

pub fn held_until_the_cloud_reports_the_node_shut_down(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = ["node-21", "node-22"];
    scenario(shared, ops, "fenced", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        let spec = json!({"fencing": {"proof": "CloudShutdownTaint"}});
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
        Ok(())
    })
}
