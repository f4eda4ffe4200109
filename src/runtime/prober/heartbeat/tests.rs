use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::super::{ProbePlan, Round, run};
use super::*;
use crate::agent::isolation::RenewalsCount;
use crate::agent::leader_key::LeaderKey;
use crate::agent::peers::{Peers, SurveyTimes};
use crate::agent::server::{Endpoints, Hearing, SharedHearing, router};
use crate::contract::PublicKey;
use crate::health::Arming;
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
        hold: None,
        heeds_term: true,
        heeds_renewals: true,
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
    // The heartbeats named the claim's term (0 here): the agent knows that term heard it; and
    // they said podha counts from the agent's renewals.
    let (later, same) = {
        let mut h = hearing.lock().expect("lock");
        h.lease_renewed(Instant::now());
        (
            h.renewing(Some(1), Instant::now(), Duration::MAX),
            h.renewing(Some(0), Instant::now(), Duration::MAX),
        )
    };
    assert_eq!(
        later.map(|r| r.why),
        Some(RenewalsCount::NewTerm {
            heard_in: 0,
            leads: 1
        })
    );
    assert_eq!(same.map(|r| r.why), Some(RenewalsCount::FromRenewals));
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

/// What the agent at `addr` answers to `query`, sent by whoever holds the heartbeat key.
async fn ask_agent(addr: SocketAddr, query: &HeartbeatQuery) -> HeartbeatAnswer {
    let http: Http = HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let uri = format!("http://{addr}{}", query.path_and_query())
        .parse::<hyper::Uri>()
        .expect("uri");
    let response = http.get(uri).await.expect("answered");
    let body = response.into_body().collect().await.expect("body");
    serde_json::from_slice(&body.to_bytes()).expect("an answer")
}

/// Another holder of the heartbeat key (a replica that does not lead, a process that read the
/// key's Secret) drains the agent's challenges: a signed heartbeat over a bogus challenge gets
/// the newest, and one over that takes it without `heardMs`. podha's own heartbeat then signs a
/// challenge already taken and tells the agent nothing, while the agent, heard before in this
/// boot, still says it counts itself heard: podha must not count that answer as hearing it.
#[tokio::test]
async fn an_agent_whose_challenge_another_key_holder_took_is_not_heard() {
    let leader = key();
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let http: Http = HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let leadership = leading();
    let targets = [target("n1", addr, Some(agent_key))];
    // podha's leader probes n1 as its prober does, telling it what it heard of it.
    let probe_n1 = |heard: &Heard| {
        heartbeat(
            &http,
            &leader,
            &leadership,
            targets[0].clone(),
            heard.probe("n1", Instant::now()),
        )
    };
    for drained in [false, true] {
        // Heard in this boot, 30 s ago (an earlier leader's hearing).
        *hearing.lock().expect("lock") =
            Hearing::resumed(Instant::now(), Some(Duration::from_secs(30)), false);
        let mut heard_by_podha = Heard::default();
        let first = probe_n1(&heard_by_podha).await;
        assert!(
            matches!(first.answer, Answer::Own { heard: true, .. }),
            "{:?}",
            first.answer
        );
        heard_by_podha.round(&targets, &[first], Instant::now());
        if drained {
            let bogus = HeartbeatQuery::signed(&leader, "n1", None, "bogus");
            let newest = ask_agent(addr, &bogus).await.challenge;
            ask_agent(addr, &HeartbeatQuery::signed(&leader, "n1", None, &newest)).await;
        }
        let second = probe_n1(&heard_by_podha).await;
        if drained {
            assert!(
                heard(&hearing).is_some_and(|ago| ago >= Duration::from_secs(30)),
                "podha's heartbeat signed a challenge already taken: the agent counted nothing"
            );
            assert_eq!(
                second.answer.result(),
                Some(TcpResult::Refused),
                "the agent's answer counted as hearing it: {:?}",
                second.answer
            );
            assert!(matches!(second.answer, Answer::Mismatched { .. }));
            // Still an answer: the next probe signs its challenge, and, nobody taking that
            // one first, the agent is heard again.
            heard_by_podha.round(&targets, &[second], Instant::now());
            let third = probe_n1(&heard_by_podha).await;
            assert!(
                matches!(third.answer, Answer::Own { heard: true, .. }),
                "{:?}",
                third.answer
            );
            assert!(heard(&hearing).is_some_and(|ago| ago < Duration::from_secs(1)));
        } else {
            assert!(heard(&hearing).is_some_and(|ago| ago < Duration::from_secs(1)));
            assert!(
                matches!(second.answer, Answer::Own { heard: true, .. }),
                "{:?}",
                second.answer
            );
        }
    }
    server.abort();
}

