//! The agent's HTTP endpoints, and what it knows of being heard.
//!
//! - `GET /heartbeat` — podha's leader probes every agent with this (the request and the
//!   answer are part of [`crate::contract`], signed as [`crate::contract::words`] says).
//!   `heardMs` is how long ago the leader last got an answer from this agent (absent: never).
//!   The agent counts itself heard when it issued the challenge the probe signs (podha got the
//!   answer carrying it), or `heardMs` before the probe arrived if that is earlier, so neither
//!   lost answers nor a probe held back pass for being heard. Its answer says whether,
//!   after this probe, it counts itself heard in this boot: podha counts only such answers as
//!   hearing it for its silence proof (the first answer of a boot is not, until the next
//!   probe tells the agent it was heard). It also says how long ago it was last heard, so
//!   that podha sees when its own probe told the agent nothing: anyone else holding the
//!   leader's key can take the challenge podha's next probe signs (a heartbeat over no
//!   challenge gets the newest), and the agent, heard before in this boot, would still say
//!   `heard` while its isolation timeout runs.
//! - `GET /peer` — another agent surveying its peers: how long ago podha last heard this one.
//! - `GET /metrics` — what the agent refused (see [`counters`]).
//!
//! A probe not signed by podha's leader, or a question not signed by a peer, gets `401` and
//! nothing else: a process on a node cut off from podha cannot keep its agent "heard", and
//! nobody learns anything from an agent it could not prove itself to. Answers are JSON signed
//! by the agent's key; nothing here writes to the API server: thousands of nodes probed every
//! second cost the leader one small request per node per interval and the API server nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::time::Instant;

use super::counters;
use super::isolation::{RenewalsCount, Renewing, Silence};
use super::leader_key::LeaderKey;
use super::peer_list::lock;
use super::peers::Peers;
use super::port::Trust;
use crate::contract::{
    AGENT_PROBE_INTERVAL, HEARTBEAT_PATH, HeartbeatAnswer, HeartbeatQuery, Identity, PEER_PATH,
    PeerAnswer, PeerQuery, fresh_nonce,
};

/// What the agent knows of podha hearing it, shared by the endpoints and the check loop.
#[derive(Debug, Default)]
pub struct Hearing {
    /// `None`: podha has not heard this node since it booted.
    last: Option<HeardAgo>,
    /// `last` is a guess: resumed from a hearing file that says podha heard this node in this
    /// boot but not when (see `super::hearing_file`), and no probe has said since. The guess
    /// (long ago) is the safe side for this agent's own verdict, not for a peer's: the agent
    /// answers no survey until a probe says when podha heard it.
    unsure: bool,
    /// The agent is withdrawing its advert (it stops): podha no longer counts it, so a peer
    /// must not count its word either; it answers no survey from then on.
    withdrawing: bool,
    /// The last heartbeat the agent counted said podha holds this node (`hold`), and the
    /// agent's Lease no longer says podha may count its silence: podha counts none, so the
    /// agent fences nothing on isolation ([`Silence::Held`]) and disarms its watchdog. Kept
    /// across a restart by the hearing file once the watchdog is disarmed (see
    /// `super::arming`).
    held: bool,
    /// The agent has a watchdog, and it is not armed (podha held the node, or has not heard it
    /// since it booted; see `super::arming`): until it is armed again, the agent takes the
    /// node as held, says so, and its Lease says nothing of being heard, so that podha counts
    /// no silence that nothing would end in a reset.
    unarmed: bool,
    /// A heartbeat said podha holds this node, and the agent's Lease has not yet been written
    /// without its word of being heard: until it is, a new leader could take that word for an
    /// agent that counts its silence, so the agent is not held yet (see `super::advert`).
    hold_pending: bool,
    /// Told whenever the hold changes: the agent's Lease is written at once (see
    /// `super::advert`).
    held_changed: Arc<tokio::sync::Notify>,
    /// The latest leadership term among the heartbeats the agent counted (each names its
    /// sender's); `None` while none named one. Not kept across a restart: an agent that does
    /// not know it sees no later term, the side that fences.
    heard_term: Option<u64>,
    /// When the agent last sent a renewal of its Lease that the API server took (see
    /// `super::advert`).
    lease_renewed: Option<Instant>,
    /// The last heartbeat the agent counted said its leader counts the silence from the
    /// agent's renewals (see [`Renewing`]): that heartbeat's term. Only while the leader Lease
    /// shows that same term does the agent stay on its renewals for it: a term it cannot read
    /// (the leader Lease unreadable, recreated) shows nothing, the side that fences. Kept
    /// across a restart by the hearing file.
    renewals_in: Option<u64>,
}

