use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::super::{ProbePlan, Round, run};
use super::*;
use crate::agent::leader_key::LeaderKey;
use crate::agent::peers::{Peers, SurveyTimes};
use crate::agent::server::{Endpoints, Hearing, SharedHearing, router};
use crate::contract::PublicKey;
use crate::health::ProbeKind;

/// A replica that leads for as long as any test runs.
fn leading() -> crate::leader::Leadership {
    let (claim, leadership) = crate::leader::channel();
    claim
        .send(Some(crate::leader::Claim::for_tests()))
        .expect("claim");
    // The sender goes; the claim stays published.
    std::mem::forget(claim);
    leadership
}

fn key() -> Identity {
    Identity::generate().expect("key")
}

/// A real agent endpoint for node `n1` on loopback, trusting `leader`'s heartbeats: what it
/// knows of being heard, its key, its address, its server task.
async fn agent_of_n1(
    leader: PublicKey,
) -> (
    SharedHearing,
    PublicKey,
    SocketAddr,
    tokio::task::JoinHandle<()>,
) {
    let hearing = SharedHearing::default();
    let identity = Arc::new(key());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = router(Endpoints {
        node: "n1".into(),
        identity: identity.clone(),
        hearing: hearing.clone(),
        leader_key: Arc::new(LeaderKey::known(leader)),
        peers: Arc::new(Peers::fixed(
            "n1",
            identity.clone(),
            Vec::new(),
            SurveyTimes::new(Duration::from_secs(1)),
        )),
    });
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, served).await;
    });
    (hearing, identity.public(), addr, server)
}

fn target(node: &str, addr: SocketAddr, key: Option<PublicKey>) -> Target {
    Target {
        node: node.into(),
        addr: Some(addr),
        timeout: Duration::from_millis(500),
        boot_id: None,
        key,
    }
}

fn heard(h: &SharedHearing) -> Option<Duration> {
    h.lock().expect("lock").heard_ago(Instant::now())
}

/// The agent prober of `leader` on `plan`: its rounds, and its task.
fn start_prober(
    leader: Identity,
    plan: watch::Receiver<ProbePlan>,
) -> (mpsc::Receiver<Round>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(run(ProbeKind::Agent, plan, tx, Arc::new(leader), leading()));
    (rx, task)
}

/// The leader's heartbeat reaches a real agent's endpoint: answered, and from the second
/// round on it tells the agent it was heard.
#[tokio::test]
async fn the_agent_heartbeat_is_answered_and_tells_the_agent_it_is_heard() {
    let leader = key();
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![
            target("n1", addr, Some(agent_key)),
            target("n2", refused, None),
            target("other", addr, Some(agent_key)),
        ],
    });
    let (mut rx, prober) = start_prober(leader, plan_rx);
    let first = rx.recv().await.expect("a round");
    assert!(
        first.heard.is_empty(),
        "the agent does not know its first answer was heard"
    );
    let mut results = first.results;
    results.sort();
    assert_eq!(
        results,
        vec![
            ("n1".to_string(), Some(TcpResult::Connected)),
            ("n2".to_string(), Some(TcpResult::Refused)),
            // Another node's agent answers at that address: the host runs, not its agent.
            ("other".to_string(), Some(TcpResult::Refused)),
        ]
    );
    let second = rx.recv().await.expect("a second round");
    assert!(
        heard(&hearing).is_some_and(|ago| ago < Duration::from_secs(1)),
        "the second probe says the first was answered"
    );
    assert_eq!(
        second.heard,
        BTreeSet::from(["n1".to_string()]),
        "the agent says it is heard"
    );
    assert!(second.unverified.is_empty());
    prober.abort();
    server.abort();
}

