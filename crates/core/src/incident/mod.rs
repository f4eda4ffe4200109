//! One node death, from the moment a policy judges the node Failed until the node is healthy
//! again: what podha did about it and when each phase of the failover ended. One record per dead
//! node ([`Incident`]), kept by the decision loop in the [`Ledger`]; the planner reads it so that
//! one incident never gets two actions, and [`Incident::follow`] advances its phases from the
//! cluster view. Pure: no client, no IO; the runtime turns what changed into events, metrics and
//! status.
//!
//! Rules:
//! - **Only the pods there at the judgement move.** The UIDs bound to the node when the incident
//!   opened are the only ones podha may delete: a pod bound to the node later is a replacement
//!   that the dead kubelet never ran.
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

mod follow;

#[cfg(test)]
mod follow_tests;
mod ledger;
mod moved;
mod phase;

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

pub use ledger::{Ledger, RECENT_KEPT_FOR};
pub use moved::{MovedPod, OwnerRef, Replacement};

pub use phase::{Phase, PhaseChange};

use crate::api::NodeTaint;
use crate::view::View;

/// A node powered off through its BMC in an incident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerOff {
    /// When the BMC accepted podha's `ForceOff`, or said the machine was off already.
    pub accepted_at: Instant,
    /// podha's `ForceOff` powered the machine off (not found off: someone else switched it
    /// off, and only they may switch it on again). A machine found off after a `ForceOff` of
    /// podha's whose answer was lost counts as podha's.
    pub by_podha: bool,
    /// The reads of the system's `PowerState` since then that said `Off`; what the proof
    /// `BMC` is made of (`planner::proof::bmc_off`).
    pub off_reads: Option<OffReads>,
    /// With `fencing.bmc.powerCycle`: when the BMC accepted podha's `On` after the failover
    /// (or said the machine was on already).
    pub on_requested_at: Option<Instant>,
}

/// Reads of a system's `PowerState` that said `Off`, with none between them that did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffReads {
    pub first: Instant,
    pub last: Instant,
}

/// podha's taint on an incident's node: which one, and when it landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tainted {
    pub taint: NodeTaint,
    pub at: Instant,
}

/// Why an incident's actions are held, while none was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The hold's reason, as `podha_actions_held_total` labels it (`FencingPending`...).
    pub reason: &'static str,
    /// What the hold says: the failover's message while it lasts.
    pub note: String,
}

/// One node death, from judgement to recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incident {
    pub node: String,
    /// The policy that judged the node dead.
    pub policy: String,
    /// Last time the node was seen alive on the operator's clock, if known.
    pub last_seen_alive: Option<Instant>,
    /// When the node was judged Failed.
    pub detected_at: Instant,

    // What podha did.
    /// UIDs of the pods bound to the node when the incident opened. Only these may be deleted:
    /// a pod bound to the node later is a replacement that the dead kubelet never ran.
    pub pods_at_failure: BTreeSet<String>,
    /// The node's boot (`status.nodeInfo.bootID`) when the incident opened, if it reported one:
    /// a node that reports another has rebooted since (see `rebooted`).
    pub boot_at_failure: Option<String>,
    /// UIDs of the pods podha force-deleted.
    pub deleted: BTreeSet<String>,
    /// The pods podha marked NotReady, by UID: the resourceVersion the mark produced, or
    /// `None` once a delete in that version found the pod changed (the watch decides then).
    pub marked_not_ready: BTreeMap<String, Option<String>>,
    /// podha's taint on the node for this incident, once it landed.
    pub tainted: Option<Tainted>,
    /// The fence podha asked of the node's agent in this incident (the request's value on the
    /// Node), once the request is written.
    pub fence_request: Option<String>,
    /// When podha's `ForceOff` to the node's BMC was about to go out, recorded before it does
    /// and taken back only by that action's own answer showing it never reached the BMC: one
    /// whose answer was lost (no answer in time, the connection cut after sending) may have
    /// powered the machine off, and a machine found off after it is podha's to power on again.
    pub force_off_sent: Option<Instant>,
    /// The node's power through its BMC (proof `BMC`), once the BMC accepted podha's
    /// `ForceOff` (or said the machine was off already).
    pub power_off: Option<PowerOff>,
    /// Pods podha deleted, as they were, in the order it deleted them.
    pub moved: Vec<MovedPod>,

    // When each phase ended.
    /// The first action: a taint or a pod deletion.
    pub acted_at: Option<Instant>,
    pub detached_at: Option<Instant>,
    pub recovered_at: Option<Instant>,
    /// When the detach timeout was reported.
    pub timed_out_at: Option<Instant>,
    /// Volumes (or, for an inline spec, VolumeAttachments) still holding the dead node, as of
    /// the last update before the detach; empty once detached.
    pub still_attached: Vec<String>,
    /// Why actions are held, while no action was taken.
    pub held: Option<Held>,
    /// Whether this round's plan holds the node until its fence is proven (set every round).
    pub awaiting_proof: bool,
    /// When the node was seen healthy again, if before recovery.
    pub node_returned_at: Option<Instant>,
}

