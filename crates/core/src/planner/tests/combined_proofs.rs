//! Proofs combined (`fencing.proof: AnyOf` / `AllOf`): every proof asked for at once, the
//! first to come (`anyOf`) or the last (`allOf`) letting the taint on, and a judgement without
//! the kubelet's heartbeat only behind a combination that is confirmed.

use super::bmc::read_off_twice;
use super::fencing::{acknowledge, agent_silent_for, renewed_after_ack, with_agents};
use super::*;
use crate::api::{BmcFencing, Fencing, FencingProof, Signal};
use crate::planner::proof::BMC_OFF_READS_APART;

const TAINT: &str = "taint node-1 node.kubernetes.io/out-of-service";

pub(super) fn combined(
    mut spec: PodHAPolicySpec,
    all: bool,
    proofs: &[FencingProof],
) -> PodHAPolicySpec {
    let (proof, any_of, all_of) = if all {
        (FencingProof::AllOf, None, Some(proofs.to_vec()))
    } else {
        (FencingProof::AnyOf, Some(proofs.to_vec()), None)
    };
    spec.fencing = Fencing {
        proof,
        any_of,
        all_of,
        bmc: Some(BmcFencing {
            secret_name: Some("bmc-{node}".into()),
            secret_name_label: None,
            power_cycle: false,
            match_system_uuid: true,
        }),
        ..Fencing::default()
    };
    spec
}

/// The agent's acknowledgement or the BMC's `Off`.
fn ack_or_bmc(spec: PodHAPolicySpec) -> PodHAPolicySpec {
    combined(
        spec,
        false,
        &[FencingProof::AgentAcknowledged, FencingProof::Bmc],
    )
}

/// `node-1` dead, every node with an agent, the fence asked of its agent and its BMC (which
/// accepted the `ForceOff`).
fn asked(spec: PodHAPolicySpec) -> World {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", spec)
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    world.ledger.record_power_off("node-1", world.now, true);
    world
}

#[test]
fn any_of_asks_every_proof_at_once() {
    let plan = World::new(with_agents(cluster(3)))
        .policy("p", ack_or_bmc(mk_spec()))
        .fail("node-1")
        .plan();
    assert_eq!(
        intent_names(&plan),
        [
            "power off node-1",
            "request fence node-1",
            "hold FencingPending"
        ],
        "nothing tainted or deleted before a proof"
    );
    let held = plan.intents.iter().find_map(|i| match i {
        Intent::Hold {
            reason: HoldReason::FencingPending { proof },
            ..
        } => Some(proof.describe()),
        _ => None,
    });
    assert_eq!(held.as_deref(), Some("AnyOf [AgentAcknowledged, BMC]"));
}

#[test]
fn any_of_lets_the_taint_on_with_the_first_proof_to_come() {
    let waiting = asked(ack_or_bmc(mk_spec()));
    assert_eq!(
        intent_names(&waiting.plan()),
        ["read power of node-1", "hold FencingPending"]
    );

    let mut acknowledged = asked(ack_or_bmc(mk_spec()));
    acknowledge(&mut acknowledged, "node-1", "p/1");
    assert_eq!(intent_names(&acknowledged.plan()), [TAINT]);

    let mut off = asked(ack_or_bmc(mk_spec()));
    read_off_twice(&mut off.ledger, "node-1", off.now);
    assert_eq!(intent_names(&off.plan()), [TAINT]);
}

#[test]
fn all_of_waits_for_every_proof() {
    let both = |spec| {
        combined(
            spec,
            true,
            &[FencingProof::AgentAcknowledged, FencingProof::Bmc],
        )
    };
    let mut world = asked(both(mk_spec()));
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["read power of node-1", "hold FencingPending"],
        "the acknowledgement alone is not enough"
    );
    read_off_twice(&mut world.ledger, "node-1", world.now);
    assert_eq!(intent_names(&world.plan()), [TAINT]);

    let mut off_only = asked(both(mk_spec()));
    read_off_twice(&mut off_only.ledger, "node-1", off_only.now);
    assert_eq!(intent_names(&off_only.plan()), ["hold FencingPending"]);
}

#[test]
fn the_agents_silence_counts_under_any_of_but_its_doubt_is_no_reason_to_hold() {
    let silence_or_bmc = |spec| combined(spec, false, &[FencingProof::Agent, FencingProof::Bmc]);
    let mut silent = asked(silence_or_bmc(mk_spec()));
    agent_silent_for(&mut silent, "node-1", 3600);
    assert_eq!(intent_names(&silent.plan()), [TAINT]);
    // Never heard: the agent's silence proves nothing, but the BMC may still prove the fence;
    // the hold names the combination, not the agent's doubt.
    let never_heard = asked(silence_or_bmc(mk_spec()));
    assert_eq!(
        intent_names(&never_heard.plan()),
        ["read power of node-1", "hold FencingPending"]
    );
}

