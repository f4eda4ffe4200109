//! The peer list as the agent reads it from the API server: every other node that advertises
//! an agent, read in pages of [`PAGE`], kept warm while the agent runs ([`keep_warm`]), the
//! last good list kept when a read fails, and saved for the next agent of this boot
//! ([`SavedList`]). Each peer comes with the key it publishes on its Node: the key its answers
//! must verify under, and the one its own questions are answered by.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::PeerListError;
use super::boot::{RecordBoot, write_record};
use crate::contract::{PublicKey, agent_addr, agent_key};

/// How often the peer list is read again from the API server once it is known: every 30 s on
/// average, each agent at a time of its own (from 30 s less half [`REFRESH_JITTER`] to 30 s
/// plus half), so that agents started together do not read in step.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How far the refreshes spread around [`REFRESH`].
const REFRESH_JITTER: Duration = Duration::from_secs(10);
/// How soon a list still unknown (never read, since the agent started) is read again: every
/// 2 s on average, spread as the refreshes are ([`RETRY_JITTER`]). Until the list is known the
/// agent fences when podha stops hearing it, so after a cold start with the API server down
/// every agent must learn its peers as soon as the API server answers, not up to 30 s later.
const RETRY: Duration = Duration::from_secs(2);
/// How far the retries spread around [`RETRY`].
const RETRY_JITTER: Duration = Duration::from_secs(1);
/// The shortest time between two reads when a survey found the list behind (see
/// [`keep_warm`]).
const STALE_REREAD: Duration = Duration::from_secs(5);
/// How many Nodes one page of the peer list holds.
const PAGE: u32 = 500;
/// How long one read of the whole peer list may take (all its pages) once the list is known:
/// a read that hangs is given up and tried again at the next refresh.
const READ_TIMEOUT: Duration = REFRESH;
/// How long the first read of a list still unknown may take, so that an API server that hangs
/// does not hold the next attempt back for [`READ_TIMEOUT`]. Each read of it that runs out
/// doubles the next one's time, up to [`READ_TIMEOUT`], so that a large cluster's list that
/// takes longer to read is still read.
const FIRST_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One peer: another node that advertises an agent, where it listens, and the key its words
/// are signed with (`None`: it publishes none, or a garbled one: it counts as a peer, and no
/// word of it is believed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: String,
    pub addr: SocketAddr,
    pub key: Option<PublicKey>,
}

impl Peer {
    /// `node`'s agent, if it advertises one.
    fn of(node: &Node) -> Option<Self> {
        Some(Self {
            node: node.metadata.name.clone()?,
            addr: agent_addr(node)?,
            key: agent_key(node),
        })
    }

    /// Its line in a saved list: node, address, key (`-` for none).
    fn line(&self) -> String {
        let key = self.key.map_or_else(|| "-".to_string(), |k| k.encode());
        format!("{} {} {key}\n", self.node, self.addr)
    }

    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_whitespace();
        let (node, addr, key) = (fields.next()?, fields.next()?, fields.next()?);
        if fields.next().is_some() {
            return None;
        }
        Some(Self {
            node: node.to_string(),
            addr: addr.parse().ok()?,
            key: match key {
                "-" => None,
                key => Some(PublicKey::parse(key)?),
            },
        })
    }
}

/// The peer list as last read from the API server, and whether reading it fails now.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// `None`: never read. Shared, so that a survey (every second while podha's leader is
    /// down) takes it without copying thousands of peers.
    pub(super) list: Option<Arc<Vec<Peer>>>,
    /// The keys of the list's peers, by node: whose questions this agent answers.
    keys: HashMap<String, PublicKey>,
    /// The peers whose answers a survey found unverified since the list was read: each asks
    /// for one early read, not one per survey.
    found_behind: HashSet<String>,
    /// The last read failed: said once per run of failures, not at every refresh.
    pub(super) failing: bool,
}

impl Kept {
    pub(super) fn new(list: Option<Vec<Peer>>) -> Self {
        let mut kept = Self::default();
        kept.set(list);
        kept
    }

