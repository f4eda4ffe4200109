//! Which nodes of a policy that asks for the agent's proof (`fencing.proof: Agent`) have no
//! agent whose silence could prove their fence: no agent advertised on the Node, an agent
//! without a usable watchdog (it advertises no `podha.io/agent-fenced-within`), or an agent
//! Lease that is gone or lapsed. Such a node, judged dead, is held until its agent
//! acknowledges a fence request, which a node that is off never does: the policy says so
//! before that happens (condition `Degraded`, reason `AgentsMissing`, a Warning event and
//! `podha_policy_nodes_unprotected`).
//!
//! A node counts only once it has lacked its agent for [`MISSING_AFTER`]: an agent's pod
//! replaced (a rollout, an eviction) withdraws its advert and a new one puts it back within
//! seconds. Nodes the policy judges suspect or failed are left out: their agents are expected
//! to fall silent, and the incident says what holds them; so are control-plane nodes that take
//! no ordinary workload and run no agent ([`CONTROL_PLANE_LABEL`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::{FencingProof, PodHAPolicy};
use crate::health::NodeHealth;
use crate::protection::{AgentGap, agent_gap};
use crate::view::View;

/// The label (and taint) of a control-plane node. The chart runs no agent there unless asked
/// (`agent.controlPlane`). A control-plane node that takes no ordinary workload (tainted
/// `NoSchedule` or `NoExecute` with this key, as kubeadm and kind leave it) needs none and is
/// not reported; one that does (a k3s server, a single-node cluster) is, as any node without
/// its agent: set `agent.controlPlane` there.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// Whether `node` is a control-plane node that takes no ordinary workload.
fn control_plane_only(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints.iter().any(|t| {
                t.key == CONTROL_PLANE_LABEL
                    && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            })
        });
    labelled && tainted
}

/// How long a node must lack its agent before the policy reports it.
pub const MISSING_AFTER: Duration = Duration::from_secs(30);

/// How many nodes a policy's condition names (the count says how many more).
const NAMED: usize = 5;

/// Since when each node has lacked its agent, to report only lasting gaps. Every replica
/// keeps it, so that one that takes the lead knows already.
#[derive(Default)]
pub struct AgentCoverage {
    missing_since: BTreeMap<String, (AgentGap, Instant)>,
    /// The first observation: until [`MISSING_AFTER`] has passed since, no gap can have
    /// lasted, and none is known not to have (a process that just started).
    first: Option<Instant>,
}

impl AgentCoverage {
    /// Notes every node's gap now; a node whose gap closed (or changed) starts over.
    pub fn observe(&mut self, view: &View, now: Instant) {
        self.first.get_or_insert(now);
        let mut seen = BTreeMap::new();
        for (name, node) in &view.nodes {
            let gap = agent_gap(name, node, view, now)
                .filter(|gap| !(*gap == AgentGap::Absent && control_plane_only(node)));
            if let Some(gap) = gap {
                let since = match self.missing_since.get(name) {
                    Some((previous, since)) if *previous == gap => *since,
                    _ => now,
                };
                seen.insert(name.clone(), (gap, since));
            }
        }
        self.missing_since = seen;
    }

    /// How long this process has watched the agents (every replica does, leading or not).
    pub fn watched_for(&self, now: Instant) -> Duration {
        self.first
            .map_or(Duration::ZERO, |first| now.saturating_duration_since(first))
    }

    /// The nodes `policy` watches (`health`) that have lacked their agent for
    /// [`MISSING_AFTER`], and what they lack; empty for a policy that does not rely on agents;
    /// `None` while this process has not observed for that long (it cannot tell yet).
    pub fn unprotected(
        &self,
        policy: &PodHAPolicy,
        health: &BTreeMap<String, NodeHealth>,
        now: Instant,
    ) -> Option<Vec<(String, AgentGap)>> {
        // Only a policy that waits for the agent's proof relies on agents (under `anyOf`,
        // another proof may prove the fence of a node without one).
        if !policy.spec.fencing.proofs().requires(FencingProof::Agent) {
            return Some(Vec::new());
        }
        let observed = self.first.map(|first| now.saturating_duration_since(first));
        if observed.is_none_or(|observed| observed < MISSING_AFTER) {
            return None;
        }
        let unprotected = health
            .iter()
            .filter(|(_, h)| matches!(h, NodeHealth::Healthy))
            .filter_map(|(name, _)| {
                let (gap, since) = self.missing_since.get(name)?;
                (now.saturating_duration_since(*since) >= MISSING_AFTER)
                    .then(|| (name.clone(), *gap))
            })
            .collect();
        Some(unprotected)
    }
}

/// The `Degraded` message for `unprotected` of `watched` nodes: the count, the first few
/// named with what they lack.
pub fn describe_unprotected(unprotected: &[(String, AgentGap)], watched: usize) -> String {
    let named: Vec<String> = unprotected
        .iter()
        .take(NAMED)
        .map(|(node, gap)| format!("{node} ({})", gap.describe()))
        .collect();
    let more = unprotected.len().saturating_sub(NAMED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} of {watched} watched nodes have no agent whose silence proves their fence \
         (fencing.proof Agent, alone or in allOf): {}{more}. Judged dead, such a node is held \
         until its agent acknowledges a fence request; install the agent (chart value agent.enabled) and a \
         watchdog on these nodes, or open the agent port between the nodes for an agent that \
         cannot reach its peers (docs/agent.md), or choose another proof",
        unprotected.len(),
        named.join(", ")
    )
}

#[cfg(test)]
mod tests;
