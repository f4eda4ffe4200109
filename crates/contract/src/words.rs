//! The words podha's leader and the agents exchange over HTTP, and the keys that sign them.
//!
//! Every word is signed with Ed25519 by the one who says it, and counts only if the key that
//! verifies it is the one published for its speaker on an object only that speaker may write:
//! - an agent's key on its own Node ([`AGENT_KEY_ANNOTATION`]), which the chart's admission
//!   policy lets only the agent of that node write (its token is bound to a pod on the node);
//! - podha's leader's key on the leader Lease ([`LEADER_KEY_ANNOTATION`]), which only podha may
//!   write.
//!
//! No secret is shared: each agent keeps its private key on its node (one per boot), each podha
//! replica in its memory (one per process). Each word is bound to its moment by a value the
//! listener chose (a nonce the asker sends and the answer signs, or a challenge the agent
//! issued and podha's next heartbeat signs), so a word recorded once counts nowhere else: not
//! later, not at another node, not as another kind of word (each signs its kind first).
//!
//! - [`HeartbeatQuery`] (`GET` [`HEARTBEAT_PATH`]): podha's leader to an agent, signing the
//!   node, `heardMs`, its nonce and the agent's last challenge. The agent counts the hearing
//!   only from a heartbeat signed by the published leader key over a challenge it issued and
//!   has not taken yet; anything else unsigned or badly signed gets `401` and nothing else.
//!   A heartbeat may also sign `hold` (a word of another kind): whether podha holds the node,
//!   counting no silence of its agent, which then fences nothing on isolation.
//! - [`HeartbeatAnswer`]: the agent's answer, signing its node, whether it counts itself
//!   heard and how long ago it last counted a heartbeat of podha's as heard (`heardAgoMs`),
//!   podha's nonce and its next challenge, and, to a heartbeat that signed `hold`, whether
//!   the agent takes its node as held (`held`). A heartbeat over a challenge someone else took
//!   tells the agent nothing, and its answer says so: podha counts an answer whose
//!   `heardAgoMs` does not fit the heartbeat it sent as no hearing.
//! - [`PeerQuery`] (`GET` [`PEER_PATH`]): an agent surveying another, signing both nodes and
//!   its nonce; the asked agent answers only an asker whose key its peer list holds.
//! - [`PeerAnswer`]: how long ago podha heard the asked agent, signing its node and the nonce.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// Node annotation the agent writes with its advert: its public key ([`PublicKey::encode`]).
/// podha verifies the agent's answers, and the peers its words, with it.
pub const AGENT_KEY_ANNOTATION: &str = "podha.io/agent-key";
/// Annotation of podha's leader Lease: the public key the holder signs its heartbeats with.
/// Agents trust heartbeats signed by this key alone.
pub const LEADER_KEY_ANNOTATION: &str = "podha.io/leader-key";

/// Where podha's leader probes an agent.
pub const HEARTBEAT_PATH: &str = "/heartbeat";
/// Where an agent asks a peer.
pub const PEER_PATH: &str = "/peer";

/// A private key: an agent's or a podha replica's.
pub struct Identity {
    pair: Ed25519KeyPair,
    pkcs8: Vec<u8>,
}

/// Why a key could not be made or read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeyError(String);

impl Identity {
    /// A new key from the system's random source.
    pub fn generate() -> Result<Self, KeyError> {
        let document = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| KeyError("the system's random source failed".into()))?;
        Self::from_pkcs8(document.as_ref())
    }

    /// A key kept as [`Identity::pkcs8`] wrote it.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, KeyError> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8)
            .map_err(|e| KeyError(format!("not an Ed25519 key in PKCS#8: {e}")))?;
        Ok(Self {
            pair,
            pkcs8: pkcs8.to_vec(),
        })
    }

    /// The private key, to keep (PKCS#8 v2).
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    pub fn public(&self) -> PublicKey {
        let mut key = [0; 32];
        key.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(key)
    }

    /// The signature of `word`, as its field carries it.
    pub fn sign(&self, word: &Word<'_>) -> String {
        URL_SAFE_NO_PAD.encode(self.pair.sign(&word.bytes()).as_ref())
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Identity").field(&self.public()).finish()
    }
}

/// A public key, as an annotation publishes it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The key an annotation carries; `None` for anything that is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(text.trim()).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    /// The annotation's value: the 32 bytes in unpadded base64url.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0)
    }

    /// Whether `signature` (as its field carries it) is this key's signature of `word`.
    pub fn verifies(&self, word: &Word<'_>, signature: &str) -> bool {
        let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
            return false;
        };
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(&word.bytes(), &signature)
            .is_ok()
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.encode())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

