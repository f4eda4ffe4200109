//! Whether this agent reaches its peers while nothing is wrong: a few of them asked every
//! [`CHECK_EVERY`], in turn, with the survey's own signed question.
//!
//! Why: on isolation the agent stays up only when at least half of its peers answer that
//! podha does not hear them either ([`super::super::isolation::stays_with`]). An agent that
//! cannot reach half of its peers (their port blocked by a NetworkPolicy or a firewall while
//! podha still reaches every agent) could never show that, so the next outage of podha or of
//! the API server longer than the isolation timeout would reboot its node, and with a mesh
//! blocked everywhere, every node. The check finds it beforehand: the agent says so on its
//! Lease ([`crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION`]), podha holds its node (it
//! counts no silence of it, and tells the agent, which then fences nothing on isolation) and
//! reports it, and the agent's metrics show it.
//!
//! A round that reached fewer than half of the peers it asked is not enough: two rounds in a
//! row must, so that a peer's restart or one lost answer changes nothing.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tracing::{info, warn};

use super::{Peers, in_turn};
use crate::agent::counters;
use crate::agent::peer_list::{lock, spread};

/// How often the agent checks its reach.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);
/// Peers asked in one round, at most: every peer of a cluster of up to 9 nodes each round; in
/// a larger one the next ones in this node's order, so that every peer is asked in turn. At
/// 5,000 nodes, the whole cluster asks some 1,300 questions a second, each agent answering
/// about one every 4 s.
pub const PEERS_PER_ROUND: usize = 8;

/// One round of the check: how many peers were asked, and how many answered with a word their
/// key verifies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub asked: usize,
    pub answered: usize,
}

impl Round {
    /// Whether peers that answer this way could keep this node up on isolation: a survey
    /// stays only when at least half of the peers answer (that podha does not hear them), so
    /// fewer than half answering could never. A round that asked nobody (no other node)
    /// shows nothing wrong.
    pub const fn could_show(&self) -> bool {
        self.answered * 2 >= self.asked
    }
}

/// What the agent says of its reach, from its last two rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    last: Option<Round>,
    unreachable: Option<Round>,
}

impl Reach {
    /// Takes the round just done; returns whether what the agent says changed.
    pub fn take(&mut self, round: Round) -> bool {
        let before = self.unreachable.is_some();
        let twice = !round.could_show() && self.last.is_some_and(|l| !l.could_show());
        self.unreachable = twice.then_some(round);
        self.last = Some(round);
        before != twice
    }

    /// The last round, if two rounds in a row reached fewer than half of the peers they asked:
    /// the agent cannot show podha hears no majority on isolation.
    pub const fn unreachable(&self) -> Option<Round> {
        self.unreachable
    }

    /// The last round done, if any.
    pub const fn last(&self) -> Option<Round> {
        self.last
    }
}

/// What the agent's Lease says of an unreachable peer set: how many of the peers asked
/// answered in the last round, as `"answered/asked"`.
pub fn lease_value(round: Round) -> String {
    format!("{}/{}", round.answered, round.asked)
}

/// The reach as the agent's Lease and metrics read it.
pub type SharedReach = std::sync::Arc<std::sync::Mutex<Reach>>;

impl Peers {
    /// One round: the next [`PEERS_PER_ROUND`] peers in this node's order from `turn` (moved
    /// past them), asked at once. `None` while the peer list was never read: nobody to ask.
    pub async fn check_reach(&self, turn: &mut usize) -> Option<Round> {
        let (peers, first) = self.kept()?;
        let asked = PEERS_PER_ROUND.min(peers.len());
        let start = if peers.is_empty() {
            0
        } else {
            (first + *turn) % peers.len()
        };
        *turn = turn.wrapping_add(asked);
        let answered = in_turn(&peers, start)
            .take(asked)
            .map(|peer| self.ask(peer))
            .collect::<FuturesUnordered<_>>()
            .filter(|answer| std::future::ready(answer.is_some()))
            .count()
            .await;
        Some(Round { asked, answered })
    }

    /// Checks the reach every [`CHECK_EVERY`] (the first at a time of this node's own, so
    /// that agents started together do not ask at once) for as long as the agent runs,
    /// keeping what it found ([`Peers::reach`]), and saying it in the log and the metrics.
    pub async fn keep_reach_checked(&self) {
        let offset = (spread(&self.me) % 1000) as u64 * CHECK_EVERY.as_millis() as u64 / 1000;
        tokio::time::sleep(Duration::from_millis(offset)).await;
        let mut turn = 0;
        let mut every = tokio::time::interval(CHECK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(round) = self.check_reach(&mut turn).await else {
                continue;
            };
            counters::peer_check(round.asked, round.answered);
            let (changed, unreachable) = {
                let mut reach = lock(&self.reach);
                (reach.take(round), reach.unreachable())
            };
            counters::peers_reachable(unreachable.is_none());
            match unreachable {
                Some(r) if changed => warn!(
                    answered = r.answered,
                    asked = r.asked,
                    "fewer than half of the peers asked answered, twice in a row: on isolation \
                     this agent could not show that podha hears no majority, so podha holds \
                     this node (see podha.io/agent-peers-unreachable on the agent's Lease)"
                ),
                None if changed => info!(
                    answered = round.answered,
                    asked = round.asked,
                    "the peers answer again"
                ),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(answered: usize, asked: usize) -> Round {
        Round { asked, answered }
    }

    #[test]
    fn a_round_could_show_when_at_least_half_of_the_peers_asked_answer() {
        for (answered, asked, could) in [
            (0, 0, true),
            (0, 1, false),
            (1, 1, true),
            (1, 2, true),
            (0, 2, false),
            (3, 8, false),
            (4, 8, true),
            (8, 8, true),
        ] {
            assert_eq!(
                round(answered, asked).could_show(),
                could,
                "{answered} of {asked}"
            );
        }
    }

    #[test]
    fn unreachable_only_after_two_short_rounds_in_a_row() {
        let mut reach = Reach::default();
        assert!(!reach.take(round(0, 8)), "one round is not enough");
        assert_eq!(reach.unreachable(), None);
        assert!(reach.take(round(1, 8)), "two in a row");
        assert_eq!(reach.unreachable(), Some(round(1, 8)));
        assert!(!reach.take(round(2, 8)), "still");
        assert_eq!(
            reach.unreachable(),
            Some(round(2, 8)),
            "the last round is said"
        );
        assert!(reach.take(round(4, 8)), "half answered: reachable at once");
        assert_eq!(reach.unreachable(), None);
        // A short round between good ones changes nothing.
        assert!(!reach.take(round(0, 8)));
        assert!(!reach.take(round(8, 8)));
        assert!(!reach.take(round(0, 8)));
        assert_eq!(reach.unreachable(), None);
        assert_eq!(reach.last(), Some(round(0, 8)));
        assert_eq!(lease_value(round(1, 8)), "1/8");
    }
}
