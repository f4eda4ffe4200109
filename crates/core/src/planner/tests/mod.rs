use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::time::Instant;

use super::*;
use crate::api::{Action, NodeTaint, OwnerKind, TAINT_MARKER_ANNOTATION};
use crate::planner::Heartbeat;
use crate::test_builders::*;

const DRIVER: &str = "rwo.sim.podha.io";

/// A cluster of `n` nodes; on `node-1`, a StatefulSet pod `db-0` with one RWO CSI claim.
fn cluster(n: usize) -> View {
    let mut view = View::default();
    for i in 1..=n {
        view = view.with(mk_node(&format!("node-{i}")));
    }
    view.with(
        mk_pod("ns", "db-0")
            .on("node-1")
            .owned_by_sts("db")
            .claim("data-db-0"),
    )
    .with(mk_pvc("ns", "data-db-0").bound_to("pv-db"))
    .with(mk_csi_pv("pv-db", DRIVER))
}

fn uid(view: &View, node: &str, name: &str) -> String {
    view.pods_on(node)
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .and_then(|p| p.metadata.uid.clone())
        .expect("pod in view")
}

struct World {
    view: View,
    specs: Vec<(String, PodHAPolicySpec)>,
    health: HealthBook,
    ledger: Ledger,
    heartbeats: Heartbeats,
    unreadable: Vec<String>,
    agent_quorum_since: Option<Instant>,
    t0: Instant,
    now: Instant,
}

impl World {
    fn new(view: View) -> Self {
        Self {
            view,
            specs: Vec::new(),
            health: HealthBook::new(),
            ledger: Ledger::default(),
            heartbeats: Heartbeats::new(),
            unreadable: Vec::new(),
            agent_quorum_since: None,
            t0: Instant::now(),
            now: Instant::now(),
        }
    }

    /// Adds a policy that watches every node of the view, all Healthy.
    fn policy(mut self, name: &str, spec: PodHAPolicySpec) -> Self {
        let nodes = self
            .view
            .nodes
            .keys()
            .map(|n| (n.clone(), NodeHealth::Healthy))
            .collect();
        self.health.insert(name.to_string(), nodes);
        self.specs.push((name.to_string(), spec));
        self
    }

    fn set_health(mut self, policy: &str, node: &str, health: NodeHealth) -> Self {
        self.health
            .get_mut(policy)
            .expect("policy")
            .insert(node.to_string(), health);
        self
    }

    /// Every policy judges `node` Failed, and the runtime opened its incident.
    /// `node` renewed its Lease after this process saw podha's taint on it: it is back.
    fn back(mut self, node: &str) -> Self {
        let hb = Heartbeat {
            tainted_since: Some(self.t0),
            ..renewed_at(self.t0 + Duration::from_secs(1))
        };
        self.heartbeats.insert(node.to_string(), hb);
        self
    }

    fn fail(mut self, node: &str) -> Self {
        let failed = NodeHealth::Failed { since: self.t0 };
        for nodes in self.health.values_mut() {
            nodes.insert(node.to_string(), failed);
        }
        self.ledger.open(node, "p", None, self.t0, &self.view);
        self
    }

    /// `node` is Failed and podha's taint is on it: its pods may move.
    fn fail_tainted(mut self, node: &str) -> Self {
        self = self.fail(node);
        self.taint_landed(node);
        self
    }

    /// podha's out-of-service taint landed on `node` long enough ago that the taint eviction
    /// controller had its time (`TAINT_EVICTION_WAIT`).
    fn taint_landed(&mut self, node: &str) {
        let at = self.now - TAINT_EVICTION_WAIT;
        self.ledger
            .record_tainted(node, NodeTaint::OutOfService, at);
    }

    fn plan(&self) -> Plan {
        let policies: Vec<PolicyRef<'_>> = self
            .specs
            .iter()
            .map(|(name, spec)| PolicyRef { name, spec })
            .collect();
        plan(&PlanInput {
            policies: &policies,
            health: &self.health,
            view: &self.view,
            ledger: &self.ledger,
            heartbeats: &self.heartbeats,
            unreadable: &self.unreadable,
            agent_quorum_since: self.agent_quorum_since,
            now: self.now,
        })
    }
}

