//! `spec.fencing`: what must prove that a dead node can no longer write before podha puts the
//! out-of-service taint on it (the proof itself is judged in `planner::proof`).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HumanDuration;

/// The taint the cloud node lifecycle controller puts on a node whose instance the cloud
/// provider reports shut down.
pub const CLOUD_SHUTDOWN_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// What proves a dead node fenced before the out-of-service taint. The taint tells Kubernetes
/// the node is shut down: its volumes are detached at once and attached elsewhere. A node that
/// is only frozen or cut off from the control plane still runs its containers, and unless the
/// storage fences it on detach they write on beside the replacement. With a proof, podha holds
/// the node (event `FencingPending`, nothing deleted, nothing tainted) until the proof is
/// there; `DeletePods` needs none (its fence only keeps the scheduler off the node).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Fencing {
    /// `Agent` (the default): the node's podha agent (docs/agent.md) fenced it: it
    /// acknowledged the fence podha asked for on the Node, or it has not answered podha's
    /// heartbeat for as long as it advertises on the Node (`podha.io/agent-fenced-within`, its
    /// isolation timeout) plus `agentMargin`, by which time its watchdog has reset a node cut
    /// off from podha or frozen. Only an agent that pets a watchdog advertises that: a frozen
    /// node without one never fences itself.
    /// The silence counts only for an agent podha heard right before it (within 3 s) in its
    /// current leadership term, and only while podha hears a strict majority of the other
    /// agents (an agent whose peers say podha hears nobody stays up); otherwise podha holds
    /// the node (event `AgentSilenceUnproven`) until the agent acknowledges the request. A
    /// node without an agent, or whose agent has no usable watchdog
    /// (`podha.io/agent-watchdog: none: ...`), has no silence proof: the policy shows it
    /// (condition `Degraded`, reason `AgentsMissing`).
    /// `None`: no proof; the node is taken for shut down once judged dead, and the taint
    /// follows the judgement alone (condition `Ready`, reason `WatchingWithoutProof`). Choose
    /// it only where a node that stops heartbeating is off (power loss, kernel panic), or
    /// where the storage refuses a detached node's writes; a frozen or cut-off node may
    /// otherwise write beside the replacement.
    /// `CloudShutdownTaint`: the cloud provider reported the instance shut down (the taint
    /// `node.cloudprovider.kubernetes.io/shutdown`, which the cloud node lifecycle controller
    /// adds while the instance is off and removes when it runs again).
    /// `External`: a fence controller of the user's fenced it: podha asks on the Node
    /// (annotation `podha.io/fence-request`) and the controller, once the node is off (a BMC,
    /// a cloud API, a storage fence), sets `podha.io/fence-ack` to the request's value. Only an
    /// acknowledgement of this incident's request counts; silence proves nothing.
    #[serde(default)]
    pub proof: FencingProof,
    /// With proof `Agent`: how much longer than the time the agent advertises
    /// (`podha.io/agent-fenced-within`) podha waits on a silent agent. It covers the fence
    /// itself (a reboot, a BMC's power-off) and the delay of podha's heartbeat probes. At most
    /// 1h.
    #[serde(default = "default_agent_margin")]
    #[x_kube(validation = Rule::new("duration(self) <= duration('1h')").message("fencing.agentMargin must be at most 1h"))]
    pub agent_margin: HumanDuration,
}

impl Default for Fencing {
    fn default() -> Self {
        Self {
            proof: FencingProof::default(),
            agent_margin: default_agent_margin(),
        }
    }
}

fn default_agent_margin() -> HumanDuration {
    HumanDuration::from_secs(10)
}

/// The proof the out-of-service taint needs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum FencingProof {
    None,
    CloudShutdownTaint,
    #[default]
    Agent,
    External,
}

impl FencingProof {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::CloudShutdownTaint => "CloudShutdownTaint",
            Self::Agent => "Agent",
            Self::External => "External",
        }
    }
}
