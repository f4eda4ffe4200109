//! What the leader tells people of the agents it cannot count on while their nodes are up: an
//! agent it does not hear, and an agent that cannot reach its peers (whose node it holds).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::Actor;
use crate::contract::agent_addr;
use crate::health::{ProbeKind, ReadyStatus};

/// How long the leader may not hear the agent of a Ready node that advertises one before it
/// reports the agent unreachable.
pub(super) const AGENT_UNREACHABLE_AFTER: Duration = Duration::from_secs(30);

impl Actor {
    /// Reports the agents the leader cannot hear on nodes that are up (Ready, advertising an
    /// agent on the Node): their port blocked (a NetworkPolicy, a firewall) or the agent not
    /// running. Such a node is not fenced by its agent on isolation (the agent never learned it
    /// was heard), and `proof: Agent` cannot prove it fenced by silence: the user must know
    /// before the node fails. Event `AgentUnreachable` once per episode (until the agent is
    /// heard again) and `podha_agents_unreachable`.
    pub(super) async fn report_unreachable_agents(&mut self, now: Instant) {
        let Some(since) = self.leading_since.filter(|_| self.leading) else {
            self.metrics.operating.set_agents_unreachable(0);
            return;
        };
        let view = &self.state.view;
        let mut unreachable = Vec::new();
        for (name, node) in &view.nodes {
            let (Some(obs), Some(addr)) = (self.state.observations.get(name), agent_addr(node))
            else {
                continue;
            };
            if ReadyStatus::from_node(node) != ReadyStatus::True {
                continue;
            }
            let agent = obs.probed(ProbeKind::Agent);
            let heard_or_asked = agent
                .connected
                .or(agent.from)
                .map_or(since, |t| t.max(since));
            let unheard = now.saturating_duration_since(heard_or_asked);
            if unheard >= AGENT_UNREACHABLE_AFTER {
                unreachable.push((name.clone(), addr, agent.connected, unheard));
            }
        }
        self.metrics
            .operating
            .set_agents_unreachable(unreachable.len());
        for (node, addr, last_heard, unheard) in unreachable {
            if !self
                .reported
                .first(&node, format!("agent-unreachable/{since:?}/{last_heard:?}"))
            {
                continue;
            }
            let note = format!(
                "podha has not heard the agent of node {node} ({addr}) for {}s though the node \
                 is Ready: its port may be blocked (a NetworkPolicy, a firewall) or the agent \
                 not running. It does not fence this node on isolation, and with \
                 fencing.proof Agent podha cannot prove the node fenced by its silence",
                unheard.as_secs()
            );
            warn!(node, %note, "agent unreachable");
            let event = self.node_event(&node, true, "AgentUnreachable", "Probe", note);
            self.event(event).await;
        }
    }

    /// Reports the agents whose Lease says they cannot reach half of their peers
    /// ([`crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION`]): their nodes are held (the
    /// agent fences nothing on isolation, and podha counts no silence of it), so they fail
    /// over by no agent's silence until the peers answer again. Event
    /// `AgentPeersUnreachable` once per episode and `podha_agents_peers_unreachable`.
    pub(super) async fn report_agents_peers_unreachable(&mut self) {
        let unreachable: BTreeSet<String> = if self.leading {
            self.state
                .view
                .agent_adverts
                .iter()
                .filter(|(node, a)| {
                    a.peers_unreachable.is_some() && self.state.view.nodes.contains_key(*node)
                })
                .map(|(node, _)| node.clone())
                .collect()
        } else {
            BTreeSet::new()
        };
        self.metrics
            .operating
            .set_agents_peers_unreachable(unreachable.len());
        for node in self.reported.set_peers_unreachable(unreachable) {
            let said = self
                .state
                .view
                .agent_adverts
                .get(&node)
                .and_then(|a| a.peers_unreachable.clone())
                .unwrap_or_default();
            let note = format!(
                "the agent of node {node} cannot reach half of its peers ({said} of the peers \
                 its last check asked answered): their agent port is blocked from it (a \
                 NetworkPolicy, a firewall). On isolation it could not show that podha hears \
                 no majority of the agents, and would reboot its node in an outage of podha or \
                 of the API server, so podha holds the node: its agent fences nothing on \
                 isolation, and fencing.proof Agent proves no fence of it until the peers \
                 answer again"
            );
            warn!(node, %note, "agent cannot reach its peers");
            let event = self.node_event(&node, true, "AgentPeersUnreachable", "Hold", note);
            self.event(event).await;
        }
    }
}
