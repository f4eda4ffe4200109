//! The target check: could some healthy node run this pod, or the replacement its controller
//! will create from the same template? If not, deleting the pod only turns a stuck pod into a
//! Pending one, and takes away the chance that its node comes back.
//!
//! The predicates mirror the scheduler filters that depend only on the pod, the node and the
//! pod's volumes (`NodeUnschedulable`, `NodeAffinity`, `TaintToleration`, `VolumeBinding`'s PV
//! node affinity, `NodeResourcesFit`), plus podha's own view of node health. They err on the
//! side of "no target": a pod that could in fact run elsewhere but is refused waits for the
//! node, which is what Kubernetes does anyway. Inter-pod (anti-)affinity, topology spread,
//! ports, CSI attach limits and preemption are not modelled.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod, Taint};
use kube::ResourceExt;

use super::tolerations::tolerated;
use super::{node_affinity, resources, volumes};
use crate::health::ReadyStatus;
use crate::view::View;

/// Why a node cannot take the pod: the first predicate it fails, in evaluation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// The node the pod is on now.
    OwnNode,
    /// podha judges the node failed or suspect.
    NotUsable,
    /// The node's Ready condition is not True.
    NotReady,
    /// Cordoned (`spec.unschedulable`) and the pod does not tolerate it.
    Cordoned,
    /// The pod's `nodeSelector` does not match the node's labels.
    NodeSelector,
    /// The pod's required node affinity does not match.
    NodeAffinity,
    /// A NoSchedule or NoExecute taint the pod does not tolerate.
    Taint,
    /// A volume's node affinity (topology) excludes the node.
    VolumeTopology,
    /// The pod's requests do not fit next to the pods already there.
    Resources,
}

/// Taint the node lifecycle controller mirrors from `spec.unschedulable`; a pod tolerating it
/// may be scheduled on a cordoned node (`NodeUnschedulable` filter).
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// A healthy node that could run this pod (or a replacement from the same template), if any:
/// the first by name. Volume topology is checked for every claim that is bound; `check_movable`
/// refuses pods with unbound claims before it asks.
pub fn find_target<'v>(
    pod: &Pod,
    view: &'v View,
    node_usable: &dyn Fn(&Node) -> bool,
) -> Option<&'v Node> {
    let namespace = pod.namespace().unwrap_or_default();
    let pvs: Vec<&PersistentVolume> = volumes::claim_names(pod)
        .iter()
        .filter_map(|claim| volumes::bound_volume(view, &namespace, claim))
        .collect();
    find_target_with(pod, &pvs, view, node_usable)
}

/// `find_target` with the pod's volumes already resolved.
pub(crate) fn find_target_with<'v>(
    pod: &Pod,
    pvs: &[&PersistentVolume],
    view: &'v View,
    node_usable: &dyn Fn(&Node) -> bool,
) -> Option<&'v Node> {
    view.nodes
        .values()
        .map(AsRef::as_ref)
        .find(|node| unfit(pod, pvs, node, view, node_usable).is_none())
}

