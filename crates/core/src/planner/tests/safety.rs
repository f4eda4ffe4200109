//! Safety of the fence: what the out-of-service taint may hit, when the fence
//! leaves, counting unhealthy nodes in a partition, and one rule for overlapping policies.

use std::time::Duration;

use super::*;
use crate::api::Signal;
use crate::planner::Heartbeat;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn refused(plan: &Plan) -> Vec<(String, &'static str)> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                reason: HoldReason::OutOfServiceRefused { pod, why },
                ..
            } => Some((pod.to_string(), *why)),
            _ => None,
        })
        .collect()
}

fn oos() -> PodHAPolicySpec {
    with_action(mk_spec(), Action::OutOfServiceTaint)
}

// ---- the out-of-service taint is node-wide ------------------------------------------

/// One eligible pod must not bring the taint down on pods podha would never move: a bare pod
/// (lost for good), an opted-out pod, a pod of another driver. The node gets the fence, the
/// eligible pod is deleted once it is on, and the refusal is reported.
#[test]
fn the_out_of_service_taint_is_refused_while_a_pod_that_must_stay_is_on_the_node() {
    let bare = mk_pod("ns", "bare").on("node-1").claim("bare-data");
    let opted_out = mk_pod("ns", "keep")
        .on("node-1")
        .owned_by_sts("keep")
        .annotation(crate::api::FAILOVER_ANNOTATION, "false");
    let other_driver = mk_pod("ns", "other-0")
        .on("node-1")
        .owned_by_sts("other")
        .claim("other-data");
    let cases = [
        (bare, "NoControllerOwner"),
        (opted_out, "OptedOut"),
        (other_driver, "DriverNotSelected"),
    ];
    for (pod, why) in cases {
        let name = format!("ns/{}", pod.metadata.name.clone().unwrap_or_default());
        let view = cluster(3)
            .with(pod)
            .with(mk_pvc("ns", "bare-data").bound_to("pv-bare"))
            .with(mk_csi_pv("pv-bare", DRIVER))
            .with(mk_pvc("ns", "other-data").bound_to("pv-other"))
            .with(mk_csi_pv("pv-other", "other.sim.podha.io"));
        let spec = oos().drivers(&[DRIVER]);
        let world = World::new(view).policy("p", spec).fail("node-1");
        let plan = world.plan();
        assert_eq!(
            taints(&plan),
            vec![("node-1".to_string(), NodeTaint::Fence)],
            "{why}"
        );
        assert_eq!(refused(&plan), vec![(name.clone(), why)], "{why}");
        assert!(
            deletes(&plan).is_empty(),
            "deletes wait for the fence ({why})"
        );

        let mut world = world;
        world.taint_landed("node-1");
        assert_eq!(deletes(&world.plan()), vec!["ns/db-0"], "{why}");
    }
}

/// A pod without claims and with a controller loses nothing to the taint (its controller
/// replaces it; the node lifecycle controller would evict it after 300 s anyway), and a pod
/// that moves anyway is no reason to refuse.
#[test]
fn stateless_controlled_pods_do_not_hold_back_the_out_of_service_taint() {
    let view = cluster(3).with(mk_pod("ns", "web-abc").on("node-1").owned_by_rs("web"));
    let plan = World::new(view).policy("p", oos()).fail("node-1");
    let plan = plan.plan();
    assert_eq!(
        taints(&plan),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );
    assert!(refused(&plan).is_empty());
}

// ---- one rule for overlapping policies ---------------------------------------------

/// "a" owns the node (first by name; its namespace selector selects no pod here), "b" owns the
/// pod. The pod moves only once "a" judges the node dead too, and never before a taint: today
/// the deletes went out with no taint when the node's policy was not Failed.
#[test]
fn the_nodes_policy_must_judge_the_node_dead_before_anything_moves() {
    let t0 = Instant::now();
    let a = oos().namespace_selector(ns_selector("team", "nobody"));
    let world = World::new(cluster(3))
        .policy("a", a)
        .policy("b", oos())
        .fail("node-1")
        .set_health(
            "a",
            "node-1",
            NodeHealth::Suspect {
                failures: 2,
                since: t0,
            },
        );
    let plan = world.plan();
    assert!(plan.intents.is_empty(), "{:?}", plan.intents);
    assert!(deletes(&plan).is_empty());

    let world = world.set_health("a", "node-1", NodeHealth::Failed { since: t0 });
    let plan = world.plan();
    assert_eq!(
        taints(&plan),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );
    assert!(deletes(&plan).is_empty(), "taint first");
}

