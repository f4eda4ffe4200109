//! The probers. `KubeletTCP`: a TCP connect to each node's InternalIP and kubelet port, every
//! probe interval, with a timeout and bounded concurrency. Only the connect is tried; nothing is
//! sent, so it needs no credentials and costs the kubelet one accept. What it tells apart: an
//! accepted connect, a refusal (the host's kernel answered: the machine runs) and silence (no
//! answer within the timeout, or the host unreachable: a machine that is off or cut off).
//!
//! `AgentHeartbeat`: an HTTP GET of `/heartbeat` on each node's podha agent (InternalIP, the
//! port the agent advertises on its Node), every second, by the leader only. Each probe says
//! how long ago this process last got an answer from that agent (`heardMs`), so an agent whose
//! answers are lost learns it is not heard (see `crate::contract`); what it heard of an agent
//! is forgotten when the agent's node boots again (a new boot ID in the plan), so a new boot's
//! agent is never told its node's downtime as a silence. An answer naming the node is
//! `Connected`; a refusal or any other answer is the host up without its agent (`Refused`);
//! silence is `NoAnswer`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

pub use crate::contract::{AGENT_PROBE_INTERVAL, agent_addr};
use crate::contract::{HeartbeatAnswer, HeartbeatQuery, internal_ip};
use crate::health::{ProbeKind, TcpResult};

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
    /// The node's boot ID (`status.nodeInfo.bootID`), for the agent's heartbeat: what this
    /// process heard of an agent is forgotten when its node boots again (see [`run`]).
    pub boot_id: Option<String>,
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

type Http = HttpClient<HttpConnector, Empty<Bytes>>;

/// One agent's heartbeat: the node, what the probe found, and whether the agent said it
/// counts itself heard in this boot.
type Heartbeat = (String, Option<TcpResult>, bool);

async fn heartbeat(http: &Http, target: Target, heard_ago: Option<Duration>) -> Heartbeat {
    let Some(addr) = target.addr else {
        return (target.node, None, false);
    };
    let path = HeartbeatQuery::new(heard_ago).path_and_query();
    let Ok(uri) = format!("http://{addr}{path}").parse::<hyper::Uri>() else {
        return (target.node, None, false);
    };
    let asked = async {
        let response = http.get(uri).await?;
        let ok = response.status().is_success();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((ok, body))
    };
    let (result, heard) = match tokio::time::timeout(target.timeout, asked).await {
        Ok(Ok((true, body))) => match serde_json::from_slice::<HeartbeatAnswer>(&body) {
            Ok(answer) if answer.node == target.node => (TcpResult::Connected, answer.heard),
            // Something else answers at that address: the host runs, its agent does not.
            _ => (TcpResult::Refused, false),
        },
        Ok(Ok((false, _))) => (TcpResult::Refused, false),
        Ok(Err(e)) if refused(e.as_ref()) => (TcpResult::Refused, false),
        Ok(Err(_)) | Err(_) => (TcpResult::NoAnswer, false),
    };
    (target.node, Some(result), heard)
}

/// Whether a connect was refused somewhere down this error's chain.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// When each agent last answered this process, and in which boot of its node: what the next
/// probe tells it (`heardMs`).
#[derive(Debug, Default)]
struct Heard(BTreeMap<String, (Option<String>, Instant)>);

impl Heard {
    /// The plan's targets now: an agent no longer probed, or whose node booted again since it
    /// answered, is forgotten. A new boot's agent was never heard, and must not be told it was
    /// heard as long ago as its node was down: it would count that downtime as a silence and
    /// survey its peers at once.
    fn follow(&mut self, targets: &[Target]) {
        self.0.retain(|node, (boot, _)| {
            targets
                .iter()
                .any(|t| &t.node == node && t.boot_id == *boot)
        });
    }

    /// How long before `sent` this process last got an answer from `node`'s agent, if ever.
    fn ago(&self, node: &str, sent: Instant) -> Option<Duration> {
        self.0
            .get(node)
            .map(|(_, at)| sent.saturating_duration_since(*at))
    }

    /// The answers of a round probing `targets`, in at `now`. Any answer naming the node is
    /// one: whether the agent knew it was heard before this one or not, the next probe tells
    /// it this one was.
    fn round(&mut self, targets: &[Target], results: &[Heartbeat], now: Instant) {
        for (node, result, _) in results {
            if *result != Some(TcpResult::Connected) {
                continue;
            }
            if let Some(t) = targets.iter().find(|t| &t.node == node) {
                self.0.insert(node.clone(), (t.boot_id.clone(), now));
            }
        }
        self.follow(targets);
    }
}

