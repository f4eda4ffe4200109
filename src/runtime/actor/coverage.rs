//! Report, in part: how many of each policy's pods podha would fail over now, worked out by
//! the rules `podha explain` answers with (`crate::protection`), when due
//! (`super::super::pod_coverage`), for the statuses and `podha_pods`.

use std::collections::BTreeMap;

use tokio::time::Instant;
use tracing::debug;

use super::Actor;
use crate::api::PodHAPolicyStatus;
use crate::planner::PolicyRef;
use crate::protection::{Cluster, Operator, coverage};

impl Actor {
    /// Works the coverage out again if it is due; only the leader calls it.
    pub(super) fn work_out_coverage(&mut self, now: Instant) {
        if !self.pod_coverage.due(now) {
            return;
        }
        let state = &self.state;
        // The statuses as the cache holds them: what this leader, or the one before, wrote.
        let statuses: BTreeMap<String, PodHAPolicyStatus> = state
            .policies
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), p.status.clone()?)))
            .collect();
        let unreadable: BTreeMap<String, String> = state
            .unreadable_policies
            .iter()
            .map(|(name, p)| (name.clone(), p.error.clone()))
            .collect();
        let policies = state
            .policies
            .iter()
            .map(|(name, p)| PolicyRef {
                name,
                spec: &p.spec,
            })
            .collect();
        let cluster = Cluster::new(
            policies,
            &unreadable,
            &statuses,
            &state.view,
            Operator::Leading,
            now,
        );
        let started = std::time::Instant::now();
        let by_policy = coverage(&cluster);
        let took = started.elapsed();
        self.metrics.protection.observe_work(took);
        debug!(
            took_ms = took.as_millis(),
            "worked out which pods podha would fail over"
        );
        for (policy, counts) in &by_policy {
            self.metrics.protection.set_pods(policy, counts);
        }
        self.pod_coverage.set(by_policy, now);
    }
}