/// An agent whose key podha has not seen yet (rotated, or its Node not yet watched) answers
/// with words podha cannot verify: not the agent's own (no `Connected`: podha holds, its
/// silence proof cannot start), and yet an answer, so the agent is told it is heard and does
/// not fence over a credential. An agent that does not trust this leader's key answers `401`:
/// the host runs, nothing more.
#[tokio::test]
async fn a_credential_that_fails_makes_podha_deaf_and_fences_nothing() {
    let leader = key();
    let (hearing, _, addr, server) = agent_of_n1(leader.public()).await;
    let stale_key = key().public();
    let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![target("n1", addr, Some(stale_key))],
    });
    let (mut rx, prober) = start_prober(leader, plan_rx);
    for _ in 0..3 {
        let round = rx.recv().await.expect("a round");
        assert_eq!(round.results, vec![("n1".into(), Some(TcpResult::Refused))]);
        assert!(round.heard.is_empty(), "no answer of the agent's own");
        assert_eq!(round.unverified, BTreeSet::from(["n1".to_string()]));
    }
    assert!(
        heard(&hearing).is_some_and(|ago| ago < Duration::from_secs(1)),
        "the agent is told it is heard: podha holds for it meanwhile"
    );
    prober.abort();

    // A leader whose key the agent does not trust: 401, so the host runs, and the agent learns
    // nothing from it.
    *hearing.lock().expect("lock") = Hearing::default();
    let stranger = key();
    let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![target("n1", addr, None)],
    });
    let (mut rx, prober) = start_prober(stranger, plan_rx);
    for _ in 0..3 {
        let round = rx.recv().await.expect("a round");
        assert_eq!(round.results, vec![("n1".into(), Some(TcpResult::Refused))]);
        assert!(round.unverified.is_empty(), "a 401 names no node");
    }
    assert_eq!(heard(&hearing), None, "an untrusted leader tells nothing");
    prober.abort();
    server.abort();
}

/// A node that booted again has a new agent, never heard: the first probe after its new
/// boot ID reaches the plan carries no `heardMs`, not the old boot's answer (which would
/// tell the new agent it was heard as long ago as its node was down).
#[tokio::test]
async fn a_new_boot_of_the_node_is_not_told_the_last_boots_hearing() {
    let leader = key();
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let plan = |boot: &str| ProbePlan {
        interval: Duration::from_millis(500),
        targets: vec![Target {
            boot_id: Some(boot.into()),
            ..target("n1", addr, Some(agent_key))
        }],
    };
    let (plan_tx, plan_rx) = watch::channel(plan("boot-1"));
    let (mut rx, prober) = start_prober(leader, plan_rx);
    let _ = rx.recv().await.expect("a round");
    let _ = rx.recv().await.expect("a second round");
    assert!(heard(&hearing).is_some(), "heard in the first boot");
    // The node reboots: a new agent, never heard, and the Node reports the new boot.
    *hearing.lock().expect("lock") = Hearing::default();
    plan_tx.send(plan("boot-2")).expect("plan");
    let _ = rx.recv().await.expect("the new boot's first round");
    assert_eq!(
        heard(&hearing),
        None,
        "the new boot's agent was told the last boot's hearing"
    );
    let _ = rx.recv().await.expect("the new boot's second round");
    assert!(heard(&hearing).is_some(), "heard in the new boot");
    prober.abort();
    server.abort();
}

/// A replica that does not lead (lost the Lease mid-round, say) sends no heartbeat: its key is
/// the replicas' key, which the agents trust, so it must sign nothing.
#[tokio::test]
async fn a_replica_that_does_not_lead_sends_no_heartbeat() {
    let leader = key();
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![target("n1", addr, Some(agent_key))],
    });
    let (tx, mut rx) = mpsc::channel(4);
    let (_no_claim, follower) = crate::leader::channel();
    let prober = tokio::spawn(run(
        ProbeKind::Agent,
        plan_rx,
        tx,
        Arc::new(leader),
        follower,
    ));
    for _ in 0..3 {
        let round = rx.recv().await.expect("a round");
        assert_eq!(round.results, vec![("n1".into(), None)], "nothing sent");
    }
    assert_eq!(heard(&hearing), None);
    prober.abort();
    server.abort();
}
