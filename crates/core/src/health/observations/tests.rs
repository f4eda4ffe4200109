//! What podha has seen of a node: the Lease, Ready, the probes, boots and leadership terms.

use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::health::Arming;
use crate::test_builders::{NodeBuild, mk_node};

fn micro(secs: i64) -> MicroTime {
    MicroTime(Timestamp::from_second(secs).unwrap())
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn ready_status_from_condition() {
    let cases = [
        (None, ReadyStatus::Missing),
        (Some("True"), ReadyStatus::True),
        (Some("False"), ReadyStatus::False),
        (Some("Unknown"), ReadyStatus::Unknown),
        (Some("true"), ReadyStatus::Unknown),
        (Some(""), ReadyStatus::Unknown),
    ];
    for (input, want) in cases {
        assert_eq!(ReadyStatus::from_condition_status(input), want, "{input:?}");
    }
}

#[test]
fn ready_status_from_node() {
    let only_pressure = mk_node("n1").without_conditions();
    let only_pressure = Node {
        status: only_pressure.status.map(|st| NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "MemoryPressure".into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..st
        }),
        ..only_pressure
    };
    let cases = [
        (mk_node("n1"), ReadyStatus::True),
        (mk_node("n1").ready(false), ReadyStatus::Unknown),
        (mk_node("n1").without_conditions(), ReadyStatus::Missing),
        (only_pressure, ReadyStatus::Missing),
        (Node::default(), ReadyStatus::Missing),
    ];
    for (node, want) in cases {
        assert_eq!(ReadyStatus::from_node(&node), want, "{:?}", node.status);
    }
}

#[test]
fn new_baselines_the_lease_clock_without_a_sign_of_life() {
    let t0 = Instant::now();
    let obs = NodeObservations::new(t0);
    assert_eq!(obs.lease_baseline(), t0);
    assert_eq!(obs.last_renewal(), None);
    assert_eq!(obs.last_seen_alive(), None);
    assert_eq!(obs.ready(), ReadyStatus::Missing);
    assert_eq!(obs.tcp(), None);
    assert!(!obs.in_gap());
}

#[test]
fn only_a_changed_renew_time_counts_as_renewal() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    // First sighting: recorded, not counted.
    assert!(!obs.observe_lease(Some(&micro(100)), t0 + s(1)));
    assert_eq!(obs.last_renewal(), None);
    assert_eq!(obs.lease_baseline(), t0);
    // Re-delivery of the same renewTime (re-list): not a renewal.
    assert!(!obs.observe_lease(Some(&micro(100)), t0 + s(2)));
    assert_eq!(obs.last_renewal(), None);
    // A lease without renewTime says nothing and forgets nothing.
    assert!(!obs.observe_lease(None, t0 + s(3)));
    assert!(!obs.observe_lease(Some(&micro(100)), t0 + s(4)));
    // A new renewTime is a renewal, at podha's instant.
    assert!(obs.observe_lease(Some(&micro(110)), t0 + s(5)));
    assert_eq!(obs.last_renewal(), Some(t0 + s(5)));
    assert_eq!(obs.lease_baseline(), t0 + s(5));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(5)));
    // An earlier renewTime (kubelet clock stepped back) is still a change.
    assert!(obs.observe_lease(Some(&micro(50)), t0 + s(6)));
    assert_eq!(obs.last_renewal(), Some(t0 + s(6)));
}

#[test]
fn out_of_order_instants_never_move_clocks_back() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.lease_renewed(t0 + s(10));
    obs.lease_renewed(t0 + s(4));
    assert_eq!(obs.last_renewal(), Some(t0 + s(10)));
    assert_eq!(obs.lease_baseline(), t0 + s(10));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(10)));
    obs.gap(t0 + s(8));
    assert_eq!(obs.lease_baseline(), t0 + s(10));
}

#[test]
fn only_a_change_to_ready_true_is_a_sign_of_life() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.observe_ready(ReadyStatus::True, t0 + s(1));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(1)));
    obs.observe_ready(ReadyStatus::True, t0 + s(2));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(1)), "re-delivered True");
    obs.observe_ready(ReadyStatus::Unknown, t0 + s(3));
    assert_eq!(obs.ready(), ReadyStatus::Unknown);
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(1)));
    obs.observe_ready(ReadyStatus::True, t0 + s(4));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(4)));
}

