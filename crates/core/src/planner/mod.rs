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
//! - **Pause** (`spec.paused`, or the Node annotation `podha.io/paused`): no new action on a
//!   dead node and no would-be action reported, only the hold; a failover podha acted on
//!   already finishes what it started (no half-done failover), and untaints go on.
//! - **One action per incident.** A pod is deleted only if it was on the node when the incident
//!   opened (later pods are replacements) and was not deleted already; a node is tainted once.
//! - **Stale readiness.** A pod still Ready on a dead node shows what the dead kubelet last
//!   wrote. The node lifecycle controller marks such pods NotReady only after its grace period
//!   (50 s by default); podha marks the pods it will move NotReady as soon as it judges the node
//!   dead (before the taint: a mark moves nothing), and deletes each one in the version its mark
//!   produced, or once the watch shows it not Ready. A pod that changed after podha marked it
//!   and is Ready again is left alone: something alive keeps reporting it.
//! - **Taint eviction first** (see `eviction.rs`): under the out-of-service taint, podha's
//!   delete waits (at most `TAINT_EVICTION_WAIT`) for Kubernetes' own, which goes by name and
//!   would otherwise hit the replacement.
//! - **Taint first.** A pod is deleted only once its node's taint is on: the taint this
//!   incident put on (ledger), or one found on the node once the policy's fencing proof is
//!   there (see `taints::tainted_for`); a replacement created before could be scheduled
//!   straight back onto the dead node.
//! - **Proof before any move.** Under either action, nothing is tainted, marked or deleted on
//!   a dead node until the policy's fencing proof is there (see `fencing::fencing_pending`): a
//!   force-deleted pod's volume is force-detached 6 minutes later whatever the node still runs.

mod eviction;
mod fencing;
mod foresight;
mod holds;
mod intent;
mod ownership;
pub mod proof;
mod taints;
mod verdict;
mod withdrawals;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use tokio::time::Instant;

pub use eviction::TAINT_EVICTION_WAIT;
pub use fencing::{BmcGap, bmc_target};
pub use foresight::{Seen, foresee};
pub use holds::{Heartbeat, Heartbeats, unhealthy_hold};
pub use intent::{AgentLeaseSeen, HoldKind, HoldReason, Intent, taint_key};
pub use ownership::{node_owner, pod_owner};
pub use verdict::{NodeVerdict, PodVerdict, Ruling};

use crate::api::{Action, PodHAPolicySpec};
use crate::eligibility::{self, SkipReason};
use crate::health::NodeHealth;
use crate::incident::{Incident, Ledger};
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
    /// Policies podha cannot read (`crate::api::ListedPolicy`): their selectors are unknown.
    pub unreadable: &'a [String],
    /// Since when podha has heard enough agents without a break (`proof::agent_quorum`);
    /// `None` while it does not.
    pub agent_quorum_since: Option<Instant>,
    pub now: Instant,
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
    /// Its policy is paused (`spec.paused`).
    Paused,
}

impl Skip {
    /// Label value for `podha_pods_skipped_total{reason}`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ineligible(reason) => reason.as_str(),
            Self::Replacement => "Replacement",
            Self::Held => "Held",
            Self::Paused => "Paused",
        }
    }
}

/// The outcome of one planning round. A pod's delete is planned only once its node's taint is
/// on (recorded in the ledger or seen on the node) and, for a pod still Ready, its mark has
/// landed, so no two intents of a round depend on each other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub intents: Vec<Intent>,
    /// Every failed node the round judged, and its pods (see [`NodeVerdict`]).
    pub verdicts: Vec<NodeVerdict>,
}

impl Plan {
    /// The pods the round leaves where they are on their failed nodes, with why, as its
    /// verdicts say (a pod no policy selects, or whose policy does not judge the node dead,
    /// is not its to skip).
    pub fn skips(&self) -> impl Iterator<Item = PodSkip> + '_ {
        self.verdicts.iter().flat_map(|node| {
            node.pods.iter().filter_map(move |pod| {
                let reason = match &pod.ruling {
                    Ruling::Skipped(skip) => *skip,
                    Ruling::Held(_) => Skip::Held,
                    _ => return None,
                };
                Some(PodSkip {
                    pod: pod.pod.clone(),
                    uid: pod.uid.clone(),
                    node: node.node.clone(),
                    policy: pod.policy.clone()?,
                    reason,
                })
            })
        })
    }
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
        plan_incident(incident, &policies, &held, input, Round::Live, &mut out);
    }
    taints::plan_untaints(&policies, input, &mut out.intents);
    withdrawals::plan_contradictions(input, &mut out.intents);
    withdrawals::plan_withdrawals(input, &mut out.intents);
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
    verdicts: Vec<PodVerdict>,
}