/// podha heard this node `ago` before `at`. Kept so rather than as the instant itself, which
/// may lie before the monotonic clock's start (a long silence recorded before a restart).
#[derive(Clone, Copy, Debug)]
struct HeardAgo {
    at: Instant,
    ago: Duration,
}

impl HeardAgo {
    fn silence(self, now: Instant) -> Duration {
        self.ago
            .saturating_add(now.saturating_duration_since(self.at))
    }
}

impl Hearing {
    /// An agent that goes on where its predecessor in this boot stopped: podha last heard this
    /// node `heard_ago` before `now` (`None`: never since the node booted), and held it
    /// (`held`) with the watchdog disarmed.
    pub fn resumed(now: Instant, heard_ago: Option<Duration>, held: bool) -> Self {
        Self {
            last: heard_ago.map(|ago| HeardAgo { at: now, ago }),
            held: held && heard_ago.is_some(),
            ..Self::default()
        }
    }

    /// An agent that goes on from a hearing file that says podha heard this node in this boot
    /// at a time it cannot know: taken as `heard_ago` before `now`, and answering no survey
    /// until a probe says when; held (`held`) with the watchdog disarmed, if the file says so.
    pub fn resumed_unsure(now: Instant, heard_ago: Duration, held: bool) -> Self {
        Self {
            last: Some(HeardAgo {
                at: now,
                ago: heard_ago,
            }),
            unsure: true,
            held,
            ..Self::default()
        }
    }

    /// How long ago podha last heard this agent, for a peer's survey; `None` while the agent
    /// knows only that podha heard it, not when ([`Self::resumed_unsure`]), and once it is
    /// withdrawing ([`Self::withdraw`]).
    pub fn for_peers(&self, now: Instant) -> Option<Option<Duration>> {
        (!self.unsure && !self.withdrawing).then(|| self.heard_ago(now))
    }

    /// The agent takes its advert back: it answers no survey from now on (podha no longer
    /// counts it among the agents it expects; a peer that did would count one more than
    /// podha, which the peers' rule has no room for beside a list one node behind).
    pub fn withdraw(&mut self) {
        self.withdrawing = true;
    }

    /// A probe arrived at `now`, from a leader that last heard this agent `heard_ago` ago.
    pub fn probed(&mut self, now: Instant, heard_ago: Option<Duration>) {
        let Some(ago) = heard_ago else {
            return;
        };
        let heard = HeardAgo { at: now, ago };
        if self.unsure || self.last.is_none_or(|last| ago < last.silence(now)) {
            self.last = Some(heard);
        }
        self.unsure = false;
    }

    /// A heartbeat the agent counted (one over a challenge it had out) said whether podha
    /// holds this node (`None`: it did not say, and nothing changes). Let go of, the agent
    /// counts its silence at once; held, only once its Lease says nothing of being heard
    /// ([`Self::hold_written`]).
    pub fn hold(&mut self, hold: Option<bool>) {
        match hold {
            None => {}
            Some(true) if self.held || self.hold_pending => {}
            Some(true) => {
                self.hold_pending = true;
                self.held_changed.notify_one();
            }
            Some(false) if !self.held && !self.hold_pending => {}
            Some(false) => {
                self.held = false;
                self.hold_pending = false;
                self.held_changed.notify_one();
            }
        }
    }

