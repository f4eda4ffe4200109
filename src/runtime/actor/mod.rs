//! The decision loop: one task that owns the cluster state, the health trackers, the ledger and
//! the open failovers. Watch changes and action results come in; every tick it probes, plans,
//! and sends writes out. Owning everything in one task keeps decisions sequential and lock-free.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::actuator::Outcome;
use super::prober::{
    self, AGENT_PROBE_INTERVAL, PlanSenders, ProbePlan, Target, agent_addr, kubelet_addr,
};
use super::state::{Change, ClusterState, Watch};
use super::status::{PolicyFacts, policy_status};
use super::writer::{
    ActResult, EventNote, Lanes, Report, ResultReceiver, count_dropped, intent_kind,
};
use crate::api::{
    NodeTaint, PodHAPolicy, PodHAPolicyStatus, RECENT_FAILOVERS_KEPT, TAINT_MARKER_ANNOTATION,
};
use crate::detach::{Failover, MovedPod, PhaseChange};
use crate::eligibility::SkipReason;
use crate::eligibility::node_selected;
use crate::health::{
    Cause, DetectionConfig, HealthTracker, NodeHealth, ProbeKind, ReadyStatus, Transition,
};
use crate::leader::Leadership;
use crate::metrics::{Metrics, TaintOperation};
use crate::planner::{
    self, HealthBook, Heartbeat, Heartbeats, HoldReason, Intent, Ledger, PlanInput, PodSkip,
    PolicyRef, Skip,
};

mod actions;
mod reports;
#[cfg(test)]
mod tests;

/// How often the loop wakes to probe and plan. Probes themselves run every policy `interval`.
pub const TICK: Duration = Duration::from_millis(200);
/// Retry delays for a failed action: doubled per failure up to the maximum.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error("the watch streams ended")]
    WatchesEnded,
}

/// One policy's judgement of one node, and when it probes next.
/// An action sent to the writer and not answered yet, or one waiting to be retried.
struct Pending {
    moved: Option<MovedPod>,
    policy: String,
    sent_at: Instant,
}

/// Converts the loop's monotonic instants to wall-clock times for status and events, from one
/// fixed anchor so a time never changes once computed.
#[derive(Clone, Copy)]
struct WallClock {
    instant: Instant,
    system: SystemTime,
}

impl WallClock {
    fn now() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    fn time(&self, at: Instant) -> Time {
        let system = if at >= self.instant {
            self.system + (at - self.instant)
        } else {
            self.system - (self.instant - at)
        };
        let ts = k8s_openapi::jiff::Timestamp::try_from(system)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        // Kubernetes stores times to the second; rounding here keeps status patches stable.
        Time(ts.round(k8s_openapi::jiff::Unit::Second).unwrap_or(ts))
    }
}

pub struct Actor {
    state: ClusterState,
    trackers: BTreeMap<(String, String), HealthTracker>,
    ledger: Ledger,
    /// Open failovers by node.
    failovers: BTreeMap<String, Failover>,
    /// Finished failovers per policy, newest first.
    history: BTreeMap<String, VecDeque<Failover>>,
    pending: BTreeMap<String, Pending>,
    retry_at: BTreeMap<String, (Instant, Duration)>,
    /// Skips, holds and dropped intents already reported, so each is counted once; grouped by
    /// scope (a node, or `policy:<name>` for a policy-wide hold) so a scope is forgotten whole
    /// when its incident closes or its hold ends.
    reported: BTreeMap<String, BTreeSet<String>>,
    last_status: BTreeMap<String, PodHAPolicyStatus>,
    /// Each policy's policy-wide hold in the last planning round.
    policy_holds: BTreeMap<String, HoldReason>,
    leading: bool,
    leadership: Leadership,
    ready: watch::Sender<bool>,
    writes: Lanes,
    probe_plans: PlanSenders,
    metrics: Arc<Metrics>,
    wall: WallClock,
}

