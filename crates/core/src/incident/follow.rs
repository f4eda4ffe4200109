//! How an incident advances from the cluster view once podha acted: the moved pods' volumes
//! leave the dead node (detach), then every moved pod has a replacement running on a healthy
//! node with its volumes attached there (recover).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::moved::{all_pods, node_of, va_volume};
use super::{Incident, PhaseChange, Replacement};
use crate::view::{ObjectKey, View};

impl Incident {
    /// Advances the phases from the current view; returns what changed. Nothing happens before
    /// the first action.
    pub fn follow(
        &mut self,
        now: Instant,
        view: &View,
        detach_timeout: Duration,
    ) -> Vec<PhaseChange> {
        let Some(acted_at) = self.acted_at else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        if self.detached_at.is_none() {
            self.still_attached = self.volumes_on_node(view);
            let waited = now.saturating_duration_since(acted_at);
            if self.still_attached.is_empty() {
                self.detached_at = Some(now);
                changes.push(PhaseChange::Detached { at: now });
            } else if self.timed_out_at.is_none() && waited > detach_timeout {
                self.timed_out_at = Some(now);
                changes.push(PhaseChange::DetachTimedOut {
                    waited,
                    volumes: self.still_attached.clone(),
                });
            }
        }
        if self.detached_at.is_some()
            && self.recovered_at.is_none()
            && let Some(replacements) = self.find_replacements(view)
        {
            for (pod, replacement) in self.moved.iter_mut().zip(replacements) {
                pod.replaced_by = Some(replacement);
            }
            self.recovered_at = Some(now);
            changes.push(PhaseChange::Recovered { at: now });
        }
        changes
    }

    /// Sorted, de-duplicated volumes still attached to the dead node that hold the failover
    /// back: the moved pods' volumes, or with nothing moved every attachment (named by its
    /// volume, or by itself for an inline spec).
    fn volumes_on_node(&self, view: &View) -> Vec<String> {
        let attachments = view.attachments_on(&self.node);
        let names: BTreeSet<String> = if self.moved.is_empty() {
            attachments
                .iter()
                .map(|va| {
                    va_volume(va)
                        .map(str::to_string)
                        .unwrap_or_else(|| va.metadata.name.clone().unwrap_or_default())
                })
                .collect()
        } else {
            let moved: BTreeSet<&str> = self
                .moved
                .iter()
                .flat_map(|m| m.pvs.iter().map(String::as_str))
                .collect();
            attachments
                .iter()
                .filter_map(|va| va_volume(va))
                .filter(|pv| moved.contains(pv))
                .map(str::to_string)
                .collect()
        };
        names.into_iter().collect()
    }

    /// A distinct replacement for every moved pod, in `moved` order, or `None` while one is
    /// missing. A replacement lives in the moved pod's namespace (one pass over the view groups
    /// the candidates) and passes [`MovedPod::replaced_by`]. Pods that could replace several
    /// moved pods (siblings of one ReplicaSet with the same claims) are interchangeable, so
    /// taking the first free match is enough.
    fn find_replacements(&self, view: &View) -> Option<Vec<Replacement>> {
        let mut by_namespace: BTreeMap<&str, Vec<&Pod>> = self
            .moved
            .iter()
            .map(|m| (m.key.namespace.as_str(), Vec::new()))
            .collect();
        for pod in all_pods(view) {
            if let Some(candidates) = pod
                .metadata
                .namespace
                .as_deref()
                .and_then(|ns| by_namespace.get_mut(ns))
            {
                candidates.push(pod);
            }
        }
        let mut taken: BTreeSet<&str> = BTreeSet::new();
        let mut found = Vec::with_capacity(self.moved.len());
        for moved in &self.moved {
            let candidates = by_namespace.get(moved.key.namespace.as_str())?;
            let pod = candidates.iter().find(|p| {
                p.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| !taken.contains(uid))
                    && moved.replaced_by(p, view)
            })?;
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            taken.insert(uid);
            found.push(Replacement {
                key: ObjectKey::new(
                    moved.key.namespace.clone(),
                    pod.metadata.name.clone().unwrap_or_default(),
                ),
                uid: uid.to_string(),
                node: node_of(pod).unwrap_or_default().to_string(),
            });
        }
        Some(found)
    }
}
