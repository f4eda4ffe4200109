//! What the planner would do if a node died now: the round it would plan, foreseen. `podha
//! explain`, the policies' coverage and `podha_pods` answer "would podha fail this pod over?"
//! from the verdicts of that round (see `verdict.rs`), so they say what `plan` does.
//!
//! The foreseen death: every policy that watches the node judges it Failed now; every other
//! node they watch is as the operator judges it ([`Seen`], when the operator asks) or else
//! healthy; the nodes that failed recently count for `safety.unhealthyWindow`; the pods on the
//! node now are the pods at failure, none marked, deleted or tainted for yet. Since the death,
//! every other node has shown life on each probe it can answer: its Lease, its kubelet's port,
//! and its agent if it advertises one ([`heard_since_the_death`]); so the settle wait lets the
//! round go, unless a policy judges by probes some node can never answer. What depends on the
//! death itself is not foreseen: how long the settle wait takes, and whether the fencing proof
//! comes (it is taken as given; `crate::protection` says what the proof needs of the node).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    HealthBook, Heartbeat, Heartbeats, NodeVerdict, Plan, PlanInput, PolicyRef, Round, holds,
    node_owner, plan_incident,
};
use crate::contract::agent_addr;
use crate::eligibility::node_selected;
use crate::health::NodeHealth;
use crate::incident::Ledger;
use crate::view::View;

/// What the operator knows of its nodes when it is the one asking: each policy's judgement of
/// the nodes it watches, and every failure it remembers (node, when judged dead).
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    pub health: &'a HealthBook,
    pub failures: &'a [(String, Instant)],
}

/// The verdict of the round `plan` would run were `node` judged dead now (see the module
/// docs); `None` when no policy selects the node or it is not in the view.
pub fn foresee(
    policies: &[PolicyRef<'_>],
    unreadable: &[String],
    view: &View,
    seen: Option<Seen<'_>>,
    node: &str,
    now: Instant,
) -> Option<NodeVerdict> {
    let node_obj = view.nodes.get(node)?;
    let mut policies = policies.to_vec();
    policies.sort_by(|a, b| a.name.cmp(b.name));
    let node_policy = node_owner(&policies, node_obj)?;
    let health = foreseen_health(&policies, view, seen.map(|s| s.health), node, now);
    let mut ledger = Ledger::default();
    for (failed, at) in seen.map_or(&[][..], |s| s.failures) {
        ledger.remember_failure(failed, *at);
    }
    ledger.open(node, node_policy.name, None, now, view);
    let heartbeats = heard_since_the_death(view, node, now);
    let input = PlanInput {
        policies: &policies,
        health: &health,
        view,
        ledger: &ledger,
        heartbeats: &heartbeats,
        unreadable,
        agent_quorum_since: None,
        now,
    };
    let held = holds::held_policies(&policies, &input);
    let incident = ledger.get(node)?;
    let mut out = Plan::default();
    plan_incident(
        incident,
        &policies,
        &held,
        &input,
        Round::Foreseen,
        &mut out,
    );
    out.verdicts.pop()
}

/// How long before now the foreseen death happened: long enough that a settle wait would be
/// reported as a hold (two renew intervals past the instant the node was certainly silent).
const DIED_AGO: Duration = Duration::from_secs(3600);

/// What podha has heard since `dead` died: nothing of `dead`, and of every other node each
/// probe it can answer, just now (its Lease renewed, its kubelet's port answered, and its agent,
/// if it advertises one).
fn heard_since_the_death(view: &View, dead: &str, now: Instant) -> Heartbeats {
    let died = now.checked_sub(DIED_AGO).unwrap_or(now);
    view.nodes
        .iter()
        .map(|(name, node)| {
            let heartbeat = if name == dead {
                Heartbeat {
                    last_renewal: Some(died),
                    renewal_not_before: Some(died),
                    silent_since: died,
                    tcp_silent_since: Some(died),
                    agent_silent_since: Some(died),
                    ..Heartbeat::silent_since(died, RENEW_PERIOD)
                }
            } else {
                let agent = agent_addr(node).map(|_| now);
                Heartbeat {
                    last_renewal: Some(now),
                    renewal_not_before: Some(now),
                    tcp_answered: Some(now),
                    agent_answered: agent,
                    agent_connected: agent,
                    ..Heartbeat::silent_since(now, RENEW_PERIOD)
                }
            };
            (name.clone(), heartbeat)
        })
        .collect()
}

/// The kubelet's renew interval the foreseen heartbeats assume (a quarter of the default 40 s
/// Lease).
const RENEW_PERIOD: Duration = Duration::from_secs(10);

/// Every node each policy watches as `seen` judges it (healthy when nothing is seen), but
/// `dead`, judged Failed at `now`.
fn foreseen_health(
    policies: &[PolicyRef<'_>],
    view: &View,
    seen: Option<&HealthBook>,
    dead: &str,
    now: Instant,
) -> HealthBook {
    policies
        .iter()
        .map(|policy| {
            let judged = seen.and_then(|book| book.get(policy.name));
            let watched: BTreeMap<String, NodeHealth> = view
                .nodes
                .iter()
                .filter(|(_, node)| node_selected(policy.spec, node))
                .map(|(name, _)| {
                    let health = if name == dead {
                        NodeHealth::Failed { since: now }
                    } else {
                        judged
                            .and_then(|nodes| nodes.get(name))
                            .copied()
                            .unwrap_or(NodeHealth::Healthy)
                    };
                    (name.clone(), health)
                })
                .collect();
            (policy.name.to_string(), watched)
        })
        .collect()
}
