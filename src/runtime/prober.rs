//! The probers. `KubeletTCP`: a TCP connect to each node's InternalIP and kubelet port, every
//! probe interval, with a timeout and bounded concurrency. Only the connect is tried; nothing is
//! sent, so it needs no credentials and costs the kubelet one accept. What it tells apart: an
//! accepted connect, a refusal (the host's kernel answered: the machine runs) and silence (no
//! answer within the timeout, or the host unreachable: a machine that is off or cut off).
//!
//! `AgentHeartbeat`: an HTTP GET of `/heartbeat` on each node's podha agent (InternalIP, the
//! port the agent advertises on its Node), every second, by the leader only, signed with the
//! key the leader publishes (see [`heartbeat`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

pub use crate::contract::{AGENT_PROBE_INTERVAL, agent_addr, agent_key};
use crate::contract::{Identity, PublicKey, internal_ip};
use crate::health::{Arming, ProbeKind, TcpResult};
use crate::leader::Leadership;
use heartbeat::{Answer, Heard, Http, heartbeat};

mod heartbeat;

/// Probes in flight at once.
const CONCURRENCY: usize = 256;

/// One node to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    /// `None` when the node publishes no InternalIP or port: nothing is probed and the signal
    /// has no evidence.
    pub addr: Option<SocketAddr>,
    pub timeout: Duration,
    /// For the agent's heartbeat: whether podha holds the node (`judge::holds`), `None` for an
    /// agent that does not heed it (see [`crate::contract::AGENT_HEEDS_HOLD_ANNOTATION`]).
    pub hold: Option<bool>,
    /// For the agent's heartbeat: whether the agent heeds the leadership term (see
    /// [`crate::contract::AGENT_HEEDS_TERM_ANNOTATION`]); only then does the heartbeat name it.
    pub heeds_term: bool,
    /// For the agent's heartbeat: whether the agent heeds `renewals` (see
    /// [`crate::contract::AGENT_HEEDS_RENEWALS_ANNOTATION`]); only then does the heartbeat say
    /// podha counts its silence from its renewals (as podha does for every agent).
    pub heeds_renewals: bool,
    /// The node's boot ID (`status.nodeInfo.bootID`), for the agent's heartbeat: what this
    /// process heard of an agent is forgotten when its node boots again (see [`run`]).
    pub boot_id: Option<String>,
    /// The key the node's agent publishes: only answers it verifies are the agent's.
    pub key: Option<PublicKey>,
}

/// What to probe and how often; published by the decision loop when it changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbePlan {
    pub interval: Duration,
    pub targets: Vec<Target>,
}

/// The kubelet endpoint of a node, from its status.
pub fn kubelet_addr(node: &Node) -> Option<SocketAddr> {
    let ip = internal_ip(node)?;
    let port = node
        .status
        .as_ref()?
        .daemon_endpoints
        .as_ref()?
        .kubelet_endpoint
        .as_ref()?
        .port;
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .map(|p| SocketAddr::new(ip, p))
}

/// The decision loop's ends of the probers' plans.
pub struct PlanSenders {
    pub kubelet: watch::Sender<ProbePlan>,
    pub agent: watch::Sender<ProbePlan>,
}

/// One probe round: which prober, when its probes were sent, and per node what the probe found
/// (`None`: nothing to probe).
#[derive(Debug)]
pub struct Round {
    pub kind: ProbeKind,
    pub sent: Instant,
    pub results: Vec<(String, Option<TcpResult>)>,
    /// The nodes whose agent answered this round saying it counts itself heard in this boot:
    /// only their answers count for the `Agent` proof (see `NodeObservations::observe_agent`).
    pub heard: BTreeSet<String>,
    /// What each node's probe and answer say of its agent counting its silence (see
    /// `health::Arming`); a node not named said nothing either way.
    pub arming: BTreeMap<String, Arming>,
    /// The nodes where something answered that the key their Node publishes does not verify
    /// (see [`heartbeat`]).
    pub unverified: BTreeSet<String>,
    /// The nodes whose agent answered counting podha's heartbeats as heard at another time
    /// than podha told it (see [`heartbeat`]).
    pub mismatched: BTreeSet<String>,
}

async fn connect(target: Target) -> (String, Option<TcpResult>) {
    let Some(addr) = target.addr else {
        return (target.node, None);
    };
    let result =
        match tokio::time::timeout(target.timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => TcpResult::Connected,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => TcpResult::Refused,
            // Unreachable host or network, or no answer in time: nothing at that address answers.
            Ok(Err(_)) | Err(_) => TcpResult::NoAnswer,
        };
    (target.node, Some(result))
}

