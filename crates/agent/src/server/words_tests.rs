//! The endpoints believe only words signed by a key the agent trusts, bound to their moment.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;
use crate::contract::{PublicKey, Said, Word};
use crate::peers::{Peer, SurveyTimes};

struct Agent {
    router: Router,
    hearing: SharedHearing,
    key: PublicKey,
}

fn key() -> Identity {
    Identity::generate().expect("key")
}

/// The agent of `n1`, trusting `leader`'s heartbeats and `peers`' questions.
fn agent(leader: &Identity, peers: Vec<(&str, &Identity)>) -> Agent {
    let identity = Arc::new(key());
    let peers = peers
        .into_iter()
        .enumerate()
        .map(|(i, (node, id))| Peer {
            node: node.into(),
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16)),
            key: Some(id.public()),
        })
        .collect();
    let hearing = SharedHearing::default();
    let endpoints = Endpoints {
        node: "n1".into(),
        identity: identity.clone(),
        hearing: hearing.clone(),
        leader_key: Arc::new(LeaderKey::known(leader.public())),
        peers: Arc::new(Peers::fixed(
            "n1",
            identity.clone(),
            peers,
            SurveyTimes::new(Duration::from_secs(1)),
        )),
    };
    Agent {
        router: router(endpoints),
        hearing,
        key: identity.public(),
    }
}

impl Agent {
    async fn get(&self, path_and_query: &str) -> (StatusCode, Vec<u8>) {
        let request = Request::get(path_and_query)
            .body(Body::empty())
            .expect("request");
        let response = self.router.clone().oneshot(request).await.expect("answer");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, body.to_vec())
    }

    /// A heartbeat, and the agent's answer if it gave one (checked to be signed by the agent
    /// over the heartbeat's nonce).
    async fn heartbeat(&self, query: &HeartbeatQuery) -> Option<HeartbeatAnswer> {
        let (status, body) = self.get(&query.path_and_query()).await;
        if status == StatusCode::UNAUTHORIZED {
            assert!(body.is_empty(), "a refusal says nothing");
            return None;
        }
        assert_eq!(status, StatusCode::OK);
        let answer: HeartbeatAnswer = serde_json::from_slice(&body).expect("json");
        assert!(
            self.key
                .verifies(&answer.word(&query.nonce), &answer.signature),
            "the answer is signed by the agent over the probe's nonce"
        );
        Some(answer)
    }

    fn heard_ago(&self) -> Option<Duration> {
        lock(&self.hearing).heard_ago(Instant::now())
    }
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn only_a_heartbeat_signed_by_the_leader_over_the_agents_challenge_tells_it_is_heard() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    // The leader's first probe: no challenge yet. Answered, with one; nothing learnt.
    let first = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), "");
    let answer = agent.heartbeat(&first).await.expect("answered");
    assert!(!answer.heard);
    assert_eq!(agent.heard_ago(), None, "a probe without the challenge");
    // The next probe signs the challenge: heard (counted from the challenge's issue).
    tokio::time::advance(s(1)).await;
    let second = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &answer.challenge);
    let next = agent.heartbeat(&second).await.expect("answered");
    assert!(next.heard);
    assert_eq!(agent.heard_ago(), Some(s(1)));
    assert_ne!(
        next.challenge, answer.challenge,
        "a challenge is taken once"
    );
    // Replayed later: the challenge is taken, so it tells nothing (and the challenge, 20 s
    // old, is renewed for the next leader-signed probe).
    tokio::time::advance(s(20)).await;
    let replayed = agent.heartbeat(&second).await.expect("answered");
    assert!(replayed.heard, "heard 21 s ago, still in this boot");
    assert_eq!(agent.heard_ago(), Some(s(21)), "the replay moved nothing");
    assert_ne!(
        replayed.challenge, next.challenge,
        "an old challenge renewed"
    );
    // A probe held back on its way counts from the issue of the challenge it signs, not from
    // when it arrives, 20 s after that.
    let held = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &replayed.challenge);
    tokio::time::advance(s(20)).await;
    agent.heartbeat(&held).await.expect("answered");
    assert_eq!(agent.heard_ago(), Some(s(20)));
    // A young challenge is not renewed by a stale probe (replays cannot evict it).
    let young = agent.heartbeat(&second).await.expect("answered").challenge;
    tokio::time::advance(s(1)).await;
    let again = agent.heartbeat(&second).await.expect("answered").challenge;
    assert_eq!(young, again);
}

