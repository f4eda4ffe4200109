//! Whether an incident's node is proven fenced, as its policy's `fencing.proof` asks, and what
//! podha asks for while it is not: the fence requests on the Node, the BMC's `ForceOff` and its
//! reads, the hold that says what is missing; and the BMC's `On` once the failover is done.
//! The proofs themselves are read in `proof.rs`.
//!
//! Every way a volume leaves the node waits for the proof: the taint, and the deletes of
//! `DeletePods` or of a refused taint alike. A force-deleted pod leaves the attach/detach
//! controller's desired state, and the controller force-detaches its volume from the unhealthy
//! node 6 minutes later whatever the node still runs; a pod left alone keeps its volume for as
//! long as its statuses say Running.

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use super::proof::{
    Acknowledgement, BMC_OFF_READS_APART, FenceEvidence, SilenceDoubt, agent_evidence, bmc_off,
    bmc_off_read_twice, proven, proven_without_the_node, rests_on_agent_silence,
    system_uuid_shared_with,
};
use super::{AgentLeaseSeen, HoldReason, Incident, Intent, PlanInput, PolicyRef};
use crate::api::{Fencing, FencingProof};
use crate::contract::agent_addr;
use crate::incident::PowerOff;
use crate::view::View;

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
    /// The proof rests on the agent's silence, counted from the last renewal of its Lease podha
    /// saw (`proof::rests_on_agent_silence`): the taint goes out only with the Lease as podha
    /// saw it ([`agent_lease_seen`]).
    pub rests_on_agent_silence: bool,
}

impl FenceCheck {
    pub fn proven(self) -> bool {
        self.proof.is_some()
    }

    /// A foreseen death's proof: whether it comes depends on the death itself, so the round
    /// takes it as given (it counts as no proof asked for: nothing confirmed, nothing read).
    pub fn taken_as_given() -> Self {
        Self {
            proof: Some(FenceEvidence::NotAsked),
            doubt: None,
            contradicted: None,
            rests_on_agent_silence: false,
        }
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
        rests_on_agent_silence: rests_on_agent_silence(fencing, node, agent, powered_off, proof),
    }
}

/// What a taint that `check` allows must find of the node's agent Lease when it goes out, if
/// anything: the version podha's view holds, when the proof rests on the agent's silence.
pub(super) fn agent_lease_seen(
    check: FenceCheck,
    node: &str,
    view: &View,
) -> Option<AgentLeaseSeen> {
    check.rests_on_agent_silence.then(|| AgentLeaseSeen {
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
            lease_seen: input
                .heartbeats
                .get(&incident.node)
                .and_then(|hb| hb.renew_time),
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
    let (secret, system_uuid) =
        bmc_target(&node_policy.spec.fencing, &incident.node, node, input.view).ok()?;
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

/// Why podha cannot reach a node's BMC, as its policy's `fencing.bmc` finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BmcGap {
    /// The policy has no `fencing.bmc`.
    NotConfigured,
    /// Nothing names the node's Secret: no `fencing.bmc.secretName`, and the label
    /// `fencing.bmc.secretNameLabel` names is not on the Node (or none is named).
    NoSecretName,
    /// Under `matchSystemUUID`, node `with` reports the same system UUID: it binds neither node
    /// to its BMC (firmware that gives many boards one UUID, a cloned VM), and a Secret with
    /// the other machine's address would pass the check.
    SharedSystemUuid { with: String },
}

/// The node's BMC as podha reaches it: the name of its Secret, and the system UUID the BMC
/// must report (under `matchSystemUUID`); or why podha cannot, which holds a node judged dead
/// for good under the `BMC` proof.
pub fn bmc_target(
    fencing: &Fencing,
    name: &str,
    node: &Node,
    view: &View,
) -> Result<(String, Option<String>), BmcGap> {
    let bmc = fencing.bmc.as_ref().ok_or(BmcGap::NotConfigured)?;
    let secret = bmc.secret_for(node).ok_or(BmcGap::NoSecretName)?;
    let system_uuid = bmc.expected_uuid(node);
    if system_uuid.is_some()
        && let Some(other) = system_uuid_shared_with(view, name, node)
    {
        return Err(BmcGap::SharedSystemUuid {
            with: other.to_string(),
        });
    }
    Ok((secret, system_uuid))
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
