//! Which taint a failed node gets, and when podha takes it off again.
//!
//! The out-of-service taint acts on the whole node: the taint-eviction controller and pod GC
//! delete **every** pod there that does not tolerate it, and the attach/detach controller
//! detaches every volume at once. So podha puts it on only when nothing on the node would be
//! harmed by that: no pod that podha's rules say must stay (no controller owner, opted out, a
//! volume podha's policy does not cover, a policy that holds, rehearses or chose `DeletePods`).
//! With such a pod on the node, podha fences the node for the scheduler instead, deletes only
//! the eligible pods, and reports the refused taint as a hold: their volumes then detach after
//! the attach/detach controller's 6-minute wait.
//!
//! Every way a volume leaves the node waits for the policy's fencing proof (`fencing.rs`).

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::fencing::{FenceCheck, agent_lease_seen};
use super::{
    AgentLeaseSeen, HoldReason, Incident, Intent, PlanInput, PolicyRef, Protected, dry_run_guard,
    node_usable,
};
use crate::api::{Action, NodeTaint, TAINT_MARKER_ANNOTATION};
use crate::eligibility::{
    SkipReason, claim_names, controller_ref, opted_out, spared_by_out_of_service,
};
use crate::health::ReadyStatus;
use crate::view::View;

/// Why the out-of-service taint would wrongly remove a pod no policy selects, if it would.
pub(super) fn unselected_protection(pod: &Pod) -> Option<&'static str> {
    if controller_ref(pod).is_none() {
        Some("NoControllerOwner")
    } else if opted_out(pod) {
        Some("OptedOut")
    } else if !claim_names(pod).is_empty() {
        // Its volume would be detached under it, on storage no policy vouches for.
        Some("NotSelected")
    } else {
        // A stateless pod with a controller: the taint only evicts it before the node
        // lifecycle controller would (300 s), and its controller replaces it.
        None
    }
}

/// Why the out-of-service taint would wrongly remove a pod its policy leaves alone for
/// `reason`, if it would.
pub(super) fn skip_protection(reason: SkipReason, pod: &Pod) -> Option<&'static str> {
    match reason {
        SkipReason::NoPersistentVolumeClaim => None,
        // A pod the out-of-service taint leaves alone (tolerated for good, not terminating) is
        // neither evicted nor detached; any other that podha leaves alone must be spared.
        SkipReason::ToleratesFence if spared_by_out_of_service(pod) => None,
        SkipReason::OwnerKindNotSelected if claim_names(pod).is_empty() => None,
        other => Some(other.as_str()),
    }
}

/// Whether the incident's node carries a taint its pods may be deleted under: the one this
/// incident put on, or one found on the node (an earlier process's or replica's, for this
/// failure) once the policy's fencing proof is there. A taint left from an earlier
/// failure (podha's scheduling fence, whose volumes never moved and whose node nothing proved
/// fenced) must not let this incident delete pods without the proof its policy asks for.
pub(super) fn tainted_for(incident: &Incident, node: &Node, proven: bool) -> bool {
    incident.tainted.is_some() || (NodeTaint::ALL.iter().any(|t| t.on(node)) && proven)
}

/// The taint a failed node gets under `node_policy`: the one its action asks for, but the
/// scheduling fence instead of the out-of-service taint while `protected` must stay.
pub(super) fn taint_for(node_policy: PolicyRef<'_>, protected: Option<&Protected>) -> NodeTaint {
    match NodeTaint::for_action(node_policy.spec.action) {
        NodeTaint::OutOfService if protected.is_some() => NodeTaint::Fence,
        wanted => wanted,
    }
}

/// The node's taint, before any pod moves, as decided by the node's policy: the out-of-service
/// taint (volumes detach at once) or the scheduling fence (without it, a pod deleted before the
/// node lifecycle controller taints the node unreachable may be scheduled right back onto the
/// dead node). Wanted only when at least one pod will move: otherwise a taint would only
/// disturb pods podha leaves alone. Returns the intents: the taint, and the hold that says why
/// the out-of-service taint was refused.
pub(super) fn plan_taint(
    node_name: &str,
    node_policy: PolicyRef<'_>,
    dry_run: bool,
    protected: Option<&Protected>,
    agent_lease_seen: Option<AgentLeaseSeen>,
) -> Vec<Intent> {
    let taint = taint_for(node_policy, protected);
    let mut out = Vec::new();
    if let Some(p) = protected.filter(|_| taint != NodeTaint::for_action(node_policy.spec.action)) {
        out.push(Intent::Hold {
            policy: node_policy.name.to_string(),
            node: Some(node_name.to_string()),
            reason: HoldReason::OutOfServiceRefused {
                pod: p.pod.clone(),
                why: p.why,
            },
        });
    }
    let intent = Intent::TaintNode {
        node: node_name.to_string(),
        policy: node_policy.name.to_string(),
        taint,
        agent_lease_seen,
    };
    out.push(dry_run_guard(node_policy, node_name, intent, dry_run));
    out
}

