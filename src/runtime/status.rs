//! A policy's status, computed from what the decision loop knows. Pure, so that the loop can
//! compare it with the last one written and patch only on change (no hot loop).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tokio::time::Instant;

use super::agent_coverage::describe_unprotected;
use crate::api::{
    Action, FailoverPhase, PodHAPolicy, PodHAPolicyStatus, RECENT_FAILOVERS_KEPT,
    UNPROTECTED_REASONS_KEPT, UnprotectedReason, UnreadablePolicy, condition,
};
use crate::eligibility::invalid_selectors;
use crate::health::{DetectionConfig, NodeHealth};
use crate::incident::Incident;
use crate::planner::HoldReason;
use crate::protection::AgentGap;
use crate::protection::Coverage;

/// What a policy's status is made of.
pub struct PolicyFacts<'a> {
    pub policy: &'a PodHAPolicy,
    /// Health of the nodes the policy watches.
    pub health: &'a BTreeMap<String, NodeHealth>,
    /// Its open failovers and its finished ones (newest first).
    pub open: &'a [&'a Incident],
    pub finished: &'a [&'a Incident],
    pub wall: &'a dyn Fn(Instant) -> Time,
    /// Wall-clock now, for condition transitions.
    pub now: Time,
    /// The policy-wide hold of the last planning round, if any (the planner decides holds).
    pub held: Option<&'a HoldReason>,
    /// The watched nodes without an agent whose silence proves their fence, when the policy
    /// relies on it (see `super::agent_coverage`); `None` while this process cannot tell yet
    /// (then the condition says what it said before).
    pub unprotected: Option<&'a [(String, AgentGap)]>,
    /// How many watched nodes podha takes no new action on (the policy or the node paused).
    pub paused_nodes: usize,
    /// How many of its pods podha would fail over now; `None` until worked out (then the
    /// status says what it said before).
    pub coverage: Option<&'a Coverage>,
}

