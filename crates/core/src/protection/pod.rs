//! Would podha fail this pod over if its node died now? The rules in the order podha applies
//! them: podha leads, the pod is on a node, a policy selects it and one governs its node, then
//! the planner's verdicts (`verdicts.rs`) and what the proof needs (`fence.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use serde::Serialize;

use super::fence::proof_checks;
use super::verdicts::{ForeseenPod, eligibility_checks, state_checks, taint_check};
use super::{Check, Checks, Cluster, Operator, Outcome, Unprotected, human};
use crate::api::FencingProof;
use crate::eligibility::{node_selected, selects};
use crate::health::ReadyStatus;
use crate::planner::{PolicyRef, is_terminal, node_owner, pod_owner};
use crate::view::View;

/// The answer about one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodExplanation {
    /// `namespace/name`.
    pub pod: String,
    pub node: Option<String>,
    /// The policy that selects the pod, if one does.
    pub policy: Option<String>,
    /// Whether podha would fail the pod over if its node died now: no rule fails.
    pub protected: bool,
    pub checks: Vec<Check>,
}

impl PodExplanation {
    /// The first rule that keeps the pod where it is, if any, a dry run last: what would
    /// still keep it once `dryRun` is off comes first.
    pub fn first_failure(&self) -> Option<&Check> {
        self.why_not()
            .map(|(_, c)| c)
            .or_else(|| self.checks.iter().find(|c| c.failed()))
    }

    /// Why the pod is not protected: the first failing rule with its label, a dry run only
    /// when no other rule fails ([`Self::rehearsed`] says whether one is on as well).
    pub fn why_not(&self) -> Option<(Unprotected, &Check)> {
        let mut failures = self
            .checks
            .iter()
            .filter_map(|c| c.reason.filter(|_| c.failed()).map(|r| (r, c)));
        let first = failures.next()?;
        if first.0 != Unprotected::DryRun {
            return Some(first);
        }
        Some(failures.next().unwrap_or(first))
    }

    /// podha would fail the pod over, but only on the 6-minute path: the out-of-service taint
    /// would be refused on its node ([`Outcome::Slow`]).
    pub fn slow(&self) -> bool {
        self.protected && self.checks.iter().any(|c| c.outcome == Outcome::Slow)
    }

    /// A dry run keeps the pod (whatever else does).
    pub fn rehearsed(&self) -> bool {
        self.checks
            .iter()
            .any(|c| c.failed() && c.reason == Some(Unprotected::DryRun))
    }
}

/// Every rule about `pod`, in the order podha applies them.
pub fn explain_pod(cluster: &Cluster<'_>, pod: &Pod) -> PodExplanation {
    let mut checks = Checks::default();
    let (policy, node) = pod_checks(cluster, pod, &mut checks);
    let checks = checks.0;
    PodExplanation {
        pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        node,
        policy,
        protected: !checks.iter().any(Check::failed),
        checks,
    }
}

fn pod_checks(
    cluster: &Cluster<'_>,
    pod: &Pod,
    checks: &mut Checks,
) -> (Option<String>, Option<String>) {
    checks.push(operator_check(cluster));
    let view = cluster.view;
    let (node_name, node) = match scheduled_on(pod, view) {
        Ok(found) => found,
        Err((node_name, why)) => {
            checks.fail("node", Unprotected::NotOnNode, why);
            return (None, node_name);
        }
    };
    checks.pass("node", format!("on {node_name} ({})", ready_text(node)));
    let policies = &cluster.policies;
    let Some(owner) = pod_owner(policies, pod, node, view) else {
        checks.fail(
            "policy",
            Unprotected::NotSelected,
            unselected(policies, pod, node, view),
        );
        return (None, Some(node_name));
    };
    checks.pass(
        "policy",
        format!(
            "{} selects it (the first policy by name whose node, namespace and pod selectors \
             all select it)",
            owner.name
        ),
    );
    // The pod's policy selects the node, so some policy governs it.
    let node_policy = node_owner(policies, node).unwrap_or(owner);
    checks.push(node_policy_check(node_policy, owner, &node_name));
    let foreseen = cluster.foreseen(&node_name);
    let verdict = foreseen.as_ref().as_ref().map(|node| ForeseenPod {
        node,
        ruling: pod
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| node.pod(uid))
            .map(|p| &p.ruling),
    });
    state_checks(
        cluster,
        node_policy,
        owner,
        &node_name,
        verdict.as_ref(),
        checks,
    );
    eligibility_checks(owner, pod, node, view, verdict.as_ref(), checks);
    checks.push(taint_check(node_policy, owner, foreseen.as_ref().as_ref()));
    proof_checks(cluster, node_policy, &node_name, node, checks);
    checks.push(timing_note(node_policy, &node_name));
    (Some(owner.name.to_string()), Some(node_name))
}