/// A `DeletePods` policy's pods never get another policy's out-of-service taint, and an
/// `OutOfServiceTaint` policy's pod on a `DeletePods` node gets the fence: the node's policy
/// picks the taint, and the stricter of the two wins.
#[test]
fn overlapping_policies_never_taint_out_of_service_against_a_delete_pods_policy() {
    // Node policy "a" (OutOfServiceTaint, owns no pod here); pod policy "b" (DeletePods).
    let world = World::new(cluster(3))
        .policy("a", oos().namespace_selector(ns_selector("team", "nobody")))
        .policy("b", delete_pods())
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        taints(&plan),
        vec![("node-1".to_string(), NodeTaint::Fence)]
    );
    assert_eq!(
        refused(&plan),
        vec![("ns/db-0".to_string(), "PolicyActionDeletePods")]
    );

    // Node policy "a" (DeletePods), pod policy "b" (OutOfServiceTaint): the fence.
    let world = World::new(cluster(3))
        .policy(
            "a",
            delete_pods().namespace_selector(ns_selector("team", "nobody")),
        )
        .policy("b", oos())
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        taints(&plan),
        vec![("node-1".to_string(), NodeTaint::Fence)]
    );
    assert!(refused(&plan).is_empty());
}

/// The node's policy's hold holds the pods of every policy on the node.
#[test]
fn the_nodes_policy_hold_holds_every_pod_on_the_node() {
    let world = World::new(cluster(4))
        .policy(
            "a",
            max_unhealthy(oos(), 1).namespace_selector(ns_selector("team", "nobody")),
        )
        .policy("b", max_unhealthy(oos(), 3))
        .fail("node-1")
        .fail("node-2");
    let plan = world.plan();
    assert!(taints(&plan).is_empty());
    assert!(deletes(&plan).is_empty());
    assert_eq!(skip_reasons(&plan), vec![("ns/db-0".to_string(), "Held")]);
}

// ---- the fence protects the moved pods' volumes -----------------------------------

/// The node comes back with a pod podha left alone (a bare pod) still attached: its volume is
/// no reason to keep the fence, so the node takes new pods again. A volume of a pod that moved
/// away still holds it.
#[test]
fn the_fence_leaves_once_the_moved_pods_volumes_are_gone_whatever_stayed_attached() {
    let kept = mk_pod("ns", "bare").on("node-1").claim("bare-data");
    let mut view = View::default()
        .with(mk_node("node-1"))
        .with(mk_node("node-2"))
        .with(kept)
        .with(mk_pvc("ns", "bare-data").bound_to("pv-bare"))
        .with(mk_csi_pv("pv-bare", DRIVER).claimed_by("ns", "bare-data"))
        .with(mk_va("va-bare", DRIVER, "pv-bare", "node-1"));
    tainted_by_podha(&mut view, "node-1");
    let plan = World::new(view.clone())
        .policy("p", delete_pods())
        .back("node-1")
        .plan();
    assert_eq!(
        plan.intents,
        vec![Intent::RemoveTaint {
            node: "node-1".into()
        }]
    );

    // The moved pod (now on node-2, or not yet scheduled) still has its volume on node-1.
    let view = view
        .with(
            mk_pod("ns", "db-0")
                .on("node-2")
                .owned_by_sts("db")
                .claim("data-db-0"),
        )
        .with(mk_pvc("ns", "data-db-0").bound_to("pv-db"))
        .with(mk_csi_pv("pv-db", DRIVER).claimed_by("ns", "data-db-0"))
        .with(mk_va("va-db", DRIVER, "pv-db", "node-1"));
    let plan = World::new(view).policy("p", delete_pods()).plan();
    assert!(plan.intents.is_empty(), "{:?}", plan.intents);
}

// ---- counting unhealthy nodes in a partition --------------------------------------