fn answer(heard_ago_ms: Option<Option<u64>>) -> HeartbeatAnswer {
    HeartbeatAnswer {
        node: "n1".into(),
        heard: heard_ago_ms.flatten().is_some(),
        heard_ago_ms,
        held: None,
        challenge: "c".into(),
        signature: String::new(),
    }
}

/// What the agent says of being heard must fit what podha's probe told it; an answer that does
/// not is the agent's, yet no hearing: refused, and its node counted among the mismatched.
#[test]
fn an_answer_that_does_not_fit_the_probe_is_refused() {
    let ms = Duration::from_millis;
    let slack = HEARD_AGO_SLACK.as_millis() as u64;
    let fit = [
        // A first probe tells nothing to fit.
        (None, answer(Some(None))),
        (None, answer(Some(Some(30_000)))),
        // Heard at the challenge's issue: after podha's last answer came back, up to the ways
        // of that answer and of this probe.
        (Some(ms(1_000)), answer(Some(Some(1_000)))),
        (Some(ms(1_000)), answer(Some(Some(1_000 + slack)))),
        (Some(ms(40_000)), answer(Some(Some(40_400)))),
        // An agent from before heardAgoMs: its `heard` counts as it says.
        (Some(ms(1_000)), answer(None)),
        (
            Some(ms(1_000)),
            HeartbeatAnswer {
                heard: true,
                ..answer(None)
            },
        ),
    ];
    let misfit = [
        // Its challenge taken by someone else: unheard for 30 s though podha answered a
        // second ago.
        (Some(ms(1_000)), answer(Some(Some(30_000)))),
        (Some(ms(1_000)), answer(Some(Some(1_001 + slack)))),
        // Told it was heard, it says never.
        (Some(ms(1_000)), answer(Some(None))),
        // Heard more recently than podha heard it: someone else says so.
        (Some(ms(30_000)), answer(Some(Some(1_000)))),
        // `heard` and `heardAgoMs` disagree.
        (
            None,
            HeartbeatAnswer {
                heard: true,
                ..answer(Some(None))
            },
        ),
        (
            Some(ms(1_000)),
            HeartbeatAnswer {
                heard: false,
                ..answer(Some(Some(1_000)))
            },
        ),
    ];
    for (told, a) in &fit {
        assert!(fits(*told, a), "{told:?} {a:?}");
    }
    for (told, a) in &misfit {
        assert!(!fits(*told, a), "{told:?} {a:?}");
    }
    let mismatched = Answer::Mismatched {
        challenge: "c2".into(),
    };
    assert_eq!(mismatched.result(), Some(TcpResult::Refused), "no hearing");
    // Still an answer for `heardMs`, and the challenge the next probe signs.
    let targets = [target("n1", "127.0.0.1:1".parse().expect("addr"), None)];
    let mut podhas = Heard::default();
    let at = Instant::now();
    podhas.round(
        &targets,
        &[Heartbeat {
            node: "n1".into(),
            held: false,
            answer: mismatched,
        }],
        at,
    );
    assert_eq!(
        podhas.probe("n1", at + Duration::from_secs(1)),
        Probe {
            heard_ago: Some(Duration::from_secs(1)),
            challenge: "c2".into(),
        }
    );
}

