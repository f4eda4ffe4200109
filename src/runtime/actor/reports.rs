//! Report: what the decision loop tells people: events, holds and skips reported once, phase
//! changes announced, node counts, policy statuses written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;
use tracing::{info, warn};

use super::super::status::{PolicyFacts, condition_of, policy_status, unreadable_status};
use super::super::writer::{EventNote, Report};
use super::Actor;
use crate::api::{PodHAPolicy, PodHAPolicyStatus, condition};
use crate::eligibility::SkipReason;
use crate::health::NodeHealth;
use crate::incident::{Incident, Phase, PhaseChange};
use crate::planner::{HealthBook, HoldReason, PodSkip, Skip};
use crate::protection::AgentGap;

/// What was reported already, so each skip, hold and dropped intent is counted once, and each
/// status written only when it changed.
#[derive(Default)]
pub(super) struct ReportBook {
    /// Keys reported, grouped by scope (a node, or `policy:<name>` for a policy-wide hold) so a
    /// scope is forgotten whole when its incident closes or its hold ends.
    reported: BTreeMap<String, BTreeSet<String>>,
    last_status: BTreeMap<String, PodHAPolicyStatus>,
    /// Each policy's policy-wide hold in the last planning round.
    policy_holds: BTreeMap<String, HoldReason>,
    /// The nodes whose agent said it cannot reach its peers in the last round.
    peers_unreachable: BTreeSet<String>,
}

impl ReportBook {
    /// Whether `key` is reported for the first time in `scope` (and remember it).
    pub fn first(&mut self, scope: &str, key: String) -> bool {
        self.reported
            .entry(scope.to_string())
            .or_default()
            .insert(key)
    }

    pub fn forget_scope(&mut self, scope: &str) {
        self.reported.remove(scope);
    }

    /// A new leader writes every status again.
    pub fn forget_statuses(&mut self) {
        self.last_status.clear();
    }

    /// The policies a status was written for that are gone now (`live` says which are not);
    /// forgotten here.
    pub fn policies_gone(&mut self, live: impl Fn(&str) -> bool) -> Vec<String> {
        let gone: Vec<String> = self
            .last_status
            .keys()
            .filter(|p| !live(p))
            .cloned()
            .collect();
        for policy in &gone {
            self.last_status.remove(policy);
        }
        gone
    }

    /// This round's nodes whose agent cannot reach its peers (none when not leading); returns
    /// those that were not in the last round's, to be reported once per episode.
    pub fn set_peers_unreachable(&mut self, nodes: BTreeSet<String>) -> Vec<String> {
        let new = nodes.difference(&self.peers_unreachable).cloned().collect();
        self.peers_unreachable = nodes;
        new
    }

    /// This round's policy-wide holds; a hold that ended is reported again when it returns.
    pub fn set_policy_holds(&mut self, holds: BTreeMap<String, HoldReason>) {
        let held: BTreeSet<String> = holds.keys().map(|p| format!("policy:{p}")).collect();
        self.reported
            .retain(|scope, _| !scope.starts_with("policy:") || held.contains(scope));
        self.policy_holds = holds;
    }
}

impl Actor {
    /// Events from result handling go out without awaiting: the channel has room, and a full
    /// channel only loses an event, never an action.
    pub(super) fn queue_event(&self, note: EventNote) {
        if self.leading {
            self.out.writes.try_report(Report::Event(note));
        }
    }

    pub(super) async fn report_hold(
        &mut self,
        policy: &str,
        node: Option<&str>,
        reason: &HoldReason,
    ) {
        let incident = node.and_then(|n| self.ledger.get(n)).map(|i| i.detected_at);
        let key = format!(
            "hold/{policy}/{}/{}/{incident:?}",
            reason.as_str(),
            reason.subject()
        );
        let scope = match node {
            Some(node) => node.to_string(),
            None => format!("policy:{policy}"),
        };
        // The incident says why it waits every round, not only when the hold is first said: a
        // policy-wide hold may have spoken over it meanwhile.
        if (reason.awaits_proof() || matches!(reason, HoldReason::Paused { .. }))
            && let Some(incident) = node.and_then(|n| self.ledger.get_mut(n))
        {
            incident.record_hold(reason.as_str(), reason.note(node));
        }
        if !self.reported.first(&scope, key) {
            return;
        }
        self.metrics.actions.inc_actions_held(policy, reason.kind());
        let note = reason.note(node);
        warn!(policy, %note, "action held");
        if let (Some(event_reason), Some(node)) = (reason.node_event_reason(), node) {
            let on_node = self.node_event(node, true, event_reason, "Hold", note.clone());
            self.event(on_node).await;
        }
        if matches!(reason, HoldReason::TooManyUnhealthy { .. }) {
            for incident in self.ledger.iter_mut().filter(|i| i.policy == policy) {
                incident.record_hold(reason.as_str(), note.clone());
            }
        }
        if let Some(p) = self.state.policies.get(policy) {
            self.event(EventNote {
                regarding: p.object_ref(&()),
                warning: true,
                reason: reason.policy_event_reason(),
                action: "Hold",
                note,
            })
            .await;
        }
    }

