//! When an agent fences its own node. Pure: the agent's loop gathers the facts, this decides.
//!
//! podha's leader probes every agent (see [`super::server`]); each probe says how long ago the
//! leader last got an answer from this agent, so an agent whose answers are lost learns it is
//! not heard even while probes still reach it. A node whose agent podha has not heard for
//! `isolation_timeout` may be judged dead and its volumes moved; by then the agent must have
//! fenced the node, unless podha itself is not hearing anybody (its leader crashed, the control
//! plane is down): then nothing is being moved, and fencing would only take healthy nodes down.
//!
//! The agent counts that silence only once podha has heard the node in this boot. While podha
//! has never heard this node since it booted ([`Silence::NeverHeard`]: no probe said podha got
//! an answer, and the hearing file, which a reboot empties, has no record), the agent asks
//! nobody and **stays**, and pets its watchdog. Otherwise an agent whose port podha cannot reach
//! would fence its node after every boot, and a cluster powering up while its API server is
//! down (every node unheard, no peer list read) would reboot every node, again and again. This
//! is sound only while podha's `Agent` proof likewise counts no silence of an agent it has not
//! heard in the node's current boot (see docs/agent.md, "What is not there yet"). A hearing
//! file that cannot be read or trusted counts as heard in this boot, long ago (see
//! `super::hearing_file`).
//!
//! Once heard, the agent tells its own isolation from a podha that cannot prove it by asking
//! its peers how long ago podha heard *them*. podha counts an agent's silence only while it
//! hears a strict majority of the agents it expects (every node advertising one, the silent
//! one included: [`crate::contract::agent_quorum`]); the agent's peers are read from the same
//! adverts. A peer counts as unheard when podha last heard it more than half the timeout ago
//! (or never since that agent started): when podha stops hearing everybody at once (its
//! leader stopped), every peer's silence is nearly as long as this node's, while a peer podha
//! still hears was heard a probe interval ago, and podha counts as heard only an agent that
//! answered within a few seconds. A peer that does not answer shows nothing either way, and
//! neither does one that is withdrawing or does not know when podha heard it
//! (`super::server::Hearing::for_peers`).
//! - at least half of the peers are shown unheard ([`stays_with`]): podha hears no strict
//!   majority of the agents and cannot prove this node's silence, so fencing would only take
//!   a healthy node down (a leader that hears part of the fleet, the control plane down).
//!   **Stay.** With no peers (the list was read, or given, and names no other agent) there is
//!   nowhere to fail over to.
//! - fewer than that (answers missing count for nothing): podha may hear a majority and prove
//!   this node's silence. **Fence.** This caps the fences of a partial outage at what podha
//!   could prove: when podha hears `k` of `n` agents, every other agent whose survey reaches
//!   its peers fences only if `2k >= n`: when podha could count its silence, or at an exact
//!   tie (`2k = n`), where staying would need a peer list that names every agent podha
//!   counts, and a list read before a node joined does not.
//! - the peer list was never read (the API server has not answered the agent since it
//!   started): the agent cannot know whether it is alone, so it can show nothing. **Fence.**
//!   (A node cut off from everything must not take its empty list for a cluster of one.)
//!
//! With a watchdog (see [`super::watchdog`]) the agent also decides whether to pet it: freely
//! while podha never heard it since the node booted, or heard it recently enough that the watchdog, if it stopped now, would fire
//! within the isolation timeout of podha's last hearing; after that only while the peers show
//! that podha cannot prove this node's silence ([`pet_watchdog`]). A frozen agent pets nothing, so the watchdog
//! resets a hung node before podha's silence proof can hold.

use std::time::Duration;

use tokio::time::Instant;

/// How many peers (other nodes with an agent) the agent knows of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerCount {
    /// The peer list was never read: the agent cannot know whether it is alone.
    Unknown,
    /// The peer list was read (or given with `--peers`): this many peers.
    Known(usize),
}

/// What the agent learned from its peers in one survey.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survey {
    /// Every peer the agent knows of, asked or not.
    pub peers: PeerCount,
    /// The answers: for each peer that answered, how long ago podha last heard it (`None`:
    /// never since that agent started).
    pub answers: Vec<Option<Duration>>,
}

