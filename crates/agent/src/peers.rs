//! The peers: every other node's agent, and the survey of how long ago podha heard them.
//!
//! Peers come from a fixed list (`--peers`), or from the Node list: every other node that
//! advertises an agent (a node without one could never answer, and would count against the
//! majority). The agent keeps that list warm while it runs ([`Peers::keep_warm`], reading it
//! as [`super::peer_list`] says: in pages, a 5,000-node cluster is ten small answers, not one
//! large one), and keeps the last good list when a read fails, so a cut-off agent surveys the
//! peers it knew. A survey reads that kept list and never waits for the API server.
//! A list never read is unknown ([`PeerCount::Unknown`]), not empty: an agent cut off from
//! everything since it started cannot tell a cluster of one from its own isolation, and must
//! not take one for the other (see [`super::isolation`]).
//!
//! A survey asks up to [`IN_FLIGHT`] peers at once, a new one as soon as one answers (or gives
//! up), and stops as soon as the answers decide (half of the peers unheard, or so many heard
//! that the rest could not make half) or its deadline ([`SurveyTimes`], `--survey-timeout`)
//! passed: a silent peer holds one place for the ask's time, not the whole survey. Either way
//! a 5,000-node cluster's agent needs about 2,500 answers; 2,501 came in 0.34 s on loopback
//! with 1 % silent, every word signed and verified (`podha-bench survey`, docs/agent.md).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::debug;

use super::counters;
use super::isolation::{PeerCount, Survey};
pub use super::peer_list::Peer;
use super::peer_list::{Kept, SavedList, keep_warm, lock, spread};
use crate::contract::{Identity, PeerAnswer, PeerQuery, PublicKey};
use connect::ResetOnClose;

mod connect;
mod reach;

pub use reach::{Reach, Round, SavedReach, SharedReach, lease_value};

/// Peers asked at once, at most. Time: each silent peer (its node down or cut off) holds a
/// place for the whole ask (1 s), so the places decide how fast a survey gets past them; with
/// 256, a 5,000-node cluster's agent still gathers its 2,500 answers within the 5 s deadline
/// when a fifth of its peers are silent (about 1,000 answers a second), and in well under a
/// second when few are. Cost: one socket per ask (closed after the answer: see
/// [`Peers::with`]), so at most 256 open files, a quarter of the 1,024 a container may be
/// limited to, and a few MB of buffers against the agent's 128Mi limit; on the other side,
/// an agent answers each of its surveying peers in microseconds, whatever their number.
/// podha's leader probes the agents with the same bound.
pub const IN_FLIGHT: usize = 256;
/// How long a survey and its parts may take, from its deadline (`--survey-timeout`, 5 s by
/// default): what the survey has by then decides (few answers fence). The longest a survey
/// takes ([`SurveyTimes::limit`]) bounds the watchdog timeout from below. A short deadline
/// suits a small cluster on a fast network: a survey that runs out before the answers decide
/// fences a node podha may merely not hear while its leader changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SurveyTimes {
    /// After this, no new peer is asked.
    pub deadline: Duration,
    /// How long one peer has to answer: 1 s, or half the deadline if that is shorter.
    pub ask: Duration,
}

impl SurveyTimes {
    pub fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            ask: Duration::from_secs(1).min(deadline / 2),
        }
    }

    /// The longest a survey takes: asking until the deadline, and the asks under way then,
    /// each given up [`SurveyTimes::ask`] after it began (the peer list is the one kept warm:
    /// reading it takes no time).
    pub fn limit(&self) -> Duration {
        self.deadline + self.ask
    }
}

pub struct Peers {
    /// This agent's node, and the key its questions are signed with.
    me: String,
    identity: Arc<Identity>,
    /// A survey met an answer its peer's key as listed does not verify (the peer's key changed):
    /// read the list again soon (see [`keep_warm`]).
    behind: Notify,
    source: Source,
    times: SurveyTimes,
    /// Peers asked at once, at most: [`IN_FLIGHT`] (fewer in some tests).
    in_flight: usize,
    http: HttpClient<ResetOnClose, Empty<Bytes>>,
    /// Whether this agent reaches its peers, as its checks found (see [`reach`]).
    reach: SharedReach,
    /// Where that is kept for the next agent of this boot, if anywhere.
    saved_reach: Option<SavedReach>,
}

enum Source {
    Fixed(Kept),
    Discovered {
        client: kube::Client,
        kept: Mutex<Kept>,
        /// Where the list is saved for the next agent of this boot (see [`SavedList`]).
        saved: SavedList,
    },
}

