//! Fence requests withdrawn once their failure is over: a node that carries podha's
//! `podha.io/fence-request`, has no open incident and is judged Healthy by every policy that
//! watches it gets the request taken off. Left there, a request an agent never saw (it was cut
//! off from the API server, or stopped) would be carried out whenever the agent next reads its
//! Node, perhaps hours later on a healthy node.
//!
//! A request acknowledged and then contradicted (the node's kubelet renewed its Lease since, in
//! the same boot: see `proof::ACK_CONTRADICTED_BY`) is reported on the node and its policy
//! (hold `FenceContradicted`), whether or not its incident is still open: the node came back
//! from a fence that did not take, and the pods podha moved may have run twice.

use kube::ResourceExt;

use super::proof::ACK_CONTRADICTED_BY;
use super::{HoldReason, Intent, PlanInput, node_usable};
use crate::contract::{FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION};
use crate::health::ReadyStatus;

/// The withdrawals due this round.
pub(super) fn plan_withdrawals(input: &PlanInput<'_>, out: &mut Vec<Intent>) {
    let usable = node_usable(input.health);
    for (name, node) in &input.view.nodes {
        let requested = node.annotations().contains_key(FENCE_REQUEST_ANNOTATION);
        if requested
            && input.ledger.get(name).is_none()
            && ReadyStatus::from_node(node) == ReadyStatus::True
            && usable(node)
        {
            out.push(Intent::WithdrawFenceRequest { node: name.clone() });
        }
    }
}

/// The reports due this round of acknowledged fences the node contradicted, for the nodes
/// without an open incident (an incident's own plan holds them, see `taints::fence_contradicted`).
pub(super) fn plan_contradictions(input: &PlanInput<'_>, out: &mut Vec<Intent>) {
    for (name, node) in &input.view.nodes {
        let annotations = node.annotations();
        let Some(request) = annotations.get(FENCE_REQUEST_ANNOTATION) else {
            continue;
        };
        let renewals = input
            .heartbeats
            .get(name)
            .map_or(0, |hb| hb.renewals_since_ack);
        if annotations.get(FENCE_ACK_ANNOTATION) == Some(request)
            && renewals >= ACK_CONTRADICTED_BY
            && input.ledger.get(name).is_none()
        {
            // The request names the policy it was made for (`contract::fence_request`).
            let policy = request.split('/').next().unwrap_or_default();
            out.push(Intent::Hold {
                policy: policy.to_string(),
                node: Some(name.clone()),
                reason: HoldReason::FenceContradicted { renewals },
            });
        }
    }
}
