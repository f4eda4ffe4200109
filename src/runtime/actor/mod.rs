//! The decision loop: one task that owns the cluster state, the health trackers and the
//! incidents. Watch changes, probe rounds and action results come in; every tick runs the
//! pipeline
//!
//! observe → judge → plan → dispatch → follow → report
//!
//! each step in a room of its own (`judge.rs`, `incidents.rs`, the planner, `schedule.rs`,
//! `results.rs`, `reports.rs`). Owning everything in one task keeps decisions sequential and
//! lock-free.

use super::agent_coverage::AgentCoverage;
use super::pod_coverage::PodCoverage;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::info;

use super::prober::{self, PlanSenders};
use super::state::{Change, ClusterState};
use super::writer::{Lanes, ResultReceiver};
use crate::api::PodHAPolicy;
use crate::health::ProbeKind;
use crate::incident::Ledger;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::planner::{self, HealthBook, Intent, PlanInput, PolicyRef};
use clock::WallClock;
use judge::Judge;
use reports::ReportBook;
use schedule::Schedule;

mod agent_reports;
mod clock;
mod coverage;
mod incidents;
mod judge;
mod reports;
mod results;
mod schedule;
#[cfg(test)]
mod tests;

/// How often the loop wakes to probe and plan. Probes themselves run every policy `interval`.
pub const TICK: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error("the watch streams ended")]
    WatchesEnded,
}

/// Where the loop's decisions go: the writer's lanes, the probers' plans, `/readyz`.
pub struct Outputs {
    pub ready: watch::Sender<bool>,
    pub writes: Lanes,
    pub probe_plans: PlanSenders,
}

pub struct Actor {
    state: ClusterState,
    judge: Judge,
    ledger: Ledger,
    schedule: Schedule,
    reported: ReportBook,
    /// Since when each node has lacked an agent that could prove its fence.
    coverage: AgentCoverage,
    /// How many of each policy's pods podha would fail over now (while leading).
    pod_coverage: PodCoverage,
    /// The working-out of `pod_coverage` under way, if one is.
    coverage_job: Option<coverage::CoverageJob>,
    leading: bool,
    /// The leadership term this replica leads in (see [`Leadership::term`]), while it leads.
    term: Option<u64>,
    /// When this replica's current term began (while it leads).
    leading_since: Option<Instant>,
    leadership: Leadership,
    out: Outputs,
    metrics: Arc<Metrics>,
    wall: WallClock,
}

impl Actor {
    pub fn new(leadership: Leadership, out: Outputs, metrics: Arc<Metrics>) -> Self {
        Self {
            state: ClusterState::default(),
            judge: Judge::default(),
            ledger: Ledger::default(),
            schedule: Schedule::default(),
            reported: ReportBook::default(),
            coverage: AgentCoverage::default(),
            pod_coverage: PodCoverage::default(),
            coverage_job: None,
            leading: false,
            term: None,
            leading_since: None,
            leadership,
            out,
            metrics,
            wall: WallClock::now(),
        }
    }

