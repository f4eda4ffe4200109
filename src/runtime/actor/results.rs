//! What a write that succeeded did: recorded in its incident (so it is never done twice),
//! counted, and told in an event.

use std::time::Duration;

use kube::ResourceExt;
use tokio::time::Instant;
use tracing::info;

use super::super::actuator::{ActError, Outcome};
use super::super::power::PowerOutcome;
use super::super::writer::EventNote;
use super::Actor;
use super::judge;
use super::reports::pod_reference;
use super::schedule::Sent;
use crate::api::{FencingProof, NodeTaint, Proofs, TAINT_MARKER_ANNOTATION};
use crate::incident::Phase;
use crate::metrics::TaintOperation;
use crate::planner::Intent;
use crate::planner::proof::{self, FenceEvidence};
use crate::view::ObjectKey;

/// How long a BMC may take to apply a `ForceOff` it accepted before podha warns that it does
/// not say `Off` (real BMCs take seconds; the node stays held either way).
pub const POWER_OFF_EXPECTED_WITHIN: Duration = Duration::from_secs(30);

impl Actor {
    pub(super) fn record_outcome(
        &mut self,
        intent: &Intent,
        outcome: Outcome,
        sent: Sent,
        now: Instant,
    ) {
        match intent {
            Intent::MarkPodNotReady { node, uid, pod, .. } => {
                self.record_mark(node, uid, pod, outcome, sent, now);
            }
            Intent::ForceDeletePod {
                pod,
                uid,
                node,
                policy,
                ..
            } if outcome == Outcome::Changed => self.record_changed(pod, uid, node, policy),
            Intent::ForceDeletePod { .. } => {
                self.record_delete(intent, outcome == Outcome::Applied, sent, now);
            }
            Intent::TaintNode {
                node,
                policy,
                taint,
                ..
            } => self.record_taint(node, policy, *taint, outcome == Outcome::Applied, now),
            Intent::RemoveTaint { node } => {
                if outcome == Outcome::Applied {
                    self.metrics
                        .actions
                        .inc_taints(&sent.policy, TaintOperation::Remove);
                    let note = "removed podha's taint: the node is back and holds no volume";
                    let ev = self.node_event(node, false, "TaintRemoved", "Untaint", note.into());
                    self.queue_event(ev);
                }
            }
            Intent::RequestFence { node, policy, .. } => {
                if let Outcome::FenceRequested { request } = &outcome {
                    self.record_fence_request(node, policy, request);
                }
            }
            Intent::PowerOff {
                node,
                policy,
                secret,
                ..
            } => match outcome {
                Outcome::Power(PowerOutcome::OffRequested) => {
                    self.record_power_off_requested(node, policy, secret, now);
                }
                Outcome::Power(PowerOutcome::Off) => {
                    self.ledger.record_found_off(node, now, sent.sent_at);
                    self.report_powered_off(node, now, None);
                }
                _ => {}
            },
            Intent::ConfirmPowerOff { node, .. } => {
                if outcome == Outcome::Power(PowerOutcome::Off) {
                    self.record_powered_off(node, now);
                }
            }
            Intent::PowerOn { node, secret, .. } => {
                if outcome == Outcome::Power(PowerOutcome::OnRequested) {
                    self.ledger.record_power_on(node, now);
                    info!(node, secret, "the BMC accepted On");
                    let note = format!(
                        "the failover is done: asked the node's BMC (Secret {secret}) to power \
                         the machine on (fencing.bmc.powerCycle); podha takes its taint off once \
                         the node is back"
                    );
                    let ev = self.node_event(node, false, "PowerOnRequested", "Fence", note);
                    self.queue_event(ev);
                }
            }
            Intent::WithdrawFenceRequest { node } => {
                if outcome == Outcome::Applied {
                    info!(node, "fence request withdrawn");
                    let note = "withdrew podha's fence request (podha.io/fence-request): the \
                                node is back and its failure is over";
                    let ev =
                        self.node_event(node, false, "FenceRequestWithdrawn", "Fence", note.into());
                    self.queue_event(ev);
                }
            }
            Intent::Hold { .. } => {}
        }
    }

