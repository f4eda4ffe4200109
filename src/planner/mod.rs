//! From policies, node health and the cluster view, the intents: what to taint, delete,
//! untaint or hold. Pure: no client, no IO. The actuator carries the intents out.
//!
//! Rules, each in one place below:
//! - **Which policy decides.** Policies are taken in name order. A node belongs to the first
//!   policy whose node selector selects it (the *node's policy*); a pod to the first policy whose
//!   node, namespace and pod selectors all select it (the *pod's policy*). The node's policy
//!   governs everything done on the node: its detection says whether the node is dead, its
//!   safety limits and `dryRun` hold or rehearse every action there, its action picks the taint.
//!   A pod moves only when, in addition, its own policy selects it, finds it eligible, judges the
//!   node dead and neither holds nor rehearses. So overlapping policies can only add reasons to
//!   stay, never a reason to act.
//! - **The out-of-service taint is node-wide** (see `taints.rs`): refused, in favour of the
//!   scheduling fence and per-pod deletes, while any pod podha must not move is on the node.
//! - **Hold when unsure** (see `holds.rs`): too many unhealthy nodes, or a newly failed node
//!   while others have not been heard from since, or a dry run.
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

mod holds;
mod ledger;
mod ownership;
pub mod proof;
mod taints;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

pub use holds::{Heartbeat, Heartbeats};
pub use ledger::{Incident, Ledger};
pub use ownership::{node_owner, pod_owner};

use crate::api::{Action, FencingProof, NodeTaint, PodHAPolicySpec};
use crate::eligibility::{self, SkipReason};
use crate::health::NodeHealth;
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
    /// podha's observations of every node's Lease, for the settle rule.
    pub heartbeats: &'a Heartbeats,
    pub now: Instant,
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
    /// Ask the node's podha agent to fence the node (policy proof `Agent`): an annotation on
    /// the Node the agent answers with its acknowledgement.
    RequestFence { node: String, policy: String },
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
    /// More watched nodes are unhealthy (Failed, Suspect, or failed within
    /// `safety.unhealthyWindow`) than `safety.maxUnhealthy` allows.
    TooManyUnhealthy {
        failed: usize,
        watched: usize,
        max: usize,
    },
    /// `dryRun` is set; this is what would have been done.
    DryRun { would: Box<Intent> },
    /// A node failed, but so many other watched nodes have not renewed their Lease since that a
    /// partition cannot be ruled out.
    Unconfirmed { unheard: usize, watched: usize },
    /// The out-of-service taint would remove `pod`, which must stay (`why`); the node gets the
    /// scheduling fence instead and only the eligible pods are deleted.
    OutOfServiceRefused { pod: ObjectKey, why: &'static str },
    /// The policy's `fencing.proof` is not on the node yet: nothing is tainted or deleted there.
    FencingPending { proof: FencingProof },
}

impl HoldReason {
    /// Label value for `podha_actions_held_total{reason}`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::TooManyUnhealthy { .. } => "TooManyUnhealthyNodes",
            Self::DryRun { .. } => "DryRun",
            Self::Unconfirmed { .. } => "NodesNotHeardFrom",
            Self::OutOfServiceRefused { .. } => "OutOfServiceTaintRefused",
            Self::FencingPending { .. } => "FencingPending",
        }
    }
}

/// A pod on a failed node that the out-of-service taint must not remove, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protected {
    pub pod: ObjectKey,
    pub why: &'static str,
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
    /// Its policy, or its node's, holds every action (see the policy's hold).
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
    let held = holds::held_policies(&policies, input);

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
    taints::plan_untaints(&policies, input, &mut out.intents);
    out
}

fn health_of(health: &HealthBook, policy: &str, node: &str) -> Option<NodeHealth> {
    health
        .get(policy)
        .and_then(|nodes| nodes.get(node))
        .copied()
}

