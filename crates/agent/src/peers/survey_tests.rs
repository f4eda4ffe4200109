//! Surveys of peers on loopback ports: real HTTP servers, some silent (they take the connection
//! and never answer), some ports nobody listens on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::super::isolation::{PeerCount, Silence, Verdict, decide};
use super::super::leader_key::LeaderKey;
use super::super::server::{Endpoints, Hearing, router};
use super::{Peer, Peers, SurveyTimes};
use crate::contract::{Identity, PeerAnswer, PeerQuery};

const TIMEOUT: Duration = Duration::from_secs(30);

/// What the fake peers of one kind were asked: how many asks in all, how many they are
/// handling now, and the most at any moment.
#[derive(Debug, Default)]
struct Gauge {
    asked: AtomicUsize,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Gauge {
    fn enter(self: &Arc<Self>) -> Entered {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Entered(self.clone())
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// An ask a fake peer is handling; it ends when this is dropped (answered, or given up).
struct Entered(Arc<Gauge>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

fn addr(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("local address")
}

fn key() -> Arc<Identity> {
    Arc::new(Identity::generate().expect("key"))
}

/// The surveying agent (node `me`), and what its peers know of it: its key.
struct Surveyor {
    identity: Arc<Identity>,
    /// The peer list of the fake peers: the surveyor alone.
    known_by_peers: Arc<Peers>,
}

impl Surveyor {
    fn new() -> Self {
        let identity = key();
        let me = Peer {
            node: "me".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 9)),
            key: Some(identity.public()),
        };
        let known_by_peers = Arc::new(Peers::fixed(
            "peer",
            identity.clone(),
            vec![me],
            SurveyTimes::new(secs(1)),
        ));
        Self {
            identity,
            known_by_peers,
        }
    }

    /// The surveyor's peers.
    fn peers(&self, peers: Vec<Peer>, times: SurveyTimes) -> Peers {
        Peers::fixed("me", self.identity.clone(), peers, times)
    }

    /// A peer that answers as an agent does (podha's own `/peer`): podha heard it `heard_ago`
    /// ago.
    async fn agent(&self, heard_ago: Duration) -> Peer {
        let listener = listener().await;
        let at = addr(&listener);
        let node = format!("peer-{}", at.port());
        let identity = key();
        let app = router(Endpoints {
            node: node.as_str().into(),
            identity: identity.clone(),
            hearing: Arc::new(Hearing::resumed(Instant::now(), Some(heard_ago), false).into()),
            leader_key: Arc::new(LeaderKey::default()),
            peers: self.known_by_peers.clone(),
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Peer {
            node,
            addr: at,
            key: Some(identity.public()),
        }
    }
}

/// A peer that answers, `after` a while, that podha heard it `heard_ago` ago, signing with
/// `signer` (its own key, or another); each ask counted in `gauge` from its arrival until just
/// before its answer.
async fn answering_peer(
    heard_ago: Duration,
    after: Duration,
    gauge: Arc<Gauge>,
    signer: Arc<Identity>,
) -> Peer {
    let listener = listener().await;
    let at = addr(&listener);
    let node = format!("peer-{}", at.port());
    let name = node.clone();
    let key = signer.public();
    let peer = move |axum::extract::Query(q): axum::extract::Query<PeerQuery>| {
        let entered = gauge.enter();
        let (node, signer) = (name.clone(), signer.clone());
        async move {
            tokio::time::sleep(after).await;
            drop(entered);
            axum::Json(PeerAnswer::signed(
                &signer,
                &node,
                Some(heard_ago),
                &q.nonce,
            ))
        }
    };
    let app = axum::Router::new().route("/peer", axum::routing::get(peer));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Peer {
        node,
        addr: at,
        key: Some(key),
    }
}

/// A peer that answers, `after` a while, that podha heard it `heard_ago` ago.
async fn slow_peer(heard_ago: Duration, after: Duration, gauge: Arc<Gauge>) -> Peer {
    answering_peer(heard_ago, after, gauge, key()).await
}

/// A peer that takes every connection and never answers, counted in `gauge` while open.
async fn silent(gauge: Arc<Gauge>) -> Peer {
    let listener = listener().await;
    let at = addr(&listener);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let entered = gauge.enter();
            tokio::spawn(async move {
                let mut sink = [0_u8; 1024];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                drop(entered);
            });
        }
    });
    Peer {
        node: format!("peer-{}", at.port()),
        addr: at,
        key: Some(key().public()),
    }
}

/// A loopback port nobody listens on (bound, then let go).
async fn unbound() -> Peer {
    let at = addr(&listener().await);
    Peer {
        node: format!("peer-{}", at.port()),
        addr: at,
        key: Some(key().public()),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survey_of_300_peers_with_silent_ones_asked_first_decides_stay_within_an_ask() {
    // podha's leader stopped a minute ago: every peer is as unheard as this node. 1 % of them
    // (3) are silent, and asked first: in batches they cost the first batch its whole ask.
    let gauge = Arc::new(Gauge::default());
    let me = Surveyor::new();
    let mut peers = Vec::new();
    for _ in 0..3 {
        peers.push(silent(gauge.clone()).await);
    }
    for _ in 0..297 {
        peers.push(me.agent(secs(60)).await);
    }
    let times = SurveyTimes::new(secs(5));
    let surveyor = me.peers(peers, times);
    let start = Instant::now();
    let survey = surveyor.survey(TIMEOUT).await;
    let took = start.elapsed();
    assert_eq!(survey.peers, PeerCount::Known(300));
    assert_eq!(
        survey.answers.len(),
        150,
        "stops once half of the 301 agents, this one included, are unheard"
    );
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey), None);
    assert!(matches!(verdict, Verdict::Stay(_)), "{verdict:?}");
    assert_eq!(gauge.asked(), 3, "the silent peers were asked");
    assert!(
        took < times.ask,
        "decided in {took:?}, before any silent peer's ask ran out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heard_peers_answering_late_decide_fence_once_the_rest_could_not_make_half() {
    // This node alone is unheard with one peer: the eight peers podha hears answer 300 ms
    // late, the unheard one at once, three are silent, two are down. Once the eight answered,
    // at most seven of the fifteen agents can be unheard (this one, the unheard peer and the
    // five that do not answer): fewer than half, whatever the silent ones would say.
    let gauge = Arc::new(Gauge::default());
    let late = Duration::from_millis(300);
    let me = Surveyor::new();
    let mut peers = Vec::new();
    for _ in 0..8 {
        peers.push(slow_peer(secs(1), late, gauge.clone()).await);
    }
    peers.push(me.agent(secs(60)).await);
    for _ in 0..3 {
        peers.push(silent(gauge.clone()).await);
    }
    for _ in 0..2 {
        peers.push(unbound().await);
    }
    let times = SurveyTimes::new(secs(5));
    let surveyor = me.peers(peers, times);
    let start = Instant::now();
    let survey = surveyor.survey(TIMEOUT).await;
    let took = start.elapsed();
    assert_eq!(survey.answers.len(), 9, "{survey:?}");
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey), None);
    let Verdict::Fence(why) = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(why.contains("it hears 8 and not 1"), "{why}");
    assert!(
        took >= late && took < times.ask,
        "decided by the heard peers' answers ({took:?}), not by the silent peers' time out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_peers_than_the_bound_are_asked_at_once() {
    // 120 unheard peers, each answering after 50 ms: half of the 121 agents is this one and
    // 60 answers, asked 32 at once at most (the bound made small, so that the test opens few
    // sockets).
    let bound = 32;
    let gauge = Arc::new(Gauge::default());
    let mut peers = Vec::new();
    for _ in 0..120 {
        peers.push(slow_peer(secs(60), Duration::from_millis(50), gauge.clone()).await);
    }
    let surveyor = Surveyor::new()
        .peers(peers, SurveyTimes::new(secs(5)))
        .at_most(bound);
    let survey = surveyor.survey(TIMEOUT).await;
    assert_eq!(survey.answers.len(), 60, "stops at half");
    assert_eq!(
        gauge.most(),
        bound,
        "the peers saw the bound reached, never passed"
    );
    assert!(gauge.asked() <= 60 + bound, "{}", gauge.asked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_peer_is_asked_after_the_deadline_and_the_survey_ends_by_its_limit() {
    // Every peer silent, four asked at once: a 1 s deadline with 0.5 s asks asks two rounds.
    let gauge = Arc::new(Gauge::default());
    let mut peers = Vec::new();
    for _ in 0..20 {
        peers.push(silent(gauge.clone()).await);
    }
    let times = SurveyTimes::new(secs(1));
    let surveyor = Surveyor::new().peers(peers, times).at_most(4);
    let start = Instant::now();
    let survey = surveyor.survey(TIMEOUT).await;
    let took = start.elapsed();
    assert!(survey.answers.is_empty());
    assert_eq!(
        gauge.asked(),
        8,
        "two rounds of four, none after the deadline"
    );
    assert!(
        took >= times.deadline && took <= times.limit() + Duration::from_millis(300),
        "{took:?}"
    );
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey), None);
    assert!(matches!(verdict, Verdict::Fence(_)), "{verdict:?}");
}

/// During a leader outage (every peer as unheard as this node), answers saying "podha heard
/// me a second ago" from anyone but the peer itself (a key that is not the one its Node
/// publishes, or a peer that publishes none) are no answers: they do not make the surveying
/// agent fence, and the peers' own answers decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_heard_answer_does_not_make_an_agent_fence() {
    let gauge = Arc::new(Gauge::default());
    let me = Surveyor::new();
    let impostor = key();
    let mut peers = Vec::new();
    for _ in 0..3 {
        peers.push(answering_peer(secs(1), Duration::ZERO, gauge.clone(), impostor.clone()).await);
    }
    // The impostor's key is not theirs: each peer publishes a key of its own.
    for peer in &mut peers {
        peer.key = Some(key().public());
    }
    let keyless_gauge = Arc::new(Gauge::default());
    let mut keyless =
        answering_peer(secs(1), Duration::ZERO, keyless_gauge.clone(), impostor).await;
    keyless.key = None;
    peers.push(keyless);
    for _ in 0..6 {
        peers.push(me.agent(secs(60)).await);
    }
    // One ask at a time, in the list's order: the spoofers' answers come, and are refused,
    // before the peers' own (asked all at once, the peers' own may decide the survey before a
    // spoofer's ask even arrives).
    let surveyor = me.peers(peers, SurveyTimes::new(secs(5))).at_most(1);
    let survey = surveyor.survey(TIMEOUT).await;
    assert_eq!(survey.peers, PeerCount::Known(10));
    assert_eq!(
        survey.answers.len(),
        5,
        "only the peers' own answers count, up to half of the eleven agents with this one"
    );
    assert!(
        survey
            .answers
            .iter()
            .all(|a| a.is_some_and(|ago| ago >= secs(60) && ago < secs(61))),
        "{survey:?}"
    );
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey), None);
    assert!(matches!(verdict, Verdict::Stay(_)), "{verdict:?}");
    // The peer without a key is not asked; the spoofed answers were asked for, and given:
    // they were there to be believed.
    assert_eq!(
        keyless_gauge.asked(),
        0,
        "the peer without a key is not asked"
    );
    assert_eq!(gauge.asked(), 3, "every spoofer asked");
}

