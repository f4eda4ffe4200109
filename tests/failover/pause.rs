//! Pause for maintenance, tried as an operator would: a paused policy's node dies, podha judges
//! it dead and says it holds, and acts once the pause is lifted; then a node paused by its
//! annotation dies, and the same. `podha explain` says so before each death. (The policy asks
//! for no fencing proof: under the agent's, a node that dies while paused stays held after the
//! pause, its agent told to fence nothing meanwhile.)

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use podha::api::{PAUSE_ANNOTATION, PodHAPolicy};
use serde_json::json;

use super::{
    Failed, Operators, SharedCluster, explained_unprotected, has_podha_taint, log, other,
    policy_and_db, policy_status, scenario, secs_, times_acted, untouched_for, wait_recovered,
};
use podha_sim::testkit::*;

const PAIR: [&str; 2] = ["node-25", "node-26"];

pub fn paused_policy_and_node(shared: &SharedCluster, ops: &Operators) -> Result<(), Failed> {
    let pair = PAIR;
    scenario(shared, ops, "pause", |ctx, _, _| async move {
        let ns = ctx.ns.clone();
        // Its two nodes die one after the other: the second is no sign of a partition. No
        // fencing proof: under the agent's, a node that dies while paused stays held after the
        // pause, its agent told to fence nothing meanwhile (docs/agent.md, "Fences nothing on
        // isolation while podha holds its node"; src/runtime/actor/tests/silence.rs).
        let spec = json!({
            "action": "OutOfServiceTaint",
            "paused": true,
            "fencing": {"proof": "None"},
            "safety": {"unhealthyWindow": "0s"},
        });
        let (_, node, uid, pv) = policy_and_db(&ctx, &pair, spec).await?;
        let target = other(&pair, &node);
        explained_unprotected(&ctx, "db-0", "state", "is paused (spec.paused")?;

        // The policy paused: judged dead, held, nothing touched.
        ctx.cluster.kill_node(&node)?;
        wait_for(
            "the paused policy to judge the node dead",
            secs_(60),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                Ok((status.failed_nodes == 1 && status.paused_nodes == 2).then_some(()))
            },
        )
        .await?;
        said(&ctx, "ActionsPaused", &node).await?;
        untouched_for(&ctx, &uid, &node, secs_(8), " while its policy was paused").await?;
        log(
            &ns,
            format!("{node} dead and held while the policy is paused"),
        );
        let policies: Api<PodHAPolicy> = Api::all(ctx.client.clone());
        policies
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false}})),
            )
            .await?;
        wait_recovered(&ctx, "db", &pv, target, &node, secs_(90)).await?;
        log(&ns, format!("unpaused: recovered on {target}"));
        ctx.cluster.start_node(&node).await?;
        wait_for(&format!("podha's taint off {node}"), secs_(60), || async {
            Ok((!has_podha_taint(&ctx, &node).await?).then_some(()))
        })
        .await?;

        // The node db now runs on paused by its annotation: the same.
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        let annotate = |value: serde_json::Value| {
            let nodes = nodes.clone();
            async move {
                let annotations =
                    serde_json::Map::from_iter([(PAUSE_ANNOTATION.to_string(), value)]);
                let patch = json!({"metadata": {"annotations": annotations}});
                nodes
                    .patch(target, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            }
        };
        annotate(json!("true")).await?;
        explained_unprotected(&ctx, "db-0", "state", "paused for maintenance")?;
        let db = ctx.pods().get("db-0").await?;
        let uid = db.metadata.uid.clone().unwrap_or_default();
        ctx.cluster.kill_node(target)?;
        said(&ctx, "ActionsPaused", target).await?;
        untouched_for(&ctx, &uid, target, secs_(8), " while the node was paused").await?;
        wait_for(
            "the policy's status to count one paused node",
            secs_(30),
            || async {
                let status = policy_status(&ctx.client, &ns).await?;
                Ok((status.paused_nodes == 1).then_some(()))
            },
        )
        .await?;
        annotate(serde_json::Value::Null).await?;
        wait_recovered(&ctx, "db", &pv, &node, target, secs_(90)).await?;
        log(&ns, format!("annotation removed: recovered on {node}"));
        ctx.cluster.start_node(target).await?;
        wait_for(
            &format!("podha's taint off {target}"),
            secs_(60),
            || async { Ok((!has_podha_taint(&ctx, target).await?).then_some(())) },
        )
        .await?;
        Ok(())
    })
}

/// podha's `reason` event about `node` arrives (a replica that took the lead since may say it
/// again: at least once).
async fn said(ctx: &Ctx<'_>, reason: &str, node: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("podha's {reason} event about {node}"),
        secs_(30),
        || async {
            Ok((times_acted(&ctx.client, "default", reason, node).await? > 0).then_some(()))
        },
    )
    .await
}