/// The prober's round names the node whose agent answered out of step with podha's probes:
/// what the decision loop counts (`podha_agent_answers_mismatched_total`), and holds for.
#[tokio::test]
async fn a_round_names_the_agents_that_answered_out_of_step() {
    let leader = key();
    let other_holder = Identity::from_pkcs8(leader.pkcs8()).expect("the same key");
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![target("n1", addr, Some(agent_key))],
    });
    let (mut rx, prober) = start_prober(leader, plan_rx);
    let _ = rx.recv().await.expect("a round");
    let heard_round = rx.recv().await.expect("a second round");
    assert_eq!(heard_round.heard, BTreeSet::from(["n1".to_string()]));
    assert!(heard_round.mismatched.is_empty());
    // From now on someone else takes each challenge podha's next probe would sign, as soon as
    // a round is in, and the agent was last heard 30 s ago.
    let mut out_of_step = None;
    for _ in 0..20 {
        *hearing.lock().expect("lock") =
            Hearing::resumed(Instant::now(), Some(Duration::from_secs(30)), false);
        let bogus = HeartbeatQuery::signed(&other_holder, "n1", None, "bogus");
        let newest = ask_agent(addr, &bogus).await.challenge;
        ask_agent(
            addr,
            &HeartbeatQuery::signed(&other_holder, "n1", None, &newest),
        )
        .await;
        let round = rx.recv().await.expect("a round");
        if !round.mismatched.is_empty() {
            out_of_step = Some(round);
            break;
        }
    }
    let out_of_step = out_of_step.expect("a round with the agent out of step");
    assert_eq!(out_of_step.mismatched, BTreeSet::from(["n1".to_string()]));
    assert!(out_of_step.heard.is_empty(), "no hearing");
    assert_eq!(
        out_of_step.results,
        vec![("n1".into(), Some(TcpResult::Refused))]
    );
    prober.abort();
    server.abort();
}

/// podha holds a node (paused): its agent, which heeds holds, takes it as held from the probe
/// after its first counted answer, and says so; the round names it held (no silence counts),
/// though the agent is heard. Once podha no longer holds it, the agent says so and is armed.
#[tokio::test]
async fn a_held_node_s_agent_is_told_and_says_it_is_held_until_podha_lets_go() {
    let leader = key();
    let (hearing, agent_key, addr, server) = agent_of_n1(leader.public()).await;
    let plan = |hold| ProbePlan {
        interval: Duration::from_millis(100),
        targets: vec![Target {
            hold: Some(hold),
            ..target("n1", addr, Some(agent_key))
        }],
    };
    let (plan_tx, plan_rx) = watch::channel(plan(true));
    // The replicas' key: the next leader signs with it too.
    let next_leader = Identity::from_pkcs8(leader.pkcs8()).expect("key");
    let (mut rx, prober) = start_prober(leader, plan_rx);
    let held = |h: &SharedHearing| h.lock().expect("lock").held();
    let first = rx.recv().await.expect("a round");
    assert_eq!(first.arming.get("n1"), Some(&Arming::Disarmed), "held");
    assert!(
        !hearing.lock().expect("lock").holding(),
        "a probe over no challenge of the agent's tells it nothing"
    );
    let second = rx.recv().await.expect("a second round");
    assert!(
        hearing.lock().expect("lock").holding(),
        "the second probe asks to hold the node"
    );
    assert_eq!(second.heard, BTreeSet::from(["n1".to_string()]));
    assert_eq!(second.arming.get("n1"), Some(&Arming::Disarmed));
    // The agent's Lease was written without its word of being heard: held.
    hearing.lock().expect("lock").hold_written(true);
    assert!(held(&hearing));
    plan_tx.send(plan(false)).expect("plan");
    let mut armed = None;
    for _ in 0..5 {
        let round = rx.recv().await.expect("a round");
        if round.arming.get("n1") == Some(&Arming::Armed) {
            armed = Some(round);
            break;
        }
    }
    let armed = armed.expect("the agent says it is no longer held within a few rounds");
    assert!(!held(&hearing));
    assert_eq!(armed.heard, BTreeSet::from(["n1".to_string()]));
    prober.abort();
    // A new leadership term: its first probe, over no challenge, tells the agent nothing, and
    // the agent's answer, heard and not held, arms nothing yet (a probe of the last leader,
    // held back on its way, could still hold the node after it); the next one does.
    let (_plan_tx, plan_rx) = watch::channel(plan(false));
    let (mut rx, prober) = start_prober(next_leader, plan_rx);
    let first = rx.recv().await.expect("a round");
    assert_eq!(first.heard, BTreeSet::from(["n1".to_string()]));
    assert_eq!(first.arming.get("n1"), None, "nothing said: not armed");
    let second = rx.recv().await.expect("a round");
    assert_eq!(second.arming.get("n1"), Some(&Arming::Armed));
    prober.abort();
    server.abort();
}