fn taints(plan: &Plan) -> Vec<(String, NodeTaint)> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::TaintNode { node, taint, .. } => Some((node.clone(), *taint)),
            _ => None,
        })
        .collect()
}

fn deletes(plan: &Plan) -> Vec<String> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::ForceDeletePod { pod, .. } => Some(pod.to_string()),
            _ => None,
        })
        .collect()
}

fn skip_reasons(plan: &Plan) -> Vec<(String, &'static str)> {
    plan.skips()
        .map(|s| (s.pod.to_string(), s.reason.as_str()))
        .collect()
}

/// A default spec with `action: DeletePods` (the default is `OutOfServiceTaint`).
fn delete_pods() -> PodHAPolicySpec {
    with_action(mk_spec(), Action::DeletePods)
}

fn with_action(mut spec: PodHAPolicySpec, action: Action) -> PodHAPolicySpec {
    spec.action = action;
    spec
}

fn dry_run(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.dry_run = true;
    spec
}

fn max_unhealthy(mut spec: PodHAPolicySpec, max: i32) -> PodHAPolicySpec {
    spec.safety.max_unhealthy = IntOrString::Int(max);
    spec
}

fn ns_selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..LabelSelector::default()
    }
}

#[test]
fn failed_node_is_fenced_then_its_eligible_pod_force_deleted() {
    let mut world = World::new(cluster(3))
        .policy("p", delete_pods())
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        plan.intents,
        vec![Intent::TaintNode {
            node: "node-1".into(),
            policy: "p".into(),
            taint: NodeTaint::Fence,
            agent_lease_seen: None,
        }]
    );
    assert_eq!(plan.skips().count(), 0, "{:?}", plan.verdicts);

    world.taint_landed("node-1");
    let plan = world.plan();
    let expected_uid = uid(&world.view, "node-1", "db-0");
    assert_eq!(
        plan.intents,
        vec![Intent::ForceDeletePod {
            pod: ObjectKey::new("ns", "db-0"),
            uid: expected_uid,
            node: "node-1".into(),
            policy: "p".into(),
            owner_kind: "StatefulSet".to_string(),
            resource_version: None,
        }]
    );
    assert_eq!(plan.skips().count(), 0, "{:?}", plan.verdicts);
}

#[test]
fn nothing_happens_before_the_node_is_failed() {
    let t0 = Instant::now();
    for health in [
        NodeHealth::Healthy,
        NodeHealth::Suspect {
            failures: 2,
            since: t0,
        },
    ] {
        let mut world = World::new(cluster(3)).policy("p", mk_spec());
        // Even with an incident opened by another policy's judgement, this policy decides.
        world.ledger.open("node-1", "p", None, t0, &world.view);
        let world = world.set_health("p", "node-1", health);
        assert_eq!(world.plan(), Plan::default(), "{health:?}");
    }
}

#[test]
fn without_an_open_incident_nothing_is_done() {
    let failed = NodeHealth::Failed {
        since: Instant::now(),
    };
    let world = World::new(cluster(3))
        .policy("p", mk_spec())
        .set_health("p", "node-1", failed);
    assert_eq!(world.plan(), Plan::default());
}

#[test]
fn a_pod_deleted_once_is_never_deleted_again() {
    let mut world = World::new(cluster(3)).policy("p", mk_spec()).fail("node-1");
    let uid = uid(&world.view, "node-1", "db-0");
    world.ledger.record_deleted("node-1", &uid);
    let plan = world.plan();
    assert_eq!((plan.skips().count(), plan.intents), (0, vec![]));
    let judged: Vec<_> = plan.verdicts.iter().flat_map(|v| &v.pods).collect();
    assert!(
        judged.is_empty(),
        "a deleted pod is judged no more: {judged:?}"
    );
}

