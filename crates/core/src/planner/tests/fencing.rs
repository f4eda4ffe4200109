//! `fencing.proof`: the out-of-service taint only on a node proven fenced.

use super::*;
use crate::api::{CLOUD_SHUTDOWN_TAINT_KEY, Fencing, FencingProof, Proofs};
use crate::contract::{FENCE_ACK_ANNOTATION, FENCE_REQUEST_ANNOTATION};

fn needs_cloud_shutdown(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.fencing = Fencing {
        proof: FencingProof::CloudShutdownTaint,
        ..Fencing::default()
    };
    spec
}

pub(super) fn shut_down(mut view: View, node: &str) -> View {
    let off = (*view.nodes[node])
        .clone()
        .taint(CLOUD_SHUTDOWN_TAINT_KEY, "", "NoSchedule");
    view.nodes.insert(node.into(), std::sync::Arc::new(off));
    view
}

fn pending(plan: &Plan) -> Vec<(Option<String>, Proofs)> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                node,
                reason: HoldReason::FencingPending { proof },
                ..
            } => Some((node.clone(), *proof)),
            _ => None,
        })
        .collect()
}

#[test]
fn without_the_proof_a_dead_node_is_held_with_nothing_tainted_marked_or_deleted() {
    let plan = World::new(cluster(3))
        .policy("p", needs_cloud_shutdown(mk_spec()))
        .fail("node-1")
        .plan();
    assert_eq!(
        pending(&plan),
        [(
            Some("node-1".to_string()),
            FencingProof::CloudShutdownTaint.into()
        )]
    );
    assert_eq!(plan.intents.len(), 1, "only the hold: {:?}", plan.intents);
    assert_eq!(
        HoldReason::FencingPending {
            proof: FencingProof::None.into()
        }
        .as_str(),
        "FencingPending"
    );
}

#[test]
fn once_the_cloud_reports_the_instance_shut_down_the_taint_follows() {
    let mut world = World::new(shut_down(cluster(3), "node-1"))
        .policy("p", needs_cloud_shutdown(mk_spec()))
        .fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
    world.taint_landed("node-1");
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0"]);
}

