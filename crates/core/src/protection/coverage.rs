//! How many of the pods each policy selects podha would fail over now, and why not the others:
//! every pod that mounts a claim, judged by [`explain_pod`] and counted under its first failing
//! rule, a dry run last (what would still keep the pod once `dryRun` is off comes first). A pod without a claim is not counted: it loses nothing when its node dies, and
//! Kubernetes replaces it by itself; nor is a pod that has finished (it holds no volume).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Cluster, Unprotected, explain_pod};
use crate::eligibility::claim_names;
use crate::planner::{is_terminal, pod_owner};

/// How many example pods a coverage names.
const EXAMPLES: usize = 5;

/// The pods with volumes one policy selects, by verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Coverage {
    pub protected: usize,
    /// Of the protected pods, those podha would move only on the 6-minute path: the
    /// out-of-service taint would be refused on their node (`PodExplanation::slow`).
    pub slow: usize,
    pub unprotected: usize,
    /// How many unprotected pods each reason keeps, most first (then by name).
    pub reasons: Vec<(Unprotected, usize)>,
    /// A few unprotected pods (`namespace/name`), each with its first failing rule.
    pub examples: Vec<(String, String)>,
    /// How many of the unprotected pods a dry run keeps, beside whatever else does: a pod
    /// counts under `DryRun` in `reasons` only when nothing else keeps it, so a dry run
    /// shows what would still keep the pods once it is off.
    pub rehearsed: usize,
}

/// Every policy's coverage, by policy name; a policy that selects no pod with a volume has an
/// empty one.
pub fn coverage(cluster: &Cluster<'_>) -> BTreeMap<String, Coverage> {
    let mut by_policy: BTreeMap<String, Coverage> = cluster
        .policies
        .iter()
        .map(|p| (p.name.to_string(), Coverage::default()))
        .collect();
    let mut reasons: BTreeMap<&str, BTreeMap<Unprotected, usize>> = BTreeMap::new();
    for (node_name, pods) in &cluster.view.pods_by_node {
        let Some(node) = cluster.view.nodes.get(node_name) else {
            continue;
        };
        for pod in pods {
            if claim_names(pod).is_empty() || is_terminal(pod) {
                continue;
            }
            let Some(owner) = pod_owner(&cluster.policies, pod, node, cluster.view) else {
                continue;
            };
            let Some(out) = by_policy.get_mut(owner.name) else {
                continue;
            };
            let e = explain_pod(cluster, pod);
            match e.why_not() {
                None => {
                    out.protected += 1;
                    out.slow += usize::from(e.slow());
                }
                Some((reason, check)) => {
                    out.unprotected += 1;
                    let rehearsed = e.rehearsed();
                    out.rehearsed += usize::from(rehearsed);
                    *reasons
                        .entry(owner.name)
                        .or_default()
                        .entry(reason)
                        .or_default() += 1;
                    if out.examples.len() < EXAMPLES {
                        let mut why = check.detail.clone();
                        if rehearsed && reason != Unprotected::DryRun {
                            why.push_str(" (and dryRun is on)");
                        }
                        out.examples.push((e.pod.clone(), why));
                    }
                }
            }
        }
    }
    for (policy, counts) in reasons {
        if let Some(out) = by_policy.get_mut(policy) {
            let mut counts: Vec<(Unprotected, usize)> = counts.into_iter().collect();
            counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.as_str().cmp(b.0.as_str())));
            out.reasons = counts;
        }
    }
    by_policy
}
