//! From policies, node health and the cluster view, the intents: what to taint, delete,
//! untaint or hold. Pure: no client, no IO. The actuator carries the intents out.
//!
//! Rules, each in one place below:
//! - **Which policy decides.** Policies are taken in name order. A pod belongs to the first
//!   policy whose node, namespace and pod selectors all select it; a node's taint belongs to the
//!   first policy whose node selector selects the node. Only that policy's detection settings,
//!   action and safety limits apply, so overlapping policies never disagree about one object.
//! - **One action per incident.** A pod is deleted only if it was on the node when the incident
//!   opened (later pods are replacements) and was not deleted already; a node is tainted once.
//! - **Stale readiness.** A pod still Ready on a dead node shows what the dead kubelet last
//!   wrote. The node lifecycle controller marks such pods NotReady only after its grace period
//!   (50 s by default); podha marks the pods it will move NotReady as soon as it judges the node
//!   dead (beside the taint: a mark moves nothing), and deletes each one in the version its mark
//!   produced, or once the watch shows it not Ready. A pod that changed after podha marked it
//!   and is Ready again is left alone: something alive keeps reporting it.
//! - **Taint first.** A pod is deleted only once its node's taint is on (ledger or node): a
//!   replacement created before could be scheduled straight back onto the dead node.
//! - **Hold when unsure.** Too many failed nodes, or a dry run, turns actions into holds.

mod ledger;
mod ownership;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

pub use ledger::{Incident, Ledger};
pub use ownership::{node_owner, pod_owner};

use crate::api::{NodeTaint, PodHAPolicySpec, TAINT_MARKER_ANNOTATION};
use crate::eligibility::{self, SkipReason};
use crate::health::{NodeHealth, ReadyStatus};
use crate::view::{ObjectKey, View};

/// A policy as the planner sees it.
#[derive(Clone, Copy, Debug)]
pub struct PolicyRef<'a> {
    pub name: &'a str,
    pub spec: &'a PodHAPolicySpec,
}

/// Node health per policy: `health[policy][node]`. A node a policy does not watch is absent.
pub type HealthBook = BTreeMap<String, BTreeMap<String, NodeHealth>>;

/// Everything one planning round reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub policies: &'a [PolicyRef<'a>],
    pub health: &'a HealthBook,
    pub view: &'a View,
    pub ledger: &'a Ledger,
}

/// Something the actuator should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Add the taint (out-of-service, or the scheduling fence) and podha's marker.
    TaintNode {
        node: String,
        policy: String,
        taint: NodeTaint,
    },
    /// Set the pod's Ready condition to False (its node is dead, the readiness is stale), if it
    /// is still the object with this UID.
    MarkPodNotReady {
        pod: ObjectKey,
        uid: String,
        node: String,
        policy: String,
    },
    /// Force-delete (grace 0) the pod with this UID (UID precondition), and, for a pod podha
    /// marked NotReady that the watch does not show so yet, only in the version the mark
    /// produced (resourceVersion precondition).
    ForceDeletePod {
        pod: ObjectKey,
        uid: String,
        node: String,
        policy: String,
        owner_kind: &'static str,
        resource_version: Option<String>,
    },
    /// Remove the taints podha added (the node is back and holds no volume).
    RemoveTaint { node: String },
    /// An action podha chose not to take, and why.
    Hold {
        policy: String,
        node: Option<String>,
        reason: HoldReason,
    },
}

/// Why an action is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// More watched nodes are Failed than `safety.maxUnhealthy` allows.
    TooManyUnhealthy {
        failed: usize,
        watched: usize,
        max: usize,
    },
    /// `dryRun` is set; this is what would have been done.
    DryRun { would: Box<Intent> },
}

impl HoldReason {
    /// Label value for `podha_actions_held_total{reason}`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::TooManyUnhealthy { .. } => "TooManyUnhealthyNodes",
            Self::DryRun { .. } => "DryRun",
        }
    }
}

/// A pod on a failed node that podha leaves alone this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSkip {
    pub pod: ObjectKey,
    pub uid: String,
    pub node: String,
    pub policy: String,
    pub reason: Skip,
}

/// Why a pod is skipped: ineligible, or a planner-level rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Skip {
    Ineligible(SkipReason),
    /// Bound to the node after the incident opened: a replacement, never deleted.
    Replacement,
    /// Its policy holds every action (see the policy's hold).
    Held,
}