#[test]
fn no_proof_is_todays_behaviour_and_the_default() {
    assert_eq!(mk_spec().fencing.proof, FencingProof::None);
    let plan = World::new(cluster(3))
        .policy("p", mk_spec())
        .fail("node-1")
        .plan();
    assert!(pending(&plan).is_empty());
    assert_eq!(
        intent_names(&plan),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// `DeletePods` waits for the proof as the taint does: the attach/detach controller
/// force-detaches a force-deleted pod's volume from the unhealthy node 6 minutes later, whether
/// or not the node still writes.
#[test]
fn delete_pods_waits_for_the_proof_like_the_taint() {
    let world = World::new(cluster(3))
        .policy("p", needs_cloud_shutdown(delete_pods()))
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        pending(&plan),
        vec![(
            Some("node-1".to_string()),
            needs_cloud_shutdown(delete_pods()).fencing.proofs()
        )]
    );
    assert!(deletes(&plan).is_empty(), "{:?}", plan.intents);
    assert!(taints(&plan).is_empty(), "{:?}", plan.intents);

    // The proof in: podha's fence first, then the delete.
    let mut world = World {
        view: shut_down(world.view.clone(), "node-1"),
        ..world
    };
    let plan = world.plan();
    assert!(pending(&plan).is_empty(), "{:?}", plan.intents);
    assert!(matches!(
        plan.intents.first(),
        Some(Intent::TaintNode {
            taint: NodeTaint::Fence,
            ..
        })
    ));
    world.taint_landed("node-1");
    assert_eq!(deletes(&world.plan()), ["ns/db-0"]);
}

/// The default proof, the agent's, under `DeletePods`: a node cut off from the API server
/// whose agent podha still hears is held with a fence request, and its pod is deleted only
/// once the agent acknowledges it.
#[test]
fn delete_pods_asks_the_agent_to_fence_and_waits_for_its_word() {
    let mut world = World::new(with_agent(cluster(3), "node-1"))
        .policy("p", needs_agent(delete_pods()))
        .fail("node-1");
    let plan = world.plan();
    assert!(deletes(&plan).is_empty(), "{:?}", plan.intents);
    assert!(taints(&plan).is_empty(), "{:?}", plan.intents);
    assert!(
        plan.intents
            .iter()
            .any(|i| matches!(i, Intent::RequestFence { node, .. } if node == "node-1")),
        "{:?}",
        plan.intents
    );
    // A fence found on the node (left by an earlier failure) proves nothing either.
    let fenced = (*world.view.nodes["node-1"]).clone().taint(
        crate::api::FENCE_TAINT_KEY,
        "nodeDead",
        "NoSchedule",
    );
    world.view.nodes.insert("node-1".into(), fenced.into());
    assert!(deletes(&world.plan()).is_empty());
    world.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(deletes(&world.plan()), ["ns/db-0"]);
}

#[test]
fn a_fenced_node_is_upgraded_to_the_out_of_service_taint_only_with_the_proof() {
    // podha fenced the node under DeletePods; the policy then switched to the taint with a
    // proof: the upgrade waits for the proof like a first taint does.
    // db-0 already runs on node-2; its volume is still attached to the dead node-1.
    let mut view = View::default();
    for i in 1..=3 {
        view = view.with(mk_node(&format!("node-{i}")));
    }
    let mut view = view
        .with(
            mk_pod("ns", "db-0")
                .on("node-2")
                .owned_by_sts("db")
                .claim("data-db-0"),
        )
        .with(mk_pvc("ns", "data-db-0").bound_to("pv-db"))
        .with(mk_csi_pv("pv-db", DRIVER));
    let fenced = (*view.nodes["node-1"])
        .clone()
        .taint(crate::api::FENCE_TAINT_KEY, "nodeDead", "NoSchedule")
        .annotation(TAINT_MARKER_ANNOTATION, "p");
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(fenced));
    let va = mk_va("va-db", DRIVER, "pv-db", "node-1");
    let without = World::new(view.clone().with(va.clone()))
        .policy("p", needs_cloud_shutdown(mk_spec()))
        .fail("node-1")
        .plan();
    assert!(
        !intent_names(&without)
            .iter()
            .any(|i| i.contains("out-of-service")),
        "{:?}",
        without.intents
    );
    // Waiting for the proof is said the round it is decided, not kept quiet; it is no
    // FencingPending hold (nothing else waits for it: the fence is on).
    assert!(pending(&without).is_empty(), "{:?}", without.intents);
    assert!(
        without.intents.iter().any(|i| matches!(
            i,
            Intent::Hold {
                reason: HoldReason::UpgradeAwaitsProof { proof },
                ..
            } if *proof == FencingProof::CloudShutdownTaint.into()
        )),
        "{:?}",
        without.intents
    );
    // A pod that must stay on the node refuses the upgrade, and says so.
    let bare = mk_pod("ns", "bare").on("node-1").claim("data-bare");
    let refused = World::new(
        shut_down(view.clone(), "node-1")
            .with(va.clone())
            .with(bare),
    )
    .policy("p", needs_cloud_shutdown(mk_spec()))
    .fail("node-1")
    .plan();
    let refusals: Vec<_> = refused
        .intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                node: Some(node),
                reason: HoldReason::OutOfServiceRefused { pod, why },
                ..
            } => Some((node.as_str(), pod.name.as_str(), *why)),
            _ => None,
        })
        .collect();
    assert_eq!(
        refusals,
        [("node-1", "bare", "NoControllerOwner")],
        "{:?}",
        refused.intents
    );
    assert!(
        !intent_names(&refused)
            .iter()
            .any(|i| i.contains("out-of-service")),
        "{:?}",
        refused.intents
    );
    let with = World::new(shut_down(view, "node-1").with(va))
        .policy("p", needs_cloud_shutdown(mk_spec()))
        .fail("node-1")
        .plan();
    assert!(
        intent_names(&with)
            .iter()
            .any(|i| i.contains("out-of-service")),
        "{:?}",
        with.intents
    );
}