#[tokio::test(start_paused = true)]
async fn a_process_hammering_the_agent_with_forged_heartbeats_does_not_keep_it_heard() {
    let (leader, forger) = (key(), key());
    let agent = agent(&leader, vec![]);
    let first = agent
        .heartbeat(&HeartbeatQuery::signed(&leader, "n1", None, ""))
        .await
        .expect("answered");
    let heard = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &first.challenge);
    let challenge = agent.heartbeat(&heard).await.expect("answered").challenge;
    assert_eq!(agent.heard_ago(), Some(Duration::ZERO));
    // Cut off from podha: only a local process speaks to the agent, knowing its challenge.
    let refused_before = counters::refused_count(HEARTBEAT_PATH);
    let leaders_for_n2 = HeartbeatQuery::signed(&leader, "n2", Some(Duration::ZERO), &challenge);
    let mut unsigned = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &challenge);
    unsigned.signature.clear();
    let mut altered = HeartbeatQuery::signed(&leader, "n1", Some(s(5)), &challenge);
    altered.heard_ms = Some(0);
    let forgeries = [
        "/heartbeat?heardMs=0".to_string(),
        "/heartbeat?heardMs=soon".to_string(),
        "/heartbeat".to_string(),
        HeartbeatQuery::signed(&forger, "n1", Some(Duration::ZERO), &challenge).path_and_query(),
        leaders_for_n2.path_and_query(),
        unsigned.path_and_query(),
        altered.path_and_query(),
    ];
    for _ in 0..30 {
        tokio::time::advance(s(1)).await;
        for forged in &forgeries {
            let (status, body) = agent.get(forged).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{forged}");
            assert!(body.is_empty());
        }
    }
    assert_eq!(
        agent.heard_ago(),
        Some(s(30)),
        "unheard for 30 s all the same"
    );
    assert_eq!(
        counters::refused_count(HEARTBEAT_PATH) - refused_before,
        30 * forgeries.len() as u64,
        "each refusal counted"
    );
}

#[tokio::test]
async fn a_peer_is_answered_only_when_it_signs_with_its_own_key() {
    let (leader, n2, n3, stranger) = (key(), key(), key(), key());
    let agent = agent(&leader, vec![("n2", &n2), ("n3", &n3)]);
    let asked = PeerQuery::signed(&n2, "n2", "n1");
    let (status, body) = agent.get(&asked.path_and_query()).await;
    assert_eq!(status, StatusCode::OK);
    let answer: PeerAnswer = serde_json::from_slice(&body).expect("json");
    assert_eq!(answer.node, "n1");
    assert!(
        agent
            .key
            .verifies(&answer.word(&asked.nonce), &answer.signature)
    );
    let mut unsigned = PeerQuery::signed(&n2, "n2", "n1");
    unsigned.signature.clear();
    for (why, forged) in [
        ("unsigned", "/peer".to_string()),
        ("no signature", unsigned.path_and_query()),
        (
            "n3's key for n2",
            PeerQuery::signed(&n3, "n2", "n1").path_and_query(),
        ),
        (
            "a stranger",
            PeerQuery::signed(&stranger, "n9", "n1").path_and_query(),
        ),
        (
            "asked of n3",
            PeerQuery::signed(&n2, "n2", "n3").path_and_query(),
        ),
    ] {
        let (status, body) = agent.get(&forged).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}");
        assert!(body.is_empty(), "{why}");
    }
    // The word a peer signs for one question is no answer to another.
    assert!(!agent.key.verifies(
        &Word::PeerAnswer {
            node: "n1",
            heard_ago_ms: answer.heard_ago_ms,
            nonce: "another",
        },
        &answer.signature
    ));
}

#[tokio::test]
async fn the_refusals_are_served_as_metrics() {
    let agent = agent(&key(), vec![]);
    let (status, _) = agent.get("/peer").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = agent.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).expect("text");
    assert!(
        text.contains("podha_agent_requests_refused_total{path=\"/peer\"}"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn replays_cannot_push_the_leaders_challenge_out_between_two_probes() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    let first = HeartbeatQuery::signed(&leader, "n1", None, "");
    let challenge = agent.heartbeat(&first).await.expect("answered").challenge;
    // A recorded heartbeat replayed every 3 s (each renews the newest challenge) while the
    // leader's next probe is late.
    for _ in 0..2 {
        tokio::time::advance(s(3)).await;
        agent.heartbeat(&first).await.expect("answered");
    }
    tokio::time::advance(Duration::from_millis(500)).await;
    let late = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &challenge);
    agent.heartbeat(&late).await.expect("answered");
    assert_eq!(
        agent.heard_ago(),
        Some(Duration::from_millis(6500)),
        "the leader's challenge was still out"
    );
}

