//! Whether a pod tolerates the taint podha fences a dead node with. Such a pod's replacement
//! (a StatefulSet's keeps its name, and its tolerations) may be scheduled straight back onto the
//! dead node, where it waits for a kubelet that is gone: deleting it moves nothing. Under
//! `DeletePods` that taint is podha's scheduling fence (`NoSchedule`); under
//! `OutOfServiceTaint` it is the out-of-service taint (`NoExecute`, which also keeps from the
//! node every replacement that does not tolerate it). When the out-of-service taint is refused
//! (a pod that must stay) podha's fence is used instead, and a pod tolerating only that fence
//! may then come back: that case is not told apart here.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use super::SkipReason;
use crate::api::{Action, NodeTaint, PodHAPolicySpec};

/// The taint podha fences a dead node with under `action`.
fn fence_taint(action: Action) -> NodeTaint {
    NodeTaint::for_action(action)
}

fn as_taint(taint: NodeTaint) -> Taint {
    Taint {
        key: taint.key().to_string(),
        value: Some(taint.value().to_string()),
        effect: taint.effect().to_string(),
        time_added: None,
    }
}

fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// `ToleratesFence` when the pod tolerates the taint podha fences its node with.
pub(crate) fn check_tolerations(spec: &PodHAPolicySpec, pod: &Pod) -> Result<(), SkipReason> {
    tolerated_fence(spec.action, pod).map_or(Ok(()), |_| Err(SkipReason::ToleratesFence))
}

/// The taint podha fences the pod's node with under `action`, if the pod tolerates it.
pub fn tolerated_fence(action: Action, pod: &Pod) -> Option<NodeTaint> {
    let taint = fence_taint(action);
    tolerated(tolerations(pod), &as_taint(taint)).then_some(taint)
}

/// Whether the out-of-service taint leaves the pod alone: it tolerates it for good (no
/// `tolerationSeconds`, after which taint eviction would delete it) and is not terminating
/// (pod GC force-deletes terminating pods on an out-of-service node). Only then is its volume
/// not detached under it either: it stays in the attach/detach controller's desired state.
pub fn spared_by_out_of_service(pod: &Pod) -> bool {
    let taint = as_taint(NodeTaint::OutOfService);
    pod.metadata.deletion_timestamp.is_none()
        && tolerations(pod)
            .iter()
            .any(|t| tolerates(t, &taint) && t.toleration_seconds.is_none())
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
    fn a_pod_tolerating_the_actions_taint_defeats_it() {
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
        assert!(spared_by_out_of_service(&all));
    }

    #[test]
    fn only_a_toleration_matching_key_and_effect_counts() {
        // Tolerating NoSchedule taints does not bring a replacement past the out-of-service
        // taint (NoExecute), only past podha's own fence.
        let no_schedule = tolerating(Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
        assert_eq!(
            tolerated_fence(Action::OutOfServiceTaint, &no_schedule),
            None
        );
        assert_eq!(
            tolerated_fence(Action::DeletePods, &no_schedule),
            Some(NodeTaint::Fence)
        );
        assert!(!spared_by_out_of_service(&no_schedule));
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
    }

    #[test]
    fn a_toleration_for_a_while_or_a_terminating_pod_is_not_spared_by_the_taint() {
        let out_of_service = |seconds| {
            tolerating(Toleration {
                key: Some(NodeTaint::OutOfService.key().into()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: seconds,
                ..Toleration::default()
            })
        };
        assert!(spared_by_out_of_service(&out_of_service(None)));
        // Still a fence it passes (scheduling ignores tolerationSeconds), but evicted later.
        assert_eq!(
            tolerated_fence(Action::OutOfServiceTaint, &out_of_service(Some(60))),
            Some(NodeTaint::OutOfService)
        );
        assert!(!spared_by_out_of_service(&out_of_service(Some(60))));
        let mut terminating = out_of_service(None);
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!spared_by_out_of_service(&terminating));
    }
}
