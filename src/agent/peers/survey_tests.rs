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
use super::super::server::{Hearing, PeerAnswer, router};
use super::{Peers, SurveyTimes};

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

/// A peer that answers as an agent does (podha's own `/peer`): podha heard it `heard_ago` ago.
async fn agent(heard_ago: Duration) -> SocketAddr {
    let listener = listener().await;
    let at = addr(&listener);
    let hearing = Hearing::resumed(Instant::now(), Some(heard_ago));
    let app = router(&format!("peer-{}", at.port()), Arc::new(hearing.into()));
    tokio::spawn(async move { axum::serve(listener, app).await });
    at
}

/// A peer that answers, `after` a while, that podha heard it `heard_ago` ago; each ask counted
/// in `gauge` from its arrival until just before its answer.
async fn slow_peer(heard_ago: Duration, after: Duration, gauge: Arc<Gauge>) -> SocketAddr {
    let listener = listener().await;
    let at = addr(&listener);
    let peer = move || {
        let entered = gauge.enter();
        async move {
            tokio::time::sleep(after).await;
            drop(entered);
            axum::Json(PeerAnswer {
                node: "slow".into(),
                heard_ago_ms: Some(heard_ago.as_millis() as u64),
            })
        }
    };
    let app = axum::Router::new().route("/peer", axum::routing::get(peer));
    tokio::spawn(async move { axum::serve(listener, app).await });
    at
}

/// A peer that takes every connection and never answers, counted in `gauge` while open.
async fn silent(gauge: Arc<Gauge>) -> SocketAddr {
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
    at
}

/// A loopback port nobody listens on (bound, then let go).
async fn unbound() -> SocketAddr {
    addr(&listener().await)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survey_of_300_peers_with_silent_ones_asked_first_decides_stay_within_an_ask() {
    // podha's leader stopped a minute ago: every peer is as unheard as this node. 1 % of them
    // (3) are silent, and asked first: in batches they cost the first batch its whole ask.
    let gauge = Arc::new(Gauge::default());
    let mut peers = Vec::new();
    for _ in 0..3 {
        peers.push(silent(gauge.clone()).await);
    }
    for _ in 0..297 {
        peers.push(agent(secs(60)).await);
    }
    let times = SurveyTimes::new(secs(5));
    let surveyor = Peers::fixed(peers, times);
    let start = Instant::now();
    let survey = surveyor.survey(TIMEOUT).await;
    let took = start.elapsed();
    assert_eq!(survey.peers, PeerCount::Known(300));
    assert!(survey.answers.len() > 150, "{}", survey.answers.len());
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey));
    assert!(matches!(verdict, Verdict::Stay(_)), "{verdict:?}");
    assert_eq!(gauge.asked(), 3, "the silent peers were asked");
    assert!(
        took < times.ask,
        "decided in {took:?}, before any silent peer's ask ran out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_heard_peer_answering_late_decides_fence_when_it_answers() {
    // This node alone is unheard: the one peer podha hears answers 300 ms late; four unheard
    // ones answer at once (too few for a majority of ten), three are silent, two are down.
    let gauge = Arc::new(Gauge::default());
    let late = Duration::from_millis(300);
    let mut peers = vec![slow_peer(secs(1), late, gauge.clone()).await];
    for _ in 0..4 {
        peers.push(agent(secs(60)).await);
    }
    for _ in 0..3 {
        peers.push(silent(gauge.clone()).await);
    }
    for _ in 0..2 {
        peers.push(unbound().await);
    }
    let times = SurveyTimes::new(secs(5));
    let surveyor = Peers::fixed(peers, times);
    let start = Instant::now();
    let survey = surveyor.survey(TIMEOUT).await;
    let took = start.elapsed();
    assert_eq!(survey.answers.len(), 5, "{survey:?}");
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey));
    let Verdict::Fence(why) = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(why.contains("hears 1 of the 5"), "{why}");
    assert!(
        took >= late && took < times.ask,
        "decided by the heard peer's answer ({took:?}), not by the silent peers' time out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_peers_than_the_bound_are_asked_at_once() {
    // 120 unheard peers, each answering after 50 ms: a majority is 61 answers, asked 32 at
    // once at most (the bound made small, so that the test opens few sockets).
    let bound = 32;
    let gauge = Arc::new(Gauge::default());
    let mut peers = Vec::new();
    for _ in 0..120 {
        peers.push(slow_peer(secs(60), Duration::from_millis(50), gauge.clone()).await);
    }
    let surveyor = Peers::fixed(peers, SurveyTimes::new(secs(5))).at_most(bound);
    let survey = surveyor.survey(TIMEOUT).await;
    assert_eq!(survey.answers.len(), 61, "stops at a majority");
    assert_eq!(
        gauge.most(),
        bound,
        "the peers saw the bound reached, never passed"
    );
    assert!(gauge.asked() <= 61 + bound, "{}", gauge.asked());
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
    let surveyor = Peers::fixed(peers, times).at_most(4);
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
    let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey));
    assert!(matches!(verdict, Verdict::Fence(_)), "{verdict:?}");
}