/// Which policy governs the pod's node: its own, or one before it by name.
fn node_policy_check(node_policy: PolicyRef<'_>, owner: PolicyRef<'_>, node: &str) -> Check {
    let action = node_policy.spec.action.as_str();
    if node_policy.name == owner.name {
        Check::pass(
            "node policy",
            format!("{} also governs {node}: action {action}", owner.name),
        )
    } else {
        Check::note(
            "node policy",
            format!(
                "{} governs {node} (the first policy by name that selects it): its detection \
                 judges the node, its safety limits and dryRun decide there, its action \
                 ({action}) picks the taint",
                node_policy.name
            ),
        )
    }
}

/// What the failover's timing depends on, which no rule foresees.
fn timing_note(node_policy: PolicyRef<'_>, node: &str) -> Check {
    Check::note(
        "timing",
        format!(
            "after {node} is judged dead ({}), podha waits until its Lease missed a renewal \
             and every other watched node has shown life since (the settle wait){}: these \
             depend on the death itself and are not predicted",
            detection_text(node_policy),
            match node_policy.spec.fencing.proofs().single() {
                Some(FencingProof::Agent) => ", and for the agent's fence",
                Some(FencingProof::None) => "",
                _ => ", and for the fencing proof",
            }
        ),
    )
}

/// The node the pod runs on; else the node it names, if any, and why there is nothing to move.
fn scheduled_on<'v>(
    pod: &Pod,
    view: &'v View,
) -> Result<(String, &'v Node), (Option<String>, String)> {
    let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Err((
            None,
            "the pod is not scheduled on a node: there is nothing to move yet".to_string(),
        ));
    };
    let Some(node) = view.nodes.get(&node_name) else {
        let why = format!("node {node_name} does not exist");
        return Err((Some(node_name), why));
    };
    if is_terminal(pod) {
        let why = format!("on {node_name}, but the pod has finished: it holds no volume");
        return Err((Some(node_name), why));
    }
    Ok((node_name, node.as_ref()))
}

/// Does a podha replica lead now?
pub fn operator_check(cluster: &Cluster<'_>) -> Check {
    let lease = match cluster.operator {
        Operator::Leading => return Check::pass("podha", "this replica leads"),
        Operator::Lease(lease) => lease,
    };
    match lease {
        None => Check::fail(
            "podha",
            Unprotected::NoLeader,
            "no podha leader Lease found: podha is not running and nothing acts (or name its \
             Lease with --leader-lease and its namespace with --podha-namespace)",
        ),
        Some(lease) if lease.held() => Check::pass(
            "podha",
            format!(
                "{} leads (Lease {}/{} renewed {} ago)",
                lease.holder.as_deref().unwrap_or_default(),
                lease.namespace,
                lease.name,
                human(lease.renewed_ago.unwrap_or_default())
            ),
        ),
        Some(lease) => Check::fail(
            "podha",
            Unprotected::NoLeader,
            format!(
                "no replica leads: Lease {}/{} {} (it lasts {}): nothing acts",
                lease.namespace,
                lease.name,
                match (&lease.holder, lease.renewed_ago) {
                    (Some(h), Some(ago)) if !h.is_empty() =>
                        format!("last renewed by {h} {} ago", human(ago)),
                    _ => "is held by no one".to_string(),
                },
                human(lease.lasts)
            ),
        ),
    }
}