impl Actor {
    pub fn new(
        leadership: Leadership,
        ready: watch::Sender<bool>,
        writes: Lanes,
        probe_plans: PlanSenders,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            state: ClusterState::default(),
            trackers: BTreeMap::new(),
            ledger: Ledger::default(),
            failovers: BTreeMap::new(),
            history: BTreeMap::new(),
            pending: BTreeMap::new(),
            retry_at: BTreeMap::new(),
            reported: BTreeMap::new(),
            last_status: BTreeMap::new(),
            policy_holds: BTreeMap::new(),
            leading: false,
            leadership,
            ready,
            writes,
            probe_plans,
            metrics,
            wall: WallClock::now(),
        }
    }

    /// Runs until the watches end (an error: they never end on their own).
    pub async fn run(
        mut self,
        changes: impl Stream<Item = Change> + Unpin,
        mut results: ResultReceiver,
        mut rounds: mpsc::Receiver<prober::Round>,
    ) -> Result<(), ActorError> {
        let mut changes = changes;
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(change) => {
                        if let Change::WatchError { watch } = &change {
                            self.metrics.operating.inc_watch_restarts(watch.as_str());
                        }
                        self.state.apply(change, Instant::now());
                    }
                    None => return Err(ActorError::WatchesEnded),
                },
                Some(result) = results.recv() => {
                    // A pod is deleted once its node's taint is on and its mark has landed:
                    // plan the delete now, not a tick later; once for all the results in.
                    let mut unblocks = false;
                    let mut next = Some(result);
                    while let Some(result) = next {
                        unblocks |= matches!(
                            result.intent,
                            Intent::TaintNode { .. } | Intent::MarkPodNotReady { .. }
                        );
                        self.on_result(result, Instant::now());
                        next = results.try_recv().ok();
                    }
                    if unblocks {
                        self.tick(Instant::now()).await;
                    }
                }
                Some(round) = rounds.recv() => {
                    let received = Instant::now();
                    for (node, result) in round.results {
                        if let Some(obs) = self.state.observations.get_mut(&node) {
                            match result {
                                Some(result) => {
                                    obs.observe_probe(round.kind, result, round.sent, received);
                                }
                                None => obs.forget_probe(round.kind),
                            }
                        }
                    }
                }
                _ = ticker.tick() => self.tick(Instant::now()).await,
            }
        }
    }

    async fn event(&self, note: EventNote) {
        if self.leading {
            self.writes.report(Report::Event(note)).await;
        }
    }

    fn follow_leadership(&mut self, now: Instant) {
        let leading = self.leadership.may_write(now);
        if leading != self.leading {
            self.leading = leading;
            self.metrics.set_leader(leading);
            if leading {
                // What a follower saw may be stale; re-baseline before judging anything.
                for obs in self.state.observations.values_mut() {
                    obs.gap(now);
                }
                self.last_status.clear();
                info!("became leader");
            } else {
                info!("lost leadership; holding every write");
            }
        }
    }

    async fn tick(&mut self, now: Instant) {
        self.follow_leadership(now);
        let synced = self.state.synced();
        self.metrics.set_cache_synced(synced);
        self.ready
            .send_if_modified(|r| std::mem::replace(r, synced) != synced);
        if !synced {
            return;
        }
        self.forget_deleted_policies();
        let transitions = self.probe(now);
        for (policy, node, transition) in transitions {
            self.on_transition(&policy, &node, transition).await;
        }
        self.open_resumed_incidents();
        self.adopt_earlier_actions(now);
        let health = self.health_book();
        self.count_nodes(&health);

        let policies: Vec<(String, Arc<PodHAPolicy>)> = self
            .state
            .policies
            .iter()
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        let refs: Vec<PolicyRef<'_>> = policies
            .iter()
            .map(|(name, p)| PolicyRef {
                name,
                spec: &p.spec,
            })
            .collect();
        let heartbeats = self.heartbeats();
        let plan = planner::plan(&PlanInput {
            policies: &refs,
            health: &health,
            view: &self.state.view,
            ledger: &self.ledger,
            heartbeats: &heartbeats,
            now,
        });
        self.policy_holds = plan
            .intents
            .iter()
            .filter_map(|i| match i {
                Intent::Hold {
                    policy,
                    node: None,
                    reason,
                } => Some((policy.clone(), reason.clone())),
                _ => None,
            })
            .collect();
        let held: BTreeSet<String> = self
            .policy_holds
            .keys()
            .map(|policy| format!("policy:{policy}"))
            .collect();
        self.reported
            .retain(|scope, _| !scope.starts_with("policy:") || held.contains(scope));
        for intent in plan.intents {
            self.dispatch(intent, now).await;
        }
        for skip in plan.skips {
            self.report_skip(skip).await;
        }
        self.follow_failovers(now, &health).await;
        self.metrics
            .operating
            .touch_watches(Watch::ALL.map(Watch::as_str));
        for policy in self.state.policies.keys() {
            self.metrics.touch_policy(policy);
        }
        self.metrics.operating.set_failovers_open(
            self.state.policies.keys().map(String::as_str),
            self.failovers
                .values()
                .map(|f| (f.policy.as_str(), f.phase())),
        );
        self.write_statuses(&health).await;
    }

    fn forget_deleted_policies(&mut self) {
        let live = &self.state.policies;
        let gone: Vec<String> = self
            .last_status
            .keys()
            .filter(|p| !live.contains_key(*p))
            .cloned()
            .collect();
        for policy in gone {
            self.metrics.forget_policy(&policy);
            self.last_status.remove(&policy);
            self.history.remove(&policy);
        }
        self.trackers
            .retain(|(policy, _), _| live.contains_key(policy));
    }

    /// Runs due probes; returns the transitions, in policy and node order. On the same walk over
    /// (policy, node) it tells the TCP prober which nodes to connect to: those watched by a
    /// policy with the `KubeletTCP` signal, at the shortest such interval and timeout.
    fn probe(&mut self, now: Instant) -> Vec<(String, String, Transition)> {
        let mut transitions = Vec::new();
        let mut selected = BTreeSet::new();
        let mut tcp_interval: Option<Duration> = None;
        let mut tcp_targets: BTreeMap<&str, Target> = BTreeMap::new();
        let mut agent_timeout = AGENT_PROBE_INTERVAL;
        for (name, policy) in &self.state.policies {
            let Ok(cfg) = DetectionConfig::try_from(&policy.spec.detection) else {
                continue;
            };
            if cfg.signals.kubelet_tcp {
                tcp_interval = Some(tcp_interval.map_or(cfg.interval, |i| i.min(cfg.interval)));
            }
            if cfg.signals.agent {
                agent_timeout = agent_timeout.min(cfg.tcp_timeout);
            }
            for (node_name, node) in &self.state.view.nodes {
                if !node_selected(&policy.spec, node) {
                    continue;
                }
                if cfg.signals.kubelet_tcp {
                    tcp_targets
                        .entry(node_name)
                        .and_modify(|t| t.timeout = t.timeout.min(cfg.tcp_timeout))
                        .or_insert_with(|| Target {
                            node: node_name.clone(),
                            addr: kubelet_addr(node),
                            timeout: cfg.tcp_timeout,
                        });
                }
                let Some(obs) = self.state.observations.get(node_name) else {
                    continue;
                };
                let key = (name.clone(), node_name.clone());
                selected.insert(key.clone());
                let tracker = self
                    .trackers
                    .entry(key)
                    .or_insert_with(|| resumed_tracker(node, name, obs, now));
                if let Some(t) = tracker.poll(now, obs, &cfg) {
                    transitions.push((name.clone(), node_name.clone(), t));
                }
            }
        }
        publish(
            &self.probe_plans.kubelet,
            ProbePlan {
                interval: tcp_interval.unwrap_or_default(),
                targets: tcp_targets.into_values().collect(),
            },
        );
        publish(&self.probe_plans.agent, self.agent_plan(agent_timeout));
        self.trackers.retain(|key, _| selected.contains(key));
        transitions
    }

    /// The leader asks every node that runs a podha agent, whether or not a policy listens:
    /// an agent podha stops hearing fences its node (see `crate::agent`), so every agent must be
    /// heard while podha leads. A follower asks none (only the leader's hearing counts).
    fn agent_plan(&self, timeout: Duration) -> ProbePlan {
        if !self.leading {
            return ProbePlan::default();
        }
        let targets = self
            .state
            .view
            .nodes
            .iter()
            .filter_map(|(name, node)| {
                agent_addr(node).map(|addr| Target {
                    node: name.clone(),
                    addr: Some(addr),
                    timeout,
                })
            })
            .collect();
        ProbePlan {
            interval: AGENT_PROBE_INTERVAL,
            targets,
        }
    }

    async fn on_transition(&mut self, policy: &str, node: &str, t: Transition) {
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
                self.metrics.inc_node_failures(policy);
                if self.ledger.open(node, since, &self.state.view) {
                    let alive = self
                        .state
                        .observations
                        .get(node)
                        .and_then(|o| o.last_seen_alive());
                    self.failovers
                        .insert(node.to_string(), Failover::new(node, policy, alive, since));
                }
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

    /// Every Failed node has an incident. A tracker resumed as Failed (the node carries podha's
    /// taint from a previous leader or process) made no transition, so open it here: the
    /// failover that leader started is finished, and nothing it did is repeated (deleted pods
    /// are gone from the view, the taint is already on the node).
    fn open_resumed_incidents(&mut self) {
        for ((policy, node), tracker) in &self.trackers {
            if let NodeHealth::Failed { since } = tracker.state()
                && tracker.judged_failed()
                && self.ledger.open(node, since, &self.state.view)
            {
                let alive = self
                    .state
                    .observations
                    .get(node)
                    .and_then(|o| o.last_seen_alive());
                self.failovers.insert(
                    node.clone(),
                    Failover::new(node.clone(), policy.clone(), alive, since),
                );
                info!(
                    policy,
                    node, "resuming the failover of a node podha tainted before"
                );
            }
        }
    }

    /// A failover whose node already carries podha's taint for its policy, put there by
    /// another replica (this one followed meanwhile) or an earlier process (resumed above), is
    /// past Acting: that action was taken, whether or not anything is left for this one to do.
    /// Not while this process's own taint is in flight: its result records the action, and
    /// observes it.
    fn adopt_earlier_actions(&mut self, now: Instant) {
        for (node, failover) in &mut self.failovers {
            let tainted = self
                .state
                .view
                .nodes
                .get(node)
                .is_some_and(|n| podha_taint_proves_failure(n, &failover.policy));
            if failover.acted_at.is_none()
                && tainted
                && !self.pending.contains_key(&taint_key(node))
            {
                failover.adopt_action(now);
            }
        }
    }

    fn heartbeats(&self) -> Heartbeats {
        self.state
            .observations
            .iter()
            .map(|(node, obs)| {
                let hb = Heartbeat {
                    last_renewal: obs.last_renewal(),
                    silent_since: obs.lease_baseline(),
                    renew_period: obs.renew_period_bound(),
                    tcp_answered: obs.tcp_answered(),
                    tcp_silent_since: obs.tcp_silent_since(),
                    agent_answered: obs.probed(ProbeKind::Agent).answered,
                    agent_silent_since: obs.probed(ProbeKind::Agent).silent_since,
                    tainted_since: obs.podha_tainted_since(),
                };
                (node.clone(), hb)
            })
            .collect()
    }

    fn health_book(&self) -> HealthBook {
        let mut book = HealthBook::new();
        for ((policy, node), tracker) in &self.trackers {
            book.entry(policy.clone())
                .or_default()
                .insert(node.clone(), tracker.state());
        }
        book
    }

    fn count_nodes(&self, health: &HealthBook) {
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
        self.metrics.set_nodes(count(0), count(1), count(2));
    }

    /// Advances every open failover; closes those whose node is back.
    async fn follow_failovers(&mut self, now: Instant, health: &HealthBook) {
        let nodes: Vec<String> = self.failovers.keys().cloned().collect();
        for node in nodes {
            let Some(failover) = self.failovers.get_mut(&node) else {
                continue;
            };
            let timeout = self
                .state
                .policies
                .get(&failover.policy)
                .map_or(Duration::from_secs(390), |p| p.spec.detach_timeout.get());
            let changes = failover.update(now, &self.state.view, timeout);
            let failover = failover.clone();
            for change in &changes {
                observe(&self.metrics, &failover, change);
                self.announce(&failover, change).await;
            }
            let still_failed = health
                .values()
                .any(|n| n.get(&node).is_some_and(|h| h.is_failed()));
            if !still_failed {
                self.close_incident(&node, now);
            }
        }
    }

    fn close_incident(&mut self, node: &str, now: Instant) {
        self.ledger.close(node, now);
        self.reported.remove(node);
        if let Some(mut failover) = self.failovers.remove(node) {
            if failover.recovered_at.is_none() {
                failover.record_node_returned(now);
            }
            let history = self.history.entry(failover.policy.clone()).or_default();
            history.push_front(failover);
            history.truncate(RECENT_FAILOVERS_KEPT);
        }
    }
}

