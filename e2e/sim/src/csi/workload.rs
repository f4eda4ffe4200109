//! The writer workload as real containers, for real nodes: `podha-csi write` from podha-csi's
//! image (the one its node plugin runs), writing numbered records to its volume at `/data`
//! through its node, its acknowledgements in `/acks/<pod uid>.acks`, a host directory every
//! node shares (`realnode::csi::CSI_ACKS`), off the volume. After a failover the checker reads
//! the volume's write log against the acknowledgements of every pod that wrote to it.
//!
//! On kwok nodes, which run no containers, the same loop runs as a simulated twin (`writer`).

use std::path::Path;

use anyhow::Context;
use podha_csi::checker::Report;
use podha_csi::store::Store;
use serde_json::json;

use crate::cluster::realnode::csi::{CSI_ACKS, csi_image, shared_acks, shared_store};

/// Interval between two writes of a writer.
pub const WRITE_INTERVAL: &str = "100ms";

/// The pod template's spec of a writer: required node affinity to `nodes`, the volume `data`
/// at `/data` (its claim or claim template named by the caller).
pub(crate) fn writer_pod_spec(nodes: &[&str]) -> anyhow::Result<serde_json::Value> {
    Ok(json!({
        "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": nodes,
            }]}],
        }}},
        // `podha-csi write` stops on TERM; a short grace keeps removals quick.
        "terminationGracePeriodSeconds": 2,
        "containers": [{
            "name": "writer",
            "image": csi_image()?,
            "imagePullPolicy": "IfNotPresent",
            "args": [
                "write",
                "--volume-dir=/data",
                "--acks=/acks/$(POD_UID).acks",
                format!("--interval={WRITE_INTERVAL}"),
            ],
            "env": [
                { "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                { "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } },
            ],
            "volumeMounts": [
                { "name": "data", "mountPath": "/data" },
                { "name": "acks", "mountPath": "/acks" },
            ],
        }],
        "volumes": [
            { "name": "acks", "hostPath": { "path": CSI_ACKS, "type": "Directory" } },
        ],
    }))
}

/// A one-replica StatefulSet `name` (label `app=<name>`) of writers, its claim template `data`
/// of StorageClass `class`.
pub fn writer_statefulset(
    name: &str,
    nodes: &[&str],
    class: &str,
) -> anyhow::Result<serde_json::Value> {
    Ok(crate::testkit::statefulset_of(
        name,
        writer_pod_spec(nodes)?,
        class,
    ))
}

/// A one-replica Deployment `name` (label `app=<name>`) of writers on claim `claim` (strategy
/// Recreate: the claim is ReadWriteOnce).
pub fn writer_deployment(
    name: &str,
    nodes: &[&str],
    claim: &str,
) -> anyhow::Result<serde_json::Value> {
    let mut spec = writer_pod_spec(nodes)?;
    spec["volumes"]
        .as_array_mut()
        .context("writer volumes")?
        .push(json!({ "name": "data", "persistentVolumeClaim": { "claimName": claim } }));
    let mut deployment = crate::testkit::deployment_of(name, spec);
    deployment["spec"]["strategy"] = json!({ "type": "Recreate" });
    Ok(deployment)
}

/// The checker's report on volume `handle` of the cluster in `cluster_dir`, against the
/// acknowledgements of every pod its log names.
pub fn check(cluster_dir: &Path, handle: &str) -> anyhow::Result<Report> {
    let volume = Store::new(shared_store(cluster_dir))?.volume(handle)?;
    let acks = shared_acks(cluster_dir);
    Ok(podha_csi::checker::check_volume(
        &volume,
        podha_csi::checker::AcksFrom::Dir(&acks),
    )?)
}

/// Volume `handle`'s write log (every attempt, accepted or refused), oldest first.
pub fn write_log(
    cluster_dir: &Path,
    handle: &str,
) -> anyhow::Result<Vec<podha_csi::store::LogEntry>> {
    Ok(Store::new(shared_store(cluster_dir))?
        .volume(handle)?
        .log()?)
}

/// How many writes pod `pod_uid` had acknowledged (0 before its first).
pub fn acknowledged(cluster_dir: &Path, pod_uid: &str) -> anyhow::Result<usize> {
    Ok(podha_csi::writer::read_acks(&acks_path(cluster_dir, pod_uid))?.len())
}

/// Where pod `pod_uid`'s acknowledgements are, seen from the host.
pub fn acks_path(cluster_dir: &Path, pod_uid: &str) -> std::path::PathBuf {
    shared_acks(cluster_dir).join(format!("{pod_uid}.acks"))
}
