//! Follows one failover after podha acted on a dead node: the moved pods' VolumeAttachments
//! leave the dead node (detach), then each moved pod has a replacement running on a healthy node
//! with its volumes attached there (recover). Pure: the runtime feeds it views and instants and
//! turns what changed into events, metrics and status.
//!
//! Rules:
//! - **Detached** when no VolumeAttachment on the dead node attaches a volume of a moved pod.
//!   Attachments of other volumes do not count: they belong to pods podha left alone.
//!   Attachments of inline volume specs name no PersistentVolume and are ignored. When nothing
//!   was moved (only the out-of-service taint was added), detached means no VolumeAttachment at
//!   all remains on the node: with the taint the attach/detach controller frees every volume
//!   there, and it is the same test that allows removing the taint.
//! - **Recovered** when every moved pod has a replacement (see [`MovedPod`]), never before
//!   detached. When nothing was moved it is recovered as soon as it is detached.
//! - **Detach timed out** once more than `detachTimeout` has passed since the first action
//!   without a detach; reported once. A later detach is still recorded, and the failover goes on.
//! - Phase timestamps are written once, so each event and metric fires once and repeated updates
//!   with the same view change nothing. A pod recorded after recovery is listed, not tracked.

mod moved;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

pub use moved::{MovedPod, OwnerRef, Replacement};

use crate::api::{FailoverPhase, FailoverRecord, HumanDuration};
use crate::metrics::Phase;
use crate::view::{ObjectKey, View};
use moved::{all_pods, node_of, va_volume};

/// A step a failover took, as returned by [`Failover::record_action`] and [`Failover::update`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhaseChange {
    /// The first action (taint or pod deletion).
    Acted { at: Instant },
    /// The moved pods' volumes left the dead node.
    Detached { at: Instant },
    /// Every moved pod has a replacement running with its volumes attached.
    Recovered { at: Instant },
    /// `detachTimeout` passed without a detach; `volumes` are still attached to the dead node.
    DetachTimedOut {
        waited: Duration,
        volumes: Vec<String>,
    },
}

impl PhaseChange {
    /// The metric phases this step completes.
    pub const fn completes(&self) -> &'static [Phase] {
        match self {
            Self::Acted { .. } => &[Phase::Detect, Phase::Act],
            Self::Detached { .. } => &[Phase::Detach],
            Self::Recovered { .. } => &[Phase::Recover, Phase::Total],
            Self::DetachTimedOut { .. } => &[],
        }
    }
}

/// One node failure, from judgement to recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    pub node: String,
    pub policy: String,
    /// Last time the node was seen alive on the operator's clock, if known.
    pub last_seen_alive: Option<Instant>,
    /// When the node was judged Failed.
    pub detected_at: Instant,
    /// The first action: a taint or a pod deletion.
    pub acted_at: Option<Instant>,
    /// Pods podha deleted, in the order it deleted them.
    pub moved: Vec<MovedPod>,
    pub detached_at: Option<Instant>,
    pub recovered_at: Option<Instant>,
    /// When the detach timeout was reported.
    pub timed_out_at: Option<Instant>,
    /// Volumes (or, for an inline spec, VolumeAttachments) still holding the dead node, as of
    /// the last update before the detach; empty once detached.
    pub still_attached: Vec<String>,
    /// Why actions are held, while no action was taken.
    pub held: Option<String>,
    /// When the node was seen healthy again, if before recovery.
    pub node_returned_at: Option<Instant>,
}

impl Failover {
    pub fn new(
        node: impl Into<String>,
        policy: impl Into<String>,
        last_seen_alive: Option<Instant>,
        detected_at: Instant,
    ) -> Self {
        Self {
            node: node.into(),
            policy: policy.into(),
            last_seen_alive,
            detected_at,
            acted_at: None,
            moved: Vec::new(),
            detached_at: None,
            recovered_at: None,
            timed_out_at: None,
            still_attached: Vec::new(),
            held: None,
            node_returned_at: None,
        }
    }

    /// Notes an action this process did not take: podha's taint on the node, put there by
    /// another replica or an earlier process (which observed its act phase itself). The
    /// failover is past Acting even if nothing is left to do here (Kubernetes' pod GC may have
    /// removed the pods the taint let go); its detach and recover phases count from now.
    pub fn adopt_action(&mut self, now: Instant) {
        if self.acted_at.is_none() {
            self.acted_at = Some(now);
            self.held = None;
        }
    }

    /// Records an action: the taint (`moved: None`) or a pod deletion. Returns
    /// [`PhaseChange::Acted`] for the first one only. A pod already recorded (same UID) is not
    /// added twice.
    pub fn record_action(&mut self, now: Instant, moved: Option<MovedPod>) -> Option<PhaseChange> {
        if let Some(pod) = moved
            && !self.moved.iter().any(|m| m.uid == pod.uid)
        {
            self.moved.push(pod);
        }
        if self.acted_at.is_some() {
            return None;
        }
        self.acted_at = Some(now);
        self.held = None;
        Some(PhaseChange::Acted { at: now })
    }

