//! `fencing.proof: BMC`: the node's BMC is asked to force the machine off once per incident,
//! read until it says `Off`, and only then is the out-of-service taint put on.

use super::*;
use crate::api::{BmcFencing, Fencing, FencingProof};
use crate::planner::proof::BMC_OFF_READS_APART;

fn needs_bmc(mut spec: PodHAPolicySpec, bmc: BmcFencing) -> PodHAPolicySpec {
    spec.fencing = Fencing {
        proof: FencingProof::Bmc,
        bmc: Some(bmc),
        ..Fencing::default()
    };
    spec
}

fn by_template() -> BmcFencing {
    BmcFencing {
        secret_name: Some("bmc-{node}".into()),
        secret_name_label: None,
        power_cycle: false,
        match_system_uuid: true,
    }
}

fn bmc_intents(plan: &Plan) -> Vec<String> {
    plan.intents
        .iter()
        .map(|i| match i {
            Intent::PowerOff { node, secret, .. } => format!("power off {node} by {secret}"),
            Intent::ConfirmPowerOff { node, secret, .. } => {
                format!("read power of {node} by {secret}")
            }
            other => intent_names(&Plan {
                intents: vec![other.clone()],
                ..Plan::default()
            })
            .remove(0),
        })
        .collect()
}

/// `node`'s BMC said `Off` twice, the second time at `last`: the reads the proof takes.
pub(super) fn read_off_twice(ledger: &mut Ledger, node: &str, last: Instant) {
    ledger.record_powered_off(node, last - BMC_OFF_READS_APART);
    ledger.record_powered_off(node, last);
}

/// `node-1` dead and tainted, its machine off: powered off by podha (`by_podha`) or found off.
fn off_and_tainted(power_cycle: bool, by_podha: bool) -> World {
    let bmc = BmcFencing {
        power_cycle,
        ..by_template()
    };
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), bmc))
        .fail_tainted("node-1");
    world.ledger.record_power_off("node-1", world.now, by_podha);
    read_off_twice(&mut world.ledger, "node-1", world.now);
    world
}

/// `node-1`'s failover is done.
fn recovered(world: &mut World) {
    world.ledger.get_mut("node-1").expect("open").recovered_at = Some(world.now);
}

/// How many `On`s this round asks of `node-1`'s BMC.
fn powers_on(world: &World) -> usize {
    world
        .plan()
        .intents
        .iter()
        .filter(|i| matches!(i, Intent::PowerOn { secret, .. } if secret == "bmc-node-1"))
        .count()
}

#[test]
fn the_bmc_is_asked_once_read_until_off_and_only_then_the_taint_goes_on() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    assert_eq!(
        bmc_intents(&world.plan()),
        ["power off node-1 by bmc-node-1", "hold FencingPending"],
        "nothing tainted or deleted before the proof"
    );
    world.ledger.record_power_off("node-1", world.now, true);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["read power of node-1 by bmc-node-1", "hold FencingPending"],
        "the ForceOff once per incident; then reads"
    );
    read_off_twice(&mut world.ledger, "node-1", world.now);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn one_off_read_proves_nothing_until_another_says_it_seconds_later() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    let first = world.now;
    world.ledger.record_power_off("node-1", first, true);
    world.ledger.record_powered_off("node-1", first);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["hold FencingPending"],
        "one Off is no proof, and the next read waits"
    );
    // A read sooner (an answer late, another replica's) is no second look.
    world.now = first + Duration::from_secs(1);
    world.ledger.record_powered_off("node-1", world.now);
    assert_eq!(bmc_intents(&world.plan()), ["hold FencingPending"]);
    world.now = first + BMC_OFF_READS_APART;
    assert_eq!(
        bmc_intents(&world.plan()),
        ["read power of node-1 by bmc-node-1", "hold FencingPending"]
    );
    // A read that is not Off between the two: the pair starts over.
    world.ledger.record_not_off("node-1");
    world.ledger.record_powered_off("node-1", world.now);
    assert_eq!(bmc_intents(&world.plan()), ["hold FencingPending"]);
    world.now += BMC_OFF_READS_APART;
    world.ledger.record_powered_off("node-1", world.now);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn a_node_heard_after_the_first_off_is_not_proven_off() {
    type Heard = fn(&mut Heartbeat, Instant);
    let answers: [(&str, Heard); 3] = [
        ("kubelet port", |hb, at| hb.tcp_answered = Some(at)),
        ("agent or its host", |hb, at| hb.agent_answered = Some(at)),
        ("Lease", |hb, at| hb.renewal_not_before = Some(at)),
    ];
    for (what, heard) in answers {
        let mut world = World::new(cluster(3))
            .policy("p", needs_bmc(mk_spec(), by_template()))
            .fail("node-1");
        let first_off = world.now - BMC_OFF_READS_APART;
        let accepted = first_off - Duration::from_secs(1);
        world.ledger.record_power_off("node-1", accepted, true);
        read_off_twice(&mut world.ledger, "node-1", world.now);
        let mut hb = renewed_at(first_off - Duration::from_secs(60));
        heard(&mut hb, first_off - Duration::from_millis(500));
        world.heartbeats.insert("node-1".into(), hb);
        assert_eq!(
            bmc_intents(&world.plan()),
            ["taint node-1 node.kubernetes.io/out-of-service"],
            "{what} heard before the first Off"
        );
        heard(&mut hb, first_off + Duration::from_secs(1));
        world.heartbeats.insert("node-1".into(), hb);
        assert_eq!(
            bmc_intents(&world.plan()),
            ["hold FencingPending"],
            "{what} heard between the two Offs"
        );
    }
}