/// With a 10 s margin, which these tests count with (an agent's 30 s and the margin: 40 s).
pub(super) fn needs_agent(mut spec: PodHAPolicySpec) -> PodHAPolicySpec {
    spec.fencing = Fencing {
        proof: FencingProof::Agent,
        agent_margin: crate::api::HumanDuration::from_secs(10),
        ..Fencing::default()
    };
    spec
}

/// Whoever fences `node` acknowledges `request` on it.
pub(super) fn acknowledge(world: &mut World, node: &str, request: &str) {
    let acked = (*world.view.nodes[node])
        .clone()
        .annotation(FENCE_ACK_ANNOTATION, request);
    world.view.nodes.insert(node.into(), acked.into());
}

/// `node` runs a podha agent: an InternalIP and the agent's advertised port and timeout.
pub(super) fn with_agent(mut view: View, node: &str) -> View {
    let n = (*view.nodes[node]).clone().agent(Some("30s"));
    view.nodes.insert(node.into(), std::sync::Arc::new(n));
    view.agent_adverts
        .insert(node.into(), agent_advert(Instant::now()));
    view
}

/// Every node of `view` runs a podha agent.
pub(super) fn with_agents(mut view: View) -> View {
    let names: Vec<String> = view.nodes.keys().cloned().collect();
    for name in names {
        view = with_agent(view, &name);
    }
    view
}

/// `node`'s agent has not answered for `secs`, and podha heard it right before; every other
/// node renewed its Lease just now (so the settle rule lets the policy act), and its agent, if
/// it runs one, answered just now.
pub(super) fn agent_silent_for(world: &mut World, node: &str, secs: u64) {
    agent_silent(world, node, secs, |_| true);
}

/// `node`'s agent has not answered for `secs`, after an answer right before if podha heard
/// it; every other node renewed its Lease just now, and its agent answered just now if podha
/// hears it (`heard`).
fn agent_silent(world: &mut World, node: &str, secs: u64, heard: impl Fn(&str) -> bool) {
    let since = world.now - Duration::from_secs(secs);
    // podha heard enough agents since before the silence began.
    world.agent_quorum_since = Some(since - Duration::from_secs(10));
    let others: Vec<String> = world
        .view
        .nodes
        .keys()
        .filter(|n| *n != node)
        .cloned()
        .collect();
    for other in others {
        let alive = Heartbeat {
            last_renewal: Some(world.now),
            renewal_not_before: Some(world.now),
            agent_answered: heard(&other).then_some(world.now),
            agent_connected: heard(&other).then_some(world.now),
            agent_armed: heard(&other).then_some(world.now),
            agent_silent_since: (!heard(&other)).then_some(since),
            ..Heartbeat::silent_since(world.now, Duration::from_secs(10))
        };
        world.heartbeats.insert(other, alive);
    }
    // Its agent renewed its Lease right before the silence, the others just now.
    for (name, advert) in &mut world.view.agent_adverts {
        advert.renewed_seen = if name == node {
            since - Duration::from_secs(1)
        } else {
            world.now
        };
    }
    world.heartbeats.insert(
        node.to_string(),
        Heartbeat {
            agent_answered: heard(node).then(|| since - Duration::from_secs(1)),
            agent_connected: heard(node).then(|| since - Duration::from_secs(1)),
            agent_armed: heard(node).then(|| since - Duration::from_secs(1)),
            agent_silent_since: Some(since),
            ..Heartbeat::silent_since(since - Duration::from_secs(10), Duration::from_secs(10))
        },
    );
}

