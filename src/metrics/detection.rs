//! What podha's probes concluded about nodes: how many are in each health state now, and how
//! often a policy judged a node failed. Updated by the decision loop after each probe round.

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{POLICY, register, remove_policy};

/// A node's health as counted by `podha_nodes{state}`: the worst any policy judged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    Healthy,
    /// Failing probes, fewer than the threshold.
    Suspect,
    Failed,
}

impl NodeState {
    pub const ALL: [NodeState; 3] = [NodeState::Healthy, NodeState::Suspect, NodeState::Failed];

    pub const fn as_str(self) -> &'static str {
        match self {
            NodeState::Healthy => "healthy",
            NodeState::Suspect => "suspect",
            NodeState::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Detection {
    nodes: IntGaugeVec,
    node_failures: IntCounterVec,
    agent_answers_unverified: IntCounter,
    agent_answers_mismatched: IntCounter,
    nodes_unprotected: IntGaugeVec,
    paused_nodes: IntGaugeVec,
}

impl Detection {
    /// Registers the families in `registry`, with every node state at 0 so that dashboards
    /// see 0 rather than no data before the first round.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let nodes = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_nodes",
                    "Nodes watched by at least one policy, by health state as of the last probe \
                     round (healthy, suspect = failing probes below the threshold, failed).",
                ),
                &["state"],
            )?,
        )?;
        let node_failures = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "podha_node_failures_total",
                    "Nodes that a policy judged failed (failureThreshold consecutive failed \
                     probes).",
                ),
                &[POLICY],
            )?,
        )?;
        let agent_answers_unverified = register(
            registry,
            IntCounter::new(
                "podha_agent_answers_unverified_total",
                "Heartbeat answers naming their node that the key the node publishes does not \
                 verify (a key rotated and not yet seen, an agent from before keys, an impostor): \
                 podha holds for such a node, as for one whose agent it does not hear.",
            )?,
        )?;
        let agent_answers_mismatched = register(
            registry,
            IntCounter::new(
                "podha_agent_answers_mismatched_total",
                "Heartbeat answers of a node's agent saying it last counted podha's heartbeats as \
                 heard at another time than podha told it (someone else holding the heartbeat key \
                 took the challenges podha's heartbeats sign, or tells the agent it is heard): \
                 podha holds for such a node, as for one whose agent it does not hear.",
            )?,
        )?;
        let nodes_unprotected = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_policy_nodes_unprotected",
                    "Healthy nodes watched by a policy with fencing.proof Agent that have had no \
                     agent whose silence proves their fence (no agent, no usable watchdog, its \
                     Lease lapsed, or it cannot reach half of its peers) for 30s: judged dead, they are held until their agent \
                     acknowledges a fence request. Set by the leader only.",
                ),
                &[POLICY],
            )?,
        )?;
        let paused_nodes = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_policy_paused_nodes",
                    "Nodes watched by a policy on which podha takes no new action: all of them \
                     while the policy is paused (spec.paused), else those annotated \
                     podha.io/paused. Set by the leader only.",
                ),
                &[POLICY],
            )?,
        )?;
        let detection = Self {
            nodes,
            node_failures,
            agent_answers_unverified,
            agent_answers_mismatched,
            nodes_unprotected,
            paused_nodes,
        };
        detection.set_nodes(0, 0, 0);
        Ok(detection)
    }

    pub fn set_nodes(&self, healthy: usize, suspect: usize, failed: usize) {
        for state in NodeState::ALL {
            let count = match state {
                NodeState::Healthy => healthy,
                NodeState::Suspect => suspect,
                NodeState::Failed => failed,
            };
            self.nodes
                .with_label_values(&[state.as_str()])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub fn inc_agent_answers_unverified(&self, answers: usize) {
        self.agent_answers_unverified
            .inc_by(u64::try_from(answers).unwrap_or(u64::MAX));
    }

    pub fn inc_agent_answers_mismatched(&self, answers: usize) {
        self.agent_answers_mismatched
            .inc_by(u64::try_from(answers).unwrap_or(u64::MAX));
    }

    pub fn inc_node_failures(&self, policy: &str) {
        self.node_failures.with_label_values(&[policy]).inc();
    }

    pub fn set_nodes_unprotected(&self, policy: &str, count: usize) {
        self.nodes_unprotected
            .with_label_values(&[policy])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn set_paused_nodes(&self, policy: &str, count: usize) {
        self.paused_nodes
            .with_label_values(&[policy])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A follower reports no unprotected or paused nodes: only the leader's counts are current.
    pub fn clear_nodes_unprotected(&self) {
        self.nodes_unprotected.reset();
        self.paused_nodes.reset();
    }

    /// Exports `policy`'s failure counter at 0 until it counts.
    pub(super) fn touch_policy(&self, policy: &str) {
        self.node_failures.with_label_values(&[policy]);
    }

    pub(super) fn forget_policy(&self, policy: &str) {
        remove_policy(&self.node_failures, policy);
        remove_policy(&self.nodes_unprotected, policy);
        remove_policy(&self.paused_nodes, policy);
    }
}
