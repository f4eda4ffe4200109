//! The operator's picture of the cluster, kept up to date from watch events: the decision
//! [`View`], the policies, and per-node observations (lease renewals, Ready, gaps).
//!
//! Watch streams restart (`Init` … `InitDone`) after errors or expiry. While any stream that
//! feeds detection is re-listing, podha's view has a gap: detection re-baselines instead of
//! counting the missing updates as death: a renewal podha did not see is not a renewal that did
//! not happen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use crate::api::{ListedPolicy, OwnerKind, PodHAPolicy, UnreadablePolicy};
use crate::contract::{
    AGENT_HEARD_IN_BOOT_ANNOTATION, AGENT_HEEDS_HOLD_ANNOTATION, AGENT_HEEDS_RENEWALS_ANNOTATION,
    AGENT_HEEDS_TERM_ANNOTATION, AGENT_PEERS_UNREACHABLE_ANNOTATION, advertising_node,
};
use crate::health::{NodeObservations, ReadyStatus};
pub use crate::view::Watch;
use crate::view::{AgentAdvert, ObjectKey, View};

/// What podha sees of an agent Lease at `now`, given what it saw before: its node, renewed now
/// when its renewTime or its version changed (or it is new). `None` for a Lease that is no agent's advert
/// (named after another node than its holder).
fn seen_agent_lease(
    lease: &Lease,
    before: &BTreeMap<String, AgentAdvert>,
    now: Instant,
) -> Option<(String, AgentAdvert)> {
    let spec = lease.spec.as_ref();
    let name = lease.name_any();
    let node = advertising_node(&name, spec.and_then(|s| s.holder_identity.as_deref()))?;
    let renew_time = spec.and_then(|s| s.renew_time.clone());
    let lasts = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(Duration::ZERO, Duration::from_secs);
    // Any write counts as a renewal for the silence (a write that left renewTime as it was
    // still shows the agent runs, and moves the version the read before a taint compares).
    let resource_version = lease.metadata.resource_version.clone();
    let renewed_seen = match before.get(node) {
        Some(earlier)
            if earlier.renew_time == renew_time && earlier.resource_version == resource_version =>
        {
            earlier.renewed_seen
        }
        _ => now,
    };
    let renewal_observed = before
        .get(node)
        .is_some_and(|earlier| earlier.renewal_observed || earlier.renew_time != renew_time);
    let heard_in_boot = lease
        .annotations()
        .get(AGENT_HEARD_IN_BOOT_ANNOTATION)
        .filter(|boot| !boot.is_empty())
        .cloned();
    let says = |annotation: &str| {
        lease
            .annotations()
            .get(annotation)
            .is_some_and(|v| v == "true")
    };
    let heeds_hold = says(AGENT_HEEDS_HOLD_ANNOTATION);
    let heeds_term = says(AGENT_HEEDS_TERM_ANNOTATION);
    let heeds_renewals = says(AGENT_HEEDS_RENEWALS_ANNOTATION);
    let peers_unreachable = lease
        .annotations()
        .get(AGENT_PEERS_UNREACHABLE_ANNOTATION)
        .map(|said| counted_peers(said));
    let advert = AgentAdvert {
        renew_time,
        renewed_seen,
        lasts,
        heard_in_boot,
        heeds_hold,
        heeds_term,
        heeds_renewals,
        peers_unreachable,
        renewal_observed,
        resource_version,
    };
    Some((node.to_string(), advert))
}

/// What an agent says of its peers' answers (`"<answered>/<asked>"`), as podha repeats it in
/// events and explain: anything else is said as `?/?` (the word still holds the node).
fn counted_peers(said: &str) -> String {
    if crate::contract::parse_peer_count(said).is_some() {
        said.to_string()
    } else {
        "?/?".to_string()
    }
}

/// One watch event from any of podha's watches, or the failure of a watch.
#[derive(Debug)]
pub enum Change {
    Policy(Event<ListedPolicy>),
    Node(Event<Node>),
    Lease(Event<Lease>),
    Pod(Event<Pod>),
    Pvc(Event<PersistentVolumeClaim>),
    Pv(Event<PersistentVolume>),
    Va(Event<VolumeAttachment>),
    ReplicaSet(Event<PartialObjectMeta<ReplicaSet>>),
    Namespace(Event<PartialObjectMeta<Namespace>>),
    /// The agents' Leases in podha's namespace.
    AgentLease(Event<Lease>),
    /// A watch failed; it retries with backoff and re-lists.
    WatchError {
        watch: Watch,
    },
}

