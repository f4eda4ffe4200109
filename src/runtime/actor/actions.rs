//! What the decision loop does with an intent (send it, or report a dry run) and with the
//! answer of an action (record it in its failover, retry, or report the failure).

use super::*;

impl Actor {
    pub(super) async fn dispatch(&mut self, intent: Intent, now: Instant) {
        if let Intent::Hold {
            policy,
            node,
            reason,
        } = &intent
        {
            self.report_hold(policy, node.as_deref(), reason).await;
            return;
        }
        let key = intent_key(&intent);
        if self.pending.contains_key(&key) {
            return;
        }
        if let Some((at, _)) = self.retry_at.get(&key)
            && now < *at
        {
            return;
        }
        if !self.leading {
            if self.first_report(intent_node(&intent), format!("dropped/{key}")) {
                self.metrics.inc_intents_dropped(intent_kind(&intent));
            }
            return;
        }
        let (moved, policy) = match &intent {
            Intent::ForceDeletePod {
                node, uid, policy, ..
            }
            | Intent::MarkPodNotReady {
                node, uid, policy, ..
            } => {
                let pod = self
                    .state
                    .view
                    .pods_on(node)
                    .iter()
                    .find(|p| p.uid().as_deref() == Some(uid));
                (
                    pod.map(|p| MovedPod::from_pod(p, &self.state.view)),
                    policy.clone(),
                )
            }
            Intent::TaintNode { policy, .. } | Intent::RequestFence { policy, .. } => {
                (None, policy.clone())
            }
            Intent::RemoveTaint { node } => (None, self.marker_policy(node)),
            Intent::Hold { .. } => return,
        };
        let sent_at = Instant::now();
        self.pending.insert(
            key,
            Pending {
                moved,
                policy,
                sent_at,
            },
        );
        let node = match &intent {
            Intent::TaintNode { node, .. }
            | Intent::RemoveTaint { node }
            | Intent::RequestFence { node, .. } => self.state.view.nodes.get(node).cloned(),
            _ => None,
        };
        self.writes.act(intent, node).await;
    }

    /// Notes an action taken for `node`'s failover (and the pod it moved, if any); the first
    /// one ends the detect phase.
    pub(super) fn record_action(&mut self, node: &str, now: Instant, moved: Option<MovedPod>) {
        if let Some(f) = self.failovers.get_mut(node)
            && let Some(change) = f.record_action(now, moved)
        {
            observe(&self.metrics, f, &change);
        }
    }

    /// What proves `node` fenced for `policy` now, as the planner judged it.
    fn fence_evidence(
        &self,
        node: &str,
        policy: &str,
        now: Instant,
    ) -> Option<crate::planner::proof::FenceEvidence> {
        let spec = &self.state.policies.get(policy)?.spec;
        let node_obj = self.state.view.nodes.get(node)?;
        let silent_for = self
            .state
            .observations
            .get(node)
            .and_then(|o| o.probed(ProbeKind::Agent).silent_since)
            .map(|since| now.saturating_duration_since(since));
        let agent = crate::planner::proof::AgentEvidence {
            silent_for,
            request: self
                .ledger
                .get(node)
                .and_then(|i| i.fence_request.as_deref()),
        };
        crate::planner::proof::proven(&spec.fencing, node_obj, agent)
    }

    pub(super) fn marker_policy(&self, node: &str) -> String {
        self.state
            .view
            .nodes
            .get(node)
            .and_then(|n| n.annotations().get(TAINT_MARKER_ANNOTATION).cloned())
            .unwrap_or_default()
    }

