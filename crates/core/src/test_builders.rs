//! Small builders for the cluster objects decision tests need, in one style:
//! `mk_node("n1").label("zone", "a").taint("k", "v", "NoSchedule").unschedulable()`,
//! `mk_pod("ns", "db-0").on("n1").owned_by_sts("db").claim("data").ready(true)`,
//! `mk_pvc("ns", "data").bound_to("pv1")`, `mk_csi_pv("pv1", "rwo.sim.podha.io")`, and
//! `view_with([node.into(), pod.into(), ...])` to put them in a [`View`].
//!
//! Each `mk_*` returns the real Kubernetes type, and the builder methods are extension traits on
//! that type, so a test can still reach into any field the builders do not cover.
//!
//! Defaults describe the common case of a failover test: a node is Ready with room
//! (4 CPU, 16Gi, 110 pods); a pod is Running and **not Ready** (as the node lifecycle controller
//! marks pods on a dead node) with one container without requests; a claim is Pending until
//! `bound_to`; a CSI volume is ReadWriteOnce with 1Gi; a policy has the CRD defaults.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{
    Affinity, CSIPersistentVolumeSource, Container, EphemeralVolumeSource, HostPathVolumeSource,
    Namespace, Node, NodeAffinity, NodeCondition, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, NodeSpec, NodeStatus, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeClaimTemplate, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod,
    PodCondition, PodSpec, PodStatus, ResourceRequirements, Taint, Toleration, Volume,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use crate::api::{AccessMode, OwnerKind, PodHAPolicySpec};
use crate::eligibility::replica_set_controller;
use crate::view::{AgentAdvert, ObjectKey, View};

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        uid: Some(match namespace {
            Some(ns) => format!("uid-{ns}-{name}"),
            None => format!("uid-{name}"),
        }),
        ..ObjectMeta::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

fn controller_ref(api_version: &str, kind: &str, name: &str, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: format!("uid-{kind}-{name}"),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    }
}

/// Labels, annotations and owners on any object.
pub trait MetaBuild: Resource + Sized {
    fn label(mut self, key: &str, value: &str) -> Self {
        self.labels_mut().insert(key.to_string(), value.to_string());
        self
    }

    fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations_mut()
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a controller owner reference (`controller: true`).
    fn owned_by(mut self, api_version: &str, kind: &str, name: &str) -> Self {
        self.owner_references_mut()
            .push(controller_ref(api_version, kind, name, true));
        self
    }

    /// Adds an owner reference that is not the controller.
    fn owned_by_non_controller(mut self, api_version: &str, kind: &str, name: &str) -> Self {
        self.owner_references_mut()
            .push(controller_ref(api_version, kind, name, false));
        self
    }

    fn uid(mut self, uid: &str) -> Self {
        self.meta_mut().uid = Some(uid.to_string());
        self
    }

    /// Sets `deletionTimestamp` (a fixed instant): the object is terminating.
    fn terminating(mut self) -> Self {
        self.meta_mut().deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        self
    }
}

impl<T: Resource + Sized> MetaBuild for T {}

// ---------------------------------------------------------------------------------------------
// Nodes

/// A Ready node with allocatable 4 CPU, 16Gi memory, 110 pods and the hostname label.
pub fn mk_node(name: &str) -> Node {
    Node {
        metadata: meta(None, name),
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(quantities(&[
                ("cpu", "4"),
                ("memory", "16Gi"),
                ("pods", "110"),
            ])),
            capacity: Some(quantities(&[
                ("cpu", "4"),
                ("memory", "16Gi"),
                ("pods", "110"),
            ])),
            conditions: Some(vec![ready_condition(true)]),
            ..NodeStatus::default()
        }),
    }
    .label("kubernetes.io/hostname", name)
}

fn ready_condition(ready: bool) -> NodeCondition {
    NodeCondition {
        type_: "Ready".to_string(),
        status: if ready { "True" } else { "Unknown" }.to_string(),
        ..NodeCondition::default()
    }
}

