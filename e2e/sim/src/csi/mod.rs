//! sim-csi: a CSI driver that lives only in the API server.
//!
//! There is no storage and no CSI gRPC socket. sim-csi plays the Kubernetes-facing roles that a
//! real driver's sidecars and the kubelet play, writing the same objects and fields they write,
//! so that the real kube-controller-manager (PV binder, attach/detach controller) and scheduler
//! see an ordinary attachable CSI driver.
//!
//! # Interface (used by `cluster`)
//!
//! - [`RWO_DRIVER`], [`OTHER_DRIVER`]: the two driver names, so driver scoping can be tested.
//! - [`cluster_objects`]: `CSIDriver` objects (attachRequired) and the StorageClasses
//!   [`RWO_STORAGE_CLASS`] (`sim-rwo`) and [`OTHER_STORAGE_CLASS`] (`sim-other`). The caller
//!   applies them once; nothing here creates them.
//! - [`run_controller`] with a [`ControllerConfig`]: one process per cluster; the provisioner and
//!   the external-attacher for both drivers. Runs until an error.
//! - [`run_node_agent`]: one process per node, started and killed with that node's kwok (it is
//!   the storage half of the fake kubelet). Runs until an error.
//! - [`VOLUMES_READY_ANNOTATION`]: the node agent sets it to `"true"` on a pod once every CSI
//!   volume of the pod is attached to the pod's node; kwok's pod stage must start only pods that
//!   carry it (this stands in for the kubelet's "wait for attach + mount").
//!
//! # What each part does, and which real component it imitates
//!
//! - `provisioner` (external-provisioner): a PVC of a sim StorageClass without `volumeName` gets
//!   a PV `pvc-<pvc uid>` pre-bound through `claimRef`; the KCM's PV controller binds the pair.
//!   A `Released` PV with reclaim policy `Delete` that sim-csi provisioned is deleted.
//! - `attacher` (external-attacher): a VolumeAttachment of a sim driver gets the finalizer
//!   `external-attacher/<sanitized driver>` (also on its PV) and the annotation
//!   `csi.alpha.kubernetes.io/node-id`, then `status.attached=true` after `attach_delay`.
//!   Attaching needs the node's CSINode to list the driver, as the real one does. A deleted VA is
//!   marked detached and loses the finalizer after `detach_delay`, whether or not its node is
//!   alive (ControllerUnpublish is a storage-backend call). The PV finalizer is removed once the
//!   PV is being deleted and no VA refers to it.
//! - `node_agent` (kubelet): annotates the Node with
//!   `volumes.kubernetes.io/controller-managed-attach-detach` (without it the attach/detach
//!   controller ignores the node) and `csi.volume.kubernetes.io/nodeid`, registers both drivers
//!   in the node's CSINode, keeps `node.status.volumesInUse` equal to the CSI volumes of the
//!   non-terminal pods bound to the node, and sets [`VOLUMES_READY_ANNOTATION`]. When the agent
//!   is killed, `volumesInUse` freezes, which is what makes the attach/detach controller wait
//!   six minutes before it force-detaches from a dead node.
//!
//! Decisions are pure functions (`plan_*`, `desired_*`) over objects; the `run` functions around
//! them only watch (kube-runtime reflectors and controllers) and write.

mod attacher;
mod node_agent;
mod provisioner;

use std::time::Duration;

use serde_json::json;

/// Driver whose volumes podha is meant to fail over (tests use it with RWO/RWOP claims).
pub const RWO_DRIVER: &str = "rwo.sim.podha.io";
/// A second driver, so that `volumes.drivers` scoping can be tested.
pub const OTHER_DRIVER: &str = "other.sim.podha.io";
/// Both drivers served by sim-csi.
pub const DRIVERS: [&str; 2] = [RWO_DRIVER, OTHER_DRIVER];
/// StorageClass provisioned by [`RWO_DRIVER`].
pub const RWO_STORAGE_CLASS: &str = "sim-rwo";
/// StorageClass provisioned by [`OTHER_DRIVER`].
pub const OTHER_STORAGE_CLASS: &str = "sim-other";
/// Pod annotation set (value `"true"`) by the node agent once the pod's volumes are attached to
/// its node; kwok's pod stage starts only pods carrying it.
pub const VOLUMES_READY_ANNOTATION: &str = "sim.podha.io/volumes-ready";

/// Annotation on PVs naming the provisioner that created them (set by external-provisioner,
/// read by the PV controller).
pub(crate) const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";

/// Timing of the simulated storage backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Time from first seeing a VolumeAttachment to reporting it attached (ControllerPublish).
    pub attach_delay: Duration,
    /// Time from first seeing a VolumeAttachment's deletion to removing its finalizer
    /// (ControllerUnpublish).
    pub detach_delay: Duration,
}