/// A store for one kind that swaps in a complete re-list at `InitDone`.
#[derive(Debug)]
struct Relist<K> {
    buffer: Option<Vec<K>>,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Self { buffer: None }
    }
}

/// What one event means for a keyed collection.
enum Step<K> {
    Upsert(K),
    Remove(K),
    Replace(Vec<K>),
    Nothing,
}

impl<K> Relist<K> {
    fn step(&mut self, event: Event<K>) -> Step<K> {
        match event {
            Event::Apply(k) => Step::Upsert(k),
            Event::Delete(k) => Step::Remove(k),
            Event::Init => {
                self.buffer = Some(Vec::new());
                Step::Nothing
            }
            Event::InitApply(k) => {
                self.buffer.get_or_insert_with(Vec::new).push(k);
                Step::Nothing
            }
            Event::InitDone => Step::Replace(self.buffer.take().unwrap_or_default()),
        }
    }

    fn relisting(&self) -> bool {
        self.buffer.is_some()
    }
}

/// Everything podha knows, updated one event at a time.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub view: View,
    pub policies: BTreeMap<String, Arc<PodHAPolicy>>,
    /// Policies podha cannot read (see [`ListedPolicy`]): it acts on none of their nodes and
    /// reports each on itself.
    pub unreadable_policies: BTreeMap<String, UnreadablePolicy>,
    pub observations: BTreeMap<String, NodeObservations>,
    /// Node of each bound pod, to move or drop it from `view.pods_by_node`.
    pod_nodes: HashMap<ObjectKey, String>,
    /// Node of each VolumeAttachment, likewise.
    va_nodes: HashMap<String, String>,
    /// Node of each agent Lease (by the Lease's name), likewise for `view.agent_adverts`.
    agent_lease_nodes: HashMap<String, String>,
    /// Watches that completed a list at least once.
    synced: BTreeMap<Watch, bool>,
    policies_relist: Relist<ListedPolicy>,
    nodes_relist: Relist<Node>,
    leases_relist: Relist<Lease>,
    pods_relist: Relist<Pod>,
    pvcs_relist: Relist<PersistentVolumeClaim>,
    pvs_relist: Relist<PersistentVolume>,
    vas_relist: Relist<VolumeAttachment>,
    rs_relist: Relist<PartialObjectMeta<ReplicaSet>>,
    ns_relist: Relist<PartialObjectMeta<Namespace>>,
    agent_leases_relist: Relist<Lease>,
    /// Watches that failed and have not re-listed since.
    broken: BTreeMap<Watch, bool>,
}

impl ClusterState {
    /// Every watch has completed its first list.
    pub fn synced(&self) -> bool {
        Watch::ALL
            .iter()
            .filter(|w| w.gates_sync())
            .all(|w| self.synced.get(w).copied().unwrap_or(false))
    }

    /// A detection watch is failing or re-listing: podha cannot see renewals right now.
    pub fn detection_gap(&self) -> bool {
        Watch::ALL.iter().filter(|w| w.feeds_detection()).any(|w| {
            self.broken.get(w).copied().unwrap_or(false)
                || !self.synced.get(w).copied().unwrap_or(false)
                || self.relisting(*w)
        })
    }

    fn relisting(&self, watch: Watch) -> bool {
        match watch {
            Watch::Node => self.nodes_relist.relisting(),
            Watch::Lease => self.leases_relist.relisting(),
            _ => false,
        }
    }