    pub(super) async fn report_skip(&mut self, skip: PodSkip) {
        let incident = self.ledger.get(&skip.node).map(|i| i.detected_at);
        let key = format!("skip/{}/{}/{incident:?}", skip.uid, skip.reason.as_str());
        if !self.reported.first(&skip.node, key) {
            return;
        }
        self.metrics
            .actions
            .inc_pods_skipped(&skip.policy, skip.reason);
        let note = format!(
            "not moved off dead node {}: {} (policy {})",
            skip.node,
            skip.reason.as_str(),
            skip.policy
        );
        info!(pod = %skip.pod, reason = skip.reason.as_str(), "pod skipped");
        // A pod without a claim loses nothing when its node dies and Kubernetes replaces it
        // itself; an event on each (hundreds on a busy node) would only bury the ones that
        // matter. The metric counts them.
        if skip.reason == Skip::Ineligible(SkipReason::NoPersistentVolumeClaim) {
            return;
        }
        // Every pod skipped but a replacement is left on a dead node, most of them stuck there.
        self.event(EventNote {
            regarding: pod_reference(&skip.pod, &skip.uid),
            warning: skip.reason != Skip::Replacement,
            reason: "FailoverSkipped",
            action: "Skip",
            note,
        })
        .await;
    }

    pub(super) async fn announce(&self, f: &Incident, change: &PhaseChange) {
        let (warning, reason, note) = match change {
            PhaseChange::Acted { .. } => return,
            PhaseChange::Detached { .. } => (
                false,
                "VolumesDetached",
                format!("volumes of the moved pods left dead node {}", f.node),
            ),
            PhaseChange::Recovered { .. } => {
                let total = f.durations().into_iter().find(|(p, _)| *p == Phase::Total);
                let secs = total.map_or(String::new(), |(_, d)| {
                    format!(" in {:.1}s", d.as_secs_f64())
                });
                (
                    false,
                    "FailoverRecovered",
                    format!("replacements run on healthy nodes{secs}"),
                )
            }
            PhaseChange::DetachTimedOut { waited, volumes } => {
                self.metrics.failovers.inc_detach_timeouts(&f.policy);
                (
                    true,
                    "DetachTimeout",
                    format!(
                        "volumes {} still attached to dead node {} after {}s",
                        volumes.join(", "),
                        f.node,
                        waited.as_secs()
                    ),
                )
            }
        };
        self.event(self.node_event(&f.node, warning, reason, "Follow", note.clone()))
            .await;
        if let Some(p) = self.state.policies.get(&f.policy) {
            let regarding = p.object_ref(&());
            self.event(EventNote {
                regarding,
                warning,
                reason,
                action: "Follow",
                note,
            })
            .await;
        }
    }

    pub(super) async fn write_statuses(&mut self, health: &HealthBook) {
        // Every replica follows the agents' coverage: one that takes the lead knows already.
        let now = Instant::now();
        self.coverage.observe(&self.state.view, now);
        self.work_out_coverage(now);
        if !self.leading {
            self.metrics.detection.clear_nodes_unprotected();
            self.metrics.protection.clear();
            return;
        }
        let policies: Vec<Arc<PodHAPolicy>> = self.state.policies.values().cloned().collect();
        for policy in policies {
            let name = policy.name_any();
            let watched = health.get(&name);
            let unprotected = match watched {
                Some(nodes) => self.coverage.unprotected(&policy, nodes, now),
                None => Some(Vec::new()),
            };
            if let Some(unprotected) = &unprotected {
                self.metrics
                    .detection
                    .set_nodes_unprotected(&name, unprotected.len());
            }
            let status = self.policy_status(&policy, watched, unprotected.as_deref());
            let before = self
                .reported
                .last_status
                .get(&name)
                .or(policy.status.as_ref());
            let events = condition_events(&policy, before, &status);
            if self.write_status(name, status).await {
                for event in events {
                    self.event(event).await;
                }
            }
        }
        self.write_unreadable_statuses().await;
    }

    /// Writes `status` on the policy `name` unless it is what was written last; returns
    /// whether it wrote.
    async fn write_status(&mut self, name: String, status: PodHAPolicyStatus) -> bool {
        if self.reported.last_status.get(&name) == Some(&status) {
            return false;
        }
        self.reported
            .last_status
            .insert(name.clone(), status.clone());
        self.out
            .writes
            .report(Report::Status {
                policy: name,
                status,
            })
            .await;
        true
    }