/// What an answer says of the agent counting its silence: armed only heard, not held, over a
/// challenge; nothing said over none; disarmed when not heard, held, or silent on a hold the
/// probe asked about.
#[test]
fn only_an_answer_over_a_challenge_saying_heard_and_not_held_arms_the_silence_proof() {
    let with = |heard: bool, held: Option<bool>| HeartbeatAnswer {
        heard,
        held,
        ..answer(Some(Some(0)))
    };
    // A probe that said nothing: any answer not saying it is held (an older agent).
    assert_eq!(arming(None, true, &with(true, None)), Arming::Armed);
    assert_eq!(
        arming(None, true, &with(true, Some(true))),
        Arming::Disarmed
    );
    assert_eq!(arming(None, true, &with(false, None)), Arming::Disarmed);
    // A probe that asked: only an answer saying it is not held.
    for hold in [Some(false), Some(true)] {
        assert_eq!(arming(hold, true, &with(true, Some(false))), Arming::Armed);
        assert_eq!(
            arming(hold, true, &with(true, Some(true))),
            Arming::Disarmed
        );
        assert_eq!(
            arming(hold, true, &with(true, None)),
            Arming::Disarmed,
            "does not say"
        );
        assert_eq!(
            arming(hold, true, &with(false, Some(false))),
            Arming::Disarmed,
            "not heard"
        );
    }
    // Over no challenge (the first probe of a term): nothing said, unless it disarms.
    assert_eq!(
        arming(Some(false), false, &with(true, Some(false))),
        Arming::Unsaid
    );
    assert_eq!(
        arming(None, false, &with(true, Some(true))),
        Arming::Disarmed
    );
}

/// A probe whose node's agent did not answer the last one is not newly held: the plan, made
/// before that round came in, may hold a node whose agent died armed a moment ago. One the
/// last probe held stays held through a silence.
#[test]
fn an_agent_silent_at_its_last_probe_is_not_newly_held() {
    let targets = [Target {
        hold: Some(true),
        ..target("n1", "127.0.0.1:1".parse().expect("addr"), None)
    }];
    let mut podhas = Heard::default();
    let at = Instant::now();
    let own = |arming| Heartbeat {
        node: "n1".into(),
        held: false,
        answer: Answer::Own {
            heard: true,
            arming,
            challenge: "c".into(),
        },
    };
    podhas.round(&targets, &[own(Arming::Armed)], at);
    assert_eq!(podhas.hold(&targets[0]), Some(true));
    let silent = Heartbeat {
        node: "n1".into(),
        held: false,
        answer: Answer::Silent,
    };
    podhas.round(&targets, &[silent], at);
    assert_eq!(podhas.hold(&targets[0]), Some(false), "silent: not held");
    podhas.round(&targets, &[own(Arming::Armed)], at);
    assert_eq!(podhas.hold(&targets[0]), Some(true), "answered again");
    // Held by that probe, then silent: still held, however many probes go unanswered (a probe
    // letting go over a challenge the lost one never took would end the hold at once).
    let held = Heartbeat {
        held: true,
        ..own(Arming::Disarmed)
    };
    podhas.round(&targets, &[held], at);
    for _ in 0..3 {
        let silent_held = Heartbeat {
            node: "n1".into(),
            held: true,
            answer: Answer::Silent,
        };
        podhas.round(&targets, &[silent_held], at);
        assert_eq!(
            podhas.hold(&targets[0]),
            Some(true),
            "held through a silence"
        );
    }
    let let_go = Target {
        hold: Some(false),
        ..targets[0].clone()
    };
    assert_eq!(podhas.hold(&let_go), Some(false), "the plan lets go");
    let unheeding = Target {
        hold: None,
        ..targets[0].clone()
    };
    assert_eq!(podhas.hold(&unheeding), None);
}
