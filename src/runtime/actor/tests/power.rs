//! The BMC's answers to power actions, as the decision loop records them in the incident.

use super::*;
use crate::api::{BmcFencing, Fencing, FencingProof};
use crate::runtime::actuator::ActError;
use crate::runtime::power::{PowerError, PowerOutcome};
use crate::runtime::writer::POWER_ACTION_DEADLINE;

/// [`quick_spec`] fencing its nodes through their BMCs, powering them on after the failover.
fn bmc_spec() -> PodHAPolicySpec {
    let mut spec = quick_spec();
    spec.fencing = Fencing {
        proof: FencingProof::Bmc,
        bmc: Some(BmcFencing {
            secret_name: Some("bmc-{node}".into()),
            secret_name_label: None,
            power_cycle: true,
            match_system_uuid: false,
        }),
        ..Fencing::default()
    };
    spec
}

/// The `ForceOff` of `node-1` the loop sent since last asked.
fn power_off_sent(h: &mut Harness) -> Intent {
    h.writes
        .queued_intents()
        .into_iter()
        .find(|i| matches!(i, Intent::PowerOff { .. }))
        .expect("a ForceOff sent")
}

/// `node-1` dead, its `ForceOff` sent and failed with `first`, sent again and answered
/// `Off` (the machine found off before the second `ForceOff` went out): whether podha counts
/// the power-off as its own.
async fn found_off_after(first: ActError) -> bool {
    let mut objects = dead_node_with_pods("node-1");
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness_with(objects, Some(bmc_spec()));
    h.actor.tick(Instant::now()).await;
    let intent = power_off_sent(&mut h);
    let result = Err(first);
    h.actor.on_result(
        ActResult {
            intent: intent.clone(),
            result,
        },
        Instant::now(),
    );
    h.run_for(2).await;
    let again = power_off_sent(&mut h);
    let result = Ok(Outcome::Power(PowerOutcome::Off));
    h.actor.on_result(
        ActResult {
            intent: again,
            result,
        },
        Instant::now(),
    );
    let incident = h.actor.ledger.get("node-1").expect("incident");
    incident.power_off.expect("found off").by_podha
}

#[tokio::test(start_paused = true)]
async fn a_machine_found_off_after_a_force_off_whose_answer_was_lost_is_podhas() {
    assert!(
        found_off_after(ActError::TimedOut(POWER_ACTION_DEADLINE)).await,
        "no answer in time: the ForceOff may have gone out"
    );
    let unreachable = || crate::redfish::Error::Unreachable {
        address: "https://bmc".into(),
        detail: "connection reset".into(),
    };
    let unanswered = PowerError::ForceOffUnanswered {
        node: "node-1".into(),
        secret: "bmc-node-1".into(),
        error: unreachable(),
    };
    assert!(found_off_after(ActError::Power(unanswered)).await);
    // The BMC unreachable before the ForceOff went out: someone else switched the machine off.
    let unread = PowerError::Bmc {
        node: "node-1".into(),
        secret: "bmc-node-1".into(),
        error: unreachable(),
    };
    assert!(!found_off_after(ActError::Power(unread)).await);
}