#[test]
fn a_pod_bound_after_the_incident_opened_is_a_replacement() {
    let world = World::new(cluster(3))
        .policy("p", mk_spec())
        .fail_tainted("node-1");
    // The StatefulSet's replacement lands on the dead node before the scheduler learns it is dead.
    let replacement = mk_pod("ns", "db-0")
        .uid("uid-replacement")
        .on("node-1")
        .owned_by_sts("db")
        .claim("data-db-0");
    let mut world = world;
    world.view = world.view.clone().with(replacement);
    let plan = world.plan();
    assert_eq!(
        deletes(&plan),
        vec!["ns/db-0"],
        "the original is still deleted"
    );
    assert!(
        plan.skips()
            .any(|s| s.uid == "uid-replacement" && s.reason == Skip::Replacement),
        "{:?}",
        plan.verdicts
    );
}

#[test]
fn ineligible_pods_are_skipped_with_their_reason() {
    let view = cluster(3)
        .with(mk_pod("ns", "bare").on("node-1").claim("data-bare"))
        .with(mk_pvc("ns", "data-bare").bound_to("pv-bare"))
        .with(mk_csi_pv("pv-bare", DRIVER))
        .with(
            mk_pod("ns", "out")
                .on("node-1")
                .owned_by_sts("out")
                .claim("data-out")
                .annotation(crate::api::FAILOVER_ANNOTATION, "false"),
        )
        .with(mk_pvc("ns", "data-out").bound_to("pv-out"))
        .with(mk_csi_pv("pv-out", DRIVER));
    let plan = World::new(view)
        .policy("p", mk_spec())
        .fail_tainted("node-1")
        .plan();
    assert_eq!(deletes(&plan), vec!["ns/db-0"]);
    let mut skips = skip_reasons(&plan);
    skips.sort();
    assert_eq!(
        skips,
        vec![
            ("ns/bare".to_string(), "NoControllerOwner"),
            ("ns/out".to_string(), "OptedOut")
        ]
    );
}

#[test]
fn finished_pods_are_ignored() {
    let view = cluster(3).with(
        mk_pod("ns", "job")
            .on("node-1")
            .owned_by_sts("job")
            .claim("c")
            .phase("Succeeded"),
    );
    let plan = World::new(view)
        .policy("p", mk_spec())
        .fail_tainted("node-1")
        .plan();
    assert_eq!(deletes(&plan), vec!["ns/db-0"]);
    assert_eq!(plan.skips().count(), 0, "{:?}", plan.verdicts);
}

#[test]
fn pods_move_only_once_the_out_of_service_taint_is_on() {
    let spec = with_action(mk_spec(), Action::OutOfServiceTaint);
    let mut world = World::new(cluster(3)).policy("p", spec).fail("node-1");
    assert_eq!(
        world.plan().intents,
        [Intent::TaintNode {
            node: "node-1".into(),
            policy: "p".into(),
            taint: NodeTaint::OutOfService,
            agent_lease_seen: None,
        }],
        "the writer runs actions concurrently: no delete may race the taint"
    );
    world.taint_landed("node-1");
    let plan = world.plan();
    assert_eq!(deletes(&plan), vec!["ns/db-0"]);
    assert_eq!(plan.intents.len(), 1);
}

#[test]
fn the_taint_is_added_once_per_incident() {
    let spec = with_action(mk_spec(), Action::OutOfServiceTaint);
    let mut world = World::new(cluster(3)).policy("p", spec).fail("node-1");
    world.taint_landed("node-1");
    assert!(
        !world
            .plan()
            .intents
            .iter()
            .any(|i| matches!(i, Intent::TaintNode { .. }))
    );

    // Also when the ledger was lost (a restart) but the node carries the taint.
    let spec = with_action(mk_spec(), Action::OutOfServiceTaint);
    let mut view = cluster(3);
    let tainted = (*view.nodes["node-1"]).clone().taint(
        crate::api::OUT_OF_SERVICE_TAINT_KEY,
        "nodeshutdown",
        "NoExecute",
    );
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(tainted));
    let plan = World::new(view).policy("p", spec).fail("node-1").plan();
    assert!(
        !plan
            .intents
            .iter()
            .any(|i| matches!(i, Intent::TaintNode { .. }))
    );
    assert_eq!(deletes(&plan), vec!["ns/db-0"]);
}

