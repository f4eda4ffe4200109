//! The planner's verdicts on a pod's foreseen death (`planner::foresee`), read as `podha
//! explain`'s rules: the policies' state, each eligibility rule up to the refusal, the taint.
//! Every result here is the planner's; this room only says it in words.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::pod::{claims_text, ready_elsewhere};
use super::{Check, Checks, Cluster, Unprotected};
use crate::api::{Action, NodeTaint, OwnerKind, PAUSE_ANNOTATION, condition};
use crate::eligibility::{
    OwnerMatch, SkipReason, check_owner, controller_ref, counted_kind, find_target, tolerated_fence,
};
use crate::health::ReadyStatus;
use crate::planner::{HoldReason, NodeVerdict, PolicyRef, Ruling, Skip, unhealthy_hold};
use crate::view::View;

/// The foreseen round's verdict on a pod's node, and on the pod if the round judged it.
pub struct ForeseenPod<'a> {
    pub node: &'a NodeVerdict,
    pub ruling: Option<&'a Ruling>,
}

/// The policies' own state, as the foreseen round (`verdict`) rules: paused, a dry run, held
/// (a policy before them unreadable, too many unhealthy nodes), or a judgement no confirmed
/// proof stands behind; and the hold the operator reports now (the policies' statuses).
pub fn state_checks(
    cluster: &Cluster<'_>,
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
    node: &str,
    verdict: Option<&ForeseenPod<'_>>,
    checks: &mut Checks,
) {
    // In the planner's order: the node's hold, the policies' holds, then the pod's own.
    let node_hold = verdict.and_then(|v| v.node.hold.as_ref());
    let ruled = node_hold
        .map(|hold| held(hold, node_policy, node))
        .or_else(|| held_now(cluster, [node_policy, owner], node))
        .or_else(|| {
            let v = verdict?;
            match v.ruling {
                Some(ruling) => pod_state(ruling, node_policy, owner, node),
                // The node alone: a dry run of its policy rehearses every action there.
                None => v.node.rehearsed.then(|| rehearsed(node_policy, node)),
            }
        });
    if let Some((reason, why)) = ruled {
        checks.fail("state", reason, why);
        return;
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

/// The pod's own ruling, where it is about the policies' state: held, paused, rehearsed.
fn pod_state(
    ruling: &Ruling,
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
    node: &str,
) -> Option<(Unprotected, String)> {
    match ruling {
        Ruling::Held(hold) => Some(held(hold, owner, node)),
        Ruling::Skipped(Skip::Paused) => Some((
            Unprotected::Paused,
            format!(
                "{} is paused (spec.paused): podha judges but takes no new action",
                owner.name
            ),
        )),
        Ruling::Moves {
            rehearsed: true, ..
        } if node_policy.spec.dry_run => Some(rehearsed(node_policy, node)),
        Ruling::Moves {
            rehearsed: true, ..
        } => Some((
            Unprotected::DryRun,
            format!(
                "{}: dryRun is on: podha only says what it would do",
                owner.name
            ),
        )),
        _ => None,
    }
}

/// The node's policy rehearses every action on `node`.
fn rehearsed(node_policy: PolicyRef<'_>, node: &str) -> (Unprotected, String) {
    (
        Unprotected::DryRun,
        format!(
            "{}: dryRun is on (it governs {node}): podha only says what it would do",
            node_policy.name
        ),
    )
}

/// The hold the operator reports now; and, for a reader of the API (the operator foresees
/// with its own judgement of the nodes, [`Cluster::seen`]), the hold it would take once `node`
/// is unhealthy too, as the policies' statuses count their nodes: the planner's limit
/// (`planner::unhealthy_hold`) on failed and suspect nodes. The statuses do not name the nodes
/// that failed within `safety.unhealthyWindow`, so such a hold can be missed; `node` counts
/// once more unless it is Ready (the safe side: a suspect node may be counted twice).
fn held_now(
    cluster: &Cluster<'_>,
    policies: [PolicyRef<'_>; 2],
    node: &str,
) -> Option<(Unprotected, String)> {
    policies.into_iter().find_map(|policy| {
        let status = cluster.statuses.get(policy.name)?;
        if let Some(c) = status.degraded_because(condition::REASON_TOO_MANY_UNHEALTHY) {
            let why = format!(
                "{} holds every action: {} ({})",
                policy.name, c.reason, c.message
            );
            return Some((Unprotected::TooManyUnhealthy, why));
        }
        if cluster.seen.is_some() {
            return None;
        }
        let count = |n: i32| usize::try_from(n).unwrap_or_default();
        let counted = cluster
            .view
            .nodes
            .get(node)
            .is_none_or(|n| ReadyStatus::from_node(n) != ReadyStatus::True);
        let unhealthy =
            count(status.failed_nodes) + count(status.suspect_nodes) + usize::from(!counted);
        let hold = unhealthy_hold(policy, unhealthy, count(status.watched_nodes))?;
        Some(held(&hold, policy, node))
    })
}

/// Why a hold of `policy` keeps the pods of `node` where they are.
fn held(hold: &HoldReason, policy: PolicyRef<'_>, node: &str) -> (Unprotected, String) {
    let name = policy.name;
    match hold {
        HoldReason::Paused { by_node: true } => (
            Unprotected::Paused,
            format!(
                "{node} is paused for maintenance ({PAUSE_ANNOTATION}): podha takes no new \
                 action there until the annotation goes"
            ),
        ),
        HoldReason::Paused { by_node: false } => (
            Unprotected::Paused,
            format!(
                "{name} is paused (spec.paused, it governs {node}): podha judges but takes no \
                 new action"
            ),
        ),
        HoldReason::PolicyUnreadable { unreadable } => (
            Unprotected::PolicyUnreadable,
            format!(
                "policy {unreadable} cannot be read and comes first by name: podha holds every \
                 action of the policies after it"
            ),
        ),
        HoldReason::TooManyUnhealthy {
            failed,
            watched,
            max,
        } => (
            Unprotected::TooManyUnhealthy,
            format!(
                "{name} would hold every action: with {node} dead, {failed} of its {watched} \
                 watched nodes would be unhealthy, more than the {max} safety.maxUnhealthy allows"
            ),
        ),
        HoldReason::Unconfirmed { unheard, watched } => (
            Unprotected::Unconfirmed,
            format!(
                "{name} would wait for good: {unheard} of its {watched} watched nodes answer none \
                 of the probes it judges by (detection.signals; no agent runs there), so it \
                 cannot tell {node}'s death from its own cut-off"
            ),
        ),
        HoldReason::FencingPending { proof } => (
            Unprotected::NoProof,
            format!(
                "{name} judges {node} without the kubelet's heartbeat and its action and proof \
                 ({proof}) confirm no fence: judged dead, the node is held for good"
            ),
        ),
        other => (
            Unprotected::NoProof,
            format!("{name} holds: {}", other.as_str()),
        ),
    }
}

/// An eligibility rule, as `podha explain` names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rule {
    Owner,
    Volumes,
    Target,
    Tolerations,
}

impl Rule {
    /// In the order `eligibility::check_movable` applies them, the first refusal winning.
    const IN_ORDER: [Self; 4] = [Self::Owner, Self::Volumes, Self::Target, Self::Tolerations];

    const fn name(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Volumes => "volumes",
            Self::Target => "target",
            Self::Tolerations => "tolerations",
        }
    }

    /// The rule an eligibility refusal belongs to.
    const fn refusing(reason: SkipReason) -> Self {
        match reason {
            SkipReason::NoControllerOwner
            | SkipReason::OwnerKindNotSelected
            | SkipReason::OptedOut => Self::Owner,
            SkipReason::NoPersistentVolumeClaim
            | SkipReason::ClaimNotBound
            | SkipReason::VolumeNotCsi
            | SkipReason::DriverNotSelected
            | SkipReason::AccessModeNotSelected => Self::Volumes,
            SkipReason::NoTargetNode => Self::Target,
            SkipReason::ToleratesFence => Self::Tolerations,
        }
    }
}

/// The eligibility rules, as the foreseen round judged the pod: each rule it passed,
/// described, up to the refusal that keeps it, if one does.
pub(super) fn eligibility_checks(
    owner: PolicyRef<'_>,
    pod: &Pod,
    node: &Node,
    view: &View,
    verdict: Option<&ForeseenPod<'_>>,
    checks: &mut Checks,
) {
    let (refusal, matched) = match verdict.map(|v| (v.node.hold.is_some(), v.ruling)) {
        Some((_, Some(Ruling::Moves { owner: matched, .. }))) => (None, Some(matched)),
        Some((_, Some(Ruling::Skipped(Skip::Ineligible(reason))))) => (Some(*reason), None),
        Some((true, None) | (_, Some(Ruling::Held(_) | Ruling::Skipped(Skip::Paused)))) => {
            checks.note("eligibility", "not judged: a hold comes first (see state)");
            return;
        }
        // The pod as read is not one the planner judged on its node: no UID, or it changed
        // between the reads.
        _ => {
            checks.fail(
                "eligibility",
                Unprotected::NotJudged,
                format!(
                    "the planner did not judge this pod on {}: it is not among the node's pods \
                     as read (no UID, or it changed while it was read): ask again",
                    node.name_any()
                ),
            );
            return;
        }
    };
    for rule in Rule::IN_ORDER {
        match refusal {
            Some(reason) if Rule::refusing(reason) == rule => {
                checks.push(refused(owner, pod, view, reason));
                return;
            }
            _ => checks.push(passed(rule, owner, matched, pod, node, view)),
        }
    }
}

/// An eligibility rule the pod passed, described.
fn passed(
    rule: Rule,
    owner: PolicyRef<'_>,
    matched: Option<&OwnerMatch>,
    pod: &Pod,
    node: &Node,
    view: &View,
) -> Check {
    let controller = controller_ref(pod);
    let name = rule.name();
    match rule {
        Rule::Owner => {
            let matched = matched
                .cloned()
                .or_else(|| check_owner(owner.spec, pod, view).ok());
            let how = match &matched {
                Some(m) if m.listed => "listed in owners",
                Some(_) => "opted in by podha.io/failover",
                None => "",
            };
            Check::pass(
                name,
                format!(
                    "{} {} ({how})",
                    matched.map(|m| m.kind.to_string()).unwrap_or_default(),
                    controller.map_or("", |r| r.name.as_str())
                ),
            )
        }
        Rule::Volumes => Check::pass(name, claims_text(pod, view)),
        Rule::Target => match find_target(pod, view, &ready_elsewhere(&node.name_any())) {
            Some(target) => Check::pass(
                name,
                format!(
                    "{} could run it now (taints, affinity, resources, volume topology)",
                    target.name_any()
                ),
            ),
            None => Check::note(
                name,
                "no Ready, schedulable node could run it now; safety.requireTarget is off: \
                 podha moves it and its replacement waits Pending",
            ),
        },
        Rule::Tolerations => Check::pass(
            name,
            format!(
                "does not tolerate {}, the taint podha fences with under {}",
                NodeTaint::for_action(owner.spec.action).key(),
                owner.spec.action.as_str()
            ),
        ),
    }
}

/// The eligibility rule that refuses the pod, with what it found.
fn refused(owner: PolicyRef<'_>, pod: &Pod, view: &View, reason: SkipReason) -> Check {
    let rule = Rule::refusing(reason);
    let found = match rule {
        Rule::Volumes => Some(claims_text(pod, view)).filter(|c| !c.is_empty()),
        Rule::Tolerations => tolerated_fence(owner.spec.action, pod)
            .map(|taint| format!("it tolerates {}", taint.key())),
        Rule::Owner if reason == SkipReason::OwnerKindNotSelected => {
            Some(unlisted_owner(owner, pod, view))
        }
        Rule::Owner | Rule::Target => None,
    };
    Check::fail(
        rule.name(),
        Unprotected::Ineligible(reason),
        format!(
            "policy {}: {}: {}{}",
            owner.name,
            reason.as_str(),
            reason.describe(),
            found.map_or_else(String::new, |f| format!(" ({f})"))
        ),
    )
}

/// The kind a pod's controller counts as, beside the policy's `owners`, for a pod whose kind
/// is not listed.
fn unlisted_owner(owner: PolicyRef<'_>, pod: &Pod, view: &View) -> String {
    let listed = owner
        .spec
        .owners
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let counted = controller_ref(pod).map(|r| (r, counted_kind(pod, r, view)));
    // Only a kind `owners` can name is suggested (not one of the core group, nor one an owner
    // reference misspells): the API server would refuse it.
    let nameable =
        |kind: &OwnerKind| kind.to_string().parse::<OwnerKind>().ok().as_ref() == Some(kind);
    match counted {
        Some((r, Some(kind))) if nameable(&kind) => format!(
            "{kind} {}, owners: [{listed}]: add {kind} to owners if its controller recreates \
             a deleted pod",
            r.name
        ),
        Some((r, Some(kind))) => format!(
            "kind {:?} of API group {:?} {:?}, owners: [{listed}]: owners cannot name it; opt \
             the pod in (podha.io/failover: \"true\") if its controller recreates a deleted pod",
            kind.kind(),
            kind.group(),
            r.name
        ),
        Some((r, None)) => format!(
            "ReplicaSet {} is not in podha's view yet: whose it is is not known",
            r.name
        ),
        None => format!("owners: [{listed}]"),
    }
}

/// Which taint the node would get if it died now, and what that means for the volumes, as the
/// foreseen round decided.
/// `owner`: the pod's own policy (the node's, asked about the node): a pod whose policy asks
/// for the taint, on a node whose policy chose `DeletePods`, moves only on the slow path.
pub fn taint_check(
    node_policy: PolicyRef<'_>,
    owner: PolicyRef<'_>,
    foreseen: Option<&NodeVerdict>,
) -> Check {
    let Some(verdict) = foreseen.filter(|v| v.hold.is_none()) else {
        return Check::note("taint", "not judged: a hold comes first (see state)");
    };
    if node_policy.spec.action == Action::DeletePods {
        let detail = format!(
            "{} (action DeletePods of {}): the pod is deleted once the fencing proof is in; its \
             volume detaches after the attach/detach controller's 6-minute wait",
            NodeTaint::Fence.key(),
            node_policy.name
        );
        // The pod's own policy chose the 6 minutes too, or it asks for the taint: then it
        // is on the slow path.
        return if owner.spec.action == Action::DeletePods {
            Check::pass("taint", detail)
        } else {
            Check::slow("taint", detail)
        };
    }
    match &verdict.spared {
        None => Check::pass(
            "taint",
            format!(
                "{}: volumes detach as soon as their pods are deleted",
                NodeTaint::OutOfService.key()
            ),
        ),
        Some(spared) => Check::slow(
            "taint",
            format!(
                "{} would be refused while {} must stay on {} ({}): podha fences the node with \
                 {} instead and deletes the pods that move, whose volumes detach after the \
                 attach/detach controller's 6-minute wait",
                NodeTaint::OutOfService.key(),
                spared.pod,
                verdict.node,
                spared.why,
                verdict.taint.key()
            ),
        ),
    }
}