impl Survey {
    /// Whether this survey already decides: at least half of the peers are shown unheard, or
    /// the peers not yet answered could no longer show it. The agent stops asking once it does
    /// (a thousand-node cluster needs about half the answers either way). `silence`: how long
    /// this node has gone unheard, as [`Survey::unheard`] takes it.
    pub fn settled(&self, silence: Duration) -> bool {
        let PeerCount::Known(peers) = self.peers else {
            return true;
        };
        let unanswered = peers.saturating_sub(self.answers.len());
        let unheard = self.unheard(silence);
        stays_with(unheard, peers) || !stays_with(unheard + unanswered, peers)
    }

    /// Peers podha heard within half of `silence` (this node's silence, at most the isolation
    /// timeout): when podha stops hearing everybody at once, each peer's silence is nearly as
    /// long as this node's, while a peer podha still hears was heard a probe interval ago.
    /// (No longer window: at the shortest timings the watchdog's petting survey begins at 4 s
    /// of silence, and peers silenced with this node must count unheard by then.)
    pub fn heard(&self, silence: Duration) -> usize {
        self.answers
            .iter()
            .filter(|a| a.is_some_and(|ago| ago <= silence / 2))
            .count()
    }

    /// Peers that answered that podha did not hear within half of `silence` (or never since
    /// they started). A peer that did not answer is neither heard nor unheard: it shows
    /// nothing.
    pub fn unheard(&self, silence: Duration) -> usize {
        self.answers.len() - self.heard(silence)
    }

    /// podha cannot prove this node's silence: at least half of the peers are shown unheard
    /// ([`stays_with`]). With no peers (known) there is nowhere to fail over to; an unknown
    /// list shows nothing.
    pub fn podha_cannot_prove(&self, silence: Duration) -> bool {
        matches!(self.peers, PeerCount::Known(peers) if stays_with(self.unheard(silence), peers))
    }
}

/// Whether an agent with `unheard` of its `peers` shown unheard stays up: at least half of
/// them, `2 * unheard >= peers`. podha counts a silence only while it hears a strict majority
/// of all the agents, the silent one included ([`crate::contract::agent_quorum`]); an agent
/// that stays shows podha hears at most `peers - unheard`, no more than half of the others,
/// so podha cannot prove its silence, and still could not with one agent more than the
/// agent's list names (a node that began advertising since the list was read). At an exact
/// tie (an even cluster split in halves, podha in one) the other half fences though podha
/// cannot prove it either: the tie has no room for a list one node behind.
pub const fn stays_with(unheard: usize, peers: usize) -> bool {
    unheard * 2 >= peers
}

/// How long podha has not heard this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// podha has never heard this node since it booted: no probe said podha got an answer,
    /// and the hearing file has no record.
    NeverHeard,
    /// podha last heard this node this long ago.
    For(Duration),
    /// podha heard this node in this boot, and its last heartbeat the agent counted said podha
    /// holds the node (paused, or no policy with the `Agent` proof selects it): podha counts
    /// no silence of it, so the agent counts none either.
    Held,
}

/// The agent renews its Lease, recently enough that podha cannot count its silence: the agent
/// stays up on isolation, and pets its watchdog, while it renews. Two leaders see it so:
///
/// - **One that counts from renewals** (`why` [`RenewalsCount::FromRenewals`]): the last
///   heartbeat the agent counted said its leader counts the silence from the latest of its
///   first unanswered probe and its last sight of a renewal of the agent's Lease (`renewals`
///   in the heartbeat). A node that only podha cannot reach (a firewall, a path between podha
///   and a rack) renews through the API server, and is not reset for it.
/// - **A new leader** (`why` [`RenewalsCount::NewTerm`]): the leader Lease shows a later
///   leadership term than any heartbeat the agent counted (each signs its sender's term). A
///   leader that never heard an agent counts its silence only from an earlier leader's hearing
///   (the Lease's word that it was heard in this boot), and never once it saw the agent's
///   Lease renewed in its own term (`planner::proof`).
///
/// Why the renewals must be this recent ([`renewal_window`]): podha's proof waits the
/// isolation timeout plus its margin from the last renewal it saw (or, for a new leader, from
/// its own first unanswered probe, later than a renewal it did not see in its term). An agent
/// whose renewals stop (the API server out of its reach) stops staying at the last one taken
/// plus the window, and its watchdog fires within the watchdog's timeout of that: within the
/// isolation timeout of the last renewal, which podha saw no earlier than it was sent. The
/// margin covers the time podha takes to see a renewal (its watch); a renewal its view missed
/// is found by the read of the agent's Lease right before the taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewing {
    pub why: RenewalsCount,
    /// How long ago the last renewal of the agent's Lease that was taken was sent.
    pub renewed_ago: Duration,
}

