//! `spec.fencing`: what must prove that a dead node can no longer write before podha puts the
//! out-of-service taint on it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HumanDuration;
use crate::contract::{AGENT_FENCED_WITHIN_ANNOTATION, FENCE_ACK_ANNOTATION};

/// The taint the cloud node lifecycle controller puts on a node whose instance the cloud
/// provider reports shut down.
pub const CLOUD_SHUTDOWN_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// What proves a dead node fenced before the out-of-service taint. The taint tells Kubernetes
/// the node is shut down: its volumes are detached at once and attached elsewhere. A node that
/// is only frozen or cut off from the control plane still runs its containers, and unless the
/// storage fences it on detach they write on beside the replacement. With a proof, podha holds
/// the node (event `FencingPending`, nothing deleted, nothing tainted) until the proof is
/// there; `DeletePods` needs none (its fence only keeps the scheduler off the node).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fencing {
    /// `None` (the default): no proof; the node is taken for shut down once judged dead. Safe
    /// where a node that stops heartbeating is off (power loss, kernel panic), or where the
    /// storage refuses a detached node's writes; a frozen or cut-off node may otherwise write
    /// beside the replacement. `CloudShutdownTaint`: the cloud provider reported the instance
    /// shut down (the taint `node.cloudprovider.kubernetes.io/shutdown`, which the cloud node
    /// lifecycle controller adds while the instance is off and removes when it runs again).
    /// `Agent`: the node's podha agent (docs/agent.md) fenced it: it acknowledged the fence
    /// podha asked for on the Node, or it has not answered podha's heartbeat for as long as it
    /// advertises on the Node (`podha.io/agent-fenced-within`: its isolation timeout with a
    /// watchdog, longer without) plus `agentMargin`, by which time an agent cut off from podha
    /// has fenced its node itself. A node without an agent never has this proof.
    /// `External`: a fence controller of the user's fenced it: podha asks on the Node
    /// (annotation `podha.io/fence-request`) and the controller, once the node is off (a BMC,
    /// a cloud API, a storage fence), sets `podha.io/fence-ack` to the request's value. Only an
    /// acknowledgement of this incident's request counts; silence proves nothing.
    #[serde(default)]
    pub proof: FencingProof,
    /// With proof `Agent`: how much longer than the time the agent advertises
    /// (`podha.io/agent-fenced-within`, which includes the agent's own checks and peer
    /// surveys) podha waits on a silent agent. It covers the fence itself (a reboot, a BMC's
    /// power-off) and the delay of podha's heartbeat probes.
    #[serde(default = "default_agent_margin")]
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
    #[default]
    None,
    CloudShutdownTaint,
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

    /// Whether podha asks for the fence on the Node (`podha.io/fence-request`) and takes an
    /// acknowledgement of it as the proof.
    pub const fn requests_fence(self) -> bool {
        matches!(self, Self::Agent | Self::External)
    }
}

/// What podha knows of a node's agent for the `Agent` proof.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentEvidence<'a> {
    /// How long the agent has not answered podha's heartbeat; `None` while it answers (or was
    /// never asked).
    pub silent_for: Option<Duration>,
    /// The fence podha asked the agent for in this incident, if it did.
    pub request: Option<&'a str>,
}

/// What proved a node fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceEvidence {
    /// The policy asks for no proof.
    NotAsked,
    /// The cloud provider's shutdown taint.
    CloudShutdown,
    /// The agent acknowledged podha's fence request.
    AgentAcknowledged,
    /// The agent has been silent past its isolation timeout and the margin.
    AgentSilent,
    /// The user's fence controller acknowledged podha's fence request.
    ExternalAcknowledged,
}

impl FenceEvidence {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotAsked => "NotAsked",
            Self::CloudShutdown => "CloudShutdownTaint",
            Self::AgentAcknowledged => "AgentAcknowledged",
            Self::AgentSilent => "AgentSilent",
            Self::ExternalAcknowledged => "ExternalAcknowledged",
        }
    }
}

impl Fencing {
    /// The proof this policy asks for, if `node` has it (always, with `None`).
    pub fn proven(&self, node: &Node, agent: AgentEvidence<'_>) -> Option<FenceEvidence> {
        match self.proof {
            FencingProof::None => Some(FenceEvidence::NotAsked),
            FencingProof::CloudShutdownTaint => node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == CLOUD_SHUTDOWN_TAINT_KEY))
                .then_some(FenceEvidence::CloudShutdown),
            FencingProof::External => {
                acknowledged(node, agent.request).then_some(FenceEvidence::ExternalAcknowledged)
            }
            FencingProof::Agent => {
                let annotations = node.metadata.annotations.as_ref();
                let acknowledged = acknowledged(node, agent.request);
                let isolation = annotations
                    .and_then(|a| a.get(AGENT_FENCED_WITHIN_ANNOTATION))
                    .and_then(|t| humantime::parse_duration(t).ok());
                let silent = matches!(
                    (agent.silent_for, isolation),
                    (Some(silent), Some(timeout)) if silent >= timeout + self.agent_margin.get()
                );
                if acknowledged {
                    Some(FenceEvidence::AgentAcknowledged)
                } else if silent {
                    Some(FenceEvidence::AgentSilent)
                } else {
                    None
                }
            }
        }
    }
}