#[test]
fn no_taint_when_no_pod_would_move() {
    let spec = with_action(mk_spec(), Action::OutOfServiceTaint).owners(&[OwnerKind::REPLICA_SET]);
    let plan = World::new(cluster(3))
        .policy("p", spec)
        .fail("node-1")
        .plan();
    assert!(plan.intents.is_empty(), "{:?}", plan.intents);
    assert_eq!(
        skip_reasons(&plan),
        vec![("ns/db-0".to_string(), "OwnerKindNotSelected")]
    );
}

#[test]
fn no_target_means_no_delete() {
    // Two nodes: the other one is cordoned, so nothing could take the pod.
    let mut view = cluster(2);
    let cordoned = (*view.nodes["node-2"]).clone().unschedulable();
    view.nodes
        .insert("node-2".into(), std::sync::Arc::new(cordoned));
    let plan = World::new(view)
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert!(plan.intents.is_empty(), "{:?}", plan.intents);
    assert_eq!(
        skip_reasons(&plan),
        vec![("ns/db-0".to_string(), "NoTargetNode")]
    );
}

#[test]
fn a_suspect_node_is_no_target() {
    let t0 = Instant::now();
    let world = World::new(cluster(2))
        .policy("p", max_unhealthy(mk_spec(), 2))
        .fail("node-1")
        .set_health(
            "p",
            "node-2",
            NodeHealth::Suspect {
                failures: 1,
                since: t0,
            },
        );
    assert_eq!(
        skip_reasons(&world.plan()),
        vec![("ns/db-0".to_string(), "NoTargetNode")]
    );
}

#[test]
fn too_many_failed_nodes_hold_every_action() {
    let spec = with_action(max_unhealthy(mk_spec(), 1), Action::OutOfServiceTaint);
    let view = cluster(4)
        .with(
            mk_pod("ns", "web-0")
                .on("node-2")
                .owned_by_sts("web")
                .claim("data-web-0"),
        )
        .with(mk_pvc("ns", "data-web-0").bound_to("pv-web"))
        .with(mk_csi_pv("pv-web", DRIVER));
    let plan = World::new(view)
        .policy("p", spec)
        .fail("node-1")
        .fail("node-2")
        .plan();
    assert_eq!(
        plan.intents,
        vec![Intent::Hold {
            policy: "p".into(),
            node: None,
            reason: HoldReason::TooManyUnhealthy {
                failed: 2,
                watched: 4,
                max: 1
            },
        }]
    );
    let mut skips = skip_reasons(&plan);
    skips.sort();
    assert_eq!(
        skips,
        vec![("ns/db-0".into(), "Held"), ("ns/web-0".into(), "Held")]
    );
}

#[test]
fn at_the_limit_podha_still_acts() {
    let plan = World::new(cluster(4))
        .policy("p", max_unhealthy(mk_spec(), 2))
        .fail_tainted("node-1")
        .fail_tainted("node-3")
        .plan();
    assert_eq!(deletes(&plan), vec!["ns/db-0"]);
}

#[test]
fn dry_run_turns_every_action_into_a_hold() {
    let spec = dry_run(with_action(mk_spec(), Action::OutOfServiceTaint));
    let plan = World::new(cluster(3))
        .policy("p", spec)
        .fail("node-1")
        .plan();
    let would: Vec<&Intent> = plan
        .intents
        .iter()
        .map(|i| match i {
            Intent::Hold {
                reason: HoldReason::DryRun { would },
                node: Some(node),
                ..
            } => {
                assert_eq!(node, "node-1");
                would.as_ref()
            }
            other => panic!("dry run produced an action: {other:?}"),
        })
        .collect();
    assert!(matches!(would[0], Intent::TaintNode { .. }), "{would:?}");
    assert!(
        matches!(would[1], Intent::ForceDeletePod { .. }),
        "{would:?}"
    );
    assert_eq!(would.len(), 2);
}