    /// A heartbeat the agent counted named its sender's leadership term. `None`: it named
    /// none (an older podha, or one that did not know this agent heeds terms), and the term
    /// that heard the agent is unknown from then on: such a leader counts its silence, and an
    /// unknown term shows no later one, the side that fences.
    pub fn heard_in_term(&mut self, term: Option<u64>) {
        self.heard_term = term.map(|term| self.heard_term.map_or(term, |t| t.max(term)));
    }

    /// A heartbeat the agent counted, of leadership term `term`, said whether its leader counts
    /// the silence from the agent's renewals (`None`: it did not say: an older podha, or one
    /// that did not know this agent heeds it, which counts from its first unanswered probe
    /// alone). Only a heartbeat that names its term counts from renewals for the agent.
    pub fn heard_counting_renewals(&mut self, renewals: Option<bool>, term: Option<u64>) {
        self.renewals_in = term.filter(|_| renewals == Some(true));
    }

    /// The term of the last counted heartbeat, if it said its leader counts from the
    /// renewals: for the hearing file.
    pub fn renewals_in(&self) -> Option<u64> {
        self.renewals_in
    }

    /// A restarted agent goes on from the hearing file: the last heartbeat its predecessor
    /// counted, of term `term`, said its leader counts from the renewals.
    #[must_use]
    pub fn resumed_counting_renewals(mut self, term: Option<u64>) -> Self {
        self.renewals_in = term;
        self
    }

    /// A renewal of the agent's Lease sent at `sent` was taken.
    pub fn lease_renewed(&mut self, sent: Instant) {
        self.lease_renewed = Some(self.lease_renewed.map_or(sent, |at| at.max(sent)));
    }

    /// Whether, at `now`, the agent's Lease renewals keep podha from counting its silence (see
    /// [`Renewing`]): podha heard it in this boot and does not hold it, its last renewal taken
    /// was sent within `window`, and either a leader of a later term than any heartbeat the
    /// agent counted leads (`leads`, the term the leader Lease shows: one that never heard the
    /// agent), or the last heartbeat it counted said its leader counts from the renewals and
    /// that leader's term leads. `None` if not.
    pub fn renewing(&self, leads: Option<u64>, now: Instant, window: Duration) -> Option<Renewing> {
        let renewed_ago = now.saturating_duration_since(self.lease_renewed?);
        let counts = self.counts_silence() && !self.unarmed && !self.unsure;
        if !counts || renewed_ago > window {
            return None;
        }
        let why = match (self.heard_term, leads) {
            (Some(heard_in), Some(leads)) if leads > heard_in => {
                RenewalsCount::NewTerm { heard_in, leads }
            }
            (_, Some(leads)) if self.renewals_in == Some(leads) => RenewalsCount::FromRenewals,
            _ => return None,
        };
        Some(Renewing { why, renewed_ago })
    }

    /// Whether the agent takes its node as held by podha: it fences nothing on isolation.
    pub fn held(&self) -> bool {
        self.held
    }

    /// Whether a hold is asked for or taken, or the watchdog is not armed: the answers say
    /// held, and the Lease must say nothing of being heard.
    pub fn holding(&self) -> bool {
        self.held || self.hold_pending || self.unarmed
    }

    /// Whether podha may count this node's silence, as far as the agent knows: it heard the
    /// node in this boot and does not hold it (a hold asked for but not taken yet included).
    /// Only then is the watchdog armed (see `super::arming`).
    pub fn counts_silence(&self) -> bool {
        self.last.is_some() && !self.held
    }

    /// The watchdog was armed, or disarmed. Armed, the node is no longer held for it, and the
    /// Lease is written at once (as when a hold changes).
    pub fn watchdog_armed(&mut self, armed: bool) {
        if self.unarmed == armed {
            self.unarmed = !armed;
            self.held_changed.notify_one();
        }
    }

    /// The agent's Lease was written without its word of being heard, having been built while
    /// a hold was pending (`pending`): the hold is taken, if it is still asked for.
    pub fn hold_written(&mut self, pending: bool) {
        if pending && self.hold_pending {
            self.hold_pending = false;
            self.held = true;
        }
    }

