//! Report, in part: how many of each policy's pods podha would fail over now, worked out by
//! the rules `podha explain` answers with (`crate::protection`), when due
//! (`super::super::pod_coverage`), for the statuses and `podha_pods`. The working-out runs on
//! a blocking thread, on a copy of what the loop knows, so that a large cluster never holds
//! up a round; the loop takes its result in a later round.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::Actor;
use crate::api::{PodHAPolicy, PodHAPolicyStatus};
use crate::contract::AGENT_LEASE_DURATION;
use crate::planner::PolicyRef;
use crate::protection::{Cluster, Coverage, Operator, coverage};
use crate::view::View;

/// A working-out under way.
pub(super) struct CoverageJob {
    handle: JoinHandle<(BTreeMap<String, Coverage>, Duration)>,
    /// Whether this process led when it started: a result is used only by the same term.
    term: Option<Instant>,
}

/// What a working-out reads: a copy, so that the loop goes on meanwhile.
struct Inputs {
    policies: Vec<(String, Arc<PodHAPolicy>)>,
    unreadable: BTreeMap<String, String>,
    statuses: BTreeMap<String, PodHAPolicyStatus>,
    view: View,
    now: Instant,
}

impl Actor {
    /// Takes the result of a finished working-out, and starts one if it is due. Every
    /// replica reaps; only the leader starts, and only once a Lease's duration has passed since
    /// it began watching the agents (a Lease first seen counts as renewed then, so an agent
    /// that stopped before this process started shows only after that).
    pub(super) fn work_out_coverage(&mut self, now: Instant) {
        self.reap_coverage();
        if !self.leading
            || self.coverage_job.is_some()
            || self.coverage.watched_for(now) < AGENT_LEASE_DURATION
            || !self.pod_coverage.due(now)
        {
            return;
        }
        let inputs = self.coverage_inputs(now);
        self.pod_coverage.start(now);
        let handle = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let by_policy = inputs.work_out();
            (by_policy, started.elapsed())
        });
        self.coverage_job = Some(CoverageJob {
            handle,
            term: self.leading_since,
        });
    }

    /// Waits, on this thread, until the working-out under way (if any) has finished, so that
    /// the next round takes its result: tests tick in paused time, faster than a thread runs.
    #[cfg(test)]
    pub(super) fn finish_coverage_job(&self) {
        while let Some(job) = &self.coverage_job
            && !job.handle.is_finished()
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn reap_coverage(&mut self) {
        let Some(job) = self.coverage_job.as_mut() else {
            return;
        };
        let Some(done) = (&mut job.handle).now_or_never() else {
            return;
        };
        let same_term = self.leading && job.term == self.leading_since;
        self.coverage_job = None;
        match done {
            Ok((by_policy, took)) if same_term => {
                self.metrics.protection.observe_work(took);
                debug!(
                    took_ms = took.as_millis(),
                    "worked out which pods podha would fail over"
                );
                self.metrics.protection.set_pods(&by_policy);
                self.pod_coverage.set(by_policy);
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "working out which pods podha would fail over failed"),
        }
    }

    fn coverage_inputs(&self, now: Instant) -> Inputs {
        let state = &self.state;
        Inputs {
            policies: state
                .policies
                .iter()
                .map(|(name, p)| (name.clone(), p.clone()))
                .collect(),
            unreadable: state
                .unreadable_policies
                .iter()
                .map(|(name, p)| (name.clone(), p.error.clone()))
                .collect(),
            // The statuses as the cache holds them: what this leader, or the one before, wrote.
            statuses: state
                .policies
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p.status.clone()?)))
                .collect(),
            view: state.view.clone(),
            now,
        }
    }
}

impl Inputs {
    fn work_out(&self) -> BTreeMap<String, Coverage> {
        let policies = self
            .policies
            .iter()
            .map(|(name, p)| PolicyRef {
                name,
                spec: &p.spec,
            })
            .collect();
        let cluster = Cluster::new(
            policies,
            &self.unreadable,
            &self.statuses,
            &self.view,
            Operator::Leading,
            self.now,
        );
        coverage(&cluster)
    }
}
