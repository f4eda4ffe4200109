//! What podha reports back on a `PodHAPolicy`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How many failovers a policy keeps in its status.
pub const RECENT_FAILOVERS_KEPT: usize = 10;

/// Observed state of a PodHAPolicy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodHAPolicyStatus {
    /// The policy generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: the policy is valid and podha watches its nodes. `Degraded`: something needs an
    /// operator's attention (actions held, a detach stuck, an invalid spec); the reason says
    /// which, in CamelCase.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Nodes selected by this policy.
    #[serde(default)]
    pub watched_nodes: i32,

    /// Selected nodes currently judged Failed.
    #[serde(default)]
    pub failed_nodes: i32,

    /// Selected nodes on their way to Failed: at least one probe failed, fewer than
    /// `detection.failureThreshold` in a row.
    #[serde(default)]
    pub suspect_nodes: i32,

    /// Selected nodes on which podha takes no new action: all of them while `spec.paused`,
    /// else those annotated `podha.io/paused`.
    #[serde(default)]
    pub paused_nodes: i32,

    /// Pods this policy selects that mount a PersistentVolumeClaim and that podha would fail
    /// over if their node died now: every rule `podha explain pod` lists passes. Pods without a
    /// claim are not counted (Kubernetes replaces them by itself). Recomputed on changes, at
    /// most every few seconds.
    #[serde(default)]
    pub protected_pods: i32,

    /// Pods this policy selects that mount a PersistentVolumeClaim and that podha would leave
    /// where they are if their node died now.
    #[serde(default)]
    pub unprotected_pods: i32,

    /// Of `protectedPods`, those podha would move only on the slow path: under
    /// `OutOfServiceTaint` the taint would be refused on their node (a pod podha must not move
    /// is there), so their volumes detach only after the attach/detach controller's 6-minute
    /// wait. `podha explain node` names the pod that must stay.
    #[serde(default)]
    pub slow_detach_pods: i32,

    /// Why the unprotected pods are not protected: the first rule each fails, most pods first
    /// (at most 5 reasons; `podha explain policy` lists them all, with examples).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprotected_reasons: Vec<UnprotectedReason>,

    /// When the most recent failover started (the node was judged Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover_time: Option<Time>,

    /// The most recent failovers, newest first (at most 10).
    #[serde(default)]
    pub recent_failovers: Vec<FailoverRecord>,
}

impl PodHAPolicyStatus {
    /// The condition `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// `Degraded=True` with `reason`, if that is what the status says.
    pub fn degraded_because(&self, reason: &str) -> Option<&Condition> {
        self.condition(condition::DEGRADED)
            .filter(|c| c.status == "True" && c.reason == reason)
    }
}

/// How many of a policy's pods one rule keeps from being failed over.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnprotectedReason {
    /// The first rule the pods fail, in CamelCase: an eligibility reason (`OptedOut`,
    /// `DriverNotSelected`, `NoTargetNode`, `ToleratesFence`, ...), the policy's state
    /// (`Paused`, `DryRun`, `TooManyUnhealthyNodes`, `PolicyUnreadable`) or the fence's proof
    /// (`NoProvingAgent`, `TooFewAgentsHeard`, `NoCloudProvider`, `NoBMC`).
    pub reason: String,
    /// How many pods it keeps.
    pub pods: i32,
}

/// How many reasons a policy's status lists.
pub const UNPROTECTED_REASONS_KEPT: usize = 5;

/// One node failure handled by a policy, with the time of each phase.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// The node judged dead.
    pub node: String,
    /// Where the failover stands.
    pub phase: FailoverPhase,
    /// When podha last saw the node alive (last lease renewal or Ready) before it died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_alive: Option<Time>,
    /// When the node was judged Failed.
    pub detected_at: Time,
    /// When podha acted (taint added or first pod deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acted_at: Option<Time>,
    /// When the last VolumeAttachment of the moved pods' volumes left the dead node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached_at: Option<Time>,
    /// When every replacement pod ran on a healthy node with its volumes attached there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_at: Option<Time>,
    /// Pods deleted, as `namespace/name`.
    #[serde(default)]
    pub pods: Vec<String>,
    /// A human-readable note (why a failover was held, which detach is stuck).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The phases of one failover.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FailoverPhase {
    /// The node is Failed; actions are being taken.
    Acting,
    /// Actions held (safety limit, dry run, no eligible pod).
    Held,
    /// Pods deleted; waiting for their volumes to detach from the dead node.
    Detaching,
    /// Volumes detached; waiting for replacements to run with their volumes attached.
    Recovering,
    /// Replacements run on healthy nodes with their volumes attached.
    Recovered,
    /// The detach did not finish within `detachTimeout`.
    DetachTimedOut,
    /// The node came back before the failover finished.
    NodeReturned,
}

/// Condition types and reasons used on a PodHAPolicy.
pub mod condition {
    pub const READY: &str = "Ready";
    pub const DEGRADED: &str = "Degraded";

    pub const REASON_WATCHING: &str = "Watching";
    /// Ready, with `fencing.proof: None` and the taint: it follows the judgement alone.
    pub const REASON_WATCHING_WITHOUT_PROOF: &str = "WatchingWithoutProof";
    /// Ready, with `spec.paused`: watching and judging, no new action.
    pub const REASON_PAUSED: &str = "Paused";
    pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
    pub const REASON_TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthyNodes";
    pub const REASON_DETACH_TIMEOUT: &str = "DetachTimeout";
    pub const REASON_POLICY_UNREADABLE: &str = "PolicyUnreadable";
    /// Dead nodes held until their fence is proven.
    pub const REASON_FENCING_PENDING: &str = "FencingPending";
    /// Watched nodes without an agent whose silence proves their fence (`proof: Agent`).
    pub const REASON_AGENTS_MISSING: &str = "AgentsMissing";
    pub const REASON_AS_EXPECTED: &str = "AsExpected";
}