#[test]
fn the_first_policy_by_name_decides_about_a_pod() {
    let view = cluster(3)
        .with(mk_namespace("ns").label("team", "a"))
        .with(
            mk_pod("other", "db-0")
                .on("node-1")
                .owned_by_sts("db")
                .claim("data"),
        )
        .with(mk_pvc("other", "data").bound_to("pv-other"))
        .with(mk_csi_pv("pv-other", DRIVER));
    // "b-all" selects everything with DeletePods; "a-team" selects namespace ns in dry run.
    let world = World::new(view)
        .policy("b-all", delete_pods())
        .policy(
            "a-team",
            dry_run(delete_pods().namespace_selector(ns_selector("team", "a"))),
        )
        .fail("node-1");
    let plan = world.plan();
    // a-team (first by name) owns the node too: its dry run rehearses everything on the node,
    // b-all's pod included; b-all still decides about its own pod.
    assert_eq!(deletes(&plan), Vec::<String>::new());
    let held: Vec<_> = plan
        .intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                policy,
                reason: HoldReason::DryRun { would },
                ..
            } => Some((policy.clone(), would.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(matches!(
        (&held[0].0, &*held[0].1),
        (p, Intent::TaintNode { taint: NodeTaint::Fence, .. }) if p == "a-team"
    ));
    assert!(matches!(
        (&held[1].0, &*held[1].1),
        (p, Intent::ForceDeletePod { pod, .. }) if p == "a-team" && pod.to_string() == "ns/db-0"
    ));
    assert!(matches!(
        (&held[2].0, &*held[2].1),
        (p, Intent::ForceDeletePod { pod, .. }) if p == "b-all" && pod.to_string() == "other/db-0"
    ));
}

#[test]
fn only_the_owning_policy_judgement_counts() {
    let t0 = Instant::now();
    let mut world = World::new(cluster(3))
        .policy("a", mk_spec())
        .policy("b", mk_spec())
        .fail_tainted("node-1")
        // "a" owns the pod (first by name) but does not judge the node dead (yet).
        .set_health(
            "a",
            "node-1",
            NodeHealth::Suspect {
                failures: 1,
                since: t0,
            },
        );
    assert_eq!(world.plan(), Plan::default());
    world = world.set_health("a", "node-1", NodeHealth::Failed { since: t0 });
    assert_eq!(deletes(&world.plan()), vec!["ns/db-0"]);
}

#[test]
fn plans_do_not_depend_on_policy_order() {
    let view = cluster(3);
    let a = World::new(view.clone())
        .policy("x", with_action(mk_spec(), Action::OutOfServiceTaint))
        .policy("y", mk_spec())
        .fail("node-1");
    let b = World::new(view)
        .policy("y", mk_spec())
        .policy("x", a.specs[0].1.clone())
        .fail("node-1");
    assert_eq!(a.plan(), b.plan());
}

fn tainted_by_podha(view: &mut View, node: &str) {
    let marked = (*view.nodes[node])
        .clone()
        .taint(
            crate::api::OUT_OF_SERVICE_TAINT_KEY,
            "nodeshutdown",
            "NoExecute",
        )
        .annotation(TAINT_MARKER_ANNOTATION, "p");
    view.nodes.insert(node.into(), std::sync::Arc::new(marked));
}

#[test]
fn podha_removes_its_taint_once_the_node_is_back_and_empty() {
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let world = World::new(view).policy("p", mk_spec()).back("node-1");
    assert_eq!(
        world.plan().intents,
        vec![Intent::RemoveTaint {
            node: "node-1".into()
        }]
    );
}

/// A node back with attachments podha cannot trace to a claim (an inline volume, a PV without a
/// claim): no pod podha moved uses them, so they keep no taint; a claim's volume whose pod moved
/// away keeps it until it is detached.
#[test]
fn only_attachments_of_moved_claims_keep_the_taint_on_a_node_that_is_back() {
    let mut inline = mk_va("va-inline", DRIVER, "unused", "node-1");
    inline.spec.source.persistent_volume_name = None;
    inline.spec.source.inline_volume_spec = Some(Default::default());
    let mut view = cluster(3)
        .with(mk_csi_pv("pv-scratch", DRIVER))
        .with(inline)
        .with(mk_va("va-scratch", DRIVER, "pv-scratch", "node-1"))
        .with(mk_va("va-gone", DRIVER, "pv-deleted", "node-1"))
        .with(mk_va("va-db", DRIVER, "pv-db", "node-1"));
    tainted_by_podha(&mut view, "node-1");
    let untaint = vec![Intent::RemoveTaint {
        node: "node-1".into(),
    }];
    // db-0 came back with its node: every attachment serves it or is no claim's.
    let world = World::new(view.clone())
        .policy("p", mk_spec())
        .back("node-1");
    assert_eq!(world.plan().intents, untaint);
    // db-0 moved away: its volume's attachment keeps the taint until it is gone.
    view.pods_by_node.remove("node-1");
    let world = World::new(view.clone())
        .policy("p", mk_spec())
        .back("node-1");
    assert!(world.plan().intents.is_empty(), "{:?}", world.plan());
    view.attachments_by_node
        .get_mut("node-1")
        .expect("attachments")
        .retain(|va| va.metadata.name.as_deref() != Some("va-db"));
    let world = World::new(view).policy("p", mk_spec()).back("node-1");
    assert_eq!(world.plan().intents, untaint);
}

/// The policy that tainted the node was deleted mid-incident: the taint still leaves once the
/// node is back (removing taints follows podha's marker, not a policy), and not before.
#[test]
fn a_taint_outlives_its_deleted_policy_only_until_the_node_is_back() {
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let world = World::new(view);
    assert!(
        world.plan().intents.is_empty(),
        "still dead: the taint stays"
    );
    assert_eq!(
        world.back("node-1").plan().intents,
        vec![Intent::RemoveTaint {
            node: "node-1".into()
        }]
    );
}

/// A new leader (or a restarted podha) sees its taint on a node that died seconds ago: Ready
/// is still True (the node lifecycle controller waits 40 s) and its fresh tracker remembers no
/// failure. Only a Lease renewal seen after the taint proves the node back. Found by the
/// leader-change scenario: the new leader took the out-of-service taint off the dead node one
/// second after taking over.
#[test]
fn the_taint_stays_until_the_node_renews_after_it_was_seen() {
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let world = World::new(view).policy("p", mk_spec());
    assert!(world.plan().intents.is_empty(), "no renewal seen at all");
    let mut world = world.back("node-1");
    let hb = world
        .heartbeats
        .get_mut("node-1")
        .expect("inserted by back");
    hb.last_renewal = Some(world.t0 - Duration::from_secs(3));
    assert!(
        world.plan().intents.is_empty(),
        "renewed only before the taint was seen"
    );
    let world = world.back("node-1");
    assert_eq!(
        world.plan().intents,
        vec![Intent::RemoveTaint {
            node: "node-1".into()
        }]
    );
}

#[test]
fn the_taint_stays_while_anything_is_unsafe() {
    let t0 = Instant::now();
    // A VolumeAttachment still on the node.
    let mut view = cluster(3).with(mk_va("va-1", DRIVER, "pv-db", "node-1"));
    tainted_by_podha(&mut view, "node-1");
    assert!(
        World::new(view)
            .policy("p", mk_spec())
            .plan()
            .intents
            .is_empty()
    );

    // The node is not Ready.
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let not_ready = (*view.nodes["node-1"]).clone().ready(false);
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(not_ready));
    assert!(
        World::new(view)
            .policy("p", mk_spec())
            .plan()
            .intents
            .is_empty()
    );

    // A policy still suspects it.
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let world = World::new(view).policy("p", mk_spec()).set_health(
        "p",
        "node-1",
        NodeHealth::Suspect {
            failures: 1,
            since: t0,
        },
    );
    assert!(world.plan().intents.is_empty());

    // Somebody else's taint (no marker) is never removed.
    let mut view = cluster(3);
    let foreign = (*view.nodes["node-1"]).clone().taint(
        crate::api::OUT_OF_SERVICE_TAINT_KEY,
        "nodeshutdown",
        "NoExecute",
    );
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(foreign));
    assert!(
        World::new(view)
            .policy("p", mk_spec())
            .plan()
            .intents
            .is_empty()
    );
}

