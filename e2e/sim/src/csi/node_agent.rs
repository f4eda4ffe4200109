//! The node agent: the storage half of a kubelet, for one node.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::Duration,
};

use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::{
        core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
        storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde_json::json;
use tokio::time::Instant;

use super::{
    DRIVERS, VOLUMES_READY_ANNOTATION, is_already_exists, is_not_found, unique_volume_name,
};

/// Node annotation the kubelet sets (with `--enable-controller-attach-detach`, the default);
/// the attach/detach controller ignores nodes without it.
pub(super) const CONTROLLER_MANAGED_ATTACH_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
/// Node annotation the kubelet keeps as a JSON map of CSI driver name to node ID.
pub(super) const NODE_ID_MAP_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// Retry period after a failed write.
const WRITE_RETRY: Duration = Duration::from_secs(1);
/// Recompute now and then even without events, as the kubelet's periodic syncs do.
const RESYNC: Duration = Duration::from_secs(30);

/// The objects the agent decides from.
#[derive(Default)]
pub(super) struct World<'a> {
    pub node_name: &'a str,
    pub node: Option<&'a Node>,
    pub csinode: Option<&'a CSINode>,
    /// Pods bound to this node.
    pub pods: Vec<&'a Pod>,
    /// Claims by (namespace, name).
    pub claims: HashMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    /// PersistentVolumes by name.
    pub volumes: HashMap<&'a str, &'a PersistentVolume>,
    pub attachments: Vec<&'a VolumeAttachment>,
}

/// A CSI persistent volume a pod uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CsiVolume {
    pub pv: String,
    pub driver: String,
    pub handle: String,
}

impl CsiVolume {
    pub fn unique_name(&self) -> String {
        unique_volume_name(&self.driver, &self.handle)
    }
}

/// A write the agent wants.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum NodeIntent {
    /// Set these annotations on the Node.
    AnnotateNode(BTreeMap<String, String>),
    /// Create the node's CSINode with these drivers.
    CreateCsiNode {
        node_uid: String,
        drivers: Vec<CSINodeDriver>,
    },
    /// Replace the drivers of the existing CSINode.
    SetCsiNodeDrivers(Vec<CSINodeDriver>),
    /// Set `node.status.volumesInUse`.
    SetVolumesInUse(Vec<String>),
    /// Annotate the pod with [`VOLUMES_READY_ANNOTATION`].
    MarkPodReady {
        namespace: String,
        name: String,
        uid: String,
    },
}

/// Why a pod's volumes cannot be used yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Readiness {
    Ready,
    Waiting(String),
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The CSI persistent volumes of `pod`, or why they cannot be resolved yet (claim missing or
/// unbound, PV missing), as the kubelet's volume manager resolves them. Non-CSI volumes are
/// left out.
pub(super) fn pod_volumes(pod: &Pod, world: &World<'_>) -> Result<Vec<CsiVolume>, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.name_any();
    let mut out = Vec::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let claim_name = match (&volume.persistent_volume_claim, &volume.ephemeral) {
            (Some(pvc), _) => pvc.claim_name.clone(),
            // Generic ephemeral volumes get a claim named <pod>-<volume>.
            (None, Some(_)) => format!("{pod_name}-{}", volume.name),
            (None, None) => continue,
        };
        let Some(claim) = world.claims.get(&(namespace, claim_name.as_str())) else {
            return Err(format!("claim {namespace}/{claim_name} not found"));
        };
        let Some(pv_name) = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
        else {
            return Err(format!("claim {namespace}/{claim_name} is not bound"));
        };
        let Some(pv) = world.volumes.get(pv_name) else {
            return Err(format!("volume {pv_name} not found"));
        };
        let spec = pv.spec.as_ref();
        let bound_uid = spec
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref());
        if bound_uid.is_some_and(|uid| Some(uid) != claim.metadata.uid.as_deref()) {
            return Err(format!("volume {pv_name} is bound to another claim"));
        }
        if let Some(csi) = spec.and_then(|s| s.csi.as_ref()) {
            out.push(CsiVolume {
                pv: pv_name.to_owned(),
                driver: csi.driver.clone(),
                handle: csi.volume_handle.clone(),
            });
        }
    }
    Ok(out)
}

