//! What the planner asks for: an [`Intent`] per action (or hold), and the names the rest of
//! podha gives it: its key among the actions in flight, its node, its words in an event.

use super::proof::SilenceDoubt;
use crate::api::{NodeTaint, Proofs};
use crate::view::ObjectKey;

/// Something the actuator should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Add the taint (out-of-service, or the scheduling fence) and podha's marker.
    TaintNode {
        node: String,
        policy: String,
        taint: NodeTaint,
        /// When the proof is the node's agent's silence counted through its Lease's word of
        /// being heard (a leadership term that never heard the agent): the Lease as podha saw
        /// it. Read again right before the taint, from the API server, a Lease of another
        /// version stops it (see [`AgentLeaseSeen`]).
        agent_lease_seen: Option<AgentLeaseSeen>,
    },
    /// Set the pod's Ready condition to False (its node is dead, the readiness is stale), if it
    /// is still the object with this UID.
    MarkPodNotReady {
        pod: ObjectKey,
        uid: String,
        node: String,
        policy: String,
    },
    /// Force-delete (grace 0) the pod with this UID (UID precondition), and, for a pod podha
    /// marked NotReady that the watch does not show so yet, only in the version the mark
    /// produced (resourceVersion precondition).
    ForceDeletePod {
        pod: ObjectKey,
        uid: String,
        node: String,
        policy: String,
        owner_kind: String,
        resource_version: Option<String>,
    },
    /// Remove the taints podha added (the node is back and holds no volume).
    RemoveTaint { node: String },
    /// Ask the node's podha agent to fence the node (policy proof `Agent`): an annotation on
    /// the Node the agent answers with its acknowledgement.
    RequestFence {
        node: String,
        policy: String,
        /// The node's Lease `renewTime` as podha saw it when it planned this: read again right
        /// before the request goes out, a Lease that says otherwise (the kubelet renewed since,
        /// unseen by a watch that lags) stops it.
        lease_seen: Option<k8s_openapi::jiff::Timestamp>,
    },
    /// Ask the node's BMC to force the machine off (`ComputerSystem.Reset` `ForceOff`, proof
    /// `BMC`), through the Secret `secret` in podha's namespace.
    PowerOff {
        node: String,
        policy: String,
        secret: String,
        /// The UUID the system must report (`fencing.bmc.matchSystemUUID`).
        system_uuid: Option<String>,
        /// The node's Lease `renewTime` as podha saw it when it planned this: read again right
        /// before the `ForceOff`, a Lease that says otherwise (the kubelet renewed since, the
        /// node is back) stops it.
        lease_seen: Option<k8s_openapi::jiff::Timestamp>,
    },
    /// Read the node's `PowerState` from its BMC, after it accepted the `ForceOff`: the proof
    /// once it says `Off`.
    ConfirmPowerOff {
        node: String,
        policy: String,
        secret: String,
        /// The UUID the system must report (`fencing.bmc.matchSystemUUID`).
        system_uuid: Option<String>,
    },
    /// Power the machine on again through its BMC once its failover is done
    /// (`fencing.bmc.powerCycle`).
    PowerOn {
        node: String,
        policy: String,
        secret: String,
        /// The UUID the system must report (`fencing.bmc.matchSystemUUID`).
        system_uuid: Option<String>,
    },
    /// Take podha's fence request off a node whose failure is over (no open incident, judged
    /// Healthy): an agent that never saw it must not carry it out later.
    WithdrawFenceRequest { node: String },
    /// An action podha chose not to take, and why.
    Hold {
        policy: String,
        node: Option<String>,
        reason: HoldReason,
    },
}

/// The `resourceVersion` of a node's agent Lease as podha's view held it when it planned an
/// action that rests on the Lease's word (`None`: the view held none). A leadership term that
/// never heard an agent counts its silence only through that word, and only while it sees no
/// renewal of the Lease in the term; a watch of the Leases that stalls or lags would show
/// neither a renewal nor the word taken back (a hold), and the silence of an agent that runs
/// would count. A read straight from the API server that finds this same version shows the
/// view was whole when the action went out; any other (or none, or no Lease) stops the action
/// until the view catches up and the planner decides again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentLeaseSeen {
    pub resource_version: Option<String>,
}

