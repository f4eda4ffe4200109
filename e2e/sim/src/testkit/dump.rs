//! What a failed scenario's message shows of the cluster.

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::ListParams;

use super::{name_of, node_of, phase, ready_status, running_ready, va_attached, volumes_in_use};

/// Pods, claims, volume attachments, nodes and events, for failure messages.
pub async fn dump(client: &kube::Client, ns: &str) -> String {
    let mut out = String::new();
    pods(client, ns, &mut out).await;
    claims(client, ns, &mut out).await;
    volume_attachments(client, &mut out).await;
    nodes(client, &mut out).await;
    events(client, ns, &mut out).await;
    out
}

/// The namespace's pods: where each runs, in what state, and whether its volumes are ready.
async fn pods(client: &kube::Client, ns: &str, out: &mut String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    match pods.list(&ListParams::default()).await {
        Ok(list) => {
            out.push_str(&format!("pods in {ns}:\n"));
            for p in &list.items {
                let ann = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::csi::VOLUMES_READY_ANNOTATION).cloned());
                out.push_str(&format!(
                    "  {} uid={} node={} phase={} ready={} deletion={:?} volumes-ready={:?}\n",
                    name_of(p),
                    p.metadata.uid.as_deref().unwrap_or(""),
                    node_of(p).unwrap_or("-"),
                    phase(p),
                    running_ready(p),
                    p.metadata
                        .deletion_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string()),
                    ann,
                ));
            }
        }
        Err(e) => out.push_str(&format!("pods: {e}\n")),
    }
}

/// The namespace's claims and the volumes they are bound to.
async fn claims(client: &kube::Client, ns: &str, out: &mut String) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = pvcs.list(&ListParams::default()).await {
        out.push_str("claims:\n");
        for c in &list.items {
            out.push_str(&format!(
                "  {} volume={:?} phase={:?}\n",
                c.metadata.name.as_deref().unwrap_or(""),
                c.spec.as_ref().and_then(|s| s.volume_name.clone()),
                c.status.as_ref().and_then(|s| s.phase.clone()),
            ));
        }
    }
}

/// Every VolumeAttachment: its volume, node, state and attach error.
async fn volume_attachments(client: &kube::Client, out: &mut String) {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    match vas.list(&ListParams::default()).await {
        Ok(list) => {
            out.push_str("volume attachments:\n");
            for va in &list.items {
                out.push_str(&format!(
                    "  {} pv={:?} node={} attached={} deletion={:?} finalizers={:?} error={:?}\n",
                    va.metadata.name.as_deref().unwrap_or(""),
                    va.spec.source.persistent_volume_name,
                    va.spec.node_name,
                    va_attached(va),
                    va.metadata
                        .deletion_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string()),
                    va.metadata.finalizers,
                    va.status
                        .as_ref()
                        .and_then(|s| s.attach_error.as_ref())
                        .and_then(|e| e.message.clone()),
                ));
            }
        }
        Err(e) => out.push_str(&format!("volume attachments: {e}\n")),
    }
}

/// Every node: Ready, taints and the volumes its kubelet reports in use.
async fn nodes(client: &kube::Client, out: &mut String) {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.list(&ListParams::default()).await {
        Ok(list) => {
            out.push_str("nodes:\n");
            for n in &list.items {
                let taints: Vec<String> = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
                    .iter()
                    .map(|t| {
                        format!(
                            "{}={}:{}",
                            t.key,
                            t.value.as_deref().unwrap_or(""),
                            t.effect
                        )
                    })
                    .collect();
                out.push_str(&format!(
                    "  {} ready={:?} taints={:?} volumesInUse={:?}\n",
                    n.metadata.name.as_deref().unwrap_or(""),
                    ready_status(n),
                    taints,
                    volumes_in_use(n),
                ));
            }
        }
        Err(e) => out.push_str(&format!("nodes: {e}\n")),
    }
}

/// The namespace's last 40 events.
async fn events(client: &kube::Client, ns: &str, out: &mut String) {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = events.list(&ListParams::default()).await {
        out.push_str(&format!("events in {ns} (last 40):\n"));
        let mut items = list.items;
        items.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0));
        for e in items.iter().rev().take(40).rev() {
            out.push_str(&format!(
                "  {} {}/{} {}: {}\n",
                e.type_.as_deref().unwrap_or(""),
                e.involved_object.kind.as_deref().unwrap_or(""),
                e.involved_object.name.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                e.message.as_deref().unwrap_or(""),
            ));
        }
    }
}