/// Runs the prober of `kind` until the decision loop goes away (its plan sender or result
/// receiver dropped).
pub async fn run(
    kind: ProbeKind,
    mut plan: watch::Receiver<ProbePlan>,
    results: mpsc::Sender<Round>,
) {
    let http: Http = HttpClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build_http();
    // When each agent last answered this process: what its next probe tells it.
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
                    let mut agents_heard = BTreeSet::new();
                    let results_in: Vec<(String, Option<TcpResult>)> = match kind {
                        ProbeKind::KubeletTcp => {
                            futures::stream::iter(current.targets.clone())
                                .map(connect)
                                .buffer_unordered(CONCURRENCY)
                                .collect()
                                .await
                        }
                        ProbeKind::Agent => {
                            let asks: Vec<_> = current
                                .targets
                                .iter()
                                .map(|t| heartbeat(&http, t.clone(), heard.ago(&t.node, sent)))
                                .collect();
                            let results_in: Vec<_> = futures::stream::iter(asks)
                                .buffer_unordered(CONCURRENCY)
                                .collect()
                                .await;
                            heard.round(&current.targets, &results_in, Instant::now());
                            results_in
                                .into_iter()
                                .map(|(node, result, said_heard)| {
                                    if said_heard && result == Some(TcpResult::Connected) {
                                        agents_heard.insert(node.clone());
                                    }
                                    (node, result)
                                })
                                .collect()
                        }
                    };
                    let round = Round { kind, sent, results: results_in, heard: agents_heard };
                    if results.send(round).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::server::{Hearing, SharedHearing, router};
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
                    boot_id: None,
                },
                Target {
                    node: "closed".into(),
                    addr: Some(closed),
                    timeout,
                    boot_id: None,
                },
                Target {
                    node: "silent".into(),
                    addr: Some(silent),
                    timeout,
                    boot_id: None,
                },
                Target {
                    node: "unknown".into(),
                    addr: None,
                    timeout,
                    boot_id: None,
                },
            ],
        });
        let spawned = Instant::now();
        let prober = tokio::spawn(run(ProbeKind::KubeletTcp, plan_rx, tx));
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

    /// A real agent endpoint for node `n1` on loopback: what it knows of being heard, its
    /// address, its server task.
    async fn agent_of_n1() -> (
        SharedHearing,
        std::net::SocketAddr,
        tokio::task::JoinHandle<()>,
    ) {
        let hearing = SharedHearing::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = router("n1", hearing.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, served).await;
        });
        (hearing, addr, server)
    }

    /// The leader's heartbeat reaches a real agent's endpoint: answered, and from the second
    /// round on it tells the agent it was heard.
    #[tokio::test]
    async fn the_agent_heartbeat_is_answered_and_tells_the_agent_it_is_heard() {
        let (hearing, addr, server) = agent_of_n1().await;
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let (tx, mut rx) = mpsc::channel(4);
        let target = |node: &str, addr| Target {
            node: node.into(),
            addr: Some(addr),
            timeout: Duration::from_millis(500),
            boot_id: None,
        };
        let (_plan_tx, plan_rx) = watch::channel(ProbePlan {
            interval: Duration::from_millis(100),
            targets: vec![
                target("n1", addr),
                target("n2", refused),
                target("other", addr),
            ],
        });
        let prober = tokio::spawn(run(ProbeKind::Agent, plan_rx, tx));
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
        let heard = |h: &SharedHearing| h.lock().expect("lock").heard_ago(Instant::now());
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
        prober.abort();
        server.abort();
    }

    /// A node that booted again has a new agent, never heard: the first probe after its new
    /// boot ID reaches the plan carries no `heardMs`, not the old boot's answer (which would
    /// tell the new agent it was heard as long ago as its node was down).
    #[tokio::test]
    async fn a_new_boot_of_the_node_is_not_told_the_last_boots_hearing() {
        let (hearing, addr, server) = agent_of_n1().await;
        let plan = |boot: &str| ProbePlan {
            interval: Duration::from_millis(500),
            targets: vec![Target {
                node: "n1".into(),
                addr: Some(addr),
                timeout: Duration::from_millis(400),
                boot_id: Some(boot.into()),
            }],
        };
        let (tx, mut rx) = mpsc::channel(4);
        let (plan_tx, plan_rx) = watch::channel(plan("boot-1"));
        let prober = tokio::spawn(run(ProbeKind::Agent, plan_rx, tx));
        let heard = |h: &SharedHearing| h.lock().expect("lock").heard_ago(Instant::now());
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
}
