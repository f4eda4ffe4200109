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
//! Every way a volume leaves the node waits for the policy's fencing proof: the taint, and the
//! deletes of `DeletePods` or of a refused taint alike. A force-deleted pod leaves the
//! attach/detach controller's desired state, and the controller force-detaches its volume from
//! the unhealthy node 6 minutes later whatever the node still runs; a pod left alone keeps its
//! volume for as long as its statuses say Running.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use tokio::time::Instant;

use super::proof::{
    Acknowledgement, BMC_OFF_READS_APART, FenceEvidence, SilenceDoubt, agent_evidence, bmc_off,
    bmc_off_read_twice, proven, proven_without_the_node, rests_on_lease_word,
    system_uuid_shared_with,
};
use super::{
    AgentLeaseSeen, HoldReason, Incident, Intent, PlanInput, PolicyRef, Protected, dry_run_guard,
    node_usable,
};
use crate::api::{Action, FencingProof, NodeTaint, TAINT_MARKER_ANNOTATION};
use crate::contract::agent_addr;
use crate::eligibility::{
    SkipReason, claim_names, controller_ref, opted_out, spared_by_out_of_service,
};
use crate::health::ReadyStatus;
use crate::incident::PowerOff;
use crate::view::View;

/// Why the out-of-service taint on `node` would have to spare `pod` if the node died now, if
/// it would: the rules the planner applies to every pod of a dead node (below), without what
/// depends on the incident itself (which policies judged the node dead, holds, replacements).
pub fn must_stay(
    policies: &[PolicyRef<'_>],
    node_policy: PolicyRef<'_>,
    pod: &Pod,
    node: &Node,
    view: &View,
    usable: &dyn Fn(&Node) -> bool,
) -> Option<&'static str> {
    let Some(owner) = super::pod_owner(policies, pod, node, view) else {
        return unselected_protection(pod);
    };
    match crate::eligibility::check_movable(owner.spec, pod, view, usable) {
        Err(reason) => skip_protection(reason, pod),
        // As `judge_pod`: a pod of a paused policy stays.
        Ok(_) if owner.spec.paused => Some("PolicyPaused"),
        Ok(_) => super::other_policy_protection(node_policy, owner),
    }
}

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
        SkipReason::NoPersistentVolumeClaim | SkipReason::PodReady => None,
        // A pod the out-of-service taint leaves alone (tolerated for good, not terminating) is
        // neither evicted nor detached; any other that podha leaves alone must be spared.
        SkipReason::ToleratesFence if spared_by_out_of_service(pod) => None,
        SkipReason::OwnerKindNotSelected if claim_names(pod).is_empty() => None,
        other => Some(other.as_str()),
    }
}

/// The hold while the policy's fencing proof is missing; none once it is there (or the policy
/// asks for none, `fencing.proof: None`). Whatever the node gets, the out-of-service taint or
/// podha's scheduling fence (action `DeletePods`, or a refused taint), the eligible pods'
/// deletion is what lets the attach/detach controller force-detach their volumes 6 minutes
/// later, which on storage that does not fence is the very move the proof guards (a pod left
/// alone on a dead node is never detached). A silent agent whose silence proves nothing (see
/// `proof`) is held for that reason, so the user learns the proof will not come by itself.
pub(super) fn fencing_pending(
    node: &Node,
    node_policy: PolicyRef<'_>,
    check: FenceCheck,
) -> Option<Intent> {
    let fencing = &node_policy.spec.fencing;
    let reason = match check.doubt {
        Some(why) => HoldReason::AgentSilenceUnproven { why },
        None => HoldReason::FencingPending {
            proof: fencing.proofs(),
        },
    };
    (!check.proven()).then(|| Intent::Hold {
        policy: node_policy.name.to_string(),
        node: node.metadata.name.clone(),
        reason,
    })
}

/// What podha knows of the fence of an incident's node, as its policy asks.
#[derive(Clone, Copy, Debug)]
pub(super) struct FenceCheck {
    /// What proves the node fenced, if anything does yet.
    pub proof: Option<FenceEvidence>,
    /// With proof `Agent` (alone, or in `allOf`), not proven: why the agent's silence proves
    /// nothing, if it is silent.
    pub doubt: Option<SilenceDoubt>,
    /// The node renewed its Lease this many times after its fence acknowledgement, in the
    /// same boot: the fence did not take (see `proof::ACK_CONTRADICTED_BY`).
    pub contradicted: Option<u32>,
    /// The proof rests on the agent's silence counted through its Lease's word
    /// (`proof::rests_on_lease_word`): the taint goes out only with the Lease as podha saw it
    /// ([`agent_lease_seen`]).
    pub rests_on_lease_word: bool,
}

impl FenceCheck {
    pub fn proven(self) -> bool {
        self.proof.is_some()
    }
}

