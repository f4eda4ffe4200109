//! What a policy says of its own protection: nodes without an agent that could prove their
//! fence under `fencing.proof: Agent`, and the taint on the judgement alone under `None`.

use super::*;
use crate::api::FencingProof;
use crate::api::condition;
use crate::runtime::writer::{EventNote, Report};

/// The events and the last status the loop reported for policy `p` since the last call.
fn reported(h: &mut Harness) -> (Vec<EventNote>, Option<crate::api::PodHAPolicyStatus>) {
    let mut events = Vec::new();
    let mut status = None;
    for report in h.writes.queued_reports() {
        match report {
            Report::Event(note) => events.push(note),
            Report::Status { policy, status: s } if policy == "p" => status = Some(s),
            Report::Status { .. } => {}
        }
    }
    (events, status)
}

fn reason_of(status: &crate::api::PodHAPolicyStatus, type_: &str) -> (String, String) {
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("condition");
    (c.reason.clone(), c.message.clone())
}

fn unprotected_gauge(metrics: &Metrics) -> Option<String> {
    let text = metrics.encode().expect("encode");
    text.lines()
        .find_map(|l| l.strip_prefix("podha_policy_nodes_unprotected{policy=\"p\"} "))
        .map(str::to_string)
}

#[tokio::test(start_paused = true)]
async fn nodes_without_an_agent_degrade_an_agent_policy_once_they_last() {
    let mut spec = quick_spec();
    spec.fencing.proof = FencingProof::Agent;
    let objects = vec![mk_node("node-1").into(), mk_node("node-2").into()];
    let mut h = harness_with(objects, Some(spec));
    h.run_for(5).await;
    let (events, status) = reported(&mut h);
    let status = status.expect("a status");
    assert_eq!(
        reason_of(&status, condition::DEGRADED).0,
        condition::REASON_AS_EXPECTED,
        "an agent's pod replaced comes back within seconds"
    );
    assert!(events.iter().all(|e| e.reason != "AgentsMissing"));
    h.run_for(30).await;
    let (events, status) = reported(&mut h);
    let (reason, message) = reason_of(&status.expect("a new status"), condition::DEGRADED);
    assert_eq!(reason, condition::REASON_AGENTS_MISSING);
    assert!(
        message.starts_with("2 of 2 watched nodes") && message.contains("node-1 (no agent)"),
        "{message}"
    );
    let warned: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "AgentsMissing")
        .collect();
    assert_eq!(warned.len(), 1, "{events:?}");
    assert!(warned[0].warning);
    assert_eq!(unprotected_gauge(&h.metrics).as_deref(), Some("2"));
    // Said once: the status does not change, and nothing is said again.
    h.run_for(10).await;
    let (events, _) = reported(&mut h);
    assert!(events.iter().all(|e| e.reason != "AgentsMissing"));
}