/// Whether a round plans for the cluster as it is, or foresees a death (see `foresight.rs`):
/// then the node's fencing proof is taken as given, since it depends on the death itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Live,
    Foreseen,
}

/// A failed node and the policy that governs it, as one round sees them.
struct FailedNode<'a, 'p> {
    incident: &'a Incident,
    node: &'a Node,
    policy: PolicyRef<'p>,
    policies: &'a [PolicyRef<'p>],
    held: &'a BTreeMap<&'a str, HoldReason>,
    input: &'a PlanInput<'a>,
}

impl FailedNode<'_, '_> {
    fn name(&self) -> &str {
        &self.incident.node
    }

    /// The node's policy holds every action on the node.
    fn held(&self) -> bool {
        self.held.contains_key(self.policy.name)
    }

    /// A dry run of the node's policy rehearses every action on the node.
    fn rehearsal(&self) -> bool {
        self.policy.spec.dry_run
    }

    /// The round's verdict on the node: `hold` stops it, `np` judged its pods.
    fn verdict(&self, hold: Option<HoldReason>, np: Option<&mut NodePlan<'_>>) -> NodeVerdict {
        let (spared, pods) = np.map_or((None, Vec::new()), |np| {
            (np.protected.clone(), std::mem::take(&mut np.verdicts))
        });
        NodeVerdict {
            node: self.name().to_string(),
            policy: self.policy.name.to_string(),
            hold,
            rehearsed: self.rehearsal(),
            taint: taints::taint_for(self.policy, spared.as_ref()),
            spared,
            pods,
        }
    }
}

/// The reason of a hold intent.
fn hold_reason(intent: &Intent) -> Option<HoldReason> {
    match intent {
        Intent::Hold { reason, .. } => Some(reason.clone()),
        _ => None,
    }
}

fn plan_incident<'p>(
    incident: &Incident,
    policies: &[PolicyRef<'p>],
    held: &BTreeMap<&str, HoldReason>,
    input: &PlanInput<'_>,
    round: Round,
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
    let failed = FailedNode {
        incident,
        node: node_obj,
        policy: node_policy,
        policies,
        held,
        input,
    };
    let stopped = paused(node_policy, node_obj, incident)
        .or_else(|| unconfirmed_judgement(node_policy, incident));
    if let Some(hold) = stopped {
        out.verdicts.push(failed.verdict(hold_reason(&hold), None));
        out.intents.push(hold);
        return;
    }
    if !failed.held()
        && let holds::Settle::Wait(hold) = holds::settle(node_policy, incident, input)
    {
        out.verdicts
            .push(failed.verdict(hold.as_ref().and_then(hold_reason), None));
        out.intents.extend(hold);
        return;
    }
    let mut np = plan_pods(&failed);
    if failed.held() {
        let hold = failed.held.get(node_policy.name).cloned();
        out.verdicts.push(failed.verdict(hold, Some(&mut np)));
        return;
    }
    if let Some(on) = fencing::power_on(node_obj, node_policy, incident, input) {
        out.intents
            .push(dry_run_guard(node_policy, node, on, failed.rehearsal()));
    }
    // Marks go out before the taint (see `plan_fence`): they move nothing. Deletes only once
    // the node carries a taint: the writer runs actions concurrently, and a pod deleted before
    // the taint lands may have its replacement scheduled straight back onto the dead node
    // (still Ready for the node lifecycle controller for up to 50 s).
    let check = match round {
        Round::Live => fencing::fence_check(node_obj, node_policy, incident, input),
        Round::Foreseen => fencing::FenceCheck::taken_as_given(),
    };
    if let Some(hold) = fencing::fence_contradicted(node_obj, node_policy, check) {
        // Under `anyOf`, the BMC may still prove what the acknowledgement did not.
        ask_for_fences(&failed, &np, out);
        out.verdicts
            .push(failed.verdict(hold_reason(&hold), Some(&mut np)));
        out.intents.push(hold);
        return;
    }
    // A taint found on the node counts with the proof, but not with one resting on the agent's
    // silence: the taint is planned again, and goes out (or is found done) only after the
    // agent's Lease is read (see `Intent::TaintNode`).
    let tainted = taints::tainted_for(
        incident,
        node_obj,
        check.proven() && !check.rests_on_agent_silence,
    );
    let hold = plan_fence(&failed, &np, tainted, check, out);
    let fenced = hold.is_none();
    out.verdicts.push(failed.verdict(hold, Some(&mut np)));
    if fenced {
        plan_moves(&failed, np, tainted, out);
    }
}