pub trait NodeBuild {
    /// Adds a taint (`effect`: NoSchedule, PreferNoSchedule or NoExecute).
    fn taint(self, key: &str, value: &str, effect: &str) -> Self;
    /// Cordons the node (`spec.unschedulable`).
    fn unschedulable(self) -> Self;
    /// Sets the Ready condition to True, or to Unknown as for a node that stopped reporting.
    fn ready(self, ready: bool) -> Self;
    /// Removes all conditions, as for a node that never reported.
    fn without_conditions(self) -> Self;
    /// Sets allocatable CPU and memory.
    fn allocatable(self, cpu: &str, memory: &str) -> Self;
    /// Sets the allocatable pod count.
    fn max_pods(self, pods: u32) -> Self;
    /// Removes `status.allocatable` altogether.
    fn no_allocatable(self) -> Self;
    /// Runs a podha agent at 10.0.0.1:9441 (the node's InternalIP and the port on the Node),
    /// petting a 4 s watchdog and fenced within `fenced_within` (`None`: an agent without a
    /// usable watchdog, which advertises no time).
    fn agent(self, fenced_within: Option<&str>) -> Self;
    /// Reports boot `boot_id` (`status.nodeInfo.bootID`).
    fn boot(self, boot_id: &str) -> Self;
    /// Reports system UUID `uuid` (`status.nodeInfo.systemUUID`).
    fn system_uuid(self, uuid: &str) -> Self;
}

impl NodeBuild for Node {
    fn boot(mut self, boot_id: &str) -> Self {
        node_status(&mut self)
            .node_info
            .get_or_insert_default()
            .boot_id = boot_id.to_string();
        self
    }

    fn system_uuid(mut self, uuid: &str) -> Self {
        node_status(&mut self)
            .node_info
            .get_or_insert_default()
            .system_uuid = uuid.to_string();
        self
    }

    fn agent(self, fenced_within: Option<&str>) -> Self {
        use crate::contract::{
            AGENT_FENCED_WITHIN_ANNOTATION, AGENT_PORT_ANNOTATION, AGENT_WATCHDOG_ANNOTATION,
        };
        let mut node = self.annotation(AGENT_PORT_ANNOTATION, "9441");
        if let Some(within) = fenced_within {
            node = node
                .annotation(AGENT_FENCED_WITHIN_ANNOTATION, within)
                .annotation(AGENT_WATCHDOG_ANNOTATION, "4s");
        }
        node.status
            .get_or_insert_with(NodeStatus::default)
            .addresses = Some(vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }]);
        node
    }

    fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        let spec = self.spec.get_or_insert_with(NodeSpec::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.to_string(),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        });
        self
    }

    fn unschedulable(mut self) -> Self {
        self.spec
            .get_or_insert_with(NodeSpec::default)
            .unschedulable = Some(true);
        self
    }

    fn ready(mut self, ready: bool) -> Self {
        let conditions = node_status(&mut self)
            .conditions
            .get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(ready_condition(ready));
        self
    }

    fn without_conditions(mut self) -> Self {
        node_status(&mut self).conditions = None;
        self
    }

    fn allocatable(mut self, cpu: &str, memory: &str) -> Self {
        let allocatable = node_status(&mut self)
            .allocatable
            .get_or_insert_with(BTreeMap::new);
        allocatable.insert("cpu".to_string(), Quantity(cpu.to_string()));
        allocatable.insert("memory".to_string(), Quantity(memory.to_string()));
        self
    }

    fn max_pods(mut self, pods: u32) -> Self {
        let allocatable = node_status(&mut self)
            .allocatable
            .get_or_insert_with(BTreeMap::new);
        allocatable.insert("pods".to_string(), Quantity(pods.to_string()));
        self
    }

    fn no_allocatable(mut self) -> Self {
        node_status(&mut self).allocatable = None;
        self
    }
}

fn node_status(node: &mut Node) -> &mut NodeStatus {
    node.status.get_or_insert_with(NodeStatus::default)
}

/// An empty node selector term; add requirements with [`TermBuild`].
pub fn mk_term() -> NodeSelectorTerm {
    NodeSelectorTerm::default()
}