impl AgentLeaseSeen {
    /// Whether a Lease read now, of version `read` (`None`: no Lease), is the one seen.
    pub fn matches(&self, read: Option<&str>) -> bool {
        self.resource_version.is_some() && self.resource_version.as_deref() == read
    }
}

/// Why an action is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// More watched nodes are unhealthy (Failed, Suspect, or failed within
    /// `safety.unhealthyWindow`) than `safety.maxUnhealthy` allows.
    TooManyUnhealthy {
        failed: usize,
        watched: usize,
        max: usize,
    },
    /// `dryRun` is set; this is what would have been done.
    DryRun { would: Box<Intent> },
    /// A node failed, but so many other watched nodes have not renewed their Lease since that a
    /// partition cannot be ruled out.
    Unconfirmed { unheard: usize, watched: usize },
    /// The node is judged dead, but its kubelet renewed its Lease `renewed_ago` ago, within a
    /// renew interval and [`super::holds::RENEWAL_SLACK`]: it still talks to the API server,
    /// and podha's own path to it may be what failed (a firewall, a NetworkPolicy, a switch
    /// between podha and a rack). No fence is asked for and nothing moves until the Lease
    /// misses a renewal.
    LeaseRenewing { renewed_ago: std::time::Duration },
    /// The out-of-service taint would remove `pod`, which must stay (`why`); the node gets the
    /// scheduling fence instead and only the eligible pods are deleted.
    OutOfServiceRefused { pod: ObjectKey, why: &'static str },
    /// The policy's `fencing.proof` is not on the node yet: nothing is tainted or deleted there.
    FencingPending { proof: Proofs },
    /// `fencing.proof: Agent`, and the node's agent is silent, but its silence proves no fence
    /// (`why`): only its acknowledgement of this incident's fence request can.
    AgentSilenceUnproven { why: SilenceDoubt },
    /// The node's fence was acknowledged (`podha.io/fence-ack`), but its kubelet renewed its
    /// Lease `renewals` times since, in the same boot: the fence did not take. podha takes no
    /// further action on the node.
    FenceContradicted { renewals: u32 },
    /// A policy that comes before this one by name cannot be read: it may select the same
    /// nodes and pods, so this one holds every action.
    PolicyUnreadable { unreadable: String },
    /// podha fenced the node (action `DeletePods` then) and the policy now wants the
    /// out-of-service taint, which waits for `fencing.proof`: the moved pods' volumes detach
    /// after the attach/detach controller's 6-minute wait until it comes.
    UpgradeAwaitsProof { proof: Proofs },
    /// The policy (`spec.paused`) or the node (annotation `podha.io/paused`, `by_node`) is
    /// paused for maintenance: no new action on the node.
    Paused { by_node: bool },
}

impl HoldReason {
    pub const fn kind(&self) -> HoldKind {
        match self {
            Self::TooManyUnhealthy { .. } => HoldKind::TooManyUnhealthy,
            Self::DryRun { .. } => HoldKind::DryRun,
            Self::Unconfirmed { .. } => HoldKind::Unconfirmed,
            Self::LeaseRenewing { .. } => HoldKind::LeaseRenewing,
            Self::OutOfServiceRefused { .. } => HoldKind::OutOfServiceRefused,
            Self::FencingPending { .. } => HoldKind::FencingPending,
            Self::AgentSilenceUnproven { .. } => HoldKind::AgentSilenceUnproven,
            Self::FenceContradicted { .. } => HoldKind::FenceContradicted,
            Self::PolicyUnreadable { .. } => HoldKind::PolicyUnreadable,
            Self::Paused { .. } => HoldKind::Paused,
            Self::UpgradeAwaitsProof { .. } => HoldKind::UpgradeAwaitsProof,
        }
    }