impl Skip {
    /// Label value for `podha_pods_skipped_total{reason}`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ineligible(reason) => reason.as_str(),
            Self::Replacement => "Replacement",
            Self::Held => "Held",
        }
    }
}

/// The outcome of one planning round. A pod's delete is planned only once its node's taint is
/// on (recorded in the ledger or seen on the node) and, for a pod still Ready, its mark has
/// landed, so no two intents of a round depend on each other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub intents: Vec<Intent>,
    pub skips: Vec<PodSkip>,
}

/// Plans one round. Deterministic: the same input gives the same plan.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut policies = input.policies.to_vec();
    policies.sort_by(|a, b| a.name.cmp(b.name));
    let held = held_policies(&policies, input);

    let mut out = Plan::default();
    for (name, hold) in &held {
        out.intents.push(Intent::Hold {
            policy: name.to_string(),
            node: None,
            reason: hold.clone(),
        });
    }
    for incident in input.ledger.iter() {
        plan_incident(incident, &policies, &held, input, &mut out);
    }
    plan_untaints(&policies, input, &mut out);
    out
}

fn health_of(health: &HealthBook, policy: &str, node: &str) -> Option<NodeHealth> {
    health
        .get(policy)
        .and_then(|nodes| nodes.get(node))
        .copied()
}

/// Policies over their `safety.maxUnhealthy` limit hold every action.
fn held_policies<'a>(
    policies: &[PolicyRef<'a>],
    input: &PlanInput<'_>,
) -> BTreeMap<&'a str, HoldReason> {
    let mut held = BTreeMap::new();
    for policy in policies {
        let Some(nodes) = input.health.get(policy.name) else {
            continue;
        };
        let watched = nodes.len();
        let failed = nodes.values().filter(|h| h.is_failed()).count();
        let max = policy.spec.max_unhealthy_nodes(watched);
        if failed > max {
            held.insert(
                policy.name,
                HoldReason::TooManyUnhealthy {
                    failed,
                    watched,
                    max,
                },
            );
        }
    }
    held
}

/// A node may take a pod when no policy judges it anything but Healthy. Nodes no policy
/// watches are left to the target check's own Ready test.
fn node_usable(health: &HealthBook) -> impl Fn(&Node) -> bool + '_ {
    move |node: &Node| {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        health.values().all(|nodes| {
            nodes
                .get(name)
                .is_none_or(|h| matches!(h, NodeHealth::Healthy))
        })
    }
}

fn plan_incident(
    incident: &Incident,
    policies: &[PolicyRef<'_>],
    held: &BTreeMap<&str, HoldReason>,
    input: &PlanInput<'_>,
    out: &mut Plan,
) {
    let view = input.view;
    let node = incident.node.as_str();
    let Some(node_obj) = view.nodes.get(node) else {
        return;
    };
    let usable = node_usable(input.health);
    let mut marks = Vec::new();
    let mut deletes = Vec::new();

    for pod in view.pods_on(node) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if is_terminal(pod) || incident.deleted.contains(uid) {
            continue;
        }
        let Some(owner) = pod_owner(policies, pod, node_obj, view) else {
            continue;
        };
        if !matches!(
            health_of(input.health, owner.name, node),
            Some(NodeHealth::Failed { .. })
        ) {
            continue;
        }
        let key = ObjectKey::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let skip = |reason| PodSkip {
            pod: key.clone(),
            uid: uid.to_string(),
            node: node.to_string(),
            policy: owner.name.to_string(),
            reason,
        };
        if held.contains_key(owner.name) {
            out.skips.push(skip(Skip::Held));
            continue;
        }
        if !incident.pods_at_failure.contains(uid) {
            out.skips.push(skip(Skip::Replacement));
            continue;
        }
        let eligible = match eligibility::check_movable(owner.spec, pod, view, &usable) {
            Err(reason) => {
                out.skips.push(skip(Skip::Ineligible(reason)));
                continue;
            }
            Ok(eligible) => eligible,
        };
        let resource_version = if eligibility::looks_alive(pod) {
            match incident.marked_not_ready.get(uid) {
                None => {
                    let intent = Intent::MarkPodNotReady {
                        pod: key,
                        uid: uid.to_string(),
                        node: node.to_string(),
                        policy: owner.name.to_string(),
                    };
                    marks.push((owner, intent));
                    continue;
                }
                // Marked, and the watch does not show it yet: delete that version only.
                Some(Some(version)) => Some(version.clone()),
                // Marked, but the pod changed since and still shows Ready: wait for the watch
                // to show the mark (or, if a live kubelet turned it Ready again, for the node
                // to be judged healthy).
                Some(None) => continue,
            }
        } else {
            None
        };
        let intent = Intent::ForceDeletePod {
            pod: key,
            uid: uid.to_string(),
            node: node.to_string(),
            policy: owner.name.to_string(),
            owner_kind: eligible.owner_kind,
            resource_version,
        };
        deletes.push((owner, intent));
    }

    // Marks go out with the taint: they move nothing. Deletes only once the node carries its
    // taint: the writer runs actions concurrently, and a pod deleted before the taint lands may
    // have its replacement scheduled straight back onto the dead node (still Ready for the node
    // lifecycle controller for up to 50 s). A taint that is only a dry-run hold does not wait.
    let moving = !marks.is_empty() || !deletes.is_empty();
    let taint = plan_taint(incident, node_obj, policies, held, input, moving);
    let wait_for_taint = matches!(taint, Some(Intent::TaintNode { .. }));
    out.intents.extend(taint);
    for (owner, intent) in marks {
        out.intents.push(dry_run_guard(owner, node, intent));
    }
    if wait_for_taint {
        return;
    }
    for (owner, intent) in deletes {
        out.intents.push(dry_run_guard(owner, node, intent));
    }
}