/// A fresh value (16 bytes, unpadded base64url): a nonce or a challenge. What they need is
/// never to repeat (a word recorded for one must count for no other): random bytes, or, should
/// the system's random source fail, this process's ID, a count of values made and the time,
/// which do not repeat either.
pub fn fresh_nonce() -> String {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0; 16];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        bytes[..4].copy_from_slice(&std::process::id().to_le_bytes());
        bytes[4..12].copy_from_slice(&made.to_le_bytes());
        bytes[12..].copy_from_slice(&nanos.to_le_bytes());
    }
    URL_SAFE_NO_PAD.encode(bytes)
}

/// What a signature covers: the kind of word first, then its fields, as one JSON array (no
/// field can run into the next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word<'a> {
    Heartbeat {
        node: &'a str,
        heard_ms: Option<u64>,
        /// `None` in the word of a podha from before `hold`, which signed without it.
        hold: Option<bool>,
        /// The sender's leadership term; `None` in the word of a podha from before terms, or
        /// to an agent that does not say it heeds them.
        term: Option<u64>,
        /// Whether the sender counts the agent's silence from its last renewal of its Lease
        /// seen; `None` in the word of a podha from before renewals counted, or to an agent
        /// that does not say it heeds them.
        renewals: Option<bool>,
        nonce: &'a str,
        challenge: &'a str,
    },
    HeartbeatAnswer {
        node: &'a str,
        heard: bool,
        /// `None` in the word of an agent from before `heardAgoMs`, which signed without it;
        /// `Some(None)`: never heard in this boot.
        heard_ago_ms: Option<Option<u64>>,
        /// `None` in an answer to a heartbeat without `hold`.
        held: Option<bool>,
        nonce: &'a str,
        challenge: &'a str,
    },
    PeerAsk {
        from: &'a str,
        to: &'a str,
        nonce: &'a str,
    },
    PeerAnswer {
        node: &'a str,
        heard_ago_ms: Option<u64>,
        nonce: &'a str,
    },
}

impl Word<'_> {
    fn bytes(&self) -> Vec<u8> {
        let fields = match *self {
            Word::Heartbeat {
                node,
                heard_ms,
                hold,
                term,
                renewals,
                nonce,
                challenge,
            } => heartbeat_fields(
                node,
                heard_ms,
                Said {
                    hold,
                    term,
                    renewals,
                },
                nonce,
                challenge,
            ),
            Word::HeartbeatAnswer {
                node,
                heard,
                heard_ago_ms: None,
                held: None,
                nonce,
                challenge,
            } => serde_json::json!(["podha/v1 heartbeat-answer", node, heard, nonce, challenge]),
            // A kind of its own: an answer that carries `heardAgoMs` cannot be passed off as an
            // older agent's by dropping the field, nor the other way round.
            // An answer saying `held` is never signed without `heardAgoMs`; one that lost it
            // reads as a word of the same kind with no time, which the agent never signs.
            Word::HeartbeatAnswer {
                node,
                heard,
                heard_ago_ms,
                held: Some(held),
                nonce,
                challenge,
            } => serde_json::json!([
                "podha/v3 heartbeat-answer",
                node,
                heard,
                heard_ago_ms.map(|ago| serde_json::json!([ago])),
                held,
                nonce,
                challenge
            ]),
            Word::HeartbeatAnswer {
                node,
                heard,
                heard_ago_ms: Some(heard_ago_ms),
                held: None,
                nonce,
                challenge,
            } => serde_json::json!([
                "podha/v2 heartbeat-answer",
                node,
                heard,
                heard_ago_ms,
                nonce,
                challenge
            ]),
            Word::PeerAsk { from, to, nonce } => {
                serde_json::json!(["podha/v1 peer-ask", from, to, nonce])
            }
            Word::PeerAnswer {
                node,
                heard_ago_ms,
                nonce,
            } => serde_json::json!(["podha/v1 peer-answer", node, heard_ago_ms, nonce]),
        };
        fields.to_string().into_bytes()
    }
}