    /// Applies one change observed at `now`; returns the watch it came from.
    pub fn apply(&mut self, change: Change, now: Instant) -> Watch {
        let gap_before = self.detection_gap();
        let watch = match change {
            Change::Policy(e) => {
                self.apply_policy(e);
                Watch::Policy
            }
            Change::Node(e) => {
                self.apply_node(e, now);
                Watch::Node
            }
            Change::Lease(e) => {
                self.apply_lease(e, now);
                Watch::Lease
            }
            Change::Pod(e) => {
                self.apply_pod(e);
                Watch::Pod
            }
            Change::Pvc(e) => {
                self.apply_pvc(e);
                Watch::Pvc
            }
            Change::Pv(e) => {
                self.apply_pv(e);
                Watch::Pv
            }
            Change::Va(e) => {
                self.apply_va(e);
                Watch::Va
            }
            Change::ReplicaSet(e) => {
                self.apply_replica_set(e);
                Watch::ReplicaSet
            }
            Change::Namespace(e) => {
                self.apply_namespace(e);
                Watch::Namespace
            }
            Change::AgentLease(e) => {
                self.apply_agent_lease(e, now);
                Watch::AgentLease
            }
            Change::WatchError { watch } => {
                self.broken.insert(watch, true);
                watch
            }
        };
        let gap_after = self.detection_gap();
        if watch.feeds_detection() && gap_before != gap_after {
            for obs in self.observations.values_mut() {
                if gap_after {
                    obs.begin_gap(now);
                } else {
                    obs.end_gap(now);
                }
            }
        }
        watch
    }

    fn mark_synced(&mut self, watch: Watch) {
        self.synced.insert(watch, true);
        self.broken.insert(watch, false);
    }

    fn apply_policy(&mut self, event: Event<ListedPolicy>) {
        match self.policies_relist.step(event) {
            Step::Upsert(p) => self.keep_policy(p),
            Step::Remove(p) => {
                self.policies.remove(&p.name_any());
                self.unreadable_policies.remove(&p.name_any());
            }
            Step::Replace(all) => {
                self.policies.clear();
                self.unreadable_policies.clear();
                for p in all {
                    self.keep_policy(p);
                }
                self.mark_synced(Watch::Policy);
            }
            Step::Nothing => {}
        }
    }

    /// A policy as listed, where it belongs: a policy that became unreadable is no longer
    /// acted on as it was.
    fn keep_policy(&mut self, listed: ListedPolicy) {
        let name = listed.name_any();
        match listed {
            ListedPolicy::Valid(p) => {
                self.unreadable_policies.remove(&name);
                self.policies.insert(name, Arc::new(*p));
            }
            ListedPolicy::Unreadable(u) => {
                self.policies.remove(&name);
                self.unreadable_policies.insert(name, *u);
            }
        }
    }

    /// The observations of `node`, begun now (within the open gap, if any) when it is new.
    fn observations_of(&mut self, node: String, now: Instant) -> &mut NodeObservations {
        let in_gap = self.detection_gap();
        self.observations.entry(node).or_insert_with(|| {
            let mut obs = NodeObservations::new(now);
            if in_gap {
                obs.begin_gap(now);
            }
            obs
        })
    }

    fn observe_node(&mut self, node: &Node, now: Instant) {
        let tainted = crate::api::NodeTaint::ALL.iter().any(|t| t.on(node));
        let obs = self.observations_of(node.name_any(), now);
        obs.observe_ready(ReadyStatus::from_node(node), now);
        obs.observe_podha_taint(tainted, now);
        let boot_id = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        obs.observe_boot_id(boot_id.map(|i| i.boot_id.as_str()), now);
        let ack = node
            .annotations()
            .get(crate::contract::FENCE_ACK_ANNOTATION);
        obs.observe_fence_ack(ack.map(String::as_str));
    }

    fn apply_node(&mut self, event: Event<Node>, now: Instant) {
        match self.nodes_relist.step(event) {
            Step::Upsert(mut n) => {
                crate::runtime::trim::node(&mut n);
                self.observe_node(&n, now);
                self.view.nodes.insert(n.name_any(), Arc::new(n));
            }
            Step::Remove(n) => {
                self.view.nodes.remove(&n.name_any());
                self.observations.remove(&n.name_any());
            }
            Step::Replace(all) => {
                let mut nodes = BTreeMap::new();
                for mut n in all {
                    crate::runtime::trim::node(&mut n);
                    self.observe_node(&n, now);
                    nodes.insert(n.name_any(), Arc::new(n));
                }
                self.observations.retain(|name, _| nodes.contains_key(name));
                self.view.nodes = nodes;
                self.mark_synced(Watch::Node);
            }
            Step::Nothing => {}
        }
    }

    /// The Lease and Node watches are independent, so a Lease may be seen before its Node (at
    /// start, or for a node just added). Its renewTime is kept either way: dropped, the node's
    /// next renewal would pass for the first sighting and not count, and the Lease would look
    /// silent for a whole renew interval longer than it was.
    fn observe_lease(&mut self, lease: &Lease, now: Instant) {
        let renew = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
        let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
        let obs = self.observations_of(lease.name_any(), now);
        obs.observe_lease_duration(duration);
        obs.observe_lease(renew, now);
    }