/// `node.status.volumesInUse` as the kubelet reports it: every resolvable CSI volume of every
/// pod bound to the node that has not terminated (a pod being deleted still has its volumes
/// mounted until it is gone), sorted and without duplicates.
pub(super) fn desired_volumes_in_use(world: &World<'_>) -> Vec<String> {
    let names: BTreeSet<String> = world
        .pods
        .iter()
        .filter(|pod| on_node(pod, world.node_name) && !is_terminal(pod))
        .filter_map(|pod| pod_volumes(pod, world).ok())
        .flatten()
        .map(|v| v.unique_name())
        .collect();
    names.into_iter().collect()
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Whether the kubelet would mount `pod`'s volumes now: each CSI volume is reported in use by
/// this node, listed in `node.status.volumesAttached` by the attach/detach controller, and has
/// an attached VolumeAttachment for this node and its PV.
pub(super) fn pod_readiness(pod: &Pod, world: &World<'_>) -> Readiness {
    let volumes = match pod_volumes(pod, world) {
        Ok(v) => v,
        Err(reason) => return Readiness::Waiting(reason),
    };
    if volumes.is_empty() {
        return Readiness::Ready;
    }
    let Some(status) = world.node.and_then(|n| n.status.as_ref()) else {
        return Readiness::Waiting("node status not seen yet".to_owned());
    };
    for volume in &volumes {
        let unique = volume.unique_name();
        if !status.volumes_in_use.iter().flatten().any(|v| *v == unique) {
            return Readiness::Waiting(format!("{unique} not reported in use yet"));
        }
        if !status
            .volumes_attached
            .iter()
            .flatten()
            .any(|v| v.name == unique)
        {
            return Readiness::Waiting(format!("{unique} not in node.status.volumesAttached"));
        }
        let attached = world.attachments.iter().any(|va| {
            va.spec.node_name == world.node_name
                && va.spec.attacher == volume.driver
                && va.spec.source.persistent_volume_name.as_deref() == Some(volume.pv.as_str())
                && va.metadata.deletion_timestamp.is_none()
                && va.status.as_ref().is_some_and(|s| s.attached)
        });
        if !attached {
            return Readiness::Waiting(format!("no attached VolumeAttachment for {}", volume.pv));
        }
    }
    Readiness::Ready
}

/// The driver entries this node registers in its CSINode.
fn our_drivers(node: &str) -> Vec<CSINodeDriver> {
    DRIVERS
        .iter()
        .map(|d| CSINodeDriver {
            name: (*d).to_owned(),
            node_id: node.to_owned(),
            topology_keys: Some(Vec::new()),
            allocatable: None,
        })
        .collect()
}

/// Node annotations to set (only the ones missing or different).
fn node_annotations(node: &Node, node_name: &str) -> BTreeMap<String, String> {
    let current = node.annotations();
    let mut ids: serde_json::Map<String, serde_json::Value> = current
        .get(NODE_ID_MAP_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    for d in DRIVERS {
        ids.insert(d.to_owned(), json!(node_name));
    }
    let wanted = [
        (CONTROLLER_MANAGED_ATTACH_ANNOTATION, "true".to_owned()),
        (
            NODE_ID_MAP_ANNOTATION,
            serde_json::Value::Object(ids).to_string(),
        ),
    ];
    wanted
        .into_iter()
        .filter(|(k, v)| current.get(*k) != Some(v))
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// Everything the agent should write now, given `world`. Nothing until the Node exists (the
/// cluster creates it; the agent only decorates it).
pub(super) fn plan(world: &World<'_>) -> Vec<NodeIntent> {
    let Some(node) = world.node else {
        return Vec::new();
    };
    let mut intents = Vec::new();

    let annotations = node_annotations(node, world.node_name);
    if !annotations.is_empty() {
        intents.push(NodeIntent::AnnotateNode(annotations));
    }

    let ours = our_drivers(world.node_name);
    match world.csinode {
        None => intents.push(NodeIntent::CreateCsiNode {
            node_uid: node.metadata.uid.clone().unwrap_or_default(),
            drivers: ours,
        }),
        Some(csinode) => {
            let registered = ours.iter().all(|want| {
                csinode
                    .spec
                    .drivers
                    .iter()
                    .any(|d| d.name == want.name && d.node_id == want.node_id)
            });
            if !registered {
                let mut drivers: Vec<CSINodeDriver> = csinode
                    .spec
                    .drivers
                    .iter()
                    .filter(|d| !DRIVERS.contains(&d.name.as_str()))
                    .cloned()
                    .collect();
                drivers.extend(ours);
                intents.push(NodeIntent::SetCsiNodeDrivers(drivers));
            }
        }
    }

    let in_use = desired_volumes_in_use(world);
    let mut current: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default();
    current.sort();
    if current != in_use {
        intents.push(NodeIntent::SetVolumesInUse(in_use));
    }

    for pod in &world.pods {
        let marked = pod
            .annotations()
            .get(VOLUMES_READY_ANNOTATION)
            .is_some_and(|v| v == "true");
        if marked
            || !on_node(pod, world.node_name)
            || is_terminal(pod)
            || pod.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        match pod_readiness(pod, world) {
            Readiness::Ready => intents.push(NodeIntent::MarkPodReady {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
            }),
            Readiness::Waiting(reason) => {
                tracing::debug!(pod = %pod.name_any(), %reason, "volumes not ready");
            }
        }
    }
    intents
}

/// The agent's caches.
struct Stores {
    nodes: Store<Node>,
    csinodes: Store<CSINode>,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    attachments: Store<VolumeAttachment>,
}

impl Stores {
    /// The caches of what the node's kubelet would watch, and the stream that keeps them
    /// up to date.
    fn watch(
        client: &Client,
        node_name: &str,
    ) -> (
        Stores,
        futures::stream::SelectAll<BoxStream<'static, Result<(), watcher::Error>>>,
    ) {
        let by_name = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
        let (nodes, s1) = reflect(Api::<Node>::all(client.clone()), by_name.clone());
        let (csinodes, s2) = reflect(Api::<CSINode>::all(client.clone()), by_name);
        let (pods, s3) = reflect(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        );
        let (claims, s4) = reflect(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            Default::default(),
        );
        let (volumes, s5) = reflect(
            Api::<PersistentVolume>::all(client.clone()),
            Default::default(),
        );
        let (attachments, s6) = reflect(
            Api::<VolumeAttachment>::all(client.clone()),
            Default::default(),
        );
        let stores = Stores {
            nodes,
            csinodes,
            pods,
            claims,
            volumes,
            attachments,
        };
        let events = futures::stream::select_all([s1, s2, s3, s4, s5, s6]);
        (stores, events)
    }

    /// What the node should do now, from the caches; forgets the marks of pods that are gone.
    fn intents(&self, node_name: &str, marked: &mut HashSet<String>) -> Vec<NodeIntent> {
        let node = self.nodes.get(&reflector::ObjectRef::new(node_name));
        let csinode = self.csinodes.get(&reflector::ObjectRef::new(node_name));
        let pods = self.pods.state();
        let claims = self.claims.state();
        let volumes = self.volumes.state();
        let attachments = self.attachments.state();
        let world = World {
            node_name,
            node: node.as_deref(),
            csinode: csinode.as_deref(),
            pods: pods.iter().map(|p| &**p).collect(),
            claims: claims
                .iter()
                .map(|c| {
                    let key = (
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default(),
                    );
                    (key, &**c)
                })
                .collect(),
            volumes: volumes
                .iter()
                .map(|v| (v.metadata.name.as_deref().unwrap_or_default(), &**v))
                .collect(),
            attachments: attachments.iter().map(|a| &**a).collect(),
        };
        let present: HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        marked.retain(|uid| present.contains(uid));
        plan(&world)
    }

    fn ready(&self) -> bool {
        fn ready<K: kube::Resource + Clone>(s: &Store<K>) -> bool
        where
            K::DynamicType: std::hash::Hash + Eq + Clone,
        {
            matches!(s.wait_until_ready().now_or_never(), Some(Ok(())))
        }
        ready(&self.nodes)
            && ready(&self.csinodes)
            && ready(&self.pods)
            && ready(&self.claims)
            && ready(&self.volumes)
            && ready(&self.attachments)
    }
}

/// A watch on `api` with `cfg`, reflected into a new store.
fn reflect<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> (Store<K>, BoxStream<'static, Result<(), watcher::Error>>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, cfg)
        .default_backoff()
        .reflect(writer)
        .map(|ev| ev.map(drop))
        .boxed();
    (store, stream)
}

async fn apply(client: &Client, node_name: &str, intent: &NodeIntent) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    let nodes = Api::<Node>::all(client.clone());
    let csinodes = Api::<CSINode>::all(client.clone());
    match intent {
        NodeIntent::AnnotateNode(annotations) => {
            let patch = Patch::Merge(json!({ "metadata": { "annotations": annotations } }));
            nodes.patch(node_name, &pp, &patch).await?;
        }
        NodeIntent::CreateCsiNode { node_uid, drivers } => {
            let csinode = CSINode {
                metadata: ObjectMeta {
                    name: Some(node_name.to_owned()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".to_owned(),
                        kind: "Node".to_owned(),
                        name: node_name.to_owned(),
                        uid: node_uid.clone(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: drivers.clone(),
                },
            };
            match csinodes.create(&PostParams::default(), &csinode).await {
                Ok(_) => tracing::info!(node = node_name, "registered drivers in new CSINode"),
                // Our cache is behind; the next round patches it if needed.
                Err(e) if is_already_exists(&e) => {}
                Err(e) => return Err(e),
            }
        }
        NodeIntent::SetCsiNodeDrivers(drivers) => {
            let patch = Patch::Merge(json!({ "spec": { "drivers": drivers } }));
            csinodes.patch(node_name, &pp, &patch).await?;
            tracing::info!(node = node_name, "registered drivers in CSINode");
        }
        NodeIntent::SetVolumesInUse(volumes) => {
            // A merge patch of this one field: kwok's heartbeats own the rest of the status.
            let patch = Patch::Merge(json!({ "status": { "volumesInUse": volumes } }));
            nodes.patch_status(node_name, &pp, &patch).await?;
            tracing::info!(node = node_name, ?volumes, "volumesInUse");
        }
        NodeIntent::MarkPodReady {
            namespace, name, ..
        } => {
            let patch = Patch::Merge(
                json!({ "metadata": { "annotations": { VOLUMES_READY_ANNOTATION: "true" } } }),
            );
            match Api::<Pod>::namespaced(client.clone(), namespace)
                .patch(name, &pp, &patch)
                .await
            {
                Ok(_) => tracing::info!(node = node_name, pod = %name, %namespace, "volumes ready"),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Watches what the node's kubelet would watch and applies [`plan`] on every change.
pub(super) async fn run(client: Client, node_name: String) -> anyhow::Result<()> {
    let (stores, mut events) = Stores::watch(&client, &node_name);

    // Pods annotated by us whose update our cache may not show yet, by UID.
    let mut marked: HashSet<String> = HashSet::new();
    let mut retry_at: Option<Instant> = None;
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                None => anyhow::bail!("node agent watches ended"),
                Some(Err(e)) => tracing::warn!(node = %node_name, error = %e, "watch"),
                Some(Ok(())) => {}
            },
            () = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {}
            _ = resync.tick() => {}
        }
        // Decide once per burst of events.
        while let Some(Some(ev)) = events.next().now_or_never() {
            if let Err(e) = ev {
                tracing::warn!(node = %node_name, error = %e, "watch");
            }
        }
        if !stores.ready() {
            continue;
        }
        let intents = stores.intents(&node_name, &mut marked);
        retry_at = None;
        for intent in intents {
            if let NodeIntent::MarkPodReady { uid, .. } = &intent
                && marked.contains(uid)
            {
                continue;
            }
            match apply(&client, &node_name, &intent).await {
                Ok(()) => {
                    if let NodeIntent::MarkPodReady { uid, .. } = intent {
                        marked.insert(uid);
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node_name, error = %e, ?intent, "write failed; retrying");
                    retry_at = Some(Instant::now() + WRITE_RETRY);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{
        core::v1::{
            AttachedVolume, CSIPersistentVolumeSource, EphemeralVolumeSource, NodeStatus,
            ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
            PersistentVolumeSpec, PodSpec, PodStatus, Volume,
        },
        storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus},
    };

    use super::*;
    use crate::csi::{OTHER_DRIVER, RWO_DRIVER};

    const N: &str = "node-1";

    fn meta(ns: Option<&str>, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: ns.map(Into::into),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        }
    }

    fn pod(name: &str, node: &str, claims: &[&str]) -> Pod {
        let mut volumes: Vec<Volume> = claims
            .iter()
            .map(|c| Volume {
                name: format!("v-{c}"),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: (*c).into(),
                    read_only: None,
                }),
                ..Volume::default()
            })
            .collect();
        volumes.push(Volume {
            name: "scratch".into(),
            empty_dir: Some(Default::default()),
            ..Volume::default()
        });
        Pod {
            metadata: meta(Some("ns"), name),
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                volumes: Some(volumes),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..PodStatus::default()
            }),
        }
    }

    fn claim(name: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: meta(Some("ns"), name),
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: volume.map(Into::into),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        }
    }

    fn csi_pv(name: &str, claim: &str, driver: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: meta(None, name),
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    uid: Some(format!("uid-{claim}")),
                    ..Default::default()
                }),
                csi: Some(CSIPersistentVolumeSource {
                    driver: driver.into(),
                    volume_handle: format!("h-{name}"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn va(pv: &str, node: &str, driver: &str, attached: bool) -> VolumeAttachment {
        VolumeAttachment {
            metadata: meta(None, &format!("csi-{pv}-{node}")),
            spec: VolumeAttachmentSpec {
                attacher: driver.into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.into()),
                    ..Default::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached,
                ..Default::default()
            }),
        }
    }

    fn node(in_use: &[&str], attached: &[&str]) -> Node {
        let mut meta = meta(None, N);
        meta.annotations = Some(BTreeMap::from([
            (CONTROLLER_MANAGED_ATTACH_ANNOTATION.into(), "true".into()),
            (
                NODE_ID_MAP_ANNOTATION.into(),
                json!({ OTHER_DRIVER: N, RWO_DRIVER: N }).to_string(),
            ),
        ]));
        Node {
            metadata: meta,
            spec: None,
            status: Some(NodeStatus {
                volumes_in_use: Some(in_use.iter().map(|v| (*v).to_owned()).collect()),
                volumes_attached: Some(
                    attached
                        .iter()
                        .map(|v| AttachedVolume {
                            name: (*v).into(),
                            device_path: String::new(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    fn csinode() -> CSINode {
        CSINode {
            metadata: meta(None, N),
            spec: CSINodeSpec {
                drivers: our_drivers(N),
            },
        }
    }

    /// Test fixtures owned in one place, borrowed by a [`World`].
    struct Fixture {
        node: Node,
        csinode: Option<CSINode>,
        pods: Vec<Pod>,
        claims: Vec<PersistentVolumeClaim>,
        volumes: Vec<PersistentVolume>,
        attachments: Vec<VolumeAttachment>,
    }

    impl Fixture {
        /// db-0 uses data-0 (bound to pv-0, rwo driver); nothing attached yet.
        fn new() -> Self {
            Self {
                node: node(&[], &[]),
                csinode: Some(csinode()),
                pods: vec![pod("db-0", N, &["data-0"])],
                claims: vec![claim("data-0", Some("pv-0"))],
                volumes: vec![csi_pv("pv-0", "data-0", RWO_DRIVER)],
                attachments: vec![],
            }
        }

        fn world(&self) -> World<'_> {
            World {
                node_name: N,
                node: Some(&self.node),
                csinode: self.csinode.as_ref(),
                pods: self.pods.iter().collect(),
                claims: self
                    .claims
                    .iter()
                    .map(|c| {
                        (
                            (
                                c.metadata.namespace.as_deref().unwrap(),
                                c.metadata.name.as_deref().unwrap(),
                            ),
                            c,
                        )
                    })
                    .collect(),
                volumes: self
                    .volumes
                    .iter()
                    .map(|v| (v.metadata.name.as_deref().unwrap(), v))
                    .collect(),
                attachments: self.attachments.iter().collect(),
            }
        }
    }

    const PV0: &str = "kubernetes.io/csi/rwo.sim.podha.io^h-pv-0";

    #[test]
    fn volumes_in_use_lists_csi_volumes_of_live_pods_on_the_node() {
        let mut f = Fixture::new();
        f.pods.push(pod("other-node", "node-2", &["data-1"]));
        f.pods.push(pod("web", N, &[])); // emptyDir only
        f.pods.push(pod("db-1", N, &["data-1", "data-0"])); // shares data-0 (RWX-like)
        f.claims.push(claim("data-1", Some("pv-1")));
        f.volumes.push(csi_pv("pv-1", "data-1", OTHER_DRIVER));
        assert_eq!(
            desired_volumes_in_use(&f.world()),
            vec![
                "kubernetes.io/csi/other.sim.podha.io^h-pv-1".to_owned(),
                PV0.to_owned()
            ]
        );
    }

    #[test]
    fn terminal_and_unresolvable_pods_use_no_volumes_but_terminating_ones_do() {
        let mut f = Fixture::new();
        f.pods[0].status.as_mut().unwrap().phase = Some("Succeeded".into());
        f.pods.push(pod("pending-claim", N, &["unbound"]));
        f.claims.push(claim("unbound", None));
        f.pods.push(pod("missing-claim", N, &["nope"]));
        assert!(desired_volumes_in_use(&f.world()).is_empty());

        let mut f = Fixture::new();
        f.pods[0].metadata.deletion_timestamp = Some(crate::csi::tests::epoch());
        assert_eq!(desired_volumes_in_use(&f.world()), vec![PV0.to_owned()]);
    }

    #[test]
    fn ephemeral_volumes_resolve_through_their_generated_claim() {
        let mut f = Fixture::new();
        f.pods[0].spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "scratch".into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Volume::default()
        }]);
        f.claims = vec![claim("db-0-scratch", Some("pv-0"))];
        f.volumes = vec![csi_pv("pv-0", "db-0-scratch", RWO_DRIVER)];
        assert_eq!(desired_volumes_in_use(&f.world()), vec![PV0.to_owned()]);
    }

    #[test]
    fn pv_bound_to_another_claim_is_not_resolved() {
        let mut f = Fixture::new();
        f.volumes = vec![csi_pv("pv-0", "someone-else", RWO_DRIVER)];
        assert!(pod_volumes(&f.pods[0], &f.world()).is_err());
    }

    #[test]
    fn pod_waits_for_in_use_then_attached_on_this_node() {
        let mut f = Fixture::new();
        let waiting =
            |f: &Fixture| matches!(pod_readiness(&f.pods[0], &f.world()), Readiness::Waiting(_));
        assert!(waiting(&f));
        f.node = node(&[PV0], &[]);
        assert!(waiting(&f));
        f.node = node(&[PV0], &[PV0]);
        assert!(waiting(&f), "no VA yet");
        f.attachments.push(va("pv-0", "node-2", RWO_DRIVER, true));
        assert!(waiting(&f), "attached to another node (multi-attach)");
        f.attachments.push(va("pv-0", N, RWO_DRIVER, false));
        assert!(waiting(&f), "not attached yet");
        f.attachments
            .last_mut()
            .unwrap()
            .status
            .as_mut()
            .unwrap()
            .attached = true;
        assert_eq!(pod_readiness(&f.pods[0], &f.world()), Readiness::Ready);
        f.attachments
            .last_mut()
            .unwrap()
            .metadata
            .deletion_timestamp = Some(crate::csi::tests::epoch());
        assert!(waiting(&f), "attachment being deleted");
    }

    #[test]
    fn pods_without_csi_volumes_are_ready_at_once() {
        let mut f = Fixture::new();
        f.pods = vec![pod("web", N, &[])];
        assert_eq!(pod_readiness(&f.pods[0], &f.world()), Readiness::Ready);
        assert!(
            matches!(&plan(&f.world())[..], [NodeIntent::MarkPodReady { name, .. }] if name == "web")
        );
    }

    #[test]
    fn steady_state_plans_nothing() {
        let mut f = Fixture::new();
        f.node = node(&[PV0], &[PV0]);
        f.attachments.push(va("pv-0", N, RWO_DRIVER, true));
        f.pods[0].metadata.annotations = Some(BTreeMap::from([(
            VOLUMES_READY_ANNOTATION.into(),
            "true".into(),
        )]));
        assert_eq!(plan(&f.world()), vec![]);
    }

    #[test]
    fn plan_reports_volumes_in_use_and_marks_ready_pods() {
        let mut f = Fixture::new();
        assert_eq!(
            plan(&f.world()),
            vec![NodeIntent::SetVolumesInUse(vec![PV0.into()])]
        );
        f.node = node(&[PV0], &[PV0]);
        f.attachments.push(va("pv-0", N, RWO_DRIVER, true));
        assert_eq!(
            plan(&f.world()),
            vec![NodeIntent::MarkPodReady {
                namespace: "ns".into(),
                name: "db-0".into(),
                uid: "uid-db-0".into()
            }]
        );
        // The pod is gone: the volume is no longer in use.
        f.pods.clear();
        assert_eq!(plan(&f.world()), vec![NodeIntent::SetVolumesInUse(vec![])]);
    }

    #[test]
    fn plan_registers_the_node_for_attach_detach_and_csi() {
        let mut f = Fixture::new();
        f.pods.clear();
        f.node.metadata.annotations = Some(BTreeMap::from([(
            NODE_ID_MAP_ANNOTATION.into(),
            json!({ "ebs.csi.aws.com": "i-1" }).to_string(),
        )]));
        f.csinode = None;
        let intents = plan(&f.world());
        let NodeIntent::AnnotateNode(annotations) = &intents[0] else {
            panic!("{intents:?}")
        };
        assert_eq!(annotations[CONTROLLER_MANAGED_ATTACH_ANNOTATION], "true");
        let ids: serde_json::Value =
            serde_json::from_str(&annotations[NODE_ID_MAP_ANNOTATION]).unwrap();
        assert_eq!(
            ids,
            json!({ "ebs.csi.aws.com": "i-1", RWO_DRIVER: N, OTHER_DRIVER: N })
        );
        assert_eq!(
            intents[1],
            NodeIntent::CreateCsiNode {
                node_uid: "uid-node-1".into(),
                drivers: our_drivers(N)
            }
        );

        // An existing CSINode keeps other drivers and gains ours.
        let foreign = CSINodeDriver {
            name: "ebs.csi.aws.com".into(),
            node_id: "i-1".into(),
            ..Default::default()
        };
        f.csinode = Some(CSINode {
            metadata: meta(None, N),
            spec: CSINodeSpec {
                drivers: vec![foreign.clone()],
            },
        });
        let mut want = vec![foreign];
        want.extend(our_drivers(N));
        assert!(plan(&f.world()).contains(&NodeIntent::SetCsiNodeDrivers(want)));
    }

    #[test]
    fn nothing_before_the_node_exists() {
        let f = Fixture::new();
        let mut world = f.world();
        world.node = None;
        assert!(plan(&world).is_empty());
    }
}