/// The marks, and once the node carries its taint the deletes, each as a rehearsal where a dry
/// run says so.
fn plan_moves(failed: &FailedNode<'_, '_>, np: NodePlan<'_>, tainted: bool, out: &mut Plan) {
    let rehearsal = failed.rehearsal();
    let node = failed.name();
    for (owner, intent) in np.marks {
        let dry_run = rehearsal || owner.spec.dry_run;
        out.intents
            .push(dry_run_guard(owner, node, intent, dry_run));
    }
    // In a rehearsal nothing is tainted: say what would be deleted all the same.
    if !tainted && !rehearsal {
        return;
    }
    for (owner, intent) in np.deletes {
        let dry_run = rehearsal || owner.spec.dry_run;
        out.intents
            .push(dry_run_guard(owner, node, intent, dry_run));
    }
}

/// The hold of a node whose policy or own annotation pauses podha, unless podha acted there
/// already: a failover under way finishes what it started.
fn paused(node_policy: PolicyRef<'_>, node: &Node, incident: &Incident) -> Option<Intent> {
    let by_node = crate::api::node_paused(node);
    ((by_node || node_policy.spec.paused) && !incident.acted()).then(|| Intent::Hold {
        policy: node_policy.name.to_string(),
        node: Some(incident.node.clone()),
        reason: HoldReason::Paused { by_node },
    })
}

/// The hold of a node judged dead without the kubelet's heartbeat (signals without Lease and
/// NodeReady) by a policy that does not put the out-of-service taint behind a confirmed proof:
/// a fault between podha and the node alone looks the same, and nothing may move on it. The
/// CRD refuses such a policy; this keeps one admitted by a CRD without that rule from acting
/// (a `DeletePods` policy would delete the pods of a node that runs on).
fn unconfirmed_judgement(node_policy: PolicyRef<'_>, incident: &Incident) -> Option<Intent> {
    let spec = node_policy.spec;
    let guarded = spec.detection.watches_kubelet_heartbeat()
        || (spec.action == Action::OutOfServiceTaint && spec.fencing.is_confirmed());
    (!guarded).then(|| Intent::Hold {
        policy: node_policy.name.to_string(),
        node: Some(incident.node.clone()),
        reason: HoldReason::FencingPending {
            proof: spec.fencing.proofs(),
        },
    })
}

/// The fences the node's policy asks for while its proof is missing: its agent, if it runs one
/// and the policy takes its word, is asked to fence it, or its BMC to power it off. Only for a
/// pod that would move for real: a pod whose policy only rehearses (`dryRun`) asks nothing of
/// the machine (a rehearsing node policy says what it would ask).
fn ask_for_fences(failed: &FailedNode<'_, '_>, np: &NodePlan<'_>, out: &mut Plan) {
    let (node, node_obj, policy) = (failed.name(), failed.node, failed.policy);
    let rehearsal = failed.rehearsal();
    let moving_for_real = rehearsal
        || np
            .marks
            .iter()
            .chain(&np.deletes)
            .any(|(owner, _)| !owner.spec.dry_run);
    // A node that rebooted since it was judged dead is coming back: its new boot is asked for
    // nothing (the reboot ended the boot podha judged) and waits to be heard again.
    if !moving_for_real || failed.incident.rebooted(node_obj) {
        return;
    }
    // A request not yet accepted is a new action: not while a pause or the settle wait would
    // hold a first one (under `anyOf`, another request's acceptance already counts as acting).
    let paused = policy.spec.paused || crate::api::node_paused(node_obj);
    let may_ask_anew = !paused
        && matches!(
            holds::settled(policy, failed.incident, failed.input),
            holds::Settle::Go
        );
    let asks = fencing::fence_requests(
        node_obj,
        policy,
        failed.incident,
        failed.input,
        may_ask_anew,
    );
    out.intents.extend(
        asks.into_iter()
            .map(|ask| dry_run_guard(policy, node, ask, rehearsal)),
    );
}