    fn record_mark(
        &mut self,
        node: &str,
        uid: &str,
        pod: &ObjectKey,
        outcome: Outcome,
        sent: Sent,
        now: Instant,
    ) {
        match outcome {
            Outcome::Marked { resource_version } => {
                self.ledger
                    .record_marked_not_ready(node, uid, resource_version);
                info!(%pod, node, "pod marked NotReady");
                self.record_action(node, now, None);
            }
            // Gone, or the name is another pod now: nothing left to delete; its volumes are
            // followed as for a delete.
            _ => {
                self.ledger.record_deleted(node, uid);
                self.record_action(node, now, sent.moved);
            }
        }
    }

    fn record_changed(&mut self, pod: &ObjectKey, uid: &str, node: &str, policy: &str) {
        self.ledger.record_changed_since_mark(node, uid);
        info!(%pod, node, "pod marked NotReady; it changed before the delete");
        let note = format!(
            "marked NotReady: node {node} is dead (policy {policy}); the pod changed before it \
             could be deleted"
        );
        self.queue_event(EventNote {
            regarding: pod_reference(pod, uid),
            warning: false,
            reason: "PodMarkedNotReady",
            action: "MarkNotReady",
            note,
        });
    }

    fn record_delete(&mut self, intent: &Intent, applied: bool, sent: Sent, now: Instant) {
        let Intent::ForceDeletePod {
            node,
            uid,
            pod,
            owner_kind,
            policy,
            ..
        } = intent
        else {
            return;
        };
        self.ledger.record_deleted(node, uid);
        if applied {
            self.metrics.actions.inc_pods_deleted(policy, owner_kind);
            info!(%pod, node, "pod force-deleted");
        }
        self.record_action(node, now, sent.moved);
        if !applied {
            return;
        }
        let marked = self
            .ledger
            .get(node)
            .is_some_and(|i| i.marked_not_ready.contains_key(uid));
        let how = if marked { "marked NotReady and " } else { "" };
        self.queue_event(EventNote {
            regarding: pod_reference(pod, uid),
            warning: false,
            reason: "PodForceDeleted",
            action: "ForceDelete",
            note: format!("{how}force-deleted from dead node {node} (policy {policy})"),
        });
    }

    fn record_taint(
        &mut self,
        node: &str,
        policy: &str,
        taint: NodeTaint,
        applied: bool,
        now: Instant,
    ) {
        self.ledger.record_tainted(node, taint, now);
        if applied {
            self.metrics.actions.inc_taints(policy, TaintOperation::Add);
        }
        self.record_action(node, now, None);
        if !applied {
            return;
        }
        let evidence = match taint {
            NodeTaint::OutOfService => self.fence_evidence(node, policy, now),
            NodeTaint::Fence => None,
        };
        if let Some(evidence) = evidence
            && evidence != FenceEvidence::NotAsked
            && let Some(incident) = self.ledger.get(node)
        {
            let fence = now.saturating_duration_since(incident.detected_at);
            self.metrics
                .failovers
                .observe_phase(&incident.policy, Phase::Fence, fence);
        }
        // Under allOf every listed proof is there: the list says more than its last one.
        let all_of = self.proofs_of(policy).filter(|p| p.needs_all());
        let proof = evidence.map_or(String::new(), |e| match all_of {
            Some(proofs) => format!("; fencing proof: {proofs}"),
            None => format!("; fencing proof: {}", e.as_str()),
        });
        let note = format!(
            "tainted {}={}:{} (policy {policy}{proof})",
            taint.key(),
            taint.value(),
            taint.effect()
        );
        let reason = match taint {
            NodeTaint::OutOfService => "OutOfServiceTaintAdded",
            NodeTaint::Fence => "NodeFenced",
        };
        let ev = self.node_event(node, true, reason, "Taint", note);
        self.queue_event(ev);
    }