/// Runs the prober of `kind` until the decision loop goes away (its plan sender or result
/// receiver dropped).
pub async fn run(
    kind: ProbeKind,
    mut plan: watch::Receiver<ProbePlan>,
    results: mpsc::Sender<Round>,
    leader: Arc<Identity>,
    leadership: Leadership,
) {
    let http: Http = HttpClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build_http();
    // When each agent last answered this process, and its last challenge: what its next probe
    // tells it, and signs.
    let mut heard = Heard::default();
    loop {
        let current = plan.borrow_and_update().clone();
        heard.follow(&current.targets);
        if current.targets.is_empty() || current.interval.is_zero() {
            if plan.changed().await.is_err() {
                return;
            }
            continue;
        }
        let mut ticker = tokio::time::interval_at(Instant::now(), current.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = plan.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
                _ = ticker.tick() => {
                    let sent = Instant::now();
                    let round = match kind {
                        ProbeKind::KubeletTcp => Round {
                            results: futures::stream::iter(current.targets.clone())
                                .map(connect)
                                .buffer_unordered(CONCURRENCY)
                                .collect()
                                .await,
                            ..Round::empty(kind, sent)
                        },
                        ProbeKind::Agent => {
                            let asks: Vec<_> = current
                                .targets
                                .iter()
                                .map(|t| {
                                    let target = Target { hold: heard.hold(t), ..t.clone() };
                                    heartbeat(&http, &leader, &leadership, target, heard.probe(&t.node, sent))
                                })
                                .collect();
                            let results_in: Vec<_> = futures::stream::iter(asks)
                                .buffer_unordered(CONCURRENCY)
                                .collect()
                                .await;
                            heard.round(&current.targets, &results_in, Instant::now());
                            Round::of_heartbeats(sent, results_in)
                        }
                    };
                    if results.send(round).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

impl Round {
    fn empty(kind: ProbeKind, sent: Instant) -> Self {
        Self {
            kind,
            sent,
            results: Vec::new(),
            heard: BTreeSet::new(),
            arming: BTreeMap::new(),
            unverified: BTreeSet::new(),
            mismatched: BTreeSet::new(),
        }
    }

    /// The round of the agents' heartbeats sent at `sent`.
    fn of_heartbeats(sent: Instant, heartbeats: Vec<heartbeat::Heartbeat>) -> Self {
        let mut round = Self::empty(ProbeKind::Agent, sent);
        for hb in heartbeats {
            let arming = hb.arming();
            if arming != Arming::Unsaid {
                round.arming.insert(hb.node.clone(), arming);
            }
            match hb.answer {
                Answer::Own { heard: true, .. } => {
                    round.heard.insert(hb.node.clone());
                }
                Answer::Unverified { .. } => {
                    round.unverified.insert(hb.node.clone());
                }
                Answer::Mismatched { .. } => {
                    round.mismatched.insert(hb.node.clone());
                }
                _ => {}
            }
            round.results.push((hb.node, hb.answer.result()));
        }
        round
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_builders::mk_node;
    use k8s_openapi::api::core::v1::{DaemonEndpoint, NodeAddress, NodeDaemonEndpoints};

    fn with_endpoint(ip: &str, port: i32) -> Node {
        let mut node = mk_node("n1");
        let status = node.status.get_or_insert_with(Default::default);
        status.addresses = Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: ip.into(),
        }]);
        status.daemon_endpoints = Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port }),
        });
        node
    }

    #[test]
    fn the_kubelet_address_comes_from_the_node_status() {
        assert_eq!(
            kubelet_addr(&with_endpoint("127.0.0.3", 10250)),
            "127.0.0.3:10250".parse().ok()
        );
        assert_eq!(kubelet_addr(&with_endpoint("127.0.0.3", 0)), None);
        assert_eq!(kubelet_addr(&with_endpoint("not-an-ip", 10250)), None);
        assert_eq!(kubelet_addr(&mk_node("bare")), None);
    }

    /// A listener whose accept queue is full drops further SYNs unanswered, as a machine that
    /// is off (or whose packets are dropped) does: a loopback stand-in for silence.
    async fn silent_addr() -> (
        tokio::net::TcpListener,
        Vec<tokio::net::TcpStream>,
        SocketAddr,
    ) {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let listener = socket.listen(0).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let mut held = Vec::new();
        // Fill the queue (a backlog of 0 still admits one), never accepting.
        for _ in 0..2 {
            if let Ok(Ok(s)) = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                held.push(s);
            }
        }
        (listener, held, addr)
    }

    #[tokio::test]
    async fn accepted_refused_and_unanswered_connects_are_told_apart() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = listener.local_addr().expect("addr");
        let (_silent_listener, _held, silent) = silent_addr().await;
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let timeout = Duration::from_millis(500);
        let (tx, mut rx) = mpsc::channel(4);
        let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
            interval: Duration::from_millis(50),
            targets: vec![
                Target {
                    node: "open".into(),
                    addr: Some(open),
                    timeout,
                    hold: None,
                    heeds_term: false,
                    heeds_renewals: false,
                    boot_id: None,
                    key: None,
                },
                Target {
                    node: "closed".into(),
                    addr: Some(closed),
                    timeout,
                    hold: None,
                    heeds_term: false,
                    heeds_renewals: false,
                    boot_id: None,
                    key: None,
                },
                Target {
                    node: "silent".into(),
                    addr: Some(silent),
                    timeout,
                    hold: None,
                    heeds_term: false,
                    heeds_renewals: false,
                    boot_id: None,
                    key: None,
                },
                Target {
                    node: "unknown".into(),
                    addr: None,
                    timeout,
                    hold: None,
                    heeds_term: false,
                    heeds_renewals: false,
                    boot_id: None,
                    key: None,
                },
            ],
        });
        let spawned = Instant::now();
        let leader = Arc::new(Identity::generate().expect("key"));
        let (_claim, follower) = crate::leader::channel();
        let prober = tokio::spawn(run(ProbeKind::KubeletTcp, plan_rx, tx, leader, follower));
        let round = rx.recv().await.expect("a round");
        assert!(
            spawned <= round.sent && round.sent <= Instant::now(),
            "the round says when its probes were sent"
        );
        let mut results = round.results;
        results.sort();
        assert_eq!(
            results,
            vec![
                ("closed".to_string(), Some(TcpResult::Refused)),
                ("open".to_string(), Some(TcpResult::Connected)),
                ("silent".to_string(), Some(TcpResult::NoAnswer)),
                ("unknown".to_string(), None),
            ]
        );
        prober.abort();
    }
}
