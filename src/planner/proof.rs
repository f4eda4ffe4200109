//! Whether a dead node is proven fenced, as its policy's `spec.fencing` asks, before podha
//! puts the out-of-service taint on it: what proves it (the cloud's shutdown taint, an
//! acknowledgement of this incident's fence request, an agent's silence past what it
//! advertises) and what podha knows of the node's agent for it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use crate::api::{CLOUD_SHUTDOWN_TAINT_KEY, Fencing, FencingProof};
use crate::contract::{FENCE_ACK_ANNOTATION, fenced_within};

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

/// The proof `fencing` asks for, if `node` has it (always, with `None`).
pub fn proven(fencing: &Fencing, node: &Node, agent: AgentEvidence<'_>) -> Option<FenceEvidence> {
    match fencing.proof {
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
            let acknowledged = acknowledged(node, agent.request);
            let isolation = fenced_within(node);
            let silent = matches!(
                (agent.silent_for, isolation),
                (Some(silent), Some(timeout)) if silent >= timeout + fencing.agent_margin.get()
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

/// Whether podha asks for the fence on the Node (`podha.io/fence-request`) and takes an
/// acknowledgement of it as the proof.
pub const fn requests_fence(proof: FencingProof) -> bool {
    matches!(proof, FencingProof::Agent | FencingProof::External)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::AGENT_FENCED_WITHIN_ANNOTATION;
    use crate::test_builders::*;

    #[test]
    fn the_cloud_shutdown_taint_is_the_proof_and_none_needs_nothing() {
        let spec: crate::api::PodHAPolicySpec =
            serde_json::from_value(serde_json::json!({"fencing": {"proof": "CloudShutdownTaint"}}))
                .unwrap();
        let running = mk_node("n1");
        let off = mk_node("n1").taint(CLOUD_SHUTDOWN_TAINT_KEY, "", "NoSchedule");
        let none = AgentEvidence::default();
        assert_eq!(proven(&spec.fencing, &running, none), None);
        assert_eq!(
            proven(&spec.fencing, &off, none),
            Some(FenceEvidence::CloudShutdown)
        );
        assert_eq!(
            proven(&Fencing::default(), &running, none),
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
        assert_eq!(proven(&spec.fencing, &acked, asked(None, None)), None);
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/2"), None)),
            None
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/1"), None)),
            Some(FenceEvidence::ExternalAcknowledged)
        );
        let silent_agent = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "1s");
        assert_eq!(
            proven(
                &spec.fencing,
                &silent_agent,
                asked(Some("p/1"), Some(Duration::from_secs(3600)))
            ),
            None,
            "silence proves nothing to an external fence"
        );
        assert!(requests_fence(FencingProof::External) && requests_fence(FencingProof::Agent));
        assert!(!requests_fence(FencingProof::CloudShutdownTaint));
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
        assert_eq!(
            proven(&spec.fencing, &acked, asked(None)),
            None,
            "not asked"
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/2"))),
            None,
            "an older request's acknowledgement proves nothing now"
        );
        assert_eq!(
            proven(&spec.fencing, &acked, asked(Some("p/1"))),
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
        assert_eq!(proven(&spec.fencing, &with_agent, silent(39)), None);
        assert_eq!(
            proven(&spec.fencing, &with_agent, silent(40)),
            Some(FenceEvidence::AgentSilent)
        );
        assert_eq!(
            proven(&spec.fencing, &mk_node("n1"), silent(4000)),
            None,
            "a node that never had an agent proves nothing by silence"
        );
        let garbled = mk_node("n1").annotation(AGENT_FENCED_WITHIN_ANNOTATION, "soon");
        assert_eq!(proven(&spec.fencing, &garbled, silent(4000)), None);
    }
}
