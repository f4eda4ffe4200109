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
//! - The agent's own answer whose `heardAgoMs` does not fit the probe's `heardMs`
//!   ([`Answer::Mismatched`]) is refused too: the agent does not count podha's heartbeats as
//!   podha does. Someone else who holds the heartbeat key took the challenges podha's probes
//!   sign (a heartbeat over a bogus challenge gets the newest, one over that takes it without
//!   `heardMs`), so the agent's isolation timeout runs while it still says `heard`; or
//!   someone else tells it it was heard later than podha heard it. podha holds for that
//!   node (no proof from its silence) and counts the answer
//!   (`podha_agent_answers_mismatched_total`). It is still an answer for `heardMs`, and its
//!   challenge is the one the next probe signs: an agent that restarted, or whose last
//!   answer was lost, is in step again one probe later.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;
use tracing::debug;

use super::Target;
use crate::contract::{AGENT_PROBE_INTERVAL, HeartbeatAnswer, HeartbeatQuery, Identity, Said};
use crate::health::{Arming, TcpResult};
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
    /// The agent's own answer: whether it counts itself heard, what it says of counting its
    /// silence ([`arming`]), and its next challenge.
    Own {
        heard: bool,
        arming: Arming,
        challenge: String,
    },
    /// The agent's own answer, saying it last counted podha's heartbeats as heard at another
    /// time than the probe told it ([`fits`]), with its next challenge.
    Mismatched { challenge: String },
}

impl Answer {
    pub(super) fn result(&self) -> Option<TcpResult> {
        match self {
            Self::Nothing => None,
            Self::Silent => Some(TcpResult::NoAnswer),
            Self::HostOnly | Self::Unverified { .. } | Self::Mismatched { .. } => {
                Some(TcpResult::Refused)
            }
            Self::Own { .. } => Some(TcpResult::Connected),
        }
    }

    /// The challenge the agent's next probe signs, from an answer that tells that probe the
    /// agent was heard (see the module's rule); `None` from any other.
    fn challenge(&self) -> Option<&str> {
        match self {
            Self::Own { challenge, .. }
            | Self::Unverified { challenge }
            | Self::Mismatched { challenge } => Some(challenge),
            Self::Nothing | Self::Silent | Self::HostOnly => None,
        }
    }
}

/// How far the agent's `heardAgoMs` may lie from the `heardMs` of the probe it answers. The
/// agent counts the hearing from the issue of the challenge the probe signs, which was before
/// podha got the answer carrying it by that answer's way back, and reports it after this
/// probe's way there: each within the probe's timeout, at most one interval. Past that, the
/// agent heard podha at another time than podha says.
const HEARD_AGO_SLACK: Duration = AGENT_PROBE_INTERVAL.saturating_mul(2);

/// Whether what the agent says of being heard fits the probe that told it `told` (its
/// `heardMs`): the agent says `heard` exactly when it says since when, and, told when podha
/// last got its answer, it counts that hearing within [`HEARD_AGO_SLACK`] of it. A probe
/// without `heardMs` (the first of this leader, or of the node's boot) tells nothing to fit.
/// An agent from before `heardAgoMs` says nothing to check: its `heard` counts as it says,
/// so that podha hears the agents a rollout has not reached yet (see docs/agent.md).
fn fits(told: Option<Duration>, answer: &HeartbeatAnswer) -> bool {
    let Some(own) = answer.heard_ago() else {
        return true;
    };
    if own.is_some() != answer.heard {
        return false;
    }
    match (told, own) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(told), Some(own)) => own.abs_diff(told) <= HEARD_AGO_SLACK,
    }
}

/// What the agent's own answer to a probe that said `hold` (see
/// [`crate::contract::AGENT_HEEDS_HOLD_ANNOTATION`]), over a challenge or not, says of its
/// counting its silence:
/// - disarmed when it says it is not heard in this boot, or held (a held agent always says
///   so), or does not say whether it is held when the probe asked;
/// - nothing said when the probe carried no challenge (the first of a leadership term or a
///   boot): the agent took nothing from it, and a probe of the last leader held back on its
///   way could still hold the node after this answer; once a probe of this term took a
///   challenge, every older one is gone;
/// - armed otherwise: heard, not held.
fn arming(hold: Option<bool>, over_challenge: bool, answer: &HeartbeatAnswer) -> Arming {
    let held = match hold {
        None => answer.held == Some(true),
        Some(_) => answer.held != Some(false),
    };
    if !answer.heard || held {
        Arming::Disarmed
    } else if over_challenge {
        Arming::Armed
    } else {
        Arming::Unsaid
    }
}

