//! Whether this agent reaches its peers while nothing is wrong: a few of them asked every
//! [`CHECK_EVERY`], in turn, with the survey's own signed question. A peer whose port answers
//! at all is reached, its own word or not: a peer whose list does not name this agent yet
//! (a node just added, the first half minute of a cluster) refuses it for a while, and that
//! must not hold a node; only no answer in time (the port blocked, the node down) counts
//! against it.
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
//! One round decides nothing: two rounds in a row that reached fewer than half of the peers
//! they asked make the agent say it cannot reach them, and two in a row that reached half or
//! more take it back, so that a peer's restart or one lost answer changes nothing. A round's
//! peers are spread over this node's order of the list (names often follow zones or
//! subnets), and move on by one each round, so that every peer is asked in turn.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tracing::{info, warn};

use super::{Asked, Peers, in_turn};
use crate::boot::{RecordBoot, write_record};
use crate::contract::{parse_peer_count, peer_count_value};
use crate::counters;
use crate::peer_list::{lock, spread};

/// How often the agent checks its reach.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);
/// Peers asked in one round, at most: every peer of a cluster of up to 9 nodes each round; in
/// a larger one peers spread over the list, so that every peer is asked in turn. At
/// 5,000 nodes, the whole cluster asks some 1,300 questions a second, each agent answering
/// about one every 4 s.
pub const PEERS_PER_ROUND: usize = 8;

/// One round of the check: how many peers were asked, and how many answered at all.
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
    /// What an earlier agent of this boot said (see [`SavedReach`]): unreachable, as of
    /// `round`, until two rounds of this one reach half of their peers.
    pub const fn resumed(round: Round) -> Self {
        Self {
            last: Some(round),
            unreachable: Some(round),
        }
    }

    /// Takes the round just done; returns whether what the agent says changed.
    pub fn take(&mut self, round: Round) -> bool {
        let agree = self
            .last
            .is_some_and(|l| l.could_show() == round.could_show());
        let before = self.unreachable.is_some();
        let after = if agree { !round.could_show() } else { before };
        // While it says so, it says the last round that could not show.
        self.unreachable = match (after, round.could_show()) {
            (false, _) => None,
            (true, false) => Some(round),
            (true, true) => self.unreachable.or(Some(round)),
        };
        self.last = Some(round);
        before != after
    }

    /// The last round that reached fewer than half of the peers it asked, while the agent says
    /// it cannot reach them (two such rounds in a row, and not two in a row that reached half
    /// since): on isolation it could not show that podha hears no majority.
    pub const fn unreachable(&self) -> Option<Round> {
        self.unreachable
    }

    /// The last round done, if any.
    pub const fn last(&self) -> Option<Round> {
        self.last
    }
}

/// Where the agent keeps what it says of its reach for the next agent of this boot (a crash,
/// a rollout): beside the hearing file, `boot=<ID>` then `<answered>/<asked>` of the last round
/// while it says it cannot reach its peers, nothing more while it can. Without it, a
/// restarted agent's first renewal would take the word off its Lease, podha would let go of
/// its node, and for the minute its first two rounds take an outage would reboot it. A record
/// of another boot, or one it cannot place or read, is none: reachable, as podha saw the
/// agent before it ever said otherwise.
pub struct SavedReach {
    path: PathBuf,
    boot: Option<String>,
}

impl SavedReach {
    pub fn new(path: PathBuf, boot: Option<&str>) -> Self {
        Self {
            path,
            boot: boot.map(str::to_string),
        }
    }

    /// What the last agent of this boot said, if it said it cannot reach its peers.
    pub fn load(&self) -> Reach {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Reach::default();
        };
        let mut lines = text.lines();
        if RecordBoot::of(lines.next(), self.boot.as_deref()) != RecordBoot::This {
            return Reach::default();
        }
        let round = lines
            .next()
            .and_then(parse_peer_count)
            .map(|(answered, asked)| Round { asked, answered });
        match round {
            Some(round) => {
                info!(
                    answered = round.answered,
                    asked = round.asked,
                    "the last agent of this boot could not reach its peers: going on from there"
                );
                Reach::resumed(round)
            }
            None => Reach::default(),
        }
    }

    /// Keeps `reach` for the next agent; a failure is logged.
    fn save(&self, reach: &Reach) {
        let body = reach
            .unreachable()
            .map_or_else(String::new, |r| format!("{}\n", lease_value(r)));
        if let Err(e) = write_record(&self.path, self.boot.as_deref(), &body) {
            warn!(file = %self.path.display(), error = %e, "cannot save the peer reach for the next agent");
        }
    }
}

/// What the agent's Lease says of an unreachable peer set: how many of the peers asked
/// answered in the last round, as `"answered/asked"`.
pub fn lease_value(round: Round) -> String {
    peer_count_value(round.answered, round.asked)
}

