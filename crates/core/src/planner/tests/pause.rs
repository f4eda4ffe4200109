//! `spec.paused` and the Node annotation `podha.io/paused`: no new action on a dead node, only
//! the hold; a failover already acting finishes.

use super::*;
use crate::api::PAUSE_ANNOTATION;

fn paused(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.paused = true;
    spec
}

fn pauses(plan: &Plan) -> Vec<(Option<String>, bool)> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                node,
                reason: HoldReason::Paused { by_node },
                ..
            } => Some((node.clone(), *by_node)),
            _ => None,
        })
        .collect()
}

fn annotated(mut view: View, node: &str, value: &str) -> View {
    let n = (*view.nodes[node])
        .clone()
        .annotation(PAUSE_ANNOTATION, value);
    view.nodes.insert(node.into(), std::sync::Arc::new(n));
    view
}

#[test]
fn a_paused_policy_holds_a_dead_node_and_reports_no_would_be_action() {
    let plan = World::new(cluster(3))
        .policy("p", paused(mk_spec()))
        .fail("node-1")
        .plan();
    assert_eq!(intent_names(&plan), ["hold Paused"]);
    assert_eq!(pauses(&plan), [(Some("node-1".to_string()), false)]);
    // A dry run under a pause rehearses nothing either.
    let mut dry = paused(mk_spec());
    dry.dry_run = true;
    let plan = World::new(cluster(3))
        .policy("p", dry)
        .fail("node-1")
        .plan();
    assert_eq!(intent_names(&plan), ["hold Paused"]);
    // Unpaused, the same death is acted on.
    let plan = World::new(cluster(3))
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert_eq!(
        intent_names(&plan),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn the_node_annotation_pauses_that_node_only_and_false_pauses_nothing() {
    let view = annotated(cluster(3), "node-1", "true");
    let plan = World::new(view.clone())
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert_eq!(pauses(&plan), [(Some("node-1".to_string()), true)]);
    assert_eq!(intent_names(&plan), ["hold Paused"]);
    // A typo pauses (the safe reading); "false" does not.
    let typo = annotated(cluster(3), "node-1", "yes");
    let plan = World::new(typo)
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert_eq!(intent_names(&plan), ["hold Paused"]);
    let off = annotated(cluster(3), "node-1", "false");
    let plan = World::new(off).policy("p", mk_spec()).fail("node-1").plan();
    assert_eq!(
        intent_names(&plan),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
    // Cordoning is not maintenance.
    let mut cordoned = cluster(3);
    let n = (*cordoned.nodes["node-1"]).clone().unschedulable();
    cordoned
        .nodes
        .insert("node-1".into(), std::sync::Arc::new(n));
    let plan = World::new(cordoned)
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert!(pauses(&plan).is_empty(), "{:?}", plan.intents);
}

#[test]
fn a_failover_already_acting_finishes_what_it_started() {
    let plan = World::new(cluster(3))
        .policy("p", paused(mk_spec()))
        .fail_tainted("node-1")
        .plan();
    assert!(pauses(&plan).is_empty(), "{:?}", plan.intents);
    assert_eq!(deletes(&plan), ["ns/db-0"]);
}

#[test]
fn a_pod_whose_own_policy_is_paused_stays_and_spares_it_the_taint() {
    // "a" governs the node but selects other pods; "b", paused, selects db-0.
    let app = |value: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), value.to_string())])),
        ..LabelSelector::default()
    };
    let mut view = cluster(3);
    let db = view.pods_on("node-1")[0]
        .as_ref()
        .clone()
        .label("app", "db");
    view.pods_by_node
        .insert("node-1".into(), vec![std::sync::Arc::new(db)]);
    let world = || {
        World::new(view.clone())
            .policy("a", mk_spec().pod_selector(app("web")))
            .policy("b", paused(mk_spec().pod_selector(app("db"))))
    };
    let plan = world().fail("node-1").plan();
    assert_eq!(skip_reasons(&plan), vec![("ns/db-0".to_string(), "Paused")]);
    // Nor once the node's policy acted there (its fence on): the pod was never begun on.
    let plan = world().fail_tainted("node-1").plan();
    assert_eq!(skip_reasons(&plan), vec![("ns/db-0".to_string(), "Paused")]);
    assert!(
        !intent_names(&plan)
            .iter()
            .any(|i| i.contains("taint node-1 node.kubernetes.io/out-of-service")),
        "{:?}",
        plan.intents
    );
}