/// Why no policy selects the pod: each policy's first selector that refuses it.
fn unselected(policies: &[PolicyRef<'_>], pod: &Pod, node: &Node, view: &View) -> String {
    let namespace = pod.namespace().unwrap_or_default();
    let node_name = node.name_any();
    if policies.is_empty() {
        return "no PodHAPolicy exists: podha moves nothing".to_string();
    }
    let no_labels = BTreeMap::new();
    let ns_labels = view.namespace_labels.get(&namespace).unwrap_or(&no_labels);
    let refusals: Vec<(&str, String)> = policies
        .iter()
        .map(|p| {
            if !node_selected(p.spec, node) {
                ("node", format!("policy {}: nodeSelector", p.name))
            } else if !selects(&p.spec.namespace_selector, ns_labels) {
                ("namespace", format!("policy {}: namespaceSelector", p.name))
            } else {
                ("pod", format!("policy {}: podSelector", p.name))
            }
        })
        .collect();
    let subject = match refusals[0].0 {
        kind if refusals.iter().all(|(k, _)| *k == kind) => match kind {
            "node" => format!("node {node_name}"),
            "namespace" => format!("namespace {namespace}"),
            _ => format!("pod {namespace}/{}", pod.name_any()),
        },
        _ => format!("pod {namespace}/{} on node {node_name}", pod.name_any()),
    };
    let list: Vec<String> = refusals
        .into_iter()
        .map(|(_, r)| format!("{r} does not select it"))
        .collect();
    format!("no PodHAPolicy selects {subject} ({})", list.join("; "))
}

/// Each claim the pod mounts, with its volume, driver and access modes as far as they are
/// known.
pub(super) fn claims_text(pod: &Pod, view: &View) -> String {
    let namespace = pod.namespace().unwrap_or_default();
    crate::eligibility::claim_names(pod)
        .iter()
        .map(
            |claim| match crate::eligibility::bound_volume(view, &namespace, claim) {
                None => format!("{claim}: not bound"),
                Some(pv) => {
                    let spec = pv.spec.as_ref();
                    let driver = spec
                        .and_then(|s| s.csi.as_ref())
                        .map_or("not CSI", |c| c.driver.as_str());
                    let modes = spec
                        .and_then(|s| s.access_modes.as_ref())
                        .map_or_else(String::new, |m| m.join(","));
                    format!("{claim} → {} ({driver}, {modes})", pv.name_any())
                }
            },
        )
        .collect::<Vec<_>>()
        .join("; ")
}

/// The nodes that could take a pod of `dead`, as a reader of the API tells: Ready, and not
/// `dead` itself (the planner also asks that no policy suspects them, which only podha knows).
pub fn ready_elsewhere(dead: &str) -> impl Fn(&Node) -> bool + '_ {
    move |n: &Node| {
        n.metadata.name.as_deref() != Some(dead) && ReadyStatus::from_node(n) == ReadyStatus::True
    }
}

fn ready_text(node: &Node) -> &'static str {
    match ReadyStatus::from_node(node) {
        ReadyStatus::True => "Ready",
        ReadyStatus::False => "NotReady",
        ReadyStatus::Unknown => "Ready Unknown",
        ReadyStatus::Missing => "no Ready condition",
    }
}

pub fn detection_text(policy: PolicyRef<'_>) -> String {
    let d = &policy.spec.detection;
    let signals: Vec<&str> = d.signals.iter().map(|s| s.as_str()).collect();
    format!(
        "{} failed probes {} apart, signals {}",
        d.failure_threshold,
        d.interval,
        signals.join(", ")
    )
}