/// A heartbeat's word. Each addition is a kind of its own: a heartbeat that holds the node
/// cannot pass for one that does not say (which the agent takes as not holding it), nor one
/// that names its term for one of no term (which tells the agent nothing of the term), nor
/// one that counts from the agent's renewals for one that does not say.
fn heartbeat_fields(
    node: &str,
    heard_ms: Option<u64>,
    said: Said,
    nonce: &str,
    challenge: &str,
) -> serde_json::Value {
    let Said {
        hold,
        term,
        renewals,
    } = said;
    if let Some(renewals) = renewals {
        return serde_json::json!([
            "podha/v4 heartbeat",
            node,
            heard_ms,
            hold,
            term,
            renewals,
            nonce,
            challenge
        ]);
    }
    match (hold, term) {
        (None, None) => serde_json::json!(["podha/v1 heartbeat", node, heard_ms, nonce, challenge]),
        (Some(hold), None) => {
            serde_json::json!(["podha/v2 heartbeat", node, heard_ms, hold, nonce, challenge])
        }
        (hold, Some(term)) => serde_json::json!([
            "podha/v3 heartbeat",
            node,
            heard_ms,
            hold,
            term,
            nonce,
            challenge
        ]),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The query of podha's probe. `heardMs` is how long ago the leader last got an answer from
/// this agent (absent: never), the answer whose challenge the probe signs; the agent counts
/// itself heard when it issued that challenge, or `heardMs` before the probe arrived if that
/// is earlier, so neither lost answers nor a probe held back on the way pass for being heard.
/// `hold` says whether podha holds the node (it counts no silence of its agent: the node or
/// every policy with the `Agent` proof that selects it is paused, or none selects it); absent,
/// it does not (a podha from before `hold`, or an agent whose Lease does not say it heeds it:
/// see [`crate::AGENT_HEEDS_HOLD_ANNOTATION`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<bool>,
    /// The leadership term of the leader that sends it (the leader Lease's
    /// `leaseTransitions`): an agent that knows which term last heard it tells a new leader
    /// that has not heard it yet from podha not hearing it (see docs/agent.md). Absent to an
    /// agent whose Lease does not say it heeds terms
    /// ([`crate::AGENT_HEEDS_TERM_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// `true`: the leader counts the agent's silence from the latest of its first unanswered
    /// probe and its last sight of a renewal of the agent's Lease, so an agent that renews its
    /// Lease may stay up while this leader does not hear it (see docs/agent.md). Absent to an
    /// agent whose Lease does not say it heeds it ([`crate::AGENT_HEEDS_RENEWALS_ANNOTATION`]),
    /// and from a podha from before it: such a leader counts from its first unanswered probe
    /// alone, and the agent fences as it always did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewals: Option<bool>,
    #[serde(default)]
    pub nonce: String,
    /// The challenge of the agent's last answer; empty when podha has none (its first probe).
    #[serde(default)]
    pub challenge: String,
    #[serde(default)]
    pub signature: String,
}

impl HeartbeatQuery {
    /// A probe of `node`'s agent, signed by `leader`, saying nothing of holding the node.
    pub fn signed(
        leader: &Identity,
        node: &str,
        heard_ago: Option<Duration>,
        challenge: &str,
    ) -> Self {
        Self::signed_as(leader, node, heard_ago, Said::default(), challenge)
    }

    /// A probe of `node`'s agent, signed by `leader`, saying what `said` says (nothing of a
    /// word an agent may not know).
    pub fn signed_as(
        leader: &Identity,
        node: &str,
        heard_ago: Option<Duration>,
        said: Said,
        challenge: &str,
    ) -> Self {
        let mut query = Self {
            heard_ms: heard_ago.map(millis),
            hold: said.hold,
            term: said.term,
            renewals: said.renewals,
            nonce: fresh_nonce(),
            challenge: challenge.to_string(),
            signature: String::new(),
        };
        query.signature = leader.sign(&query.word(node));
        query
    }

    /// What its signature covers, for the agent of `node`.
    pub fn word<'a>(&'a self, node: &'a str) -> Word<'a> {
        Word::Heartbeat {
            node,
            heard_ms: self.heard_ms,
            hold: self.hold,
            term: self.term,
            renewals: self.renewals,
            nonce: &self.nonce,
            challenge: &self.challenge,
        }
    }

    /// How long ago the leader last heard the agent, if ever.
    pub fn heard_ago(&self) -> Option<Duration> {
        self.heard_ms.map(Duration::from_millis)
    }

    /// The probe's path and query.
    pub fn path_and_query(&self) -> String {
        let query = serde_urlencoded::to_string(self).unwrap_or_default();
        format!("{HEARTBEAT_PATH}?{query}")
    }
}

/// What a heartbeat says besides the hearing: whether podha holds the node (`None`: nothing,
/// for an agent that may not know the word), the sender's leadership term and whether it
/// counts from the agent's renewals (`None`: nothing, likewise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Said {
    pub hold: Option<bool>,
    pub term: Option<u64>,
    pub renewals: Option<bool>,
}