#[test]
fn judged_on_heartbeats_alone_only_a_confirmed_combination_moves_anything() {
    let heartbeats = |mut spec: PodHAPolicySpec| {
        spec.detection.signals = vec![Signal::AgentHeartbeat];
        spec
    };
    let mut confirmed = asked(heartbeats(ack_or_bmc(mk_spec())));
    acknowledge(&mut confirmed, "node-1", "p/1");
    assert_eq!(intent_names(&confirmed.plan()), [TAINT]);

    // The CRD refuses an anyOf with a proof inferred from silence here; one admitted without
    // that rule asks nothing of the node (no ForceOff, no request) and moves nothing, even
    // when the BMC says off.
    let silence_or_bmc = heartbeats(combined(
        mk_spec(),
        false,
        &[FencingProof::Agent, FencingProof::Bmc],
    ));
    let fresh = World::new(with_agents(cluster(3)))
        .policy("p", silence_or_bmc.clone())
        .fail("node-1");
    assert_eq!(intent_names(&fresh.plan()), ["hold FencingPending"]);
    let mut off = asked(silence_or_bmc);
    read_off_twice(&mut off.ledger, "node-1", off.now);
    assert_eq!(intent_names(&off.plan()), ["hold FencingPending"]);
    // An allOf with one confirmed member is confirmed: the silence alone never moves it.
    let silence_and_bmc = heartbeats(combined(
        mk_spec(),
        true,
        &[FencingProof::Agent, FencingProof::Bmc],
    ));
    let mut silent = asked(silence_and_bmc);
    agent_silent_for(&mut silent, "node-1", 3600);
    assert_eq!(
        intent_names(&silent.plan()),
        ["read power of node-1", "hold FencingPending"]
    );
    read_off_twice(&mut silent.ledger, "node-1", silent.now);
    assert_eq!(intent_names(&silent.plan()), [TAINT]);
}

/// A combination without its list (a CRD without its rules let it in) proves nothing, ever:
/// an empty `allOf` is not "every one of nothing".
#[test]
fn a_combination_without_its_list_is_never_proven() {
    for proof in [FencingProof::AnyOf, FencingProof::AllOf] {
        let mut spec = mk_spec();
        spec.fencing.proof = proof;
        let mut world = World::new(with_agents(cluster(3)))
            .policy("p", spec)
            .fail("node-1");
        agent_silent_for(&mut world, "node-1", 3600);
        assert_eq!(
            intent_names(&world.plan()),
            ["hold FencingPending"],
            "{proof:?}"
        );
    }
}

/// Under `anyOf` with `powerCycle`, the agent's acknowledgement let the taint on before the BMC
/// said `Off`: podha reads the machine's power from the taint on until it says `Off`, and
/// powers it on once the failover is done, once.
#[test]
fn a_machine_powered_off_beside_another_proof_is_read_then_powered_on() {
    let mut world = tainted_beside_the_ack();
    assert_eq!(power(&world), ["read power of node-1"]);
    read_off_twice(&mut world.ledger, "node-1", world.now);
    assert_eq!(
        power(&world),
        Vec::<String>::new(),
        "not before the failover is done"
    );
    world.ledger.get_mut("node-1").expect("open").recovered_at = Some(world.now);
    assert_eq!(power(&world), ["power on node-1"]);
    world.ledger.record_power_on("node-1", world.now);
    assert_eq!(power(&world), Vec::<String>::new(), "once per incident");
}

/// A machine whose kubelet renewed its Lease after the BMC said `Off` was switched on by
/// someone, who decides what follows: no `On` from podha. Nor anything for one that booted
/// again since it was judged dead.
#[test]
fn a_machine_that_ran_since_the_power_off_is_left_to_whoever_switched_it_on() {
    let mut world = tainted_beside_the_ack();
    let off_at = world.now - Duration::from_secs(1);
    read_off_twice(&mut world.ledger, "node-1", off_at);
    world.ledger.get_mut("node-1").expect("open").recovered_at = Some(world.now);
    // A renewal written before the first Off, seen late, says nothing.
    let first_off = off_at - BMC_OFF_READS_APART;
    world.heartbeats.insert(
        "node-1".into(),
        renewed_at(first_off - Duration::from_secs(2)),
    );
    assert_eq!(power(&world), ["power on node-1"]);
    world
        .heartbeats
        .insert("node-1".into(), renewed_at(world.now));
    assert_eq!(power(&world), Vec::<String>::new());

    let mut rebooted = tainted_beside_the_ack();
    rebooted
        .ledger
        .get_mut("node-1")
        .expect("open")
        .boot_at_failure = Some("boot-1".into());
    let node = (*rebooted.view.nodes["node-1"]).clone().boot("boot-2");
    rebooted.view.nodes.insert("node-1".into(), node.into());
    assert_eq!(power(&rebooted), Vec::<String>::new(), "no read either");
}