    fn set(&mut self, list: Option<Vec<Peer>>) {
        self.keys = list
            .iter()
            .flatten()
            .filter_map(|p| Some((p.node.clone(), p.key?)))
            .collect();
        self.list = list.map(Arc::new);
        self.found_behind.clear();
    }

    /// A survey found `node`'s answer unverified: whether that asks for an early read (the
    /// first time since the list was read).
    pub(super) fn found_behind(&mut self, node: &str) -> bool {
        self.found_behind.insert(node.to_string())
    }

    /// The key `node`'s agent signs with, as the list says.
    pub(super) fn key_of(&self, node: &str) -> Option<PublicKey> {
        self.keys.get(node).copied()
    }

    /// Takes one read of the list: a good one replaces the list, a failed one keeps it.
    /// Returns whether the read was worth a log line (the first failure of a run of them, the
    /// first good read after one, the first read ever).
    pub(super) fn took(&mut self, read: Result<Vec<Peer>, PeerListError>) -> bool {
        match read {
            Ok(list) => {
                let note = self.failing || self.list.is_none();
                if note {
                    info!(peers = list.len(), "peer list read");
                }
                self.set(Some(list));
                self.failing = false;
                note
            }
            Err(e) => {
                let note = !self.failing;
                if note {
                    match &self.list {
                        Some(list) => {
                            warn!(error = %e, kept = list.len(), "cannot read the peer list; keeping the last one")
                        }
                        None => {
                            warn!(error = %e, "cannot read the peer list, never read yet: until it is, this node is fenced if podha stops hearing it for the isolation timeout")
                        }
                    }
                }
                self.failing = true;
                note
            }
        }
    }
}

/// Reads the peer list now and again into `kept`, for as long as the agent runs: every
/// [`RETRY`] while it is unknown, every [`REFRESH`] once known, each spread by [`jittered`],
/// and sooner (at most every [`STALE_REREAD`]) when `behind` says a survey found the list
/// behind its peers (a listed key that does not verify a peer's answer). A failed read keeps
/// the last good list; a new list is saved in `saved`.
pub(super) async fn keep_warm(
    nodes: &Api<Node>,
    node: &str,
    kept: &Mutex<Kept>,
    saved: &SavedList,
    behind: &Notify,
) {
    // Reads of the unknown list that ran out of time in a row.
    let mut timed_out: u32 = 0;
    for n in 0_u64.. {
        let limit = match lock(kept).list {
            Some(_) => READ_TIMEOUT,
            None => FIRST_READ_TIMEOUT
                .saturating_mul(2_u32.saturating_pow(timed_out))
                .min(READ_TIMEOUT),
        };
        let read = match tokio::time::timeout(limit, list_peers(nodes, node)).await {
            Ok(read) => read.map_err(PeerListError::from),
            Err(_) => Err(PeerListError::TimedOut(limit)),
        };
        timed_out = match read {
            Err(PeerListError::TimedOut(_)) => timed_out.saturating_add(1),
            _ => 0,
        };
        let known = {
            let mut kept = lock(kept);
            let before = kept.list.clone();
            kept.took(read);
            if let Some(list) = kept.list.as_ref().filter(|l| Some(*l) != before.as_ref()) {
                saved.save(list);
            }
            kept.list.is_some()
        };
        let next = if known {
            jittered(REFRESH, REFRESH_JITTER, node, n)
        } else {
            jittered(RETRY, RETRY_JITTER, node, n)
        };
        tokio::time::sleep(STALE_REREAD.min(next)).await;
        let _ = tokio::time::timeout(next.saturating_sub(STALE_REREAD), behind.notified()).await;
    }
}

/// `base`, give or take half of `jitter`: how long node `node` waits after its `n`th read. It
/// differs from node to node and from read to read (a hash of both), so agents that started
/// together drift apart; no random numbers needed.
fn jittered(base: Duration, jitter: Duration, node: &str, n: u64) -> Duration {
    const STEPS: u32 = 1000;
    let step = (spread(&format!("{node}/{n}")) % STEPS as usize) as u32;
    base.saturating_sub(jitter / 2) + jitter * step / STEPS
}