/// The agent's answer to podha's probe: the node it runs on, whether it counts itself heard
/// and since when, and the challenge podha's next probe signs. An answer naming another node,
/// or not signed by the key the node publishes, is no answer from this node's agent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAnswer {
    pub node: String,
    /// Whether, after this probe, the agent counts itself heard by podha in this boot of its
    /// node: a probe (this one, or an earlier one of this boot, as its hearing file says)
    /// told it podha got an answer. Only such an answer counts for podha's `Agent` proof: an
    /// agent learns it was heard from the probe after its answer, and one cut off before that
    /// counts itself never heard and does not fence on isolation.
    #[serde(default)]
    pub heard: bool,
    /// How long ago, after this probe, the agent last counted a heartbeat of podha's as heard,
    /// in milliseconds: what its isolation timeout runs from. `null`: never in this boot (then
    /// `heard` is `false`); absent (`None`): an agent from before this field. podha compares
    /// it with the `heardMs` it sent: a heartbeat over a challenge someone else took (whoever
    /// else holds the heartbeat key) tells the agent nothing, and only this shows it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub heard_ago_ms: Option<Option<u64>>,
    /// Whether, after this probe, the agent takes podha to hold its node, and so fences
    /// nothing on isolation; absent in an answer to a heartbeat without `hold` from an agent
    /// not held (a held one always says it). Only an answer that says `heard` and not `held`
    /// counts for the silence proof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<bool>,
    #[serde(default)]
    pub challenge: String,
    #[serde(default)]
    pub signature: String,
}

/// A field that is there, `null` or not: serde reads an absent field as the default (`None`)
/// and, without this, a `null` one as `None` too.
fn present<'de, D: serde::Deserializer<'de>>(field: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(field).map(Some)
}

impl HeartbeatAnswer {
    /// The answer of `node`'s agent to the probe with `nonce`, signed by the agent, which last
    /// counted a heartbeat of podha's as heard `heard_ago` ago (`None`: never in this boot),
    /// and, to a probe that said whether podha holds the node, whether it takes it as held.
    pub fn signed(
        agent: &Identity,
        node: &str,
        heard_ago: Option<Duration>,
        held: Option<bool>,
        nonce: &str,
        challenge: &str,
    ) -> Self {
        let mut answer = Self {
            node: node.to_string(),
            heard: heard_ago.is_some(),
            heard_ago_ms: Some(heard_ago.map(millis)),
            held,
            challenge: challenge.to_string(),
            signature: String::new(),
        };
        answer.signature = agent.sign(&answer.word(nonce));
        answer
    }

    /// What its signature covers, for the probe with `nonce`.
    pub fn word<'a>(&'a self, nonce: &'a str) -> Word<'a> {
        Word::HeartbeatAnswer {
            node: &self.node,
            heard: self.heard,
            heard_ago_ms: self.heard_ago_ms,
            held: self.held,
            nonce,
            challenge: &self.challenge,
        }
    }

    /// How long ago the agent last counted a heartbeat of podha's as heard: `Some(None)` never
    /// in this boot, `None` when it does not say (an agent from before `heardAgoMs`).
    pub fn heard_ago(&self) -> Option<Option<Duration>> {
        self.heard_ago_ms.map(|ago| ago.map(Duration::from_millis))
    }
}

/// An agent's survey question to a peer.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerQuery {
    /// The asking agent's node.
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub nonce: String,
    #[serde(default)]
    pub signature: String,
}

impl PeerQuery {
    /// `from`'s agent asking `to`'s.
    pub fn signed(asker: &Identity, from: &str, to: &str) -> Self {
        let mut query = Self {
            from: from.to_string(),
            nonce: fresh_nonce(),
            signature: String::new(),
        };
        query.signature = asker.sign(&query.word(to));
        query
    }

    /// What its signature covers, asked of `to`'s agent.
    pub fn word<'a>(&'a self, to: &'a str) -> Word<'a> {
        Word::PeerAsk {
            from: &self.from,
            to,
            nonce: &self.nonce,
        }
    }

    pub fn path_and_query(&self) -> String {
        let query = serde_urlencoded::to_string(self).unwrap_or_default();
        format!("{PEER_PATH}?{query}")
    }
}

/// The answer to a peer's survey question.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerAnswer {
    pub node: String,
    /// How long ago podha last heard this agent, in milliseconds; absent: never.
    pub heard_ago_ms: Option<u64>,
    #[serde(default)]
    pub signature: String,
}

impl PeerAnswer {
    /// `node`'s answer to the question with `nonce`, signed by its agent.
    pub fn signed(agent: &Identity, node: &str, heard_ago: Option<Duration>, nonce: &str) -> Self {
        let mut answer = Self {
            node: node.to_string(),
            heard_ago_ms: heard_ago.map(millis),
            signature: String::new(),
        };
        answer.signature = agent.sign(&answer.word(nonce));
        answer
    }

    pub fn word<'a>(&'a self, nonce: &'a str) -> Word<'a> {
        Word::PeerAnswer {
            node: &self.node,
            heard_ago_ms: self.heard_ago_ms,
            nonce,
        }
    }

    pub fn heard_ago(&self) -> Option<Duration> {
        self.heard_ago_ms.map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests;