/// `node-1` dead and tainted under `anyOf [AgentAcknowledged, BMC]` with `powerCycle`, its
/// BMC having accepted podha's `ForceOff` a second ago, nothing read yet.
fn tainted_beside_the_ack() -> World {
    let mut spec = ack_or_bmc(mk_spec());
    if let Some(bmc) = spec.fencing.bmc.as_mut() {
        bmc.power_cycle = true;
    }
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", spec)
        .fail_tainted("node-1");
    let accepted = world.now - Duration::from_secs(1);
    world.ledger.record_power_off("node-1", accepted, true);
    world
}

/// The power intents of a round.
fn power(world: &World) -> Vec<String> {
    intent_names(&world.plan())
        .into_iter()
        .filter(|i| i.contains("power"))
        .collect()
}

/// Under `anyOf` with a proof the node has no part in, an acknowledgement the node
/// contradicts holds the node as under a single proof, and its agent's silence no longer
/// counts either; but the BMC is still asked and read, and its `Off` proves the fence.
#[test]
fn under_any_of_a_contradicted_acknowledgement_leaves_the_bmc_to_prove_the_fence() {
    let mut world = asked(ack_or_bmc(mk_spec()));
    acknowledge(&mut world, "node-1", "p/1");
    renewed_after_ack(&mut world, "node-1", 2);
    assert_eq!(
        intent_names(&world.plan()),
        ["read power of node-1", "hold FenceContradicted"]
    );
    read_off_twice(&mut world.ledger, "node-1", world.now);
    assert_eq!(intent_names(&world.plan()), [TAINT]);

    // The ForceOff not accepted yet is sent (again).
    let mut unasked = World::new(with_agents(cluster(3)))
        .policy("p", ack_or_bmc(mk_spec()))
        .fail("node-1");
    unasked.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut unasked, "node-1", "p/1");
    renewed_after_ack(&mut unasked, "node-1", 2);
    assert_eq!(
        intent_names(&unasked.plan()),
        ["power off node-1", "hold FenceContradicted"]
    );

    // The agent's silence after a contradicted acknowledgement proves nothing.
    let silence_or_bmc = combined(mk_spec(), false, &[FencingProof::Agent, FencingProof::Bmc]);
    let mut silent = asked(silence_or_bmc);
    acknowledge(&mut silent, "node-1", "p/1");
    renewed_after_ack(&mut silent, "node-1", 2);
    agent_silent_for(&mut silent, "node-1", 3600);
    if let Some(hb) = silent.heartbeats.get_mut("node-1") {
        hb.renewals_since_ack = 2;
    }
    assert_eq!(
        intent_names(&silent.plan()),
        ["read power of node-1", "hold FenceContradicted"]
    );
}

/// A request not yet accepted is a new action: under `anyOf`, the agent's fence request
/// written, a `ForceOff` that failed is not sent again while the node is paused (someone works
/// on the machine), and goes once the pause ends.
#[test]
fn no_first_power_off_while_paused_though_another_request_went_out() {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", ack_or_bmc(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    let pause = |world: &mut World, on: &str| {
        let node = (*world.view.nodes["node-1"])
            .clone()
            .annotation(crate::api::PAUSE_ANNOTATION, on);
        world.view.nodes.insert("node-1".into(), node.into());
    };
    pause(&mut world, "true");
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    world.specs[0].1.paused = true;
    pause(&mut world, "false");
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    world.specs[0].1.paused = false;
    assert_eq!(
        intent_names(&world.plan()),
        ["power off node-1", "hold FencingPending"]
    );
}

/// The cloud's shutdown taint never comes for an instance that still runs (hung, or cut off
/// from the network): alone it holds such a node for ever. Paired under `anyOf` with a fence
/// that can act on a running instance (here a controller of the user's), the hung instance
/// fails over once that fence is acknowledged, and a shut-down one at once.
#[test]
fn any_of_pairs_the_cloud_shutdown_taint_with_a_fence_for_an_instance_that_still_runs() {
    let spec = combined(
        mk_spec(),
        false,
        &[FencingProof::CloudShutdownTaint, FencingProof::External],
    );
    let hung = || {
        World::new(cluster(3))
            .policy("p", spec.clone())
            .fail("node-1")
    };
    assert_eq!(
        intent_names(&hung().plan()),
        ["request fence node-1", "hold FencingPending"],
        "no shutdown taint: the other fence is asked, nothing moves"
    );
    let mut fenced = hung();
    fenced.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut fenced, "node-1", "p/1");
    assert_eq!(intent_names(&fenced.plan()), [TAINT]);

    let shut_down = World::new(super::fencing::shut_down(cluster(3), "node-1"))
        .policy("p", spec.clone())
        .fail("node-1");
    assert_eq!(intent_names(&shut_down.plan()), [TAINT]);
}