#[test]
fn gaps_restart_the_lease_clock_at_their_end_but_are_no_sign_of_life() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.lease_renewed(t0 + s(1));
    let epoch = obs.gap_epoch();

    obs.begin_gap(t0 + s(5));
    obs.begin_gap(t0 + s(6));
    assert!(obs.in_gap());
    assert_eq!(
        obs.gap_since(),
        Some(t0 + s(5)),
        "a gap starts at its first begin"
    );
    assert_eq!(
        obs.lease_baseline(),
        t0 + s(1),
        "the clock restarts at the end, not the start"
    );
    assert!(obs.gap_epoch() > epoch);

    let epoch = obs.gap_epoch();
    obs.end_gap(t0 + s(30));
    assert!(!obs.in_gap());
    assert!(obs.gap_epoch() > epoch);
    assert_eq!(obs.lease_baseline(), t0 + s(30));
    assert_eq!(obs.last_renewal(), Some(t0 + s(1)));
    assert_eq!(obs.last_seen_alive(), Some(t0 + s(1)));

    // An end without a begin still re-baselines.
    let epoch = obs.gap_epoch();
    obs.end_gap(t0 + s(40));
    assert_eq!(obs.lease_baseline(), t0 + s(40));
    assert!(obs.gap_epoch() > epoch);
}

#[test]
fn a_point_gap_re_baselines_but_does_not_end_an_open_gap() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.gap(t0 + s(10));
    assert!(!obs.in_gap());
    assert_eq!(obs.lease_baseline(), t0 + s(10));

    // A watch is re-listing when leadership is gained: the gap stays open until it ends.
    obs.begin_gap(t0 + s(20));
    obs.gap(t0 + s(21));
    assert!(obs.in_gap(), "still waiting for the watch");
    obs.end_gap(t0 + s(25));
    assert!(!obs.in_gap());
    assert_eq!(obs.lease_baseline(), t0 + s(25));
}

/// The settle rule reads when the port last answered (the probe's send time: the host was
/// up then or later) and since when it has been silent (the first unanswered probe's
/// result: silent by then). A refusal is an answer; silence restarts with each run.
#[test]
fn tcp_answers_and_silences_carry_their_instants() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.observe_probe(
        ProbeKind::KubeletTcp,
        TcpResult::Connected,
        t0 + s(1),
        t0 + s(2),
    );
    assert_eq!(obs.tcp_answered(), Some(t0 + s(1)));
    assert_eq!(obs.tcp_silent_since(), None);
    obs.observe_probe(
        ProbeKind::KubeletTcp,
        TcpResult::NoAnswer,
        t0 + s(3),
        t0 + s(4),
    );
    obs.observe_probe(
        ProbeKind::KubeletTcp,
        TcpResult::NoAnswer,
        t0 + s(5),
        t0 + s(6),
    );
    assert_eq!(
        obs.tcp_silent_since(),
        Some(t0 + s(4)),
        "from the first of the run"
    );
    assert_eq!(obs.tcp_answered(), Some(t0 + s(1)));
    obs.observe_probe(
        ProbeKind::KubeletTcp,
        TcpResult::Refused,
        t0 + s(7),
        t0 + s(7),
    );
    assert_eq!(
        (obs.tcp_answered(), obs.tcp_silent_since()),
        (Some(t0 + s(7)), None)
    );
    assert_eq!(
        obs.probed(ProbeKind::KubeletTcp).connected,
        Some(t0 + s(1)),
        "a refusal is the host, not what listens on the port"
    );
    obs.observe_probe(
        ProbeKind::KubeletTcp,
        TcpResult::NoAnswer,
        t0 + s(8),
        t0 + s(9),
    );
    obs.forget_probe(ProbeKind::KubeletTcp);
    assert_eq!(obs.tcp_silent_since(), None, "no endpoint, no evidence");
}

/// Only an answer from an agent that counts itself heard is counted as the agent's own
/// (for the `Agent` proof); any answer says it runs.
#[test]
fn an_agent_answer_counts_as_the_agents_only_once_it_knows_it_is_heard() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    let agent = |obs: &NodeObservations| *obs.probed(ProbeKind::Agent);
    obs.observe_agent(TcpResult::Connected, false, Arming::Disarmed, t0, t0 + s(1));
    assert_eq!(
        (agent(&obs).answered, agent(&obs).connected),
        (Some(t0), None)
    );
    obs.observe_agent(
        TcpResult::Connected,
        true,
        Arming::Armed,
        t0 + s(1),
        t0 + s(2),
    );
    assert_eq!(agent(&obs).connected, Some(t0 + s(1)));
    assert_eq!(agent(&obs).armed, Some(t0 + s(1)));
    obs.observe_agent(
        TcpResult::Refused,
        true,
        Arming::Disarmed,
        t0 + s(2),
        t0 + s(3),
    );
    assert_eq!(
        (agent(&obs).answered, agent(&obs).connected),
        (Some(t0 + s(2)), Some(t0 + s(1)))
    );
}