/// Whoever else holds the heartbeat key can take the challenge podha's next heartbeat signs: a
/// heartbeat over a bogus challenge gets the newest, and one over that takes it without
/// `heardMs`. podha's heartbeat then tells the agent nothing, and the agent, heard before in
/// this boot, says `heard` all the same; its answer says how long ago it was last heard, so
/// podha sees that its heartbeats no longer count.
#[tokio::test(start_paused = true)]
async fn an_answer_says_how_long_ago_the_agent_was_heard_though_its_challenge_was_taken() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    let first = agent
        .heartbeat(&HeartbeatQuery::signed(&leader, "n1", None, ""))
        .await
        .expect("answered");
    assert_eq!(first.heard_ago(), Some(None), "never heard in this boot");
    tokio::time::advance(s(1)).await;
    let heard = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &first.challenge);
    let mut podhas = agent.heartbeat(&heard).await.expect("answered").challenge;
    assert_eq!(agent.heard_ago(), Some(s(1)));
    for _ in 0..30 {
        tokio::time::advance(s(1)).await;
        let bogus = HeartbeatQuery::signed(&leader, "n1", None, "bogus");
        let newest = agent.heartbeat(&bogus).await.expect("answered").challenge;
        assert_eq!(
            newest, podhas,
            "a heartbeat over no challenge out gets the newest"
        );
        let taking = HeartbeatQuery::signed(&leader, "n1", None, &newest);
        agent.heartbeat(&taking).await.expect("answered");
        // podha got its last answer a second ago, and says so over the challenge it carried.
        let real = HeartbeatQuery::signed(&leader, "n1", Some(s(1)), &podhas);
        let answer = agent.heartbeat(&real).await.expect("answered");
        assert!(answer.heard, "heard in this boot");
        assert_eq!(
            answer.heard_ago(),
            agent.heard_ago().map(Some),
            "the answer says the agent's own hearing"
        );
        assert_ne!(answer.heard_ago(), Some(Some(s(1))));
        podhas = answer.challenge;
    }
    assert_eq!(
        agent.heard_ago(),
        Some(s(31)),
        "podha's heartbeats counted for nothing"
    );
}

/// Only a heartbeat over a challenge the agent had out says whether podha holds the node: a
/// new leader's first probe, or a replay of one sent while the node was held, does not (a
/// replay must not hold a node podha no longer holds, and stop its fencing). A hold is taken
/// once the agent's Lease no longer says podha may count its silence; let go of, at once. A
/// heartbeat that says nothing of holds changes nothing. A held agent says so in every
/// answer, asked or not.
#[tokio::test(start_paused = true)]
async fn only_a_heartbeat_over_the_agents_challenge_holds_or_lets_go_of_the_node() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    let held = || lock(&agent.hearing).held();
    let hold = |heard_ago, hold, challenge: &str| {
        HeartbeatQuery::signed_as(
            &leader,
            "n1",
            heard_ago,
            Said {
                hold: Some(hold),
                ..Said::default()
            },
            challenge,
        )
    };
    let first = agent
        .heartbeat(&hold(None, true, ""))
        .await
        .expect("answered");
    assert!(!lock(&agent.hearing).holding(), "no challenge taken");
    assert_eq!(first.held, Some(false));
    let holding = hold(Some(Duration::ZERO), true, &first.challenge);
    let answer = agent.heartbeat(&holding).await.expect("answered");
    assert!(lock(&agent.hearing).holding() && !held(), "asked for");
    assert_eq!(
        (answer.heard, answer.held),
        (true, Some(true)),
        "said held while the Lease is written, though not held yet"
    );
    lock(&agent.hearing).hold_written(true);
    assert!(held());
    assert_eq!(
        lock(&agent.hearing).silence(Instant::now()),
        Silence::Held,
        "heard, and held: no silence counts"
    );
    // A heartbeat that says nothing of holds: nothing changes, and the answer says held.
    let silent_on_holds =
        HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &answer.challenge);
    let answer = agent.heartbeat(&silent_on_holds).await.expect("answered");
    assert!(held());
    assert_eq!(answer.held, Some(true), "said though not asked");
    // Let go of it: armed again at once, its silence counting from the hearing.
    let letting_go = hold(Some(Duration::ZERO), false, &answer.challenge);
    let answer = agent.heartbeat(&letting_go).await.expect("answered");
    assert!(!held());
    assert_eq!(answer.held, Some(false));
    // A replay of the holding heartbeat: its challenge is taken, nothing changes.
    tokio::time::advance(s(5)).await;
    let replayed = agent.heartbeat(&holding).await.expect("answered");
    assert!(!lock(&agent.hearing).holding(), "a replay holds nothing");
    assert_eq!(replayed.held, Some(false));
    assert_eq!(
        lock(&agent.hearing).silence(Instant::now()),
        Silence::For(s(5))
    );
    // Not held, not asked: the answer says nothing of holds (an older podha verifies it).
    let plain = HeartbeatQuery::signed(&leader, "n1", None, "");
    assert_eq!(agent.heartbeat(&plain).await.expect("answered").held, None);
}

