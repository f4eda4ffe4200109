//! Which pods on a failed node podha may delete, and whether a healthy node could take them.
//! Every refusal has a reason (`podha_pods_skipped_total{reason}`).
//!
//! One file per concern:
//! - `owners.rs`: controller owner and the `podha.io/failover` annotation. **A pod with no
//!   controller owner is never deleted** — that rule lives there.
//! - `volumes.rs`: claims → PersistentVolumes → CSI driver and access mode.
//! - `target.rs`: could a healthy node run the pod (scheduling predicates), using
//!   `node_affinity.rs` and `resources.rs` (which reads quantities with `quantity.rs`).
//! - `tolerations.rs`: a pod that tolerates podha's fence would come straight back.
//! - `selectors.rs`: the policy's node, namespace and pod selectors.
//!
//! Everything here is pure: it reads a [`View`] and decides.

mod node_affinity;
mod owners;
mod quantity;
mod resources;
mod selectors;
mod target;
mod tolerations;
mod volumes;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::api::PodHAPolicySpec;
use crate::view::View;

pub(crate) use owners::check_owner;
pub use owners::{OwnerMatch, controller_ref, counted_kind, opted_out, replica_set_controller};
pub(crate) use selectors::selects;
pub use selectors::{invalid_selectors, node_selected, pod_selected};
pub use target::find_target;
pub use tolerations::{spared_by_out_of_service, tolerated_fence};
pub(crate) use volumes::bound_volume;
pub use volumes::claim_names;

/// Why a pod on a failed node is left alone. The label is a `podha_pods_skipped_total` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The pod has no controller owner reference: nothing would recreate it.
    NoControllerOwner,
    /// The pod's controller kind is not in the policy's `owners` (and it is not opted in), or
    /// is a ReplicaSet the view does not know yet.
    OwnerKindNotSelected,
    /// The pod carries `podha.io/failover: "false"` (or any value other than `"true"`).
    OptedOut,
    /// The pod mounts no PersistentVolumeClaim.
    NoPersistentVolumeClaim,
    /// A claim the pod mounts is missing or not bound to a PersistentVolume.
    ClaimNotBound,
    /// A claim is bound to a volume that is not a CSI volume.
    VolumeNotCsi,
    /// A claim is bound to a CSI volume of a driver the policy does not list.
    DriverNotSelected,
    /// A claim is bound to a volume whose access modes the policy does not list.
    AccessModeNotSelected,
    /// The pod tolerates the taint podha fences its node with: its replacement could be
    /// scheduled straight back onto the dead node.
    ToleratesFence,
    /// No healthy, schedulable node could run the pod (`safety.requireTarget`).
    NoTargetNode,
}

impl SkipReason {
    /// What the reason means for the pod, for a reader.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::NoControllerOwner => "no controller owner: nothing would recreate it",
            Self::OwnerKindNotSelected => {
                "its controller's kind is not in the policy's owners (opt the pod in with \
                 podha.io/failover: \"true\")"
            }
            Self::OptedOut => "podha.io/failover is set to something other than \"true\"",
            Self::NoPersistentVolumeClaim => {
                "it mounts no PersistentVolumeClaim: Kubernetes replaces it by itself"
            }
            Self::ClaimNotBound => "a claim is missing or not bound to a PersistentVolume",
            Self::VolumeNotCsi => "a claim is bound to a volume that is not a CSI volume",
            Self::DriverNotSelected => {
                "a volume's CSI driver is not in the policy's volumes.drivers"
            }
            Self::AccessModeNotSelected => {
                "a volume's access modes are not in the policy's volumes.accessModes"
            }
            Self::ToleratesFence => {
                "it tolerates the taint podha fences its node with: its replacement could land \
                 back on the dead node"
            }
            Self::NoTargetNode => {
                "no healthy, schedulable node could run it (safety.requireTarget)"
            }
        }
    }

    /// CamelCase label for metrics and events.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoControllerOwner => "NoControllerOwner",
            Self::OwnerKindNotSelected => "OwnerKindNotSelected",
            Self::OptedOut => "OptedOut",
            Self::NoPersistentVolumeClaim => "NoPersistentVolumeClaim",
            Self::ClaimNotBound => "ClaimNotBound",
            Self::VolumeNotCsi => "VolumeNotCsi",
            Self::DriverNotSelected => "DriverNotSelected",
            Self::AccessModeNotSelected => "AccessModeNotSelected",
            Self::ToleratesFence => "ToleratesFence",
            Self::NoTargetNode => "NoTargetNode",
        }
    }
}

/// A pod that may be force-deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eligible {
    /// The controller kind the pod is counted under, and whether its policy lists it
    /// (`OwnerMatch::label` is `podha_pods_deleted_total{owner_kind}`).
    pub owner: OwnerMatch,
}

/// May this pod, on a failed node, be force-deleted? `node_usable(node)` says whether podha
/// considers a node healthy (not failed or suspect); the target check uses it.
///
/// The policy's selectors are not consulted here (see [`pod_selected`], [`node_selected`]),
/// nor is readiness: on a node that podha judged dead, a pod's Ready=True is what the dead
/// kubelet last wrote; the planner first marks such pods NotReady (as the node lifecycle
/// controller would, later) and deletes them once they are not Ready ([`looks_alive`]).
/// Checks run in this order and the first refusal wins, so a pod is reported under the most
/// fundamental reason:
/// 1. `NoControllerOwner`, `OptedOut`, `OwnerKindNotSelected` (see `owners.rs`);
/// 2. `NoPersistentVolumeClaim`, then per claim `ClaimNotBound`, `VolumeNotCsi`,
///    `DriverNotSelected`, `AccessModeNotSelected` (see `volumes.rs`);
/// 3. `NoTargetNode`, only with `safety.requireTarget` (see `target.rs`);
/// 4. `ToleratesFence` (see `tolerations.rs`).
pub fn check_movable(
    spec: &PodHAPolicySpec,
    pod: &Pod,
    view: &View,
    node_usable: &dyn Fn(&Node) -> bool,
) -> Result<Eligible, SkipReason> {
    let owner = owners::check_owner(spec, pod, view)?;
    check_volumes_and_target(spec, pod, view, node_usable)?;
    Ok(Eligible { owner })
}

fn check_volumes_and_target(
    spec: &PodHAPolicySpec,
    pod: &Pod,
    view: &View,
    node_usable: &dyn Fn(&Node) -> bool,
) -> Result<(), SkipReason> {
    let pvs = volumes::check_volumes(spec, pod, view)?;
    if spec.safety.require_target
        && target::find_target_with(pod, &pvs, view, node_usable).is_none()
    {
        return Err(SkipReason::NoTargetNode);
    }
    tolerations::check_tolerations(spec, pod)
}

/// Ready and not terminating: the pod looks alive, whatever its node says.
pub fn looks_alive(pod: &Pod) -> bool {
    is_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// The pod's Ready condition is True.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests;