    fn apply_lease(&mut self, event: Event<Lease>, now: Instant) {
        match self.leases_relist.step(event) {
            Step::Upsert(l) => self.observe_lease(&l, now),
            // The Lease of a node that is gone: nothing else will remove what it left.
            Step::Remove(l) => {
                if !self.view.nodes.contains_key(&l.name_any()) {
                    self.observations.remove(&l.name_any());
                }
            }
            Step::Nothing => {}
            Step::Replace(all) => {
                for l in &all {
                    self.observe_lease(l, now);
                }
                self.mark_synced(Watch::Lease);
            }
        }
    }

    fn apply_agent_lease(&mut self, event: Event<Lease>, now: Instant) {
        match self.agent_leases_relist.step(event) {
            Step::Upsert(l) => {
                let name = l.name_any();
                let seen = seen_agent_lease(&l, &self.view.agent_adverts, now);
                // No longer the advert it was (its holder changed): that node's is gone.
                if let Some(old) = self.agent_lease_nodes.get(&name)
                    && seen.as_ref().map(|(node, _)| node) != Some(old)
                {
                    self.view.agent_adverts.remove(old);
                    self.agent_lease_nodes.remove(&name);
                }
                if let Some((node, advert)) = seen {
                    self.agent_lease_nodes.insert(name, node.clone());
                    self.view.agent_adverts.insert(node, advert);
                }
            }
            Step::Remove(l) => {
                if let Some(node) = self.agent_lease_nodes.remove(&l.name_any()) {
                    self.view.agent_adverts.remove(&node);
                }
            }
            Step::Replace(all) => {
                let mut nodes = HashMap::new();
                let mut adverts = BTreeMap::new();
                for l in &all {
                    if let Some((node, advert)) = seen_agent_lease(l, &self.view.agent_adverts, now)
                    {
                        nodes.insert(l.name_any(), node.clone());
                        adverts.insert(node, advert);
                    }
                }
                self.agent_lease_nodes = nodes;
                self.view.agent_adverts = adverts;
                self.mark_synced(Watch::AgentLease);
            }
            Step::Nothing => {}
        }
    }

    fn unbind_pod(&mut self, key: &ObjectKey) {
        if let Some(node) = self.pod_nodes.remove(key)
            && let Some(pods) = self.view.pods_by_node.get_mut(&node)
        {
            pods.retain(|p| !same_key(p, key));
            if pods.is_empty() {
                self.view.pods_by_node.remove(&node);
            }
        }
    }

    fn bind_pod(&mut self, mut pod: Pod) {
        let key = pod_key(&pod);
        self.unbind_pod(&key);
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        crate::runtime::trim::pod(&mut pod);
        self.pod_nodes.insert(key, node.clone());
        self.view
            .pods_by_node
            .entry(node)
            .or_default()
            .push(Arc::new(pod));
    }

    fn apply_pod(&mut self, event: Event<Pod>) {
        match self.pods_relist.step(event) {
            Step::Upsert(p) => self.bind_pod(p),
            Step::Remove(p) => self.unbind_pod(&pod_key(&p)),
            Step::Replace(all) => {
                self.view.pods_by_node.clear();
                self.pod_nodes.clear();
                for p in all {
                    self.bind_pod(p);
                }
                self.mark_synced(Watch::Pod);
            }
            Step::Nothing => {}
        }
    }

    fn apply_pvc(&mut self, event: Event<PersistentVolumeClaim>) {
        let key = |c: &PersistentVolumeClaim| {
            ObjectKey::new(c.namespace().unwrap_or_default(), c.name_any())
        };
        match self.pvcs_relist.step(event) {
            Step::Upsert(mut c) => {
                crate::runtime::trim::pvc(&mut c);
                self.view.pvcs.insert(key(&c), Arc::new(c));
            }
            Step::Remove(c) => {
                self.view.pvcs.remove(&key(&c));
            }
            Step::Replace(all) => {
                self.view.pvcs = all
                    .into_iter()
                    .map(|mut c| {
                        crate::runtime::trim::pvc(&mut c);
                        (key(&c), Arc::new(c))
                    })
                    .collect();
                self.mark_synced(Watch::Pvc);
            }
            Step::Nothing => {}
        }
    }