#[test]
fn untaint_in_dry_run_is_held() {
    let mut view = cluster(3);
    tainted_by_podha(&mut view, "node-1");
    let intents = World::new(view)
        .policy("p", dry_run(mk_spec()))
        .back("node-1")
        .plan()
        .intents;
    assert!(
        matches!(&intents[..], [Intent::Hold { reason: HoldReason::DryRun { would }, .. }]
            if **would == Intent::RemoveTaint { node: "node-1".into() }),
        "{intents:?}"
    );
}

#[test]
fn ledger_snapshots_the_pods_on_the_node() {
    let view = cluster(3);
    let mut ledger = Ledger::default();
    let t0 = Instant::now();
    assert!(ledger.open("node-1", "p", None, t0, &view));
    assert!(
        !ledger.open("node-1", "p", None, t0, &view),
        "an open incident is not reopened"
    );
    let incident = ledger.get("node-1").expect("open");
    assert_eq!(incident.pods_at_failure.len(), 1);
    assert!(
        incident
            .pods_at_failure
            .contains(&uid(&view, "node-1", "db-0"))
    );
    assert!(ledger.close("node-1", Instant::now()).is_some());
    assert!(ledger.get("node-1").is_none());
}

/// The heartbeat of a node whose kubelet last renewed its Lease `at` (every 10 s), with no
/// other signal heard.
fn renewed_at(at: Instant) -> Heartbeat {
    Heartbeat {
        last_renewal: Some(at),
        renewal_not_before: Some(at),
        ..Heartbeat::silent_since(at, Duration::from_secs(10))
    }
}

