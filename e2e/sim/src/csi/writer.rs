//! The writer workload's simulated twin, for pods on kwok nodes (no containers there): the same
//! write loop as `podha-csi write` (podha_csi::writer), run in the caller's process, writing to
//! the pod's volume in the store through the pod's node, as the pod with the pod's UID.
//!
//! It lives outside the node's processes on purpose: killing a kwok node stops its kubelet
//! stand-ins, while a workload on a host that lost its kubelet or its network keeps writing.
//! Stop it to model a host that lost power.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use podha_csi::checker::{self, Report};
use podha_csi::store::{Store, Volume};
use podha_csi::writer::{Writer, WriterStats};

/// A running simulated writer.
pub struct SimulatedWriter {
    acks: PathBuf,
    volume: Volume,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<podha_csi::store::Result<WriterStats>>,
}

/// The store volume (`spec.csi.volumeHandle`) of the pod's first persistent volume claim.
pub async fn volume_handle(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
) -> anyhow::Result<String> {
    let claim = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find_map(|v| v.persistent_volume_claim.as_ref())
        .ok_or_else(|| anyhow!("pod {namespace}/{:?} has no claim", pod.metadata.name))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get(&claim.claim_name)
        .await?;
    let pv_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| anyhow!("claim {namespace}/{} is not bound", claim.claim_name))?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?;
    pv.spec
        .and_then(|s| s.csi)
        .map(|csi| csi.volume_handle)
        .ok_or_else(|| anyhow!("volume {pv_name} is not a CSI volume"))
}

impl SimulatedWriter {
    /// Starts writing for pod `namespace/name` (bound to a node, its claim bound) to its volume
    /// in `store`, every `interval`. Acknowledged writes go to `acks_dir/<pod uid>.acks`.
    pub async fn start(
        client: &kube::Client,
        store: &Path,
        namespace: &str,
        name: &str,
        acks_dir: &Path,
        interval: Duration,
    ) -> anyhow::Result<SimulatedWriter> {
        let pod = Api::<Pod>::namespaced(client.clone(), namespace)
            .get(name)
            .await?;
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .ok_or_else(|| anyhow!("pod {namespace}/{name} is not bound to a node"))?;
        let pod_uid = pod
            .metadata
            .uid
            .clone()
            .ok_or_else(|| anyhow!("pod {namespace}/{name} has no uid"))?;
        let handle = volume_handle(client, namespace, &pod).await?;
        let volume = Store::new(store)?.volume(&handle)?;
        std::fs::create_dir_all(acks_dir).with_context(|| acks_dir.display().to_string())?;
        let acks = acks_dir.join(format!("{pod_uid}.acks"));
        let writer = Writer {
            volume: volume.clone(),
            node,
            pod_uid,
            acks: acks.clone(),
            interval,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            writer
                .run(None, async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(SimulatedWriter {
            acks,
            volume,
            stop: Some(stop),
            task,
        })
    }

    /// Where this writer's acknowledged writes are.
    pub fn acks(&self) -> &Path {
        &self.acks
    }

    /// The volume it writes to.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// Stops writing; returns what it did.
    pub async fn stop(mut self) -> anyhow::Result<WriterStats> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        Ok((&mut self.task).await??)
    }
}

/// The checker's report on `volume` against the acknowledgements in `acks`.
pub fn check(volume: &Volume, acks: &[&Path]) -> anyhow::Result<Report> {
    let files: Vec<PathBuf> = acks.iter().map(|path| path.to_path_buf()).collect();
    Ok(checker::check_volume(
        volume,
        checker::AcksFrom::Files(&files),
    )?)
}