/// The reach as the agent's Lease and metrics read it.
pub type SharedReach = std::sync::Arc<std::sync::Mutex<Reach>>;

impl Peers {
    /// These peers keeping what the agent says of its reach in `saved` for the next agent of
    /// this boot, and going on from what the last one said (read now, before the Lease is
    /// first renewed, so that a restart does not take the word off it).
    pub fn keeping_reach(mut self, saved: SavedReach) -> Self {
        let resumed = saved.load();
        *lock(&self.reach) = resumed;
        counters::peers_reachable(resumed.unreachable().is_none());
        self.saved_reach = Some(saved);
        self
    }

    /// One round (the `turn`th, moved on by one): [`PEERS_PER_ROUND`] peers evenly spread
    /// over this node's order of the list, from the `turn`th on, asked at once. `None` while
    /// the peer list was never read: nobody to ask.
    pub async fn check_reach(&self, turn: &mut usize) -> Option<Round> {
        let (peers, first) = self.kept()?;
        let asked = PEERS_PER_ROUND.min(peers.len());
        let order: Vec<&super::Peer> = in_turn(&peers, first).collect();
        let n = order.len();
        let at = *turn;
        *turn = turn.wrapping_add(1);
        // `i * n / asked`: distinct and evenly spaced, as `asked <= n` (no peer: none asked).
        let chosen = (0..asked).map(|i| order[(at + i * n / asked) % n]);
        let answered = chosen
            .map(|peer| self.ask_peer(peer))
            .collect::<FuturesUnordered<_>>()
            .filter(|asked| std::future::ready(!matches!(asked, Asked::Nothing)))
            .count()
            .await;
        Some(Round { asked, answered })
    }

    /// Checks the reach every [`CHECK_EVERY`] (the first at a time of this node's own, so
    /// that agents started together do not ask at once) for as long as the agent runs,
    /// keeping what it found ([`Peers::reach`], and for the next agent of this boot: see
    /// [`Peers::keeping_reach`]), and saying it in the log and the metrics.
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
            if let Some(saved) = self.saved_reach.as_ref().filter(|_| changed) {
                saved.save(&lock(&self.reach));
            }
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
    fn two_rounds_in_a_row_change_what_the_agent_says() {
        let mut reach = Reach::default();
        assert!(!reach.take(round(0, 8)), "one round is not enough");
        assert_eq!(reach.unreachable(), None);
        assert!(reach.take(round(1, 8)), "two in a row");
        assert_eq!(reach.unreachable(), Some(round(1, 8)));
        assert!(
            !reach.take(round(4, 8)),
            "one good round is not enough either"
        );
        assert_eq!(
            reach.unreachable(),
            Some(round(1, 8)),
            "the last short round is said"
        );
        assert!(!reach.take(round(2, 8)));
        assert_eq!(reach.unreachable(), Some(round(2, 8)));
        assert!(!reach.take(round(4, 8)));
        assert!(reach.take(round(8, 8)), "two good rounds in a row");
        assert_eq!(reach.unreachable(), None);
        // A short round between good ones changes nothing.
        assert!(!reach.take(round(0, 8)));
        assert!(!reach.take(round(8, 8)));
        assert!(!reach.take(round(0, 8)));
        assert_eq!(reach.unreachable(), None);
        assert_eq!(reach.last(), Some(round(0, 8)));
        assert_eq!(lease_value(round(1, 8)), "1/8");
        // Resumed from an earlier agent of this boot: unreachable until two good rounds.
        let mut resumed = Reach::resumed(round(1, 8));
        assert!(!resumed.take(round(8, 8)));
        assert!(resumed.take(round(8, 8)));
    }

    #[test]
    fn the_next_agent_of_this_boot_goes_on_from_what_this_one_said() {
        let dir = std::env::temp_dir().join(format!("podha-reach-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard.reach");
        let saved = SavedReach::new(path.clone(), Some("b1"));
        assert_eq!(saved.load(), Reach::default(), "nothing saved");
        saved.save(&Reach::resumed(round(1, 8)));
        assert_eq!(saved.load(), Reach::resumed(round(1, 8)));
        let next_boot = SavedReach::new(path.clone(), Some("b2"));
        assert_eq!(next_boot.load(), Reach::default(), "another boot");
        let unplaced = SavedReach::new(path.clone(), None);
        assert_eq!(unplaced.load(), Reach::default(), "a boot it cannot tell");
        saved.save(&Reach::default());
        assert_eq!(saved.load(), Reach::default(), "reachable again");
        std::fs::write(&path, "boot=b1\nmany\n").expect("write");
        assert_eq!(saved.load(), Reach::default(), "garbled");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
