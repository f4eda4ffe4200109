//! The key podha's leader signs its heartbeats with, as the agent last saw it on the leader
//! Lease ([`LEADER_KEY_ANNOTATION`]; only podha may write that Lease).
//!
//! The agent watches that one Lease: a new leader publishes its key as it takes the Lease, and
//! the agents see it within a round trip. A heartbeat that does not verify causes no read (a
//! process hammering the agent must not make it hammer the API server). Until the new key
//! arrives the agent counts the new leader's heartbeats as none; if it cannot watch the Lease
//! at all (the API server is down or out of its reach), it goes on with the last key it saw: a
//! leader elected meanwhile is not heard, and the agent's peers decide as when podha's leader
//! is down.
//!
//! A Lease without a key is held by a podha from before signed heartbeats (an upgrade under
//! way), or one about to write it: the agent refuses that leader's heartbeats, and the leader
//! proves no silence of an agent it cannot hear. A new agent starts never heard from an old
//! agent's hearing record (see `super::hearing_file`), so it does not fence meanwhile.
//!
//! The same watch follows the leadership term the Lease shows (`leaseTransitions`, raised with
//! every acquisition): podha signs its term into each heartbeat, so an agent that sees a later
//! term than the one that last heard it knows a new leader has not heard it yet (see
//! `super::isolation::Renewing`). A Lease that cannot be watched leaves the term last seen;
//! one deleted leaves none (and a recreated one starts again from zero): the agent then knows
//! of no later term, which is the side that fences.
//!
//! A watch that failed (the API server restarted, say) comes back after its backoff, up to
//! half a minute later, and the agent may meanwhile be unheard by a new leader it does not know
//! of: judged against the old term, its silence would look counted, and its watchdog would reset
//! a running node. So until the watch has listed the Lease again (or delivered an event), an
//! agent about to decide on its silence reads the Lease itself, beside its peer survey
//! ([`LeaderKey::refresh_if_stale`]): only agents unheard long enough to survey read, at most
//! once per [`READ_EVERY`]. A read the watch overtook is dropped.
//!
//! The key read last is kept beside the hearing file (`<file>.leader-key`), as a record naming
//! its boot (see [`super::boot`]): an agent restarted while the API server is down goes on
//! trusting the leader its predecessor trusted, and so stays heard.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use super::boot::{RecordBoot, write_record};
use super::peer_list::lock;
use crate::contract::{LEADER_KEY_ANNOTATION, PublicKey, lease_term};

#[derive(Debug, Default)]
pub struct LeaderKey {
    key: Mutex<Option<PublicKey>>,
    /// The leadership term the Lease showed last (`None`: no Lease seen, or it was deleted).
    term: Mutex<Option<u64>>,
    /// Told whenever the term changes: the agent's Lease is renewed at once (see
    /// `super::advert`).
    term_changed: std::sync::Arc<tokio::sync::Notify>,
    /// Where the key read last is kept for the next agent of this boot (`None`: nowhere).
    kept: Option<(PathBuf, Option<String>)>,
    /// The watch listed the Lease, or delivered an event, since it last failed (false until
    /// its first list: what is held may be stale).
    fresh: std::sync::atomic::AtomicBool,
    /// Bumped with every event of the watch: a read that began before one is dropped.
    events: std::sync::atomic::AtomicU64,
    /// The Lease watched (its namespace and name), once the watch started.
    watched: std::sync::OnceLock<(Api<Lease>, String)>,
    /// When the Lease was last read by name (see [`LeaderKey::refresh_if_stale`]).
    last_read: Mutex<Option<tokio::time::Instant>>,
    /// The last read by name failed.
    read_failing: std::sync::atomic::AtomicBool,
}

/// How often an agent reads the leader Lease by name at most, while its watch is failing: a
/// decision on its silence comes every check (a second), and thousands of agents may be
/// deciding at once after an API-server restart.
const READ_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

impl LeaderKey {
    /// A leader key known from the start (tests).
    pub fn known(key: PublicKey) -> Self {
        Self {
            key: Mutex::new(Some(key)),
            ..Self::default()
        }
    }

    /// The key an earlier agent of boot `boot` kept at `path`, if any, kept there again when it
    /// changes.
    pub fn kept_at(path: PathBuf, boot: Option<&str>) -> Self {
        let key = load(&path, boot);
        if let Some(key) = key {
            info!(file = %path.display(), %key, "going on with the leader key the last agent of this boot read");
        }
        Self {
            key: Mutex::new(key),
            kept: Some((path, boot.map(str::to_string))),
            ..Self::default()
        }
    }