pub trait TermBuild {
    /// Adds a `matchExpressions` requirement (In, NotIn, Exists, DoesNotExist, Gt, Lt).
    fn expr(self, key: &str, operator: &str, values: &[&str]) -> Self;
    /// Adds a `matchFields` requirement (the scheduler supports `metadata.name`).
    fn field(self, key: &str, operator: &str, values: &[&str]) -> Self;
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: operator.to_string(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

impl TermBuild for NodeSelectorTerm {
    fn expr(mut self, key: &str, operator: &str, values: &[&str]) -> Self {
        self.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement(key, operator, values));
        self
    }

    fn field(mut self, key: &str, operator: &str, values: &[&str]) -> Self {
        self.match_fields
            .get_or_insert_with(Vec::new)
            .push(requirement(key, operator, values));
        self
    }
}

/// A toleration; empty strings leave the field unset.
pub fn mk_toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Toleration {
        key: opt(key),
        operator: opt(operator),
        value: opt(value),
        effect: opt(effect),
        toleration_seconds: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Pods

/// A Running, not Ready pod with one container `app` and no node.
pub fn mk_pod(namespace: &str, name: &str) -> Pod {
    Pod {
        metadata: meta(Some(namespace), name),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".to_string(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_string()),
            conditions: Some(vec![pod_ready_condition(false)]),
            ..PodStatus::default()
        }),
    }
}

fn pod_ready_condition(ready: bool) -> PodCondition {
    PodCondition {
        type_: "Ready".to_string(),
        status: if ready { "True" } else { "False" }.to_string(),
        ..PodCondition::default()
    }
}

pub trait PodBuild {
    /// Binds the pod to a node (`spec.nodeName`).
    fn on(self, node: &str) -> Self;
    /// Controlled by the StatefulSet `name`.
    fn owned_by_sts(self, name: &str) -> Self;
    /// Controlled by the ReplicaSet `name` (add `mk_rs` to the view to say who owns it).
    fn owned_by_rs(self, name: &str) -> Self;
    /// Mounts the PersistentVolumeClaim `claim` (the volume has the claim's name).
    fn claim(self, claim: &str) -> Self;
    /// A generic ephemeral volume `volume`: its claim is `<pod>-<volume>`.
    fn ephemeral(self, volume: &str) -> Self;
    /// An emptyDir volume.
    fn empty_dir(self, volume: &str) -> Self;
    /// Sets the Ready condition.
    fn ready(self, ready: bool) -> Self;
    /// Sets `status.phase` (Pending, Running, Succeeded, Failed).
    fn phase(self, phase: &str) -> Self;
    /// Adds a `spec.nodeSelector` entry.
    fn node_selector(self, key: &str, value: &str) -> Self;
    /// Adds a toleration (see [`mk_toleration`]).
    fn toleration(self, toleration: Toleration) -> Self;
    /// Adds a term (ORed with the others) to the required node affinity.
    fn required_affinity(self, term: NodeSelectorTerm) -> Self;
    /// Adds a container with these CPU and memory requests.
    fn requests(self, cpu: &str, memory: &str) -> Self;
    /// Adds an ordinary init container with these requests.
    fn init_requests(self, cpu: &str, memory: &str) -> Self;
    /// Adds a sidecar (init container with `restartPolicy: Always`) with these requests.
    fn sidecar_requests(self, cpu: &str, memory: &str) -> Self;
    /// Sets pod-level `spec.resources.requests`.
    fn pod_level_requests(self, requests: &[(&str, &str)]) -> Self;
    /// Sets `spec.overhead`.
    fn overhead(self, cpu: &str, memory: &str) -> Self;
}

fn pod_spec(pod: &mut Pod) -> &mut PodSpec {
    pod.spec.get_or_insert_with(PodSpec::default)
}