#[test]
fn the_agent_is_asked_to_fence_once_and_its_acknowledgement_lets_the_taint_on() {
    let mut world = World::new(with_agent(cluster(3), "node-1"))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        intent_names(&plan),
        ["request fence node-1", "hold FencingPending"],
        "nothing tainted or deleted before the proof"
    );
    world.ledger.record_fence_request("node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["hold FencingPending"],
        "asked once per incident"
    );
    // An acknowledgement of another request proves nothing.
    acknowledge(&mut world, "node-1", "p/0");
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn an_agent_silent_past_its_timeout_and_the_margin_has_fenced_its_node() {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 39);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    agent_silent_for(&mut world, "node-1", 40);
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// podha counts an agent's silence from the last renewal of its Lease it saw: an agent that
/// renews while podha cannot reach it runs (and stays up while it renews), so its node is held
/// until the time it advertises and the margin have passed since that renewal.
#[test]
fn an_agent_silence_counts_from_the_last_renewal_of_its_lease_seen() {
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 120);
    let renewed = |world: &mut World, ago: u64| {
        world
            .view
            .agent_adverts
            .get_mut("node-1")
            .expect("advert")
            .renewed_seen = world.now - Duration::from_secs(ago);
    };
    renewed(&mut world, 39);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
    renewed(&mut world, 40);
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// The versions of the agent Lease each taint of `plan` must find again, if it rests on it.
fn leases_seen(plan: &Plan) -> Vec<Option<AgentLeaseSeen>> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::TaintNode {
                agent_lease_seen, ..
            } => Some(agent_lease_seen.clone()),
            _ => None,
        })
        .collect()
}

/// `node-1` dead under `spec`, its agent silent for 40 s, never heard by this leadership term
/// (`this_term_heard` false) while its Lease, at version 41, says podha heard it in this boot;
/// with `shut`, the cloud reports the instance shut down too.
fn silent_under(spec: PodHAPolicySpec, this_term_heard: bool, shut: bool) -> World {
    let mut view = with_agents(cluster(3));
    let booted = (*view.nodes["node-1"]).clone().boot("boot-2");
    view.nodes.insert("node-1".into(), booted.into());
    if shut {
        view = shut_down(view, "node-1");
    }
    let mut world = World::new(view).policy("p", spec).fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent(&mut world, "node-1", 40, |n| {
        this_term_heard || n != "node-1"
    });
    let advert = world.view.agent_adverts.get_mut("node-1").expect("advert");
    advert.heard_in_boot = Some("boot-2".into());
    advert.resource_version = Some("41".into());
    world
}

/// The agent's silence counts from the last renewal of its Lease podha saw (and, for a
/// leadership term that never heard the agent, through the Lease's word that an earlier term
/// heard it in this boot): a taint it proves carries the version of the Lease podha's view
/// holds, which the actuator must read again before it taints (also under `allOf`, where the
/// silence is one of the proofs), so that a renewal the view missed stops it. A taint another
/// proof lets on too under `anyOf` rests on no Lease.
#[test]
fn a_taint_proven_by_the_agents_silence_goes_out_only_with_the_lease_as_seen() {
    let seen = Some(AgentLeaseSeen {
        resource_version: Some("41".into()),
    });
    let both = |all| {
        let proofs = [FencingProof::CloudShutdownTaint, FencingProof::Agent];
        super::combined_proofs::combined(mk_spec(), all, &proofs)
    };
    let cases = [
        (
            "the agent's silence",
            needs_agent(mk_spec()),
            false,
            false,
            seen.clone(),
        ),
        (
            "heard by this term",
            needs_agent(mk_spec()),
            true,
            false,
            seen.clone(),
        ),
        (
            "allOf, the silence one of them",
            both(true),
            false,
            true,
            seen.clone(),
        ),
        (
            "anyOf, the cloud's proof in too",
            both(false),
            false,
            true,
            None,
        ),
        (
            "anyOf, the silence alone",
            both(false),
            false,
            false,
            seen.clone(),
        ),
    ];
    for (what, spec, heard, shut, expected) in cases {
        let plan = silent_under(spec, heard, shut).plan();
        assert_eq!(
            intent_names(&plan),
            ["taint node-1 node.kubernetes.io/out-of-service"],
            "{what}"
        );
        assert_eq!(leases_seen(&plan), [expected], "{what}");
    }
    // A view that holds no version: one no read matches.
    let mut world = silent_under(needs_agent(mk_spec()), false, false);
    world
        .view
        .agent_adverts
        .get_mut("node-1")
        .expect("advert")
        .resource_version = None;
    let unversioned = AgentLeaseSeen {
        resource_version: None,
    };
    assert_eq!(leases_seen(&world.plan()), [Some(unversioned.clone())]);
    assert!(!unversioned.matches(None) && !unversioned.matches(Some("41")));
}