    /// The key heartbeats must be signed with, if the agent read one.
    pub fn current(&self) -> Option<PublicKey> {
        *lock(&self.key)
    }

    /// The leadership term the leader Lease showed last, if any.
    pub fn term(&self) -> Option<u64> {
        *lock(&self.term)
    }

    /// What is told whenever the term changes.
    pub fn term_changed(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.term_changed.clone()
    }

    /// Takes the Lease as seen (`None`: there is none): its key replaces the one held (a Lease
    /// without one leaves it), and its term the one held.
    fn saw(&self, lease: Option<&Lease>) {
        self.took(lease.and_then(published_key));
        self.seen_in_term(lease.map(|l| lease_term(l.spec.as_ref())));
    }

    /// The leader Lease shows `term` (`None`: there is none).
    pub(super) fn seen_in_term(&self, term: Option<u64>) {
        let mut held = lock(&self.term);
        if *held != term {
            info!(?term, "podha's leader Lease shows a new leadership term");
            *held = term;
            self.term_changed.notify_one();
        }
    }

    /// A key replaces the one held; none leaves it.
    fn took(&self, published: Option<PublicKey>) {
        let Some(key) = published else { return };
        let mut held = lock(&self.key);
        if *held != Some(key) {
            info!(%key, "podha's leader signs with a new key");
            *held = Some(key);
            if let Some((path, boot)) = &self.kept
                && let Err(e) = write_record(path, boot.as_deref(), &format!("{key}\n"))
            {
                warn!(file = %path.display(), error = %e, "cannot keep the leader key for the next agent");
            }
        }
    }