    fn apply_pv(&mut self, event: Event<PersistentVolume>) {
        match self.pvs_relist.step(event) {
            Step::Upsert(mut v) => {
                crate::runtime::trim::pv(&mut v);
                self.view.pvs.insert(v.name_any(), Arc::new(v));
            }
            Step::Remove(v) => {
                self.view.pvs.remove(&v.name_any());
            }
            Step::Replace(all) => {
                self.view.pvs = all
                    .into_iter()
                    .map(|mut v| {
                        crate::runtime::trim::pv(&mut v);
                        (v.name_any(), Arc::new(v))
                    })
                    .collect();
                self.mark_synced(Watch::Pv);
            }
            Step::Nothing => {}
        }
    }

    fn unbind_va(&mut self, name: &str) {
        if let Some(node) = self.va_nodes.remove(name)
            && let Some(vas) = self.view.attachments_by_node.get_mut(&node)
        {
            vas.retain(|v| v.metadata.name.as_deref() != Some(name));
            if vas.is_empty() {
                self.view.attachments_by_node.remove(&node);
            }
        }
    }

    fn bind_va(&mut self, mut va: VolumeAttachment) {
        let name = va.name_any();
        self.unbind_va(&name);
        crate::runtime::trim::volume_attachment(&mut va);
        let node = va.spec.node_name.clone();
        self.va_nodes.insert(name, node.clone());
        self.view
            .attachments_by_node
            .entry(node)
            .or_default()
            .push(Arc::new(va));
    }

    fn apply_va(&mut self, event: Event<VolumeAttachment>) {
        match self.vas_relist.step(event) {
            Step::Upsert(v) => self.bind_va(v),
            Step::Remove(v) => self.unbind_va(&v.name_any()),
            Step::Replace(all) => {
                self.view.attachments_by_node.clear();
                self.va_nodes.clear();
                for v in all {
                    self.bind_va(v);
                }
                self.mark_synced(Watch::Va);
            }
            Step::Nothing => {}
        }
    }

    fn apply_replica_set(&mut self, event: Event<PartialObjectMeta<ReplicaSet>>) {
        let key = |rs: &PartialObjectMeta<ReplicaSet>| {
            ObjectKey::new(rs.namespace().unwrap_or_default(), rs.name_any())
        };
        match self.rs_relist.step(event) {
            Step::Upsert(rs) => {
                self.view
                    .replica_set_owners
                    .insert(key(&rs), controller_kind(&rs));
            }
            Step::Remove(rs) => {
                self.view.replica_set_owners.remove(&key(&rs));
            }
            Step::Replace(all) => {
                self.view.replica_set_owners = all
                    .iter()
                    .map(|rs| (key(rs), controller_kind(rs)))
                    .collect();
                self.mark_synced(Watch::ReplicaSet);
            }
            Step::Nothing => {}
        }
    }

    fn apply_namespace(&mut self, event: Event<PartialObjectMeta<Namespace>>) {
        match self.ns_relist.step(event) {
            Step::Upsert(ns) => {
                self.view
                    .namespace_labels
                    .insert(ns.name_any(), ns.labels().clone());
            }
            Step::Remove(ns) => {
                self.view.namespace_labels.remove(&ns.name_any());
            }
            Step::Replace(all) => {
                self.view.namespace_labels = all
                    .iter()
                    .map(|ns| (ns.name_any(), ns.labels().clone()))
                    .collect();
                self.mark_synced(Watch::Namespace);
            }
            Step::Nothing => {}
        }
    }
}

fn pod_key(pod: &Pod) -> ObjectKey {
    ObjectKey::new(pod.namespace().unwrap_or_default(), pod.name_any())
}

fn same_key(pod: &Pod, key: &ObjectKey) -> bool {
    pod.metadata.name.as_deref() == Some(key.name.as_str())
        && pod.metadata.namespace.as_deref() == Some(key.namespace.as_str())
}

/// The controller kind of a ReplicaSet, as podha counts it (only Deployments matter).
fn controller_kind(rs: &PartialObjectMeta<ReplicaSet>) -> Option<OwnerKind> {
    crate::eligibility::replica_set_controller(&rs.metadata)
}

#[cfg(test)]
mod tests;
