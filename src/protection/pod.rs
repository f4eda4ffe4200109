//! Would podha fail this pod over if its node died now? Every rule with its result, each
//! answered by the operator's own code: the planner's policy ownership and taint rules, the
//! eligibility checks, the agent coverage, the policy's status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use serde::Serialize;

use super::fence::proof_checks;
use super::{Check, Checks, Cluster, Operator, Unprotected, human};
use crate::api::{Action, FencingProof, NodeTaint, PAUSE_ANNOTATION, condition, node_paused};
use crate::eligibility::{
    SkipReason, check_owner, check_tolerations, check_volumes, controller_ref, find_target_with,
    node_selected, selects, tolerated_fence,
};
use crate::health::ReadyStatus;
use crate::planner::{PolicyRef, is_terminal, must_stay, node_owner, pod_owner};
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
    /// The first rule that keeps the pod where it is, if any.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.failed())
    }

    /// Why the pod is not protected: the first failing rule, with its label.
    pub fn why_not(&self) -> Option<(Unprotected, &Check)> {
        self.checks
            .iter()
            .find_map(|c| c.reason.filter(|_| c.failed()).map(|r| (r, c)))
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
    if node_policy.name == owner.name {
        checks.pass(
            "node policy",
            format!(
                "{} also governs {node_name}: action {}",
                owner.name,
                node_policy.spec.action.as_str()
            ),
        );
    } else {
        checks.note(
            "node policy",
            format!(
                "{} governs {node_name} (the first policy by name that selects it): its \
                 detection judges the node, its safety limits and dryRun decide there, its \
                 action ({}) picks the taint",
                node_policy.name,
                node_policy.spec.action.as_str()
            ),
        );
    }
    state_checks(cluster, node_policy, owner, &node_name, checks);
    eligibility_checks(owner, pod, node, view, checks);
    checks.push(taint_check(cluster, node_policy, node));
    proof_checks(cluster, node_policy, &node_name, node, checks);
    checks.note(
        "timing",
        format!(
            "after {node_name} is judged dead ({}), podha waits until every other watched node \
             has shown life since (the settle wait){}: these depend on the death itself and are \
             not predicted",
            detection_text(node_policy),
            match node_policy.spec.fencing.proofs().single() {
                Some(FencingProof::Agent) => ", and for the agent's fence",
                Some(FencingProof::None) => "",
                _ => ", and for the fencing proof",
            }
        ),
    );
    (Some(owner.name.to_string()), Some(node_name))
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

/// The policies' own state: paused, dry run, a policy before them unreadable, too many
/// unhealthy nodes.
pub fn state_checks(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
    node: &str,
    checks: &mut Checks,
) {
    if let Some(why) = pause(node_policy, owner, node, cluster) {
        checks.fail("state", Unprotected::Paused, why);
        return;
    }
    if node_policy.spec.dry_run {
        checks.fail(
            "state",
            Unprotected::DryRun,
            format!(
                "{}: dryRun is on (it governs {node}): podha only says what it would do",
                node_policy.name
            ),
        );
        return;
    }
    if owner.spec.dry_run {
        checks.fail(
            "state",
            Unprotected::DryRun,
            format!(
                "{}: dryRun is on: podha only says what it would do",
                owner.name
            ),
        );
        return;
    }
    // As the planner: a policy after an unreadable one by name holds every action.
    if let Some((unreadable, why)) = cluster
        .unreadable
        .iter()
        .find(|(name, _)| name.as_str() < node_policy.name.max(owner.name))
    {
        checks.fail(
            "state",
            Unprotected::PolicyUnreadable,
            format!(
                "policy {unreadable} cannot be read ({why}) and comes first by name: podha \
                 holds every action of the policies after it"
            ),
        );
        return;
    }
    for policy in [node_policy, owner] {
        if let Some(c) = cluster
            .statuses
            .get(policy.name)
            .and_then(|s| s.degraded_because(condition::REASON_TOO_MANY_UNHEALTHY))
        {
            checks.fail(
                "state",
                Unprotected::TooManyUnhealthy,
                format!(
                    "{} holds every action: {} ({})",
                    policy.name, c.reason, c.message
                ),
            );
            return;
        }
    }
    let status = cluster.statuses.get(node_policy.name);
    let counts = status.map_or_else(
        || "no status yet".to_string(),
        |s| {
            format!(
                "{} failed and {} suspect of {} watched nodes, at most {} unhealthy within {}",
                s.failed_nodes,
                s.suspect_nodes,
                s.watched_nodes,
                node_policy
                    .spec
                    .max_unhealthy_nodes(usize::try_from(s.watched_nodes).unwrap_or_default()),
                node_policy.spec.safety.unhealthy_window
            )
        },
    );
    checks.pass("state", format!("{} acts: {counts}", node_policy.name));
}

/// Why podha would take no new action on `node` if it died now: its policy, the pod's, or the
/// node itself paused.
fn pause(
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
    node: &str,
    cluster: &Cluster<'_>,
) -> Option<String> {
    let annotated = cluster.view.nodes.get(node).is_some_and(|n| node_paused(n));
    if annotated {
        Some(format!(
            "{node} is paused for maintenance ({PAUSE_ANNOTATION}): podha takes no new action \
             there until the annotation goes"
        ))
    } else if node_policy.spec.paused {
        Some(format!(
            "{} is paused (spec.paused, it governs {node}): podha judges but takes no new action",
            node_policy.name
        ))
    } else if owner.spec.paused {
        Some(format!(
            "{} is paused (spec.paused): podha judges but takes no new action",
            owner.name
        ))
    } else {
        None
    }
}

/// The eligibility rules, each on its own, with the pod's policy.
fn eligibility_checks(
    owner: PolicyRef<'_>,
    pod: &Pod,
    node: &Node,
    view: &View,
    checks: &mut Checks,
) {
    let spec = owner.spec;
    let ineligible = |reason: SkipReason| {
        format!(
            "policy {}: {}: {}",
            owner.name,
            reason.as_str(),
            reason.describe()
        )
    };
    match check_owner(spec, pod, view) {
        Ok(kind) => {
            let name = controller_ref(pod).map_or("", |r| r.name.as_str());
            checks.pass("owner", format!("{kind} {name}"));
        }
        Err(reason) => checks.fail("owner", Unprotected::Ineligible(reason), ineligible(reason)),
    }
    let claims = claims_text(pod, view);
    let pvs = match check_volumes(spec, pod, view) {
        Ok(pvs) => {
            checks.pass("volumes", claims);
            pvs
        }
        Err(reason) => {
            let known = if claims.is_empty() {
                String::new()
            } else {
                format!(" ({claims})")
            };
            checks.fail(
                "volumes",
                Unprotected::Ineligible(reason),
                format!("{}{known}", ineligible(reason)),
            );
            Vec::new()
        }
    };
    let node_name = node.name_any();
    let usable = ready_elsewhere(&node_name);
    match (
        find_target_with(pod, &pvs, view, &usable),
        spec.safety.require_target,
    ) {
        (Some(target), _) => checks.pass(
            "target",
            format!(
                "{} could run it now (taints, affinity, resources, volume topology)",
                target.name_any()
            ),
        ),
        (None, true) => checks.fail(
            "target",
            Unprotected::Ineligible(SkipReason::NoTargetNode),
            ineligible(SkipReason::NoTargetNode),
        ),
        (None, false) => checks.note(
            "target",
            "no Ready, schedulable node could run it now; safety.requireTarget is off: podha \
             moves it and its replacement waits Pending",
        ),
    }
    // After the target, in the planner's order (`eligibility::check_movable`).
    match check_tolerations(spec, pod) {
        Ok(()) => checks.pass(
            "tolerations",
            format!(
                "does not tolerate {}, the taint podha fences with under {}",
                NodeTaint::for_action(spec.action).key(),
                spec.action.as_str()
            ),
        ),
        Err(reason) => checks.fail(
            "tolerations",
            Unprotected::Ineligible(reason),
            format!(
                "{} (it tolerates {})",
                ineligible(reason),
                tolerated_fence(spec.action, pod).map_or("", NodeTaint::key)
            ),
        ),
    }
}

/// Which taint `node` would get if it died now, and what that means for the volumes: worked out
/// once per node.
pub fn taint_check(cluster: &Cluster<'_>, node_policy: PolicyRef<'_>, node: &Node) -> Check {
    cluster.taint_of(&node.name_any(), || node_taint(cluster, node_policy, node))
}

fn node_taint(cluster: &Cluster<'_>, node_policy: PolicyRef<'_>, node: &Node) -> Check {
    let node_name = node.name_any();
    if node_policy.spec.action == Action::DeletePods {
        return Check::pass(
            "taint",
            format!(
                "{} (action DeletePods): the pod is deleted once the fencing proof is in; its \
                 volume detaches after the attach/detach controller's 6-minute wait",
                NodeTaint::Fence.key()
            ),
        );
    }
    let usable = ready_elsewhere(&node_name);
    // The pods the planner would judge: not those that have finished.
    let staying = cluster
        .view
        .pods_on(&node_name)
        .iter()
        .filter(|p| !is_terminal(p))
        .find_map(|pod| {
            let why = must_stay(
                &cluster.policies,
                node_policy,
                pod,
                node,
                cluster.view,
                &usable,
            )?;
            Some((pod.namespace().unwrap_or_default(), pod.name_any(), why))
        });
    match staying {
        None => Check::pass(
            "taint",
            format!(
                "{}: volumes detach as soon as their pods are deleted",
                NodeTaint::OutOfService.key()
            ),
        ),
        Some((ns, name, why)) => Check::note(
            "taint",
            format!(
                "{} would be refused while {ns}/{name} must stay on {node_name} ({why}): podha \
                 fences the node with {} instead, deletes the pod, and its volume detaches after \
                 the attach/detach controller's 6-minute wait",
                NodeTaint::OutOfService.key(),
                NodeTaint::Fence.key()
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
fn claims_text(pod: &Pod, view: &View) -> String {
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
