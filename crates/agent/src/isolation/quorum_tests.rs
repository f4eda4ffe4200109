//! The agent's rule against podha's quorum: an agent stays up only where podha cannot prove
//! its silence (even with one agent more than its list names, or an older podha), and fences
//! where podha may, or at an exact tie. Every split of the peers into heard, unheard and
//! unanswered for clusters of one to seven agents, and a thousand agents of which the leader
//! hears any number.

use std::time::Duration;

use super::{PeerCount, Silence, Survey, Verdict, decide, pet_watchdog};
use crate::contract::silence_counts_among;

const TIMEOUT: Duration = Duration::from_secs(40);
const WATCHDOG: Duration = Duration::from_secs(10);

/// How long ago podha heard a peer it hears: well within half the timeout.
fn heard_ago(i: usize) -> Option<Duration> {
    Some(Duration::from_millis(300 * (i % 4) as u64))
}

/// How long ago podha heard a peer it does not hear (or never, since that agent started):
/// past half the timeout.
fn unheard_ago(i: usize) -> Option<Duration> {
    (!i.is_multiple_of(5)).then(|| TIMEOUT / 2 + Duration::from_secs((i % 60) as u64 + 1))
}

fn survey(peers: usize, heard: usize, unheard: usize) -> Survey {
    let answers = (0..heard)
        .map(heard_ago)
        .chain((0..unheard).map(unheard_ago))
        .collect();
    Survey {
        peers: PeerCount::Known(peers),
        answers,
    }
}

fn stays(verdict: &Verdict) -> bool {
    match verdict {
        Verdict::Stay(_) => true,
        Verdict::Fence(_) => false,
        Verdict::Heard => panic!("a node unheard for the timeout is not heard"),
    }
}

/// How many peers must be shown unheard for an agent to stay, by the number of agents in the
/// cluster: half of the peers, rounded up.
const UNHEARD_PEERS_TO_STAY: [(usize, usize); 7] =
    [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (6, 3), (7, 3)];

/// Every split of the peers of one to seven agents: (agents, peers to stay, heard, unheard).
fn splits() -> impl Iterator<Item = (usize, usize, usize, usize)> {
    UNHEARD_PEERS_TO_STAY
        .into_iter()
        .flat_map(|(agents, to_stay)| {
            (0..agents).flat_map(move |heard| {
                (0..agents - heard).map(move |unheard| (agents, to_stay, heard, unheard))
            })
        })
}

#[test]
fn every_split_of_one_to_seven_agents_stays_only_where_podha_cannot_prove_the_silence() {
    for (agents, to_stay, heard, unheard) in splits() {
        let peers = agents - 1;
        let unanswered = peers - heard - unheard;
        let split =
            format!("{agents} agents: {heard} heard, {unheard} unheard, {unanswered} unanswered");
        let survey = survey(peers, heard, unheard);
        let verdict = decide(Silence::For(TIMEOUT), TIMEOUT, Some(&survey), None);
        assert_eq!(stays(&verdict), unheard >= to_stay, "{split}: {verdict:?}");
        // podha hears at most the heard peers and those that did not answer.
        let podha_may_prove = silence_counts_among(heard + unanswered, peers);
        if stays(&verdict) {
            assert!(!podha_may_prove, "{split}: stays, yet podha may prove it");
            // Nor with one agent more, heard, that the agent's list does not name yet.
            assert!(
                !silence_counts_among(heard + unanswered + 1, peers + 1),
                "{split}: stays, yet podha may prove it with one agent more"
            );
            // Nor a podha from before this rule (a strict majority of the others), as during
            // an upgrade.
            assert!(
                (heard + unanswered) * 2 <= peers,
                "{split}: stays, yet an older podha may prove it"
            );
        } else if !podha_may_prove {
            // Only at an exact tie does an agent fence what podha cannot prove.
            assert_eq!(
                2 * (1 + unheard),
                agents,
                "{split}: fences, though podha cannot prove it"
            );
        }
        // Past the free window, the watchdog is petted exactly while the agent stays.
        let pets = pet_watchdog(
            Silence::For(TIMEOUT),
            TIMEOUT,
            WATCHDOG,
            Some(&survey),
            None,
        );
        assert_eq!(pets, stays(&verdict), "{split}");
    }
}