fn container_with(name: String, cpu: &str, memory: &str) -> Container {
    Container {
        name,
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", cpu), ("memory", memory)])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

fn add_volume(pod: &mut Pod, volume: Volume) {
    pod_spec(pod)
        .volumes
        .get_or_insert_with(Vec::new)
        .push(volume);
}

impl PodBuild for Pod {
    fn on(mut self, node: &str) -> Self {
        pod_spec(&mut self).node_name = Some(node.to_string());
        self
    }

    fn owned_by_sts(self, name: &str) -> Self {
        self.owned_by("apps/v1", "StatefulSet", name)
    }

    fn owned_by_rs(self, name: &str) -> Self {
        self.owned_by("apps/v1", "ReplicaSet", name)
    }

    fn claim(mut self, claim: &str) -> Self {
        add_volume(
            &mut self,
            Volume {
                name: claim.to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    read_only: None,
                }),
                ..Volume::default()
            },
        );
        self
    }

    fn ephemeral(mut self, volume: &str) -> Self {
        add_volume(
            &mut self,
            Volume {
                name: volume.to_string(),
                ephemeral: Some(EphemeralVolumeSource {
                    volume_claim_template: Some(PersistentVolumeClaimTemplate::default()),
                }),
                ..Volume::default()
            },
        );
        self
    }

    fn empty_dir(mut self, volume: &str) -> Self {
        add_volume(
            &mut self,
            Volume {
                name: volume.to_string(),
                empty_dir: Some(Default::default()),
                ..Volume::default()
            },
        );
        self
    }

    fn ready(mut self, ready: bool) -> Self {
        let status = self.status.get_or_insert_with(PodStatus::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(pod_ready_condition(ready));
        self
    }

    fn phase(mut self, phase: &str) -> Self {
        self.status.get_or_insert_with(PodStatus::default).phase = Some(phase.to_string());
        self
    }

    fn node_selector(mut self, key: &str, value: &str) -> Self {
        let selector = pod_spec(&mut self)
            .node_selector
            .get_or_insert_with(BTreeMap::new);
        selector.insert(key.to_string(), value.to_string());
        self
    }

    fn toleration(mut self, toleration: Toleration) -> Self {
        pod_spec(&mut self)
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(toleration);
        self
    }

    fn required_affinity(mut self, term: NodeSelectorTerm) -> Self {
        let affinity = pod_spec(&mut self)
            .affinity
            .get_or_insert_with(Affinity::default);
        let node_affinity = affinity
            .node_affinity
            .get_or_insert_with(NodeAffinity::default);
        node_affinity
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(NodeSelector::default)
            .node_selector_terms
            .push(term);
        self
    }

    fn requests(mut self, cpu: &str, memory: &str) -> Self {
        let spec = pod_spec(&mut self);
        let name = format!("c{}", spec.containers.len());
        spec.containers.push(container_with(name, cpu, memory));
        self
    }

    fn init_requests(mut self, cpu: &str, memory: &str) -> Self {
        let init = pod_spec(&mut self)
            .init_containers
            .get_or_insert_with(Vec::new);
        init.push(container_with(format!("init{}", init.len()), cpu, memory));
        self
    }

    fn sidecar_requests(mut self, cpu: &str, memory: &str) -> Self {
        let init = pod_spec(&mut self)
            .init_containers
            .get_or_insert_with(Vec::new);
        let mut sidecar = container_with(format!("sidecar{}", init.len()), cpu, memory);
        sidecar.restart_policy = Some("Always".to_string());
        init.push(sidecar);
        self
    }

    fn pod_level_requests(mut self, requests: &[(&str, &str)]) -> Self {
        pod_spec(&mut self).resources = Some(ResourceRequirements {
            requests: Some(quantities(requests)),
            ..ResourceRequirements::default()
        });
        self
    }

    fn overhead(mut self, cpu: &str, memory: &str) -> Self {
        pod_spec(&mut self).overhead = Some(quantities(&[("cpu", cpu), ("memory", memory)]));
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Claims and volumes

/// A Pending claim with no volume.
pub fn mk_pvc(namespace: &str, name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(Some(namespace), name),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![AccessMode::ReadWriteOnce.as_str().to_string()]),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".to_string()),
            ..PersistentVolumeClaimStatus::default()
        }),
    }
}

pub trait PvcBuild {
    /// Bound to the volume `pv` (`spec.volumeName`, phase Bound).
    fn bound_to(self, pv: &str) -> Self;
}

impl PvcBuild for PersistentVolumeClaim {
    fn bound_to(mut self, pv: &str) -> Self {
        self.spec.get_or_insert_with(Default::default).volume_name = Some(pv.to_string());
        self.phase("Bound")
    }
}

/// `status.phase` of a claim (Pending, Bound, Lost) or a volume (Available, Bound, Released).
pub trait PhaseBuild {
    fn phase(self, phase: &str) -> Self;
}

impl PhaseBuild for PersistentVolumeClaim {
    fn phase(mut self, phase: &str) -> Self {
        self.status.get_or_insert_with(Default::default).phase = Some(phase.to_string());
        self
    }
}