impl Incident {
    /// podha acted on the node already (marked, deleted or tainted, asked for its fence, or
    /// found its own taint there when it took the incident over): a failover under way, which
    /// a pause or the settle wait does not stop half-way.
    pub fn acted(&self) -> bool {
        self.tainted.is_some()
            || !self.deleted.is_empty()
            || !self.marked_not_ready.is_empty()
            || self.fence_request.is_some()
            || self.power_off.is_some()
            || self.acted_at.is_some()
    }

    /// An incident with nothing done yet and no pod recorded on the node.
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
            pods_at_failure: BTreeSet::new(),
            boot_at_failure: None,
            deleted: BTreeSet::new(),
            marked_not_ready: BTreeMap::new(),
            tainted: None,
            fence_request: None,
            force_off_sent: None,
            power_off: None,
            moved: Vec::new(),
            acted_at: None,
            detached_at: None,
            recovered_at: None,
            timed_out_at: None,
            still_attached: Vec::new(),
            held: None,
            awaiting_proof: false,
            node_returned_at: None,
        }
    }

    /// The same, with the pods bound to the node in `view` now as the only ones that may move.
    pub fn open(
        node: &str,
        policy: &str,
        last_seen_alive: Option<Instant>,
        detected_at: Instant,
        view: &View,
    ) -> Self {
        let mut incident = Self::new(node, policy, last_seen_alive, detected_at);
        incident.pods_at_failure = view
            .pods_on(node)
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        incident.boot_at_failure = view.nodes.get(node).and_then(|n| boot_id(n));
        incident
    }

    /// Whether `node` (this incident's) reports another boot than the one judged dead: the
    /// machine rebooted since, which ended that boot's processes. Asking the new boot for a
    /// fence, or its BMC for a power-off, would reset a machine that is coming back.
    pub fn rebooted(&self, node: &k8s_openapi::api::core::v1::Node) -> bool {
        matches!((&self.boot_at_failure, boot_id(node)), (Some(then), Some(now)) if *then != now)
    }

    /// Records that the pod `uid` was deleted.
    pub fn record_deleted(&mut self, uid: &str) {
        self.deleted.insert(uid.to_string());
    }

    /// Records that the pod `uid` was marked NotReady, in `version`.
    pub fn record_marked_not_ready(&mut self, uid: &str, version: Option<String>) {
        self.marked_not_ready.insert(uid.to_string(), version);
    }

    /// Records that the pod `uid` changed after podha marked it: no delete in the marked
    /// version any more.
    pub fn record_changed_since_mark(&mut self, uid: &str) {
        if let Some(version) = self.marked_not_ready.get_mut(uid) {
            *version = None;
        }
    }

    /// Records that podha asked the node's agent for a fence, with this request value.
    pub fn record_fence_request(&mut self, request: &str) {
        self.fence_request = Some(request.to_string());
    }

    /// Records that podha's `ForceOff`, in the action sent at `at`, is about to go out.
    /// The first one kept counts: a later one's answer cannot show that an earlier one never
    /// reached the BMC.
    pub fn record_force_off_sending(&mut self, at: Instant) {
        self.force_off_sent.get_or_insert(at);
    }

    /// Records that the action sent at `at` sent no `ForceOff` (refused before it, or the
    /// machine read off first): its own record, if it is the one kept, is taken back.
    pub fn record_force_off_not_sent(&mut self, at: Instant) {
        if self.force_off_sent == Some(at) {
            self.force_off_sent = None;
        }
    }

    /// Records that the node's BMC accepted podha's `ForceOff` (`by_podha`), or said the
    /// machine was off already. The first counts: a read says the machine is off only if it
    /// comes after one.
    pub fn record_power_off(&mut self, now: Instant, by_podha: bool) {
        self.power_off.get_or_insert(PowerOff {
            accepted_at: now,
            by_podha,
            off_reads: None,
            on_requested_at: None,
        });
    }

    /// Records that the node's BMC said the machine was off before the `ForceOff` of the
    /// action sent at `sent_at` went out: podha's power-off if an earlier `ForceOff` of this
    /// incident may have reached the BMC (its answer lost), someone else's otherwise.
    pub fn record_found_off(&mut self, now: Instant, sent_at: Instant) {
        let earlier = self.force_off_sent.is_some_and(|at| at != sent_at);
        self.record_force_off_not_sent(sent_at);
        self.record_power_off(now, earlier);
        self.record_powered_off(now);
    }

    /// Records a read of the node's BMC, after it accepted the `ForceOff`, that says the
    /// machine is off.
    pub fn record_powered_off(&mut self, now: Instant) {
        if let Some(p) = &mut self.power_off {
            let reads = p.off_reads.get_or_insert(OffReads {
                first: now,
                last: now,
            });
            reads.last = now;
        }
    }

    /// Records a read of the node's BMC that does not say the machine is off: the reads that
    /// said `Off` before it prove nothing together with those after.
    pub fn record_not_off(&mut self) {
        if let Some(p) = &mut self.power_off {
            p.off_reads = None;
        }
    }

    /// Records that the node's BMC accepted podha's `On` after the failover.
    pub fn record_power_on(&mut self, now: Instant) {
        if let Some(power_off) = &mut self.power_off {
            power_off.on_requested_at.get_or_insert(now);
        }
    }

    /// Records that podha's `taint` landed on the node at `now`; the first counts.
    pub fn record_tainted(&mut self, taint: NodeTaint, now: Instant) {
        self.tainted.get_or_insert(Tainted { taint, at: now });
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

    /// Notes that actions are held (safety limit, dry run, a fence not proven yet): `reason`,
    /// a `podha_actions_held_total` label, and what the hold says; shown until an action is
    /// taken.
    pub fn record_hold(&mut self, reason: &'static str, note: impl Into<String>) {
        if self.acted_at.is_none() {
            self.held = Some(Held {
                reason,
                note: note.into(),
            });
        }
    }

    /// Whether the failover waits, with nothing done, for the proof that its node is fenced.
    pub fn awaits_proof(&self) -> bool {
        self.acted_at.is_none() && self.awaiting_proof
    }

    /// Notes that the node is healthy again. Tracking goes on: a late detach or recovery is
    /// still recorded.
    pub fn record_node_returned(&mut self, now: Instant) {
        if self.recovered_at.is_none() && self.node_returned_at.is_none() {
            self.node_returned_at = Some(now);
        }
    }
}

/// The boot a Node reports (`status.nodeInfo.bootID`), if any.
fn boot_id(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty())
}
