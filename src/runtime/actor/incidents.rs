//! Judge and follow, as the loop lives them: a node judged dead opens its incident, one
//! resumed from an earlier leader's taint is opened too, and every open incident advances from
//! the view until its node is healthy again.

use tokio::time::Instant;
use tracing::{info, warn};

use super::Actor;
use super::judge::{self, Judgement, podha_taint_proves_failure};
use crate::api::default_detach_timeout;
use crate::health::{Cause, NodeHealth};
use crate::incident::{Incident, PhaseChange};
use crate::metrics::Metrics;
use crate::planner::{HealthBook, taint_key};

impl Actor {
    /// Judge: advance the trackers, tell the probers what to probe, open an incident for every
    /// node judged dead.
    pub(super) async fn judge_nodes(&mut self, now: Instant) {
        let judgements = self.judge.advance(&self.state, now);
        self.judge.follow_agent_quorum(&self.state, now);
        let (kubelet, agent) = judge::probe_plans(&self.state, self.leading);
        judge::publish(&self.out.probe_plans.kubelet, kubelet);
        judge::publish(&self.out.probe_plans.agent, agent);
        for judgement in judgements {
            self.on_judgement(judgement).await;
        }
        self.open_resumed_incidents();
        self.adopt_earlier_actions(now);
    }

    async fn on_judgement(&mut self, j: Judgement) {
        let (policy, node, t) = (j.policy.as_str(), j.node.as_str(), j.transition);
        if t.from.as_str() == t.to.as_str() {
            return;
        }
        let detail = match &t.cause {
            Cause::Probe(probe) => probe.to_string(),
            Cause::Gap => "a gap in podha's view reset the count".to_string(),
        };
        match t.to {
            NodeHealth::Failed { since } => {
                warn!(policy, node, %detail, "node judged dead");
                self.metrics.detection.inc_node_failures(policy);
                self.open_incident(policy, node, since);
                let note = format!("policy {policy} judged node {node} dead: {detail}");
                self.event(self.node_event(node, true, "NodeFailed", "Detect", note))
                    .await;
            }
            NodeHealth::Healthy if t.from.is_failed() => {
                info!(policy, node, "node healthy again");
                let note = format!("policy {policy} sees node {node} alive again: {detail}");
                self.event(self.node_event(node, false, "NodeRecovered", "Detect", note))
                    .await;
            }
            _ => {}
        }
    }

    /// Opens `node`'s incident unless one is open; returns whether it opened one.
    fn open_incident(&mut self, policy: &str, node: &str, since: Instant) -> bool {
        let alive = self
            .state
            .observations
            .get(node)
            .and_then(|o| o.last_seen_alive());
        self.ledger
            .open(node, policy, alive, since, &self.state.view)
    }

    /// Every Failed node has an incident. A tracker resumed as Failed (the node carries podha's
    /// taint from a previous leader or process) made no transition, so open it here: the
    /// failover that leader started is finished, and nothing it did is repeated (deleted pods
    /// are gone from the view, the taint is already on the node).
    fn open_resumed_incidents(&mut self) {
        let resumed: Vec<(String, String, Instant)> = self
            .judge
            .resumed_failures()
            .map(|(p, n, since)| (p.to_string(), n.to_string(), since))
            .collect();
        for (policy, node, since) in resumed {
            if self.open_incident(&policy, &node, since) {
                info!(
                    policy,
                    node, "resuming the failover of a node podha tainted before"
                );
            }
        }
    }

    /// An incident whose node already carries podha's taint for its policy, put there by
    /// another replica (this one followed meanwhile) or an earlier process (resumed above), is
    /// past Acting: that action was taken, whether or not anything is left for this one to do.
    /// Not while this process's own taint is in flight: its result records the action, and
    /// observes it.
    fn adopt_earlier_actions(&mut self, now: Instant) {
        for incident in self.ledger.iter_mut() {
            let tainted = self
                .state
                .view
                .nodes
                .get(&incident.node)
                .is_some_and(|n| podha_taint_proves_failure(n, &incident.policy));
            if incident.acted_at.is_none()
                && tainted
                && !self.schedule.in_flight(&taint_key(&incident.node))
            {
                incident.adopt_action(now);
            }
        }
    }

    /// Follow: advances every open incident from the view; closes those whose node is back.
    pub(super) async fn follow_incidents(&mut self, now: Instant, health: &HealthBook) {
        let nodes: Vec<String> = self.ledger.iter().map(|i| i.node.clone()).collect();
        for node in nodes {
            let Some(incident) = self.ledger.get_mut(&node) else {
                continue;
            };
            let timeout = self
                .state
                .policies
                .get(&incident.policy)
                .map_or(default_detach_timeout(), |p| p.spec.detach_timeout)
                .get();
            let changes = incident.follow(now, &self.state.view, timeout);
            let incident = incident.clone();
            for change in &changes {
                observe_phases(&self.metrics, &incident, change);
                self.announce(&incident, change).await;
            }
            let still_failed = health
                .values()
                .any(|n| n.get(&node).is_some_and(|h| h.is_failed()));
            if !still_failed {
                self.ledger.close(&node, now);
                self.reported.forget_scope(&node);
            }
        }
    }

    /// Notes an action taken for `node`'s incident (and the pod it moved, if any); the first
    /// one ends the detect and act phases.
    pub(super) fn record_action(
        &mut self,
        node: &str,
        now: Instant,
        moved: Option<crate::incident::MovedPod>,
    ) {
        if let Some(incident) = self.ledger.get_mut(node)
            && let Some(change) = incident.record_action(now, moved)
        {
            observe_phases(&self.metrics, incident, &change);
        }
    }
}

/// Observes, once, the durations of the phases a step completes; a recovery makes the
/// failover its policy's last.
fn observe_phases(metrics: &Metrics, incident: &Incident, change: &PhaseChange) {
    for (phase, duration) in incident.durations_for(change) {
        metrics
            .failovers
            .observe_phase(&incident.policy, phase, duration);
    }
    if let PhaseChange::Recovered { .. } = change {
        metrics.failovers.set_last_failover(
            &incident.policy,
            &incident.node,
            &incident.durations(),
        );
    }
}