impl PhaseBuild for PersistentVolume {
    fn phase(mut self, phase: &str) -> Self {
        self.status.get_or_insert_with(Default::default).phase = Some(phase.to_string());
        self
    }
}

/// A Bound ReadWriteOnce 1Gi CSI volume of `driver`, volume handle `<name>-handle`.
pub fn mk_csi_pv(name: &str, driver: &str) -> PersistentVolume {
    let mut pv = mk_pv(name);
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = Some(CSIPersistentVolumeSource {
            driver: driver.to_string(),
            volume_handle: format!("{name}-handle"),
            ..CSIPersistentVolumeSource::default()
        });
    }
    pv
}

/// A Bound ReadWriteOnce 1Gi hostPath volume: not CSI.
pub fn mk_host_path_pv(name: &str) -> PersistentVolume {
    let mut pv = mk_pv(name);
    if let Some(spec) = pv.spec.as_mut() {
        spec.host_path = Some(HostPathVolumeSource {
            path: format!("/data/{name}"),
            type_: None,
        });
    }
    pv
}

fn mk_pv(name: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(None, name),
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec![AccessMode::ReadWriteOnce.as_str().to_string()]),
            capacity: Some(quantities(&[("storage", "1Gi")])),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
    .phase("Bound")
}

pub trait PvBuild {
    /// Replaces the access modes.
    fn access_modes(self, modes: &[AccessMode]) -> Self;
    /// Adds a term (ORed with the others) to `spec.nodeAffinity.required`: the topology.
    fn node_affinity(self, term: NodeSelectorTerm) -> Self;
    /// Sets `spec.claimRef` to `namespace/claim`.
    fn claimed_by(self, namespace: &str, claim: &str) -> Self;
}

impl PvBuild for PersistentVolume {
    fn access_modes(mut self, modes: &[AccessMode]) -> Self {
        self.spec.get_or_insert_with(Default::default).access_modes =
            Some(modes.iter().map(|m| m.as_str().to_string()).collect());
        self
    }

    fn node_affinity(mut self, term: NodeSelectorTerm) -> Self {
        let spec = self.spec.get_or_insert_with(Default::default);
        let affinity = spec
            .node_affinity
            .get_or_insert_with(VolumeNodeAffinity::default);
        affinity
            .required
            .get_or_insert_with(NodeSelector::default)
            .node_selector_terms
            .push(term);
        self
    }

    fn claimed_by(mut self, namespace: &str, claim: &str) -> Self {
        self.spec.get_or_insert_with(Default::default).claim_ref = Some(ObjectReference {
            kind: Some("PersistentVolumeClaim".to_string()),
            namespace: Some(namespace.to_string()),
            name: Some(claim.to_string()),
            ..ObjectReference::default()
        });
        self
    }
}

/// A VolumeAttachment of `pv` by `attacher` to `node`, not yet attached.
pub fn mk_va(name: &str, attacher: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: meta(None, name),
        spec: VolumeAttachmentSpec {
            attacher: attacher.to_string(),
            node_name: node.to_string(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_string()),
                ..VolumeAttachmentSource::default()
            },
        },
        status: None,
    }
}

pub trait VaBuild {
    /// Sets `status.attached`.
    fn attached(self, attached: bool) -> Self;
}