impl Peers {
    /// `me`'s peers, always these.
    pub fn fixed(me: &str, identity: Arc<Identity>, peers: Vec<Peer>, times: SurveyTimes) -> Self {
        Self::with(me, identity, Source::Fixed(Kept::new(Some(peers))), times)
    }

    /// Peers from the Node list, unknown until [`Peers::keep_warm`] first reads it, or until
    /// then the list an earlier agent of this boot saved in `saved`.
    pub fn discovered(
        client: kube::Client,
        node: &str,
        identity: Arc<Identity>,
        times: SurveyTimes,
        saved: SavedList,
    ) -> Self {
        let source = Source::Discovered {
            client,
            kept: Mutex::new(Kept::new(saved.load())),
            saved,
        };
        Self::with(node, identity, source, times)
    }

    /// One client for every survey, keeping no connection once its answer is in (and closing
    /// it with a reset: see [`connect`]). A kept one would save a round trip on the next
    /// survey (a second later, while podha is down), but each agent would then hold one open
    /// to half the cluster, and its server one from each of the agents that survey it: at
    /// 5,000 nodes over 5,000 open files per agent, against a limit that may be 1,024, and
    /// some 95 MiB of buffers against the chart's 128Mi (`podha-bench survey` with such a
    /// pool: its 2,600 connections cost the bench process 95 MiB on both sides, and with
    /// too few open files its asks failed and the survey fenced). Asked afresh, an agent has
    /// at most [`IN_FLIGHT`] connections out, and few in (each answered at once).
    fn with(me: &str, identity: Arc<Identity>, source: Source, times: SurveyTimes) -> Self {
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(ResetOnClose::new());
        Self {
            me: me.to_string(),
            identity,
            behind: Notify::new(),
            source,
            times,
            in_flight: IN_FLIGHT,
            http,
            reach: SharedReach::default(),
            saved_reach: None,
        }
    }

    /// These peers asked `in_flight` at once at most, to see the bound hold with few sockets.
    #[cfg(test)]
    fn at_most(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight.max(1);
        self
    }

    /// Reads the peer list now and again (see [`keep_warm`]), for as long as the agent runs (a
    /// fixed list needs nothing: this waits forever). A failed read keeps the last good list.
    pub async fn keep_warm(&self) {
        let Source::Discovered {
            client,
            kept,
            saved,
        } = &self.source
        else {
            return std::future::pending().await;
        };
        let nodes: Api<Node> = Api::all(client.clone());
        keep_warm(&nodes, &self.me, kept, saved, &self.behind).await
    }

    /// Whether this agent reaches its peers, as [`Peers::keep_reach_checked`] finds it.
    pub fn reach(&self) -> SharedReach {
        self.reach.clone()
    }

    /// The key `node`'s agent signs with, if it is a peer in the list as kept: whose questions
    /// this agent answers.
    pub fn key_of(&self, node: &str) -> Option<PublicKey> {
        match &self.source {
            Source::Fixed(kept) => kept.key_of(node),
            Source::Discovered { kept, .. } => lock(kept).key_of(node),
        }
    }

    /// Asks the peers, [`IN_FLIGHT`] at once at most, in this node's order ([`Peers::kept`]),
    /// until the answers decide, every peer was asked, or the deadline passed (no peer is asked
    /// after it; the asks under way then may still answer, each within its own time)
    /// (`silence`: how long podha has not heard this node, as [`Survey::heard`] takes it).
    /// With an unknown peer list there is nobody to ask.
    pub async fn survey(&self, silence: Duration) -> Survey {
        let start = Instant::now();
        let deadline = start + self.times.deadline;
        let Some((peers, first)) = self.kept() else {
            return Survey {
                peers: PeerCount::Unknown,
                answers: Vec::new(),
            };
        };
        let mut survey = Survey {
            peers: PeerCount::Known(peers.len()),
            answers: Vec::new(),
        };
        let mut unasked = in_turn(&peers, first);
        let mut asking = FuturesUnordered::new();
        let gather = async {
            loop {
                while asking.len() < self.in_flight && Instant::now() < deadline {
                    let Some(peer) = unasked.next() else { break };
                    asking.push(self.ask(peer));
                }
                // Nothing under way: every peer was asked, or the deadline passed.
                let Some(answer) = asking.next().await else {
                    break;
                };
                if let Some(answer) = answer {
                    survey.answers.push(answer);
                    if survey.settled(silence) {
                        break;
                    }
                }
            }
        };
        // However late the asks run (a starved agent), the survey ends by its limit, which the
        // watchdog's timeout and the advertised bound count on: what it has then decides, and
        // too few answers fence.
        if tokio::time::timeout_at(start + self.times.limit(), gather)
            .await
            .is_err()
        {
            debug!("the survey reached its limit");
        }
        survey
    }