/// One agent's heartbeat: the node, whether the probe held it, and what the probe found.
#[derive(Clone, Debug)]
pub(super) struct Heartbeat {
    pub(super) node: String,
    /// The probe said podha holds the node: whatever the answer, the agent may take it as
    /// held from now on, and counts no silence.
    pub(super) held: bool,
    pub(super) answer: Answer,
}

impl Heartbeat {
    /// What this heartbeat says of the agent counting its silence: disarmed by a probe that
    /// held the node (its answer lost or not) and by an answer from something else than the
    /// agent at its port (no silence after it counts); the agent's own answer as [`arming`]
    /// read it; nothing either way without an answer.
    pub(super) fn arming(&self) -> Arming {
        match self.answer {
            _ if self.held => Arming::Disarmed,
            Answer::Own { arming, .. } => arming,
            Answer::HostOnly | Answer::Unverified { .. } | Answer::Mismatched { .. } => {
                Arming::Disarmed
            }
            Answer::Nothing | Answer::Silent => Arming::Unsaid,
        }
    }
}

/// What the next probe of a node carries: how long ago its agent last answered, and its last
/// challenge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Probe {
    pub(super) heard_ago: Option<Duration>,
    pub(super) challenge: String,
}

/// The heartbeat of `target`, sent only while this replica leads, naming its term to an agent
/// that heeds it: a replica that lost the Lease signs nothing more (its key is the replicas'
/// key, which the agents trust), even in a round it began as leader.
pub(super) async fn heartbeat(
    http: &Http,
    leader: &Identity,
    leadership: &Leadership,
    target: Target,
    probe: Probe,
) -> Heartbeat {
    let (held, answer) = match (target.addr, leadership.term(Instant::now())) {
        (Some(addr), Some(term)) => (
            target.hold == Some(true),
            ask(http, leader, &target, addr, probe, term).await,
        ),
        _ => (false, Answer::Nothing),
    };
    Heartbeat {
        node: target.node,
        held,
        answer,
    }
}

async fn ask(
    http: &Http,
    leader: &Identity,
    target: &Target,
    addr: std::net::SocketAddr,
    probe: Probe,
    term: u64,
) -> Answer {
    let said = Said {
        hold: target.hold,
        term: target.heeds_term.then_some(term),
        renewals: target.heeds_renewals.then_some(true),
    };
    let query = HeartbeatQuery::signed_as(
        leader,
        &target.node,
        probe.heard_ago,
        said,
        &probe.challenge,
    );
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
                if !signed {
                    debug!(node = %target.node, "an answer the node's key does not verify");
                    Answer::Unverified {
                        challenge: answer.challenge,
                    }
                } else if fits(query.heard_ago(), &answer) {
                    Answer::Own {
                        heard: answer.heard,
                        arming: arming(query.hold, !query.challenge.is_empty(), &answer),
                        challenge: answer.challenge,
                    }
                } else {
                    debug!(
                        node = %target.node,
                        told_ms = query.heard_ms,
                        own_ms = ?answer.heard_ago_ms,
                        "the agent counts podha's heartbeats otherwise than podha does"
                    );
                    Answer::Mismatched {
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
    /// Its last probe got no answer.
    silent: bool,
    /// Its last probe held the node.
    held: bool,
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

    /// Whether podha holds `target`'s node in the probe now: as the plan says, but never newly
    /// for an agent whose last probe got no answer (it may have died a moment ago, armed:
    /// a hold sent now could reach it with its answer lost and stop its fence, and would leave
    /// its failover unprovable; the plan, made before that round came in, does not know). An
    /// agent the last probe held stays held through a silence: podha counts no silence of it
    /// already, and a probe letting go of it, signed over a challenge the lost probe never
    /// took, would make it count its silence again at once (and fence in the outage the hold
    /// was for).
    pub(super) fn hold(&self, target: &Target) -> Option<bool> {
        let newly_held_while_silent = self
            .0
            .get(&target.node)
            .is_some_and(|last| last.silent && !last.held);
        target.hold.map(|hold| hold && !newly_held_while_silent)
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
            let Some(challenge) = hb.answer.challenge() else {
                if hb.answer == Answer::Silent
                    && let Some(last) = self.0.get_mut(&hb.node)
                {
                    last.silent = true;
                    last.held = hb.held;
                }
                continue;
            };
            // An entry of another boot is gone already: `follow` ran on these targets.
            let last = self.0.entry(hb.node.clone()).or_insert_with(|| Last {
                boot: target.boot_id.clone(),
                ..Last::default()
            });
            last.answered = Some(now);
            last.challenge = challenge.to_string();
            last.silent = false;
            last.held = hb.held;
        }
        self.follow(targets);
    }
}

#[cfg(test)]
mod tests;