#[test]
fn a_survey_that_stops_where_it_settles_decides_as_the_whole_survey() {
    for (agents, _, heard, unheard) in splits() {
        let peers = agents - 1;
        let whole = survey(peers, heard, unheard);
        let full = stays(&decide(Silence::For(TIMEOUT), TIMEOUT, Some(&whole), None));
        // The answers in either order, cut where the survey would stop.
        for reversed in [false, true] {
            let mut answers = whole.answers.clone();
            if reversed {
                answers.reverse();
            }
            let mut prefix = Survey {
                peers: whole.peers,
                answers: Vec::new(),
            };
            for answer in answers {
                if prefix.settled(TIMEOUT) {
                    break;
                }
                prefix.answers.push(answer);
            }
            let cut = stays(&decide(Silence::For(TIMEOUT), TIMEOUT, Some(&prefix), None));
            assert_eq!(
                cut,
                full,
                "{agents} agents, {heard} heard, {unheard} unheard: stopped at {} \
                         answers",
                prefix.answers.len()
            );
        }
    }
}

/// One thousand agents, every one reaching every other; podha's leader hears `k` of them (a
/// spread of them, not the first `k`) and has not heard the others for longer than the
/// isolation timeout. Each unheard agent learns from every peer how long ago podha heard it
/// (where its survey would stop early, it decides the same: see the test above).
struct Fleet {
    /// For each agent, how long ago podha heard it.
    ago: Vec<Option<Duration>>,
    heard: usize,
}

impl Fleet {
    const SIZE: usize = 1000;

    fn hearing(k: usize) -> Self {
        // 7919 is prime to 1000: i ↦ 7919·i mod 1000 spreads the heard agents over the fleet.
        let ago = (0..Self::SIZE)
            .map(|i| {
                if (i * 7919) % Self::SIZE < k {
                    heard_ago(i)
                } else {
                    unheard_ago(i)
                }
            })
            .collect();
        Self { ago, heard: k }
    }

    /// What agent `me` learns from all the others.
    fn survey_by(&self, me: usize) -> Survey {
        let mut answers = Vec::with_capacity(Self::SIZE - 1);
        answers.extend_from_slice(&self.ago[..me]);
        answers.extend_from_slice(&self.ago[me + 1..]);
        Survey {
            peers: PeerCount::Known(Self::SIZE - 1),
            answers,
        }
    }

    /// How many agents fence their node, and how many silences podha could prove.
    fn fenced_and_provable(&self) -> (usize, usize) {
        let podha_proves = silence_counts_among(self.heard, Self::SIZE - 1);
        let (mut fenced, mut provable) = (0, 0);
        for me in (0..Self::SIZE).filter(|i| (i * 7919) % Self::SIZE >= self.heard) {
            let survey = self.survey_by(me);
            let verdict = decide(Silence::For(TIMEOUT * 2), TIMEOUT, Some(&survey), None);
            fenced += usize::from(!stays(&verdict));
            provable += usize::from(podha_proves);
        }
        (fenced, provable)
    }
}

#[test]
fn of_a_thousand_agents_no_more_fence_than_podha_could_prove_but_at_the_exact_tie() {
    for k in 0..=Fleet::SIZE {
        let (fenced, provable) = Fleet::hearing(k).fenced_and_provable();
        if 2 * k == Fleet::SIZE {
            // Half heard: podha proves nothing, and the other half fences (the tie has no
            // room for a peer list one node behind podha's: see `stays_with`).
            assert_eq!((fenced, provable), (Fleet::SIZE - k, 0), "podha hears {k}");
            continue;
        }
        // Every silence podha could prove is one whose agent fenced, and no other agent
        // fenced.
        assert_eq!(fenced, provable, "podha hears {k}");
    }
}