/// Suspect nodes count: they are on their way to Failed, one probe interval behind.
#[test]
fn suspect_nodes_count_towards_max_unhealthy() {
    let t0 = Instant::now();
    let world = World::new(cluster(4))
        .policy("p", max_unhealthy(oos(), 1))
        .fail("node-1")
        .set_health(
            "p",
            "node-2",
            NodeHealth::Suspect {
                failures: 1,
                since: t0,
            },
        );
    let plan = world.plan();
    assert!(taints(&plan).is_empty());
    assert!(matches!(
        plan.intents.as_slice(),
        [Intent::Hold {
            reason: HoldReason::TooManyUnhealthy { failed: 2, .. },
            ..
        }]
    ));
}

/// Nodes failing one by one, each back before the next dies, count together within
/// `safety.unhealthyWindow`: the second failure within the window is held with a limit of one.
#[test]
fn nodes_failing_one_by_one_count_together_within_the_window() {
    let mut world = World::new(cluster(4)).policy("p", max_unhealthy(oos(), 1));
    world
        .ledger
        .open("node-3", "p", None, world.t0, &world.view);
    world.ledger.close("node-3", world.t0 + s(60));
    world.now = world.t0 + s(120);
    let world = world.fail("node-1");
    let plan = world.plan();
    assert!(taints(&plan).is_empty(), "{:?}", plan.intents);

    // Ten minutes on, the earlier failure no longer counts.
    let mut world = world;
    world.now = world.t0 + s(601);
    assert_eq!(
        taints(&world.plan()),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );
}

/// A partition of three nodes whose pods matter, the first judged dead being one with a pod:
/// the others' grace periods have not run out yet (they renewed later), but none of them has
/// renewed since the first went silent. podha waits; once they turn Suspect, the limit holds.
/// Today the first node was tainted at once.
#[test]
fn a_partition_is_held_even_when_the_first_node_judged_dead_has_pods() {
    let t0 = Instant::now();
    let hb = |last: u64| renewed_at(t0 + s(last));
    let mut world = World::new(cluster(6)).policy("p", max_unhealthy(oos(), 2));
    // node-1 went silent at t0+0; node-2 and node-3 (cut off with it) renewed last at 3 s
    // and 8 s; node-4..6 are fine and renew every 10 s.
    for (node, last) in [
        ("node-1", 0),
        ("node-2", 3),
        ("node-3", 8),
        ("node-4", 9),
        ("node-5", 11),
        ("node-6", 13),
    ] {
        world.heartbeats.insert(node.into(), hb(last));
    }
    world.now = t0 + s(14);
    let world = world.fail("node-1");
    let plan = world.plan();
    assert!(plan.intents.is_empty(), "waits: {:?}", plan.intents);

    // node-4 renews at 19 s; node-2 and node-3 never do and turn Suspect.
    let mut world = world
        .set_health(
            "p",
            "node-2",
            NodeHealth::Suspect {
                failures: 1,
                since: t0 + s(15),
            },
        )
        .set_health(
            "p",
            "node-3",
            NodeHealth::Suspect {
                failures: 1,
                since: t0 + s(20),
            },
        );
    world.heartbeats.insert("node-4".into(), hb(19));
    world.now = t0 + s(21);
    let plan = world.plan();
    assert!(taints(&plan).is_empty(), "{:?}", plan.intents);
    assert!(matches!(
        plan.intents.as_slice(),
        [Intent::Hold {
            reason: HoldReason::TooManyUnhealthy { failed: 3, .. },
            ..
        }]
    ));
}

/// One dead node among live ones: podha acts as soon as every other node has renewed since
/// the dead one went silent plus one renew interval, and reports a wait that lasts too long.
#[test]
fn one_dead_node_is_acted_on_once_the_others_were_heard_from() {
    let t0 = Instant::now();
    let hb = |last: u64| Heartbeat {
        last_renewal: Some(t0 + s(last)),
        renewal_not_before: Some(t0 + s(last)),
        ..Heartbeat::silent_since(t0 + s(last), s(10))
    };
    let mut world = World::new(cluster(3)).policy("p", max_unhealthy(oos(), 1));
    world.heartbeats.insert("node-1".into(), hb(0));
    world.heartbeats.insert("node-2".into(), hb(12));
    world.heartbeats.insert("node-3".into(), hb(5));
    world.now = t0 + s(14);
    let mut world = world.fail("node-1");
    assert!(
        world.plan().intents.is_empty(),
        "node-3 not heard from since"
    );

    world.heartbeats.insert("node-3".into(), hb(15));
    world.now = t0 + s(15);
    assert_eq!(
        taints(&world.plan()),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );

    // A node that is never heard from again (and never judged dead either, e.g. a node whose
    // Lease podha does not see): the wait is reported after two more renew intervals.
    world.heartbeats.insert("node-3".into(), hb(5));
    world.now = t0 + s(31);
    assert!(matches!(
        world.plan().intents.as_slice(),
        [Intent::Hold {
            reason: HoldReason::Unconfirmed {
                unheard: 1,
                watched: 3
            },
            ..
        }]
    ));
}

