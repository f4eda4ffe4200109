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
//! Once heard, the agent tells its own isolation from a podha that hears nobody by asking its
//! peers how long ago podha heard *them*. A peer counts as heard within half the timeout:
//! when podha stops hearing everybody at once (its leader stopped), every peer's silence is
//! nearly as long as this node's, while a peer podha still hears was heard a probe interval
//! ago (podha probes every second).
//! - a peer heard: podha works and does not hear this node. **Fence.**
//! - a strict majority of all peers answered and none was heard: podha hears nobody. **Stay.**
//!   (A majority, so a group of nodes cut off together cannot vouch for one another: podha acts
//!   only while it hears most nodes, and two majorities always share a node.)
//! - fewer answers than that and none heard: this node may be on the cut-off side. **Fence.**
//! - no peers at all (the peer list was read, or given, and names no other agent): there is
//!   nowhere to fail over to. **Stay.**
//! - the peer list was never read (the API server has not answered the agent since it
//!   started): the agent cannot know whether it is alone, so nothing shows that podha hears
//!   nobody. **Fence.** (A node cut off from everything must not take its empty list for a
//!   cluster of one.)
//!
//! With a watchdog (see [`super::watchdog`]) the agent also decides whether to pet it: freely
//! while podha never heard it since the node booted, or heard it recently enough that the watchdog, if it stopped now, would fire
//! within the isolation timeout of podha's last hearing; after that only while the peers show
//! that podha hears nobody ([`pet_watchdog`]). A frozen agent pets nothing, so the watchdog
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
    /// Whether this survey already decides: a heard peer, or a majority unheard. The agent
    /// stops asking once it does (a thousand-node cluster needs few answers either way).
    /// `silence`: how long this node has gone unheard, as [`Survey::heard`] takes it.
    pub fn settled(&self, silence: Duration) -> bool {
        self.heard(silence) > 0 || self.majority_answered()
    }

    /// A strict majority of the known peers answered (never, with an unknown list).
    fn majority_answered(&self) -> bool {
        match self.peers {
            PeerCount::Unknown => false,
            PeerCount::Known(peers) => self.answers.len() > peers / 2,
        }
    }

    /// Peers podha heard within half of `silence` (this node's silence, at most the isolation
    /// timeout): when podha stops hearing everybody at once, each peer's silence is nearly as
    /// long as this node's, while a peer podha still hears was heard a probe interval ago.
    fn heard(&self, silence: Duration) -> usize {
        self.answers
            .iter()
            .filter(|a| a.is_some_and(|ago| ago <= silence / 2))
            .count()
    }

    /// podha hears nobody: there are no peers (known: an unknown list shows nothing), or a
    /// strict majority of them answered and none was heard (see the module's rule).
    pub fn nobody_heard(&self, silence: Duration) -> bool {
        self.peers == PeerCount::Known(0) || (self.heard(silence) == 0 && self.majority_answered())
    }
}

/// How long podha has not heard this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// podha has never heard this node since it booted: no probe said podha got an answer,
    /// and the hearing file has no record.
    NeverHeard,
    /// podha last heard this node this long ago.
    For(Duration),
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
/// unheard and knows no peers; fencing then would reboot every node, again and again.
pub fn decide(silence: Silence, timeout: Duration, survey: Option<&Survey>) -> Verdict {
    let not_heard_for = match silence {
        Silence::NeverHeard => {
            return Verdict::Stay(
                "podha has never heard this node since it booted: the agent fences on \
                 isolation only once podha has heard it (an agent podha cannot reach, or a \
                 cluster powering up without its API server, must not reboot its nodes)"
                    .into(),
            );
        }
        Silence::For(not_heard_for) => not_heard_for,
    };
    if not_heard_for < timeout {
        return Verdict::Heard;
    }
    let Some(survey) = survey else {
        return Verdict::Stay("not heard; the peers are not asked yet".into());
    };
    let silent = humantime::format_duration(round_secs(not_heard_for));
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
    let heard = survey.heard(timeout);
    let answered = survey.answers.len();
    if heard > 0 {
        return Verdict::Fence(format!(
            "podha has not heard this node for {silent} but hears {heard} of the {answered} \
             peers that answered"
        ));
    }
    if survey.nobody_heard(timeout) {
        return Verdict::Stay(format!(
            "podha has not heard this node for {silent}, nor any of the {answered} of {peers} \
             peers that answered: podha or the control plane is down, not this node"
        ));
    }
    Verdict::Fence(format!(
        "podha has not heard this node for {silent}, and only {answered} of {peers} peers \
         answered (none heard): this node may be cut off"
    ))
}

/// When the agent surveys its peers: at the isolation timeout, or with a watchdog as soon as
/// stopping to pet it could let it fire before then (`watchdog` earlier), so that a vouching
/// majority is known before the watchdog would reset a healthy node.
pub fn survey_after(timeout: Duration, watchdog: Option<Duration>) -> Duration {
    timeout.saturating_sub(watchdog.unwrap_or_default())
}