/// Why podha counts no silence of an agent that renews its Lease (see [`Renewing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalsCount {
    /// The last heartbeat the agent counted said its leader counts from the renewals.
    FromRenewals,
    /// A leader of a later term than the last that heard the agent leads.
    NewTerm {
        /// The latest term among the heartbeats the agent counted.
        heard_in: u64,
        /// The term the leader Lease shows.
        leads: u64,
    },
}

/// How recent the last renewal of the agent's Lease must be for podha to have seen it, or to
/// see this node fenced before its proof (see [`Renewing`]): the isolation timeout less the
/// watchdog's (less half the isolation
/// timeout without a watchdog, whose agent's silence proves nothing anyway). The agent renews
/// its Lease every third of it while it counts on this (`super::advert`).
pub fn renewal_window(timeout: Duration, watchdog: Option<Duration>) -> Duration {
    timeout.saturating_sub(watchdog.unwrap_or(timeout / 2))
}

/// The agent's verdict on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// podha heard this node within the timeout: nothing to ask.
    Heard,
    /// Fence the node now.
    Fence(String),
    /// Not heard, but fencing would not make anything safer; keep running.
    Stay(String),
}

/// The verdict for a node podha has not heard for `silence`, given its peers' answers
/// (gathered only once the silence neared `timeout`). A node podha never heard since it booted
/// stays, with no survey: an agent podha cannot reach would otherwise fence its node after
/// every boot, and when a whole cluster powers up without its control plane, every node is
/// unheard and knows no peers; fencing then would reboot every node, again and again. A node
/// whose Lease renewals keep podha from counting its silence stays (`renewing`, see
/// [`Renewing`]).
pub fn decide(
    silence: Silence,
    timeout: Duration,
    survey: Option<&Survey>,
    renewing: Option<Renewing>,
) -> Verdict {
    let not_heard_for = match silence {
        Silence::NeverHeard => {
            return Verdict::Stay(
                "podha has never heard this node since it booted: the agent fences on \
                 isolation only once podha has heard it (an agent podha cannot reach, or a \
                 cluster powering up without its API server, must not reboot its nodes)"
                    .into(),
            );
        }
        Silence::Held => {
            return Verdict::Stay(
                "podha holds this node (it, or every policy with the Agent proof that selects \
                 it, is paused, or no such policy selects it), or has just let go of it and the \
                 watchdog is not armed yet: podha counts no silence of it, so fencing on \
                 isolation would move nothing"
                    .into(),
            );
        }
        Silence::For(not_heard_for) => not_heard_for,
    };
    if not_heard_for < timeout {
        return Verdict::Heard;
    }
    let silent = humantime::format_duration(round_secs(not_heard_for));
    if let Some(r) = renewing {
        let renewed = humantime::format_duration(round_secs(r.renewed_ago));
        return Verdict::Stay(match r.why {
            RenewalsCount::NewTerm { heard_in, leads } => format!(
                "podha has not heard this node for {silent}, but its leader changed since (term \
                 {heard_in} last heard it, the leader Lease shows term {leads}) and the new \
                 leader has not heard it: this agent's Lease, renewed {renewed} ago, shows the \
                 new leader it runs, so it counts no silence of it"
            ),
            RenewalsCount::FromRenewals => format!(
                "podha has not heard this node for {silent}, but this agent's Lease, renewed \
                 {renewed} ago, shows podha it runs: podha counts its silence from the last \
                 renewal it saw, so the agent stays up while the API server takes its renewals \
                 (podha alone cannot reach it)"
            ),
        });
    }
    let Some(survey) = survey else {
        return Verdict::Stay("not heard; the peers are not asked yet".into());
    };
    let peers = match survey.peers {
        PeerCount::Unknown => {
            return Verdict::Fence(format!(
                "podha has not heard this node for {silent}, and the peer list was never read \
                 (the API server has not answered this agent): nothing shows that podha hears \
                 nobody"
            ));
        }
        PeerCount::Known(0) => {
            return Verdict::Stay(format!(
                "podha has not heard this node for {silent}, but there is no other node to \
                 fail over to"
            ));
        }
        PeerCount::Known(peers) => peers,
    };
    let answered = survey.answers.len();
    let heard = survey.heard(timeout);
    let unheard = answered - heard;
    if stays_with(unheard, peers) {
        return Verdict::Stay(format!(
            "podha has not heard this node for {silent}, nor {unheard} of the {answered} of \
             {peers} peers that answered: at least half of the peers unheard, so podha hears \
             no majority of the agents and cannot prove this node's silence"
        ));
    }
    Verdict::Fence(format!(
        "podha has not heard this node for {silent}; of the {answered} of {peers} peers that \
         answered it hears {heard} and not {unheard}: fewer than half of the peers shown \
         unheard, so podha may hear a majority of the agents and prove this node's silence"
    ))
}