/// With the kubelet port probed every interval, the dead node is certainly silent once its
/// port stopped answering, not only one renew interval after its last renewal: the others are
/// heard from as soon as a probe they answered was sent after that. The settle costs about
/// one probe instead of up to a renew interval (it doubled a fast failover). It stays safe: a
/// node that answered only before, or a cut that silences every port (podha cut off with the
/// API server), still waits; a port silent since before the last renewal says nothing.
#[test]
fn with_the_kubelet_port_probed_the_others_are_heard_from_within_a_probe() {
    let t0 = Instant::now();
    let hb = |renewed: u64, answered: u64, port_silent: Option<u64>| Heartbeat {
        last_renewal: Some(t0 + s(renewed)),
        renewal_not_before: Some(t0 + s(renewed)),
        tcp_answered: Some(t0 + s(answered)),
        tcp_silent_since: port_silent.map(|p| t0 + s(p)),
        ..Heartbeat::silent_since(t0 + s(renewed), s(10))
    };
    let mut tcp = max_unhealthy(oos(), 1);
    tcp.detection.signals = vec![Signal::Lease, Signal::KubeletTCP];
    let world = |spec: PodHAPolicySpec, beats: [Heartbeat; 3]| {
        let mut w = World::new(cluster(3)).policy("p", spec);
        for (i, hb) in beats.into_iter().enumerate() {
            w.heartbeats.insert(format!("node-{}", i + 1), hb);
        }
        w.now = t0 + s(14);
        w.fail("node-1")
    };
    // node-1 renewed at 0, its port silent from 2; the others renewed at 1 and 2 (before the
    // missed renewal at 10) but answered probes sent at 3.
    let dead = hb(0, 1, Some(2));
    let beats = [dead, hb(1, 3, None), hb(2, 3, None)];
    assert_eq!(
        taints(&world(tcp.clone(), beats).plan()),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );
    // On the Lease alone, the same evidence waits for renewals after 10 s.
    assert!(
        world(max_unhealthy(oos(), 1), beats)
            .plan()
            .intents
            .is_empty()
    );
    // node-3 answered only before the port went silent: not heard from.
    let beats = [dead, hb(1, 3, None), hb(1, 1, None)];
    assert!(world(tcp.clone(), beats).plan().intents.is_empty());
    // Every port silent from 2 (podha and the API server cut off from all nodes): waits.
    let beats = [dead, hb(1, 1, Some(2)), hb(1, 1, Some(2))];
    assert!(world(tcp.clone(), beats).plan().intents.is_empty());
    // A port silent since before the last renewal (a firewall, not the death): nothing goes
    // out before the Lease misses a renewal, and the hold says why.
    let mut old_silence = hb(5, 1, None);
    old_silence.tcp_silent_since = Some(t0 + s(2));
    let beats = [old_silence, hb(1, 3, None), hb(2, 3, None)];
    assert_eq!(
        intent_names(&world(tcp, beats).plan()),
        ["hold NodeLeaseRenewing"]
    );
}

