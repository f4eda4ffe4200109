//! podha-csi on the real nodes, installed as a user installs a CSI driver: the node side is the
//! DaemonSet of the kind kit (`e2e/kind/podha-csi/node.yaml`), its image built here from the
//! static `podha-csi` binary and imported into every node's containerd at boot. The real kubelet
//! finds the plugin through its registration socket, calls NodeGetInfo and writes the node's
//! CSINode; it then stages, publishes and unpublishes the volumes of its pods itself.
//!
//! The controller side stays where it is for every node, kwok or real: podha-csi's Controller
//! service behind the real csi-provisioner and csi-attacher, as processes of the sim
//! (`crate::csi::sidecars`). Every node reaches the same store, as nodes reach a SAN: `boot.sh`
//! bind-mounts the cluster's store at [`CSI_STORE`] and the writers' acknowledgements directory
//! at [`CSI_ACKS`] in the node's mount namespace.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use serde::Deserialize;

use crate::cluster::{Error, Result};
use crate::csi::RWO_DRIVER;

/// The kubelet's root directory on a real node (the kubelet's default, where CSI node plugins
/// look for it); the node's own `DIR/nodes/<node>/kubelet`, bind-mounted there.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// Where every node reaches the store of podha-csi's volumes.
pub const CSI_STORE: &str = "/var/lib/podha-csi/store";
/// Where writers on every node keep their acknowledgements (off the volume).
pub const CSI_ACKS: &str = "/var/lib/podha-csi/acks";
/// The node plugin's manifests, shared with the kind kit.
pub const NODE_MANIFEST: &str = include_str!("../../../../kind/podha-csi/node.yaml");

/// The store directory in the cluster directory (the sim's controller side uses it too).
pub fn shared_store(cluster_dir: &Path) -> PathBuf {
    crate::csi::sidecars::Layout::new(cluster_dir).store
}

/// The acknowledgements directory in the cluster directory, [`CSI_ACKS`] on every node.
pub fn shared_acks(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("acks")
}

/// The manifest's objects, in order.
pub fn node_manifest_objects() -> Result<Vec<serde_json::Value>> {
    serde_norway::Deserializer::from_str(NODE_MANIFEST)
        .map(|doc| {
            serde_json::Value::deserialize(doc)
                .map_err(|e| Error::Other(format!("kind/podha-csi/node.yaml: {e}")))
        })
        .filter(|doc| !matches!(doc, Ok(serde_json::Value::Null)))
        .collect()
}

/// The image the node plugin's DaemonSet runs (the sim builds podha-csi's image under it).
pub fn csi_image() -> Result<String> {
    node_manifest_objects()?
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .find_map(|o| o["spec"]["template"]["spec"]["containers"][0]["image"].as_str())
        .map(str::to_string)
        .ok_or_else(|| Error::Other("kind/podha-csi/node.yaml has no DaemonSet image".into()))
}

/// Applies the node plugin's manifests, the DaemonSet kept to the real nodes (label
/// `type=real`), then waits until every node in `nodes` lists the driver in its CSINode: the
/// plugin runs there and the kubelet registered it.
pub async fn install_node_plugin(
    client: &kube::Client,
    nodes: &[String],
    timeout: Duration,
) -> Result<()> {
    let mut objects = node_manifest_objects()?;
    for obj in objects.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
        obj["spec"]["template"]["spec"]["nodeSelector"] = serde_json::json!({ "type": "real" });
    }
    crate::cluster::apply(client, &objects).await?;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut missing = Vec::new();
        for node in nodes {
            let registered = csinodes
                .get_opt(node)
                .await
                .map_err(|e| Error::kube("read CSINode", e))?
                .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == RWO_DRIVER));
            if !registered {
                missing.push(node.as_str());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Other(format!(
                "podha-csi's node plugin did not register {RWO_DRIVER} with the kubelet of {} \
                 within {timeout:?}: see `kubectl -n podha-csi get pods -o wide`, the plugin's \
                 log and logs/kubelet-<node>.log",
                missing.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_serves_the_sims_driver_from_the_paths_boot_prepares() {
        let objects = node_manifest_objects().unwrap();
        let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
        let container = &ds["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(
            args.contains(&format!("--driver={RWO_DRIVER}").as_str()),
            "{args:?}"
        );
        assert!(
            args.contains(&format!("--store={CSI_STORE}").as_str()),
            "{args:?}"
        );
        let host_paths: Vec<&str> = ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["hostPath"]["path"].as_str())
            .collect();
        assert_eq!(host_paths, [KUBELET_ROOT, CSI_STORE]);
        assert!(csi_image().unwrap().starts_with("podha.io/podha-csi:"));
    }
}
