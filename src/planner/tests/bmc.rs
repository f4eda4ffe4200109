//! `fencing.proof: BMC`: the node's BMC is asked to force the machine off once per incident,
//! read until it says `Off`, and only then is the out-of-service taint put on.

use super::*;
use crate::api::{BmcFencing, Fencing, FencingProof};

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
    world.ledger.record_power_off_accepted("node-1", world.now);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["read power of node-1 by bmc-node-1", "hold FencingPending"],
        "the ForceOff once per incident; then reads"
    );
    world.ledger.record_powered_off("node-1", world.now);
    assert_eq!(
        bmc_intents(&world.plan()),
        ["taint node-1 node.kubernetes.io/out-of-service"]
    );
}

#[test]
fn an_off_read_without_an_accepted_power_off_proves_nothing() {
    let mut world = World::new(cluster(3))
        .policy("p", needs_bmc(mk_spec(), by_template()))
        .fail("node-1");
    // A read recorded before any ForceOff was accepted (nothing to confirm) is not kept.
    world.ledger.record_powered_off("node-1", world.now);
    assert!(!world.ledger.get("node-1").expect("open").powered_off());
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