/// A replica that starts (or takes the lead) while the status says `AgentsMissing` says so on,
/// without a second Warning: a restarted process cannot tell for 30 s, a follower that took
/// the lead watched the agents all along.
#[tokio::test(start_paused = true)]
async fn a_new_leader_keeps_saying_agents_missing_without_saying_it_again() {
    let mut spec = quick_spec();
    spec.fencing.proof = FencingProof::Agent;
    let objects = vec![mk_node("node-1").into(), mk_node("node-2").into()];
    let mut h = harness_with(objects.clone(), Some(spec.clone()));
    h.run_for(35).await;
    let (events, status) = reported(&mut h);
    let status = status.expect("a status");
    assert_eq!(
        reason_of(&status, condition::DEGRADED).0,
        condition::REASON_AGENTS_MISSING
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e.reason == "AgentsMissing")
            .count(),
        1
    );

    // The watch delivers the status written.
    let mut stored = PodHAPolicy::new("p", spec);
    stored.status = Some(status);
    h.actor.state.apply(
        Change::Policy(Event::Apply(stored.clone().into())),
        Instant::now(),
    );

    // Another process, which reads that status, takes the lead.
    let mut next = harness_with(objects, None);
    next.actor
        .state
        .apply(Change::Policy(Event::Apply(stored.into())), Instant::now());
    for secs in [3, 40] {
        next.run_for(secs).await;
        let (events, status) = reported(&mut next);
        if let Some(status) = status {
            assert_eq!(
                reason_of(&status, condition::DEGRADED).0,
                condition::REASON_AGENTS_MISSING,
                "after {secs}s"
            );
        }
        assert!(
            events.iter().all(|e| e.reason != "AgentsMissing"),
            "after {secs}s: {events:?}"
        );
    }
    assert_eq!(unprotected_gauge(&next.metrics).as_deref(), Some("2"));

    // The leader steps down and takes the lead again: it watched the agents meanwhile.
    h.leader.send(None).expect("leader channel");
    h.run_for(2).await;
    h.leader
        .send(Some(crate::leader::Claim::for_tests()))
        .expect("leader channel");
    h.run_for(2).await;
    let (events, _) = reported(&mut h);
    assert!(
        events.iter().all(|e| e.reason != "AgentsMissing"),
        "{events:?}"
    );
    assert_eq!(unprotected_gauge(&h.metrics).as_deref(), Some("2"));
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_taints_without_proof_says_so_once() {
    let objects = vec![mk_node("node-1").into(), mk_node("node-2").into()];
    let mut h = harness(objects);
    h.run_for(3).await;
    let (events, status) = reported(&mut h);
    let status = status.expect("a status");
    let (reason, _) = reason_of(&status, condition::READY);
    assert_eq!(reason, condition::REASON_WATCHING_WITHOUT_PROOF);
    let said: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "FencingProofNone")
        .collect();
    assert_eq!(said.len(), 1, "{events:?}");
    assert!(!said[0].warning && said[0].note.contains("follows the judgement alone"));
    // A new leader reads the status written before (as the watch delivers it) and does not
    // say it again.
    let mut written = PodHAPolicy::new("p", quick_spec());
    written.status = Some(status);
    h.actor
        .state
        .apply(Change::Policy(Event::Apply(written.into())), Instant::now());
    h.actor.reported.forget_statuses();
    h.run_for(3).await;
    let (events, _) = reported(&mut h);
    assert!(
        events.iter().all(|e| e.reason != "FencingProofNone"),
        "{events:?}"
    );
    assert_eq!(unprotected_gauge(&h.metrics).as_deref(), Some("0"));
}

/// A dead node held for its proof degrades its policy while it waits, and only then.
#[tokio::test(start_paused = true)]
async fn a_node_held_for_its_proof_degrades_its_policy_until_it_is_acted_on() {
    let mut spec = quick_spec();
    spec.fencing.proof = FencingProof::CloudShutdownTaint;
    let mut objects = dead_node_with_pods("node-1");
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness_with(objects, Some(spec.clone()));
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "held: nothing sent");
    let (_, status) = reported(&mut h);
    let (reason, message) = reason_of(&status.expect("a status"), condition::DEGRADED);
    assert_eq!(reason, condition::REASON_FENCING_PENDING);
    assert!(message.ends_with(": node-1"), "{message}");
    // The proof comes: acted on, no longer degraded.
    spec.fencing.proof = FencingProof::None;
    h.apply_policy(spec);
    h.run_for(2).await;
    assert!(!acts(&mut h.writes).is_empty(), "acted once proven");
    let (_, status) = reported(&mut h);
    let status = status.expect("a new status");
    assert_ne!(
        reason_of(&status, condition::DEGRADED).0,
        condition::REASON_FENCING_PENDING
    );
}

fn pods_gauge(metrics: &Metrics) -> Vec<String> {
    let text = metrics.encode().expect("encode");
    text.lines()
        .filter(|l| l.starts_with("podha_pods{"))
        .map(str::to_string)
        .collect()
}