    /// Each policy podha cannot read says so on itself (status and a Warning event, when that
    /// changes); the others go on.
    async fn write_unreadable_statuses(&mut self) {
        let now = self.wall.time(Instant::now());
        let unreadable: Vec<_> = self.state.unreadable_policies.values().cloned().collect();
        for policy in unreadable {
            let name = policy.metadata.name.clone().unwrap_or_default();
            let status = unreadable_status(&policy, &now);
            if !self.write_status(name.clone(), status).await {
                continue;
            }
            warn!(policy = %name, error = %policy.error, "cannot read the policy; acting on none of its nodes");
            let regarding = ObjectReference {
                api_version: Some(PodHAPolicy::api_version(&()).into_owned()),
                kind: Some(PodHAPolicy::kind(&()).into_owned()),
                name: Some(name),
                uid: policy.metadata.uid.clone(),
                ..ObjectReference::default()
            };
            self.event(EventNote {
                regarding,
                warning: true,
                reason: "PolicyUnreadable",
                action: "Read",
                note: policy.note(),
            })
            .await;
        }
    }

    /// The status of one policy now (no await inside: the borrowed facts stay on this side).
    pub(super) fn policy_status(
        &self,
        policy: &PodHAPolicy,
        health: Option<&BTreeMap<String, NodeHealth>>,
        unprotected: Option<&[(String, AgentGap)]>,
    ) -> PodHAPolicyStatus {
        let name = policy.name_any();
        let empty = BTreeMap::new();
        let (open, done) = self.ledger.of_policy(&name);
        let wall = self.wall;
        let paused_nodes = paused_nodes(policy, health.unwrap_or(&empty), &self.state.view);
        self.metrics.detection.set_paused_nodes(&name, paused_nodes);
        policy_status(&PolicyFacts {
            policy,
            health: health.unwrap_or(&empty),
            open: &open,
            finished: &done,
            wall: &|i| wall.time(i),
            held: self.reported.policy_holds.get(&name),
            now: wall.time(Instant::now()),
            unprotected,
            paused_nodes,
            coverage: self.pod_coverage.of(&name),
        })
    }

    pub(super) fn node_event(
        &self,
        node: &str,
        warning: bool,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) -> EventNote {
        let regarding = match self.state.view.nodes.get(node) {
            Some(n) => n.object_ref(&()),
            None => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..ObjectReference::default()
            },
        };
        EventNote {
            regarding,
            warning,
            reason,
            action,
            note,
        }
    }
}

impl Actor {
    /// Events go out only from the leader.
    pub(super) async fn event(&self, note: EventNote) {
        if self.leading {
            self.out.writes.report(Report::Event(note)).await;
        }
    }

    /// `podha_nodes{state}`: every watched node once, in the worst state any policy sees.
    pub(super) fn count_nodes(&self, health: &HealthBook) {
        let mut worst: BTreeMap<&str, u8> = BTreeMap::new();
        for nodes in health.values() {
            for (node, h) in nodes {
                let rank = match h {
                    NodeHealth::Healthy => 0,
                    NodeHealth::Suspect { .. } => 1,
                    NodeHealth::Failed { .. } => 2,
                };
                let entry = worst.entry(node).or_default();
                *entry = (*entry).max(rank);
            }
        }
        let count = |r| worst.values().filter(|v| **v == r).count();
        self.metrics
            .detection
            .set_nodes(count(0), count(1), count(2));
    }
}

/// The events of a policy's conditions, once when a condition takes the reason (compared
/// with the status written last, or stored when this replica took the lead, so that a new
/// leader does not say it again): a Warning when watched nodes lack an agent that could prove
/// their fence, a Normal event when the taint follows the judgement alone.
fn condition_events(
    policy: &PodHAPolicy,
    before: Option<&PodHAPolicyStatus>,
    after: &PodHAPolicyStatus,
) -> Vec<EventNote> {
    let announced = [
        (
            condition::DEGRADED,
            condition::REASON_AGENTS_MISSING,
            true,
            "AgentsMissing",
        ),
        (
            condition::READY,
            condition::REASON_WATCHING_WITHOUT_PROOF,
            false,
            "FencingProofNone",
        ),
    ];
    announced
        .into_iter()
        .filter_map(|(type_, reason, warning, event_reason)| {
            let now = condition_of(Some(after), type_).filter(|c| c.reason == reason)?;
            let said = condition_of(before, type_).is_some_and(|c| c.reason == reason);
            (!said).then(|| EventNote {
                regarding: policy.object_ref(&()),
                warning,
                reason: event_reason,
                action: "Watch",
                note: now.message.clone(),
            })
        })
        .collect()
}

pub(super) fn pod_reference(pod: &crate::view::ObjectKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(<Pod as Resource>::kind(&()).into_owned()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}

/// How many of the nodes `policy` watches podha takes no new action on: all of them while the
/// policy is paused, else those annotated `podha.io/paused`.
fn paused_nodes(
    policy: &PodHAPolicy,
    health: &BTreeMap<String, NodeHealth>,
    view: &crate::view::View,
) -> usize {
    if policy.spec.paused {
        return health.len();
    }
    health
        .keys()
        .filter(|name| {
            view.nodes
                .get(*name)
                .is_some_and(|n| crate::api::node_paused(n))
        })
        .count()
}