#[test]
fn an_off_read_without_an_accepted_power_off_proves_nothing() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    // Reads recorded before any ForceOff was accepted (nothing to confirm) are not kept.
    read_off_twice(&mut world.ledger, "node-1", world.now);
    assert_eq!(world.ledger.get("node-1").expect("open").power_off, None);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["power off node-1 by bmc-node-1", "hold FencingPending"]
    );
}

#[test]
fn a_node_without_the_label_naming_its_secret_is_held_and_never_powered_off() {
    let bmc = BmcFencing {
        secret_name: None,
        secret_name_label: Some("example.com/bmc-secret".into()),
        power_cycle: false,
        match_system_uuid: true,
    };
    let unlabelled = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), bmc.clone()))
        .fail("node-1");
    assert_eq!(bmc_intents(&unlabelled.plan()), ["hold FencingPending"]);

    let mut view = cluster(3);
    let labelled = (*view.nodes["node-1"])
        .clone()
        .label("example.com/bmc-secret", "rack4-u12");
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(labelled));
    let world = World::new(view)
        .policy("p", needs_bmc(mk_spec(), bmc))
        .fail("node-1");
    assert_eq!(
        bmc_intents(&world.plan()),
        ["power off node-1 by rack4-u12", "hold FencingPending"]
    );
}

#[test]
fn a_rehearsal_only_says_it_would_power_the_node_off() {
    let mut spec = needs_bmc(mk_spec(), by_template());
    spec.dry_run = true;
    let plan = World::new(cluster(3))
        .policy("p", spec)
        .fail("node-1")
        .plan();
    assert!(
        plan.intents.iter().any(|i| matches!(
            i,
            Intent::Hold { reason: HoldReason::DryRun { would }, .. }
                if matches!(**would, Intent::PowerOff { .. })
        )),
        "{:?}",
        plan.intents
    );
    assert!(
        !plan
            .intents
            .iter()
            .any(|i| matches!(i, Intent::PowerOff { .. })),
        "{:?}",
        plan.intents
    );
}

#[test]
fn too_many_unhealthy_nodes_power_none_off() {
    let mut spec = needs_bmc(mk_spec(), by_template());
    spec.safety.max_unhealthy = IntOrString::Int(1);
    let plan = World::new(cluster(4))
        .policy("p", spec)
        .fail("node-1")
        .fail("node-2")
        .plan();
    assert!(
        !plan
            .intents
            .iter()
            .any(|i| matches!(i, Intent::PowerOff { .. } | Intent::ConfirmPowerOff { .. })),
        "{:?}",
        plan.intents
    );
    assert!(
        plan.intents.iter().any(|i| matches!(
            i,
            Intent::Hold {
                reason: HoldReason::TooManyUnhealthy { .. },
                ..
            }
        )),
        "{:?}",
        plan.intents
    );
}