/// A taint found on the node (an earlier process's, or a failure's before) lets no pod go on
/// the agent's silence with its Lease unread: the taint is planned again, with the Lease as
/// seen, and only once it is recorded (landed, or found done after the read) do the deletes
/// follow, whether this term heard the silence begin or not.
#[test]
fn a_taint_found_on_the_node_lets_no_pod_go_on_the_agents_silence_unread() {
    for (heard, deleting) in [(false, false), (false, true), (true, false), (true, true)] {
        let spec = if deleting {
            needs_agent(delete_pods())
        } else {
            needs_agent(mk_spec())
        };
        let taint = if deleting {
            NodeTaint::Fence
        } else {
            NodeTaint::OutOfService
        };
        let mut world = silent_under(spec, heard, false);
        let found =
            (*world.view.nodes["node-1"])
                .clone()
                .taint(taint.key(), taint.value(), taint.effect());
        world.view.nodes.insert("node-1".into(), found.into());
        let plan = world.plan();
        let what = format!("heard by this term: {heard}, DeletePods: {deleting}");
        assert!(deletes(&plan).is_empty(), "{what}: {:?}", plan.intents);
        assert_eq!(taints(&plan), [("node-1".to_string(), taint)], "{what}");
        assert_eq!(
            leases_seen(&plan),
            [Some(AgentLeaseSeen {
                resource_version: Some("41".into())
            })],
            "{what}"
        );
        world.taint_landed("node-1");
        assert_eq!(deletes(&world.plan()), ["ns/db-0"], "{what}: recorded");
    }
}

#[test]
fn a_node_without_an_agent_is_never_asked_and_never_proven_by_the_agent() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    agent_silent_for(&mut world, "node-1", 400);
    assert_eq!(intent_names(&world.plan()), ["hold FencingPending"]);
}

#[test]
fn a_rehearsal_only_says_it_would_ask_the_agent() {
    let mut spec = needs_agent(mk_spec());
    spec.dry_run = true;
    let plan = World::new(with_agent(cluster(3), "node-1"))
        .policy("p", spec)
        .fail("node-1")
        .plan();
    assert!(
        plan.intents
            .iter()
            .all(|i| !matches!(i, Intent::RequestFence { .. })),
        "{:?}",
        plan.intents
    );
}

#[test]
fn an_external_fence_is_asked_of_any_node_and_only_its_acknowledgement_lets_the_taint_on() {
    let mut spec = mk_spec();
    spec.fencing = Fencing {
        proof: FencingProof::External,
        ..Fencing::default()
    };
    // No agent on the node: the user's fence controller answers.
    let mut world = World::new(cluster(3)).policy("p", spec).fail("node-1");
    assert_eq!(
        intent_names(&world.plan()),
        ["request fence node-1", "hold FencingPending"]
    );
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 3600);
    assert_eq!(
        intent_names(&world.plan()),
        ["hold FencingPending"],
        "silence proves no external fence"
    );
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

