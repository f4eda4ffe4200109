//! podha's delete after the taint eviction controller's own, under the out-of-service taint
//! (`planner::eviction`).

use super::*;

/// `cluster(3)` with `db-0` as the watch shows it: Ready or not, terminating or not.
fn cluster_with_pod(ready: bool, terminating: bool) -> View {
    let mut view = cluster(3);
    let pod = mk_pod("ns", "db-0")
        .on("node-1")
        .owned_by_sts("db")
        .claim("data-db-0")
        .ready(ready);
    let pod = if terminating { pod.terminating() } else { pod };
    view.pods_by_node
        .insert("node-1".into(), vec![std::sync::Arc::new(pod)]);
    view
}

/// `db-0` marked NotReady in version 7 on the dead `node-1`, and podha's `taint` landed just now.
fn marked_and_tainted(spec: PodHAPolicySpec, taint: NodeTaint) -> World {
    let mut world = World::new(cluster_with_pod(true, false))
        .policy("p", spec)
        .fail("node-1");
    let uid = uid(&world.view, "node-1", "db-0");
    world
        .ledger
        .record_marked_not_ready("node-1", &uid, Some("7".into()));
    world.ledger.record_tainted("node-1", taint, world.now);
    world
}

#[test]
fn the_taint_eviction_deletes_first_then_podha_by_the_uid() {
    let mut world = marked_and_tainted(
        with_action(mk_spec(), Action::OutOfServiceTaint),
        NodeTaint::OutOfService,
    );
    // Deleted first by podha, the pod would fail the controller's attempt, whose retry reads
    // the StatefulSet's new db-0 by name and deletes it.
    assert!(deletes(&world.plan()).is_empty(), "{:?}", world.plan());
    // The controller's delete landed (the mark shows too): podha's goes by the UID alone.
    world.view = cluster_with_pod(false, true);
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0"]);
}

#[test]
fn without_the_controllers_delete_podha_deletes_once_the_wait_is_over() {
    let mut world = marked_and_tainted(
        with_action(mk_spec(), Action::OutOfServiceTaint),
        NodeTaint::OutOfService,
    );
    let tainted_at = world.now;
    world.now = tainted_at + TAINT_EVICTION_WAIT - Duration::from_millis(1);
    assert!(deletes(&world.plan()).is_empty());
    world.now = tainted_at + TAINT_EVICTION_WAIT;
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0 in version 7"]);
}

#[test]
fn podhas_fence_evicts_nothing_and_its_deletes_wait_for_nothing() {
    let world = marked_and_tainted(delete_pods(), NodeTaint::Fence);
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0 in version 7"]);
}

/// A mark only a rehearsal would send (its pod's policy in `dryRun`) never lands: the node's
/// taint waits for the marks that do, not for it.
#[test]
fn a_rehearsed_mark_does_not_hold_the_taint() {
    // "a-live" owns the node and live/web-0; "b-dry", in dry run, owns ns/db-0: both Ready.
    let view = cluster_with_pod(true, false)
        .with(mk_namespace("ns").label("team", "dry"))
        .with(mk_namespace("live").label("team", "live"))
        .with(
            mk_pod("live", "web-0")
                .on("node-1")
                .owned_by_sts("web")
                .claim("data-web")
                .ready(true),
        )
        .with(mk_pvc("live", "data-web").bound_to("pv-web"))
        .with(mk_csi_pv("pv-web", DRIVER));
    let live = with_action(mk_spec(), Action::OutOfServiceTaint)
        .namespace_selector(ns_selector("team", "live"));
    let dry = dry_run(mk_spec().namespace_selector(ns_selector("team", "dry")));
    let mut world = World::new(view)
        .policy("a-live", live)
        .policy("b-dry", dry)
        .fail("node-1");
    let plan = world.plan();
    assert!(intent_names(&plan).contains(&"mark live/web-0".to_string()));
    assert!(taints(&plan).is_empty(), "{:?}", plan.intents);
    let web = uid(&world.view, "node-1", "web-0");
    world
        .ledger
        .record_marked_not_ready("node-1", &web, Some("7".into()));
    // db-0 stays (its policy rehearses): podha's fence instead of the out-of-service taint.
    assert_eq!(
        taints(&world.plan()),
        vec![("node-1".to_string(), NodeTaint::Fence)]
    );
}
