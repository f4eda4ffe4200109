//! Report, in part: how many of each policy's pods podha would fail over now, worked out by
//! the rules `podha explain` answers with (`crate::protection`), when due
//! (`super::super::pod_coverage`), for the statuses and `podha_pods`. The working-out runs on
//! a blocking thread, on a copy of what the loop knows, so that a large cluster never holds
//! up a round; the loop takes its result in a later round, from a channel (a poll of the
//! thread's handle inside the loop's busy task may be refused by tokio's cooperative budget).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot::{self, error::TryRecvError};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::Actor;
use crate::api::{FencingProof, PodHAPolicy, PodHAPolicyStatus};
use crate::contract::AGENT_LEASE_DURATION;
use crate::planner::{HealthBook, PolicyRef, Seen};
use crate::protection::{Cluster, Coverage, Operator, coverage};
use crate::view::View;

/// What a working-out comes to, and how long it took.
type WorkedOut = (BTreeMap<String, Coverage>, Duration);

/// A working-out under way.
pub(super) struct CoverageJob {
    /// Its answer, sent once; closed without one if the thread panicked.
    result: oneshot::Receiver<WorkedOut>,
    /// An answer taken from `result` before the loop's turn (tests).
    ready: Option<WorkedOut>,
    /// When this process's lead began when it started: a result is used only by the same term.
    term: Option<Instant>,
}

/// What a working-out reads: a copy, so that the loop goes on meanwhile.
struct Inputs {
    policies: Vec<(String, Arc<PodHAPolicy>)>,
    unreadable: BTreeMap<String, String>,
    view: View,
    /// Each policy's judgement of its nodes, and the failures the ledger remembers: a death
    /// is foreseen with the other nodes as this process judges them.
    health: HealthBook,
    failures: Vec<(String, Instant)>,
    now: Instant,
}

impl Actor {
    /// Takes the result of a finished working-out, and starts one if it is due. Every
    /// replica reaps; only the leader starts; and while a policy relies on the agents' proof,
    /// only once a Lease's duration has passed since this process began watching the agents (a
    /// Lease first seen counts as renewed then, so an agent that stopped before this process
    /// started shows only after that).
    pub(super) fn work_out_coverage(&mut self, now: Instant) {
        self.reap_coverage();
        if !self.leading
            || self.coverage_job.is_some()
            || (self.coverage.watched_for(now) < AGENT_LEASE_DURATION && self.relies_on_agents())
            || !self.pod_coverage.due(now)
        {
            return;
        }
        let inputs = self.coverage_inputs(now);
        self.pod_coverage.start(now);
        let (tx, result) = oneshot::channel();
        // Its end is followed through `result`, not its handle.
        drop(tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let by_policy = inputs.work_out();
            // The loop may have moved on (a new term): then nobody waits for it.
            let _ = tx.send((by_policy, started.elapsed()));
        }));
        self.coverage_job = Some(CoverageJob {
            result,
            ready: None,
            term: self.leading_since,
        });
    }

    /// Waits, on this thread, until the working-out under way (if any) has finished, so that
    /// the next round takes its result: tests tick in paused time, faster than a thread runs.
    #[cfg(test)]
    pub(super) fn finish_coverage_job(&mut self) {
        if let Some(job) = self.coverage_job.as_mut()
            && job.ready.is_none()
        {
            job.ready = loop {
                match job.result.try_recv() {
                    Ok(done) => break Some(done),
                    Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
                    Err(TryRecvError::Closed) => break None,
                }
            };
        }
    }

    fn reap_coverage(&mut self) {
        let Some(job) = self.coverage_job.as_mut() else {
            return;
        };
        let answer = match job.ready.take() {
            Some(done) => Ok(done),
            None => job.result.try_recv(),
        };
        let done = match answer {
            Ok(done) => done,
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Closed) => {
                warn!("working out which pods podha would fail over ended without an answer");
                self.coverage_job = None;
                return;
            }
        };
        let same_term = self.leading && job.term == self.leading_since;
        self.coverage_job = None;
        if !same_term {
            return;
        }
        let (mut by_policy, took) = done;
        // A policy deleted while it ran has had its series removed already.
        by_policy.retain(|policy, _| self.state.policies.contains_key(policy));
        self.metrics.protection.observe_work(took);
        debug!(
            took_ms = took.as_millis(),
            "worked out which pods podha would fail over"
        );
        self.metrics.protection.set_pods(&by_policy);
        self.pod_coverage.set(by_policy, took);
    }

    fn relies_on_agents(&self) -> bool {
        self.state
            .policies
            .values()
            .any(|p| p.spec.fencing.proofs().asks(FencingProof::Agent))
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
            view: state.view.clone(),
            health: self.judge.health_book(),
            failures: self
                .ledger
                .failures()
                .map(|(node, at)| (node.to_string(), at))
                .collect(),
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
        // The statuses as the cache holds them: what this leader, or the one before, wrote.
        let statuses: BTreeMap<String, PodHAPolicyStatus> = self
            .policies
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), p.status.clone()?)))
            .collect();
        let cluster = Cluster::new(
            policies,
            &self.unreadable,
            &statuses,
            &self.view,
            Operator::Leading,
            self.now,
        )
        .seen(Seen {
            health: &self.health,
            failures: &self.failures,
        });
        coverage(&cluster)
    }
}