    pub(super) fn on_result(&mut self, result: ActResult, now: Instant) {
        let key = intent_key(&result.intent);
        let Some(pending) = self.pending.remove(&key) else {
            return;
        };
        self.metrics
            .observe_action_latency(intent_kind(&result.intent), now - pending.sent_at);
        let outcome = match result.result {
            Ok(outcome) => outcome,
            Err(error) => {
                let delay = self
                    .retry_at
                    .get(&key)
                    .map_or(RETRY_MIN, |(_, d)| (*d * 2).min(RETRY_MAX));
                warn!(%key, %error, retry_in = ?delay, "action failed");
                self.retry_at.insert(key, (now + delay, delay));
                return;
            }
        };
        self.retry_at.remove(&key);
        let applied = outcome == Outcome::Applied;
        match &result.intent {
            Intent::MarkPodNotReady { node, uid, pod, .. } => match outcome {
                Outcome::Marked { resource_version } => {
                    self.ledger
                        .record_marked_not_ready(node, uid, resource_version);
                    info!(%pod, node, "pod marked NotReady");
                    self.record_action(node, now, None);
                }
                // Gone, or the name is another pod now: nothing left to delete; its volumes
                // are followed as for a delete.
                _ => {
                    self.ledger.record_deleted(node, uid);
                    self.record_action(node, now, pending.moved);
                }
            },
            Intent::ForceDeletePod {
                pod,
                uid,
                node,
                policy,
                ..
            } if outcome == Outcome::Changed => {
                self.ledger.record_changed_since_mark(node, uid);
                info!(%pod, node, "pod marked NotReady; it changed before the delete");
                let note = format!(
                    "marked NotReady: node {node} is dead (policy {policy}); the pod changed \
                     before it could be deleted"
                );
                self.queue_event(EventNote {
                    regarding: pod_reference(pod, uid),
                    warning: false,
                    reason: "PodMarkedNotReady",
                    action: "MarkNotReady",
                    note,
                });
            }
            Intent::ForceDeletePod {
                node,
                uid,
                pod,
                owner_kind,
                policy,
                ..
            } => {
                self.ledger.record_deleted(node, uid);
                if applied {
                    self.metrics.inc_pods_deleted(policy, owner_kind);
                    info!(%pod, node, "pod force-deleted");
                }
                self.record_action(node, now, pending.moved);
                if applied {
                    let marked = self
                        .ledger
                        .get(node)
                        .is_some_and(|i| i.marked_not_ready.contains_key(uid));
                    let how = if marked { "marked NotReady and " } else { "" };
                    let note =
                        format!("{how}force-deleted from dead node {node} (policy {policy})");
                    let regarding = pod_reference(pod, uid);
                    self.queue_event(EventNote {
                        regarding,
                        warning: false,
                        reason: "PodForceDeleted",
                        action: "ForceDelete",
                        note,
                    });
                }
            }
            Intent::TaintNode {
                node,
                policy,
                taint,
            } => {
                self.ledger.record_tainted(node);
                if applied {
                    self.metrics.inc_taints(policy, TaintOperation::Add);
                }
                self.record_action(node, now, None);
                if applied {
                    let evidence = match taint {
                        NodeTaint::OutOfService => self.fence_evidence(node, policy, now),
                        NodeTaint::Fence => None,
                    };
                    if let Some(evidence) = evidence
                        && evidence != crate::planner::proof::FenceEvidence::NotAsked
                        && let Some(f) = self.failovers.get(node)
                    {
                        let fence = now.saturating_duration_since(f.detected_at);
                        self.metrics
                            .observe_phase(&f.policy, crate::metrics::Phase::Fence, fence);
                    }
                    let proof = evidence.map_or(String::new(), |e| {
                        format!("; fencing proof: {}", e.as_str())
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
            }
            Intent::RemoveTaint { node } => {
                if applied {
                    self.metrics
                        .inc_taints(&pending.policy, TaintOperation::Remove);
                    let note = "removed podha's taint: the node is back and holds no volume";
                    let ev = self.node_event(node, false, "TaintRemoved", "Untaint", note.into());
                    self.queue_event(ev);
                }
            }
            Intent::RequestFence { node, policy } => {
                if let Outcome::FenceRequested { request } = &outcome {
                    self.ledger.record_fence_request(node, request);
                    info!(node, request, "fence requested on the node");
                    let note = format!(
                        "asked for a fence of the node (podha.io/fence-request {request}, policy \
                         {policy}); the out-of-service taint waits for the fence's \
                         acknowledgement (podha.io/fence-ack){}",
                        if self
                            .state
                            .policies
                            .get(policy)
                            .map(|p| p.spec.fencing.proof)
                            == Some(crate::api::FencingProof::Agent)
                        {
                            " or the agent's silence"
                        } else {
                            ""
                        }
                    );
                    let ev = self.node_event(node, true, "FenceRequested", "Fence", note);
                    self.queue_event(ev);
                }
            }
            Intent::Hold { .. } => {}
        }
    }
}