/// What proves the incident's node fenced for its policy, if anything does yet, and why its
/// agent's silence does not.
pub(super) fn fence_check(
    node: &Node,
    node_policy: PolicyRef<'_>,
    incident: &Incident,
    input: &PlanInput<'_>,
) -> FenceCheck {
    let agent = agent_evidence(
        &incident.node,
        input.view,
        input.heartbeats,
        input.agent_quorum_since,
        input.now,
        incident.fence_request.as_deref(),
    );
    let fencing = &node_policy.spec.fencing;
    let powered_off = still_off(incident, input);
    let proofs = fencing.proofs();
    // Only an acknowledgement of this incident's request: an older one proves nothing here,
    // and what the node did after it says nothing of this fence.
    let contradicted = match agent.acknowledgement(node) {
        Acknowledgement::Contradicted { renewals } if proofs.requests_fence() => Some(renewals),
        _ => None,
    };
    // A judgement without the kubelet's heartbeat gets here only behind a confirmed proof
    // (`unconfirmed_judgement` holds the others), which only confirmed evidence gives. After a
    // contradicted acknowledgement neither it nor the agent's silence counts: only a proof the
    // node has no part in, under `anyOf`.
    let proof = match contradicted {
        None => proven(fencing, node, agent, powered_off),
        Some(_) => proven_without_the_node(fencing, node, powered_off),
    };
    // The agent's doubt is the reason for the hold only where its proof is required: under
    // `anyOf` another proof may still come.
    let doubt =
        (proofs.requires(FencingProof::Agent) && proof.is_none() && agent_addr(node).is_some())
            .then(|| agent.silence_doubt())
            .flatten();
    FenceCheck {
        proof,
        doubt,
        contradicted,
        rests_on_lease_word: rests_on_lease_word(fencing, node, agent, powered_off, proof),
    }
}

/// What a taint that `check` allows must find of the node's agent Lease when it goes out, if
/// anything: the version podha's view holds, when the proof rests on the Lease's word.
pub(super) fn agent_lease_seen(
    check: FenceCheck,
    node: &str,
    view: &View,
) -> Option<AgentLeaseSeen> {
    check.rests_on_lease_word.then(|| AgentLeaseSeen {
        resource_version: view
            .agent_adverts
            .get(node)
            .and_then(|advert| advert.resource_version.clone()),
    })
}

/// Whether the node's BMC proves the machine off, as podha has heard the node since
/// (`proof::bmc_off`).
fn still_off(incident: &Incident, input: &PlanInput<'_>) -> bool {
    bmc_off(incident.power_off, input.heartbeats.get(&incident.node))
}

/// With proof `BMC`: whether the next read of the node's power is due. The reads go on until
/// two say `Off` far enough apart; the second waits out [`BMC_OFF_READS_APART`] after the
/// first (asked earlier it would only be sent again).
fn power_read_due(power_off: &PowerOff, now: Instant) -> bool {
    if bmc_off_read_twice(power_off).is_some() {
        return false;
    }
    power_off
        .off_reads
        .is_none_or(|r| now >= r.first + BMC_OFF_READS_APART)
}

/// The hold of a node whose acknowledged fence its kubelet contradicts: nothing more is done
/// there, whether or not the taint is on (the pods still there stay with their volumes), until
/// a proof the node has no part in comes (under `anyOf`: the BMC's `Off`, which podha still
/// asks for).
pub(super) fn fence_contradicted(
    node: &Node,
    node_policy: PolicyRef<'_>,
    check: FenceCheck,
) -> Option<Intent> {
    let unproven = check.contradicted.filter(|_| check.proof.is_none());
    unproven.map(|renewals| Intent::Hold {
        policy: node_policy.name.to_string(),
        node: node.metadata.name.clone(),
        reason: HoldReason::FenceContradicted { renewals },
    })
}

/// Whether the incident's node carries a taint its pods may be deleted under: the one this
/// incident put on, or one found on the node (an earlier process's or replica's, for this
/// failure) once the policy's fencing proof is there. A taint left from an earlier
/// failure (podha's scheduling fence, whose volumes never moved and whose node nothing proved
/// fenced) must not let this incident delete pods without the proof its policy asks for.
pub(super) fn tainted_for(incident: &Incident, node: &Node, proven: bool) -> bool {
    incident.tainted.is_some() || (NodeTaint::ALL.iter().any(|t| t.on(node)) && proven)
}