/// Whether `node` carries the acknowledgement of `request` (this incident's fence request).
fn acknowledged(node: &Node, request: Option<&str>) -> bool {
    request.is_some_and(|request| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FENCE_ACK_ANNOTATION))
            .map(String::as_str)
            == Some(request)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    #[test]
    fn the_cloud_shutdown_taint_is_the_proof_and_none_needs_nothing() {
        let spec: crate::api::PodHAPolicySpec =
            serde_json::from_value(serde_json::json!({"fencing": {"proof": "CloudShutdownTaint"}}))
                .unwrap();
        let running = mk_node("n1");
        let off = mk_node("n1").taint(CLOUD_SHUTDOWN_TAINT_KEY, "", "NoSchedule");
        let none = AgentEvidence::default();
        assert_eq!(spec.fencing.proven(&running, none), None);
        assert_eq!(
            spec.fencing.proven(&off, none),
            Some(FenceEvidence::CloudShutdown)
        );
        assert_eq!(
            Fencing::default().proven(&running, none),
            Some(FenceEvidence::NotAsked)
        );
        assert!(
            serde_json::from_value::<crate::api::PodHAPolicySpec>(
                serde_json::json!({"fencing": {"proof": "Hope"}})
            )
            .is_err()
        );
    }

    #[test]
    fn an_external_fence_is_proven_by_the_acknowledgement_of_this_incidents_request_only() {
        let spec: crate::api::PodHAPolicySpec =
            serde_json::from_value(serde_json::json!({"fencing": {"proof": "External"}})).unwrap();
        let acked = mk_node("n1").annotation(FENCE_ACK_ANNOTATION, "p/1");
        let asked = |request, silent_for| AgentEvidence {
            silent_for,
            request,
        };
        assert_eq!(spec.fencing.proven(&acked, asked(None, None)), None);
        assert_eq!(spec.fencing.proven(&acked, asked(Some("p/2"), None)), None);
        assert_eq!(
            spec.fencing.proven(&acked, asked(Some("p/1"), None)),
            Some(FenceEvidence::ExternalAcknowledged)
        );
        let silent_agent = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "1s");
        assert_eq!(
            spec.fencing.proven(
                &silent_agent,
                asked(Some("p/1"), Some(Duration::from_secs(3600)))
            ),
            None,
            "silence proves nothing to an external fence"
        );
        assert!(FencingProof::External.requests_fence() && FencingProof::Agent.requests_fence());
        assert!(!FencingProof::CloudShutdownTaint.requests_fence());
    }

    fn agent_spec() -> crate::api::PodHAPolicySpec {
        serde_json::from_value(serde_json::json!({"fencing": {"proof": "Agent"}})).unwrap()
    }

    #[test]
    fn an_agent_proves_the_fence_by_its_acknowledgement_of_this_incidents_request() {
        let spec = agent_spec();
        let acked = mk_node("n1").annotation(FENCE_ACK_ANNOTATION, "p/1");
        let asked = |request| AgentEvidence {
            silent_for: None,
            request,
        };
        assert_eq!(spec.fencing.proven(&acked, asked(None)), None, "not asked");
        assert_eq!(
            spec.fencing.proven(&acked, asked(Some("p/2"))),
            None,
            "an older request's acknowledgement proves nothing now"
        );
        assert_eq!(
            spec.fencing.proven(&acked, asked(Some("p/1"))),
            Some(FenceEvidence::AgentAcknowledged)
        );
    }

    #[test]
    fn an_agent_proves_the_fence_by_its_silence_past_its_timeout_and_the_margin() {
        let spec = agent_spec();
        let with_agent = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s");
        let silent = |secs| AgentEvidence {
            silent_for: Some(Duration::from_secs(secs)),
            request: None,
        };
        assert_eq!(spec.fencing.proven(&with_agent, silent(39)), None);
        assert_eq!(
            spec.fencing.proven(&with_agent, silent(40)),
            Some(FenceEvidence::AgentSilent)
        );
        assert_eq!(
            spec.fencing.proven(&mk_node("n1"), silent(4000)),
            None,
            "a node that never had an agent proves nothing by silence"
        );
        let garbled = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "soon");
        assert_eq!(spec.fencing.proven(&garbled, silent(4000)), None);
    }
}