/// A policy that judges on probes alone (no Lease, no NodeReady) was told of the death by the
/// probe's silence, while the dead node's kubelet may still have renewed after it (a fault
/// between podha and the node alone): the cutoff is that silence, not a renew interval after
/// the last renewal, and the others are heard from by their next answers.
#[test]
fn judged_on_probes_alone_the_others_are_heard_from_after_the_probes_silence() {
    let t0 = Instant::now();
    let hb = |renewed: u64, answered: u64, silent: Option<u64>| Heartbeat {
        last_renewal: Some(t0 + s(renewed)),
        renewal_not_before: Some(t0 + s(renewed)),
        agent_answered: Some(t0 + s(answered)),
        agent_connected: Some(t0 + s(answered)),
        agent_armed: Some(t0 + s(answered)),
        agent_silent_since: silent.map(|p| t0 + s(p)),
        ..Heartbeat::silent_since(t0 + s(renewed), s(10))
    };
    let mut spec = max_unhealthy(oos(), 1);
    spec.detection.signals = vec![Signal::AgentHeartbeat];
    spec.fencing.proof = crate::api::FencingProof::AgentAcknowledged;
    let at = |now: u64, spec: PodHAPolicySpec, beats: [Heartbeat; 3]| {
        let mut w = World::new(cluster(3)).policy("p", spec);
        for (i, hb) in beats.into_iter().enumerate() {
            w.heartbeats.insert(format!("node-{}", i + 1), hb);
        }
        w.now = t0 + s(now);
        w.fail("node-1")
    };
    let world = |spec, beats| at(6, spec, beats);
    // Past the Lease's missed renewal (the last one at 5, a renew interval and the slack).
    let late = |spec, beats| at(5 + 10 + 3, spec, beats);
    // node-1's agent silent from 1, its kubelet renewing at 5; the others answered at 2. A
    // renewal after the probes went silent: podha's own path may be cut, so nothing is asked
    // of the node, and the hold says why.
    let dead = hb(5, 0, Some(1));
    let plan = world(spec.clone(), [dead, hb(0, 2, None), hb(0, 2, None)]).plan();
    assert_eq!(intent_names(&plan), ["hold NodeLeaseRenewing"]);
    // Once the Lease missed its renewal (none seen for a renew interval and the slack), the
    // settle rule passes: held only for the proof (no agent here to ask).
    let plan = late(spec.clone(), [dead, hb(0, 2, None), hb(0, 2, None)]).plan();
    assert_eq!(intent_names(&plan), ["hold FencingPending"]);
    // With the Lease listened to, the same: the renewal after the silence holds it.
    let mut with_lease = spec.clone();
    with_lease.detection.signals = vec![Signal::Lease, Signal::AgentHeartbeat];
    assert_eq!(
        intent_names(&world(with_lease, [dead, hb(0, 2, None), hb(0, 2, None)]).plan()),
        ["hold NodeLeaseRenewing"]
    );
    // A node heard only before the silence: waits.
    assert!(
        late(spec.clone(), [dead, hb(0, 2, None), hb(0, 0, None)])
            .plan()
            .intents
            .is_empty()
    );
    // Its kubelet renewing since says nothing of podha's own path to it (a NetworkPolicy
    // cutting podha off every agent leaves every Lease renewing): waits.
    assert!(
        late(spec.clone(), [dead, hb(0, 2, None), hb(5, 0, None)])
            .plan()
            .intents
            .is_empty()
    );
    // Judged on both probes: dead once the later of them fell silent (the port silent for long
    // at 0, the agent from 3): an answer at 2 comes before that.
    let mut both = spec.clone();
    both.detection.signals = vec![Signal::KubeletTCP, Signal::AgentHeartbeat];
    let mut two_silences = hb(5, 0, Some(3));
    two_silences.tcp_silent_since = Some(t0);
    assert!(
        late(both, [two_silences, hb(0, 2, None), hb(0, 2, None)])
            .plan()
            .intents
            .is_empty()
    );
}

// ---- a policy edited mid-incident -------------------------------------------------------------