#[test]
fn a_node_judged_healthy_again_is_not_powered_off() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    for nodes in world.health.values_mut() {
        nodes.insert("node-1".to_string(), NodeHealth::Healthy);
    }
    assert!(
        !world
            .plan()
            .intents
            .iter()
            .any(|i| matches!(i, Intent::PowerOff { .. })),
    );
}

#[test]
fn with_power_cycle_the_machine_is_powered_on_once_the_failover_is_done() {
    let mut world = off_and_tainted(true, true);
    assert_eq!(powers_on(&world), 0, "not before the failover is done");
    recovered(&mut world);
    assert_eq!(powers_on(&world), 1);
    world.ledger.record_power_on("node-1", world.now);
    assert_eq!(powers_on(&world), 0, "once per incident");
}

#[test]
fn a_pause_keeps_the_machine_off_until_it_ends() {
    let mut world = off_and_tainted(true, true);
    recovered(&mut world);
    // Someone works on the machine: they paused the node.
    let paused = (*world.view.nodes["node-1"])
        .clone()
        .annotation(crate::api::PAUSE_ANNOTATION, "true");
    world.view.nodes.insert("node-1".into(), paused.into());
    assert_eq!(powers_on(&world), 0, "paused node");
    let unpaused = (*world.view.nodes["node-1"])
        .clone()
        .annotation(crate::api::PAUSE_ANNOTATION, "false");
    world.view.nodes.insert("node-1".into(), unpaused.into());
    world.specs[0].1.paused = true;
    assert_eq!(powers_on(&world), 0, "paused policy");
    world.specs[0].1.paused = false;
    assert_eq!(powers_on(&world), 1, "once the pause ends");
}

#[test]
fn without_power_cycle_the_machine_stays_off() {
    let mut world = off_and_tainted(false, true);
    recovered(&mut world);
    assert_eq!(powers_on(&world), 0);
}

#[test]
fn a_lease_renewed_after_the_bmc_said_off_takes_the_proof_back() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    let off_at = world.now - Duration::from_secs(5);
    world
        .ledger
        .record_power_off("node-1", off_at - BMC_OFF_READS_APART, true);
    read_off_twice(&mut world.ledger, "node-1", off_at);
    world.heartbeats.insert(
        "node-1".into(),
        renewed_at(off_at - Duration::from_secs(20)),
    );
    assert_eq!(
        bmc_intents(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"],
        "a renewal from before the Off says nothing"
    );
    // Someone powered the machine on again: its kubelet renews.
    world
        .heartbeats
        .insert("node-1".into(), renewed_at(world.now));
    assert_eq!(bmc_intents(&world.plan()), ["hold FencingPending"]);
}

#[test]
fn pods_whose_policy_only_rehearses_power_no_machine_off() {
    let view = cluster(3).with(mk_namespace("ns").label("team", "a"));
    // "a-bmc" owns the node and selects no pod; "b-team" owns the pods and only rehearses.
    let world = World::new(view)
        .policy(
            "a-bmc",
            needs_bmc(mk_spec(), by_template()).namespace_selector(ns_selector("team", "nobody")),
        )
        .policy(
            "b-team",
            dry_run(mk_spec()).namespace_selector(ns_selector("team", "a")),
        )
        .fail("node-1");
    let plan = world.plan();
    let powers_off = |i: &Intent| match i {
        Intent::Hold {
            reason: HoldReason::DryRun { would },
            ..
        } => matches!(**would, Intent::PowerOff { .. }),
        other => matches!(other, Intent::PowerOff { .. }),
    };
    assert!(!plan.intents.iter().any(powers_off), "{:?}", plan.intents);
    // The node is held for its proof: its pods would move, were their policy not rehearsing.
    assert_eq!(bmc_intents(&plan), ["hold FencingPending"]);
}

#[test]
fn a_machine_found_off_is_never_powered_on_by_podha() {
    // The first read said Off: someone else switched the machine off.
    let mut world = off_and_tainted(true, false);
    recovered(&mut world);
    assert_eq!(powers_on(&world), 0);
}

/// `node` reports system UUID `uuid`.
fn with_system_uuid(world: &mut World, node: &str, uuid: &str) {
    let n = (*world.view.nodes[node]).clone().system_uuid(uuid);
    world.view.nodes.insert(node.into(), n.into());
}