/// The first reason `node` cannot take `pod`, or `None` when it can.
pub(crate) fn unfit(
    pod: &Pod,
    pvs: &[&PersistentVolume],
    node: &Node,
    view: &View,
    node_usable: &dyn Fn(&Node) -> bool,
) -> Option<Unfit> {
    let pod_spec = pod.spec.as_ref();
    let node_spec = node.spec.as_ref();
    let tolerations = pod_spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();

    let own_node = pod_spec.and_then(|s| s.node_name.as_deref());
    if own_node.is_some() && own_node == node.metadata.name.as_deref() {
        return Some(Unfit::OwnNode);
    }
    if !node_usable(node) {
        return Some(Unfit::NotUsable);
    }
    if ReadyStatus::from_node(node) != ReadyStatus::True {
        return Some(Unfit::NotReady);
    }
    let cordon = Taint {
        key: UNSCHEDULABLE_TAINT.to_string(),
        effect: "NoSchedule".to_string(),
        ..Taint::default()
    };
    if node_spec.and_then(|s| s.unschedulable) == Some(true) && !tolerated(tolerations, &cordon) {
        return Some(Unfit::Cordoned);
    }
    let node_selector = pod_spec.and_then(|s| s.node_selector.as_ref());
    if !node_selector
        .into_iter()
        .flatten()
        .all(|(k, v)| node.labels().get(k) == Some(v))
    {
        return Some(Unfit::NodeSelector);
    }
    let required = pod_spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if required.is_some_and(|selector| !node_affinity::matches(selector, node)) {
        return Some(Unfit::NodeAffinity);
    }
    // PreferNoSchedule is a preference, not a filter.
    let taints = node_spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let mut blocking = taints
        .iter()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"));
    if !blocking.all(|taint| tolerated(tolerations, taint)) {
        return Some(Unfit::Taint);
    }
    let topology_ok = pvs.iter().all(|pv| {
        let required = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref());
        required.is_none_or(|selector| node_affinity::matches(selector, node))
    });
    if !topology_ok {
        return Some(Unfit::VolumeTopology);
    }
    if !resources::fits(pod, node, view) {
        return Some(Unfit::Resources);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::*;
    use proptest::prelude::*;

    const DRIVER: &str = "rwo.sim.podha.io";

    /// The pod under test lives on the failed node `dead`.
    fn pod() -> Pod {
        mk_pod("ns", "db-0").on("dead").owned_by_sts("db")
    }

    fn usable(node: &Node) -> bool {
        node.name_any() != "dead" && !node.name_any().starts_with("suspect")
    }

    fn verdict(pod: &Pod, node: Node, extra: Vec<Obj>) -> Option<Unfit> {
        let mut objects: Vec<Obj> = vec![node.clone().into()];
        objects.extend(extra);
        let view = view_with(objects);
        let namespace = pod.namespace().unwrap_or_default();
        let pvs: Vec<&PersistentVolume> = volumes::claim_names(pod)
            .iter()
            .filter_map(|c| volumes::bound_volume(&view, &namespace, c))
            .collect();
        unfit(pod, &pvs, &node, &view, &usable)
    }

    #[test]
    fn node_predicates() {
        use Unfit::*;
        let tol =
            |key: &str, op: &str, value: &str, effect: &str| mk_toleration(key, op, value, effect);
        type Case = (&'static str, Pod, Node, Option<Unfit>);
        let cases: Vec<Case> = vec![
            ("a plain healthy node", pod(), mk_node("n2"), None),
            ("the pod's own node", pod(), mk_node("dead"), Some(OwnNode)),
            (
                "a node podha considers failed",
                pod(),
                mk_node("suspect-1"),
                Some(NotUsable),
            ),
            (
                "NotReady",
                pod(),
                mk_node("n2").ready(false),
                Some(NotReady),
            ),
            (
                "no Ready condition",
                pod(),
                mk_node("n2").without_conditions(),
                Some(NotReady),
            ),
            (
                "cordoned",
                pod(),
                mk_node("n2").unschedulable(),
                Some(Cordoned),
            ),
            (
                "cordoned but tolerated",
                pod().toleration(tol(UNSCHEDULABLE_TAINT, "Exists", "", "NoSchedule")),
                mk_node("n2").unschedulable(),
                None,
            ),
            (
                "nodeSelector matches",
                pod().node_selector("disk", "ssd"),
                mk_node("n2").label("disk", "ssd"),
                None,
            ),
            (
                "nodeSelector value differs",
                pod().node_selector("disk", "ssd"),
                mk_node("n2").label("disk", "hdd"),
                Some(NodeSelector),
            ),
            (
                "nodeSelector label absent",
                pod().node_selector("disk", "ssd"),
                mk_node("n2"),
                Some(NodeSelector),
            ),
            (
                "required affinity matches",
                pod().required_affinity(mk_term().expr("zone", "In", &["a"])),
                mk_node("n2").label("zone", "a"),
                None,
            ),
            (
                "required affinity misses",
                pod().required_affinity(mk_term().expr("zone", "In", &["b"])),
                mk_node("n2").label("zone", "a"),
                Some(NodeAffinity),
            ),
            (
                "required affinity terms are ORed",
                pod()
                    .required_affinity(mk_term().expr("zone", "In", &["b"]))
                    .required_affinity(mk_term().expr("zone", "In", &["a"])),
                mk_node("n2").label("zone", "a"),
                None,
            ),
            (
                "a DaemonSet-style pin to the dead node",
                pod().required_affinity(mk_term().field("metadata.name", "In", &["dead"])),
                mk_node("n2"),
                Some(NodeAffinity),
            ),
            (
                "matchFields naming the target",
                pod().required_affinity(mk_term().field("metadata.name", "In", &["n2"])),
                mk_node("n2"),
                None,
            ),
            (
                "NoSchedule taint",
                pod(),
                mk_node("n2").taint("gpu", "yes", "NoSchedule"),
                Some(Taint),
            ),
            (
                "NoExecute taint",
                pod(),
                mk_node("n2").taint("gpu", "yes", "NoExecute"),
                Some(Taint),
            ),
            (
                "PreferNoSchedule is ignored",
                pod(),
                mk_node("n2").taint("gpu", "yes", "PreferNoSchedule"),
                None,
            ),
            (
                "tolerated with Equal",
                pod().toleration(tol("gpu", "Equal", "yes", "NoSchedule")),
                mk_node("n2").taint("gpu", "yes", "NoSchedule"),
                None,
            ),
            (
                "Equal with another value",
                pod().toleration(tol("gpu", "Equal", "no", "NoSchedule")),
                mk_node("n2").taint("gpu", "yes", "NoSchedule"),
                Some(Taint),
            ),
            (
                "empty operator means Equal",
                pod().toleration(tol("gpu", "", "yes", "")),
                mk_node("n2").taint("gpu", "yes", "NoExecute"),
                None,
            ),
            (
                "toleration for another effect",
                pod().toleration(tol("gpu", "Exists", "", "NoSchedule")),
                mk_node("n2").taint("gpu", "yes", "NoExecute"),
                Some(Taint),
            ),
            (
                "Exists with empty effect tolerates both effects",
                pod().toleration(tol("gpu", "Exists", "", "")),
                mk_node("n2")
                    .taint("gpu", "a", "NoSchedule")
                    .taint("gpu", "b", "NoExecute"),
                None,
            ),
            (
                "every blocking taint must be tolerated",
                pod().toleration(tol("gpu", "Exists", "", "")),
                mk_node("n2")
                    .taint("gpu", "a", "NoSchedule")
                    .taint("db", "only", "NoSchedule"),
                Some(Taint),
            ),
            (
                "empty key with Exists tolerates everything",
                pod().toleration(tol("", "Exists", "", "")),
                mk_node("n2")
                    .taint("gpu", "a", "NoSchedule")
                    .taint("db", "only", "NoExecute"),
                None,
            ),
            (
                "unknown operator tolerates nothing",
                pod().toleration(tol("gpu", "Gt", "1", "")),
                mk_node("n2").taint("gpu", "2", "NoSchedule"),
                Some(Taint),
            ),
            (
                "requests do not fit",
                pod().requests("8", "1Gi"),
                mk_node("n2"),
                Some(Resources),
            ),
            (
                "requests fit",
                pod().requests("2", "1Gi"),
                mk_node("n2"),
                None,
            ),
        ];
        for (name, pod, node, want) in cases {
            assert_eq!(verdict(&pod, node, vec![]), want, "{name}");
        }
    }

    #[test]
    fn volume_topology() {
        let pod = pod().claim("data");
        let zone_a_volume =
            || mk_csi_pv("pv1", DRIVER).node_affinity(mk_term().expr("zone", "In", &["a"]));
        let cases = [
            (
                "volume without topology",
                mk_csi_pv("pv1", DRIVER),
                mk_node("n2"),
                None,
            ),
            (
                "volume's zone",
                zone_a_volume(),
                mk_node("n2").label("zone", "a"),
                None,
            ),
            (
                "other zone",
                zone_a_volume(),
                mk_node("n2").label("zone", "b"),
                Some(Unfit::VolumeTopology),
            ),
            (
                "local volume pinned to the dead node",
                mk_csi_pv("pv1", DRIVER).node_affinity(mk_term().expr(
                    "kubernetes.io/hostname",
                    "In",
                    &["dead"],
                )),
                mk_node("n2"),
                Some(Unfit::VolumeTopology),
            ),
        ];
        for (name, pv, node, want) in cases {
            let claim = mk_pvc("ns", "data").bound_to("pv1");
            assert_eq!(
                verdict(&pod, node, vec![claim.into(), pv.into()]),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn find_target_takes_the_first_node_that_fits() {
        let pod = pod().node_selector("disk", "ssd").claim("data");
        let view = view_with([
            mk_node("dead").label("disk", "ssd").ready(false).into(),
            mk_node("a-cordoned")
                .label("disk", "ssd")
                .unschedulable()
                .into(),
            mk_node("b-hdd").into(),
            mk_node("c-wrong-zone")
                .label("disk", "ssd")
                .label("zone", "b")
                .into(),
            mk_node("d-good")
                .label("disk", "ssd")
                .label("zone", "a")
                .into(),
            mk_node("e-good")
                .label("disk", "ssd")
                .label("zone", "a")
                .into(),
            mk_pvc("ns", "data").bound_to("pv1").into(),
            mk_csi_pv("pv1", DRIVER)
                .node_affinity(mk_term().expr("zone", "In", &["a"]))
                .into(),
        ]);
        let target = find_target(&pod, &view, &usable).map(ResourceExt::name_any);
        assert_eq!(target.as_deref(), Some("d-good"));

        let only_bad = view_with([
            mk_node("dead").label("disk", "ssd").into(),
            mk_node("c-wrong-zone")
                .label("disk", "ssd")
                .label("zone", "b")
                .into(),
            mk_pvc("ns", "data").bound_to("pv1").into(),
            mk_csi_pv("pv1", DRIVER)
                .node_affinity(mk_term().expr("zone", "In", &["a"]))
                .into(),
        ]);
        assert_eq!(find_target(&pod, &only_bad, &usable), None);
        assert_eq!(find_target(&pod, &View::default(), &usable), None);
    }

    #[test]
    fn find_target_counts_pods_already_on_the_node() {
        let pod = pod().requests("3", "1Gi");
        let busy = mk_pod("ns", "other").on("n2").requests("2", "1Gi");
        let view = view_with([mk_node("n2").into(), busy.clone().into()]);
        assert_eq!(find_target(&pod, &view, &usable), None);
        let finished = view_with([mk_node("n2").into(), busy.phase("Succeeded").into()]);
        assert!(find_target(&pod, &finished, &usable).is_some());
    }

    fn arb_taint() -> impl Strategy<Value = (String, String, String)> {
        (
            "[a-z./-]{0,12}",
            "[a-z0-9]{0,6}",
            prop::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule"]),
        )
            .prop_map(|(k, v, e)| (k, v, e.to_string()))
    }

    proptest! {
        /// A pod tolerating everything is never refused a node for its taints.
        #[test]
        fn tolerate_all_is_never_refused_for_taints(taints in prop::collection::vec(arb_taint(), 0..6)) {
            let mut node = mk_node("n2");
            for (key, value, effect) in &taints {
                node = node.taint(key, value, effect);
            }
            let pod = pod().toleration(mk_toleration("", "Exists", "", ""));
            prop_assert_eq!(verdict(&pod, node, vec![]), None);
        }

        /// Without tolerations, a node is refused for taints exactly when it has a blocking one.
        #[test]
        fn untolerated_blocking_taint_refuses(taints in prop::collection::vec(arb_taint(), 0..6)) {
            let mut node = mk_node("n2");
            for (key, value, effect) in &taints {
                node = node.taint(key, value, effect);
            }
            let blocking = taints.iter().any(|(_, _, e)| e != "PreferNoSchedule");
            let want = blocking.then_some(Unfit::Taint);
            prop_assert_eq!(verdict(&pod(), node, vec![]), want);
        }
    }
}
