//! Whether a pod tolerates the taint podha fences a dead node with. Such a pod's replacement
//! (a StatefulSet's keeps its name, and its tolerations) may be scheduled straight back onto the
//! dead node, where it waits for a kubelet that is gone: deleting it moves nothing. Under
//! `OutOfServiceTaint` either taint counts, since podha falls back to its own fence when the
//! out-of-service taint is refused.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::SkipReason;
use crate::api::{Action, NodeTaint, PodHAPolicySpec};

/// The taints podha may put on a dead node under `action`.
fn fence_taints(action: Action) -> &'static [NodeTaint] {
    match action {
        Action::DeletePods => &[NodeTaint::Fence],
        Action::OutOfServiceTaint => &[NodeTaint::OutOfService, NodeTaint::Fence],
    }
}

/// `ToleratesFence` when the pod tolerates a taint podha may fence its node with: the first
/// such taint's key, for the reader.
pub(crate) fn check_tolerations(spec: &PodHAPolicySpec, pod: &Pod) -> Result<(), SkipReason> {
    tolerated_fence(spec.action, pod).map_or(Ok(()), |_| Err(SkipReason::ToleratesFence))
}

/// The first taint podha may fence the pod's node with under `action` that the pod tolerates.
pub fn tolerated_fence(action: Action, pod: &Pod) -> Option<NodeTaint> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    fence_taints(action).iter().copied().find(|taint| {
        let taint = Taint {
            key: taint.key().to_string(),
            value: Some(taint.value().to_string()),
            effect: taint.effect().to_string(),
            time_added: None,
        };
        tolerated(tolerations, &taint)
    })
}

pub(super) fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// `Toleration.ToleratesTaint` from `k8s.io/api/core/v1`: an empty effect matches every effect,
/// an empty key (valid only with `Exists`) every key; `Exists` ignores the value.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;
    use k8s_openapi::api::core::v1::Toleration;

    fn tolerating(toleration: Toleration) -> Pod {
        let mut pod = mk_pod("ns", "db-0").owned_by_sts("db");
        pod.spec.get_or_insert_default().tolerations = Some(vec![toleration]);
        pod
    }

    #[test]
    fn a_pod_tolerating_every_taint_defeats_either_fence() {
        let all = tolerating(Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        });
        assert_eq!(
            tolerated_fence(Action::OutOfServiceTaint, &all),
            Some(NodeTaint::OutOfService)
        );
        assert_eq!(
            tolerated_fence(Action::DeletePods, &all),
            Some(NodeTaint::Fence)
        );
        assert_eq!(
            check_tolerations(&mk_spec(), &all),
            Err(SkipReason::ToleratesFence)
        );
    }

    #[test]
    fn only_a_toleration_matching_key_and_effect_counts() {
        let out_of_service = tolerating(Toleration {
            key: Some(NodeTaint::OutOfService.key().into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Toleration::default()
        });
        assert_eq!(
            tolerated_fence(Action::OutOfServiceTaint, &out_of_service),
            Some(NodeTaint::OutOfService)
        );
        // podha's own fence is all DeletePods puts on.
        assert_eq!(tolerated_fence(Action::DeletePods, &out_of_service), None);
        // The node lifecycle controller's taints are tolerated by every pod for 300 s: no fence.
        let unreachable = tolerating(Toleration {
            key: Some("node.kubernetes.io/unreachable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(300),
            ..Toleration::default()
        });
        assert_eq!(
            tolerated_fence(Action::OutOfServiceTaint, &unreachable),
            None
        );
        assert_eq!(check_tolerations(&mk_spec(), &unreachable), Ok(()));
        let wrong_effect = tolerating(Toleration {
            key: Some(NodeTaint::Fence.key().into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Toleration::default()
        });
        assert_eq!(tolerated_fence(Action::DeletePods, &wrong_effect), None);
    }
}