    /// What `peer` answers, if it answers in time with a word its key verifies: for the
    /// survey, an answer that is not the peer's own is none (it must neither keep this node up
    /// nor fence it).
    async fn ask(&self, peer: &Peer) -> Option<Option<Duration>> {
        match self.ask_peer(peer).await {
            Asked::Own(heard_ago) => Some(heard_ago),
            Asked::Other | Asked::Nothing => None,
        }
    }

    /// What came back from asking `peer`, within the ask's time.
    async fn ask_peer(&self, peer: &Peer) -> Asked {
        let Some(key) = peer.key else {
            return Asked::Nothing;
        };
        let question = PeerQuery::signed(&self.identity, &self.me, &peer.node);
        let Ok(uri) =
            format!("http://{}{}", peer.addr, question.path_and_query()).parse::<hyper::Uri>()
        else {
            return Asked::Nothing;
        };
        let answer = tokio::time::timeout(self.times.ask, async {
            let response = self.http.get(uri).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.into_body().collect().await;
            Ok::<_, String>((status, body.map(|b| b.to_bytes()).ok()))
        })
        .await;
        let (status, body) = match answer {
            Ok(Ok(answered)) => answered,
            Ok(Err(e)) => {
                debug!(peer = %peer.node, addr = %peer.addr, error = %e, "a peer did not answer");
                return Asked::Nothing;
            }
            Err(_) => {
                debug!(peer = %peer.node, addr = %peer.addr, "a peer did not answer in time");
                return Asked::Nothing;
            }
        };
        let word = body
            .filter(|_| status.is_success())
            .and_then(|b| serde_json::from_slice::<PeerAnswer>(&b).ok());
        match word {
            Some(answer)
                if answer.node == peer.node
                    && key.verifies(&answer.word(&question.nonce), &answer.signature) =>
            {
                Asked::Own(answer.heard_ago())
            }
            Some(_) => {
                counters::unverified_peer_answer();
                if let Source::Discovered { kept, .. } = &self.source
                    && lock(kept).found_behind(&peer.node)
                {
                    self.behind.notify_one();
                }
                debug!(peer = %peer.node, addr = %peer.addr, "an answer not signed by the peer's key: none");
                Asked::Other
            }
            None => {
                debug!(peer = %peer.node, addr = %peer.addr, %status, "a peer answered no word");
                Asked::Other
            }
        }
    }

    /// The peers as kept (`None`: the list was never read), and where this node starts asking
    /// them: an order that differs per node (so that surveys spread over the cluster).
    fn kept(&self) -> Option<(Arc<Vec<Peer>>, usize)> {
        let (peers, me) = match &self.source {
            Source::Fixed(kept) => (kept.list.clone()?, 0),
            Source::Discovered { kept, .. } => (lock(kept).list.clone()?, spread(&self.me)),
        };
        let start = if peers.is_empty() {
            0
        } else {
            me % peers.len()
        };
        Some((peers, start))
    }

    /// The peers in the order this node asks them (`None`: the list was never read).
    #[cfg(test)]
    fn list(&self) -> Option<Vec<Peer>> {
        let (peers, start) = self.kept()?;
        Some(in_turn(&peers, start).cloned().collect())
    }
}

/// What came back from asking a peer.
enum Asked {
    /// Its own word, which its key verifies: how long ago podha heard it.
    Own(Option<Duration>),
    /// An HTTP answer, but not its word: a refusal (it does not know this agent yet: its list
    /// lags), or a word its key does not verify. Its port is reached.
    Other,
    /// Nothing in time (its port blocked, its node down), or nobody to ask (no key listed).
    Nothing,
}

/// `peers` from `start` on, then those before it.
fn in_turn(peers: &[Peer], start: usize) -> impl Iterator<Item = &Peer> {
    peers[start..].iter().chain(&peers[..start])
}

#[cfg(test)]
mod survey_tests;

#[cfg(test)]
mod tests {
    use super::super::peer_list::REFRESH;
    use super::*;
    use podha_fake_api::{FakeApi, Reply};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_surveys_parts_are_bounded_by_its_deadline() {
        let ms = Duration::from_millis;
        // The default: 5 s of asking, then the asks under way given up within their 1 s; the
        // peer list is already at hand.
        let default = SurveyTimes::new(Duration::from_secs(5));
        assert_eq!(default.ask, ms(1000));
        assert_eq!(default.limit(), Duration::from_secs(6));
        // A short deadline shortens the asks too, so the watchdog may be short.
        let short = SurveyTimes::new(ms(1000));
        assert_eq!(short.ask, ms(500));
        assert_eq!(short.limit(), ms(1500));
    }