    /// Watches the Lease `name` for as long as the agent runs; a watch that fails is tried
    /// again with backoff, the last key kept meanwhile. A list that finds no Lease is taken as
    /// its deletion.
    pub async fn keep_watching(&self, leases: Api<Lease>, name: &str) {
        let _ = self.watched.set((leases.clone(), name.to_string()));
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(leases, config).default_backoff());
        let mut failing = false;
        let mut listed = false;
        while let Some(event) = events.next().await {
            // What the Lease was: `Init` alone says nothing of it (a failing relist starts one
            // every backoff), and must not drop a read meanwhile.
            if matches!(
                event,
                Ok(watcher::Event::Apply(_)
                    | watcher::Event::Delete(_)
                    | watcher::Event::InitApply(_)
                    | watcher::Event::InitDone)
            ) {
                self.events.fetch_add(1, Ordering::SeqCst);
            }
            match event {
                Ok(watcher::Event::Apply(lease)) => {
                    failing = false;
                    self.fresh.store(true, Ordering::SeqCst);
                    self.saw(Some(&lease));
                }
                Ok(watcher::Event::InitApply(lease)) => {
                    listed = true;
                    self.saw(Some(&lease));
                }
                Ok(watcher::Event::Delete(_)) => {
                    self.fresh.store(true, Ordering::SeqCst);
                    self.saw(None);
                }
                Ok(watcher::Event::Init) => {
                    failing = false;
                    listed = false;
                }
                Ok(watcher::Event::InitDone) => {
                    failing = false;
                    if !listed {
                        self.saw(None);
                    }
                    self.fresh.store(true, Ordering::SeqCst);
                }
                Err(e) => {
                    self.fresh.store(false, Ordering::SeqCst);
                    if !failing {
                        failing = true;
                        warn!(lease = name, error = %e, "cannot watch podha's leader Lease; going on with the last key seen, read again before deciding on a silence");
                    }
                }
            }
        }
    }

    /// A leader key whose watch has listed the Lease (tests).
    #[cfg(test)]
    pub fn listed() -> Self {
        let key = Self::default();
        key.fresh.store(true, Ordering::SeqCst);
        key
    }

    /// The watch failed (tests).
    #[cfg(test)]
    pub fn watch_failed(&self) {
        self.fresh.store(false, Ordering::SeqCst);
    }

    /// Whether the watch has listed the Lease, or delivered an event, since it last failed.
    pub fn fresh(&self) -> bool {
        self.fresh.load(Ordering::SeqCst)
    }

    /// Unless the watch is fresh, reads the watched Lease once and takes it as seen, unless a
    /// watch event came meanwhile (it is newer). At most one read per [`READ_EVERY`]; a read
    /// that fails or takes over `timeout` leaves what is held (said once until one answers).
    /// Called by an agent about to decide on its silence.
    pub async fn refresh_if_stale(&self, timeout: std::time::Duration) {
        let Some((leases, name)) = self.watched.get() else {
            return;
        };
        if self.fresh() {
            return;
        }
        {
            let mut last = lock(&self.last_read);
            let now = tokio::time::Instant::now();
            if last.is_some_and(|at| now.saturating_duration_since(at) < READ_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let before = self.events.load(Ordering::SeqCst);
        let failed = match tokio::time::timeout(timeout, leases.get_opt(name)).await {
            Ok(Ok(lease)) if self.events.load(Ordering::SeqCst) == before => {
                debug!(lease = %name, "read podha's leader Lease, its watch failing");
                self.saw(lease.as_ref());
                None
            }
            Ok(Ok(_)) => {
                debug!(lease = %name, "a read of podha's leader Lease overtaken by its watch");
                None
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {timeout:?}")),
        };
        let was_failing = self.read_failing.swap(failed.is_some(), Ordering::SeqCst);
        if let Some(error) = failed.filter(|_| !was_failing) {
            warn!(lease = %name, error, "cannot read podha's leader Lease, its watch failing");
        }
    }
}

/// The key kept at `path` in boot `boot`, if the record is of this boot and holds one.
fn load(path: &Path, boot: Option<&str>) -> Option<PublicKey> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if RecordBoot::of(lines.next(), boot) != RecordBoot::This {
        return None;
    }
    PublicKey::parse(lines.next()?)
}

/// The key a leader Lease publishes, if it carries a well-formed one.
pub fn published_key(lease: &Lease) -> Option<PublicKey> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(LEADER_KEY_ANNOTATION)
        .and_then(|text| PublicKey::parse(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Identity;

    /// The path of the leader Lease `podha-leader` in namespace `podha`, and of the list.
    const LEADER_LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/podha/leases/podha-leader";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/podha/leases";
    const SOON: std::time::Duration = std::time::Duration::from_secs(1);

    fn lease_in_term(term: u64) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": "podha-leader", "namespace": "podha", "resourceVersion": "5" },
            "spec": { "leaseTransitions": term },
        })
    }

    fn list_of(items: Vec<serde_json::Value>) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "LeaseList",
            "metadata": { "resourceVersion": "5" },
            "items": items,
        })
    }

    /// `key` watching the leader Lease of `api` in a task of its own.
    fn watching(
        key: &std::sync::Arc<LeaderKey>,
        api: &podha_fake_api::FakeApi,
    ) -> tokio::task::JoinHandle<()> {
        let leases: Api<Lease> = Api::namespaced(api.client(), "podha");
        let key = key.clone();
        tokio::spawn(async move { key.keep_watching(leases, "podha-leader").await })
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..300 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }

    fn reads(api: &podha_fake_api::FakeApi) -> usize {
        api.lines()
            .iter()
            .filter(|l| l.ends_with("/podha-leader"))
            .count()
    }

    #[tokio::test]
    async fn while_the_watch_fails_an_agent_about_to_decide_reads_the_term() {
        use podha_fake_api::{FakeApi, Reply};
        // The watch's list fails (the API server restarting); a read by name answers.
        let api = FakeApi::new()
            .on(http::Method::GET, LEADER_LEASE, |_| {
                Reply::json(200, lease_in_term(7))
            })
            .on(http::Method::GET, LEASES, |_| {
                Reply::status(503, "ServiceUnavailable")
            });
        let key = std::sync::Arc::new(LeaderKey::default());
        // Nothing watched yet: nothing to read.
        key.refresh_if_stale(SOON).await;
        let task = watching(&key, &api);
        until("the watch failed", || {
            api.lines().iter().any(|l| l.ends_with("/leases"))
        })
        .await;
        assert_eq!(key.term(), None, "nothing read before a decision");
        key.refresh_if_stale(SOON).await;
        task.abort();
        assert_eq!(key.term(), Some(7));
        assert_eq!(reads(&api), 1, "{:?}", api.lines());
    }

    #[tokio::test]
    async fn once_the_watch_lists_the_lease_again_nothing_is_read() {
        use podha_fake_api::{FakeApi, Reply};
        let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let api = FakeApi::new().on(http::Method::GET, LEASES, move |r| {
            if r.watching() {
                // A watch that stays open, saying nothing.
                Reply::json(200, serde_json::json!({})).after(std::sync::Arc::default())
            } else if lists.fetch_add(1, Ordering::SeqCst) == 0 {
                Reply::status(503, "ServiceUnavailable")
            } else {
                Reply::json(200, list_of(vec![lease_in_term(3)]))
            }
        });
        let key = std::sync::Arc::new(LeaderKey::default());
        let task = watching(&key, &api);
        until("the watch listed the Lease again", || {
            key.fresh.load(Ordering::SeqCst)
        })
        .await;
        key.refresh_if_stale(SOON).await;
        task.abort();
        assert_eq!(key.term(), Some(3));
        assert_eq!(reads(&api), 0, "{:?}", api.lines());
    }

    #[tokio::test]
    async fn a_list_without_the_lease_takes_it_as_deleted() {
        use podha_fake_api::{FakeApi, Reply};
        let api = FakeApi::new().on(http::Method::GET, LEASES, |r| {
            if r.watching() {
                Reply::json(200, serde_json::json!({})).after(std::sync::Arc::default())
            } else {
                Reply::json(200, list_of(vec![]))
            }
        });
        let key = std::sync::Arc::new(LeaderKey::default());
        key.seen_in_term(Some(6));
        let task = watching(&key, &api);
        until("the watch listed", || key.fresh.load(Ordering::SeqCst)).await;
        task.abort();
        assert_eq!(key.term(), None, "a Lease no longer there leaves no term");
    }

    #[tokio::test]
    async fn a_read_the_watch_overtook_is_dropped() {
        use podha_fake_api::{FakeApi, Reply};
        let answer = std::sync::Arc::new(tokio::sync::Notify::new());
        let api = FakeApi::new()
            .on(http::Method::GET, LEADER_LEASE, {
                let answer = answer.clone();
                move |_| Reply::json(200, lease_in_term(7)).after(answer.clone())
            })
            .on(http::Method::GET, LEASES, |_| {
                Reply::status(503, "ServiceUnavailable")
            });
        let key = std::sync::Arc::new(LeaderKey::default());
        let task = watching(&key, &api);
        until("the watch failed", || {
            api.lines().iter().any(|l| l.ends_with("/leases"))
        })
        .await;
        let read = tokio::spawn({
            let key = key.clone();
            async move { key.refresh_if_stale(SOON).await }
        });
        until("the read sent", || reads(&api) == 1).await;
        // The watch delivers a later term meanwhile.
        key.events.fetch_add(1, Ordering::SeqCst);
        key.seen_in_term(Some(8));
        answer.notify_one();
        read.await.expect("read");
        task.abort();
        assert_eq!(key.term(), Some(8));
    }

    #[test]
    fn a_published_key_replaces_the_one_held_and_a_lease_without_one_leaves_it() {
        let (first, second) = (
            Identity::generate().expect("key").public(),
            Identity::generate().expect("key").public(),
        );
        let held = LeaderKey::default();
        assert_eq!(held.current(), None);
        held.took(Some(first));
        held.took(None);
        assert_eq!(
            held.current(),
            Some(first),
            "not written yet by a new leader"
        );
        held.took(Some(second));
        assert_eq!(held.current(), Some(second));
        let mut lease = Lease::default();
        assert_eq!(published_key(&lease), None);
        lease.metadata.annotations =
            Some([(LEADER_KEY_ANNOTATION.to_string(), "garbled".to_string())].into());
        assert_eq!(published_key(&lease), None);
        lease.metadata.annotations =
            Some([(LEADER_KEY_ANNOTATION.to_string(), first.encode())].into());
        assert_eq!(published_key(&lease), Some(first));
    }

    #[tokio::test]
    async fn the_term_is_the_leases_transitions_and_a_change_is_told() {
        let held = LeaderKey::default();
        let changed = held.term_changed();
        assert_eq!(held.term(), None);
        let mut lease = Lease::default();
        held.saw(Some(&lease));
        assert_eq!(held.term(), Some(0), "no transitions yet");
        changed.notified().await;
        lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            lease_transitions: Some(3),
            ..Default::default()
        });
        held.saw(Some(&lease));
        assert_eq!(held.term(), Some(3));
        changed.notified().await;
        held.saw(None);
        assert_eq!(held.term(), None, "deleted: no later term known");
    }

    #[test]
    fn the_key_read_last_is_kept_for_the_next_agent_of_the_boot() {
        let dir = std::env::temp_dir().join(format!("podha-leader-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard.leader-key");
        let key = Identity::generate().expect("key").public();
        LeaderKey::kept_at(path.clone(), Some("b1")).took(Some(key));
        assert_eq!(
            LeaderKey::kept_at(path.clone(), Some("b1")).current(),
            Some(key)
        );
        assert_eq!(
            LeaderKey::kept_at(path.clone(), Some("b2")).current(),
            None,
            "another boot"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