fn intent_names(plan: &Plan) -> Vec<String> {
    plan.intents
        .iter()
        .map(|i| match i {
            Intent::MarkPodNotReady { pod, .. } => format!("mark {pod}"),
            Intent::ForceDeletePod {
                pod,
                resource_version: None,
                ..
            } => format!("delete {pod}"),
            Intent::ForceDeletePod {
                pod,
                resource_version: Some(v),
                ..
            } => format!("delete {pod} in version {v}"),
            Intent::TaintNode { node, taint, .. } => format!("taint {node} {}", taint.key()),
            Intent::RemoveTaint { node } => format!("untaint {node}"),
            Intent::RequestFence { node, .. } => format!("request fence {node}"),
            Intent::WithdrawFenceRequest { node } => format!("withdraw fence request {node}"),
            Intent::PowerOff { node, .. } => format!("power off {node}"),
            Intent::ConfirmPowerOff { node, .. } => format!("read power of {node}"),
            Intent::PowerOn { node, .. } => format!("power on {node}"),
            Intent::Hold { reason, .. } => format!("hold {}", reason.as_str()),
        })
        .collect()
}

/// `cluster(3)` with `db-0` still Ready, as the dead kubelet last reported it.
fn cluster_with_ready_pod() -> View {
    let mut view = cluster(3);
    view.pods_by_node.insert(
        "node-1".into(),
        vec![std::sync::Arc::new(
            mk_pod("ns", "db-0")
                .on("node-1")
                .owned_by_sts("db")
                .claim("data-db-0")
                .ready(true),
        )],
    );
    view
}

#[test]
fn a_ready_pod_on_a_dead_node_is_marked_not_ready_before_it_is_deleted() {
    let mut world = World::new(cluster_with_ready_pod())
        .policy("p", delete_pods())
        .fail("node-1");
    // The mark goes out before the taint: it moves nothing.
    assert_eq!(intent_names(&world.plan()), ["mark ns/db-0"]);
    let uid = uid(&world.view, "node-1", "db-0");
    world
        .ledger
        .record_marked_not_ready("node-1", &uid, Some("7".into()));
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 podha.io/fenced"]
    );

    // Marked and fenced: delete at once, in the version the mark produced (the watch still
    // shows Ready).
    world.taint_landed("node-1");
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0 in version 7"]);

    // The pod changed after the mark (the delete found another version) and the watch still
    // shows it Ready: wait, do not mark again nor delete.
    world.ledger.record_changed_since_mark("node-1", &uid);
    let plan = world.plan();
    assert!(plan.intents.is_empty(), "{:?}", plan.intents);
    assert_eq!(plan.skips().count(), 0, "{:?}", plan.verdicts);

    // The watch shows it not Ready: delete.
    world.view = cluster(3);
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0"]);
}