fn unproven(plan: &Plan) -> Vec<String> {
    plan.intents
        .iter()
        .filter_map(|i| match i {
            Intent::Hold {
                node,
                reason: reason @ HoldReason::AgentSilenceUnproven { .. },
                ..
            } => Some(reason.note(node.as_deref())),
            _ => None,
        })
        .collect()
}

/// A NetworkPolicy or a firewall blocks the agent port: podha hears no agent at all. The first
/// node to die is not proven fenced by its agent's silence, however long (an agent podha never
/// heard fences nothing on isolation): podha asks for the fence and says why it holds.
#[test]
fn silence_of_agents_podha_never_heard_proves_nothing() {
    let mut world = World::new(with_agents(cluster(5)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    agent_silent(&mut world, "node-1", 400, |_| false);
    let plan = world.plan();
    assert_eq!(
        intent_names(&plan),
        ["request fence node-1", "hold AgentSilenceUnproven"],
        "asked, held, nothing tainted on the first pass"
    );
    let notes = unproven(&plan);
    assert!(
        notes[0].contains("podha never heard the agent of node node-1 in this leadership term"),
        "{notes:?}"
    );
    // Its acknowledgement still proves the fence.
    world.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// podha heard the dead node's agent, but hears too few of the others now: their port may be
/// blocked, and peers podha does not hear may have vouched for the silent agent.
#[test]
fn silence_counts_only_while_podha_hears_a_strict_majority_of_the_agents() {
    let mut world = World::new(with_agents(cluster(5)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent(&mut world, "node-1", 400, |n| {
        n == "node-1" || n == "node-2"
    });
    let plan = world.plan();
    assert_eq!(intent_names(&plan), ["hold AgentSilenceUnproven"]);
    assert!(
        unproven(&plan)[0].contains("podha hears 1 of the 4 other agents it expects"),
        "{:?}",
        unproven(&plan)
    );
    agent_silent(&mut world, "node-1", 400, |n| {
        n != "node-5" && n != "node-4"
    });
    assert_eq!(
        intent_names(&world.plan()),
        ["hold AgentSilenceUnproven"],
        "2 of 4 is no strict majority"
    );
    agent_silent(&mut world, "node-1", 400, |n| n != "node-5");
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// With two agents, one silent, hearing the other is half of them, no majority: the silent
/// one cannot tell a cut from podha's side from its own death and stays up, so its silence
/// never counts. With three, hearing the other two is enough.
#[test]
fn with_two_agents_the_silence_of_one_never_counts_with_three_it_does() {
    let mut world = World::new(with_agents(cluster(2)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 400);
    let plan = world.plan();
    assert_eq!(intent_names(&plan), ["hold AgentSilenceUnproven"]);
    assert!(
        unproven(&plan)[0].contains("podha hears 1 of the 1 other agents"),
        "{:?}",
        unproven(&plan)
    );
    let mut world = World::new(with_agents(cluster(3)))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    world.ledger.record_fence_request("node-1", "p/1");
    agent_silent_for(&mut world, "node-1", 40);
    assert_eq!(
        intent_names(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

/// A pod that must stay keeps the out-of-service taint off the node (podha's fence instead,
/// and only the eligible pods deleted). Those deletions let the attach/detach controller
/// force-detach the volumes 6 minutes later, so with a proof asked for they wait for it too.
#[test]
fn a_refused_taint_still_waits_for_the_proof_before_any_pod_is_deleted() {
    let bare = mk_pod("ns", "bare").on("node-1").claim("bare-data");
    let view = cluster(3)
        .with(bare)
        .with(mk_pvc("ns", "bare-data").bound_to("pv-bare"))
        .with(mk_csi_pv("pv-bare", DRIVER));
    let mut world = World::new(view)
        .policy("p", needs_cloud_shutdown(mk_spec()))
        .fail("node-1");
    let plan = world.plan();
    assert_eq!(
        pending(&plan),
        vec![(
            Some("node-1".into()),
            FencingProof::CloudShutdownTaint.into()
        )]
    );
    assert_eq!(
        intent_names(&plan),
        ["hold FencingPending"],
        "no fence, no mark, no delete before the proof"
    );
    world.view = shut_down(world.view, "node-1");
    let names = intent_names(&world.plan());
    assert!(
        names.iter().any(|n| n.contains("podha.io/fenced"))
            && !names.iter().any(|n| n.contains("out-of-service")),
        "the proof in, the node gets podha's fence (the taint stays refused): {names:?}"
    );
}

/// podha's scheduling fence left from an earlier failure of the node (its volumes never
/// moved, nothing proved the node fenced) is no taint this incident may delete pods under:
/// the policy's proof is asked for as on a node without it.
#[test]
fn a_fence_left_from_an_earlier_failure_lets_no_pod_go_without_the_proof() {
    let mut view = with_agent(cluster(3), "node-1");
    let leftover = (*view.nodes["node-1"])
        .clone()
        .taint(crate::api::FENCE_TAINT_KEY, "nodeDead", "NoSchedule")
        .annotation(TAINT_MARKER_ANNOTATION, "p");
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(leftover));
    let mut world = World::new(view)
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    let plan = world.plan();
    assert!(deletes(&plan).is_empty(), "{:?}", plan.intents);
    assert_eq!(
        intent_names(&plan),
        ["request fence node-1", "hold FencingPending"]
    );
    // The proof in, the fence on the node keeps the scheduler off it: the pod may go (and
    // the node gets the out-of-service taint once its volume waits, as any fenced node).
    world.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0"]);
}

/// The out-of-service taint already on the node (an earlier process's, or an admin's) counts
/// only with the policy's proof, as podha's fence does under `DeletePods`.
#[test]
fn an_out_of_service_taint_found_on_the_node_counts_only_with_the_proof() {
    let mut view = with_agent(cluster(3), "node-1");
    let found = (*view.nodes["node-1"]).clone().taint(
        crate::api::OUT_OF_SERVICE_TAINT_KEY,
        "nodeshutdown",
        "NoExecute",
    );
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(found));
    let mut world = World::new(view)
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    assert!(deletes(&world.plan()).is_empty());
    world.ledger.record_fence_request("node-1", "p/1");
    acknowledge(&mut world, "node-1", "p/1");
    assert_eq!(intent_names(&world.plan()), ["delete ns/db-0"]);
}

/// A fence request left on a node whose failure is over is withdrawn, so an agent that never
/// saw it (cut off, stopped) does not carry it out later on a healthy node; not while the
/// incident is open, nor while the node is not Ready or some policy does not judge it Healthy.
#[test]
fn a_fence_request_is_withdrawn_once_the_failure_is_over() {
    let mut view = cluster(3);
    let requested = (*view.nodes["node-1"])
        .clone()
        .annotation(FENCE_REQUEST_ANNOTATION, "p/1/boot-1");
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(requested));
    let withdraw = Intent::WithdrawFenceRequest {
        node: "node-1".into(),
    };
    let healed = World::new(view.clone()).policy("p", mk_spec());
    assert_eq!(healed.plan().intents, vec![withdraw.clone()]);
    let open = World::new(view.clone())
        .policy("p", mk_spec())
        .fail("node-1");
    assert!(
        !open.plan().intents.contains(&withdraw),
        "the incident is open: {:?}",
        open.plan().intents
    );
    let suspect = World::new(view.clone()).policy("p", mk_spec()).set_health(
        "p",
        "node-1",
        NodeHealth::Suspect {
            since: Instant::now(),
            failures: 1,
        },
    );
    assert!(suspect.plan().intents.is_empty(), "not judged Healthy yet");
    let unknown = (*view.nodes["node-1"]).clone().ready(false);
    view.nodes
        .insert("node-1".into(), std::sync::Arc::new(unknown));
    let not_ready = World::new(view).policy("p", mk_spec());
    assert!(not_ready.plan().intents.is_empty(), "not Ready");
}

/// `node` renewed its Lease `renewals` times since the fence acknowledgement on it, in the same
/// boot (otherwise silent since long before the incident, its agent not probed); the other
/// nodes renewed just now.
pub(super) fn renewed_after_ack(world: &mut World, node: &str, renewals: u32) {
    agent_silent(world, node, 60, |_| true);
    let hb = world
        .heartbeats
        .get_mut(node)
        .expect("inserted by agent_silent");
    *hb = Heartbeat {
        agent_answered: None,
        agent_connected: None,
        agent_armed: None,
        agent_disarmed: false,
        agent_hearing_from: None,
        agent_silent_since: None,
        renewals_since_ack: renewals,
        renew_time: None,
        ..*hb
    };
}

/// A node that acknowledged its fence and then renewed its Lease twice in the same boot was not
/// fenced: the acknowledgement proves nothing, and podha does nothing more there, before the
/// taint or after it, and says so (also once the incident is over). One renewal contradicts
/// nothing: one written before the fence may reach podha after the acknowledgement.
#[test]
fn an_acknowledged_fence_the_node_contradicts_proves_nothing_and_stops_every_action() {
    for proof in [FencingProof::Agent, FencingProof::External] {
        let mut spec = mk_spec();
        spec.fencing.proof = proof;
        let mut world = World::new(with_agent(cluster(3), "node-1"))
            .policy("p", spec.clone())
            .fail("node-1");
        world.ledger.record_fence_request("node-1", "p/1");
        acknowledge(&mut world, "node-1", "p/1");
        renewed_after_ack(&mut world, "node-1", 1);
        assert_eq!(
            intent_names(&world.plan()),
            ["taint node-1 node.kubernetes.io/out-of-service"],
            "{proof:?}"
        );
        renewed_after_ack(&mut world, "node-1", 2);
        assert_eq!(
            intent_names(&world.plan()),
            ["hold FenceContradicted"],
            "{proof:?}"
        );

        // Tainted already, its pod not deleted yet: it stays.
        let mut tainted = World::new(with_agent(cluster(3), "node-1"))
            .policy("p", spec)
            .fail_tainted("node-1");
        tainted.ledger.record_fence_request("node-1", "p/1");
        acknowledge(&mut tainted, "node-1", "p/1");
        renewed_after_ack(&mut tainted, "node-1", 3);
        assert_eq!(intent_names(&tainted.plan()), ["hold FenceContradicted"]);
    }

    // A new failure of a node whose earlier fence was contradicted: that acknowledgement says
    // nothing of this incident, which asks for a fence of its own.
    let mut again = World::new(with_agent(cluster(3), "node-1"))
        .policy("p", needs_agent(mk_spec()))
        .fail("node-1");
    acknowledge(&mut again, "node-1", "p/0");
    renewed_after_ack(&mut again, "node-1", 5);
    assert_eq!(
        intent_names(&again.plan()),
        ["request fence node-1", "hold FencingPending"]
    );

    // No incident any more, the request still on the node: reported, and withdrawn.
    let mut view = with_agent(cluster(3), "node-1");
    let requested = (*view.nodes["node-1"])
        .clone()
        .annotation(FENCE_REQUEST_ANNOTATION, "p/1/b1")
        .annotation(FENCE_ACK_ANNOTATION, "p/1/b1");
    view.nodes.insert("node-1".into(), requested.into());
    let mut world = World::new(view).policy("p", needs_agent(mk_spec()));
    renewed_after_ack(&mut world, "node-1", 2);
    let plan = world.plan();
    assert!(
        plan.intents.iter().any(|i| matches!(
            i,
            Intent::Hold {
                policy,
                node: Some(node),
                reason: HoldReason::FenceContradicted { renewals: 2 },
            } if policy == "p" && node == "node-1"
        )),
        "{:?}",
        plan.intents
    );
}