    /// Label value for `podha_actions_held_total{reason}`.
    pub const fn as_str(&self) -> &'static str {
        self.kind().as_str()
    }
    /// What a hold is about, to tell two holds of one reason apart: the action a dry run
    /// rehearses, the pod a refused taint would remove, why an agent's silence proves nothing.
    pub fn subject(&self) -> String {
        match self {
            Self::DryRun { would } => would.key(),
            Self::OutOfServiceRefused { pod, .. } => pod.to_string(),
            Self::AgentSilenceUnproven { why } => why.as_str().to_string(),
            Self::PolicyUnreadable { unreadable } => unreadable.clone(),
            Self::TooManyUnhealthy { .. }
            | Self::Unconfirmed { .. }
            | Self::LeaseRenewing { .. }
            | Self::FencingPending { .. }
            | Self::FenceContradicted { .. }
            | Self::Paused { .. }
            | Self::UpgradeAwaitsProof { .. } => String::new(),
        }
    }

    /// The hold in words, for its events and the incident's status.
    pub fn note(&self, node: Option<&str>) -> String {
        let node = node.unwrap_or("?");
        match self {
            Self::TooManyUnhealthy {
                failed,
                watched,
                max,
            } => format!(
                "holding every action: {failed} of {watched} watched nodes failed, more than \
                 safety.maxUnhealthy allows ({max})"
            ),
            Self::DryRun { would } => format!("dry run: would {}", would.describe()),
            Self::Unconfirmed { unheard, watched } => format!(
                "holding: {unheard} of {watched} watched nodes have not renewed their Lease since \
                 node {node} went silent, so a partition cannot be told from one dead node"
            ),
            Self::LeaseRenewing { renewed_ago } => format!(
                "node {node} is judged dead, but its kubelet renewed its Lease {}s ago: it still \
                 reaches the API server, and podha's own path to it may be what failed (a \
                 firewall, a NetworkPolicy, a switch between podha and the node); no fence is \
                 asked for and nothing moves there until the Lease misses a renewal",
                renewed_ago.as_secs()
            ),
            Self::OutOfServiceRefused { pod, why } => format!(
                "out-of-service taint refused on node {node}: it would remove pod {pod}, which \
                 must stay ({why}); fencing the node for the scheduler and deleting only the \
                 eligible pods, whose volumes detach after the attach/detach controller's \
                 6-minute wait"
            ),
            Self::FencingPending { proof } => format!(
                "node {node} is judged dead, but fencing.proof {proof} is not on it: nothing is \
                 tainted or deleted there until it is (a node that could still run keeps its \
                 volumes)"
            ),
            Self::PolicyUnreadable { unreadable } => format!(
                "holding every action: policy {unreadable} cannot be read (see its status) and \
                 comes first by name, so it may select the same nodes and pods and podha does not \
                 know what it would decide"
            ),
            Self::AgentSilenceUnproven { why } => format!(
                "node {node} is judged dead and its agent is silent, but the silence proves no \
                 fence: {}; nothing is tainted or deleted there until the agent acknowledges \
                 podha's fence request (podha.io/fence-ack) or its silence counts",
                why.describe(node)
            ),
            Self::UpgradeAwaitsProof { proof } => format!(
                "node {node} keeps podha's scheduling fence: the out-of-service taint that would \
                 detach the moved pods' volumes at once waits for fencing.proof {proof}; until it \
                 comes they detach after the attach/detach controller's 6-minute wait"
            ),
            Self::Paused { by_node } => format!(
                "node {node} is judged dead, but {}: podha takes no new action there until the \
                 pause ends (a failover already acting finishes what it started)",
                if *by_node {
                    "the node is paused for maintenance (annotation podha.io/paused)"
                } else {
                    "its policy is paused (spec.paused)"
                }
            ),
            Self::FenceContradicted { renewals } => format!(
                "node {node} acknowledged its fence (podha.io/fence-ack), but its kubelet \
                 renewed its Lease {renewals} times since, without a reboot: the fence did not \
                 take, and the node may still write to its volumes. podha takes no further \
                 action there; fence the node by hand, check the fence and its confirmation \
                 (--fence-confirm), and check the pods podha already moved"
            ),
        }
    }

    /// Whether the hold waits for the proof that the node is fenced (nothing is done on the
    /// node until it is there).
    pub const fn awaits_proof(&self) -> bool {
        matches!(
            self,
            Self::FencingPending { .. }
                | Self::AgentSilenceUnproven { .. }
                | Self::FenceContradicted { .. }
        )
    }

    /// The reason of the hold's event on its node, for the holds a node's owner must see.
    pub const fn node_event_reason(&self) -> Option<&'static str> {
        match self {
            Self::OutOfServiceRefused { .. } => Some("OutOfServiceTaintRefused"),
            Self::LeaseRenewing { .. } => Some("NodeLeaseRenewing"),
            Self::FencingPending { .. } => Some("FencingPending"),
            Self::AgentSilenceUnproven { .. } => Some("AgentSilenceUnproven"),
            Self::FenceContradicted { .. } => Some("FenceContradicted"),
            Self::Paused { .. } => Some("ActionsPaused"),
            Self::UpgradeAwaitsProof { .. } => Some("FencingPending"),
            _ => None,
        }
    }

    /// The reason of the hold's event on its policy.
    pub const fn policy_event_reason(&self) -> &'static str {
        match self {
            Self::DryRun { .. } => "DryRun",
            Self::TooManyUnhealthy { .. }
            | Self::Unconfirmed { .. }
            | Self::PolicyUnreadable { .. } => "ActionsHeld",
            Self::LeaseRenewing { .. } => "NodeLeaseRenewing",
            Self::OutOfServiceRefused { .. } => "OutOfServiceTaintRefused",
            Self::FencingPending { .. } => "FencingPending",
            Self::AgentSilenceUnproven { .. } => "AgentSilenceUnproven",
            Self::FenceContradicted { .. } => "FenceContradicted",
            Self::Paused { .. } => "ActionsPaused",
            Self::UpgradeAwaitsProof { .. } => "FencingPending",
        }
    }
}