    fn record_fence_request(&mut self, node: &str, policy: &str, request: &str) {
        self.ledger.record_fence_request(node, request);
        info!(node, request, "fence requested on the node");
        let proofs = self.proofs_of(policy);
        let waits_for = match proofs.and_then(Proofs::single) {
            Some(FencingProof::Agent) => {
                "the fence's acknowledgement (podha.io/fence-ack) or the agent's silence".into()
            }
            Some(_) => "the fence's acknowledgement (podha.io/fence-ack)".into(),
            None => format!(
                "fencing.proof {}",
                proofs.map(|p| p.describe()).unwrap_or_default()
            ),
        };
        let note = format!(
            "asked for a fence of the node (podha.io/fence-request {request}, policy {policy}); \
             the out-of-service taint waits for {waits_for}"
        );
        let ev = self.node_event(node, true, "FenceRequested", "Fence", note);
        self.queue_event(ev);
    }

    fn record_power_off_requested(&mut self, node: &str, policy: &str, secret: &str, now: Instant) {
        self.ledger.record_power_off(node, now, true);
        info!(node, secret, "the BMC accepted ForceOff");
        let waits_for = match self.proofs_of(policy) {
            Some(proofs) if proofs.single().is_none() => format!("fencing.proof {proofs}"),
            _ => "the BMC to say PowerState Off".to_string(),
        };
        let note = format!(
            "asked the node's BMC (Secret {secret}) to force the machine off (policy {policy}); \
             the out-of-service taint waits for {waits_for}"
        );
        let ev = self.node_event(node, true, "PowerOffRequested", "Fence", note);
        self.queue_event(ev);
    }

    fn record_powered_off(&mut self, node: &str, now: Instant) {
        let read_twice = |ledger: &crate::incident::Ledger| {
            ledger
                .get(node)
                .and_then(|i| i.power_off)
                .and_then(|p| proof::bmc_off_read_twice(&p))
        };
        let before = read_twice(&self.ledger);
        self.ledger.record_powered_off(node, now);
        self.report_powered_off(node, now, before);
    }

    /// A read of the BMC that said `Off`, recorded: the proof's second read (read twice now,
    /// `before` not) is counted and told once; the first only logged.
    fn report_powered_off(&mut self, node: &str, now: Instant, before: Option<Instant>) {
        let power_off = self.ledger.get(node).and_then(|i| i.power_off);
        let Some(p) = power_off else {
            return;
        };
        if before.is_some() || proof::bmc_off_read_twice(&p).is_none() {
            info!(
                node,
                ?power_off,
                "the BMC says the machine is off; read again to be sure"
            );
            return;
        }
        info!(
            node,
            ?power_off,
            "the BMC says the machine is off, read twice"
        );
        if p.by_podha
            && let Some(incident) = self.ledger.get(node)
        {
            self.metrics.failovers.observe_phase(
                &incident.policy,
                Phase::PowerOff,
                now.saturating_duration_since(p.accepted_at),
            );
        }
        let apart = p
            .off_reads
            .map(|r| r.last.saturating_duration_since(r.first).as_secs_f64())
            .unwrap_or_default();
        let note = if p.by_podha {
            format!(
                "the node's BMC says PowerState Off {:.1}s after it accepted podha's ForceOff, \
                 read twice {apart:.1}s apart: the node is fenced unless it was heard from \
                 since the first",
                now.saturating_duration_since(p.accepted_at).as_secs_f64(),
            )
        } else {
            format!(
                "the node's BMC says PowerState Off, read twice {apart:.1}s apart: the machine \
                 is off, the node is fenced unless it was heard from since the first"
            )
        };
        let ev = self.node_event(node, false, "PoweredOff", "Fence", note);
        self.queue_event(ev);
    }

    /// What a power action that failed says of the machine: a read that does not say `Off`
    /// parts the reads that did, before and after; a power-off that sent nothing takes its
    /// `ForceOff` record back.
    pub(super) fn record_power_failure(
        &mut self,
        intent: &Intent,
        error: &ActError,
        sent_at: Instant,
    ) {
        match intent {
            Intent::ConfirmPowerOff { node, .. } if error.not_off_yet() => {
                self.ledger.record_not_off(node);
            }
            Intent::PowerOff { node, .. } if !error.force_off_may_have_gone_out() => {
                self.ledger.record_force_off_not_sent(node, sent_at);
            }
            _ => {}
        }
    }

