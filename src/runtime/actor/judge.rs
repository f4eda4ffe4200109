//! Judge: every policy's health tracker for every node it watches, advanced by the node's
//! observations; what the probers must probe; the heartbeats the planner's settle rule reads.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::prober::{
    AGENT_PROBE_INTERVAL, ProbePlan, Target, agent_addr, agent_key, kubelet_addr,
};
use super::super::state::ClusterState;
use crate::api::{FencingProof, NodeTaint, TAINT_MARKER_ANNOTATION};
use crate::contract::AGENT_HEARTBEAT_TIMEOUT;
use crate::eligibility::node_selected;
use crate::health::{
    DetectionConfig, HealthTracker, NodeHealth, NodeObservations, ProbeKind, ReadyStatus,
    Transition,
};
use crate::planner::{HealthBook, Heartbeat, Heartbeats, proof};

/// A policy's tracker of a node changed state.
pub(super) struct Judgement {
    pub policy: String,
    pub node: String,
    pub transition: Transition,
}

/// The health trackers, by (policy, node).
#[derive(Default)]
pub(super) struct Judge {
    trackers: BTreeMap<(String, String), HealthTracker>,
    /// Since when podha has heard enough agents without a break (`proof::agent_quorum`), as
    /// seen at each turn of the loop.
    agent_quorum_since: Option<Instant>,
}

impl Judge {
    /// Advances every tracker whose probe is due; returns the transitions, in policy and node
    /// order. A (policy, node) pair no longer watched loses its tracker.
    pub fn advance(&mut self, state: &ClusterState, now: Instant) -> Vec<Judgement> {
        let mut judgements = Vec::new();
        let mut watched = BTreeSet::new();
        for (name, policy) in &state.policies {
            let Ok(cfg) = DetectionConfig::try_from(&policy.spec.detection) else {
                continue;
            };
            for (node_name, node) in &state.view.nodes {
                let Some(obs) = state.observations.get(node_name) else {
                    continue;
                };
                if !node_selected(&policy.spec, node) {
                    continue;
                }
                let key = (name.clone(), node_name.clone());
                watched.insert(key.clone());
                let tracker = self
                    .trackers
                    .entry(key)
                    .or_insert_with(|| resumed_tracker(node, name, obs, now));
                if let Some(transition) = tracker.poll(now, obs, &cfg) {
                    judgements.push(Judgement {
                        policy: name.clone(),
                        node: node_name.clone(),
                        transition,
                    });
                }
            }
        }
        self.trackers.retain(|key, _| watched.contains(key));
        judgements
    }

    /// Whether podha hears enough agents at `now`: since when it has without a break is kept,
    /// and forgotten the moment it does not (an agent cut off meanwhile may have shown half of
    /// the agents unheard and stayed up, and counts its silence only from when podha hears
    /// enough again).
    pub fn follow_agent_quorum(&mut self, state: &ClusterState, now: Instant) {
        let heard = proof::hears_agent_quorum(&state.view, &heartbeats(state), now);
        self.agent_quorum_since = heard.then(|| self.agent_quorum_since.unwrap_or(now));
    }

    /// Since when podha has heard enough agents without a break; `None` while it does not.
    pub fn agent_quorum_since(&self) -> Option<Instant> {
        self.agent_quorum_since
    }

    /// Node health per policy, as the planner reads it.
    pub fn health_book(&self) -> HealthBook {
        let mut book = HealthBook::new();
        for ((policy, node), tracker) in &self.trackers {
            book.entry(policy.clone())
                .or_default()
                .insert(node.clone(), tracker.state());
        }
        book
    }

    /// (policy, node, judged at) of every tracker resumed as Failed whose failure is proven by
    /// the cluster (podha's taint from a previous leader or process): it made no transition.
    pub fn resumed_failures(&self) -> impl Iterator<Item = (&str, &str, Instant)> {
        self.trackers
            .iter()
            .filter_map(|((policy, node), tracker)| match tracker.state() {
                NodeHealth::Failed { since } if tracker.judged_failed() => {
                    Some((policy.as_str(), node.as_str(), since))
                }
                _ => None,
            })
    }
}

/// What the probers probe: the kubelet port of every node a policy with the `KubeletTCP`
/// signal watches (at the shortest such interval and timeout), and, while podha leads, the agent
/// of every node that runs one, whether or not a policy listens: an agent podha stops hearing
/// fences its node (see `crate::agent`), so every agent must be heard while podha leads, within
/// the contract's [`AGENT_HEARTBEAT_TIMEOUT`] and no policy's. A follower asks none (only the
/// leader's hearing counts).
pub(super) fn probe_plans(state: &ClusterState, leading: bool) -> (ProbePlan, ProbePlan) {
    let mut tcp_interval: Option<Duration> = None;
    let mut tcp_targets: BTreeMap<&str, Target> = BTreeMap::new();
    for policy in state.policies.values() {
        let Ok(cfg) = DetectionConfig::try_from(&policy.spec.detection) else {
            continue;
        };
        if !cfg.signals.kubelet_tcp {
            continue;
        }
        tcp_interval = Some(tcp_interval.map_or(cfg.interval, |i| i.min(cfg.interval)));
        for (node_name, node) in &state.view.nodes {
            if !node_selected(&policy.spec, node) {
                continue;
            }
            tcp_targets
                .entry(node_name)
                .and_modify(|t| t.timeout = t.timeout.min(cfg.tcp_timeout))
                .or_insert_with(|| Target {
                    node: node_name.clone(),
                    addr: kubelet_addr(node),
                    timeout: cfg.tcp_timeout,
                    hold: None,
                    heeds_term: false,
                    heeds_renewals: false,
                    boot_id: None,
                    key: None,
                });
        }
    }
    let kubelet = ProbePlan {
        interval: tcp_interval.unwrap_or_default(),
        targets: tcp_targets.into_values().collect(),
    };
    let agent = if leading {
        ProbePlan {
            interval: AGENT_PROBE_INTERVAL,
            targets: agent_targets(state),
        }
    } else {
        ProbePlan::default()
    };
    (kubelet, agent)
}