    /// Whether a hold waits for the Lease.
    pub fn hold_pending(&self) -> bool {
        self.hold_pending
    }

    /// What is told whenever the hold changes.
    pub fn held_changed(&self) -> Arc<tokio::sync::Notify> {
        self.held_changed.clone()
    }

    /// How long podha has not heard this agent: since it was last heard, or
    /// [`Silence::NeverHeard`] (no probe ever said podha got an answer, in this agent or, as
    /// the hearing file says, in an earlier one since the node booted), or [`Silence::Held`]
    /// while the last heartbeat counted said podha holds the node.
    pub fn silence(&self, now: Instant) -> Silence {
        match self.last {
            None => Silence::NeverHeard,
            Some(_) if self.held || self.unarmed => Silence::Held,
            Some(last) => Silence::For(last.silence(now)),
        }
    }

    /// How long ago podha last heard this agent, if ever.
    pub fn heard_ago(&self, now: Instant) -> Option<Duration> {
        self.last.map(|last| last.silence(now))
    }
}

pub type SharedHearing = Arc<Mutex<Hearing>>;

/// How old a challenge a stale heartbeat of the leader may find before it is renewed: two probe
/// intervals, so the leader's own accepted probes (every interval) keep it young and replays do
/// not evict it.
pub const CHALLENGE_RENEWED_AFTER: Duration = AGENT_PROBE_INTERVAL.saturating_mul(2);

/// Whom the agent's endpoints answer, and with what: its node, its key, what it knows of being
/// heard, the keys it trusts (podha's leader's and its peers').
#[derive(Clone)]
pub struct Endpoints {
    pub node: Arc<str>,
    pub identity: Arc<Identity>,
    pub hearing: SharedHearing,
    pub leader_key: Arc<LeaderKey>,
    pub peers: Arc<Peers>,
}

#[derive(Clone)]
struct AppState {
    endpoints: Endpoints,
    challenges: Arc<Mutex<Challenges>>,
}

/// A challenge podha's next heartbeat must sign, and when it was issued: a heartbeat that
/// signs it comes from a leader that got the answer carrying it, so podha heard the agent no
/// later than that instant (nor than `heardMs` before the heartbeat arrived), however long the
/// heartbeat took on its way.
struct Challenge {
    value: String,
    issued: Instant,
}

impl Challenge {
    fn fresh() -> Self {
        Self {
            value: fresh_nonce(),
            issued: Instant::now(),
        }
    }
}

/// The challenges out, newest last, at most [`OUTSTANDING`]: each answer carries the newest. A
/// heartbeat that signs one takes it and every older one, and a new one goes out; a stale
/// leader-signed heartbeat adds one if the newest is older than [`CHALLENGE_RENEWED_AFTER`], so
/// a replay can push one out only every two probe intervals, and the leader's own is taken
/// before three go by.
struct Challenges(VecDeque<Challenge>);

/// How many challenges may be out at once.
const OUTSTANDING: usize = 3;

impl Challenges {
    fn new() -> Self {
        Self(VecDeque::from([Challenge::fresh()]))
    }

    fn newest(&self) -> &str {
        self.0.back().map_or("", |c| c.value.as_str())
    }

    fn push_fresh(&mut self) {
        self.0.push_back(Challenge::fresh());
        while self.0.len() > OUTSTANDING {
            self.0.pop_front();
        }
    }

    /// Takes `value` (and every older one) if it is out: when it was issued.
    fn take(&mut self, value: &str) -> Option<Instant> {
        if value.is_empty() {
            return None;
        }
        let at = self.0.iter().position(|c| c.value == value)?;
        let issued = self.0[at].issued;
        self.0.drain(..=at);
        self.push_fresh();
        Some(issued)
    }

    /// A leader-signed heartbeat over no challenge out: a new one, if the newest is old.
    fn renew_if_old(&mut self, now: Instant) {
        let old = self
            .0
            .back()
            .is_none_or(|c| now.saturating_duration_since(c.issued) > CHALLENGE_RENEWED_AFTER);
        if old {
            self.push_fresh();
        }
    }
}

