//! Confirmed proofs (`FencingProof::is_confirmed`): the agent's acknowledgement alone, and what
//! a judgement without the kubelet's heartbeat (signals without `Lease` and `NodeReady`) may
//! count as the fence.

use super::fencing::{acknowledge, agent_silent_for, needs_agent, with_agent, with_agents};
use super::*;
use crate::api::{Fencing, FencingProof, Signal};

fn acknowledged_only(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.fencing = Fencing {
        proof: FencingProof::AgentAcknowledged,
        ..Fencing::default()
    };
    spec
}

/// Judged on the agent's heartbeat alone, as a fast policy is.
fn heartbeat_only(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.detection.signals = vec![Signal::AgentHeartbeat];
    spec
}

#[test]
fn only_the_agents_acknowledgement_proves_the_fence_never_its_silence() {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", acknowledged_only(mk_spec()))
        .fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["request fence node-1", "hold FencingPending"]
    );
    world.ledger.record_fence_request("node-1", "p/1");
    // Far past the time the agent advertises and the margin, which `Agent` would count.
    agent_silent_for(&mut world, "node-1", 3600);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn a_node_without_an_agent_is_not_asked_and_is_held() {
    let mut world = World::new(cluster(3))
        .policy("p", acknowledged_only(mk_spec()))
        .fail("node-1");
    agent_silent_for(&mut world, "node-1", 3600);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
}

#[test]
fn judged_on_heartbeats_alone_a_node_moves_on_its_agents_acknowledgement() {
    let mut world = World::new(with_agent(cluster(3), "node-1"))
        .policy("p", heartbeat_only(acknowledged_only(mk_spec())))
        .fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["request fence node-1", "hold FencingPending"]
    );
    world.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// The CRD refuses these policies; one admitted by a CRD without that rule asks nothing of the
/// node and moves nothing: not on the agent's silence, not on its acknowledgement, not without
/// a proof, not by deleting pods, not on an `Off` of a machine only a label binds.
#[test]
fn judged_on_heartbeats_alone_a_policy_without_a_confirmed_proof_moves_nothing() {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", heartbeat_only(needs_agent(mk_spec())))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 3600);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);

    let mut none = heartbeat_only(mk_spec());
    none.fencing.proof = FencingProof::None;
    let mut deleting = heartbeat_only(acknowledged_only(mk_spec()));
    deleting.action = crate::api::Action::DeletePods;
    let mut label_bound = heartbeat_only(mk_spec());
    label_bound.fencing = Fencing {
        proof: FencingProof::Bmc,
        bmc: Some(crate::api::BmcFencing {
            secret_name: Some("bmc-{node}".into()),
            secret_name_label: None,
            power_cycle: false,
            match_system_uuid: false,
        }),
        ..Fencing::default()
    };
    for spec in [none, deleting, label_bound] {
        let plan = World::new(cluster(3))
            .policy("p", spec)
            .fail("node-1")
            .plan();
        assert_eq!(intent_names(&plan), ["hold FencingPending"]);
        assert!(deletes(&plan).is_empty());
    }
}

#[test]
fn only_reported_fences_are_confirmed() {
    use crate::planner::proof::FenceEvidence;
    for proof in [
        FencingProof::AgentAcknowledged,
        FencingProof::Bmc,
        FencingProof::External,
        FencingProof::CloudShutdownTaint,
    ] {
        assert!(proof.is_confirmed(), "{proof:?}");
    }
    for proof in [FencingProof::Agent, FencingProof::None] {
        assert!(!proof.is_confirmed(), "{proof:?}");
    }
    for evidence in [FenceEvidence::NotAsked, FenceEvidence::AgentSilent] {
        assert!(!evidence.is_confirmed(), "{evidence:?}");
    }
    for evidence in [
        FenceEvidence::AgentAcknowledged,
        FenceEvidence::ExternalAcknowledged,
        FenceEvidence::BmcPoweredOff,
        FenceEvidence::CloudShutdown,
    ] {
        assert!(evidence.is_confirmed(), "{evidence:?}");
    }
}
