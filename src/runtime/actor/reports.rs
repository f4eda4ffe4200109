//! What the decision loop tells people: events, holds and skips reported once, phase
//! changes announced, policy statuses written.

use super::*;

impl Actor {
    /// Events from result handling go out without awaiting: the channel has room, and a full
    /// channel only loses an event, never an action.
    pub(super) fn queue_event(&self, note: EventNote) {
        if self.leading {
            self.writes.try_report(Report::Event(note));
        }
    }

    /// Whether `key` is reported for the first time in `scope` (and remember it).
    pub(super) fn first_report(&mut self, scope: &str, key: String) -> bool {
        self.reported
            .entry(scope.to_string())
            .or_default()
            .insert(key)
    }

    pub(super) async fn report_hold(
        &mut self,
        policy: &str,
        node: Option<&str>,
        reason: &HoldReason,
    ) {
        let would = match reason {
            HoldReason::DryRun { would } => intent_key(would),
            HoldReason::OutOfServiceRefused { pod, .. } => pod.to_string(),
            HoldReason::TooManyUnhealthy { .. }
            | HoldReason::Unconfirmed { .. }
            | HoldReason::FencingPending { .. } => String::new(),
        };
        let incident = node.and_then(|n| self.ledger.get(n)).map(|i| i.since);
        let key = format!("hold/{policy}/{}/{would}/{incident:?}", reason.as_str());
        let scope = match node {
            Some(node) => node.to_string(),
            None => format!("policy:{policy}"),
        };
        if !self.first_report(&scope, key) {
            return;
        }
        self.metrics.actions.inc_actions_held(policy, reason.kind());
        let note = match reason {
            HoldReason::TooManyUnhealthy {
                failed,
                watched,
                max,
            } => format!(
                "holding every action: {failed} of {watched} watched nodes failed, more than \
                 safety.maxUnhealthy allows ({max})"
            ),
            HoldReason::DryRun { would } => format!("dry run: would {}", describe(would)),
            HoldReason::Unconfirmed { unheard, watched } => format!(
                "holding: {unheard} of {watched} watched nodes have not renewed their Lease since \
                 node {} went silent, so a partition cannot be told from one dead node",
                node.unwrap_or("?")
            ),
            HoldReason::OutOfServiceRefused { pod, why } => format!(
                "out-of-service taint refused on node {}: it would remove pod {pod}, which must \
                 stay ({why}); fencing the node for the scheduler and deleting only the eligible \
                 pods, whose volumes detach after the attach/detach controller's 6-minute wait",
                node.unwrap_or("?")
            ),
            HoldReason::FencingPending { proof } => format!(
                "node {} is judged dead, but fencing.proof {} is not on it: nothing is tainted \
                 or deleted there until it is (a node that could still run keeps its volumes)",
                node.unwrap_or("?"),
                proof.as_str()
            ),
        };
        warn!(policy, %note, "action held");
        let on_node_reason = match reason {
            HoldReason::OutOfServiceRefused { .. } => Some("OutOfServiceTaintRefused"),
            HoldReason::FencingPending { .. } => Some("FencingPending"),
            _ => None,
        };
        if let (Some(event_reason), Some(node)) = (on_node_reason, node) {
            let on_node = self.node_event(node, true, event_reason, "Hold", note.clone());
            self.event(on_node).await;
        }
        if matches!(reason, HoldReason::TooManyUnhealthy { .. }) {
            for f in self.failovers.values_mut().filter(|f| f.policy == policy) {
                f.record_hold(note.clone());
            }
        }
        if let Some(p) = self.state.policies.get(policy) {
            let regarding = p.object_ref(&());
            let reason_label = match reason {
                HoldReason::DryRun { .. } => "DryRun",
                HoldReason::TooManyUnhealthy { .. } | HoldReason::Unconfirmed { .. } => {
                    "ActionsHeld"
                }
                HoldReason::OutOfServiceRefused { .. } => "OutOfServiceTaintRefused",
                HoldReason::FencingPending { .. } => "FencingPending",
            };
            self.event(EventNote {
                regarding,
                warning: true,
                reason: reason_label,
                action: "Hold",
                note,
            })
            .await;
        }
    }

    pub(super) async fn report_skip(&mut self, skip: PodSkip) {
        let incident = self.ledger.get(&skip.node).map(|i| i.since);
        let key = format!("skip/{}/{}/{incident:?}", skip.uid, skip.reason.as_str());
        if !self.first_report(&skip.node, key) {
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
        self.event(EventNote {
            regarding: pod_reference(&skip.pod, &skip.uid),
            warning: false,
            reason: "FailoverSkipped",
            action: "Skip",
            note,
        })
        .await;
    }

    pub(super) async fn announce(&self, f: &Failover, change: &PhaseChange) {
        let (warning, reason, note) = match change {
            PhaseChange::Acted { .. } => return,
            PhaseChange::Detached { .. } => (
                false,
                "VolumesDetached",
                format!("volumes of the moved pods left dead node {}", f.node),
            ),
            PhaseChange::Recovered { .. } => {
                let total = f
                    .durations()
                    .into_iter()
                    .find(|(p, _)| *p == crate::metrics::Phase::Total);
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
        if !self.leading {
            return;
        }
        let policies: Vec<Arc<PodHAPolicy>> = self.state.policies.values().cloned().collect();
        for policy in policies {
            let name = policy.name_any();
            let status = self.policy_status(&policy, health.get(&name));
            if self.last_status.get(&name) == Some(&status) {
                continue;
            }
            self.last_status.insert(name.clone(), status.clone());
            self.writes
                .report(Report::Status {
                    policy: name,
                    status,
                })
                .await;
        }
    }

    /// The status of one policy now (no await inside: the borrowed facts stay on this side).
    pub(super) fn policy_status(
        &self,
        policy: &PodHAPolicy,
        health: Option<&BTreeMap<String, NodeHealth>>,
    ) -> PodHAPolicyStatus {
        let name = policy.name_any();
        let empty = BTreeMap::new();
        let open: Vec<&Failover> = self
            .failovers
            .values()
            .filter(|f| f.policy == name)
            .collect();
        let done: Vec<&Failover> = self
            .history
            .get(&name)
            .map(|h| h.iter().collect())
            .unwrap_or_default();
        let wall = self.wall;
        policy_status(&PolicyFacts {
            policy,
            health: health.unwrap_or(&empty),
            open: &open,
            finished: &done,
            wall: &|i| wall.time(i),
            held: self.policy_holds.get(&name),
            now: wall.time(Instant::now()),
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