/// A node failed over with `DeletePods` (fenced, db-0 deleted, its replacement waiting for the
/// volume); the user switches the policy to `OutOfServiceTaint`: the open incident gets the
/// out-of-service taint, so the volume detaches at once instead of after 6 minutes.
#[test]
fn switching_to_out_of_service_mid_incident_taints_the_fenced_node() {
    let fenced = |view: &mut View| {
        let node = (*view.nodes["node-1"])
            .clone()
            .taint(crate::api::FENCE_TAINT_KEY, "nodeDead", "NoSchedule")
            .annotation(TAINT_MARKER_ANNOTATION, "p");
        view.nodes
            .insert("node-1".into(), std::sync::Arc::new(node));
    };
    // db-0 already moved: its replacement is bound to node-2, its volume still on node-1.
    let mut view = View::default()
        .with(mk_node("node-1"))
        .with(mk_node("node-2"))
        .with(
            mk_pod("ns", "db-0")
                .on("node-2")
                .owned_by_sts("db")
                .claim("data-db-0"),
        )
        .with(mk_pvc("ns", "data-db-0").bound_to("pv-db"))
        .with(mk_csi_pv("pv-db", DRIVER).claimed_by("ns", "data-db-0"))
        .with(mk_va("va-db", DRIVER, "pv-db", "node-1"));
    fenced(&mut view);
    let world = |spec| {
        let mut w = World::new(view.clone()).policy("p", spec).fail("node-1");
        w.taint_landed("node-1");
        w
    };
    assert!(taints(&world(delete_pods()).plan()).is_empty());
    assert_eq!(
        taints(&world(oos()).plan()),
        vec![("node-1".to_string(), NodeTaint::OutOfService)]
    );
    // In a dry run it is only said.
    assert!(taints(&world(dry_run(oos())).plan()).is_empty());

    // Once the volume has left, there is nothing to hurry.
    let mut view = view.clone();
    view.attachments_by_node.clear();
    let mut w = World::new(view).policy("p", oos()).fail("node-1");
    w.taint_landed("node-1");
    assert!(taints(&w.plan()).is_empty());
}

/// Every hold reason is exported from the start (`podha_actions_held_total` at 0), so
/// `HoldKind::ALL` must name each one.
#[test]
fn every_hold_reason_is_a_known_metric_label() {
    let reasons = [
        HoldReason::TooManyUnhealthy {
            failed: 0,
            watched: 0,
            max: 0,
        },
        HoldReason::DryRun {
            would: Box::new(Intent::RemoveTaint { node: "n".into() }),
        },
        HoldReason::Unconfirmed {
            unheard: 0,
            watched: 0,
        },
        HoldReason::LeaseRenewing {
            renewed_ago: Duration::ZERO,
        },
        HoldReason::OutOfServiceRefused {
            pod: crate::view::ObjectKey::new("ns", "p"),
            why: "x",
        },
        HoldReason::FencingPending {
            proof: crate::api::FencingProof::Agent.into(),
        },
        HoldReason::AgentSilenceUnproven {
            why: crate::planner::proof::SilenceDoubt::NeverHeard,
        },
        HoldReason::PolicyUnreadable {
            unreadable: "p".into(),
        },
    ];
    for reason in reasons {
        assert!(
            crate::planner::HoldKind::ALL.contains(&reason.kind()),
            "{}",
            reason.as_str()
        );
    }
}

/// A policy podha cannot read may select any node and pod: no policy after it by name (the
/// order in which policies own nodes and pods) acts in its place; one before it goes on.
#[test]
fn policies_after_an_unreadable_one_hold_every_action() {
    let world = |unreadable: &str| {
        let mut w = World::new(cluster(3))
            .policy("a-first", with_action(mk_spec(), Action::DeletePods))
            .policy("z-default", mk_spec())
            .fail("node-1");
        w.unreadable = vec![unreadable.to_string()];
        w
    };
    let plan = world("m-db").plan();
    let holds: Vec<(&str, &HoldReason)> = plan
        .intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                policy,
                node: None,
                reason,
            } => Some((policy.as_str(), reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        holds,
        [(
            "z-default",
            &HoldReason::PolicyUnreadable {
                unreadable: "m-db".into()
            }
        )]
    );
    // "a-first" owns node-1 and its pod: it acts (its fence first, the delete next round).
    assert!(
        plan.intents.iter().any(|i| matches!(
            i,
            Intent::TaintNode { policy, .. } if policy == "a-first"
        )),
        "{:?}",
        plan.intents
    );
    // Unreadable before every policy: nothing moves.
    let plan = world("0-db").plan();
    assert!(deletes(&plan).is_empty(), "{:?}", plan.intents);
    assert!(
        plan.intents
            .iter()
            .all(|i| matches!(i, Intent::Hold { .. })),
        "{:?}",
        plan.intents
    );
}
