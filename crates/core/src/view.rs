//! The plain, read-only view of the cluster that every decision reads. The runtime fills it from
//! its reflector stores; tests fill it from builders. It holds no client and does no IO.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use tokio::time::Instant;

use crate::api::OwnerKind;

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Everything the decisions need to know about the cluster at one moment.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Nodes by name.
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// Pods bound to a node (`spec.nodeName` set), grouped by node name.
    pub pods_by_node: BTreeMap<String, Vec<Arc<Pod>>>,
    /// PersistentVolumeClaims by namespace/name.
    pub pvcs: BTreeMap<ObjectKey, Arc<PersistentVolumeClaim>>,
    /// PersistentVolumes by name.
    pub pvs: BTreeMap<String, Arc<PersistentVolume>>,
    /// The controller kind owning each ReplicaSet (`None`: the ReplicaSet has no controller
    /// owner). Lets a Deployment's pods be recognised through their ReplicaSet.
    pub replica_set_owners: BTreeMap<ObjectKey, Option<OwnerKind>>,
    /// Namespace labels by namespace name, for `namespaceSelector`.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// VolumeAttachments grouped by `spec.nodeName`.
    pub attachments_by_node: BTreeMap<String, Vec<Arc<VolumeAttachment>>>,
    /// The agent Leases in podha's namespace (see [`crate::contract::agent_lease_name`]), by
    /// node: a node's agent counts only while its Lease is there.
    pub agent_adverts: BTreeMap<String, AgentAdvert>,
}

/// What podha saw of a node's agent Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentAdvert {
    /// The Lease's `renewTime` as last seen: a renewal is a change of it.
    pub renew_time: Option<MicroTime>,
    /// When podha last saw it renewed (or first saw it), on podha's own clock: the agent's
    /// clock may be off.
    pub renewed_seen: Instant,
    /// How long it lasts after a renewal (`leaseDurationSeconds`).
    pub lasts: Duration,
    /// The boot in which the agent says podha heard it
    /// ([`crate::contract::AGENT_HEARD_IN_BOOT_ANNOTATION`]), if it says so.
    pub heard_in_boot: Option<String>,
    /// Whether the agent heeds `hold` in podha's heartbeat
    /// ([`crate::contract::AGENT_HEEDS_HOLD_ANNOTATION`]): only then is it told.
    pub heeds_hold: bool,
    /// Whether the agent heeds the leadership term in podha's heartbeat
    /// ([`crate::contract::AGENT_HEEDS_TERM_ANNOTATION`]): only then is it told.
    pub heeds_term: bool,
    /// Whether the agent heeds `renewals` in podha's heartbeat
    /// ([`crate::contract::AGENT_HEEDS_RENEWALS_ANNOTATION`]): only then is it told that podha
    /// counts its silence from its renewals.
    pub heeds_renewals: bool,
    /// What the agent says of an unreachable peer set
    /// ([`crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION`]: `"answered/asked"` of its
    /// last reach check), if it says it cannot reach half of its peers: podha holds its node.
    pub peers_unreachable: Option<String>,
    /// Whether this process has seen the Lease renewed (not only found it, as a process that
    /// just started finds every Lease "renewed" when it first lists them).
    pub renewal_observed: bool,
    /// The Lease's `resourceVersion` as last seen: a proof resting on the agent's silence moves
    /// nothing until a read straight from the API server finds this same version (see
    /// `Intent::TaintNode`'s `agent_lease_seen`).
    pub resource_version: Option<String>,
}

impl View {
    /// Pods bound to `node` (empty when none).
    pub fn pods_on(&self, node: &str) -> &[Arc<Pod>] {
        self.pods_by_node
            .get(node)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// VolumeAttachments whose `spec.nodeName` is `node`.
    pub fn attachments_on(&self, node: &str) -> &[Arc<VolumeAttachment>] {
        self.attachments_by_node
            .get(node)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub fn pvc(&self, namespace: &str, name: &str) -> Option<&PersistentVolumeClaim> {
        self.pvcs
            .get(&ObjectKey::new(namespace, name))
            .map(Arc::as_ref)
    }

    pub fn pv(&self, name: &str) -> Option<&PersistentVolume> {
        self.pvs.get(name).map(Arc::as_ref)
    }
}

/// The watches that fill the view: one per kind of object podha reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Watch {
    Policy,
    Node,
    Lease,
    Pod,
    Pvc,
    Pv,
    Va,
    ReplicaSet,
    Namespace,
    AgentLease,
}

impl Watch {
    pub const ALL: [Watch; 10] = [
        Watch::Policy,
        Watch::Node,
        Watch::Lease,
        Watch::Pod,
        Watch::Pvc,
        Watch::Pv,
        Watch::Va,
        Watch::ReplicaSet,
        Watch::Namespace,
        Watch::AgentLease,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "podhapolicies",
            Self::Node => "nodes",
            Self::Lease => "leases",
            Self::Pod => "pods",
            Self::Pvc => "persistentvolumeclaims",
            Self::Pv => "persistentvolumes",
            Self::Va => "volumeattachments",
            Self::ReplicaSet => "replicasets",
            Self::Namespace => "namespaces",
            Self::AgentLease => "agentleases",
        }
    }

    /// Watches podha must have listed once before it judges or acts. Not the agents' Leases:
    /// without them every agent's silence is held (`NoAdvert`), never proven, so a missing
    /// right to list them (RBAC written by hand, from before they existed) must not stop every
    /// policy; its failures show in `podha_watch_restarts_total{resource="agentleases"}`.
    pub const fn gates_sync(self) -> bool {
        !matches!(self, Self::AgentLease)
    }

    /// Watches whose changes may change which pods podha would fail over (node Leases feed
    /// the health judgement, VolumeAttachments the failovers under way: neither is read).
    pub const fn feeds_coverage(self) -> bool {
        !matches!(self, Self::Lease | Self::Va)
    }

    /// Watches whose silence could look like a dead node.
    pub const fn feeds_detection(self) -> bool {
        matches!(self, Self::Node | Self::Lease)
    }
}