fn judged_failed(health: &HealthBook, policy: &str, node: &str) -> bool {
    matches!(
        health_of(health, policy, node),
        Some(NodeHealth::Failed { .. })
    )
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

/// What one round does about one failed node.
struct NodePlan<'p> {
    marks: Vec<(PolicyRef<'p>, Intent)>,
    deletes: Vec<(PolicyRef<'p>, Intent)>,
    /// The first pod (in node order) the out-of-service taint must not remove.
    protected: Option<Protected>,
}

fn plan_incident(
    incident: &Incident,
    policies: &[PolicyRef<'_>],
    held: &BTreeMap<&str, HoldReason>,
    input: &PlanInput<'_>,
    out: &mut Plan,
) {
    let node = incident.node.as_str();
    let Some(node_obj) = input.view.nodes.get(node) else {
        return;
    };
    // The node's policy governs the node: nothing happens there unless it judges the node
    // dead, and its hold holds every pod there.
    let Some(node_policy) = node_owner(policies, node_obj) else {
        return;
    };
    if !judged_failed(input.health, node_policy.name, node) {
        return;
    }
    let node_held = held.contains_key(node_policy.name);
    if !node_held && let holds::Settle::Wait(hold) = holds::settle(node_policy, incident, input) {
        out.intents.extend(hold);
        return;
    }
    let np = plan_pods(incident, node_obj, node_policy, policies, held, input, out);
    if node_held {
        return;
    }

    // Marks go out with the taint: they move nothing. Deletes only once the node carries a
    // taint: the writer runs actions concurrently, and a pod deleted before the taint lands may
    // have its replacement scheduled straight back onto the dead node (still Ready for the node
    // lifecycle controller for up to 50 s).
    let moving = !np.marks.is_empty() || !np.deletes.is_empty();
    let tainted = incident.tainted || NodeTaint::ALL.iter().any(|t| t.on(node_obj));
    let rehearsal = node_policy.spec.dry_run;
    let proven = taints::fence_proof(node_obj, node_policy, incident, input).is_some();
    if moving
        && !tainted
        && let Some(hold) = taints::fencing_pending(node_obj, node_policy, proven)
    {
        // A node that could still be running keeps its pods and volumes until the proof comes;
        // its agent, if it runs one and the policy takes its word, is asked to fence it.
        if let Some(ask) = taints::fence_request(node_obj, node_policy, incident) {
            out.intents
                .push(dry_run_guard(node_policy, node, ask, rehearsal));
        }
        out.intents.push(hold);
        return;
    }
    if moving && !tainted {
        out.intents.extend(taints::plan_taint(
            node,
            node_policy,
            rehearsal,
            np.protected.as_ref(),
        ));
    } else if let Some(upgrade) = taints::plan_upgrade(
        node_obj,
        node_policy,
        input.view,
        np.protected.as_ref(),
        proven,
    ) {
        // The policy changed to OutOfServiceTaint after podha fenced the node: the moved pods'
        // volumes need not wait out the attach/detach controller's 6 minutes any longer.
        out.intents
            .push(dry_run_guard(node_policy, node, upgrade, rehearsal));
    }
    for (owner, intent) in np.marks {
        out.intents.push(dry_run_guard(
            owner,
            node,
            intent,
            rehearsal || owner.spec.dry_run,
        ));
    }
    // In a rehearsal nothing is tainted: say what would be deleted all the same.
    if !tainted && !rehearsal {
        return;
    }
    for (owner, intent) in np.deletes {
        out.intents.push(dry_run_guard(
            owner,
            node,
            intent,
            rehearsal || owner.spec.dry_run,
        ));
    }
}

/// Every pod on the failed node: what moves, what is skipped and why, and what the
/// out-of-service taint must not touch.
fn plan_pods<'p>(
    incident: &Incident,
    node_obj: &Node,
    node_policy: PolicyRef<'p>,
    policies: &[PolicyRef<'p>],
    held: &BTreeMap<&str, HoldReason>,
    input: &PlanInput<'_>,
    out: &mut Plan,
) -> NodePlan<'p> {
    let view = input.view;
    let node = incident.node.as_str();
    let usable = node_usable(input.health);
    let node_held = held.contains_key(node_policy.name);
    let mut np = NodePlan {
        marks: Vec::new(),
        deletes: Vec::new(),
        protected: None,
    };
    for pod in view.pods_on(node) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if is_terminal(pod) || incident.deleted.contains(uid) {
            continue;
        }
        let key = ObjectKey::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let mut protect = |why: &'static str| {
            np.protected.get_or_insert_with(|| Protected {
                pod: key.clone(),
                why,
            });
        };
        let Some(owner) = pod_owner(policies, pod, node_obj, view) else {
            if let Some(why) = taints::unselected_protection(pod) {
                protect(why);
            }
            continue;
        };
        // The pod's own policy must see the node dead too; until it does the pod stays.
        if !judged_failed(input.health, owner.name, node) {
            protect("NodeNotJudgedDeadByItsPolicy");
            continue;
        }
        let skip = |reason| PodSkip {
            pod: key.clone(),
            uid: uid.to_string(),
            node: node.to_string(),
            policy: owner.name.to_string(),
            reason,
        };
        if node_held || held.contains_key(owner.name) {
            out.skips.push(skip(Skip::Held));
            protect("PolicyHeld");
            continue;
        }
        if !incident.pods_at_failure.contains(uid) {
            out.skips.push(skip(Skip::Replacement));
            continue;
        }
        let eligible = match eligibility::check_movable(owner.spec, pod, view, &usable) {
            Err(reason) => {
                out.skips.push(skip(Skip::Ineligible(reason)));
                if let Some(why) = taints::skip_protection(reason, pod) {
                    protect(why);
                }
                continue;
            }
            Ok(eligible) => eligible,
        };
        // The node's policy's own action and dry run already decide the taint; another
        // policy's choices must not be overruled by it.
        if owner.name != node_policy.name {
            if owner.spec.action == Action::DeletePods {
                // It chose to wait for the attach/detach controller (storage that does not
                // fence, nodes that may come back).
                protect("PolicyActionDeletePods");
            }
            if owner.spec.dry_run {
                protect("PolicyDryRun");
            }
        }
        let resource_version = if eligibility::looks_alive(pod) {
            match incident.marked_not_ready.get(uid) {
                None => {
                    let intent = Intent::MarkPodNotReady {
                        pod: key,
                        uid: uid.to_string(),
                        node: node.to_string(),
                        policy: owner.name.to_string(),
                    };
                    np.marks.push((owner, intent));
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
        np.deletes.push((owner, intent));
    }
    np
}

fn dry_run_guard(policy: PolicyRef<'_>, node: &str, intent: Intent, dry_run: bool) -> Intent {
    if dry_run {
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
