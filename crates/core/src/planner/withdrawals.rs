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

use super::proof::{Acknowledgement, acknowledgement};
use super::{HoldReason, Intent, PlanInput, node_usable};
use crate::contract::{FENCE_REQUEST_ANNOTATION, requested_policy};
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
/// without an open incident (an incident's own plan holds them, see `fencing::fence_contradicted`).
pub(super) fn plan_contradictions(input: &PlanInput<'_>, out: &mut Vec<Intent>) {
    for (name, node) in &input.view.nodes {
        let Some(request) = node.annotations().get(FENCE_REQUEST_ANNOTATION) else {
            continue;
        };
        let since_ack = input
            .heartbeats
            .get(name)
            .map_or(0, |hb| hb.renewals_since_ack);
        if let Acknowledgement::Contradicted { renewals } =
            acknowledgement(node, Some(request), since_ack)
            && input.ledger.get(name).is_none()
        {
            out.push(Intent::Hold {
                policy: requested_policy(request).to_string(),
                node: Some(name.clone()),
                reason: HoldReason::FenceContradicted { renewals },
            });
        }
    }
}