impl VaBuild for VolumeAttachment {
    fn attached(mut self, attached: bool) -> Self {
        self.status
            .get_or_insert_with(VolumeAttachmentStatus::default)
            .attached = attached;
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Namespaces, ReplicaSets, policies

/// A namespace; give it labels with `.label(..)`.
pub fn mk_namespace(name: &str) -> Namespace {
    Namespace {
        metadata: meta(None, name),
        ..Namespace::default()
    }
}

/// A ReplicaSet with no controller owner (a bare one); see [`RsBuild`].
pub fn mk_rs(namespace: &str, name: &str) -> ReplicaSet {
    ReplicaSet {
        metadata: meta(Some(namespace), name),
        ..ReplicaSet::default()
    }
}

pub trait RsBuild {
    /// Controlled by the Deployment `name`.
    fn owned_by_deployment(self, name: &str) -> Self;
}

impl RsBuild for ReplicaSet {
    fn owned_by_deployment(self, name: &str) -> Self {
        self.owned_by("apps/v1", "Deployment", name)
    }
}

/// A policy spec with every CRD default (owners StatefulSet and Deployment, RWO and RWOP,
/// any driver, requireTarget) but the fencing proof, which is `None`: the tests of detection,
/// eligibility and actions need no agent; those of the proofs choose theirs.
pub fn mk_spec() -> PodHAPolicySpec {
    match serde_json::from_value(serde_json::json!({"fencing": {"proof": "None"}})) {
        Ok(spec) => spec,
        Err(error) => panic!("an empty PodHAPolicySpec must deserialize with defaults: {error}"),
    }
}

pub trait SpecBuild {
    fn owners(self, owners: &[OwnerKind]) -> Self;
    fn drivers(self, drivers: &[&str]) -> Self;
    fn access_modes(self, modes: &[AccessMode]) -> Self;
    fn require_target(self, require: bool) -> Self;
    fn node_selector(self, selector: LabelSelector) -> Self;
    fn namespace_selector(self, selector: LabelSelector) -> Self;
    fn pod_selector(self, selector: LabelSelector) -> Self;
}

impl SpecBuild for PodHAPolicySpec {
    fn owners(mut self, owners: &[OwnerKind]) -> Self {
        self.owners = owners.to_vec();
        self
    }

    fn drivers(mut self, drivers: &[&str]) -> Self {
        self.volumes.drivers = drivers.iter().map(|d| d.to_string()).collect();
        self
    }

    fn access_modes(mut self, modes: &[AccessMode]) -> Self {
        self.volumes.access_modes = modes.to_vec();
        self
    }

    fn require_target(mut self, require: bool) -> Self {
        self.safety.require_target = require;
        self
    }

    fn node_selector(mut self, selector: LabelSelector) -> Self {
        self.node_selector = selector;
        self
    }

    fn namespace_selector(mut self, selector: LabelSelector) -> Self {
        self.namespace_selector = selector;
        self
    }

    fn pod_selector(mut self, selector: LabelSelector) -> Self {
        self.pod_selector = selector;
        self
    }
}

// ---------------------------------------------------------------------------------------------
// The view

/// Anything [`view_with`] can put in a [`View`].
#[derive(Clone, Debug)]
pub enum Obj {
    Node(Node),
    /// Pods without `spec.nodeName` are dropped: the view holds bound pods only.
    Pod(Pod),
    Pvc(PersistentVolumeClaim),
    Pv(PersistentVolume),
    Va(VolumeAttachment),
    /// Recorded as its labels.
    Namespace(Namespace),
    /// Recorded as its controller kind (Deployment, or none).
    ReplicaSet(ReplicaSet),
}

macro_rules! obj_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl From<$ty> for Obj {
            fn from(value: $ty) -> Self {
                Obj::$variant(value)
            }
        })*
    };
}

obj_from!(
    Node(Node),
    Pod(Pod),
    Pvc(PersistentVolumeClaim),
    Pv(PersistentVolume),
    Va(VolumeAttachment),
    Namespace(Namespace),
    ReplicaSet(ReplicaSet),
);

/// A view holding these objects.
pub fn view_with(objects: impl IntoIterator<Item = Obj>) -> View {
    View::default().with_all(objects)
}

pub trait ViewBuild {
    /// Adds one object.
    fn with(self, object: impl Into<Obj>) -> Self;
    /// Adds several objects.
    fn with_all(self, objects: impl IntoIterator<Item = Obj>) -> Self;
}

impl ViewBuild for View {
    fn with(mut self, object: impl Into<Obj>) -> Self {
        match object.into() {
            Obj::Node(node) => {
                self.nodes.insert(node.name_any(), Arc::new(node));
            }
            Obj::Pod(pod) => {
                if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    self.pods_by_node
                        .entry(node)
                        .or_default()
                        .push(Arc::new(pod));
                }
            }
            Obj::Pvc(pvc) => {
                let key = ObjectKey::new(pvc.namespace().unwrap_or_default(), pvc.name_any());
                self.pvcs.insert(key, Arc::new(pvc));
            }
            Obj::Pv(pv) => {
                self.pvs.insert(pv.name_any(), Arc::new(pv));
            }
            Obj::Va(va) => {
                let node = va.spec.node_name.clone();
                self.attachments_by_node
                    .entry(node)
                    .or_default()
                    .push(Arc::new(va));
            }
            Obj::Namespace(ns) => {
                self.namespace_labels
                    .insert(ns.name_any(), ns.labels().clone());
            }
            Obj::ReplicaSet(rs) => {
                let key = ObjectKey::new(rs.namespace().unwrap_or_default(), rs.name_any());
                self.replica_set_owners
                    .insert(key, replica_set_controller(&rs.metadata));
            }
        }
        self
    }

    fn with_all(self, objects: impl IntoIterator<Item = Obj>) -> Self {
        objects.into_iter().fold(self, ViewBuild::with)
    }
}