#[test]
fn a_system_uuid_two_nodes_report_powers_neither_off() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    with_system_uuid(&mut world, "node-1", "4C4C4544-0035-5910-8052-B4C04F4B4E32");
    with_system_uuid(&mut world, "node-2", "4c4c4544-0035-5910-8052-b4c04f4b4e33");
    assert_eq!(
        bmc_intents(&world.plan()),
        ["power off node-1 by bmc-node-1", "hold FencingPending"]
    );
    // node-3's firmware reports node-1's UUID (in another form): it binds neither.
    with_system_uuid(&mut world, "node-3", "4c4c45440035591080 52b4c04f4b4e32");
    assert_eq!(bmc_intents(&world.plan()), ["hold FencingPending"]);
    // Without matching UUIDs, the Secret's label alone binds the node.
    let mut unmatched = by_template();
    unmatched.match_system_uuid = false;
    world.specs[0].1 = needs_bmc(mk_spec(), unmatched);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["power off node-1 by bmc-node-1", "hold FencingPending"]
    );
}

#[test]
fn the_power_off_carries_the_lease_as_podha_saw_it() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    let seen: k8s_openapi::jiff::Timestamp = "2026-11-27T05:00:00Z".parse().expect("time");
    // node-1 last renewed at t0; the others were heard from since it missed a renewal: the
    // settle rule lets the policy act.
    world.now = world.t0 + Duration::from_secs(20);
    for other in ["node-2", "node-3"] {
        world.heartbeats.insert(other.into(), renewed_at(world.now));
    }
    world.heartbeats.insert(
        "node-1".into(),
        Heartbeat {
            renew_time: Some(seen),
            ..renewed_at(world.t0)
        },
    );
    let plan = world.plan();
    let lease_seen = plan.intents.iter().find_map(|i| match i {
        Intent::PowerOff { lease_seen, .. } => Some(*lease_seen),
        _ => None,
    });
    assert_eq!(lease_seen, Some(Some(seen)));
}

/// Judged on the kubelet port alone, a node whose port went silent while its kubelet renews on
/// (podha's own path to it cut) gets no `ForceOff`: the hold says its Lease still renews. Once
/// the Lease misses a renewal, the `ForceOff` goes out.
#[test]
fn no_force_off_while_the_nodes_lease_renews_after_its_probes_went_silent() {
    let s = std::time::Duration::from_secs;
    let t0 = Instant::now();
    let hb = |renewed: u64, answered: u64, silent: Option<u64>| Heartbeat {
        tcp_answered: Some(t0 + s(answered)),
        tcp_silent_since: silent.map(|p| t0 + s(p)),
        last_renewal: Some(t0 + s(renewed)),
        renewal_not_before: Some(t0 + s(renewed)),
        ..Heartbeat::silent_since(t0 + s(renewed), s(10))
    };
    let mut spec = needs_bmc(max_unhealthy(mk_spec(), 1), by_template());
    spec.detection.signals = vec![crate::api::Signal::KubeletTCP];
    let at = |now: u64, dead: Heartbeat| {
        let mut w = World::new(cluster(3)).policy("p", spec.clone());
        w.heartbeats.insert("node-1".into(), dead);
        w.heartbeats.insert("node-2".into(), hb(0, now - 1, None));
        w.heartbeats.insert("node-3".into(), hb(0, now - 1, None));
        w.now = t0 + s(now);
        w.fail("node-1")
    };
    // The port silent from 1, the kubelet renewing at 5 and 15.
    assert_eq!(
        bmc_intents(&at(6, hb(5, 0, Some(1))).plan()),
        ["hold NodeLeaseRenewing"]
    );
    assert_eq!(
        bmc_intents(&at(27, hb(15, 0, Some(1))).plan()),
        ["hold NodeLeaseRenewing"]
    );
    // Its last renewal at 15, none by 28: missed. The `ForceOff` goes out.
    let plan = at(28, hb(15, 0, Some(1))).plan();
    assert!(
        bmc_intents(&plan).contains(&"power off node-1 by bmc-node-1".to_string()),
        "{:?}",
        bmc_intents(&plan)
    );
}
