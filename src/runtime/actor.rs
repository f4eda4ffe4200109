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
use super::prober::{self, ProbePlan, Target, kubelet_addr};
use super::state::{Change, ClusterState, Watch};
use super::status::{PolicyFacts, policy_status};
use super::writer::{ActResult, EventNote, Lanes, Report, ResultReceiver, intent_kind};
use crate::api::{
    NodeTaint, PodHAPolicy, PodHAPolicyStatus, RECENT_FAILOVERS_KEPT, TAINT_MARKER_ANNOTATION,
};
use crate::detach::{Failover, MovedPod, PhaseChange};
use crate::eligibility::SkipReason;
use crate::eligibility::node_selected;
use crate::health::{Cause, DetectionConfig, HealthTracker, NodeHealth, ReadyStatus, Transition};
use crate::metrics::{Metrics, TaintOperation};
use crate::planner::{
    self, HealthBook, Heartbeat, Heartbeats, HoldReason, Intent, Ledger, PlanInput, PodSkip,
    PolicyRef, Skip,
};

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
    is_leader: watch::Receiver<bool>,
    ready: watch::Sender<bool>,
    writes: Lanes,
    probe_plan: watch::Sender<ProbePlan>,
    metrics: Arc<Metrics>,
    wall: WallClock,
}