/// The node's taint, before any pod moves: the out-of-service taint with `OutOfServiceTaint`
/// (volumes detach at once), the scheduling fence with `DeletePods` (without it, a pod deleted
/// before the node lifecycle controller taints the node unreachable may be scheduled right back
/// onto the dead node). Wanted when the node's policy judges it Failed, is not held, and at
/// least one pod will move: without a pod to move the taint would only disturb pods podha
/// leaves alone.
fn plan_taint(
    incident: &Incident,
    node: &Node,
    policies: &[PolicyRef<'_>],
    held: &BTreeMap<&str, HoldReason>,
    input: &PlanInput<'_>,
    moving: bool,
) -> Option<Intent> {
    let owner = node_owner(policies, node)?;
    let taint = NodeTaint::for_action(owner.spec.action);
    let failed = matches!(
        health_of(input.health, owner.name, &incident.node),
        Some(NodeHealth::Failed { .. })
    );
    if !failed || held.contains_key(owner.name) || incident.tainted || taint.on(node) || !moving {
        return None;
    }
    let intent = Intent::TaintNode {
        node: incident.node.clone(),
        policy: owner.name.to_string(),
        taint,
    };
    Some(dry_run_guard(owner, &incident.node, intent))
}

/// Untaint nodes podha tainted once they are back (Ready, judged Healthy by every policy that
/// watches them) and no VolumeAttachment remains on them.
fn plan_untaints(policies: &[PolicyRef<'_>], input: &PlanInput<'_>, out: &mut Plan) {
    let usable = node_usable(input.health);
    for (name, node) in &input.view.nodes {
        let marked = node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(TAINT_MARKER_ANNOTATION));
        if !marked || !NodeTaint::ALL.iter().any(|t| t.on(node)) {
            continue;
        }
        if ReadyStatus::from_node(node) != ReadyStatus::True
            || !usable(node)
            || !input.view.attachments_on(name).is_empty()
        {
            continue;
        }
        let intent = Intent::RemoveTaint { node: name.clone() };
        match node_owner(policies, node) {
            Some(owner) => out.intents.push(dry_run_guard(owner, name, intent)),
            // The policy that tainted the node is gone: clean up rather than strand the taint.
            None => out.intents.push(intent),
        }
    }
}

fn dry_run_guard(policy: PolicyRef<'_>, node: &str, intent: Intent) -> Intent {
    if policy.spec.dry_run {
        Intent::Hold {
            policy: policy.name.to_string(),
            node: Some(node.to_string()),
            reason: HoldReason::DryRun {
                would: Box::new(intent),
            },
        }
    } else {
        intent
    }
}

/// A pod that has finished holds no volume and needs no replacement.
fn is_terminal(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

#[cfg(test)]
mod tests;