#[test]
fn ready_pods_that_would_not_move_are_not_marked() {
    let view = cluster(3)
        .with(
            mk_pod("ns", "bare")
                .on("node-1")
                .claim("data-db-0")
                .ready(true),
        )
        .with(
            mk_pod("ns", "scratch")
                .on("node-1")
                .owned_by_sts("s")
                .empty_dir("tmp")
                .ready(true),
        );
    let plan = World::new(view)
        .policy("p", delete_pods())
        .fail_tainted("node-1")
        .plan();
    assert_eq!(intent_names(&plan), ["delete ns/db-0"]);
    let mut skips = skip_reasons(&plan);
    skips.sort();
    assert_eq!(
        skips,
        vec![
            ("ns/bare".to_string(), "NoControllerOwner"),
            ("ns/scratch".to_string(), "NoPersistentVolumeClaim")
        ]
    );
}

#[test]
fn a_marked_pod_is_deleted_only_once_the_taint_is_on() {
    let spec = with_action(mk_spec(), Action::OutOfServiceTaint);
    let mut world = World::new(cluster_with_ready_pod())
        .policy("p", spec)
        .fail("node-1");
    // An update of the pod after the taint would have the taint eviction controller queue its
    // delete by name again: the mark goes first, alone.
    assert_eq!(intent_names(&world.plan()), ["mark ns/db-0"]);
    // The mark landed: the taint is still to come, so no delete yet.
    let uid = uid(&world.view, "node-1", "db-0");
    world
        .ledger
        .record_marked_not_ready("node-1", &uid, Some("7".into()));
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
    world.taint_landed("node-1");
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0 in version 7"]);
}

#[test]
fn delete_pods_fences_the_node_so_no_replacement_lands_there() {
    // The node lifecycle controller has not tainted the dead node yet (it waits 50 s by
    // default); without the fence the scheduler may put the replacement right back.
    let plan = World::new(cluster(3))
        .policy("p", delete_pods())
        .fail("node-1")
        .plan();
    assert!(matches!(
        plan.intents.first(),
        Some(Intent::TaintNode { taint: NodeTaint::Fence, node, .. }) if node == "node-1"
    ));
    assert_eq!(
        NodeTaint::Fence.effect(),
        "NoSchedule",
        "a fence evicts nothing"
    );

    // Fenced already (by podha before a restart, or by the ledger): not again.
    let mut view = cluster(3);
    let fenced = (*view.nodes["node-1"]).clone().taint(
        crate::api::FENCE_TAINT_KEY,
        "nodeDead",
        "NoSchedule",
    );
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(fenced));
    let plan = World::new(view)
        .policy("p", delete_pods())
        .fail("node-1")
        .plan();
    assert_eq!(intent_names(&plan), ["delete ns/db-0"]);
}

#[test]
fn the_fence_is_removed_like_the_out_of_service_taint() {
    let mut view = cluster(3);
    let fenced = (*view.nodes["node-1"])
        .clone()
        .taint(crate::api::FENCE_TAINT_KEY, "nodeDead", "NoSchedule")
        .annotation(TAINT_MARKER_ANNOTATION, "p");
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(fenced));
    let world = World::new(view).policy("p", mk_spec()).back("node-1");
    assert_eq!(
        world.plan().intents,
        vec![Intent::RemoveTaint {
            node: "node-1".into()
        }]
    );
}

mod bmc;
mod combined_proofs;
mod confirmed_proofs;
mod eviction;
mod fencing;
mod pause;
mod reboots;
mod safety;
mod tolerations;