/// The fence before anything moves: the taint, or, while the policy's fencing proof is not on
/// the node, a hold (and a fence request to its agent). Returns that hold, which keeps the pods
/// from being planned this round, if there is one.
fn plan_fence(
    failed: &FailedNode<'_, '_>,
    np: &NodePlan<'_>,
    tainted: bool,
    check: fencing::FenceCheck,
    out: &mut Plan,
) -> Option<HoldReason> {
    let (node, node_obj, policy) = (failed.name(), failed.node, failed.policy);
    let rehearsal = failed.rehearsal();
    let moving = !np.marks.is_empty() || !np.deletes.is_empty();
    if moving
        && !tainted
        && let Some(hold) = fencing::fencing_pending(node_obj, policy, check)
    {
        // A node that could still be running keeps its pods and volumes until the proof comes.
        ask_for_fences(failed, np, out);
        let reason = hold_reason(&hold);
        out.intents.push(hold);
        return reason;
    }
    // The taint once every mark landed: a pod updated on a node with the out-of-service taint
    // has the taint eviction controller queue its delete by name again (see `eviction`). A
    // mark that only a rehearsal would send (its pod's policy in `dryRun`) never lands, and a
    // rehearsing node policy says both at once.
    let marks_pending = np.marks.iter().any(|(owner, _)| !owner.spec.dry_run);
    if moving && !tainted && (!marks_pending || rehearsal) {
        out.intents.extend(taints::plan_taint(
            node,
            policy,
            rehearsal,
            np.protected.as_ref(),
            fencing::agent_lease_seen(check, node, failed.input.view),
        ));
    } else if let Some(upgrade) = taints::plan_upgrade(
        node_obj,
        policy,
        failed.input.view,
        np.protected.as_ref(),
        check,
    ) {
        // The policy changed to OutOfServiceTaint after podha fenced the node: the moved pods'
        // volumes need not wait out the attach/detach controller's 6 minutes any longer.
        out.intents.push(match upgrade {
            hold @ Intent::Hold { .. } => hold,
            taint => dry_run_guard(policy, node, taint, rehearsal),
        });
    }
    None
}

/// What one round decides about one pod on the failed node.
struct PodDecision<'p> {
    ruling: Ruling,
    /// Why the out-of-service taint must not remove the pod.
    protect: Option<&'static str>,
    mark: Option<(PolicyRef<'p>, Intent)>,
    delete: Option<(PolicyRef<'p>, Intent)>,
}

impl<'p> PodDecision<'p> {
    fn stays(ruling: Ruling, protect: Option<&'static str>) -> Self {
        Self {
            ruling,
            protect,
            mark: None,
            delete: None,
        }
    }
}

/// Every pod on the failed node: what moves, what is skipped and why, and what the
/// out-of-service taint must not touch.
fn plan_pods<'p>(failed: &FailedNode<'_, 'p>) -> NodePlan<'p> {
    let usable = node_usable(failed.input.health);
    let mut np = NodePlan {
        marks: Vec::new(),
        deletes: Vec::new(),
        protected: None,
        verdicts: Vec::new(),
    };
    for pod in failed.input.view.pods_on(failed.name()) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        if is_terminal(pod) || failed.incident.deleted.contains(uid) {
            continue;
        }
        let key = ObjectKey::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let owner = pod_owner(failed.policies, pod, failed.node, failed.input.view);
        let decision = judge_pod(failed, owner, pod, uid, &key, &usable);
        if let Some(why) = decision.protect {
            np.protected.get_or_insert(Protected {
                pod: key.clone(),
                why,
            });
        }
        np.verdicts.push(PodVerdict {
            pod: key,
            uid: uid.to_string(),
            policy: owner.map(|o| o.name.to_string()),
            ruling: decision.ruling,
        });
        np.marks.extend(decision.mark);
        np.deletes.extend(decision.delete);
    }
    np
}