/// When the agent surveys its peers: at the isolation timeout, or with a watchdog as soon as
/// stopping to pet it could let it fire before then (`watchdog` earlier), so that the peers'
/// word is known before the watchdog would reset a healthy node.
pub fn survey_after(timeout: Duration, watchdog: Option<Duration>) -> Duration {
    timeout.saturating_sub(watchdog.unwrap_or_default())
}

/// Whether the agent pets its watchdog (whose timeout is `watchdog`) at this check:
/// - while podha has never heard this node since it booted, or holds it: no proof can hold
///   for it;
/// - while a watchdog that stopped now would fire within `timeout` of podha's last hearing
///   (`not_heard_for + watchdog <= timeout`): podha's silence proof, which waits `timeout`
///   plus a margin from that hearing, then never sees a node that still runs;
/// - later, only while `survey` shows podha cannot prove this node's silence (it hears no
///   majority: its leader or the control plane is down, or it hears part of the fleet), or
///   while the agent's Lease renewals keep podha from counting it (`renewing`, see
///   [`Renewing`]): nothing can be moved, and a watchdog reset would take a healthy node down.
///
/// A frozen or hung node pets nothing, whatever the rule says.
pub fn pet_watchdog(
    silence: Silence,
    timeout: Duration,
    watchdog: Duration,
    survey: Option<&Survey>,
    renewing: Option<Renewing>,
) -> bool {
    match silence {
        Silence::NeverHeard | Silence::Held => true,
        Silence::For(not_heard_for) => {
            not_heard_for.saturating_add(watchdog) <= timeout
                || renewing.is_some()
                || survey.is_some_and(|s| s.podha_cannot_prove(not_heard_for.min(timeout)))
        }
    }
}

/// How long a `Fence` verdict must hold before the agent fences: two probe intervals. When
/// podha's leader starts probing again (a new leader, the API server back), one round reaches
/// the agents over a few milliseconds to seconds; an agent surveying in that window finds a
/// peer heard a moment before its own probe arrives. Waiting for the verdict to hold lets that
/// probe arrive.
pub const CONFIRM: Duration = Duration::from_secs(2);

/// A `Fence` verdict held since when; the agent fences once it held for [`CONFIRM`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Confirmation {
    since: Option<Instant>,
}

impl Confirmation {
    /// Takes this check's verdict at `now`; returns whether to fence now.
    pub fn fence_now(&mut self, verdict: &Verdict, now: Instant) -> bool {
        match verdict {
            Verdict::Fence(_) => {
                let since = *self.since.get_or_insert(now);
                now.saturating_duration_since(since) >= CONFIRM
            }
            Verdict::Heard | Verdict::Stay(_) => {
                self.since = None;
                false
            }
        }
    }
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// How long after podha last heard it an agent's node is fenced at the latest, if podha does
/// not hear it again (and hears its peers): what the agent advertises on its Node, and what
/// podha's silence proof waits for (plus its margin, for the fence itself and the probes' own
/// delays).
///
/// - With a watchdog (timeout at most half of `timeout`), the isolation timeout: the agent
///   stops petting once a watchdog that stopped then would fire within it ([`pet_watchdog`]),
///   so the node is reset by then, whatever the agent decides or whether it runs at all.
/// - Without one, `None`: the agent still fences its node on isolation by its own decision
///   ([`decide`]), as a last resort, but a frozen or hung agent decides nothing, and its node
///   would thaw into a cluster that moved its volumes. So it advertises nothing, and its
///   silence proves no fence.
pub fn fenced_within(timeout: Duration, watchdog: Option<Duration>) -> Option<Duration> {
    watchdog.map(|_| timeout)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod quorum_tests;

#[cfg(test)]
mod renewing_tests;
