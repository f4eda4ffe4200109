//! The incidents the decision loop keeps: one open per dead node, the recently finished ones
//! per policy (for its status), and when recently closed ones opened (for
//! `safety.unhealthyWindow`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::Incident;
use crate::api::{NodeTaint, RECENT_FAILOVERS_KEPT};
use crate::view::View;

/// Open incidents by node name, and what is remembered of closed ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    incidents: BTreeMap<String, Incident>,
    /// (node, when its incident opened) of closed incidents, oldest first, kept for
    /// [`RECENT_KEPT_FOR`].
    closed: VecDeque<(String, Instant)>,
    /// Finished incidents per policy, newest first, at most [`RECENT_FAILOVERS_KEPT`] each.
    finished: BTreeMap<String, VecDeque<Incident>>,
}

/// How long a closed incident is remembered: the longest `safety.unhealthyWindow` allowed.
pub const RECENT_KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

impl Ledger {
    /// Opens an incident for `node`, judged dead by `policy` at `detected_at`, unless one is
    /// open; the pods bound to it now are the only ones that may move. Returns whether a new
    /// incident was opened.
    pub fn open(
        &mut self,
        node: &str,
        policy: &str,
        last_seen_alive: Option<Instant>,
        detected_at: Instant,
        view: &View,
    ) -> bool {
        if self.incidents.contains_key(node) {
            return false;
        }
        let incident = Incident::open(node, policy, last_seen_alive, detected_at, view);
        self.incidents.insert(node.to_string(), incident);
        true
    }

    pub fn get(&self, node: &str) -> Option<&Incident> {
        self.incidents.get(node)
    }

    pub fn get_mut(&mut self, node: &str) -> Option<&mut Incident> {
        self.incidents.get_mut(node)
    }

    /// Closes the incident of `node` at `now`: a failover not recovered by then ends as the
    /// node's return. It joins its policy's finished incidents.
    pub fn close(&mut self, node: &str, now: Instant) -> Option<&Incident> {
        let mut incident = self.incidents.remove(node)?;
        incident.record_node_returned(now);
        self.closed
            .push_back((incident.node.clone(), incident.detected_at));
        while let Some((_, since)) = self.closed.front()
            && since.checked_add(RECENT_KEPT_FOR).is_some_and(|t| t < now)
        {
            self.closed.pop_front();
        }
        let finished = self.finished.entry(incident.policy.clone()).or_default();
        finished.push_front(incident);
        finished.truncate(RECENT_FAILOVERS_KEPT);
        finished.front()
    }

    /// Forgets the finished incidents of a deleted policy.
    pub fn forget_policy(&mut self, policy: &str) {
        self.finished.remove(policy);
    }

    /// Nodes whose incident opened at or after `cutoff`, open or closed since.
    pub fn failed_since(&self, cutoff: Instant) -> BTreeSet<&str> {
        self.failures()
            .filter(|(_, since)| *since >= cutoff)
            .map(|(node, _)| node)
            .collect()
    }

    /// Every failure remembered, open or closed: (node, when it was judged dead).
    pub fn failures(&self) -> impl Iterator<Item = (&str, Instant)> {
        self.incidents
            .values()
            .map(|i| (i.node.as_str(), i.detected_at))
            .chain(self.closed.iter().map(|(n, since)| (n.as_str(), *since)))
    }

    /// Remembers that `node` was judged dead at `at`, as a closed incident: it counts for
    /// `safety.unhealthyWindow` and nothing else.
    pub fn remember_failure(&mut self, node: &str, at: Instant) {
        self.closed.push_back((node.to_string(), at));
    }

    /// The open incidents, in node order.
    pub fn iter(&self) -> impl Iterator<Item = &Incident> {
        self.incidents.values()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Incident> {
        self.incidents.values_mut()
    }

    /// A policy's open incidents, then its finished ones, newest first.
    pub fn of_policy<'a>(&'a self, policy: &'a str) -> (Vec<&'a Incident>, Vec<&'a Incident>) {
        let open = self.iter().filter(|i| i.policy == policy).collect();
        let finished = self
            .finished
            .get(policy)
            .map(|f| f.iter().collect())
            .unwrap_or_default();
        (open, finished)
    }

    // Recorders for the planner's tests and the decision loop: an action's result is noted on
    // the incident of its node, if one is open.

    /// Records that the pod `uid` on `node` was deleted.
    pub fn record_deleted(&mut self, node: &str, uid: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_deleted(uid);
        }
    }

    /// Records that the pod `uid` on `node` was marked NotReady, in `version`.
    pub fn record_marked_not_ready(&mut self, node: &str, uid: &str, version: Option<String>) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_marked_not_ready(uid, version);
        }
    }

    /// Records that the pod `uid` on `node` changed after podha marked it.
    pub fn record_changed_since_mark(&mut self, node: &str, uid: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_changed_since_mark(uid);
        }
    }

    /// Records that podha asked `node`'s agent for a fence, with this request value.
    pub fn record_fence_request(&mut self, node: &str, request: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_fence_request(request);
        }
    }

    /// Records that podha's `ForceOff` to `node`'s BMC, in the action sent at `at`, is about
    /// to go out.
    pub fn record_force_off_sending(&mut self, node: &str, at: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_force_off_sending(at);
        }
    }

    /// Records that the action sent at `at` sent no `ForceOff` to `node`'s BMC.
    pub fn record_force_off_not_sent(&mut self, node: &str, at: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_force_off_not_sent(at);
        }
    }

    /// Records that `node`'s BMC accepted podha's `ForceOff` (`by_podha`), or said the machine
    /// was off already.
    pub fn record_power_off(&mut self, node: &str, now: Instant, by_podha: bool) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_power_off(now, by_podha);
        }
    }

    /// Records that `node`'s BMC said the machine was off before the `ForceOff` of the action
    /// sent at `sent_at` went out (see [`Incident::record_found_off`]).
    pub fn record_found_off(&mut self, node: &str, now: Instant, sent_at: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_found_off(now, sent_at);
        }
    }

    /// Records a read of `node`'s BMC, after it accepted the `ForceOff`, that says the machine
    /// is off.
    pub fn record_powered_off(&mut self, node: &str, now: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_powered_off(now);
        }
    }

    /// Records a read of `node`'s BMC that does not say the machine is off.
    pub fn record_not_off(&mut self, node: &str) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_not_off();
        }
    }

    /// Records that `node`'s BMC accepted podha's `On` after the failover.
    pub fn record_power_on(&mut self, node: &str, now: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_power_on(now);
        }
    }

    /// Records that podha's `taint` landed on `node` at `now`.
    pub fn record_tainted(&mut self, node: &str, taint: NodeTaint, now: Instant) {
        if let Some(incident) = self.incidents.get_mut(node) {
            incident.record_tainted(taint, now);
        }
    }
}