/// A peer asked by an agent it does not know (its list lags a reboot's new key) answers 401:
/// no answer, as a peer down.
#[tokio::test]
async fn a_peer_that_does_not_know_the_asker_gives_no_answer() {
    let stranger = Surveyor::new();
    let peer = Surveyor::new().agent(secs(60)).await;
    let survey = stranger
        .peers(vec![peer], SurveyTimes::new(secs(1)))
        .survey(TIMEOUT)
        .await;
    assert!(survey.answers.is_empty(), "{survey:?}");
}

/// The reach check asks real agents and counts every peer whose port answers, its own word or
/// not (a peer signing with another key, or one whose list does not name this agent yet and
/// refuses it, is reached: the check is of the port); silent peers and ports nobody listens
/// on are not. Peers are asked in turn, eight a round, so that every one is asked as often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reach_check_asks_the_peers_in_turn_and_counts_their_own_answers() {
    use super::reach::{PEERS_PER_ROUND, Reach, Round};
    let surveyor = Surveyor::new();
    let gauge = Arc::new(Gauge::default());
    let mut list = Vec::new();
    for _ in 0..3 {
        list.push(surveyor.agent(secs(1)).await);
    }
    list.push(silent(gauge.clone()).await);
    list.push(unbound().await);
    let mut forged = answering_peer(secs(1), Duration::ZERO, gauge.clone(), key()).await;
    forged.key = Some(key().public());
    list.push(forged);
    for _ in 0..4 {
        list.push(surveyor.agent(secs(1)).await);
    }
    let peers = surveyor.peers(list, SurveyTimes::new(secs(2)));
    let (mut turn, mut asked, mut answered) = (0, 0, 0);
    for _ in 0..10 {
        let round = peers.check_reach(&mut turn).await.expect("a fixed list");
        assert_eq!(round.asked, PEERS_PER_ROUND, "eight of ten a round");
        asked += round.asked;
        answered += round.answered;
    }
    assert_eq!(asked, 80, "each peer eight times in ten rounds");
    assert_eq!(
        answered, 64,
        "the seven agents and the wrong-key peer, eight times each"
    );
    // A peer that does not know this agent yet (its list lags) refuses it: reached all the same.
    let stranger = Surveyor::new().agent(secs(1)).await;
    let round = surveyor
        .peers(vec![stranger], SurveyTimes::new(secs(2)))
        .check_reach(&mut 0)
        .await
        .expect("a fixed list");
    assert_eq!(
        round,
        Round {
            asked: 1,
            answered: 1
        }
    );
    // Only the three that fail answering: reachable.
    let mut reach = Reach::default();
    reach.take(Round {
        asked: 8,
        answered: 6,
    });
    assert_eq!(reach.unreachable(), None);
    // A blocked mesh: every peer silent or gone.
    let blocked = surveyor.peers(
        vec![
            silent(gauge.clone()).await,
            unbound().await,
            unbound().await,
        ],
        SurveyTimes::new(secs(2)),
    );
    let mut turn = 0;
    for _ in 0..2 {
        let round = blocked.check_reach(&mut turn).await.expect("a fixed list");
        assert_eq!(
            round,
            Round {
                asked: 3,
                answered: 0
            }
        );
        reach.take(round);
    }
    assert_eq!(
        reach.unreachable(),
        Some(Round {
            asked: 3,
            answered: 0
        })
    );
}