/// Hands a prober its plan, waking it only when the plan changed.
fn publish(sender: &watch::Sender<ProbePlan>, plan: ProbePlan) {
    sender.send_if_modified(|current| {
        let changed = *current != plan;
        if changed {
            *current = plan;
        }
        changed
    });
}

/// A tracker for a node a policy starts watching. A node carrying podha's taint marker for
/// this policy was judged dead before (by a previous process or leader): it resumes as Failed
/// so a restart does not by itself make it look healthy.
fn resumed_tracker(
    node: &Node,
    policy: &str,
    obs: &crate::health::NodeObservations,
    now: Instant,
) -> HealthTracker {
    if podha_taint_proves_failure(node, policy) {
        HealthTracker::resume_failed(obs, now)
    } else {
        HealthTracker::new(obs)
    }
}

/// Whether the cluster itself shows that `policy` failed this node over before (another
/// replica, or this process before a restart): podha's marker names the policy, podha's taint
/// is still on, and the node is not Ready. A marker alone proves nothing (an admin may have
/// removed the taint by hand, as Kubernetes' docs tell them to), and a Ready node is back.
fn podha_taint_proves_failure(node: &Node, policy: &str) -> bool {
    let marked = node
        .annotations()
        .get(TAINT_MARKER_ANNOTATION)
        .is_some_and(|p| p == policy);
    marked
        && NodeTaint::ALL.iter().any(|t| t.on(node))
        && ReadyStatus::from_node(node) != ReadyStatus::True
}

