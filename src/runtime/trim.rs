//! What podha keeps of each watched object: only the fields its decisions read, so memory stays
//! flat as clusters grow (a pod's env, images and commands are dropped on arrival).

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSystemInfo, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec,
    PodStatus, ResourceRequirements,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ObjectMeta;

use crate::api::{FAILOVER_ANNOTATION, PAUSE_ANNOTATION, TAINT_MARKER_ANNOTATION};
use crate::contract::NODE_ANNOTATIONS;

/// Drops metadata podha never reads; keeps only the named annotations.
fn trim_meta(meta: &mut ObjectMeta, keep_annotations: &[&str]) {
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.resource_version = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| keep_annotations.contains(&k.as_str()));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

pub fn node(node: &mut Node) {
    // A node keeps its resourceVersion: the taint patch is built on the cached node and
    // guarded by it (one request instead of a read and a write).
    let version = node.metadata.resource_version.take();
    // podha's marker and pause, and the agent contract's (its endpoint, timeout, watchdog and key, the fence request and
    // its acknowledgement): what the `Agent` proof and the heartbeat read, and what tells why a
    // node's agent proves nothing by its silence. Named one by one so that an annotation added
    // to the contract does not compile until it is kept here too.
    let [port, fenced_within, watchdog, key, request, ack] = NODE_ANNOTATIONS;
    trim_meta(
        &mut node.metadata,
        &[
            TAINT_MARKER_ANNOTATION,
            PAUSE_ANNOTATION,
            port,
            fenced_within,
            watchdog,
            key,
            request,
            ack,
        ],
    );
    node.metadata.resource_version = version;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        // The boot ID (a fence request names the boot it is for) and the machine's UUID (the
        // one its BMC must report, `fencing.bmc.matchSystemUUID`).
        status.node_info = status.node_info.take().map(|info| NodeSystemInfo {
            boot_id: info.boot_id,
            system_uuid: info.system_uuid,
            ..NodeSystemInfo::default()
        });
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.capacity = None;
        status.config = None;
        status.features = None;
        status.runtime_handlers = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.retain(|c| c.type_ == "Ready");
            for c in conditions.iter_mut() {
                c.message = None;
                c.last_heartbeat_time = None;
            }
        }
    }
}

fn container(c: &Container) -> Container {
    Container {
        name: c.name.clone(),
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            requests: r.requests.clone(),
            ..ResourceRequirements::default()
        }),
        restart_policy: c.restart_policy.clone(),
        ..Container::default()
    }
}

/// `collect` over `into_iter` reuses the source allocation, sized for every element before
/// filtering: for a pod's volumes that is 3 KiB per dropped `Volume` (every pod has at least
/// the service-account token volume), kept for the pod's whole life in the cache.
fn shrunk<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

pub fn pod(pod: &mut Pod) {
    trim_meta(&mut pod.metadata, &[FAILOVER_ANNOTATION]);
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            node_selector: spec.node_selector,
            affinity: spec.affinity.map(|mut a| {
                a.pod_affinity = None;
                a.pod_anti_affinity = None;
                a
            }),
            tolerations: spec.tolerations,
            volumes: spec.volumes.map(|vs| {
                shrunk(
                    vs.into_iter()
                        .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
                        .collect(),
                )
            }),
            containers: spec.containers.iter().map(container).collect(),
            init_containers: spec
                .init_containers
                .map(|cs| cs.iter().map(container).collect()),
            overhead: spec.overhead,
            resources: spec.resources,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions.map(|cs| {
                shrunk(
                    cs.into_iter()
                        .filter(|c| c.type_ == "Ready")
                        .map(|mut c| {
                            c.message = None;
                            c
                        })
                        .collect(),
                )
            }),
            ..PodStatus::default()
        });
    }
}

pub fn pvc(pvc: &mut PersistentVolumeClaim) {
    trim_meta(&mut pvc.metadata, &[]);
    pvc.metadata.labels = None;
    if let Some(spec) = pvc.spec.as_mut() {
        spec.selector = None;
        spec.data_source = None;
        spec.data_source_ref = None;
    }
    if let Some(status) = pvc.status.as_mut() {
        status.conditions = None;
        status.capacity = None;
    }
}