/// One pod on the failed node: whether it moves (mark or delete), is skipped, and whether the
/// out-of-service taint must spare it.
fn judge_pod<'p>(
    failed: &FailedNode<'_, 'p>,
    owner: Option<PolicyRef<'p>>,
    pod: &Pod,
    uid: &str,
    key: &ObjectKey,
    usable: &dyn Fn(&Node) -> bool,
) -> PodDecision<'p> {
    let (node, view) = (failed.name(), failed.input.view);
    let Some(owner) = owner else {
        return PodDecision::stays(Ruling::NotSelected, taints::unselected_protection(pod));
    };
    // The pod's own policy must see the node dead too; until it does the pod stays.
    if !judged_failed(failed.input.health, owner.name, node) {
        return PodDecision::stays(Ruling::NotJudgedDead, Some("NodeNotJudgedDeadByItsPolicy"));
    }
    let skipped = |reason, protect| PodDecision::stays(Ruling::Skipped(reason), protect);
    let hold = failed
        .held
        .get(failed.policy.name)
        .or_else(|| failed.held.get(owner.name));
    if let Some(hold) = hold {
        return PodDecision::stays(Ruling::Held(hold.clone()), Some("PolicyHeld"));
    }
    // The pod's own policy paused (the node's policy decided for the node already, see
    // `paused`): it stays, and the taint must spare it, unless podha began moving it (marked it
    // NotReady).
    if owner.spec.paused
        && owner.name != failed.policy.name
        && !failed.incident.marked_not_ready.contains_key(uid)
    {
        return skipped(Skip::Paused, Some("PolicyPaused"));
    }
    if !failed.incident.pods_at_failure.contains(uid) {
        return skipped(Skip::Replacement, None);
    }
    let eligible = match eligibility::check_movable(owner.spec, pod, view, usable) {
        Err(reason) => {
            return skipped(
                Skip::Ineligible(reason),
                taints::skip_protection(reason, pod),
            );
        }
        Ok(eligible) => eligible,
    };
    let mut decision = PodDecision::stays(
        Ruling::Moves {
            rehearsed: failed.rehearsal() || owner.spec.dry_run,
            owner: eligible.owner.clone(),
        },
        other_policy_protection(failed.policy, owner),
    );
    // The taint eviction controller's delete first (the pod, marked before the taint, is no
    // longer Ready then: podha's delete goes by its UID alone).
    if eviction::awaits_eviction(pod, failed.incident, failed.input.now) {
        return decision;
    }
    let resource_version = match delete_version(failed.incident, pod, uid) {
        DeleteVersion::In(version) => version,
        DeleteVersion::MarkFirst => {
            let intent = Intent::MarkPodNotReady {
                pod: key.clone(),
                uid: uid.to_string(),
                node: node.to_string(),
                policy: owner.name.to_string(),
            };
            decision.mark = Some((owner, intent));
            return decision;
        }
        DeleteVersion::Wait => return decision,
    };
    let intent = Intent::ForceDeletePod {
        pod: key.clone(),
        uid: uid.to_string(),
        node: node.to_string(),
        policy: owner.name.to_string(),
        owner_kind: eligible.owner.label(),
        resource_version,
    };
    decision.delete = Some((owner, intent));
    decision
}

/// In which version a pod on the failed node may be deleted, if it may be this round.
enum DeleteVersion {
    /// In this version only, or in any (the UID precondition alone).
    In(Option<String>),
    /// Still Ready as the dead kubelet last wrote: marked NotReady first.
    MarkFirst,
    /// Marked, but the pod changed since and still shows Ready: wait for the watch to show the
    /// mark (or, if a live kubelet turned it Ready again, for the node to be judged healthy).
    Wait,
}

fn delete_version(incident: &Incident, pod: &Pod, uid: &str) -> DeleteVersion {
    if !eligibility::looks_alive(pod) {
        return DeleteVersion::In(None);
    }
    match incident.marked_not_ready.get(uid) {
        None => DeleteVersion::MarkFirst,
        // Marked, and the watch does not show it yet: delete that version only.
        Some(Some(version)) => DeleteVersion::In(Some(version.clone())),
        Some(None) => DeleteVersion::Wait,
    }
}

/// The node's policy's own action and dry run already decide the taint; another policy's
/// choices must not be overruled by it.
fn other_policy_protection(
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
) -> Option<&'static str> {
    if owner.name == node_policy.name {
        return None;
    }
    // The pod's policy chose to wait for the attach/detach controller (storage that does not
    // fence, nodes that may come back).
    if owner.spec.action == Action::DeletePods {
        return Some("PolicyActionDeletePods");
    }
    owner.spec.dry_run.then_some("PolicyDryRun")
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
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

#[cfg(test)]
mod tests;