    /// Notes that actions are held (safety limit, dry run); shown until an action is taken.
    pub fn record_hold(&mut self, reason: impl Into<String>) {
        if self.acted_at.is_none() {
            self.held = Some(reason.into());
        }
    }

    /// Notes that the node is healthy again. Tracking goes on: a late detach or recovery is
    /// still recorded.
    pub fn record_node_returned(&mut self, now: Instant) {
        if self.recovered_at.is_none() && self.node_returned_at.is_none() {
            self.node_returned_at = Some(now);
        }
    }

    /// Advances the phases from the current view; returns what changed. Nothing happens before
    /// the first action.
    pub fn update(
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

    /// Where the failover stands. Recovered wins over everything; a node that came back before
    /// recovery ends the failover as NodeReturned.
    pub fn phase(&self) -> FailoverPhase {
        if self.recovered_at.is_some() {
            FailoverPhase::Recovered
        } else if self.node_returned_at.is_some() {
            FailoverPhase::NodeReturned
        } else if self.acted_at.is_none() {
            if self.held.is_some() {
                FailoverPhase::Held
            } else {
                FailoverPhase::Acting
            }
        } else if self.detached_at.is_some() {
            FailoverPhase::Recovering
        } else if self.timed_out_at.is_some() {
            FailoverPhase::DetachTimedOut
        } else {
            FailoverPhase::Detaching
        }
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out_at.is_some()
    }

    /// The duration of every finished phase: detect (last seen alive → judged failed), act
    /// (→ first action), detach (→ detached), recover (detached → recovered; only when pods
    /// were replaced) and total (last seen alive, or judged failed when unknown → recovered).
    pub fn durations(&self) -> Vec<(Phase, Duration)> {
        let span = |from: Option<Instant>, to: Option<Instant>| {
            from.zip(to).map(|(f, t)| t.saturating_duration_since(f))
        };
        let replaced = self.moved.iter().any(|m| m.replaced_by.is_some());
        let start = self.last_seen_alive.unwrap_or(self.detected_at);
        [
            (
                Phase::Detect,
                span(self.last_seen_alive, Some(self.detected_at)),
            ),
            (Phase::Act, span(Some(self.detected_at), self.acted_at)),
            (Phase::Detach, span(self.acted_at, self.detached_at)),
            (
                Phase::Recover,
                span(self.detached_at, self.recovered_at).filter(|_| replaced),
            ),
            (Phase::Total, span(Some(start), self.recovered_at)),
        ]
        .into_iter()
        .filter_map(|(phase, d)| d.map(|d| (phase, d)))
        .collect()
    }

    /// The durations a step completes, for observing each histogram exactly once.
    pub fn durations_for(&self, change: &PhaseChange) -> Vec<(Phase, Duration)> {
        let phases = change.completes();
        self.durations()
            .into_iter()
            .filter(|(phase, _)| phases.contains(phase))
            .collect()
    }

    /// The failover as the policy status shows it; `wall` maps the operator's clock to wall
    /// time.
    pub fn to_record(&self, wall: impl Fn(Instant) -> Time) -> FailoverRecord {
        FailoverRecord {
            node: self.node.clone(),
            phase: self.phase(),
            last_seen_alive: self.last_seen_alive.map(&wall),
            detected_at: wall(self.detected_at),
            acted_at: self.acted_at.map(&wall),
            detached_at: self.detached_at.map(&wall),
            recovered_at: self.recovered_at.map(&wall),
            pods: self.moved.iter().map(|m| m.key.to_string()).collect(),
            message: self.message(),
        }
    }

    fn message(&self) -> Option<String> {
        let secs = |d: Duration| HumanDuration(Duration::from_secs(d.as_secs()));
        match self.phase() {
            FailoverPhase::Held => self.held.clone(),
            FailoverPhase::NodeReturned => {
                Some("the node became healthy again before the failover finished".to_string())
            }
            FailoverPhase::DetachTimedOut => {
                let waited = self
                    .acted_at
                    .zip(self.timed_out_at)
                    .map(|(a, t)| t.saturating_duration_since(a))
                    .unwrap_or_default();
                Some(format!(
                    "still attached to node {} more than {} after podha acted: {}",
                    self.node,
                    secs(waited),
                    self.still_attached.join(", ")
                ))
            }
            _ => {
                let detach = self
                    .timed_out_at
                    .and(self.acted_at.zip(self.detached_at))
                    .map(|(a, d)| d.saturating_duration_since(a))?;
                Some(format!(
                    "the detach exceeded detachTimeout and took {}",
                    secs(detach)
                ))
            }
        }
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