fn observe(metrics: &Metrics, f: &Failover, change: &PhaseChange) {
    for (phase, duration) in f.durations_for(change) {
        metrics.observe_phase(&f.policy, phase, duration);
    }
}

/// The node an intent is about ("" for a policy-wide hold).
fn intent_node(intent: &Intent) -> &str {
    match intent {
        Intent::MarkPodNotReady { node, .. }
        | Intent::ForceDeletePod { node, .. }
        | Intent::TaintNode { node, .. }
        | Intent::RequestFence { node, .. }
        | Intent::RemoveTaint { node } => node,
        Intent::Hold { node, .. } => node.as_deref().unwrap_or(""),
    }
}

/// The key of a taint of `node` among the intents in flight.
fn taint_key(node: &str) -> String {
    format!("taint/{node}")
}

fn intent_key(intent: &Intent) -> String {
    match intent {
        Intent::MarkPodNotReady { uid, .. } => format!("mark/{uid}"),
        Intent::ForceDeletePod { uid, .. } => format!("delete/{uid}"),
        Intent::TaintNode { node, .. } => taint_key(node),
        Intent::RemoveTaint { node } => format!("untaint/{node}"),
        Intent::RequestFence { node, .. } => format!("fence/{node}"),
        Intent::Hold {
            policy,
            node,
            reason,
        } => {
            format!(
                "hold/{policy}/{}/{}",
                node.as_deref().unwrap_or(""),
                reason.as_str()
            )
        }
    }
}

fn describe(intent: &Intent) -> String {
    match intent {
        Intent::MarkPodNotReady { pod, node, .. } => {
            format!("mark pod {pod} on dead node {node} NotReady, then force-delete it")
        }
        Intent::ForceDeletePod { pod, node, .. } => {
            format!("force-delete pod {pod} on dead node {node}")
        }
        Intent::TaintNode { node, taint, .. } => {
            format!("taint node {node} {}:{}", taint.key(), taint.effect())
        }
        Intent::RemoveTaint { node } => format!("remove the out-of-service taint from node {node}"),
        Intent::RequestFence { node, .. } => {
            format!("ask for a fence of node {node} (podha.io/fence-request)")
        }
        Intent::Hold { .. } => "hold".to_string(),
    }
}

fn pod_reference(pod: &crate::view::ObjectKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(<Pod as Resource>::kind(&()).into_owned()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}