    /// Runs until the watches end (an error: they never end on their own).
    pub async fn run(
        mut self,
        mut changes: impl Stream<Item = Change> + Unpin,
        mut results: ResultReceiver,
        mut rounds: mpsc::Receiver<prober::Round>,
    ) -> Result<(), ActorError> {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    Some(change) => self.observe_change(change),
                    None => return Err(ActorError::WatchesEnded),
                },
                Some(result) = results.recv() => {
                    // A pod is deleted once its node's taint is on and its mark has landed:
                    // plan the delete now, not a tick later; once for all the results in.
                    let mut unblocks = false;
                    let mut next = Some(result);
                    while let Some(result) = next {
                        unblocks |= result.intent.unblocks_deletes();
                        self.on_result(result, Instant::now());
                        next = results.try_recv().ok();
                    }
                    if unblocks {
                        self.tick(Instant::now()).await;
                    }
                }
                Some(round) = rounds.recv() => self.observe_round(round),
                _ = ticker.tick() => self.tick(Instant::now()).await,
            }
        }
    }

    /// One turn of the pipeline.
    async fn tick(&mut self, now: Instant) {
        if !self.observe(now) {
            return;
        }
        self.judge_nodes(now).await;
        let health = self.judge.health_book();
        let plan = self.plan(&health, now);
        let skips: Vec<_> = plan.skips().collect();
        for intent in plan.intents {
            self.dispatch(intent, now).await;
        }
        for skip in skips {
            self.report_skip(skip).await;
        }
        self.follow_incidents(now, &health).await;
        self.report(&health).await;
        self.report_unreachable_agents(now).await;
        self.report_agents_peers_unreachable().await;
    }

    fn observe_change(&mut self, change: Change) {
        if let Change::WatchError { watch } = &change {
            self.metrics.operating.inc_watch_restarts(*watch);
        }
        if self.state.apply(change, Instant::now()).feeds_coverage() {
            self.pod_coverage.changed();
        }
    }

    fn observe_round(&mut self, round: prober::Round) {
        let received = Instant::now();
        self.metrics
            .detection
            .inc_agent_answers_unverified(round.unverified.len());
        self.metrics
            .detection
            .inc_agent_answers_mismatched(round.mismatched.len());
        for (node, result) in round.results {
            if let Some(obs) = self.state.observations.get_mut(&node) {
                match (result, round.kind) {
                    (Some(result), ProbeKind::Agent) => {
                        let heard = round.heard.contains(&node);
                        let arming = round
                            .arming
                            .get(&node)
                            .copied()
                            .unwrap_or(crate::health::Arming::Unsaid);
                        obs.observe_agent(result, heard, arming, round.sent, received);
                    }
                    (Some(result), kind) => obs.observe_probe(kind, result, round.sent, received),
                    (None, kind) => obs.forget_probe(kind),
                }
            }
        }
    }

    /// Observe: who leads, and whether the caches are complete enough to judge anything.
    fn observe(&mut self, now: Instant) -> bool {
        self.follow_leadership(now);
        let synced = self.state.synced();
        self.metrics.operating.set_cache_synced(synced);
        self.out
            .ready
            .send_if_modified(|r| std::mem::replace(r, synced) != synced);
        if synced {
            self.forget_deleted_policies();
        }
        synced
    }

    fn follow_leadership(&mut self, now: Instant) {
        let term = self.leadership.term(now);
        if term == self.term {
            return;
        }
        let was_leading = self.leading;
        self.term = term;
        self.leading = term.is_some();
        self.leading_since = self.leading.then_some(now);
        if was_leading != self.leading {
            self.metrics.operating.set_leader(self.leading);
        }
        if let Some(term) = term {
            // What a follower saw may be stale; re-baseline before judging anything. Agents
            // are heard afresh: only this term's hearing may prove a silent agent fenced. A
            // new term without a step down in between (the Lease taken again, its transitions
            // changed) is a new term all the same: the agents count terms by that number.
            for obs in self.state.observations.values_mut() {
                obs.gap(now);
                obs.restart_agent_hearing(now);
            }
            self.reported.forget_statuses();
            self.pod_coverage.forget();
            info!(term, "became leader");
        } else {
            self.metrics.protection.clear();
            self.metrics.failovers.clear_last_failovers();
            info!("lost leadership; holding every write");
        }
    }

    fn forget_deleted_policies(&mut self) {
        let state = &self.state;
        let live =
            |p: &str| state.policies.contains_key(p) || state.unreadable_policies.contains_key(p);
        for policy in self.reported.policies_gone(live) {
            self.metrics.forget_policy(&policy);
            self.ledger.forget_policy(&policy);
        }
    }

    /// Plan: the planner's intents and skips for this round; the policy-wide holds are kept
    /// for the statuses.
    fn plan(&mut self, health: &HealthBook, now: Instant) -> planner::Plan {
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
        let heartbeats = judge::heartbeats(&self.state);
        let unreadable: Vec<String> = self.state.unreadable_policies.keys().cloned().collect();
        let plan = planner::plan(&PlanInput {
            policies: &refs,
            health,
            view: &self.state.view,
            ledger: &self.ledger,
            heartbeats: &heartbeats,
            unreadable: &unreadable,
            agent_quorum_since: self.judge.agent_quorum_since(),
            now,
        });
        let holds = plan.intents.iter().filter_map(|i| match i {
            Intent::Hold {
                policy,
                node: None,
                reason,
            } => Some((policy.clone(), reason.clone())),
            _ => None,
        });
        self.reported
            .set_policy_holds(holds.collect::<BTreeMap<_, _>>());
        let awaiting_proof: BTreeSet<(&str, &str)> = plan
            .intents
            .iter()
            .filter_map(|i| match i {
                Intent::Hold {
                    policy,
                    node: Some(node),
                    reason,
                } if reason.awaits_proof() => Some((policy.as_str(), node.as_str())),
                _ => None,
            })
            .collect();
        for incident in self.ledger.iter_mut() {
            incident.awaiting_proof =
                awaiting_proof.contains(&(incident.policy.as_str(), incident.node.as_str()));
        }
        plan
    }

    /// Report: gauges, and the policies' statuses.
    async fn report(&mut self, health: &HealthBook) {
        self.count_nodes(health);
        for policy in self.state.policies.keys() {
            self.metrics.touch_policy(policy);
        }
        self.metrics.failovers.set_failovers_open(
            self.state.policies.keys().map(String::as_str),
            self.ledger.iter().map(|i| (i.policy.as_str(), i.phase())),
        );
        self.write_statuses(health).await;
    }
}
