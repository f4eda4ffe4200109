//! podha's leader's heartbeat to one agent, and what it makes of the answer.
//!
//! Each probe says how long ago this process last got an answer from that agent (`heardMs`),
//! so an agent whose answers are lost learns it is not heard (see `crate::contract`); what it
//! heard of an agent is forgotten when the agent's node boots again (a new boot ID in the
//! plan), so a new boot's agent is never told its node's downtime as a silence. Each probe is
//! signed with the replicas' key (published on the leader Lease; see `crate::leader::key`) over
//! the challenge of the agent's last answer, and only while this replica leads, and each answer must be signed by the key the agent's Node publishes
//! over the probe's nonce (see `crate::contract::words`).
//!
//! - An answer naming the node and signed by its key is the agent's own (`Connected`).
//! - Silence is `NoAnswer`.
//! - Anything else is the host up without its agent (`Refused`), which proves no fence: a
//!   refusal, another node's agent at that address, a `401` (the agent does not know this
//!   leader's key yet), and an answer its node's key does not verify ([`Answer::Unverified`]:
//!   a key rotated and not yet seen, or an agent from before keys). A credential that fails
//!   therefore makes podha deaf to the node, never sure of its silence. An unverified answer
//!   still counts as an answer for `heardMs`: podha holds for that node meanwhile, so the agent
//!   must not count itself unheard and fence over it. Only a probe signed by this leader
//!   carries `heardMs` to the agent, and only a host podha's probes reach can answer one.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tracing::debug;

use super::Target;
use crate::contract::{HeartbeatAnswer, HeartbeatQuery, Identity};
use crate::health::TcpResult;
use crate::leader::Leadership;

pub(super) type Http = HttpClient<HttpConnector, Empty<Bytes>>;

/// What one heartbeat found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Nothing to probe (no address).
    Nothing,
    /// No answer in time, or the host unreachable.
    Silent,
    /// The host answered, not its agent: refused, another node's agent, an error status.
    HostOnly,
    /// An answer naming the node that its published key does not verify (or it publishes none),
    /// with the challenge it carries: signed by this leader, the next probe is the agent's to
    /// believe or not.
    Unverified { challenge: String },
    /// The agent's own answer: whether it counts itself heard, and its next challenge.
    Own { heard: bool, challenge: String },
}

impl Answer {
    pub(super) fn result(&self) -> Option<TcpResult> {
        match self {
            Self::Nothing => None,
            Self::Silent => Some(TcpResult::NoAnswer),
            Self::HostOnly | Self::Unverified { .. } => Some(TcpResult::Refused),
            Self::Own { .. } => Some(TcpResult::Connected),
        }
    }

    /// Whether it tells the agent's next probe that it was heard (see the module's rule).
    fn counts_as_heard(&self) -> bool {
        matches!(self, Self::Own { .. } | Self::Unverified { .. })
    }
}

/// One agent's heartbeat: the node and what the probe found.
#[derive(Clone, Debug)]
pub(super) struct Heartbeat {
    pub(super) node: String,
    pub(super) answer: Answer,
}

/// What the next probe of a node carries: how long ago its agent last answered, and its last
/// challenge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Probe {
    pub(super) heard_ago: Option<Duration>,
    pub(super) challenge: String,
}

/// The heartbeat of `target`, sent only while this replica leads: a replica that lost the Lease
/// signs nothing more (its key is the replicas' key, which the agents trust), even in a round
/// it began as leader.
pub(super) async fn heartbeat(
    http: &Http,
    leader: &Identity,
    leadership: &Leadership,
    target: Target,
    probe: Probe,
) -> Heartbeat {
    let answer = match target.addr {
        Some(addr) if leadership.may_write(Instant::now()) => {
            ask(http, leader, &target, addr, probe).await
        }
        _ => Answer::Nothing,
    };
    Heartbeat {
        node: target.node,
        answer,
    }
}

async fn ask(
    http: &Http,
    leader: &Identity,
    target: &Target,
    addr: std::net::SocketAddr,
    probe: Probe,
) -> Answer {
    let query = HeartbeatQuery::signed(leader, &target.node, probe.heard_ago, &probe.challenge);
    let Ok(uri) = format!("http://{addr}{}", query.path_and_query()).parse::<hyper::Uri>() else {
        return Answer::Nothing;
    };
    let asked = async {
        let response = http.get(uri).await?;
        let ok = response.status().is_success();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((ok, body))
    };
    match tokio::time::timeout(target.timeout, asked).await {
        Ok(Ok((true, body))) => match serde_json::from_slice::<HeartbeatAnswer>(&body) {
            Ok(answer) if answer.node == target.node => {
                let signed = target
                    .key
                    .is_some_and(|key| key.verifies(&answer.word(&query.nonce), &answer.signature));
                if signed {
                    Answer::Own {
                        heard: answer.heard,
                        challenge: answer.challenge,
                    }
                } else {
                    debug!(node = %target.node, "an answer the node's key does not verify");
                    Answer::Unverified {
                        challenge: answer.challenge,
                    }
                }
            }
            _ => Answer::HostOnly,
        },
        Ok(Ok((false, _))) => Answer::HostOnly,
        Ok(Err(e)) if refused(e.as_ref()) => Answer::HostOnly,
        Ok(Err(_)) | Err(_) => Answer::Silent,
    }
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

/// Per node: in which boot, and when, its agent last answered this process, and the challenge
/// of its last answer. What the next probe tells it and signs.
#[derive(Debug, Default)]
pub(super) struct Heard(BTreeMap<String, Last>);

#[derive(Debug, Default)]
struct Last {
    boot: Option<String>,
    answered: Option<Instant>,
    challenge: String,
}

impl Heard {
    /// The plan's targets now: an agent no longer probed, or whose node booted again since it
    /// answered, is forgotten. A new boot's agent was never heard, and must not be told it was
    /// heard as long ago as its node was down: it would count that downtime as a silence and
    /// survey its peers at once.
    pub(super) fn follow(&mut self, targets: &[Target]) {
        self.0.retain(|node, last| {
            targets
                .iter()
                .any(|t| &t.node == node && t.boot_id == last.boot)
        });
    }

    /// What the probe of `node` sent at `sent` carries.
    pub(super) fn probe(&self, node: &str, sent: Instant) -> Probe {
        self.0.get(node).map_or_else(Probe::default, |last| Probe {
            heard_ago: last.answered.map(|at| sent.saturating_duration_since(at)),
            challenge: last.challenge.clone(),
        })
    }

    /// The answers of a round probing `targets`, in at `now`. Any answer that counts as heard
    /// is one (see the module's rule): whether the agent knew it was heard before this one or
    /// not, the next probe tells it this one was.
    pub(super) fn round(&mut self, targets: &[Target], results: &[Heartbeat], now: Instant) {
        for hb in results {
            let Some(target) = targets.iter().find(|t| t.node == hb.node) else {
                continue;
            };
            if !hb.answer.counts_as_heard() {
                continue;
            }
            // An entry of another boot is gone already: `follow` ran on these targets.
            let last = self.0.entry(hb.node.clone()).or_insert_with(|| Last {
                boot: target.boot_id.clone(),
                ..Last::default()
            });
            last.answered = Some(now);
            if let Answer::Own { challenge, .. } | Answer::Unverified { challenge } = &hb.answer {
                last.challenge = challenge.clone();
            }
        }
        self.follow(targets);
    }
}

#[cfg(test)]
mod tests;