fn agent_targets(state: &ClusterState) -> Vec<Target> {
    state
        .view
        .nodes
        .iter()
        .filter_map(|(name, node)| {
            let advert = state.view.agent_adverts.get(name);
            let heeds_hold = advert.is_some_and(|a| a.heeds_hold);
            agent_addr(node).map(|addr| Target {
                node: name.clone(),
                addr: Some(addr),
                timeout: AGENT_HEARTBEAT_TIMEOUT,
                hold: heeds_hold
                    .then(|| holds(state, name, node) && !armed_and_silent(state, name)),
                heeds_term: advert.is_some_and(|a| a.heeds_term),
                heeds_renewals: advert.is_some_and(|a| a.heeds_renewals),
                boot_id: node
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.boot_id.clone())
                    .filter(|b| !b.is_empty()),
                key: agent_key(node),
            })
        })
        .collect()
}

/// Whether podha holds `node` (named `name`) for its agent: it counts no silence of it, so the
/// agent need not fence on isolation. Held unless a policy that asks for the `Agent` proof
/// (alone or in a list) selects the node and neither that policy nor the node is paused: a
/// paused node cut off from everything must not be reset, and an agent no proof listens to
/// has nothing to fence for. Held also while the agent's Lease says it cannot reach half of
/// its peers ([`crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION`]): on isolation it could
/// not show that podha hears no majority, and would reboot its node in an outage of podha or
/// of the API server that moves nothing. A held agent's answers count for no silence
/// ([`crate::health`]), so the hold and the proof cannot disagree: podha counts a silence only
/// after the agent said it is not held.
pub(super) fn holds(state: &ClusterState, name: &str, node: &Node) -> bool {
    crate::api::node_paused(node)
        || state
            .view
            .agent_adverts
            .get(name)
            .is_some_and(|a| a.peers_unreachable.is_some())
        || !state.policies.values().any(|p| {
            !p.spec.paused
                && p.spec.fencing.proofs().asks(FencingProof::Agent)
                && node_selected(&p.spec, node)
        })
}

/// Whether `node`'s agent counts its silence and has fallen silent: a hold sent now could
/// reach it (its answers lost) and stop its fence, and would end the hearing the silence
/// proof counts from, stalling a failover under way for good. It is not held until it answers
/// again.
fn armed_and_silent(state: &ClusterState, node: &str) -> bool {
    state.observations.get(node).is_some_and(|obs| {
        let agent = obs.probed(ProbeKind::Agent);
        agent.armed.is_some() && agent.silent_since.is_some()
    })
}

/// Hands a prober its plan, waking it only when the plan changed.
pub(super) fn publish(sender: &watch::Sender<ProbePlan>, plan: ProbePlan) {
    sender.send_if_modified(|current| {
        let changed = *current != plan;
        if changed {
            *current = plan;
        }
        changed
    });
}

/// What podha has heard from every node, for the planner's settle rule.
pub(super) fn heartbeats(state: &ClusterState) -> Heartbeats {
    state
        .observations
        .iter()
        .map(|(node, obs)| {
            let hb = Heartbeat {
                last_renewal: obs.last_renewal(),
                renewal_not_before: obs.renewal_not_before(),
                silent_since: obs.lease_baseline(),
                renew_period: obs.renew_period_bound(),
                tcp_answered: obs.tcp_answered(),
                tcp_silent_since: obs.tcp_silent_since(),
                agent_answered: obs.probed(ProbeKind::Agent).answered,
                agent_connected: obs.probed(ProbeKind::Agent).connected,
                agent_armed: obs.probed(ProbeKind::Agent).armed,
                agent_disarmed: obs.probed(ProbeKind::Agent).disarmed,
                agent_hearing_from: obs.probed(ProbeKind::Agent).from,
                agent_silent_since: obs.probed(ProbeKind::Agent).silent_since,
                tainted_since: obs.podha_tainted_since(),
                renewals_since_ack: obs.renewals_since_ack(),
                renewed_in_boot: obs.renewed_in_boot(),
                renew_time: obs.renew_time(),
                lease_view_gap: obs.in_gap(),
            };
            (node.clone(), hb)
        })
        .collect()
}

/// A tracker for a node a policy starts watching. A node carrying podha's taint marker for
/// this policy was judged dead before (by a previous process or leader): it resumes as Failed
/// so a restart does not by itself make it look healthy.
pub(super) fn resumed_tracker(
    node: &Node,
    policy: &str,
    obs: &NodeObservations,
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
pub(super) fn podha_taint_proves_failure(node: &Node, policy: &str) -> bool {
    let marked = node
        .annotations()
        .get(TAINT_MARKER_ANNOTATION)
        .is_some_and(|p| p == policy);
    marked
        && NodeTaint::ALL.iter().any(|t| t.on(node))
        && ReadyStatus::from_node(node) != ReadyStatus::True
}