pub fn policy_status(facts: &PolicyFacts<'_>) -> PodHAPolicyStatus {
    let policy = facts.policy;
    let watched = facts.health.len();
    let failed = facts.health.values().filter(|h| h.is_failed()).count();
    let suspect = facts
        .health
        .values()
        .filter(|h| matches!(h, NodeHealth::Suspect { .. }))
        .count();
    let previous = conditions_of(policy.status.as_ref());
    let generation = policy.metadata.generation;

    let ready = ready_condition(policy, watched);
    let degraded = degraded_condition(facts, &ready);

    let mut failovers: Vec<&Incident> = facts.open.iter().chain(facts.finished).copied().collect();
    failovers.sort_by_key(|f| std::cmp::Reverse(f.detected_at));
    failovers.truncate(RECENT_FAILOVERS_KEPT);

    let (protected_pods, slow_detach_pods, unprotected_pods, unprotected_reasons) =
        match facts.coverage {
            Some(c) => (
                count(c.protected),
                count(c.slow),
                count(c.unprotected),
                top_reasons(c),
            ),
            None => policy.status.as_ref().map_or_else(Default::default, |s| {
                (
                    s.protected_pods,
                    s.slow_detach_pods,
                    s.unprotected_pods,
                    s.unprotected_reasons.clone(),
                )
            }),
        };

    PodHAPolicyStatus {
        observed_generation: generation,
        conditions: vec![
            make_condition(
                previous,
                condition::READY,
                ready.0,
                ready.1,
                ready.2,
                generation,
                &facts.now,
            ),
            make_condition(
                previous,
                condition::DEGRADED,
                degraded.0,
                degraded.1,
                degraded.2,
                generation,
                &facts.now,
            ),
        ],
        watched_nodes: count(watched),
        failed_nodes: count(failed),
        suspect_nodes: count(suspect),
        paused_nodes: count(facts.paused_nodes),
        protected_pods,
        slow_detach_pods,
        unprotected_pods,
        unprotected_reasons,
        last_failover_time: failovers.first().map(|f| (facts.wall)(f.detected_at)),
        recent_failovers: failovers.iter().map(|f| f.to_record(facts.wall)).collect(),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The reasons that keep the most unprotected pods, most first.
fn top_reasons(coverage: &Coverage) -> Vec<UnprotectedReason> {
    coverage
        .reasons
        .iter()
        .take(UNPROTECTED_REASONS_KEPT)
        .map(|(reason, pods)| UnprotectedReason {
            reason: reason.as_str().to_string(),
            pods: count(*pods),
        })
        .collect()
}

/// The status of a policy podha cannot read (see [`crate::api::ListedPolicy`]): not Ready and
/// Degraded, saying why; it watches no node and acts on none.
pub fn unreadable_status(policy: &UnreadablePolicy, now: &Time) -> PodHAPolicyStatus {
    let previous = conditions_of(policy.status.as_ref());
    let generation = policy.metadata.generation;
    let message = policy.note();
    let condition = |type_, status| {
        make_condition(
            previous,
            type_,
            status,
            condition::REASON_INVALID_SPEC,
            message.clone(),
            generation,
            now,
        )
    };
    PodHAPolicyStatus {
        observed_generation: generation,
        conditions: vec![
            condition(condition::READY, false),
            condition(condition::DEGRADED, true),
        ],
        ..PodHAPolicyStatus::default()
    }
}

/// The conditions of the status last written, to carry their transition times over.
fn conditions_of(status: Option<&PodHAPolicyStatus>) -> &[Condition] {
    status.map_or(&[], |s| s.conditions.as_slice())
}

/// A condition whose `lastTransitionTime` moves only when its status does.
fn make_condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// `Ready`: whether the policy's spec is valid, so its nodes are watched: (status, reason,
/// message). A policy that taints without a proof says so in its reason.
fn ready_condition(policy: &PodHAPolicy, watched: usize) -> (bool, &'static str, String) {
    match (
        DetectionConfig::try_from(&policy.spec.detection),
        invalid_selectors(&policy.spec),
    ) {
        (Err(e), _) => (false, condition::REASON_INVALID_SPEC, e.to_string()),
        (Ok(_), Some(problems)) => (
            false,
            condition::REASON_INVALID_SPEC,
            format!("invalid label selector, which selects nothing: {problems}"),
        ),
        (Ok(_), None) if policy.spec.paused => (
            true,
            condition::REASON_PAUSED,
            format!(
                "paused (spec.paused): watching and judging {watched} nodes, no new action on a \
                 dead one"
            ),
        ),
        (Ok(_), None) if policy.spec.fencing.proofs().is_none() => (
            true,
            condition::REASON_WATCHING_WITHOUT_PROOF,
            format!(
                "watching {watched} nodes; fencing.proof None: the {} follows the judgement \
                 alone, so a node that is frozen or cut off but running may write beside its \
                 replacement unless the storage fences it on detach",
                match policy.spec.action {
                    Action::OutOfServiceTaint => "out-of-service taint",
                    Action::DeletePods => "pods' deletion",
                }
            ),
        ),
        (Ok(_), None) => (
            true,
            condition::REASON_WATCHING,
            format!("watching {watched} nodes"),
        ),
    }
}

/// The `AgentsMissing` condition the policy's status carries, if it does: what a process that
/// cannot tell yet says on.
fn agents_missing_before(facts: &PolicyFacts<'_>) -> Option<(bool, &'static str, String)> {
    facts
        .policy
        .status
        .as_ref()?
        .degraded_because(condition::REASON_AGENTS_MISSING)
        .map(|c| (true, condition::REASON_AGENTS_MISSING, c.message.clone()))
}

/// The condition `type_` of `status`, if it has one.
pub fn condition_of<'s>(
    status: Option<&'s PodHAPolicyStatus>,
    type_: &str,
) -> Option<&'s Condition> {
    status?.condition(type_)
}

