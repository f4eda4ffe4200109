//! A failover another process or replica acted on: what this one resumes, and that it is not
//! left open in Acting.

use super::*;

/// A dead node as policy `p` leaves it: its marker and the out-of-service taint on.
fn tainted_by_policy_p(node: &str) -> Node {
    mk_node(node)
        .ready(false)
        .annotation(TAINT_MARKER_ANNOTATION, "p")
        .taint(
            crate::api::OUT_OF_SERVICE_TAINT_KEY,
            "nodeshutdown",
            "NoExecute",
        )
}

/// A process restarted after its taint; meanwhile Kubernetes' pod GC removed the pod the
/// taint let go. The resumed failover has nothing left to do and must not stay open in Acting:
/// with no volume left on the node it is recovered at once.
#[tokio::test(start_paused = true)]
async fn a_resumed_failover_with_nothing_left_to_do_is_not_left_acting() {
    let tainted = tainted_by_policy_p("node-1");
    let mut h = harness(vec![
        tainted.into(),
        mk_node("node-2").into(),
        mk_node("node-3").into(),
    ]);
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "nothing to repeat");
    assert_eq!(
        h.actor
            .ledger
            .get("node-1")
            .map(crate::incident::Incident::phase),
        Some(crate::api::FailoverPhase::Recovered)
    );
}

/// A standby followed a failover (its intents dropped); the leader tainted the node, deleted
/// the pod and stopped; the standby leads now and has nothing left to do. Its failover must
/// not stay open in Acting (CI: `podha_failovers_open{state="Acting"}` stuck at 1 on the new
/// leader after the replacement ran).
#[tokio::test(start_paused = true)]
async fn a_failover_another_replica_acted_on_is_not_left_acting() {
    let mut objects = dead_node_with_pods("node-1");
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness(objects);
    h.leader.send(None).expect("leader channel");
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "a standby sends nothing");
    assert_eq!(
        h.actor
            .ledger
            .get("node-1")
            .map(crate::incident::Incident::phase),
        Some(crate::api::FailoverPhase::Acting)
    );
    // The leader's work, as the watches show it.
    let tainted = tainted_by_policy_p("node-1");
    let now = Instant::now();
    h.actor
        .state
        .apply(Change::Node(Event::Apply(tainted)), now);
    let deleted = mk_pod("ns", "db-node-1")
        .on("node-1")
        .owned_by_sts("db")
        .claim("data-node-1");
    h.actor
        .state
        .apply(Change::Pod(Event::Delete(deleted)), now);
    h.leader
        .send(Some(crate::leader::Claim::for_tests()))
        .expect("leader channel");
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "nothing to repeat");
    assert_eq!(
        h.actor
            .ledger
            .get("node-1")
            .map(crate::incident::Incident::phase),
        Some(crate::api::FailoverPhase::Recovered)
    );
    // The dashboard's last failover is the leader's: node-1's, until this replica follows.
    let last = |h: &Harness| -> Vec<String> {
        let text = h.actor.metrics.encode().expect("encode");
        text.lines()
            .filter(|l| l.starts_with("podha_last_failover_seconds{"))
            .map(str::to_string)
            .collect()
    };
    let shown = last(&h);
    assert!(
        !shown.is_empty()
            && shown
                .iter()
                .all(|l| l.contains(r#"node="node-1""#) && l.contains(r#"policy="p""#)),
        "{shown:?}"
    );
    h.leader.send(None).expect("leader channel");
    h.run_for(3).await;
    assert!(last(&h).is_empty(), "a follower shows none: {:?}", last(&h));
}