/// Whether `driver` is one of the drivers sim-csi serves.
pub fn is_sim_driver(driver: &str) -> bool {
    DRIVERS.contains(&driver)
}

/// The external-attacher's finalizer for `driver`, on VolumeAttachments and PersistentVolumes:
/// `external-attacher/` + the driver name with every character outside `[a-zA-Z0-9-]` replaced by
/// `-` (and an `X` appended if that leaves a trailing `-`).
pub fn attacher_finalizer(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.ends_with('-') {
        name.push('X');
    }
    format!("external-attacher/{name}")
}

/// The name the kubelet and the attach/detach controller give a CSI volume in
/// `node.status.volumesInUse` and `node.status.volumesAttached`.
pub fn unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{volume_handle}")
}

/// The cluster-scoped objects sim-csi needs: a `CSIDriver` per driver (attachRequired, so the
/// attach/detach controller creates VolumeAttachments; no pod info on mount) and the
/// StorageClasses `sim-rwo` and `sim-other` (reclaim `Delete`, binding mode `Immediate`).
pub fn cluster_objects() -> Vec<serde_json::Value> {
    let labels = json!({ "app.kubernetes.io/managed-by": "podha-sim" });
    let drivers = DRIVERS.iter().map(|driver| {
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": { "name": driver, "labels": labels },
            "spec": {
                "attachRequired": true,
                "podInfoOnMount": false,
                "volumeLifecycleModes": ["Persistent"],
            },
        })
    });
    let classes = [
        (RWO_STORAGE_CLASS, RWO_DRIVER),
        (OTHER_STORAGE_CLASS, OTHER_DRIVER),
    ]
    .into_iter()
    .map(|(class, driver)| {
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": { "name": class, "labels": labels },
            "provisioner": driver,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": false,
        })
    });
    drivers.chain(classes).collect()
}

/// Runs the provisioner and the external-attacher for both drivers. Returns only on error
/// (including one of its watch loops ending).
pub async fn run_controller(client: kube::Client, cfg: ControllerConfig) -> anyhow::Result<()> {
    tokio::select! {
        res = provisioner::run(client.clone()) => res.and(Err(anyhow::anyhow!("provisioner stopped"))),
        res = attacher::run(client, cfg) => res.and(Err(anyhow::anyhow!("attacher stopped"))),
    }
}

/// Runs the node agent of `node`. Returns only on error.
pub async fn run_node_agent(client: kube::Client, node: String) -> anyhow::Result<()> {
    node_agent::run(client, node).await
}

/// Errors of the watch loops' writes and reads.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// True for a 409 Conflict from a write with a stale resourceVersion.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 409 && status.reason == "Conflict")
    }
}

/// True when a Kubernetes API error is "not found" (the object is already gone).
pub(crate) fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// True when a Kubernetes API error is "already exists".
pub(crate) fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    /// A timestamp for `deletionTimestamp` in fixtures; only its presence matters.
    pub(crate) fn epoch() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn finalizer_names_match_external_attacher() {
        assert_eq!(
            attacher_finalizer(RWO_DRIVER),
            "external-attacher/rwo-sim-podha-io"
        );
        assert_eq!(
            attacher_finalizer(OTHER_DRIVER),
            "external-attacher/other-sim-podha-io"
        );
        assert_eq!(attacher_finalizer("a.b/"), "external-attacher/a-b-X");
    }

    #[test]
    fn unique_volume_name_has_csi_plugin_prefix() {
        assert_eq!(
            unique_volume_name(RWO_DRIVER, "h1"),
            "kubernetes.io/csi/rwo.sim.podha.io^h1"
        );
    }

    #[test]
    fn cluster_objects_declare_attachable_drivers_and_immediate_classes() {
        let objs = cluster_objects();
        let drivers: Vec<_> = objs.iter().filter(|o| o["kind"] == "CSIDriver").collect();
        assert_eq!(drivers.len(), 2);
        for d in &drivers {
            assert_eq!(d["spec"]["attachRequired"], true);
            assert_eq!(d["spec"]["podInfoOnMount"], false);
        }
        let classes: Vec<_> = objs
            .iter()
            .filter(|o| o["kind"] == "StorageClass")
            .collect();
        let pairs: Vec<_> = classes
            .iter()
            .map(|c| (c["metadata"]["name"].as_str(), c["provisioner"].as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (Some("sim-rwo"), Some(RWO_DRIVER)),
                (Some("sim-other"), Some(OTHER_DRIVER))
            ]
        );
        assert!(
            classes
                .iter()
                .all(|c| c["volumeBindingMode"] == "Immediate")
        );
        assert!(classes.iter().all(|c| c["reclaimPolicy"] == "Delete"));
    }
}
