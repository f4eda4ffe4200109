//! `spec.fencing`: what must prove that a dead node can no longer write before podha puts the
//! out-of-service taint on it.

use k8s_openapi::api::core::v1::Node;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The taint the cloud node lifecycle controller puts on a node whose instance the cloud
/// provider reports shut down.
pub const CLOUD_SHUTDOWN_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// What proves a dead node fenced before the out-of-service taint. The taint tells Kubernetes
/// the node is shut down: its volumes are detached at once and attached elsewhere. A node that
/// is only frozen or cut off from the control plane still runs its containers, and unless the
/// storage fences it on detach they write on beside the replacement. With a proof, podha holds
/// the node (event `FencingPending`, nothing deleted, nothing tainted) until the proof is
/// there; `DeletePods` needs none (its fence only keeps the scheduler off the node).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fencing {
    /// `None` (the default): no proof; the node is taken for shut down once judged dead. Safe
    /// where a node that stops heartbeating is off (power loss, kernel panic), or where the
    /// storage refuses a detached node's writes; a frozen or cut-off node may otherwise write
    /// beside the replacement. `CloudShutdownTaint`: the cloud provider reported the instance
    /// shut down (the taint `node.cloudprovider.kubernetes.io/shutdown`, which the cloud node
    /// lifecycle controller adds while the instance is off and removes when it runs again).
    #[serde(default)]
    pub proof: FencingProof,
}

/// The proof the out-of-service taint needs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum FencingProof {
    #[default]
    None,
    CloudShutdownTaint,
}

impl FencingProof {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::CloudShutdownTaint => "CloudShutdownTaint",
        }
    }
}

impl Fencing {
    /// Whether `node` carries the proof this policy asks for (always, with `None`).
    pub fn proven(&self, node: &Node) -> bool {
        match self.proof {
            FencingProof::None => true,
            FencingProof::CloudShutdownTaint => node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == CLOUD_SHUTDOWN_TAINT_KEY)),
        }
    }
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
        assert!(!spec.fencing.proven(&running));
        assert!(spec.fencing.proven(&off));
        assert!(Fencing::default().proven(&running));
        assert!(
            serde_json::from_value::<crate::api::PodHAPolicySpec>(
                serde_json::json!({"fencing": {"proof": "Hope"}})
            )
            .is_err()
        );
    }
}
