//! A policy changed while its incident is still open, tried as a user would:
//! a node dies under `action: DeletePods`, podha deletes the pod, the replacement waits on the
//! attach/detach controller's 6 minutes; the user switches the policy to `OutOfServiceTaint`,
//! and podha must act on the open incident at once (taint, detach, replacement Running), not
//! on the next node that dies. Then the user deletes the policy while the node is still down:
//! once the node is back, the taint the deleted policy left must go.

use std::time::Instant;

use anyhow::bail;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use podha::api::{FENCE_TAINT_KEY, PodHAPolicy};
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, gone, has_podha_taint, log, other, policy_and_db, scenario,
    secs_, wait_recovered,
};
use podha_sim::testkit::*;

pub fn switched_to_the_taint_mid_incident(
    shared: &SharedCluster,
    ops: &Operators,
) -> Result<(), Failed> {
    let pair = ["node-19", "node-20"];
    scenario(shared, ops, "edit", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        let (_, node, uid, pv) =
            policy_and_db(&ctx, &pair, json!({"action": "DeletePods"})).await?;
        let target = other(&pair, &node);
        let killed = Instant::now();
        ctx.cluster.kill_node(&node)?;
        wait_for("db-0 force-deleted under DeletePods", secs_(60), || async {
            Ok(gone(&ctx, "db-0", &uid).await?.then_some(()))
        })
        .await?;
        if has_podha_taint(&ctx, &node).await? {
            bail!("DeletePods must not taint {node} out-of-service");
        }
        // The replacement now waits for the attach/detach controller (6 minutes): still
        // attached on the dead node a while later.
        holds_for("the volume stays on the dead node", secs_(5), || async {
            let on_dead = ctx
                .vas_of(&pv)
                .await?
                .iter()
                .any(|v| v.spec.node_name == node);
            Ok(if on_dead {
                Ok(())
            } else {
                Err(format!(
                    "{pv} left {node} under DeletePods before the 6-minute wait"
                ))
            })
        })
        .await?;
        log(
            &ns,
            format!("db-0 deleted; {pv} still on {node}; switching the action"),
        );

        let policies: Api<PodHAPolicy> = Api::all(ctx.client.clone());
        let switched = Instant::now();
        policies
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"action": "OutOfServiceTaint"}})),
            )
            .await?;
        wait_for(
            "the out-of-service taint after the edit",
            secs_(30),
            || async { Ok(has_podha_taint(&ctx, &node).await?.then_some(())) },
        )
        .await?;
        log(
            &ns,
            format!("tainted {:.1?} after the edit", switched.elapsed()),
        );
        // Well inside the 6 minutes the volume would otherwise wait.
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        log(
            &ns,
            format!(
                "recovered on {target} {:.1?} after the edit, {:.1?} after the kill",
                switched.elapsed(),
                killed.elapsed()
            ),
        );

        // The policy goes while its node is still down; its taints must not outlive it.
        policies.delete(&ns, &DeleteParams::default()).await?;
        ctx.cluster.start_node(&node).await?;
        wait_for(
            "podha's taints removed from the returned node of a deleted policy",
            secs_(60),
            || async {
                let n = ctx.nodes().get(&node).await?;
                let fenced = n
                    .spec
                    .and_then(|s| s.taints)
                    .is_some_and(|t| t.iter().any(|t| t.key == FENCE_TAINT_KEY));
                Ok((!fenced && !has_podha_taint(&ctx, &node).await?).then_some(()))
            },
        )
        .await?;
        log(&ns, format!("{node} back and untainted"));
        Ok(())
    })
}
