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
}

impl AgentGap {
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Absent => "no agent",
            Self::WithoutWatchdog => "agent without a usable watchdog",
            Self::LeaseStale => "agent Lease missing or not renewed",
        }
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
    (!fresh).then_some(AgentGap::LeaseStale)
}
