//! The sim's CSI drivers: the real storage path on the controller side, a simulated kubelet on
//! the node side.
//!
//! # Interface (used by `cluster`)
//!
//! - [`RWO_DRIVER`], [`OTHER_DRIVER`]: the two driver names, so driver scoping can be tested.
//! - [`cluster_objects`]: `CSIDriver` objects (attachRequired) and the StorageClasses
//!   [`RWO_STORAGE_CLASS`] (`sim-rwo`), [`UNFENCED_STORAGE_CLASS`] (`sim-rwo-unfenced`, same
//!   driver, storage that does not fence on unpublish) and [`OTHER_STORAGE_CLASS`]
//!   (`sim-other`). The caller applies them once; nothing here creates them.
//! - [`sidecars::controller_processes`]: per driver, podha-csi's Controller service on a unix
//!   socket ([`run_plugin`], the `podha-sim csi-plugin` command) behind the real
//!   kubernetes-csi `csi-provisioner` and `csi-attacher` (`make csi-sidecars`). The volumes
//!   live in one shared directory, the store (see the `podha-csi` crate), under the cluster
//!   directory ([`sidecars::Layout`]).
//! - [`run_node_agent`]: one process per node, started and killed with that node's kwok (it is
//!   the storage half of the fake kubelet). Runs until an error.
//! - [`VOLUMES_READY_ANNOTATION`]: the node agent sets it to `"true"` on a pod once every CSI
//!   volume of the pod is attached to the pod's node; kwok's pod stage must start only pods that
//!   carry it (this stands in for the kubelet's "wait for attach + mount").
//! - [`writer`]: the writer workload's simulated twin for pods on kwok nodes (which have no
//!   containers): writes to the pod's volume in the store through the pod's node.
//!
//! # Who does what
//!
//! - `csi-provisioner` (real): a PVC of a sim StorageClass gets a PV `pvc-<pvc uid>`, created
//!   in the store by CreateVolume; a released PV is deleted with DeleteVolume.
//! - `csi-attacher` (real): a VolumeAttachment of a sim driver gets the finalizer
//!   `external-attacher/<sanitized driver>` ([`attacher_finalizer`]); ControllerPublishVolume
//!   (after `attach_delay`) then `status.attached=true`. A deleted VA is unpublished
//!   (ControllerUnpublishVolume after `detach_delay`, which fences the node unless the volume
//!   was created without fencing) and loses its finalizer, whether or not its node is alive.
//! - `node_agent` (kubelet): annotates the Node with
//!   `volumes.kubernetes.io/controller-managed-attach-detach` (without it the attach/detach
//!   controller ignores the node) and `csi.volume.kubernetes.io/nodeid`, registers both drivers
//!   in the node's CSINode (there is no node-driver-registrar: the Go module proxy does not
//!   serve it), keeps `node.status.volumesInUse` equal to the CSI volumes of the non-terminal
//!   pods bound to the node, and sets [`VOLUMES_READY_ANNOTATION`]. When the agent is killed,
//!   `volumesInUse` freezes, which is what makes the attach/detach controller wait six minutes
//!   before it force-detaches from a dead node.
//!
//! The node agent's decisions are pure functions (`desired_*`) over objects; its `run` function
//! only watches (kube-runtime reflectors) and writes.

mod node_agent;
pub mod sidecars;
pub mod workload;
pub mod writer;

use std::path::Path;
use std::time::Duration;

use serde_json::json;

/// Driver whose volumes podha is meant to fail over (tests use it with RWO/RWOP claims).
pub const RWO_DRIVER: &str = "rwo.sim.podha.io";
/// A second driver, so that `volumes.drivers` scoping can be tested.
pub const OTHER_DRIVER: &str = "other.sim.podha.io";
/// Both drivers the sim serves.
pub const DRIVERS: [&str; 2] = [RWO_DRIVER, OTHER_DRIVER];
/// StorageClass provisioned by [`RWO_DRIVER`].
pub const RWO_STORAGE_CLASS: &str = "sim-rwo";
/// StorageClass of [`RWO_DRIVER`] whose volumes are not fenced on ControllerUnpublishVolume
/// (StorageClass parameter `fencing: "off"`): storage on which a node cut off from the cluster
/// keeps writing.
pub const UNFENCED_STORAGE_CLASS: &str = "sim-rwo-unfenced";
/// StorageClass provisioned by [`OTHER_DRIVER`].
pub const OTHER_STORAGE_CLASS: &str = "sim-other";
/// Pod annotation set (value `"true"`) by the node agent once the pod's volumes are attached to
/// its node; kwok's pod stage starts only pods carrying it.
pub const VOLUMES_READY_ANNOTATION: &str = "sim.podha.io/volumes-ready";

/// Timing of the storage backend (podha-csi's ControllerPublish/Unpublish delays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Time ControllerPublishVolume takes.
    pub attach_delay: Duration,
    /// Time ControllerUnpublishVolume takes.
    pub detach_delay: Duration,
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

/// The cluster-scoped objects the sim's CSI drivers need: a `CSIDriver` per driver (attachRequired, so the
/// attach/detach controller creates VolumeAttachments; no pod info on mount) and the
/// StorageClasses `sim-rwo`, `sim-rwo-unfenced` and `sim-other` (reclaim `Delete`, binding
/// mode `Immediate`).
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
        (RWO_STORAGE_CLASS, RWO_DRIVER, "on"),
        (UNFENCED_STORAGE_CLASS, RWO_DRIVER, "off"),
        (OTHER_STORAGE_CLASS, OTHER_DRIVER, "on"),
    ]
    .into_iter()
    .map(|(class, driver, fencing)| {
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": { "name": class, "labels": labels },
            "provisioner": driver,
            "parameters": { podha_csi::controller::FENCING_PARAMETER: fencing },
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": false,
        })
    });
    drivers.chain(classes).collect()
}

/// Serves podha-csi's Identity and Controller services for `driver` on `socket`, volumes in
/// `store`. Returns only on error.
pub async fn run_plugin(
    driver: &str,
    socket: &Path,
    store: &Path,
    cfg: ControllerConfig,
) -> anyhow::Result<()> {
    let controller = podha_csi::controller::ControllerService {
        store: podha_csi::store::Store::new(store)?,
        driver: driver.to_string(),
        attach_delay: cfg.attach_delay,
        detach_delay: cfg.detach_delay,
        fencing: true,
    };
    let identity = podha_csi::identity::IdentityService {
        driver: driver.to_string(),
        controller: true,
    };
    podha_csi::server::serve(
        socket,
        identity,
        Some(controller),
        None,
        std::future::pending(),
    )
    .await?;
    Err(anyhow::anyhow!("the CSI server of {driver} stopped"))
}

/// Runs the node agent of `node`. Returns only on error.
pub async fn run_node_agent(client: kube::Client, node: String) -> anyhow::Result<()> {
    node_agent::run(client, node).await
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
                (Some("sim-rwo-unfenced"), Some(RWO_DRIVER)),
                (Some("sim-other"), Some(OTHER_DRIVER))
            ]
        );
        let fencing: Vec<_> = classes
            .iter()
            .map(|c| c["parameters"]["fencing"].as_str())
            .collect();
        assert_eq!(fencing, [Some("on"), Some("off"), Some("on")]);
        assert!(
            classes
                .iter()
                .all(|c| c["volumeBindingMode"] == "Immediate")
        );
        assert!(classes.iter().all(|c| c["reclaimPolicy"] == "Delete"));
    }
}