/// A heartbeat that held the node leaves no answer the silence proof counts after, answered
/// or not; an answer that says nothing either way changes nothing; the next answer saying the
/// agent is heard and not held arms it again.
#[test]
fn a_held_heartbeat_ends_the_hearing_a_silence_counts_after_even_unanswered() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    let agent = |obs: &NodeObservations| *obs.probed(ProbeKind::Agent);
    obs.observe_agent(TcpResult::Connected, true, Arming::Armed, t0, t0 + s(1));
    assert_eq!((agent(&obs).armed, agent(&obs).disarmed), (Some(t0), false));
    // Held, the answer lost: the agent may take the node as held.
    obs.observe_agent(
        TcpResult::NoAnswer,
        false,
        Arming::Disarmed,
        t0 + s(1),
        t0 + s(2),
    );
    assert_eq!((agent(&obs).armed, agent(&obs).disarmed), (None, true));
    assert_eq!(agent(&obs).silent_since, Some(t0 + s(2)));
    // Held and answered: still heard (the quorum counts it), not armed.
    obs.observe_agent(
        TcpResult::Connected,
        true,
        Arming::Disarmed,
        t0 + s(2),
        t0 + s(3),
    );
    assert_eq!(
        (agent(&obs).connected, agent(&obs).armed),
        (Some(t0 + s(2)), None)
    );
    // Nothing said either way: still disarmed.
    obs.observe_agent(
        TcpResult::Connected,
        true,
        Arming::Unsaid,
        t0 + s(3),
        t0 + s(4),
    );
    assert!(agent(&obs).disarmed);
    // No longer held: armed again from that answer; a silence after it keeps it.
    obs.observe_agent(
        TcpResult::Connected,
        true,
        Arming::Armed,
        t0 + s(4),
        t0 + s(5),
    );
    obs.observe_agent(
        TcpResult::NoAnswer,
        false,
        Arming::Unsaid,
        t0 + s(5),
        t0 + s(6),
    );
    assert_eq!(
        (agent(&obs).armed, agent(&obs).disarmed),
        (Some(t0 + s(4)), false)
    );
    // A held probe sent before this term began changes nothing.
    obs.restart_agent_hearing(t0 + s(10));
    assert_eq!((agent(&obs).armed, agent(&obs).disarmed), (None, false));
    obs.observe_agent(
        TcpResult::Connected,
        true,
        Arming::Armed,
        t0 + s(10),
        t0 + s(11),
    );
    obs.observe_agent(
        TcpResult::NoAnswer,
        false,
        Arming::Disarmed,
        t0 + s(9),
        t0 + s(12),
    );
    assert_eq!(agent(&obs).armed, Some(t0 + s(10)));
}

/// A new boot's agent is heard afresh: the silence that began when the last boot ended is
/// not this agent's.
#[test]
fn a_new_boot_forgets_what_was_heard_of_the_last_boots_agent() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    let agent = |obs: &NodeObservations| *obs.probed(ProbeKind::Agent);
    obs.observe_boot_id(Some("boot-1"), t0);
    obs.observe_probe(ProbeKind::Agent, TcpResult::Connected, t0, t0 + s(1));
    obs.observe_probe(ProbeKind::Agent, TcpResult::NoAnswer, t0 + s(1), t0 + s(2));
    // Re-delivered, or not reported: nothing forgotten.
    obs.observe_boot_id(Some("boot-1"), t0 + s(3));
    obs.observe_boot_id(None, t0 + s(3));
    obs.observe_boot_id(Some(""), t0 + s(3));
    assert_eq!(agent(&obs).silent_since, Some(t0 + s(2)));
    obs.observe_boot_id(Some("boot-2"), t0 + s(30));
    let fresh = agent(&obs);
    assert_eq!((fresh.answered, fresh.silent_since), (None, None));
    // Still silent in the new boot: a silence, but with no answer before it.
    obs.observe_probe(
        ProbeKind::Agent,
        TcpResult::NoAnswer,
        t0 + s(31),
        t0 + s(32),
    );
    assert_eq!(
        (agent(&obs).answered, agent(&obs).silent_since),
        (None, Some(t0 + s(32)))
    );
}

/// A leadership term hears the agent afresh: an earlier term's answers and silence are
/// forgotten, and a round sent before the term began counts for nothing.
#[test]
fn a_new_leadership_term_forgets_what_was_heard_of_the_agent() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    let agent = |obs: &NodeObservations| *obs.probed(ProbeKind::Agent);
    obs.observe_probe(ProbeKind::Agent, TcpResult::Connected, t0, t0 + s(1));
    obs.observe_probe(ProbeKind::Agent, TcpResult::NoAnswer, t0 + s(1), t0 + s(2));
    obs.restart_agent_hearing(t0 + s(60));
    let fresh = agent(&obs);
    assert_eq!(
        (fresh.result, fresh.answered, fresh.silent_since),
        (None, None, None)
    );
    // Sent before the term began, in late.
    obs.observe_probe(
        ProbeKind::Agent,
        TcpResult::Connected,
        t0 + s(59),
        t0 + s(61),
    );
    assert_eq!(agent(&obs).answered, None);
    obs.observe_probe(
        ProbeKind::Agent,
        TcpResult::NoAnswer,
        t0 + s(60),
        t0 + s(61),
    );
    assert_eq!(agent(&obs).silent_since, Some(t0 + s(61)));
    assert_eq!(
        obs.tcp(),
        None,
        "the kubelet port's prober does not change with it"
    );
}

