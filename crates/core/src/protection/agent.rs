//! What a node lacks for the agent's proof (`fencing.proof: Agent`), as a reader of the API
//! can tell: an agent advertised on the Node, with a usable watchdog, renewing its Lease.

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use crate::contract::{agent_addr, fenced_within};
use crate::view::View;

/// What a node lacks for the agent's proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentGap {
    /// No agent advertises itself on the Node (`podha.io/agent-port`, with an InternalIP).
    Absent,
    /// The agent advertises no `podha.io/agent-fenced-within`: it has no usable watchdog
    /// (`podha.io/agent-watchdog` on the Node says why).
    WithoutWatchdog,
    /// The agent's Lease in podha's namespace is gone, or was not renewed within its duration.
    LeaseStale,
    /// The agent's Lease says it cannot reach half of its peers
    /// ([`crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION`]): podha holds its node, and
    /// counts no silence of it.
    PeersUnreachable,
}

impl AgentGap {
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Absent => "no agent",
            Self::WithoutWatchdog => "agent without a usable watchdog",
            Self::LeaseStale => "agent Lease missing or not renewed",
            Self::PeersUnreachable => "agent that cannot reach half of its peers",
        }
    }

    /// What brings the proof back.
    pub const fn remedy(self) -> &'static str {
        match self {
            Self::Absent | Self::WithoutWatchdog | Self::LeaseStale => {
                "install the agent and a watchdog, docs/agent.md"
            }
            Self::PeersUnreachable => {
                "open the agent port between the nodes: a NetworkPolicy or a firewall blocks \
                 it, docs/agent.md"
            }
        }
    }

    /// Whether the agent, though it lacks the proof, is one podha hears as a reader of the API
    /// can tell (a fresh Lease): it counts among the agents of podha's majority.
    pub const fn heard(self) -> bool {
        matches!(self, Self::PeersUnreachable)
    }
}

/// What `node`'s agent lacks for the agent's proof now, if anything.
pub fn agent_gap(name: &str, node: &Node, view: &View, now: Instant) -> Option<AgentGap> {
    if agent_addr(node).is_none() {
        return Some(AgentGap::Absent);
    }
    if fenced_within(node).is_none() {
        return Some(AgentGap::WithoutWatchdog);
    }
    let fresh = view
        .agent_adverts
        .get(name)
        .is_some_and(|lease| now.saturating_duration_since(lease.renewed_seen) <= lease.lasts);
    if !fresh {
        return Some(AgentGap::LeaseStale);
    }
    view.agent_adverts
        .get(name)
        .and_then(|lease| lease.peers_unreachable.as_ref())
        .map(|_| AgentGap::PeersUnreachable)
}