/// The peer list saved beside the hearing file, for the next agent of this boot: an agent
/// restarted while the API server is down (a crash, its container restarted, its pod replaced)
/// then still knows its peers, and their vouching keeps its healthy node up through a
/// control-plane outage. The file lives where the hearing file does and, like it, names the boot
/// it was saved in (`boot=<ID>`, then one peer per line: node, address, key; see
/// [`super::boot`]). A list saved
/// in another boot is no list, and so is one that names no boot (saved before lists named one,
/// or by an agent that could not read its boot ID), one the agent cannot place (it cannot read
/// its own boot ID), or one that cannot be read whole: unknown, as before any read.
pub struct SavedList {
    path: PathBuf,
    /// The boot the agent runs in (`None`: unknown).
    boot: Option<String>,
}

impl SavedList {
    pub fn new(path: PathBuf, boot: Option<&str>) -> Self {
        Self {
            path,
            boot: boot.map(str::to_string),
        }
    }

    pub(super) fn load(&self) -> Option<Vec<Peer>> {
        let file = self.path.display();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn!(%file, error = %e, "cannot read the saved peer list");
                return None;
            }
        };
        let mut lines = text.lines();
        match RecordBoot::of(lines.next(), self.boot.as_deref()) {
            RecordBoot::This => {}
            RecordBoot::Other => {
                info!(%file, "the saved peer list is of another boot; ignored");
                return None;
            }
            RecordBoot::CannotTell => {
                warn!(%file, "cannot tell whether the saved peer list is of this boot; ignored");
                return None;
            }
        }
        let list: Option<Vec<Peer>> = lines.map(Peer::parse).collect();
        match list {
            Some(list) => {
                info!(%file, peers = list.len(), "going on with the peer list the last agent of this boot read");
                Some(list)
            }
            None => {
                warn!(%file, "the saved peer list is garbled (or of an agent that kept no keys); ignored");
                None
            }
        }
    }

    /// Written whole, then renamed over the old file. A failure is logged; the list in memory
    /// stands.
    fn save(&self, list: &[Peer]) {
        let body: String = list.iter().map(Peer::line).collect();
        if let Err(e) = write_record(&self.path, self.boot.as_deref(), &body) {
            warn!(file = %self.path.display(), error = %e, "cannot save the peer list for the next agent");
        }
    }
}

/// The value behind `m`, even after a panic while it was held: every value the agent keeps behind
/// a lock (a hearing, a peer list, a key, the challenges) is changed in steps that each leave it
/// whole, so the agent goes on from it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A number derived from the node's name (FNV-1a), to start each node's survey elsewhere.
pub(super) fn spread(node: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as usize
}

/// Every other Node's agent, read in pages of [`PAGE`].
async fn list_peers(nodes: &Api<Node>, me: &str) -> Result<Vec<Peer>, kube::Error> {
    let mut peers = Vec::new();
    each_page(nodes, |page| {
        peers.extend(
            page.iter()
                .filter(|n| n.metadata.name.as_deref() != Some(me))
                .filter_map(Peer::of),
        );
    })
    .await?;
    Ok(peers)
}