impl Intent {
    /// The node an intent is about (`None` for a policy-wide hold).
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::MarkPodNotReady { node, .. }
            | Self::ForceDeletePod { node, .. }
            | Self::TaintNode { node, .. }
            | Self::RequestFence { node, .. }
            | Self::PowerOff { node, .. }
            | Self::ConfirmPowerOff { node, .. }
            | Self::PowerOn { node, .. }
            | Self::RemoveTaint { node }
            | Self::WithdrawFenceRequest { node } => Some(node),
            Self::Hold { node, .. } => node.as_deref(),
        }
    }

    /// The policy an intent is taken for (`None` for an untaint: its policy is the one named
    /// by podha's marker on the node; nor for a withdrawal, whose incident is over).
    pub fn policy(&self) -> Option<&str> {
        match self {
            Self::ForceDeletePod { policy, .. }
            | Self::MarkPodNotReady { policy, .. }
            | Self::TaintNode { policy, .. }
            | Self::RequestFence { policy, .. }
            | Self::PowerOff { policy, .. }
            | Self::ConfirmPowerOff { policy, .. }
            | Self::PowerOn { policy, .. }
            | Self::Hold { policy, .. } => Some(policy),
            Self::RemoveTaint { .. } | Self::WithdrawFenceRequest { .. } => None,
        }
    }

    /// Identifies the action among those in flight or waiting for a retry: one per pod and
    /// action, one per node and taint operation, one per hold.
    pub fn key(&self) -> String {
        match self {
            Self::MarkPodNotReady { uid, .. } => format!("mark/{uid}"),
            Self::ForceDeletePod { uid, .. } => format!("delete/{uid}"),
            Self::TaintNode { node, .. } => taint_key(node),
            Self::RemoveTaint { node } => format!("untaint/{node}"),
            Self::RequestFence { node, .. } => format!("fence/{node}"),
            Self::PowerOff { node, .. } => format!("power-off/{node}"),
            Self::ConfirmPowerOff { node, .. } => format!("powered-off/{node}"),
            Self::PowerOn { node, .. } => format!("power-on/{node}"),
            Self::WithdrawFenceRequest { node } => format!("unfence/{node}"),
            Self::Hold {
                policy,
                node,
                reason,
            } => format!(
                "hold/{policy}/{}/{}",
                node.as_deref().unwrap_or(""),
                reason.as_str()
            ),
        }
    }

    /// The action in words, for events ("dry run: would …").
    pub fn describe(&self) -> String {
        match self {
            Self::MarkPodNotReady { pod, node, .. } => {
                format!("mark pod {pod} on dead node {node} NotReady, then force-delete it")
            }
            Self::ForceDeletePod { pod, node, .. } => {
                format!("force-delete pod {pod} on dead node {node}")
            }
            Self::TaintNode { node, taint, .. } => {
                format!("taint node {node} {}:{}", taint.key(), taint.effect())
            }
            Self::RemoveTaint { node } => {
                format!("remove the out-of-service taint from node {node}")
            }
            Self::RequestFence { node, .. } => {
                format!("ask for a fence of node {node} (podha.io/fence-request)")
            }
            Self::PowerOff { node, secret, .. } => {
                format!("power node {node} off through its BMC (Secret {secret})")
            }
            Self::ConfirmPowerOff { node, secret, .. } => {
                format!("read the power state of node {node} from its BMC (Secret {secret})")
            }
            Self::PowerOn { node, secret, .. } => {
                format!("power node {node} on again through its BMC (Secret {secret})")
            }
            Self::WithdrawFenceRequest { node } => {
                format!("withdraw the fence request of node {node} (podha.io/fence-request)")
            }
            Self::Hold { .. } => "hold".to_string(),
        }
    }

    /// An action on a node's BMC.
    pub const fn is_power(&self) -> bool {
        matches!(
            self,
            Self::PowerOff { .. } | Self::ConfirmPowerOff { .. } | Self::PowerOn { .. }
        )
    }

    /// Whether the result of this action can let the planner go on with the node at once: a
    /// pod is deleted once its node's taint is on and its mark has landed, the taint follows a
    /// BMC's `Off`, and the first read of the power state follows its `ForceOff`.
    pub const fn unblocks_deletes(&self) -> bool {
        matches!(
            self,
            Self::TaintNode { .. }
                | Self::MarkPodNotReady { .. }
                | Self::PowerOff { .. }
                | Self::ConfirmPowerOff { .. }
        )
    }
}

