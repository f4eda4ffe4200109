//! The peers: every other node's agent, and the survey of how long ago podha heard them.
//!
//! Peers come from a fixed list, or from the Node list (every other node that advertises an
//! agent: a node without one could never answer, and would count against the majority), read
//! from the API server at most every [`REFRESH`] and kept when it is unreachable: a cut-off
//! agent surveys the peers it knew. A survey asks in batches of [`BATCH`] and stops as soon as
//! the answers decide (one heard peer, or a majority unheard) or its deadline
//! ([`SurveyTimes`], `--survey-timeout`) passed, so a node that is merely unheard for a moment
//! asks a few peers, not the whole cluster.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::join_all;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::isolation::Survey;
use super::server::PeerAnswer;
use crate::contract::agent_addr;

/// Peers asked at once.
const BATCH: usize = 16;
/// How long a survey and its parts may take, from its deadline (`--survey-timeout`, 5 s by
/// default): what the survey has by then decides (few answers fence). The longest a survey
/// takes ([`SurveyTimes::limit`]) bounds the watchdog timeout from below and, without a
/// watchdog, is part of what the agent advertises for podha's `Agent` proof
/// (`isolation::fenced_within`). A short deadline suits a small cluster on a fast network: a
/// survey that runs out before the answers decide fences a node podha may merely not hear
/// while its leader changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SurveyTimes {
    /// After this, no new batch of peers is asked.
    pub deadline: Duration,
    /// How long one peer has to answer: 1 s, or half the deadline if that is shorter.
    pub ask: Duration,
    /// How long the API server has to list the nodes: 2 s, or the deadline if shorter.
    pub list: Duration,
}

impl SurveyTimes {
    pub fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            ask: Duration::from_secs(1).min(deadline / 2),
            list: Duration::from_secs(2).min(deadline),
        }
    }

    /// The longest a survey takes: listing the peers, asking until the deadline, and the
    /// batch under way then.
    pub fn limit(&self) -> Duration {
        self.list + self.deadline + self.ask
    }
}

/// How often the peer list is read again from the API server.
const REFRESH: Duration = Duration::from_secs(30);

pub struct Peers {
    source: Source,
    times: SurveyTimes,
    http: HttpClient<HttpConnector, Empty<Bytes>>,
}

enum Source {
    Fixed(Vec<SocketAddr>),
    Discovered {
        client: kube::Client,
        node: String,
        known: Mutex<(Vec<SocketAddr>, Option<Instant>)>,
    },
}

impl Peers {
    pub fn fixed(peers: Vec<SocketAddr>, times: SurveyTimes) -> Self {
        Self::with(Source::Fixed(peers), times)
    }

    pub fn discovered(client: kube::Client, node: &str, times: SurveyTimes) -> Self {
        let source = Source::Discovered {
            client,
            node: node.to_string(),
            known: Mutex::new((Vec::new(), None)),
        };
        Self::with(source, times)
    }

    fn with(source: Source, times: SurveyTimes) -> Self {
        let http = HttpClient::builder(TokioExecutor::new()).build_http();
        Self {
            source,
            times,
            http,
        }
    }

    /// Asks the peers, a batch at a time, until the answers decide or every peer was asked
    /// (`silence`: how long podha has not heard this node, as [`Survey::heard`] takes it).
    pub async fn survey(&self, silence: Duration) -> Survey {
        let started = Instant::now();
        let peers = self.list().await;
        let mut survey = Survey {
            peers: peers.len(),
            answers: Vec::new(),
        };
        for batch in peers.chunks(BATCH) {
            let answers = join_all(batch.iter().map(|addr| self.ask(*addr))).await;
            survey.answers.extend(answers.into_iter().flatten());
            if survey.settled(silence) || started.elapsed() >= self.times.deadline {
                break;
            }
        }
        survey
    }

    async fn ask(&self, addr: SocketAddr) -> Option<Option<Duration>> {
        let uri: hyper::Uri = format!("http://{addr}/peer").parse().ok()?;
        let answer = tokio::time::timeout(self.times.ask, async {
            let response = self.http.get(uri).await.map_err(|e| e.to_string())?;
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            serde_json::from_slice::<PeerAnswer>(&body).map_err(|e| e.to_string())
        })
        .await;
        match answer {
            Ok(Ok(answer)) => Some(answer.heard_ago_ms.map(Duration::from_millis)),
            Ok(Err(e)) => {
                debug!(%addr, error = %e, "a peer did not answer");
                None
            }
            Err(_) => {
                debug!(%addr, "a peer did not answer in time");
                None
            }
        }
    }

    /// The peers, in an order that differs per node (so that surveys spread over the cluster).
    async fn list(&self) -> Vec<SocketAddr> {
        let (mut peers, me) = match &self.source {
            Source::Fixed(peers) => (peers.clone(), 0),
            Source::Discovered {
                client,
                node,
                known,
            } => {
                let stale = lock(known).1.is_none_or(|at| at.elapsed() >= REFRESH);
                if stale {
                    match tokio::time::timeout(self.times.list, list_nodes(client, node)).await {
                        Ok(Ok(found)) => *lock(known) = (found, Some(Instant::now())),
                        Ok(Err(e)) => {
                            warn!(error = %e, "cannot list the peers; using the last list")
                        }
                        Err(_) => warn!("listing the peers timed out; using the last list"),
                    }
                }
                (lock(known).0.clone(), spread(node))
            }
        };
        if !peers.is_empty() {
            let shift = me % peers.len();
            peers.rotate_left(shift);
        }
        peers
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A number derived from the node's name (FNV-1a), to start each node's survey elsewhere.
fn spread(node: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as usize
}

async fn list_nodes(client: &kube::Client, me: &str) -> Result<Vec<SocketAddr>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|n| n.metadata.name.as_deref() != Some(me))
        .filter_map(agent_addr)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_surveys_parts_are_bounded_by_its_deadline() {
        let ms = Duration::from_millis;
        // The default: a 2 s list, 5 s of batches, the last one's 1 s.
        let default = SurveyTimes::new(Duration::from_secs(5));
        assert_eq!((default.list, default.ask), (ms(2000), ms(1000)));
        assert_eq!(default.limit(), Duration::from_secs(8));
        // A short deadline shortens the list and the asks too, so the watchdog may be short.
        let short = SurveyTimes::new(ms(1000));
        assert_eq!((short.list, short.ask), (ms(1000), ms(500)));
        assert_eq!(short.limit(), ms(2500));
    }
}