/// Reads every Node in pages of [`PAGE`], handing each page to `take` (so that a large
/// cluster's Nodes need not all be held at once).
pub(super) async fn each_page(
    nodes: &Api<Node>,
    mut take: impl FnMut(Vec<Node>),
) -> Result<(), kube::Error> {
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = nodes.list(&params).await?;
        take(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_between_reads_differ_from_node_to_node_and_read_to_read_within_their_bounds() {
        let waits = |node: &str| -> Vec<Duration> {
            (0..20)
                .map(|n| jittered(REFRESH, REFRESH_JITTER, node, n))
                .collect()
        };
        let (a, b) = (waits("node-a"), waits("node-b"));
        let bounds = Duration::from_secs(25)..=Duration::from_secs(35);
        assert!(
            a.iter().chain(&b).all(|w| bounds.contains(w)),
            "{a:?} {b:?}"
        );
        assert_ne!(a, b, "two nodes do not read in step");
        assert!(
            a.windows(2).any(|w| w[0] != w[1]),
            "one node's waits vary: {a:?}"
        );
        let retry = jittered(RETRY, RETRY_JITTER, "node-a", 0);
        assert!(retry >= Duration::from_millis(1500) && retry <= Duration::from_millis(2500));
    }

    fn addr(last: u8) -> Peer {
        let key = last
            .is_multiple_of(2)
            .then(|| crate::contract::Identity::generate().expect("key").public());
        Peer {
            node: format!("n{last}"),
            addr: SocketAddr::from(([10, 0, 0, last], 9441)),
            key,
        }
    }

    fn failed() -> Result<Vec<Peer>, PeerListError> {
        Err(PeerListError::TimedOut(READ_TIMEOUT))
    }

    #[test]
    fn a_list_never_read_stays_unknown_and_a_failed_read_keeps_the_last_good_one() {
        let mut kept = Kept::default();
        assert!(kept.took(failed()), "the first failure is said");
        assert!(!kept.took(failed()), "the next ones are not");
        assert_eq!(kept.list, None, "never read: unknown, not empty");
        assert!(
            kept.took(Ok(vec![addr(2), addr(3)])),
            "the first read is said"
        );
        let (two, three) = (addr(2), addr(3));
        assert!(!kept.took(Ok(vec![two.clone(), three.clone()])));
        assert_eq!(kept.key_of("n2"), two.key, "a peer's key");
        assert_eq!(kept.key_of("n3"), None, "a peer that publishes none");
        assert!(!kept.took(Ok(vec![three.clone()])));
        assert_eq!(kept.key_of("n2"), None, "no longer a peer");
        assert!(kept.took(failed()));
        assert!(!kept.took(failed()));
        assert_eq!(
            kept.list.as_deref(),
            Some(&vec![three]),
            "the last good list is kept"
        );
        assert!(kept.took(Ok(Vec::new())), "read again after failures: said");
        assert_eq!(
            kept.list.as_deref(),
            Some(&Vec::new()),
            "read, and nobody else: known empty"
        );
    }

    #[test]
    fn a_saved_list_counts_only_in_the_boot_it_was_saved_in() {
        let dir = std::env::temp_dir().join(format!("podha-peers-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard.peers");
        let (two, three) = (addr(2), addr(3));
        let two_key = two.key.expect("a key").encode();
        SavedList::new(path.clone(), Some("b1")).save(&[two.clone(), three.clone()]);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text,
            format!("boot=b1\nn2 10.0.0.2:9441 {two_key}\nn3 10.0.0.3:9441 -\n")
        );
        let load = |boot: Option<&str>| SavedList::new(path.clone(), boot).load();
        assert_eq!(
            load(Some("b1")),
            Some(vec![two.clone(), three.clone()]),
            "this boot"
        );
        assert_eq!(load(Some("b2")), None, "another boot: no list");
        assert_eq!(load(None), None, "the agent's own boot unknown: no list");
        // Saved before lists named their boot, or by an agent without a boot ID.
        std::fs::write(&path, "10.0.0.2:9441\n").expect("write");
        assert_eq!(load(Some("b1")), None, "addresses only");
        std::fs::write(&path, "boot=b1\n10.0.0.2:9441\n").expect("write");
        assert_eq!(load(Some("b1")), None, "saved before peers had keys");
        std::fs::write(&path, "boot=b1\nn2 10.0.0.2:9441 garbled\n").expect("write");
        assert_eq!(load(Some("b1")), None, "a garbled key");
        SavedList::new(path.clone(), None).save(&[two]);
        assert_eq!(load(Some("b1")), None, "an empty boot");
        // Known empty is a list too.
        SavedList::new(path.clone(), Some("b1")).save(&[]);
        assert_eq!(load(Some("b1")), Some(Vec::new()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
