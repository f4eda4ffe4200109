//! A node: which policy governs it, whether podha could fence it if it died now (the taint it
//! would get, its agent, the proof), and every pod on it with its verdict.

use kube::ResourceExt;
use serde::Serialize;

use super::{Check, Checks, Cluster, explain_pod};
use crate::eligibility::claim_names;
use crate::planner::node_owner;
use crate::protection::pod::{detection_text, operator_check};
use crate::protection::verdicts::{ForeseenPod, state_checks, taint_check};
use crate::protection::{Unprotected, proof_checks};

/// The answer about one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeExplanation {
    pub node: String,
    /// The policy that governs the node, if one selects it.
    pub policy: Option<String>,
    /// Whether nothing about the node itself keeps its pods where they are.
    pub protected: bool,
    pub checks: Vec<Check>,
    pub pods: Vec<PodVerdict>,
}

/// One pod on the node, in a line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVerdict {
    pub pod: String,
    pub protected: bool,
    /// The first rule that keeps it where it is, if any.
    pub because: Option<Check>,
}

/// `None` when the node does not exist.
pub fn explain_node(cluster: &Cluster<'_>, name: &str) -> Option<NodeExplanation> {
    let node = cluster.view.nodes.get(name)?;
    let mut checks = Checks::default();
    checks.push(operator_check(cluster));
    let policy = node_owner(&cluster.policies, node);
    match policy {
        None => checks.fail(
            "node policy",
            Unprotected::NotSelected,
            format!("no PodHAPolicy's nodeSelector selects {name}: podha does not watch it"),
        ),
        Some(p) => {
            checks.pass(
                "node policy",
                format!(
                    "{} governs {name}: action {}, detection {}{}",
                    p.name,
                    p.spec.action.as_str(),
                    detection_text(p),
                    if p.spec.dry_run { ", dryRun on" } else { "" }
                ),
            );
            let foreseen = cluster.foreseen(name);
            let verdict = foreseen
                .as_ref()
                .as_ref()
                .map(|node| ForeseenPod { node, ruling: None });
            state_checks(cluster, p, p, name, verdict.as_ref(), &mut checks);
            checks.push(taint_check(p, p, foreseen.as_ref().as_ref()));
            proof_checks(cluster, p, name, node, &mut checks);
        }
    }
    let mut pods: Vec<PodVerdict> = cluster
        .view
        .pods_on(name)
        .iter()
        .filter(|pod| !claim_names(pod).is_empty())
        .map(|pod| {
            let e = explain_pod(cluster, pod);
            PodVerdict {
                because: e.first_failure().cloned(),
                protected: e.protected,
                pod: e.pod,
            }
        })
        .collect();
    pods.sort_by(|a, b| a.pod.cmp(&b.pod));
    let checks = checks.0;
    Some(NodeExplanation {
        node: node.name_any(),
        policy: policy.map(|p| p.name.to_string()),
        protected: !checks.iter().any(Check::failed),
        checks,
        pods,
    })
}
