//! Before a fault: which other pods on the node must keep their objects, and will the policy's
//! safety limit hold later trials? Answered with the operator's own rules on the view
//! `explain::Snapshot` reads the way the operator builds its own; whether podha would move the
//! pod at all is `podha explain`'s answer (`explain::explain_pod`).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

use crate::eligibility::{check_movable, claim_names, controller_ref, opted_out};
use crate::planner::{PolicyRef, node_owner, pod_owner};
use crate::protection::ready_elsewhere;
use crate::view::View;

/// Faults one after another count against the node policy's `safety.maxUnhealthy` for
/// `safety.unhealthyWindow` each: a note when `trials` would exceed it, as podha would hold.
pub fn window_note(
    policies: &[PolicyRef<'_>],
    view: &View,
    node: &str,
    trials: usize,
) -> Option<String> {
    let policy = node_owner(policies, view.nodes.get(node)?)?;
    let watched = view
        .nodes
        .values()
        .filter(|n| node_owner(policies, n).is_some_and(|p| p.name == policy.name))
        .count();
    let max = policy.spec.max_unhealthy_nodes(watched);
    // Without a window only the nodes failed at once count, and trials run one at a time.
    let window = policy.spec.safety.unhealthy_window.get();
    (trials > max && !window.is_zero()).then(|| {
        format!(
            "note: policy {} acts on at most {max} failed node(s) of {watched} within its \
             safety.unhealthyWindow ({}); trials beyond that within the window are held \
             (raise safety.maxUnhealthy or shorten the window for a chaos run)",
            policy.name, policy.spec.safety.unhealthy_window
        )
    })
}

/// A hold shorter than the node policy's detection shows nothing: podha would not have judged
/// even a dead node by then. A note when `hold` ends less than 10 s after the slowest judgement
/// the policy allows (`leaseGracePeriod` + `interval` × `failureThreshold`).
pub fn hold_note(
    policies: &[PolicyRef<'_>],
    view: &View,
    node: &str,
    hold: std::time::Duration,
) -> Option<String> {
    let policy = node_owner(policies, view.nodes.get(node)?)?;
    let d = &policy.spec.detection;
    let threshold = u32::try_from(d.failure_threshold.max(1)).unwrap_or(1);
    let detection = d.lease_grace_period.get() + d.interval.get() * threshold;
    let enough = detection + std::time::Duration::from_secs(10);
    (hold < enough).then(|| {
        format!(
            "note: --hold {}s ends before policy {} could judge even a dead node (up to {}s: \
             leaseGracePeriod + interval x failureThreshold): a trial that holds that long shows \
             little; use --hold {}s or more",
            hold.as_secs(),
            policy.name,
            detection.as_secs(),
            enough.as_secs()
        )
    })
}

/// A pod on the faulted node that podha's rules say must stay, recorded before the fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bystander {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Why podha must leave it alone.
    pub why: String,
}

/// The pods on `node` other than `exclude` (the workload's) that podha must not move and whose
/// objects must survive the failover: the same pods that keep podha from putting the
/// out-of-service taint on the node. A stateless pod with a controller is not one of them: its
/// controller replaces it, and the taint may evict it.
pub fn bystanders(
    policies: &[PolicyRef<'_>],
    view: &View,
    node: &str,
    exclude: &dyn Fn(&Pod) -> bool,
) -> Vec<Bystander> {
    let Some(node_obj) = view.nodes.get(node) else {
        return Vec::new();
    };
    let usable = ready_elsewhere(node);
    view.pods_on(node)
        .iter()
        .filter(|pod| !exclude(pod) && pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let replaced = controller_ref(pod).is_some() && !opted_out(pod);
            if replaced && claim_names(pod).is_empty() {
                return None;
            }
            let why = match pod_owner(policies, pod, node_obj, view) {
                None if controller_ref(pod).is_none() => {
                    "no PodHAPolicy selects it; NoControllerOwner".to_string()
                }
                None => "no PodHAPolicy selects it".to_string(),
                Some(owner) => match check_movable(owner.spec, pod, view, &usable) {
                    Ok(_) => return None,
                    Err(reason) => format!("policy {}: {}", owner.name, reason.as_str()),
                },
            };
            Some(Bystander {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                why,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;

    fn view_of(pods: Vec<Pod>) -> View {
        let nodes = ["n1", "n2"].map(|n| Obj::from(mk_node(n).ready(true)));
        view_with(nodes.into_iter().chain(pods.into_iter().map(Obj::from)))
    }

    fn db() -> Pod {
        mk_pod("shop", "db-0").on("n1").owned_by_sts("db")
    }

    #[test]
    fn more_trials_than_max_unhealthy_allows_get_a_note() {
        let view = view_of(vec![db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        // 30 % of two nodes rounds down, but a policy always tolerates one dead node.
        assert_eq!(window_note(&refs, &view, "n1", 1), None);
        let note = window_note(&refs, &view, "n1", 3).unwrap();
        assert!(
            note.starts_with("note: policy p acts on at most 1 failed node(s) of 2")
                && note.contains("(10m)"),
            "{note}"
        );
        assert_eq!(window_note(&[], &view, "n1", 3), None);
        let mut windowless = mk_spec();
        windowless.safety.unhealthy_window = crate::api::HumanDuration::from_secs(0);
        let refs = [PolicyRef {
            name: "p",
            spec: &windowless,
        }];
        assert_eq!(
            window_note(&refs, &view, "n1", 3),
            None,
            "no window: nothing held"
        );
    }

    #[test]
    fn a_hold_shorter_than_the_policys_detection_gets_a_note() {
        let view = view_of(vec![db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        let d = &spec.detection;
        let detection = d.lease_grace_period.get()
            + d.interval.get() * u32::try_from(d.failure_threshold).unwrap();
        let secs = std::time::Duration::from_secs;
        let note = hold_note(&refs, &view, "n1", detection).unwrap();
        assert!(
            note.contains(&format!("up to {}s", detection.as_secs()))
                && note.contains(&format!("use --hold {}s", detection.as_secs() + 10)),
            "{note}"
        );
        assert_eq!(hold_note(&refs, &view, "n1", detection + secs(10)), None);
        assert_eq!(
            hold_note(&[], &view, "n1", secs(1)),
            None,
            "no policy: no note"
        );
    }

    #[test]
    fn bystanders_are_the_pods_podha_must_leave_alone() {
        let bare = mk_pod("shop", "decoy").on("n1");
        let stateless = mk_pod("shop", "web-1").on("n1").owned_by_rs("web-abc");
        let opted_out = mk_pod("shop", "cache-0")
            .on("n1")
            .owned_by_sts("cache")
            .annotation("podha.io/failover", "false");
        let view = view_of(vec![bare, stateless, opted_out, db()]);
        let spec = mk_spec();
        let refs = [PolicyRef {
            name: "p",
            spec: &spec,
        }];
        let found = bystanders(&refs, &view, "n1", &|p| p.name_any() == "db-0");
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|b| (b.name.as_str(), b.why.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("decoy", "policy p: NoControllerOwner"),
                ("cache-0", "policy p: OptedOut"),
            ]
        );
        let unselected = bystanders(&[], &view, "n1", &|p| p.name_any() == "db-0");
        assert_eq!(unselected.len(), 2, "{unselected:?}");
        assert_eq!(
            unselected[0].why,
            "no PodHAPolicy selects it; NoControllerOwner"
        );
    }
}