pub fn pv(pv: &mut PersistentVolume) {
    trim_meta(&mut pv.metadata, &[]);
    pv.metadata.labels = None;
    if let Some(spec) = pv.spec.as_mut() {
        spec.mount_options = None;
        if let Some(csi) = spec.csi.as_mut() {
            csi.volume_attributes = None;
            csi.controller_publish_secret_ref = None;
            csi.node_publish_secret_ref = None;
            csi.node_stage_secret_ref = None;
            csi.node_expand_secret_ref = None;
            csi.controller_expand_secret_ref = None;
        }
    }
}

pub fn volume_attachment(va: &mut VolumeAttachment) {
    trim_meta(&mut va.metadata, &[]);
    va.metadata.labels = None;
    if let Some(status) = va.status.as_mut() {
        status.attachment_metadata = None;
        status.attach_error = None;
        status.detach_error = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{
        AGENT_FENCED_WITHIN_ANNOTATION, AGENT_PORT_ANNOTATION, AGENT_WATCHDOG_ANNOTATION,
        FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION,
    };
    use crate::test_builders::*;
    use k8s_openapi::api::core::v1::EnvVar;

    #[test]
    fn pods_keep_what_decisions_read_and_lose_the_rest() {
        let mut p = mk_pod("ns", "db-0")
            .on("n1")
            .owned_by_sts("db")
            .claim("data")
            .empty_dir("scratch")
            .requests("100m", "1Gi")
            .annotation(FAILOVER_ANNOTATION, "true")
            .annotation("kubectl.kubernetes.io/last-applied-configuration", "{...}");
        let spec = p.spec.as_mut().expect("spec");
        spec.containers[0].env = Some(vec![EnvVar {
            name: "A".into(),
            ..EnvVar::default()
        }]);
        spec.containers[0].image = Some("postgres:17".into());
        pod(&mut p);
        let spec = p.spec.as_ref().expect("spec kept");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(
            spec.volumes.as_ref().map(Vec::len),
            Some(1),
            "only claim volumes stay"
        );
        assert_eq!(
            spec.volumes.as_ref().map(Vec::capacity),
            Some(1),
            "the dropped volumes' room is given back"
        );
        assert!(spec.containers[0].env.is_none());
        assert!(spec.containers[0].image.is_none());
        assert!(
            spec.containers.iter().any(|c| c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some()),
            "requests are kept for the target check"
        );
        let annotations = p
            .metadata
            .annotations
            .as_ref()
            .expect("failover annotation kept");
        assert_eq!(annotations.len(), 1);
        assert!(p.metadata.owner_references.is_some());
        assert!(p.metadata.uid.is_some());
    }

    #[test]
    fn nodes_keep_ready_taints_the_marker_the_agents_word_the_boot_and_their_version() {
        let mut n = mk_node("n1")
            .taint("k", "v", "NoSchedule")
            .annotation(TAINT_MARKER_ANNOTATION, "p")
            .annotation(AGENT_PORT_ANNOTATION, "9441")
            .annotation(AGENT_FENCED_WITHIN_ANNOTATION, "30s")
            .annotation(AGENT_WATCHDOG_ANNOTATION, "10s")
            .annotation(FENCE_REQUEST_ANNOTATION, "p/1/b")
            .annotation(FENCE_ACK_ANNOTATION, "p/1/b")
            .annotation(crate::api::PAUSE_ANNOTATION, "true")
            .annotation("other", "x");
        n.metadata.resource_version = Some("7".into());
        n.status.get_or_insert_with(Default::default).node_info = Some(NodeSystemInfo {
            boot_id: "b".into(),
            system_uuid: "u".into(),
            kernel_version: "6.1".into(),
            ..NodeSystemInfo::default()
        });
        node(&mut n);
        assert_eq!(n.metadata.resource_version.as_deref(), Some("7"));
        assert!(
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.len() == 7 && !a.contains_key("other"))
        );
        let info = n.status.as_ref().and_then(|s| s.node_info.as_ref());
        assert_eq!(info.map(|i| i.boot_id.as_str()), Some("b"));
        assert_eq!(info.map(|i| i.system_uuid.as_str()), Some("u"));
        assert_eq!(info.map(|i| i.kernel_version.as_str()), Some(""));
        assert!(n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some());
        let conditions = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .expect("kept");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "Ready");
        assert!(
            n.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .is_some()
        );
    }
}
