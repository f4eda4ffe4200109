//! Which policy decides about a pod or a node when several select it: the first by name.
//! Callers pass policies sorted by name.

use k8s_openapi::api::core::v1::{Node, Pod};

use super::PolicyRef;
use crate::eligibility::{node_selected, pod_selected};
use crate::view::View;

/// The policy that decides about `pod` on `node`: the first whose node, namespace and pod
/// selectors all select it.
pub fn pod_owner<'a>(
    policies: &[PolicyRef<'a>],
    pod: &Pod,
    node: &Node,
    view: &View,
) -> Option<PolicyRef<'a>> {
    policies
        .iter()
        .find(|p| node_selected(p.spec, node) && pod_selected(p.spec, pod, view))
        .copied()
}

/// The policy that decides about `node` itself (its taint): the first whose node selector
/// selects it.
pub fn node_owner<'a>(policies: &[PolicyRef<'a>], node: &Node) -> Option<PolicyRef<'a>> {
    policies
        .iter()
        .find(|p| node_selected(p.spec, node))
        .copied()
}