pub fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route(HEARTBEAT_PATH, get(heartbeat))
        .route(PEER_PATH, get(peer))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            endpoints,
            challenges: Arc::new(Mutex::new(Challenges::new())),
        })
}

/// podha's leader's probe. Not signed by the leader's key as the agent last saw it: `401` and
/// nothing learnt. Signed over a challenge the agent has out: the hearing it reports counts
/// (from that challenge's issue), and a new challenge goes out. Signed over any other (a new
/// leader's first probe, or a replay): answered, with the newest challenge, and nothing learnt
/// (see [`Challenges`] for when that is a new one, so that a new leader's hearing counts from
/// its own first probe, not from a challenge issued before it led). Only a probe over a
/// challenge it had out tells it whether podha holds the node (`hold`): a replay of one
/// sent during a pause must not hold a node podha no longer holds. The answer says whether
/// the agent takes the node as held, to a probe that asked.
async fn heartbeat(
    State(state): State<AppState>,
    trust: Option<Extension<Trust>>,
    RawQuery(query): RawQuery,
) -> Response {
    let ours = &state.endpoints;
    let q: Option<HeartbeatQuery> = parse(query);
    let signed = q.as_ref().is_some_and(|q| {
        ours.leader_key
            .current()
            .is_some_and(|key| key.verifies(&q.word(&ours.node), &q.signature))
    });
    let Some(q) = q.filter(|_| signed) else {
        counters::refused(HEARTBEAT_PATH);
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if let Some(Extension(trust)) = trust {
        trust.grant();
    }
    let now = Instant::now();
    let (heard_ago, held, challenge) = {
        let mut challenges = lock(&state.challenges);
        let mut hearing = lock(&ours.hearing);
        match challenges.take(&q.challenge) {
            Some(issued) => {
                // Heard when podha got the answer carrying this challenge: no later than its
                // issue, nor than `heardMs` before now.
                let since_issue = now.saturating_duration_since(issued);
                let heard_ago = q.heard_ago().map(|ago| ago.saturating_sub(since_issue));
                hearing.probed(issued, heard_ago);
                hearing.hold(q.hold);
                hearing.heard_in_term(q.term);
                hearing.heard_counting_renewals(q.renewals, q.term);
            }
            None => {
                counters::stale_heartbeat();
                challenges.renew_if_old(now);
            }
        }
        // Held, or waiting for the Lease to take the hold: said so whenever it is, asked or
        // not (an answer a podha not asking could take for an armed agent's must not be given
        // by one that may fence nothing; an older podha cannot verify the word).
        let holding = hearing.holding();
        let held = (q.hold.is_some() || holding).then_some(holding);
        (
            hearing.heard_ago(now),
            held,
            challenges.newest().to_string(),
        )
    };
    let answer = HeartbeatAnswer::signed(
        &ours.identity,
        &ours.node,
        heard_ago,
        held,
        &q.nonce,
        &challenge,
    );
    axum::Json(answer).into_response()
}

/// A peer's survey question, answered only if signed by the key the peer list gives the
/// asker's node.
async fn peer(
    State(state): State<AppState>,
    trust: Option<Extension<Trust>>,
    RawQuery(query): RawQuery,
) -> Response {
    let ours = &state.endpoints;
    let q: Option<PeerQuery> = parse(query);
    let signed = q.as_ref().is_some_and(|q| {
        ours.peers
            .key_of(&q.from)
            .is_some_and(|key| key.verifies(&q.word(&ours.node), &q.signature))
    });
    let Some(q) = q.filter(|_| signed) else {
        counters::refused(PEER_PATH);
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if let Some(Extension(trust)) = trust {
        trust.grant();
    }
    let Some(ago) = lock(&ours.hearing).for_peers(Instant::now()) else {
        // The agent does not know when podha heard it: no answer (the asker counts it for
        // nothing) rather than a guess that would show it unheard.
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    axum::Json(PeerAnswer::signed(
        &ours.identity,
        &ours.node,
        ago,
        &q.nonce,
    ))
    .into_response()
}

/// A query as its word's fields, if it reads as one (anything else is refused like an unsigned
/// word: `401`, counted, nothing said of why).
fn parse<T: serde::de::DeserializeOwned>(query: Option<String>) -> Option<T> {
    serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).ok()
}

async fn metrics() -> String {
    counters::render()
}

#[cfg(test)]
mod words_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Resumed from a hearing file that cannot say when podha heard it, the agent takes it as
    /// long ago for itself, but answers no peer until a probe says when: a peer would count
    /// it unheard while podha may hear it.
    #[tokio::test(start_paused = true)]
    async fn an_agent_unsure_when_it_was_heard_answers_no_survey_until_a_probe_says() {
        let long = Duration::from_secs(40);
        let mut h = Hearing::resumed_unsure(Instant::now(), long, false);
        assert_eq!(h.heard_ago(Instant::now()), Some(long));
        assert_eq!(h.for_peers(Instant::now()), None);
        // A new leader's first probe says nothing of when: still unsure.
        h.probed(Instant::now(), None);
        assert_eq!(h.for_peers(Instant::now()), None);
        // A probe saying podha heard it a second ago, though the guess was longer.
        h.probed(Instant::now(), Some(Duration::from_secs(1)));
        assert_eq!(
            h.for_peers(Instant::now()),
            Some(Some(Duration::from_secs(1)))
        );
        // Sure from the start: answers at once, never heard too.
        assert_eq!(
            Hearing::resumed(Instant::now(), None, false).for_peers(Instant::now()),
            Some(None)
        );
        // Withdrawing: no answer any more, whatever a probe says.
        h.withdraw();
        h.probed(Instant::now(), Some(Duration::ZERO));
        assert_eq!(h.for_peers(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_answers_do_not_count_as_heard() {
        let mut h = Hearing::default();
        tokio::time::advance(Duration::from_secs(5)).await;
        // The leader's first probe: it never heard this agent.
        h.probed(Instant::now(), None);
        assert_eq!(h.heard_ago(Instant::now()), None);
        // It got that answer: heard a second ago.
        tokio::time::advance(Duration::from_secs(1)).await;
        h.probed(Instant::now(), Some(Duration::from_secs(1)));
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(1))
        );
        // From now on the answers are lost: the probes keep coming, saying so.
        for ago in 2..=10 {
            tokio::time::advance(Duration::from_secs(1)).await;
            h.probed(Instant::now(), Some(Duration::from_secs(ago)));
        }
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(10))
        );
        // A late, older probe does not move the time back.
        h.probed(Instant::now(), Some(Duration::from_secs(30)));
        assert_eq!(h.heard_ago(Instant::now()), Some(Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_podha_never_heard_has_no_silence_to_count() {
        // podha cannot reach this agent since the node booted: the agent counts no silence,
        // however long it runs.
        let mut h = Hearing::default();
        tokio::time::advance(Duration::from_secs(600)).await;
        h.probed(Instant::now(), None);
        assert_eq!(h.silence(Instant::now()), Silence::NeverHeard);
        assert_eq!(h.heard_ago(Instant::now()), None);
        let fresh = Hearing::resumed(Instant::now(), None, false);
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(fresh.silence(Instant::now()), Silence::NeverHeard);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_agent_is_as_unheard_as_its_predecessor() {
        tokio::time::advance(Duration::from_secs(100)).await;
        let h = Hearing::resumed(Instant::now(), Some(Duration::from_secs(25)), false);
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(25))
        );
        assert_eq!(h.heard_ago(Instant::now()), Some(Duration::from_secs(25)));
        // Longer ago than the monotonic clock reaches back: still that long, never "now".
        let long_ago = Duration::from_secs(10 * 365 * 86_400);
        let h = Hearing::resumed(Instant::now(), Some(long_ago), false);
        tokio::time::advance(Duration::from_secs(1)).await;
        let expected = long_ago + Duration::from_secs(1);
        assert_eq!(h.silence(Instant::now()), Silence::For(expected));
    }
}