/// The fences to ask for while the proof is missing, one per proof asked for (under `anyOf`
/// and `allOf` all at once): on the Node once per incident, for the `Agent` proofs only of a
/// node that runs an agent, for `External` of any (the user's fence controller answers); for
/// `BMC`, of the node's BMC (see [`power_off`]). A request not yet accepted is asked only if
/// `may_ask_anew` (no pause, the settle rule passed); the reads of a `ForceOff` accepted go on.
pub(super) fn fence_requests(
    node: &Node,
    node_policy: PolicyRef<'_>,
    incident: &Incident,
    input: &PlanInput<'_>,
    may_ask_anew: bool,
) -> Vec<Intent> {
    let proofs = node_policy.spec.fencing.proofs();
    let mut asks = Vec::new();
    if proofs.asks(FencingProof::Bmc) && (may_ask_anew || incident.power_off.is_some()) {
        asks.extend(power_off(node, node_policy, incident, input));
    }
    if proofs.requests_fence()
        && may_ask_anew
        && incident.fence_request.is_none()
        && (proofs.asks(FencingProof::External) || agent_addr(node).is_some())
    {
        asks.push(Intent::RequestFence {
            node: incident.node.clone(),
            policy: node_policy.name.to_string(),
        });
    }
    asks
}

/// With proof `BMC`: the `ForceOff`, until the node's BMC accepts one in this incident, then
/// the reads of its power state, until two say `Off` [`BMC_OFF_READS_APART`] apart (each sent
/// again by the action's backoff). Nothing for a node whose Secret has no name
/// (`fencing.bmc.secretNameLabel` missing on the Node), nor, under `matchSystemUUID`, for one
/// whose system UUID another node reports too (it binds neither to its BMC): the hold says the
/// proof is missing, and `podha explain` why.
fn power_off(
    node: &Node,
    node_policy: PolicyRef<'_>,
    incident: &Incident,
    input: &PlanInput<'_>,
) -> Option<Intent> {
    let bmc = node_policy.spec.fencing.bmc.as_ref()?;
    let secret = bmc.secret_for(node)?;
    let system_uuid = bmc.expected_uuid(node);
    if system_uuid.is_some() && system_uuid_shared_with(input.view, &incident.node, node).is_some()
    {
        return None;
    }
    let (node, policy) = (incident.node.clone(), node_policy.name.to_string());
    match incident.power_off {
        None => Some(Intent::PowerOff {
            lease_seen: input.heartbeats.get(&node).and_then(|hb| hb.renew_time),
            node,
            policy,
            secret,
            system_uuid,
        }),
        Some(p) if power_read_due(&p, input.now) => Some(Intent::ConfirmPowerOff {
            node,
            policy,
            secret,
            system_uuid,
        }),
        Some(_) => None,
    }
}

/// With `fencing.bmc.powerCycle`: the `On`, once per incident, of a machine podha powered off,
/// after the BMC proved it off and the failover is done (the moved pods' volumes detached from
/// the node and their replacements running). Under `anyOf`, another proof may have let the
/// taint on before the BMC said `Off`: its power is read from then on until it does, twice, so
/// that the `Off` is seen soon after the `ForceOff`. Nothing for a machine that booted again
/// since it was judged dead, and no `On` for one heard from after the BMC said `Off` (its
/// Lease renewed, a probe answered): someone powered it on, and decides what follows.
pub(super) fn power_on(
    node: &Node,
    node_policy: PolicyRef<'_>,
    incident: &Incident,
    input: &PlanInput<'_>,
) -> Option<Intent> {
    let fencing = &node_policy.spec.fencing;
    let bmc = fencing.bmc.as_ref().filter(|b| b.power_cycle)?;
    let power_off = incident.power_off?;
    // Only a machine podha switched off: one found off was switched off by someone else (a
    // repair, a thermal trip), who alone may switch it on. Not while the policy or the node is
    // paused: someone is working on the machine (it is switched on once the pause ends).
    let paused = node_policy.spec.paused || crate::api::node_paused(node);
    let ours = !paused
        && !incident.rebooted(node)
        && fencing.proofs().asks(FencingProof::Bmc)
        && power_off.by_podha
        && power_off.on_requested_at.is_none();
    let secret = bmc.secret_for(node).filter(|_| ours)?;
    let (node_name, policy, system_uuid) = (
        incident.node.clone(),
        node_policy.name.to_string(),
        bmc.expected_uuid(node),
    );
    match bmc_off_read_twice(&power_off) {
        // Before the taint the proof's own reads go out (`power_off`).
        None if incident.tainted.is_some() && power_read_due(&power_off, input.now) => {
            Some(Intent::ConfirmPowerOff {
                node: node_name,
                policy,
                secret,
                system_uuid,
            })
        }
        Some(_) if incident.recovered_at.is_some() && still_off(incident, input) => {
            Some(Intent::PowerOn {
                node: node_name,
                policy,
                secret,
                system_uuid,
            })
        }
        _ => None,
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
    let wanted = NodeTaint::for_action(node_policy.spec.action);
    let mut out = Vec::new();
    let taint = match (wanted, protected) {
        (NodeTaint::OutOfService, Some(p)) => {
            out.push(Intent::Hold {
                policy: node_policy.name.to_string(),
                node: Some(node_name.to_string()),
                reason: HoldReason::OutOfServiceRefused {
                    pod: p.pod.clone(),
                    why: p.why,
                },
            });
            NodeTaint::Fence
        }
        (taint, _) => taint,
    };
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