/// `Degraded`: every action held, a detach past its timeout, dead nodes held for want of
/// their fence's proof, an invalid spec, or watched nodes whose agent could not prove it.
fn degraded_condition(
    facts: &PolicyFacts<'_>,
    ready: &(bool, &'static str, String),
) -> (bool, &'static str, String) {
    let timed_out: Vec<&str> = facts
        .open
        .iter()
        .filter(|f| f.phase() == FailoverPhase::DetachTimedOut)
        .map(|f| f.node.as_str())
        .collect();
    let awaiting_proof: Vec<&str> = facts
        .open
        .iter()
        .filter(|f| f.awaits_proof())
        .map(|f| f.node.as_str())
        .collect();
    if let Some(HoldReason::TooManyUnhealthy {
        failed: unhealthy,
        watched,
        max,
    }) = facts.held
    {
        (
            true,
            condition::REASON_TOO_MANY_UNHEALTHY,
            format!(
                "{unhealthy} of {watched} watched nodes unhealthy or failed within \
                 unhealthyWindow (maxUnhealthy allows {max}): every action is held"
            ),
        )
    } else if let Some(hold @ HoldReason::PolicyUnreadable { .. }) = facts.held {
        (true, condition::REASON_POLICY_UNREADABLE, hold.note(None))
    } else if !timed_out.is_empty() {
        (
            true,
            condition::REASON_DETACH_TIMEOUT,
            format!(
                "volumes still attached to dead nodes after detachTimeout: {}",
                timed_out.join(", ")
            ),
        )
    } else if !awaiting_proof.is_empty() {
        (
            true,
            condition::REASON_FENCING_PENDING,
            format!(
                "dead nodes held until their fence is proven (fencing.proof {}; see their \
                 events): {}",
                facts.policy.spec.fencing.proofs(),
                awaiting_proof.join(", ")
            ),
        )
    } else if !ready.0 {
        (true, condition::REASON_INVALID_SPEC, ready.2.clone())
    } else if let Some(unprotected) = facts.unprotected.filter(|u| !u.is_empty()) {
        (
            true,
            condition::REASON_AGENTS_MISSING,
            describe_unprotected(unprotected, facts.health.len()),
        )
    } else if let Some(before) = facts
        .unprotected
        .is_none()
        .then(|| agents_missing_before(facts))
        .flatten()
    {
        before
    } else {
        (false, condition::REASON_AS_EXPECTED, String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Action, FencingProof};
    use crate::test_builders::mk_spec;

    fn facts_for<'a>(
        policy: &'a PodHAPolicy,
        health: &'a BTreeMap<String, NodeHealth>,
        open: &'a [&'a Incident],
        wall: &'a dyn Fn(Instant) -> Time,
    ) -> PolicyFacts<'a> {
        PolicyFacts {
            policy,
            health,
            open,
            finished: &[],
            wall,
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            held: None,
            unprotected: Some(&[]),
            paused_nodes: 0,
            coverage: None,
        }
    }

    fn condition<'s>(status: &'s PodHAPolicyStatus, type_: &str) -> &'s Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition present")
    }

    #[test]
    fn an_unreadable_policy_is_not_ready_and_degraded_and_says_why_once() {
        let listed: crate::api::ListedPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "huge", "generation": 3},
            "spec": {"fencing": {"agentMargin": "99999999999999999999h"}},
        }))
        .expect("listed");
        let crate::api::ListedPolicy::Unreadable(policy) = listed else {
            panic!("readable: {listed:?}")
        };
        let mut policy = *policy;
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t0"));
        let status = unreadable_status(&policy, &t0);
        let ready = condition(&status, condition::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", condition::REASON_INVALID_SPEC)
        );
        assert!(
            ready.message.contains("acts on none of its nodes")
                && ready.message.contains("invalid duration"),
            "{}",
            ready.message
        );
        assert_eq!(condition(&status, condition::DEGRADED).status, "True");
        assert_eq!(status.observed_generation, Some(3));
        // Written once: the next round, with that status on the object, computes the same.
        policy.status = Some(status.clone());
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).expect("t1"));
        assert_eq!(unreadable_status(&policy, &later), status);
    }

    #[test]
    fn a_policy_that_taints_without_proof_says_so_in_its_ready_reason() {
        let health = BTreeMap::from([("a".to_string(), NodeHealth::Healthy)]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let reason = |proof, action| {
            let mut spec = mk_spec();
            spec.fencing.proof = proof;
            spec.action = action;
            let policy = PodHAPolicy::new("p", spec);
            let status = policy_status(&facts_for(&policy, &health, &[], &wall));
            let ready = condition(&status, condition::READY);
            assert_eq!(ready.status, "True");
            (ready.reason.clone(), ready.message.clone())
        };
        let (unproven, message) = reason(FencingProof::None, Action::OutOfServiceTaint);
        assert_eq!(unproven, condition::REASON_WATCHING_WITHOUT_PROOF);
        assert!(message.contains("follows the judgement alone"), "{message}");
        // The deletes of `DeletePods` move the volume too, 6 minutes later.
        let (unproven, message) = reason(FencingProof::None, Action::DeletePods);
        assert_eq!(unproven, condition::REASON_WATCHING_WITHOUT_PROOF);
        assert!(message.contains("pods' deletion follows"), "{message}");
        for action in [Action::OutOfServiceTaint, Action::DeletePods] {
            assert_eq!(
                reason(FencingProof::Agent, action).0,
                condition::REASON_WATCHING
            );
        }
    }

    #[test]
    fn a_paused_policy_says_so_and_counts_its_paused_nodes() {
        let health = BTreeMap::from([("a".to_string(), NodeHealth::Healthy)]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let mut spec = mk_spec();
        spec.paused = true;
        let policy = PodHAPolicy::new("p", spec);
        let mut facts = facts_for(&policy, &health, &[], &wall);
        facts.paused_nodes = 1;
        let status = policy_status(&facts);
        let ready = condition(&status, condition::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", condition::REASON_PAUSED)
        );
        assert!(ready.message.contains("no new action"), "{}", ready.message);
        assert_eq!(status.paused_nodes, 1);
    }

    #[test]
    fn nodes_without_a_proving_agent_and_nodes_held_for_proof_degrade_the_policy() {
        use crate::protection::AgentGap;
        let mut spec = mk_spec();
        spec.fencing.proof = FencingProof::Agent;
        let policy = PodHAPolicy::new("p", spec);
        let health = BTreeMap::from([
            ("a".to_string(), NodeHealth::Healthy),
            ("b".to_string(), NodeHealth::Healthy),
        ]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let unprotected = [("b".to_string(), AgentGap::WithoutWatchdog)];
        let status = policy_status(&PolicyFacts {
            unprotected: Some(&unprotected),
            ..facts_for(&policy, &health, &[], &wall)
        });
        let degraded = condition(&status, condition::DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", condition::REASON_AGENTS_MISSING)
        );
        assert!(
            degraded
                .message
                .starts_with("1 of 2 watched nodes have no agent whose silence proves their fence")
                && degraded
                    .message
                    .contains("b (agent without a usable watchdog)"),
            "{}",
            degraded.message
        );
        // A dead node held for its proof comes first.
        let mut held = Incident::new("a", "p", None, Instant::now());
        held.record_hold("FencingPending", "fencing.proof Agent is not on node a");
        held.awaiting_proof = true;
        let open = [&held];
        let status = policy_status(&PolicyFacts {
            unprotected: Some(&unprotected),
            ..facts_for(&policy, &health, &open, &wall)
        });
        let degraded = condition(&status, condition::DEGRADED);
        assert_eq!(degraded.reason, condition::REASON_FENCING_PENDING);
        assert!(degraded.message.ends_with(": a"), "{}", degraded.message);
    }

    #[test]
    fn counts_nodes_and_reports_ready() {
        let mut policy = PodHAPolicy::new("p", mk_spec());
        policy.metadata.generation = Some(4);
        let t0 = Instant::now();
        let health = BTreeMap::from([
            ("a".to_string(), NodeHealth::Healthy),
            ("b".to_string(), NodeHealth::Failed { since: t0 }),
            (
                "c".to_string(),
                NodeHealth::Suspect {
                    failures: 1,
                    since: t0,
                },
            ),
            ("d".to_string(), NodeHealth::Healthy),
        ]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = policy_status(&facts_for(&policy, &health, &[], &wall));
        assert_eq!(
            (
                status.watched_nodes,
                status.failed_nodes,
                status.suspect_nodes
            ),
            (4, 1, 1)
        );
        assert_eq!(status.observed_generation, Some(4));
        assert_eq!(condition(&status, "Ready").status, "True");
        assert_eq!(condition(&status, "Degraded").status, "False");
    }

    #[test]
    fn an_invalid_selector_is_an_invalid_spec_not_a_ready_policy() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            LabelSelector, LabelSelectorRequirement,
        };
        let mut spec = mk_spec();
        spec.pod_selector = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "in".into(),
                values: Some(vec!["db".into()]),
            }]),
            ..LabelSelector::default()
        };
        let policy = PodHAPolicy::new("p", spec);
        let health = BTreeMap::from([("a".to_string(), NodeHealth::Healthy)]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = policy_status(&facts_for(&policy, &health, &[], &wall));
        let ready = condition(&status, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        let degraded = condition(&status, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidSpec")
        );
        assert!(
            degraded.message.contains("podSelector"),
            "{}",
            degraded.message
        );
    }

    /// The planner's hold, not a count of its own, degrades the policy: the two cannot
    /// disagree (the planner also counts suspect and recently failed nodes).
    #[test]
    fn the_planners_hold_degrades_the_policy() {
        let policy = PodHAPolicy::new("p", mk_spec());
        let t0 = Instant::now();
        let health: BTreeMap<String, NodeHealth> = (0..3)
            .map(|i| (format!("n{i}"), NodeHealth::Failed { since: t0 }))
            .chain([("n9".to_string(), NodeHealth::Healthy)])
            .collect();
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = policy_status(&facts_for(&policy, &health, &[], &wall));
        assert_eq!(condition(&status, "Degraded").status, "False");
        let hold = HoldReason::TooManyUnhealthy {
            failed: 3,
            watched: 4,
            max: 1,
        };
        let status = policy_status(&PolicyFacts {
            held: Some(&hold),
            ..facts_for(&policy, &health, &[], &wall)
        });
        let degraded = condition(&status, "Degraded");
        assert_eq!(degraded.status, "True");
        assert_eq!(degraded.reason, "TooManyUnhealthyNodes");
        assert!(
            degraded.message.starts_with("3 of 4 watched nodes"),
            "{}",
            degraded.message
        );
    }

    #[test]
    fn a_stuck_detach_degrades_the_policy_and_lists_the_failover() {
        use crate::test_builders::*;
        let policy = PodHAPolicy::new("p", mk_spec());
        let view = view_with([
            mk_node("n1").into(),
            mk_pod("ns", "db-0")
                .on("n1")
                .owned_by_sts("db")
                .claim("data")
                .into(),
            mk_pvc("ns", "data").bound_to("pv").into(),
            mk_csi_pv("pv", "d").into(),
            mk_va("va", "d", "pv", "n1").attached(true).into(),
        ]);
        let pod = view.pods_on("n1")[0].clone();
        let t0 = Instant::now();
        let mut failover = Incident::new("n1", "p", Some(t0), t0);
        failover.record_action(t0, Some(crate::incident::MovedPod::from_pod(&pod, &view)));
        failover.follow(
            t0 + std::time::Duration::from_secs(400),
            &view,
            std::time::Duration::from_secs(390),
        );
        assert_eq!(failover.phase(), FailoverPhase::DetachTimedOut);

        let open = [&failover];
        let health = BTreeMap::from([("n1".to_string(), NodeHealth::Failed { since: t0 })]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = policy_status(&facts_for(&policy, &health, &open, &wall));
        let degraded = condition(&status, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "DetachTimeout")
        );
        assert!(degraded.message.contains("n1"), "{}", degraded.message);
        assert_eq!(status.recent_failovers.len(), 1);
        assert_eq!(status.recent_failovers[0].node, "n1");
        assert_eq!(
            status.recent_failovers[0].phase,
            FailoverPhase::DetachTimedOut
        );
        assert!(status.last_failover_time.is_some());
    }

    #[test]
    fn coverage_counts_the_top_reasons_and_is_kept_until_worked_out() {
        use crate::eligibility::SkipReason;
        use crate::protection::Unprotected;
        let mut policy = PodHAPolicy::new("p", mk_spec());
        let health = BTreeMap::from([("a".to_string(), NodeHealth::Healthy)]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let reasons: Vec<(Unprotected, usize)> = [
            SkipReason::OptedOut,
            SkipReason::NoTargetNode,
            SkipReason::ToleratesFence,
            SkipReason::DriverNotSelected,
            SkipReason::ClaimNotBound,
            SkipReason::VolumeNotCsi,
        ]
        .into_iter()
        .enumerate()
        .map(|(i, r)| (Unprotected::Ineligible(r), 6 - i))
        .collect();
        let coverage = Coverage {
            protected: 40,
            unprotected: 21,
            reasons,
            ..Coverage::default()
        };
        let status = policy_status(&PolicyFacts {
            coverage: Some(&coverage),
            ..facts_for(&policy, &health, &[], &wall)
        });
        assert_eq!((status.protected_pods, status.unprotected_pods), (40, 21));
        let listed: Vec<(&str, i32)> = status
            .unprotected_reasons
            .iter()
            .map(|r| (r.reason.as_str(), r.pods))
            .collect();
        assert_eq!(
            listed,
            [
                ("OptedOut", 6),
                ("NoTargetNode", 5),
                ("ToleratesFence", 4),
                ("DriverNotSelected", 3),
                ("ClaimNotBound", 2)
            ]
        );
        // A leader that has not worked it out yet says what the status said.
        policy.status = Some(status.clone());
        let kept = policy_status(&facts_for(&policy, &health, &[], &wall));
        assert_eq!(kept, status);
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut policy = PodHAPolicy::new("p", mk_spec());
        let health = BTreeMap::from([("a".to_string(), NodeHealth::Healthy)]);
        let wall = |_| Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let first = policy_status(&facts_for(&policy, &health, &[], &wall));
        policy.status = Some(first.clone());
        let mut later = facts_for(&policy, &health, &[], &wall);
        later.now = Time(k8s_openapi::jiff::Timestamp::from_second(1_000_000).expect("valid"));
        let second = policy_status(&later);
        assert_eq!(first, second, "same facts, same status: no patch");
    }
}