    /// A power action that failed, told in a Warning event on the node once per cause while
    /// its incident lasts (the action is sent again by its backoff). A read that does not say
    /// `Off` yet is the normal wait for a reset to apply: told only once the BMC has taken
    /// longer than [`POWER_OFF_EXPECTED_WITHIN`] since accepting the `ForceOff`.
    pub(super) fn report_power_failure(&mut self, intent: &Intent, error: &ActError, now: Instant) {
        let (Intent::PowerOff { node, .. }
        | Intent::ConfirmPowerOff { node, .. }
        | Intent::PowerOn { node, .. }) = intent
        else {
            return;
        };
        let cause = match error {
            ActError::Power(failure) => failure.as_str(),
            ActError::TimedOut(_) => "timeout",
            _ => return,
        };
        let reason = if error.not_off_yet() {
            let accepted = self
                .ledger
                .get(node)
                .and_then(|i| i.power_off)
                .map(|p| p.accepted_at);
            if accepted
                .is_none_or(|at| now.saturating_duration_since(at) < POWER_OFF_EXPECTED_WITHIN)
            {
                return;
            }
            "PowerOffUnconfirmed"
        } else if matches!(intent, Intent::PowerOn { .. }) {
            "PowerOnFailed"
        } else {
            "PowerOffFailed"
        };
        if !self.reported.first(node, format!("{reason}/{cause}")) {
            return;
        }
        let tainted = self.ledger.get(node).is_some_and(|i| i.tainted.is_some());
        let note = if matches!(intent, Intent::PowerOn { .. }) {
            format!("{error}; the machine stays off until the BMC powers it on")
        } else if tainted && matches!(intent, Intent::ConfirmPowerOff { .. }) {
            // Another proof of an anyOf let the taint on; podha reads on for powerCycle.
            format!(
                "{error}; another fencing proof let the taint on: podha reads the machine's \
                 power until it says Off, then powers it on after the failover \
                 (fencing.bmc.powerCycle)"
            )
        } else if tainted {
            format!("{error}; another fencing proof let the taint on")
        } else {
            format!("{error}; the node stays held: nothing is tainted or deleted there")
        };
        let ev = self.node_event(node, true, reason, "Fence", note);
        self.queue_event(ev);
    }

    /// The proofs `policy` asks for, while it is known.
    fn proofs_of(&self, policy: &str) -> Option<Proofs> {
        self.state
            .policies
            .get(policy)
            .map(|p| p.spec.fencing.proofs())
    }

    /// What proves `node` fenced for `policy` now, as the planner judged it (from the same
    /// evidence, `proof::agent_evidence`).
    fn fence_evidence(&self, node: &str, policy: &str, now: Instant) -> Option<FenceEvidence> {
        let spec = &self.state.policies.get(policy)?.spec;
        let node_obj = self.state.view.nodes.get(node)?;
        let incident = self.ledger.get(node);
        let request = incident.and_then(|i| i.fence_request.as_deref());
        let heartbeats = judge::heartbeats(&self.state);
        let powered_off = proof::bmc_off(incident.and_then(|i| i.power_off), heartbeats.get(node));
        let quorum = self.judge.agent_quorum_since();
        let agent =
            proof::agent_evidence(node, &self.state.view, &heartbeats, quorum, now, request);
        proof::proven(&spec.fencing, node_obj, agent, powered_off)
    }

    /// The policy named by podha's taint marker on `node` ("" without one).
    pub(super) fn marker_policy(&self, node: &str) -> String {
        self.state
            .view
            .nodes
            .get(node)
            .and_then(|n| n.annotations().get(TAINT_MARKER_ANNOTATION).cloned())
            .unwrap_or_default()
    }
}