/// Whether the agent pets its watchdog (whose timeout is `watchdog`) at this check:
/// - while podha has never heard this node since it booted: no proof can hold for it;
/// - while a watchdog that stopped now would fire within `timeout` of podha's last hearing
///   (`not_heard_for + watchdog <= timeout`): podha's silence proof, which waits `timeout`
///   plus a margin from that hearing, then never sees a node that still runs;
/// - later, only while `survey` shows podha hears nobody (its leader or the control plane is
///   down): nothing is being moved, and a watchdog reset would take a healthy node down.
///
/// A frozen or hung node pets nothing, whatever the rule says.
pub fn pet_watchdog(
    silence: Silence,
    timeout: Duration,
    watchdog: Duration,
    survey: Option<&Survey>,
) -> bool {
    match silence {
        Silence::NeverHeard => true,
        Silence::For(not_heard_for) => {
            not_heard_for.saturating_add(watchdog) <= timeout
                || survey.is_some_and(|s| s.nobody_heard(not_heard_for.min(timeout)))
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
mod tests {
    use super::*;
    use Silence::For;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn only_an_agent_with_a_watchdog_says_when_its_node_is_fenced() {
        assert_eq!(fenced_within(secs(30), Some(secs(10))), Some(secs(30)));
        assert_eq!(fenced_within(secs(30), Some(secs(15))), Some(secs(30)));
        assert_eq!(fenced_within(secs(30), None), None);
    }

    const T: Duration = Duration::from_secs(30);

    fn s(secs: u64) -> Option<Duration> {
        Some(Duration::from_secs(secs))
    }

    fn survey(peers: usize, answers: &[Option<Duration>]) -> Survey {
        Survey {
            peers: PeerCount::Known(peers),
            answers: answers.to_vec(),
        }
    }

    /// What a node that never read its peer list finds: nobody to ask.
    fn unknown_peers() -> Survey {
        Survey {
            peers: PeerCount::Unknown,
            answers: Vec::new(),
        }
    }

    fn fences(v: &Verdict) -> bool {
        matches!(v, Verdict::Fence(_))
    }

    #[test]
    fn a_heard_node_asks_nobody_and_stays() {
        assert_eq!(
            decide(For(Duration::from_secs(29)), T, None),
            Verdict::Heard
        );
    }

    #[test]
    fn a_node_podha_cannot_hear_while_it_hears_a_peer_fences() {
        let v = decide(For(T), T, Some(&survey(9, &[s(40), s(2)])));
        assert!(fences(&v), "{v:?}");
    }

    #[test]
    fn when_podha_hears_nobody_a_majority_of_peers_vouches_and_nobody_fences() {
        // The leader crashed 60 s ago: every agent is unheard, and says so to the others.
        let unheard = [s(61), s(60), None, s(62), s(60)];
        let v = decide(For(Duration::from_secs(60)), T, Some(&survey(9, &unheard)));
        assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
    }

    #[test]
    fn peers_whose_silence_began_with_this_nodes_are_not_heard() {
        // podha's leader stopped 30 s ago; the peers' last probes came up to a second after
        // this node's: they are as unheard as this node, and vouch.
        let v = decide(For(T), T, Some(&survey(4, &[s(29), s(29), s(30)])));
        assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
        let v = decide(For(T), T, Some(&survey(4, &[s(15), s(29), s(30)])));
        assert!(fences(&v), "heard 15 s ago, within half the timeout: {v:?}");
    }

    #[test]
    fn a_minority_cut_off_together_cannot_vouch_for_itself() {
        // Four of ten nodes partitioned with this one: they answer, unheard; the rest of the
        // cluster (heard by podha) is out of reach.
        let v = decide(For(T), T, Some(&survey(9, &[s(31), s(35), s(40), s(33)])));
        assert!(fences(&v), "{v:?}");
    }

    #[test]
    fn a_node_no_peer_answers_fences() {
        let v = decide(For(T), T, Some(&survey(9, &[])));
        assert!(fences(&v), "{v:?}");
    }

    #[test]
    fn a_node_that_knows_it_is_alone_stays() {
        let v = decide(For(Duration::from_secs(600)), T, Some(&survey(0, &[])));
        assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
    }

    #[test]
    fn a_node_that_never_read_its_peer_list_fences() {
        // Cut off from everything since the agent started: the list was never read. An empty
        // list taken for a cluster of one kept such a node up while podha moved its volumes.
        let v = decide(For(T), T, Some(&unknown_peers()));
        assert!(fences(&v), "{v:?}");
        assert!(!unknown_peers().nobody_heard(T));
        assert!(!unknown_peers().settled(T));
    }

    #[test]
    fn a_node_that_never_read_its_peer_list_stops_petting_after_its_free_window() {
        // Petted freely while a stopped watchdog would fire within the timeout...
        assert!(pet_watchdog(
            For(Duration::from_secs(20)),
            T,
            W,
            Some(&unknown_peers())
        ));
        // ...and not after: the unknown list shows nothing, and the watchdog resets the node.
        assert!(!pet_watchdog(
            For(Duration::from_secs(21)),
            T,
            W,
            Some(&unknown_peers())
        ));
        assert!(!pet_watchdog(
            For(Duration::from_secs(600)),
            T,
            W,
            Some(&unknown_peers())
        ));
    }

    #[test]
    fn a_node_podha_never_heard_since_it_booted_stays_and_pets_without_asking() {
        // podha cannot reach it from boot, or the whole cluster powered up with the API server
        // down: nobody has heard it, and its peer list is unknown. No survey is needed.
        for survey in [None, Some(unknown_peers()), Some(survey(9, &[s(1)]))] {
            let v = decide(Silence::NeverHeard, T, survey.as_ref());
            let Verdict::Stay(why) = &v else {
                panic!("{v:?}")
            };
            assert!(
                why.contains("never heard this node since it booted"),
                "{why}"
            );
            assert!(pet_watchdog(Silence::NeverHeard, T, W, survey.as_ref()));
        }
    }

    #[test]
    fn unasked_peers_decide_nothing_yet() {
        let v = decide(For(T), T, None);
        assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
    }

    #[test]
    fn a_survey_settles_on_the_first_heard_peer_or_an_unheard_majority() {
        assert!(!survey(9, &[s(40), s(50)]).settled(T));
        assert!(survey(9, &[s(40), s(1)]).settled(T));
        assert!(!survey(9, &[s(40); 4]).settled(T));
        assert!(survey(9, &[s(40); 5]).settled(T));
        // Exactly half is no majority.
        assert!(!survey(10, &[s(40); 5]).settled(T));
        assert!(survey(10, &[s(40); 6]).settled(T));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_verdict_must_hold_for_two_seconds() {
        let fence = Verdict::Fence("cut off".into());
        let mut c = Confirmation::default();
        assert!(!c.fence_now(&fence, Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!c.fence_now(&fence, Instant::now()));
        // Heard in between: the count starts over.
        assert!(!c.fence_now(&Verdict::Heard, Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!c.fence_now(&fence, Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!c.fence_now(&fence, Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(c.fence_now(&fence, Instant::now()));
    }

    const W: Duration = Duration::from_secs(10);

    #[test]
    fn the_watchdog_is_petted_freely_only_while_it_would_fire_within_the_timeout() {
        assert!(pet_watchdog(For(Duration::from_secs(20)), T, W, None));
        assert!(!pet_watchdog(For(Duration::from_secs(21)), T, W, None));
        assert_eq!(survey_after(T, Some(W)), Duration::from_secs(20));
        assert_eq!(survey_after(T, None), T);
    }

    #[test]
    fn after_that_the_watchdog_is_petted_only_while_podha_hears_nobody() {
        let at = Duration::from_secs(21);
        // podha's leader crashed 21 s ago: every peer as unheard as this node.
        let crashed = survey(4, &[s(21), s(20), s(22)]);
        assert!(pet_watchdog(For(at), T, W, Some(&crashed)));
        // No peers: nowhere to fail over to.
        assert!(pet_watchdog(For(at), T, W, Some(&survey(0, &[]))));
        // A peer heard a second ago: this node alone is unheard; the watchdog may fire.
        let isolated = survey(4, &[s(21), s(1), s(22)]);
        assert!(!pet_watchdog(For(at), T, W, Some(&isolated)));
        // Too few answers to vouch.
        assert!(!pet_watchdog(For(at), T, W, Some(&survey(4, &[s(21)]))));
        // Long past the timeout, the same rule as the fence's (heard within half of it).
        let late = Duration::from_secs(90);
        assert!(pet_watchdog(
            For(late),
            T,
            W,
            Some(&survey(4, &[s(89), s(16), s(90)]))
        ));
        assert!(!pet_watchdog(
            For(late),
            T,
            W,
            Some(&survey(4, &[s(89), s(15), s(90)]))
        ));
    }

    #[test]
    fn before_the_timeout_heard_means_within_half_of_this_nodes_silence() {
        // Surveyed 20 s into a leader crash: the peers' silences began with this node's.
        let at = Duration::from_secs(20);
        assert!(survey(4, &[s(19), s(20), s(21)]).nobody_heard(at));
        assert!(!survey(4, &[s(10), s(20), s(21)]).nobody_heard(at));
    }

    #[test]
    fn the_verdict_holds_at_the_majority_boundary() {
        assert!(fences(&decide(For(T), T, Some(&survey(10, &[s(40); 5])))));
        assert!(!fences(&decide(For(T), T, Some(&survey(10, &[s(40); 6])))));
    }
}
