//! The objects a scenario creates: workloads pinned to its own nodes, and their claims.

use serde_json::json;

/// Required node affinity to `nodes`, so each scenario keeps to its own nodes.
fn affinity(nodes: &[&str]) -> serde_json::Value {
    json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{
                    "matchExpressions": [{
                        "key": "kubernetes.io/hostname",
                        "operator": "In",
                        "values": nodes,
                    }],
                }],
            },
        },
    })
}

fn pod_spec(nodes: &[&str], claim: Option<&str>) -> serde_json::Value {
    let mut spec = json!({
        "affinity": affinity(nodes),
        "containers": [{
            "name": "app",
            "image": "registry.invalid/podha/app:1",
            "volumeMounts": [],
        }],
    });
    if let Some(claim) = claim {
        spec["containers"][0]["volumeMounts"] = json!([{ "name": "data", "mountPath": "/data" }]);
        spec["volumes"] =
            json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
    }
    spec
}

pub fn pvc(name: &str, class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": { "name": name },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": { "requests": { "storage": "1Gi" } },
        },
    })
}

/// A one-replica StatefulSet `name` (label `app=<name>`) with a `sim-rwo` claim template `data`.
pub fn statefulset(name: &str, nodes: &[&str]) -> serde_json::Value {
    let mut spec = pod_spec(nodes, None);
    spec["containers"][0]["volumeMounts"] = json!([{ "name": "data", "mountPath": "/data" }]);
    statefulset_of(name, spec, crate::csi::RWO_STORAGE_CLASS)
}

/// A one-replica StatefulSet `name` (label `app=<name>`) of pods with `spec`, its claim template
/// `data` (ReadWriteOnce, 1Gi) of StorageClass `class`.
pub fn statefulset_of(name: &str, spec: serde_json::Value, class: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } }, "spec": spec },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    })
}

/// A one-replica Deployment `name` (label `app=<name>`), mounting `claim` if given.
pub fn deployment(name: &str, nodes: &[&str], claim: Option<&str>) -> serde_json::Value {
    deployment_of(name, pod_spec(nodes, claim))
}

/// A one-replica Deployment `name` (label `app=<name>`) of pods with `spec`.
pub fn deployment_of(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } }, "spec": spec },
        },
    })
}