/// The renewals seen after a fence acknowledgement are counted for that acknowledgement, in
/// the boot it was seen in: a new one starts again, a reboot (the fence, or the node back)
/// stops the count, and no acknowledgement counts none.
#[test]
fn renewals_after_a_fence_acknowledgement_count_until_the_node_reboots() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.observe_boot_id(Some("boot-1"), t0);
    obs.lease_renewed(t0 + s(1));
    assert_eq!(obs.renewals_since_ack(), 0, "no acknowledgement yet");
    obs.observe_fence_ack(Some("p/1/boot-1"));
    obs.lease_renewed(t0 + s(10));
    assert_eq!(obs.renewals_since_ack(), 1);
    obs.observe_fence_ack(Some("p/1/boot-1"));
    obs.lease_renewed(t0 + s(20));
    assert_eq!(
        obs.renewals_since_ack(),
        2,
        "a re-delivered one goes on counting"
    );
    obs.observe_fence_ack(Some("p/2/boot-1"));
    assert_eq!(obs.renewals_since_ack(), 0, "a new acknowledgement");
    obs.lease_renewed(t0 + s(30));
    obs.observe_boot_id(Some("boot-2"), t0 + s(40));
    obs.lease_renewed(t0 + s(50));
    assert_eq!(obs.renewals_since_ack(), 0, "rebooted since");
    // Acknowledged by the new boot's agent (the reboot was the fence), or found so by a new
    // podha process: nothing it does contradicts it.
    obs.observe_fence_ack(Some("p/3/boot-1"));
    obs.lease_renewed(t0 + s(60));
    obs.lease_renewed(t0 + s(70));
    assert_eq!(obs.renewals_since_ack(), 0, "a request of the last boot");
    obs.observe_fence_ack(None);
    assert_eq!(obs.renewals_since_ack(), 0);
}

/// A boot the Node reports is shown to run only by a renewal of its Lease seen after podha saw
/// that boot ID, with no gap since: the boot ID changed (and changed back), or a gap in podha's
/// view that may hide such changes, wait for the next renewal.
#[test]
fn only_a_renewal_after_the_boot_id_was_seen_shows_that_boot_runs() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.lease_renewed(t0 + s(1));
    assert!(!obs.renewed_in_boot(), "no boot known yet");
    obs.observe_boot_id(Some("boot-1"), t0 + s(2));
    obs.lease_renewed(t0 + s(10));
    assert!(obs.renewed_in_boot());
    obs.observe_boot_id(Some("boot-1"), t0 + s(15));
    assert!(obs.renewed_in_boot(), "the same boot delivered again");
    obs.observe_boot_id(Some("flipped"), t0 + s(20));
    obs.observe_boot_id(Some("boot-1"), t0 + s(21));
    assert!(
        !obs.renewed_in_boot(),
        "the boot ID changed and back: renewed before, not since"
    );
    obs.lease_renewed(t0 + s(30));
    assert!(obs.renewed_in_boot());
    obs.begin_gap(t0 + s(35));
    assert!(!obs.renewed_in_boot(), "a gap may hide a change");
    obs.lease_renewed(t0 + s(40));
    assert!(!obs.renewed_in_boot(), "seen in the gap");
    obs.end_gap(t0 + s(41));
    obs.lease_renewed(t0 + s(50));
    assert!(obs.renewed_in_boot());
    obs.gap(t0 + s(55));
    assert!(!obs.renewed_in_boot(), "a new leadership term");
}

/// A renewal seen when podha's view of the Leases is whole happened by the time it was seen; one
/// seen at the end of a gap may have been written any time in it: it happened no earlier than
/// the gap's start, which is what shows a node ran on after some instant.
#[test]
fn a_renewal_seen_after_a_gap_happened_no_earlier_than_the_gap_began() {
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    obs.lease_renewed(t0 + s(10));
    assert_eq!(obs.renewal_not_before(), Some(t0 + s(10)));
    obs.begin_gap(t0 + s(12));
    obs.lease_renewed(t0 + s(30));
    obs.end_gap(t0 + s(30));
    assert_eq!(obs.last_renewal(), Some(t0 + s(30)));
    assert_eq!(obs.renewal_not_before(), Some(t0 + s(12)));
    obs.lease_renewed(t0 + s(40));
    assert_eq!(obs.renewal_not_before(), Some(t0 + s(40)));
}
