//! What the tracker remembers about a pod podha moved off a dead node, and how it recognises
//! the pod that replaced it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use crate::eligibility::claim_names;
use crate::view::{ObjectKey, View};

/// The controller owner reference of a pod (`controller: true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerRef {
    /// The controller owner reference of `pod`, if it has one.
    pub fn controller_of(pod: &Pod) -> Option<Self> {
        pod.owner_references()
            .iter()
            .find(|r| r.controller == Some(true))
            .map(|r| Self {
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
            })
    }
}

/// The pod that took a moved pod's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub key: ObjectKey,
    pub uid: String,
    pub node: String,
}

/// A pod podha deleted from a dead node, as it was when deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedPod {
    pub key: ObjectKey,
    pub uid: String,
    /// The node the pod was bound to.
    pub node: String,
    pub controller: Option<OwnerRef>,
    /// Names of the `persistentVolumeClaim` volumes, sorted. These carry the data across pods,
    /// so the replacement must mount exactly these. Generic ephemeral claims are left out: they
    /// belong to one pod, and a replacement gets new ones.
    pub claims: Vec<String>,
    /// The PersistentVolumes behind every claim, ephemeral ones included, sorted: the volumes
    /// that must leave the dead node. A claim not resolvable at deletion time adds nothing.
    pub pvs: Vec<String>,
    /// Some VolumeAttachment on the pod's node carried one of `pvs` when the pod was deleted.
    /// When none did (a CSI driver with `attachRequired: false`, or a volume already
    /// force-detached), no attachment is required of the replacement either: waiting for one
    /// would never end.
    pub needs_attach: bool,
    /// For a pod without persistent claims only: UIDs of the Ready pods of the same controller
    /// on other nodes when it was deleted. Nothing else tells an old sibling from the
    /// replacement, so these never count as replacements.
    pub peers_at_move: BTreeSet<String>,
    /// Set when the failover is recovered.
    pub replaced_by: Option<Replacement>,
}

impl MovedPod {
    /// Snapshots `pod` as it is in `view` just before (or when) podha deletes it.
    pub fn from_pod(pod: &Pod, view: &View) -> Self {
        let namespace = pod.namespace().unwrap_or_default();
        let node = node_of(pod).unwrap_or_default().to_string();
        let controller = OwnerRef::controller_of(pod);
        let claims = persistent_claims(pod);
        let pvs: Vec<String> = claim_names(pod)
            .iter()
            .filter_map(|claim| claim_volume(view, &namespace, claim))
            .map(str::to_string)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let needs_attach = view
            .attachments_on(&node)
            .iter()
            .filter_map(|va| va_volume(va))
            .any(|pv| pvs.iter().any(|p| p == pv));
        let peers_at_move = match (&controller, claims.is_empty()) {
            (Some(owner), true) => all_pods(view)
                .filter(|p| {
                    p.namespace().as_deref() == Some(namespace.as_str())
                        && node_of(p) != Some(node.as_str())
                        && OwnerRef::controller_of(p).is_some_and(|o| o.uid == owner.uid)
                        && is_running_ready(p)
                })
                .filter_map(|p| p.metadata.uid.clone())
                .collect(),
            _ => BTreeSet::new(),
        };
        Self {
            key: ObjectKey::new(namespace, pod.name_any()),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node,
            controller,
            claims,
            pvs,
            needs_attach,
            peers_at_move,
            replaced_by: None,
        }
    }

    /// Whether `pod`, a pod of the same namespace, replaces this one: another pod of the same
    /// controller, on a node other than the dead one, mounting the same persistent claims,
    /// Running and Ready, and (when `needs_attach`) with every volume attached on its node.
    pub(super) fn replaced_by(&self, pod: &Pod, view: &View) -> bool {
        let Some(node) = node_of(pod) else {
            return false;
        };
        let namespace = &self.key.namespace;
        pod.metadata.uid.as_deref() != Some(self.uid.as_str())
            && node != self.node
            && self.same_controller(pod)
            && persistent_claims(pod) == self.claims
            && !(self.claims.is_empty()
                && pod
                    .metadata
                    .uid
                    .as_ref()
                    .is_some_and(|uid| self.peers_at_move.contains(uid)))
            && is_running_ready(pod)
            && (!self.needs_attach || volumes_attached(pod, namespace, node, view))
    }

    /// Same controller UID. A StatefulSet deleted and recreated (orphaning its pods) gets a new
    /// UID but the same name and adopts the same claims, so for StatefulSets the same kind,
    /// controller name and pod name count as the same controller too.
    fn same_controller(&self, pod: &Pod) -> bool {
        let theirs = OwnerRef::controller_of(pod);
        match (&self.controller, theirs) {
            (Some(ours), Some(theirs)) => {
                if ours.kind == "StatefulSet" {
                    pod.name_any() == self.key.name
                        && (ours.uid == theirs.uid
                            || (theirs.kind == ours.kind && theirs.name == ours.name))
                } else {
                    ours.uid == theirs.uid
                }
            }
            // podha never deletes a pod without a controller; should one be tracked anyway,
            // only a pod of the same name can stand for it.
            (None, None) => pod.name_any() == self.key.name,
            _ => false,
        }
    }
}

/// Every claim of the pod resolves to a volume with an attached VolumeAttachment on `node`.
fn volumes_attached(pod: &Pod, namespace: &str, node: &str, view: &View) -> bool {
    let attachments = view.attachments_on(node);
    claim_names(pod).iter().all(|claim| {
        claim_volume(view, namespace, claim).is_some_and(|pv| {
            attachments
                .iter()
                .any(|va| va_volume(va) == Some(pv) && is_attached(va))
        })
    })
}

/// Sorted names of the pod's `persistentVolumeClaim` volumes.
fn persistent_claims(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The volume a claim names (`spec.volumeName`). Not required to be `Bound`: a claim that went
/// `Lost` still has its volume attached somewhere.
fn claim_volume<'v>(view: &'v View, namespace: &str, claim: &str) -> Option<&'v str> {
    view.pvc(namespace, claim)?
        .spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// The PersistentVolume a VolumeAttachment attaches; `None` for an inline volume spec.
pub(super) fn va_volume(va: &VolumeAttachment) -> Option<&str> {
    va.spec.source.persistent_volume_name.as_deref()
}

fn is_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

pub(super) fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// Phase Running, Ready True, not terminating.
fn is_running_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

pub(super) fn all_pods(view: &View) -> impl Iterator<Item = &Pod> {
    view.pods_by_node.values().flatten().map(AsRef::as_ref)
}