/// A node's agent Lease as podha saw it, renewed at `renewed_seen`, lasting the agents' 40 s.
pub fn agent_advert(renewed_seen: tokio::time::Instant) -> AgentAdvert {
    AgentAdvert {
        renew_time: None,
        renewed_seen,
        lasts: crate::contract::AGENT_LEASE_DURATION,
        heard_in_boot: None,
        heeds_hold: false,
        heeds_term: false,
        heeds_renewals: false,
        peers_unreachable: None,
        renewal_observed: true,
        resource_version: None,
    }
}

/// `node`'s agent Lease, as the agent writes it, renewed at unix second `renew_second`.
pub fn mk_agent_lease(node: &str, renew_second: i64) -> k8s_openapi::api::coordination::v1::Lease {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    Lease {
        metadata: ObjectMeta {
            name: Some(crate::contract::agent_lease_name(node)),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(
                Timestamp::from_second(renew_second).expect("a valid time"),
            )),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_with_files_each_object_where_decisions_look() {
        let view = view_with([
            mk_node("n1").into(),
            mk_pod("ns", "on-n1").on("n1").into(),
            mk_pod("ns", "unbound").into(),
            mk_pvc("ns", "data").bound_to("pv1").into(),
            mk_csi_pv("pv1", "rwo.sim.podha.io").into(),
            mk_va("csi-1", "rwo.sim.podha.io", "pv1", "n1")
                .attached(true)
                .into(),
            mk_namespace("ns").label("env", "prod").into(),
            mk_rs("ns", "web-1").owned_by_deployment("web").into(),
            mk_rs("ns", "bare").into(),
        ]);
        assert!(view.nodes.contains_key("n1"));
        let pods: Vec<String> = view.pods_on("n1").iter().map(|p| p.name_any()).collect();
        assert_eq!(pods, ["on-n1"]);
        assert_eq!(
            view.pods_by_node.len(),
            1,
            "a pod without a node is not in the view"
        );
        let pvc = view
            .pvc("ns", "data")
            .and_then(|c| c.spec.as_ref()?.volume_name.clone());
        assert_eq!(pvc.as_deref(), Some("pv1"));
        assert!(
            view.pv("pv1")
                .and_then(|pv| pv.spec.as_ref()?.csi.as_ref())
                .is_some()
        );
        let va = &view.attachments_on("n1")[0];
        assert_eq!(va.status.as_ref().map(|s| s.attached), Some(true));
        assert_eq!(view.namespace_labels["ns"]["env"], "prod");
        assert_eq!(
            view.replica_set_owners[&ObjectKey::new("ns", "web-1")],
            Some(OwnerKind::DEPLOYMENT)
        );
        assert_eq!(view.replica_set_owners[&ObjectKey::new("ns", "bare")], None);
    }

    #[test]
    fn pods_have_distinct_uids_unless_told() {
        assert_eq!(mk_pod("a", "p").metadata.uid.as_deref(), Some("uid-a-p"));
        assert_ne!(mk_pod("a", "p").metadata.uid, mk_pod("b", "p").metadata.uid);
        assert_eq!(
            mk_pod("a", "p").uid("u1").metadata.uid.as_deref(),
            Some("u1")
        );
    }

    #[test]
    fn spec_defaults_match_the_crd() {
        let spec = mk_spec();
        assert_eq!(
            spec.owners,
            [OwnerKind::STATEFUL_SET, OwnerKind::DEPLOYMENT]
        );
        assert_eq!(
            spec.volumes.access_modes,
            [AccessMode::ReadWriteOnce, AccessMode::ReadWriteOncePod]
        );
        assert!(spec.volumes.drivers.is_empty());
        assert!(spec.safety.require_target);
    }
}