/// Only a heartbeat over a challenge the agent had out tells it which leadership term heard
/// it: a new leader's first probe (no challenge) or a replay does not. The latest term heard
/// counts, so a held-back heartbeat of an earlier term does not make a later term look new.
#[tokio::test(start_paused = true)]
async fn only_a_heartbeat_over_the_agents_challenge_tells_the_term_that_heard_it() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    let in_term = |term, heard_ago, challenge: &str| {
        HeartbeatQuery::signed_as(
            &leader,
            "n1",
            heard_ago,
            Said {
                hold: Some(false),
                term: Some(term),
                renewals: None,
            },
            challenge,
        )
    };
    let renewed = |h: &mut Hearing| h.lease_renewed(Instant::now());
    renewed(&mut lock(&agent.hearing));
    let new_term = |leads| {
        lock(&agent.hearing)
            .renewing(Some(leads), Instant::now(), s(30))
            .map(|r| match r.why {
                RenewalsCount::NewTerm { heard_in, leads } => (heard_in, leads),
                RenewalsCount::FromRenewals => panic!("no heartbeat said it counts renewals"),
            })
    };
    let first = agent
        .heartbeat(&in_term(7, None, ""))
        .await
        .expect("answered");
    assert_eq!(new_term(8), None, "nothing heard yet");
    let taken = in_term(7, Some(Duration::ZERO), &first.challenge);
    let answer = agent.heartbeat(&taken).await.expect("answered");
    assert!(answer.heard);
    assert_eq!(new_term(7), None, "heard by the term that leads");
    assert_eq!(new_term(8), Some((7, 8)));
    // A later term's first probe: answered, no challenge taken, the term not taken either.
    agent
        .heartbeat(&in_term(9, Some(Duration::ZERO), "not-a-challenge"))
        .await
        .expect("answered");
    assert_eq!(new_term(9).map(|(heard_in, _)| heard_in), Some(7));
    // An earlier term's heartbeat over the newest challenge: taken, the latest term kept.
    let older = in_term(3, Some(Duration::ZERO), &answer.challenge);
    let answer = agent.heartbeat(&older).await.expect("answered");
    assert_eq!(new_term(8).map(|(heard_in, _)| heard_in), Some(7));
    // A heartbeat naming no term (an older podha that took the Lease): the term that heard
    // the agent is unknown, and no later term shows.
    let no_term = HeartbeatQuery::signed(&leader, "n1", Some(Duration::ZERO), &answer.challenge);
    agent.heartbeat(&no_term).await.expect("answered");
    assert_eq!(new_term(8), None);
}

/// Only a heartbeat over a challenge the agent had out tells it that its leader counts from
/// the agent's renewals; the last one counted decides.
#[tokio::test(start_paused = true)]
async fn only_a_heartbeat_over_the_agents_challenge_tells_the_leader_counts_from_renewals() {
    let leader = key();
    let agent = agent(&leader, vec![]);
    let counting = |renewals, heard_ago, challenge: &str| {
        HeartbeatQuery::signed_as(
            &leader,
            "n1",
            heard_ago,
            Said {
                hold: Some(false),
                term: Some(3),
                renewals,
            },
            challenge,
        )
    };
    lock(&agent.hearing).lease_renewed(Instant::now());
    let renewing = || {
        lock(&agent.hearing)
            .renewing(Some(3), Instant::now(), s(30))
            .map(|r| r.why)
    };
    let first = agent
        .heartbeat(&counting(Some(true), None, ""))
        .await
        .expect("answered");
    assert_eq!(renewing(), None, "no challenge taken");
    let taken = counting(Some(true), Some(Duration::ZERO), &first.challenge);
    let answer = agent.heartbeat(&taken).await.expect("answered");
    assert!(answer.heard);
    assert_eq!(renewing(), Some(RenewalsCount::FromRenewals));
    // A replay over a challenge already taken: it tells nothing.
    let replay = counting(None, Some(Duration::ZERO), &first.challenge);
    agent.heartbeat(&replay).await.expect("answered");
    assert_eq!(renewing(), Some(RenewalsCount::FromRenewals), "a replay");
    // A leader that does not say it (an older podha): taken back.
    let older = counting(None, Some(Duration::ZERO), &answer.challenge);
    agent.heartbeat(&older).await.expect("answered");
    assert_eq!(renewing(), None, "an older leader");
}