    fn addr(last: u8) -> Peer {
        Peer {
            node: format!("n{last}"),
            addr: std::net::SocketAddr::from(([10, 0, 0, last], 9441)),
            key: None,
        }
    }

    fn me() -> Arc<Identity> {
        Arc::new(Identity::generate().expect("key"))
    }

    fn node_json(name: &str, ip: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","annotations":{{"podha.io/agent-port":"9441"}}}},
                 "status":{{"addresses":[{{"type":"InternalIP","address":"{ip}"}}]}}}}"#
        )
    }

    /// How the fake API server answers a list of the Nodes (by its number, from 1).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Answer {
        /// Two pages: `n1` and `n2`, then `n3` and `n4`, a node without an agent.
        Pages,
        /// An error (the API server down).
        Fail,
        /// Never.
        Hang,
    }

    /// A fake API server that answers the `n`th Node list (counting first pages) as
    /// `answer(n)` says.
    fn fake_api(answer: fn(usize) -> Answer) -> FakeApi {
        let lists = Arc::new(AtomicUsize::new(0));
        let never = Arc::new(tokio::sync::Notify::new());
        FakeApi::new().on(http::Method::GET, "/api/v1/nodes", move |req| {
            let first_page = req.param("continue").is_none();
            let n = if first_page {
                lists.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                lists.load(Ordering::SeqCst)
            };
            match answer(n) {
                Answer::Hang => Reply::status(500, "InternalError").after(never.clone()),
                Answer::Fail => Reply::status(500, "InternalError"),
                Answer::Pages => Reply::json(
                    200,
                    serde_json::from_str(&node_page(first_page)).expect("a page"),
                ),
            }
        })
    }

    /// A page of the Node list: the first (`n1`, `n2`, and a token for the next) or the second.
    fn node_page(first: bool) -> String {
        let (items, next) = if first {
            (
                [node_json("n1", "10.0.0.1"), node_json("n2", "10.0.0.2")],
                r#","continue":"page-2""#,
            )
        } else {
            let bare = r#"{"metadata":{"name":"n4"}}"#.to_string();
            ([node_json("n3", "10.0.0.3"), bare], "")
        };
        format!(
            r#"{{"apiVersion":"v1","kind":"NodeList","metadata":{{"resourceVersion":"5"{next}}},"items":[{}]}}"#,
            items.join(",")
        )
    }

    /// When `api` was asked each Node list (first pages).
    fn lists_at(api: &FakeApi) -> Vec<Instant> {
        api.requests()
            .iter()
            .filter(|r| r.param("continue").is_none())
            .map(|r| r.at)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_peer_list_is_kept_warm_in_pages_and_kept_when_the_api_server_fails() {
        let api = fake_api(|n| if n == 1 { Answer::Pages } else { Answer::Fail });
        let client = api.client();
        let times = SurveyTimes::new(Duration::from_secs(5));
        let dir = std::env::temp_dir().join(format!("podha-peers-warm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let saved = SavedList::new(dir.join("heard.peers"), Some("b1"));
        let peers = Peers::discovered(client, "n1", me(), times, saved);
        assert_eq!(peers.list(), None, "not read yet: unknown");
        let survey = peers.survey(Duration::from_secs(30)).await;
        assert_eq!(survey.peers, PeerCount::Unknown);
        // The first read at once, the next ones every 30 s or so: they fail, the list stays.
        let warm = tokio::time::timeout(REFRESH * 3 - Duration::from_secs(1), peers.keep_warm());
        assert!(
            warm.await.is_err(),
            "keeps the list warm for as long as it runs"
        );
        assert!(lists_at(&api).len() >= 3, "{:?}", api.lines());
        let mut found = peers.list().expect("read");
        found.sort_by(|a, b| a.node.cmp(&b.node));
        assert_eq!(
            found,
            vec![addr(2), addr(3)],
            "every other node with an agent"
        );
        let queries: Vec<String> = api.requests().into_iter().map(|r| r.query).collect();
        assert!(queries[0].contains("limit=500"), "{queries:?}");
        assert!(
            queries[1].contains("limit=500") && queries[1].contains("continue=page-2"),
            "{queries:?}"
        );
        // The next agent of this boot (a crash, the API server down): the saved list.
        let down = fake_api(|_| Answer::Fail).client();
        let saved = SavedList::new(dir.join("heard.peers"), Some("b1"));
        let next = Peers::discovered(down, "n1", me(), times, saved);
        let mut resumed = next.list().expect("the saved list");
        resumed.sort_by(|a, b| a.node.cmp(&b.node));
        assert_eq!(resumed, found);
        // A garbled file is no list.
        std::fs::write(
            dir.join("heard.peers"),
            "boot=b1\n10.0.0.2:9441\nnonsense\n",
        )
        .expect("write");
        let garbled = SavedList::new(dir.join("heard.peers"), Some("b1"));
        let down = fake_api(|_| Answer::Fail).client();
        assert_eq!(
            Peers::discovered(down, "n1", me(), times, garbled).list(),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Agent `node`'s discovered peers, read from `client`, saved nowhere that lasts.
    fn discovered(client: kube::Client, node: &str) -> Peers {
        let path = std::env::temp_dir().join(format!(
            "podha-peers-{node}-{}-{:?}.peers",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&path);
        let saved = SavedList::new(path, Some("b1"));
        Peers::discovered(
            client,
            node,
            me(),
            SurveyTimes::new(Duration::from_secs(5)),
            saved,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_list_is_read_again_within_seconds_not_at_the_next_refresh() {
        // A cold start: the API server down for the first three reads, then up.
        let api = fake_api(|n| if n <= 3 { Answer::Fail } else { Answer::Pages });
        let peers = discovered(api.client(), "n1");
        let start = Instant::now();
        let warm = tokio::time::timeout(Duration::from_secs(10), peers.keep_warm());
        assert!(warm.await.is_err());
        let reads = lists_at(&api);
        assert_eq!(
            reads.len(),
            4,
            "read again every 2 s or so while unknown: {reads:?}"
        );
        for pair in reads.windows(2) {
            let wait = pair[1] - pair[0];
            assert!(wait >= Duration::from_millis(1500) && wait <= Duration::from_millis(2500));
        }
        assert!(
            peers.list().is_some(),
            "known {:?} after the start",
            reads[3] - start
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_of_an_unknown_list_that_hangs_is_given_up_within_seconds() {
        let api = fake_api(|n| if n == 1 { Answer::Hang } else { Answer::Pages });
        let peers = discovered(api.client(), "n1");
        let warm = tokio::time::timeout(Duration::from_secs(10), peers.keep_warm());
        assert!(warm.await.is_err());
        assert_eq!(lists_at(&api).len(), 2, "given up after 5 s, read again");
        assert!(peers.list().is_some(), "known within 10 s");
    }

    #[tokio::test(start_paused = true)]
    async fn agents_started_together_refresh_their_lists_at_times_of_their_own() {
        let (a, b) = (fake_api(|_| Answer::Pages), fake_api(|_| Answer::Pages));
        let pa = discovered(a.client(), "node-a");
        let pb = discovered(b.client(), "node-b");
        let both = async { tokio::join!(pa.keep_warm(), pb.keep_warm()) };
        assert!(
            tokio::time::timeout(Duration::from_secs(200), both)
                .await
                .is_err()
        );
        let (a, b) = (lists_at(&a), lists_at(&b));
        let waits = |reads: &[Instant]| -> Vec<Duration> {
            reads.windows(2).map(|w| w[1] - w[0]).collect()
        };
        let (wa, wb) = (waits(&a), waits(&b));
        let bounds = Duration::from_secs(25)..=Duration::from_secs(35);
        assert!(
            wa.iter().chain(&wb).all(|w| bounds.contains(w)),
            "{wa:?} {wb:?}"
        );
        assert_ne!(wa[0], wb[0], "not in step: {wa:?} {wb:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_a_survey_found_behind_is_read_again_within_seconds() {
        let api = fake_api(|_| Answer::Pages);
        let peers = discovered(api.client(), "n1");
        let found_behind = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            peers.behind.notify_one();
            std::future::pending::<()>().await
        };
        let both = async { tokio::join!(peers.keep_warm(), found_behind) };
        assert!(
            tokio::time::timeout(Duration::from_secs(12), both)
                .await
                .is_err()
        );
        let reads = lists_at(&api);
        assert_eq!(reads.len(), 2, "at once, then again soon: {reads:?}");
        let wait = reads[1] - reads[0];
        assert!(
            wait >= Duration::from_secs(5) && wait < Duration::from_secs(6),
            "{wait:?}, not the 30 s refresh"
        );
    }

    #[tokio::test]
    async fn a_fixed_list_is_known() {
        let peers = Peers::fixed(
            "n1",
            me(),
            Vec::new(),
            SurveyTimes::new(Duration::from_secs(1)),
        );
        let survey = peers.survey(Duration::from_secs(30)).await;
        assert_eq!(survey.peers, PeerCount::Known(0));
    }
}
