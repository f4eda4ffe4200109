//! Fence requests withdrawn once their failure is over: a node that carries podha's
//! `podha.io/fence-request`, has no open incident and is judged Healthy by every policy that
//! watches it gets the request taken off. Left there, a request an agent never saw (it was cut
//! off from the API server, or stopped) would be carried out whenever the agent next reads its
//! Node, perhaps hours later on a healthy node.

use kube::ResourceExt;

use super::{Intent, PlanInput, node_usable};
use crate::contract::FENCE_REQUEST_ANNOTATION;
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