/// A node podha fenced (action `DeletePods` at the time) whose policy now says
/// `OutOfServiceTaint`: while a volume of a pod that moved away is still attached there, the
/// out-of-service taint lets it go at once. Refused, like the first taint, while a pod that
/// must stay is on the node, and held while the policy's proof is missing: both as holds, so
/// the decision not to taint is reported the round it is made.
pub(super) fn plan_upgrade(
    node: &Node,
    node_policy: PolicyRef<'_>,
    view: &View,
    protected: Option<&Protected>,
    check: FenceCheck,
) -> Option<Intent> {
    let name = node.metadata.name.as_deref()?;
    let fenced_by_podha =
        NodeTaint::Fence.on(node) && node.annotations().contains_key(TAINT_MARKER_ANNOTATION);
    let waiting = view
        .attachments_on(name)
        .iter()
        .any(|va| protects_moved_volume(va, name, view));
    let wanted = node_policy.spec.action == Action::OutOfServiceTaint
        && fenced_by_podha
        && !NodeTaint::OutOfService.on(node)
        && waiting;
    if !wanted {
        return None;
    }
    let hold = |reason| Intent::Hold {
        policy: node_policy.name.to_string(),
        node: Some(name.to_string()),
        reason,
    };
    // Not done is said, not kept quiet: the refusal or the missing proof, as for a first taint.
    Some(match protected {
        Some(p) => hold(HoldReason::OutOfServiceRefused {
            pod: p.pod.clone(),
            why: p.why,
        }),
        None if !check.proven() => hold(HoldReason::UpgradeAwaitsProof {
            proof: node_policy.spec.fencing.proofs(),
        }),
        None => Intent::TaintNode {
            node: name.to_string(),
            policy: node_policy.name.to_string(),
            taint: NodeTaint::OutOfService,
            agent_lease_seen: agent_lease_seen(check, name, view),
        },
    })
}

/// Untaint nodes podha tainted once they are back (Ready, its Lease renewed since this process
/// saw the taint, judged Healthy by every policy that watches them) and no volume of a pod that
/// moved away is still attached there. The taint protects the moved pods' volumes: a
/// VolumeAttachment that serves a pod bound to the node (one podha left alone, back with its
/// node), or that is no claim's, keeps nothing waiting.
pub(super) fn plan_untaints(
    policies: &[PolicyRef<'_>],
    input: &PlanInput<'_>,
    out: &mut Vec<Intent>,
) {
    let usable = node_usable(input.health);
    for (name, node) in &input.view.nodes {
        let marked = node.annotations().contains_key(TAINT_MARKER_ANNOTATION);
        if !marked || !NodeTaint::ALL.iter().any(|t| t.on(node)) {
            continue;
        }
        let back = input
            .heartbeats
            .get(name.as_str())
            .is_some_and(|hb| hb.renewed_since_tainted());
        if ReadyStatus::from_node(node) != ReadyStatus::True
            || !back
            || !usable(node)
            || input
                .view
                .attachments_on(name)
                .iter()
                .any(|va| protects_moved_volume(va, name, input.view))
        {
            continue;
        }
        let intent = Intent::RemoveTaint { node: name.clone() };
        match super::node_owner(policies, node) {
            Some(owner) => out.push(dry_run_guard(owner, name, intent, owner.spec.dry_run)),
            // The policy that tainted the node is gone: clean up rather than strand the taint.
            None => out.push(intent),
        }
    }
}

/// Whether the VolumeAttachment `va` on `node` is for a claim's volume that no pod bound to
/// `node` mounts: a volume podha may have moved away, which the taint protects until it is
/// detached. The claim is the PV's `claimRef`, or the claim bound to the PV. An attachment
/// podha cannot trace to a claim (an inline volume, a PV without a claim or one that is gone)
/// is no moved pod's (podha moves only pods whose claims it reads): it keeps no taint on a node
/// that is back, where it would otherwise wait for a detach nothing asks for.
fn protects_moved_volume(va: &VolumeAttachment, node: &str, view: &View) -> bool {
    let Some((namespace, claim)) = va
        .spec
        .source
        .persistent_volume_name
        .as_deref()
        .and_then(|pv| attached_claim(pv, view))
    else {
        return false;
    };
    !view.pods_on(node).iter().any(|pod| {
        pod.metadata.namespace.as_deref() == Some(namespace)
            && claim_names(pod).iter().any(|n| n == claim)
    })
}

/// The claim (namespace, name) of the PV `pv`: its `claimRef`, or a claim bound to it.
fn attached_claim<'v>(pv: &str, view: &'v View) -> Option<(&'v str, &'v str)> {
    let by_ref = view
        .pv(pv)
        .and_then(|pv| pv.spec.as_ref())
        .and_then(|spec| spec.claim_ref.as_ref())
        .and_then(|c| Some((c.namespace.as_deref()?, c.name.as_deref()?)));
    by_ref.or_else(|| {
        view.pvcs.iter().find_map(|(key, pvc)| {
            let bound = pvc.spec.as_ref()?.volume_name.as_deref() == Some(pv);
            bound.then_some((key.namespace.as_str(), key.name.as_str()))
        })
    })
}