impl Actor {
    pub fn new(
        is_leader: watch::Receiver<bool>,
        ready: watch::Sender<bool>,
        writes: Lanes,
        probe_plan: watch::Sender<ProbePlan>,
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
            is_leader,
            ready,
            writes,
            probe_plan,
            metrics,
            wall: WallClock::now(),
        }
    }

    /// Runs until the watches end (an error: they never end on their own).
    pub async fn run(
        mut self,
        changes: impl Stream<Item = Change> + Unpin,
        mut results: ResultReceiver,
        mut tcp: mpsc::Receiver<prober::Round>,
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
                Some(round) = tcp.recv() => {
                    for (node, result) in round {
                        if let Some(obs) = self.state.observations.get_mut(&node) {
                            match result {
                                Some(result) => obs.observe_tcp(result),
                                None => obs.forget_tcp(),
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
        let leading = *self.is_leader.borrow_and_update();
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
        for (name, policy) in &self.state.policies {
            let Ok(cfg) = DetectionConfig::try_from(&policy.spec.detection) else {
                continue;
            };
            if cfg.signals.kubelet_tcp {
                tcp_interval = Some(tcp_interval.map_or(cfg.interval, |i| i.min(cfg.interval)));
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
        let plan = ProbePlan {
            interval: tcp_interval.unwrap_or_default(),
            targets: tcp_targets.into_values().collect(),
        };
        self.probe_plan.send_if_modified(|current| {
            let changed = *current != plan;
            if changed {
                *current = plan;
            }
            changed
        });
        self.trackers.retain(|key, _| selected.contains(key));
        transitions
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

    fn heartbeats(&self) -> Heartbeats {
        self.state
            .observations
            .iter()
            .map(|(node, obs)| {
                let hb = Heartbeat {
                    last_renewal: obs.last_renewal(),
                    silent_since: obs.lease_baseline(),
                    renew_period: obs.renew_period_bound(),
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

    async fn dispatch(&mut self, intent: Intent, now: Instant) {
        if let Intent::Hold {
            policy,
            node,
            reason,
        } = &intent
        {
            self.report_hold(policy, node.as_deref(), reason).await;
            return;
        }
        let key = intent_key(&intent);
        if self.pending.contains_key(&key) {
            return;
        }
        if let Some((at, _)) = self.retry_at.get(&key)
            && now < *at
        {
            return;
        }
        if !self.leading {
            if self.first_report(intent_node(&intent), format!("dropped/{key}")) {
                self.metrics.inc_intents_dropped(intent_kind(&intent));
            }
            return;
        }
        let (moved, policy) = match &intent {
            Intent::ForceDeletePod {
                node, uid, policy, ..
            }
            | Intent::MarkPodNotReady {
                node, uid, policy, ..
            } => {
                let pod = self
                    .state
                    .view
                    .pods_on(node)
                    .iter()
                    .find(|p| p.uid().as_deref() == Some(uid));
                (
                    pod.map(|p| MovedPod::from_pod(p, &self.state.view)),
                    policy.clone(),
                )
            }
            Intent::TaintNode { policy, .. } => (None, policy.clone()),
            Intent::RemoveTaint { node } => (None, self.marker_policy(node)),
            Intent::Hold { .. } => return,
        };
        let sent_at = Instant::now();
        self.pending.insert(
            key,
            Pending {
                moved,
                policy,
                sent_at,
            },
        );
        let node = match &intent {
            Intent::TaintNode { node, .. } | Intent::RemoveTaint { node } => {
                self.state.view.nodes.get(node).cloned()
            }
            _ => None,
        };
        self.writes.act(intent, node).await;
    }

    /// Notes an action taken for `node`'s failover (and the pod it moved, if any); the first
    /// one ends the detect phase.
    fn record_action(&mut self, node: &str, now: Instant, moved: Option<MovedPod>) {
        if let Some(f) = self.failovers.get_mut(node)
            && let Some(change) = f.record_action(now, moved)
        {
            observe(&self.metrics, f, &change);
        }
    }

    fn marker_policy(&self, node: &str) -> String {
        self.state
            .view
            .nodes
            .get(node)
            .and_then(|n| n.annotations().get(TAINT_MARKER_ANNOTATION).cloned())
            .unwrap_or_default()
    }

    fn on_result(&mut self, result: ActResult, now: Instant) {
        let key = intent_key(&result.intent);
        let Some(pending) = self.pending.remove(&key) else {
            return;
        };
        self.metrics
            .observe_action_latency(intent_kind(&result.intent), now - pending.sent_at);
        let outcome = match result.result {
            Ok(outcome) => outcome,
            Err(error) => {
                let delay = self
                    .retry_at
                    .get(&key)
                    .map_or(RETRY_MIN, |(_, d)| (*d * 2).min(RETRY_MAX));
                warn!(%key, %error, retry_in = ?delay, "action failed");
                self.retry_at.insert(key, (now + delay, delay));
                return;
            }
        };
        self.retry_at.remove(&key);
        let applied = outcome == Outcome::Applied;
        match &result.intent {
            Intent::MarkPodNotReady { node, uid, pod, .. } => match outcome {
                Outcome::Marked { resource_version } => {
                    self.ledger
                        .record_marked_not_ready(node, uid, resource_version);
                    info!(%pod, node, "pod marked NotReady");
                    self.record_action(node, now, None);
                }
                // Gone, or the name is another pod now: nothing left to delete; its volumes
                // are followed as for a delete.
                _ => {
                    self.ledger.record_deleted(node, uid);
                    self.record_action(node, now, pending.moved);
                }
            },
            Intent::ForceDeletePod {
                pod,
                uid,
                node,
                policy,
                ..
            } if outcome == Outcome::Changed => {
                self.ledger.record_changed_since_mark(node, uid);
                info!(%pod, node, "pod marked NotReady; it changed before the delete");
                let note = format!(
                    "marked NotReady: node {node} is dead (policy {policy}); the pod changed \
                     before it could be deleted"
                );
                self.queue_event(EventNote {
                    regarding: pod_reference(pod, uid),
                    warning: false,
                    reason: "PodMarkedNotReady",
                    action: "MarkNotReady",
                    note,
                });
            }
            Intent::ForceDeletePod {
                node,
                uid,
                pod,
                owner_kind,
                policy,
                ..
            } => {
                self.ledger.record_deleted(node, uid);
                if applied {
                    self.metrics.inc_pods_deleted(policy, owner_kind);
                    info!(%pod, node, "pod force-deleted");
                }
                self.record_action(node, now, pending.moved);
                if applied {
                    let marked = self
                        .ledger
                        .get(node)
                        .is_some_and(|i| i.marked_not_ready.contains_key(uid));
                    let how = if marked { "marked NotReady and " } else { "" };
                    let note =
                        format!("{how}force-deleted from dead node {node} (policy {policy})");
                    let regarding = pod_reference(pod, uid);
                    self.queue_event(EventNote {
                        regarding,
                        warning: false,
                        reason: "PodForceDeleted",
                        action: "ForceDelete",
                        note,
                    });
                }
            }
            Intent::TaintNode {
                node,
                policy,
                taint,
            } => {
                self.ledger.record_tainted(node);
                if applied {
                    self.metrics.inc_taints(policy, TaintOperation::Add);
                }
                self.record_action(node, now, None);
                if applied {
                    let note = format!(
                        "tainted {}={}:{} (policy {policy})",
                        taint.key(),
                        taint.value(),
                        taint.effect()
                    );
                    let reason = match taint {
                        NodeTaint::OutOfService => "OutOfServiceTaintAdded",
                        NodeTaint::Fence => "NodeFenced",
                    };
                    let ev = self.node_event(node, true, reason, "Taint", note);
                    self.queue_event(ev);
                }
            }
            Intent::RemoveTaint { node } => {
                if applied {
                    self.metrics
                        .inc_taints(&pending.policy, TaintOperation::Remove);
                    let note = "removed podha's taint: the node is back and holds no volume";
                    let ev = self.node_event(node, false, "TaintRemoved", "Untaint", note.into());
                    self.queue_event(ev);
                }
            }
            Intent::Hold { .. } => {}
        }
    }

    /// Events from result handling go out without awaiting: the channel has room, and a full
    /// channel only loses an event, never an action.
    fn queue_event(&self, note: EventNote) {
        if self.leading {
            self.writes.try_report(Report::Event(note));
        }
    }

    /// Whether `key` is reported for the first time in `scope` (and remember it).
    fn first_report(&mut self, scope: &str, key: String) -> bool {
        self.reported
            .entry(scope.to_string())
            .or_default()
            .insert(key)
    }

    async fn report_hold(&mut self, policy: &str, node: Option<&str>, reason: &HoldReason) {
        let would = match reason {
            HoldReason::DryRun { would } => intent_key(would),
            HoldReason::OutOfServiceRefused { pod, .. } => pod.to_string(),
            HoldReason::TooManyUnhealthy { .. } | HoldReason::Unconfirmed { .. } => String::new(),
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
        self.metrics.inc_actions_held(policy, reason.as_str());
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
        };
        warn!(policy, %note, "action held");
        if let (HoldReason::OutOfServiceRefused { .. }, Some(node)) = (reason, node) {
            let on_node =
                self.node_event(node, true, "OutOfServiceTaintRefused", "Hold", note.clone());
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

    async fn report_skip(&mut self, skip: PodSkip) {
        let incident = self.ledger.get(&skip.node).map(|i| i.since);
        let key = format!("skip/{}/{}/{incident:?}", skip.uid, skip.reason.as_str());
        if !self.first_report(&skip.node, key) {
            return;
        }
        self.metrics
            .inc_pods_skipped(&skip.policy, skip.reason.as_str());
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

    async fn announce(&self, f: &Failover, change: &PhaseChange) {
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
                self.metrics.inc_detach_timeouts(&f.policy);
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

    async fn write_statuses(&mut self, health: &HealthBook) {
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
    fn policy_status(
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

    fn node_event(
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
        | Intent::RemoveTaint { node } => node,
        Intent::Hold { node, .. } => node.as_deref().unwrap_or(""),
    }
}

fn intent_key(intent: &Intent) -> String {
    match intent {
        Intent::MarkPodNotReady { uid, .. } => format!("mark/{uid}"),
        Intent::ForceDeletePod { uid, .. } => format!("delete/{uid}"),
        Intent::TaintNode { node, .. } => format!("taint/{node}"),
        Intent::RemoveTaint { node } => format!("untaint/{node}"),
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::test_builders::*;

    const DRIVER: &str = "rwo.sim.podha.io";

    /// Issue 11, defect 1: a restart resumes a failover only on what the cluster proves. A
    /// leftover marker (taint removed by an admin) or a node that is Ready again resumes
    /// nothing; only marker + podha's taint + not Ready does.
    #[test]
    fn only_marker_taint_and_not_ready_resume_a_failover() {
        let marker = |n: Node| n.annotation(TAINT_MARKER_ANNOTATION, "p");
        let oos = |n: Node| {
            n.taint(
                crate::api::OUT_OF_SERVICE_TAINT_KEY,
                "nodeshutdown",
                "NoExecute",
            )
        };
        let cases = [
            ("marker only, node Ready", marker(mk_node("n")), false),
            (
                "marker only, node not Ready",
                marker(mk_node("n")).ready(false),
                false,
            ),
            ("taint, marker, Ready", oos(marker(mk_node("n"))), false),
            (
                "taint and marker of another policy",
                oos(mk_node("n").annotation(TAINT_MARKER_ANNOTATION, "q")).ready(false),
                false,
            ),
            (
                "taint without marker",
                oos(mk_node("n")).ready(false),
                false,
            ),
            (
                "taint, marker, not Ready",
                oos(marker(mk_node("n"))).ready(false),
                true,
            ),
        ];
        for (what, node, resumes) in cases {
            assert_eq!(podha_taint_proves_failure(&node, "p"), resumes, "{what}");
            let obs = crate::health::NodeObservations::new(Instant::now());
            let tracker = resumed_tracker(&node, "p", &obs, Instant::now());
            assert_eq!(tracker.state().is_failed(), resumes, "{what}");
            // Even a resumed failover is no judgement: nothing new is done before a probe fails.
            assert!(!tracker.judged_failed(), "{what}");
        }
    }

    struct Harness {
        actor: Actor,
        writes: crate::runtime::writer::LaneReceivers,
        metrics: Arc<Metrics>,
        _leader: watch::Sender<bool>,
        _plan: watch::Receiver<ProbePlan>,
    }

    /// An actor that leads, fed a complete initial list of these objects and a policy that
    /// judges a node by NodeReady alone, after one failed probe.
    fn harness(objects: Vec<Obj>) -> Harness {
        let (leader_tx, leader_rx) = watch::channel(true);
        let (ready_tx, _) = watch::channel(false);
        let (writes_tx, writes) = crate::runtime::writer::lanes();
        let (plan_tx, plan_rx) = watch::channel(ProbePlan::default());
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let mut actor = Actor::new(leader_rx, ready_tx, writes_tx, plan_tx, metrics.clone());
        let now = Instant::now();
        let view = view_with(objects);
        let mut spec = mk_spec();
        spec.detection.signals = vec![crate::api::Signal::NodeReady];
        spec.detection.failure_threshold = 1;
        spec.detection.interval = crate::api::HumanDuration::from_secs(1);
        spec.safety.max_unhealthy =
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10);
        let policy = PodHAPolicy::new("p", spec);
        let state = &mut actor.state;
        state.apply(Change::Policy(Event::Init), now);
        state.apply(Change::Policy(Event::InitApply(policy)), now);
        state.apply(Change::Policy(Event::InitDone), now);
        state.apply(Change::Node(Event::Init), now);
        for node in view.nodes.values() {
            state.apply(Change::Node(Event::InitApply((**node).clone())), now);
        }
        state.apply(Change::Node(Event::InitDone), now);
        state.apply(Change::Pod(Event::Init), now);
        for pod in view.pods_by_node.values().flatten() {
            state.apply(Change::Pod(Event::InitApply((**pod).clone())), now);
        }
        state.apply(Change::Pod(Event::InitDone), now);
        state.apply(Change::Pvc(Event::Init), now);
        for pvc in view.pvcs.values() {
            state.apply(Change::Pvc(Event::InitApply((**pvc).clone())), now);
        }
        state.apply(Change::Pvc(Event::InitDone), now);
        state.apply(Change::Pv(Event::Init), now);
        for pv in view.pvs.values() {
            state.apply(Change::Pv(Event::InitApply((**pv).clone())), now);
        }
        state.apply(Change::Pv(Event::InitDone), now);
        state.apply(Change::Lease(Event::<Lease>::Init), now);
        state.apply(Change::Lease(Event::InitDone), now);
        state.apply(Change::Va(Event::Init), now);
        state.apply(Change::Va(Event::InitDone), now);
        state.apply(Change::ReplicaSet(Event::Init), now);
        state.apply(Change::ReplicaSet(Event::InitDone), now);
        state.apply(Change::Namespace(Event::Init), now);
        state.apply(Change::Namespace(Event::InitDone), now);
        Harness {
            actor,
            writes,
            metrics,
            _leader: leader_tx,
            _plan: plan_rx,
        }
    }

    fn dead_node_with_pods(node: &str) -> Vec<Obj> {
        let claim = format!("data-{node}");
        let pv = format!("pv-{node}");
        vec![
            mk_node(node).ready(false).into(),
            mk_pod("ns", &format!("db-{node}"))
                .on(node)
                .owned_by_sts("db")
                .claim(&claim)
                .into(),
            mk_pvc("ns", &claim).bound_to(&pv).into(),
            mk_csi_pv(&pv, DRIVER).into(),
            mk_pod("ns", &format!("bare-{node}"))
                .on(node)
                .claim(&claim)
                .into(),
        ]
    }

    fn acts(rx: &mut crate::runtime::writer::LaneReceivers) -> Vec<String> {
        rx.queued_intents().iter().map(intent_key).collect()
    }

    fn skipped(metrics: &Metrics) -> f64 {
        let text = metrics.encode().expect("encode");
        text.lines()
            .filter(|l| l.starts_with("podha_pods_skipped_total{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    #[tokio::test(start_paused = true)]
    async fn each_action_is_sent_once_and_each_skip_counted_once() {
        let mut objects = dead_node_with_pods("node-1");
        objects.extend(dead_node_with_pods("node-10"));
        objects.push(mk_node("node-2").into());
        objects.push(mk_node("node-3").into());
        let mut h = harness(objects);
        h.actor.tick(Instant::now()).await;
        assert_eq!(
            acts(&mut h.writes),
            ["taint/node-1", "taint/node-10"],
            "pods wait for their node's taint"
        );
        assert_eq!(skipped(&h.metrics), 2.0, "one skip per bare pod");
        for node in ["node-1", "node-10"] {
            let intent = Intent::TaintNode {
                node: node.into(),
                policy: "p".into(),
                taint: NodeTaint::OutOfService,
            };
            let result = Ok(Outcome::Applied);
            h.actor
                .on_result(ActResult { intent, result }, Instant::now());
        }
        h.actor.tick(Instant::now()).await;
        assert_eq!(
            acts(&mut h.writes),
            ["delete/uid-ns-db-node-1", "delete/uid-ns-db-node-10"]
        );
        for _ in 0..10 {
            tokio::time::advance(TICK).await;
            h.actor.tick(Instant::now()).await;
        }
        assert!(
            acts(&mut h.writes).is_empty(),
            "in flight: nothing is sent twice"
        );
        assert_eq!(
            skipped(&h.metrics),
            2.0,
            "skips are counted once per incident"
        );
    }

    fn mark_of(pod: &str) -> Intent {
        Intent::MarkPodNotReady {
            pod: crate::view::ObjectKey::new("ns", pod),
            uid: format!("uid-ns-{pod}"),
            node: "node-1".into(),
            policy: "p".into(),
        }
    }

    fn delete_of(pod: &str, version: &str) -> Intent {
        Intent::ForceDeletePod {
            pod: crate::view::ObjectKey::new("ns", pod),
            uid: format!("uid-ns-{pod}"),
            node: "node-1".into(),
            policy: "p".into(),
            owner_kind: "StatefulSet",
            resource_version: Some(version.into()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ready_pods_are_marked_beside_the_taint_then_deleted_in_the_marked_version() {
        let objects: Vec<Obj> = vec![
            mk_node("node-1").ready(false).into(),
            mk_node("node-2").into(),
            mk_node("node-3").into(),
            mk_pod("ns", "db-0")
                .on("node-1")
                .owned_by_sts("db")
                .claim("data-0")
                .ready(true)
                .into(),
            mk_pod("ns", "db-1")
                .on("node-1")
                .owned_by_sts("db")
                .claim("data-1")
                .ready(true)
                .into(),
            mk_pvc("ns", "data-0").bound_to("pv-0").into(),
            mk_pvc("ns", "data-1").bound_to("pv-1").into(),
            mk_csi_pv("pv-0", DRIVER).into(),
            mk_csi_pv("pv-1", DRIVER).into(),
        ];
        let mut h = harness(objects);
        h.actor.tick(Instant::now()).await;
        assert_eq!(
            acts(&mut h.writes),
            ["taint/node-1", "mark/uid-ns-db-0", "mark/uid-ns-db-1"],
            "the marks go out with the taint"
        );
        let now = Instant::now();
        for (pod, version) in [("db-0", "10"), ("db-1", "11")] {
            let result = Ok(Outcome::Marked {
                resource_version: Some(version.into()),
            });
            h.actor.on_result(
                ActResult {
                    intent: mark_of(pod),
                    result,
                },
                now,
            );
        }
        h.actor.tick(now).await;
        assert!(
            acts(&mut h.writes).is_empty(),
            "no delete before the taint is on"
        );
        let taint = Intent::TaintNode {
            node: "node-1".into(),
            policy: "p".into(),
            taint: NodeTaint::OutOfService,
        };
        h.actor.on_result(
            ActResult {
                intent: taint,
                result: Ok(Outcome::Applied),
            },
            now,
        );
        h.actor.tick(now).await;
        assert_eq!(
            h.writes.queued_intents(),
            [delete_of("db-0", "10"), delete_of("db-1", "11")],
            "each delete in the version its mark produced"
        );

        // db-0 deleted. db-1 changed after its mark: not deleted.
        for (pod, version, outcome) in [
            ("db-0", "10", Outcome::Applied),
            ("db-1", "11", Outcome::Changed),
        ] {
            let result = ActResult {
                intent: delete_of(pod, version),
                result: Ok(outcome),
            };
            h.actor.on_result(result, now);
        }
        let incident = h.actor.ledger.get("node-1").expect("incident");
        assert!(incident.deleted.contains("uid-ns-db-0"));
        assert!(!incident.deleted.contains("uid-ns-db-1"));
        assert_eq!(incident.marked_not_ready.get("uid-ns-db-1"), Some(&None));
        let text = h.metrics.encode().expect("encode");
        let deleted: f64 = text
            .lines()
            .filter(|l| l.starts_with("podha_pods_deleted_total{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum();
        assert_eq!(deleted, 1.0, "only db-0 was deleted");
        // The watch still shows db-1 Ready: nothing more until it shows what changed.
        for _ in 0..5 {
            tokio::time::advance(TICK).await;
            h.actor.tick(Instant::now()).await;
        }
        assert!(acts(&mut h.writes).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn closing_one_incident_does_not_forget_another_nodes_reports() {
        let mut objects = dead_node_with_pods("node-1");
        objects.extend(dead_node_with_pods("node-10"));
        objects.push(mk_node("node-2").into());
        objects.push(mk_node("node-3").into());
        let mut h = harness(objects);
        h.actor.tick(Instant::now()).await;
        assert_eq!(skipped(&h.metrics), 2.0);
        // node-1 comes back: its incident closes; node-10 stays dead.
        let now = Instant::now();
        h.actor
            .state
            .apply(Change::Node(Event::Apply(mk_node("node-1"))), now);
        // The next probe (1 s) sees node-1 alive; keep ticking well past the close.
        for _ in 0..15 {
            tokio::time::advance(TICK).await;
            h.actor.tick(Instant::now()).await;
        }
        assert!(
            h.actor.ledger.get("node-1").is_none(),
            "node-1's incident closed"
        );
        assert!(h.actor.ledger.get("node-10").is_some());
        assert_eq!(
            skipped(&h.metrics),
            2.0,
            "node-10's skip is not counted again"
        );
    }
}