/// A healthy node with a pod podha would move (a target elsewhere), one opted out and one
/// finished: the status and `podha_pods` count the first two; a change shows within a few
/// seconds, not at once.
#[tokio::test(start_paused = true)]
async fn the_status_counts_protected_pods_and_why_not_the_others_at_most_every_few_seconds() {
    let pod = |name: &str| {
        mk_pod("ns", name)
            .on("node-1")
            .owned_by_sts(name)
            .claim(&format!("data-{name}"))
    };
    let mut objects: Vec<Obj> = vec![mk_node("node-1").into(), mk_node("node-2").into()];
    for name in ["db", "cache"] {
        objects.push(
            mk_pvc("ns", &format!("data-{name}"))
                .bound_to(&format!("pv-{name}"))
                .into(),
        );
        objects.push(mk_csi_pv(&format!("pv-{name}"), DRIVER).into());
    }
    objects.push(pod("db").into());
    objects.push(pod("cache").annotation("podha.io/failover", "false").into());
    // Without a claim, or finished: not counted.
    objects.push(mk_pod("ns", "web").on("node-1").owned_by_sts("web").into());
    objects.push(pod("backup").phase("Succeeded").into());
    let mut h = harness(objects);
    h.run_for(1).await;
    let (_, status) = reported(&mut h);
    let status = status.expect("a status");
    assert_eq!((status.protected_pods, status.unprotected_pods), (1, 1));
    assert_eq!(
        status.unprotected_reasons,
        [crate::api::UnprotectedReason {
            reason: "OptedOut".into(),
            pods: 1
        }]
    );
    assert_eq!(
        pods_gauge(&h.metrics),
        [
            "podha_pods{policy=\"p\",protected=\"false\",reason=\"OptedOut\"} 1",
            "podha_pods{policy=\"p\",protected=\"true\",reason=\"\"} 0",
            // The opted-out pod stays on db's node: the taint would be refused there.
            "podha_pods{policy=\"p\",protected=\"true\",reason=\"OutOfServiceTaintRefused\"} 1",
        ]
    );
    assert_eq!(status.slow_detach_pods, 1);

    // The watch delivers the status written (its conditions' times carry over).
    let mut written = PodHAPolicy::new("p", quick_spec());
    written.status = Some(status);
    h.actor
        .observe_change(Change::Policy(Event::Apply(written.into())));
    h.run_for(1).await;
    assert!(reported(&mut h).1.is_none(), "written once");

    // The pod is opted in: a change, counted at the next working-out, at most every 5 s.
    h.actor
        .observe_change(Change::Pod(Event::Apply(pod("cache"))));
    h.run_for(1).await;
    let (_, status) = reported(&mut h);
    assert!(status.is_none(), "not yet: {status:?}");
    h.run_for(3).await;
    let (_, status) = reported(&mut h);
    let status = status.expect("the new counts");
    assert_eq!((status.protected_pods, status.unprotected_pods), (2, 0));
    assert!(status.unprotected_reasons.is_empty());
    assert_eq!(
        pods_gauge(&h.metrics),
        ["podha_pods{policy=\"p\",protected=\"true\",reason=\"\"} 2"],
        "the reason that keeps no pod is gone"
    );

    // A follower reports none: only the leader's counts are current.
    h.leader.send(None).expect("leader channel");
    h.run_for(1).await;
    assert!(pods_gauge(&h.metrics).is_empty());
}

/// Under the agent's proof the leader counts only once it has watched the agents' Leases for a
/// Lease's duration: a Lease first seen counts as renewed then, so an agent that stopped
/// before the process started would look alive until that.
#[tokio::test(start_paused = true)]
async fn under_the_agents_proof_pods_are_counted_once_a_lease_duration_has_passed() {
    let mut spec = quick_spec();
    spec.fencing.proof = FencingProof::Agent;
    let objects: Vec<Obj> = vec![
        mk_node("node-1").into(),
        mk_node("node-2").into(),
        mk_pvc("ns", "data-db").bound_to("pv-db").into(),
        mk_csi_pv("pv-db", DRIVER).into(),
        mk_pod("ns", "db-0")
            .on("node-1")
            .owned_by_sts("db")
            .claim("data-db")
            .into(),
    ];
    let mut h = harness_with(objects, Some(spec));
    h.run_for(39).await;
    let (_, status) = reported(&mut h);
    let status = status.expect("a status");
    assert_eq!((status.protected_pods, status.unprotected_pods), (0, 0));
    assert!(pods_gauge(&h.metrics).is_empty());
    h.run_for(2).await;
    let (_, status) = reported(&mut h);
    let status = status.expect("the counts");
    assert_eq!((status.protected_pods, status.unprotected_pods), (0, 1));
    assert_eq!(status.unprotected_reasons[0].reason, "NoProvingAgent");
}