/// A [`HoldReason`] without its details: every counter of a policy's holds is exported at 0
/// before it counts, so the reasons must be listable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HoldKind {
    TooManyUnhealthy,
    DryRun,
    Unconfirmed,
    LeaseRenewing,
    OutOfServiceRefused,
    FencingPending,
    AgentSilenceUnproven,
    FenceContradicted,
    PolicyUnreadable,
    Paused,
    UpgradeAwaitsProof,
}

impl HoldKind {
    pub const ALL: [HoldKind; 11] = [
        HoldKind::TooManyUnhealthy,
        HoldKind::DryRun,
        HoldKind::Unconfirmed,
        HoldKind::LeaseRenewing,
        HoldKind::OutOfServiceRefused,
        HoldKind::FencingPending,
        HoldKind::AgentSilenceUnproven,
        HoldKind::FenceContradicted,
        HoldKind::PolicyUnreadable,
        HoldKind::Paused,
        HoldKind::UpgradeAwaitsProof,
    ];

    /// Label value for `podha_actions_held_total{reason}`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TooManyUnhealthy => "TooManyUnhealthyNodes",
            Self::DryRun => "DryRun",
            Self::Unconfirmed => "NodesNotHeardFrom",
            Self::LeaseRenewing => "NodeLeaseRenewing",
            Self::OutOfServiceRefused => "OutOfServiceTaintRefused",
            Self::FencingPending => "FencingPending",
            Self::AgentSilenceUnproven => "AgentSilenceUnproven",
            Self::FenceContradicted => "FenceContradicted",
            Self::PolicyUnreadable => "PolicyUnreadable",
            Self::Paused => "Paused",
            Self::UpgradeAwaitsProof => "UpgradeAwaitsProof",
        }
    }
}

/// The key of a taint of `node` among the actions in flight ([`Intent::key`]).
pub fn taint_key(node: &str) -> String {
    format!("taint/{node}")
}
