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
//! half a minute later, while the agent may already renew its own Lease: its renewals would
//! then be judged against a term that is no longer the leader's, and an agent a new leader
//! never heard would take its silence for counted and let its watchdog reset a running node.
//! So while the watch is failing, each renewal the API server takes is followed by a read of
//! the leader Lease ([`LeaderKey::refresh_if_stale`]): whenever the agent reaches the API
//! server, it knows the term.
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
use tracing::{info, warn};

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
    /// The watch failed since it last listed the Lease: what it holds may be stale.
    stale: std::sync::atomic::AtomicBool,
    /// The name of the Lease watched, once the watch started.
    watched: std::sync::OnceLock<String>,
}

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
    /// again with backoff, the last key kept meanwhile.
    pub async fn keep_watching(&self, leases: Api<Lease>, name: &str) {
        let _ = self.watched.set(name.to_string());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(leases, config).default_backoff());
        let mut failing = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                    failing = false;
                    self.saw(Some(&lease));
                }
                Ok(watcher::Event::Delete(_)) => self.saw(None),
                Ok(watcher::Event::Init) => failing = false,
                Ok(watcher::Event::InitDone) => {
                    failing = false;
                    self.stale.store(false, Ordering::SeqCst);
                }
                Err(e) => {
                    self.stale.store(true, Ordering::SeqCst);
                    if !failing {
                        failing = true;
                        warn!(lease = name, error = %e, "cannot watch podha's leader Lease; going on with the last key seen, and reading it after each renewal of the agent's Lease");
                    }
                }
            }
        }
    }

    /// While the watch is failing, reads the watched Lease once in `leases` (its namespace)
    /// and takes it as seen: called after the API server took a renewal of the agent's Lease.
    /// A read that fails (or takes over `timeout`) leaves what is held.
    pub async fn refresh_if_stale(&self, leases: &Api<Lease>, timeout: std::time::Duration) {
        let Some(name) = self.watched.get() else {
            return;
        };
        if !self.stale.load(Ordering::SeqCst) {
            return;
        }
        match tokio::time::timeout(timeout, leases.get_opt(name)).await {
            Ok(Ok(lease)) => {
                info!(lease = %name, "read podha's leader Lease while its watch is failing");
                self.saw(lease.as_ref());
            }
            Ok(Err(e)) => warn!(lease = %name, error = %e, "cannot read podha's leader Lease"),
            Err(_) => {
                warn!(lease = %name, "no answer to a read of podha's leader Lease within {timeout:?}")
            }
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

    /// The path of the leader Lease `podha-leader` in namespace `podha`.
    const LEADER_LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/podha/leases/podha-leader";

    #[tokio::test]
    async fn while_the_watch_fails_a_renewal_is_followed_by_a_read_of_the_term() {
        use podha_fake_api::{FakeApi, Reply};
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": "podha-leader", "namespace": "podha" },
            "spec": { "leaseTransitions": 7 },
        });
        // The watch's list fails (the API server restarting), a read by name answers.
        let api = FakeApi::new()
            .on(http::Method::GET, LEADER_LEASE, move |_| {
                Reply::json(200, lease.clone())
            })
            .on(
                http::Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/podha/leases",
                |_| Reply::status(503, "ServiceUnavailable"),
            );
        let leases: Api<Lease> = Api::namespaced(api.client(), "podha");
        let key = std::sync::Arc::new(LeaderKey::default());
        let timeout = std::time::Duration::from_secs(1);
        // Nothing watched yet: nothing read.
        key.refresh_if_stale(&leases, timeout).await;
        assert_eq!(key.term(), None);
        let watching = tokio::spawn({
            let (key, leases) = (key.clone(), leases.clone());
            async move { key.keep_watching(leases, "podha-leader").await }
        });
        for _ in 0..200 {
            if key.stale.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(key.stale.load(Ordering::SeqCst), "the watch never failed");
        assert_eq!(key.term(), None, "nothing read before a renewal");
        key.refresh_if_stale(&leases, timeout).await;
        assert_eq!(key.term(), Some(7));
        watching.abort();
        let reads = api
            .lines()
            .iter()
            .filter(|l| l.ends_with("/podha-leader"))
            .count();
        assert_eq!(reads, 1, "{:?}", api.lines());
    }

    #[tokio::test]
    async fn a_watch_that_lists_the_lease_needs_no_read() {
        use podha_fake_api::{FakeApi, Reply};
        let list = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "LeaseList",
            "metadata": { "resourceVersion": "5" },
            "items": [{
                "metadata": { "name": "podha-leader", "namespace": "podha", "resourceVersion": "5" },
                "spec": { "leaseTransitions": 3 },
            }],
        });
        let api = FakeApi::new().on(
            http::Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/podha/leases",
            move |r| {
                if r.watching() {
                    Reply::json(200, serde_json::json!({})).after(std::sync::Arc::default())
                } else {
                    Reply::json(200, list.clone())
                }
            },
        );
        let leases: Api<Lease> = Api::namespaced(api.client(), "podha");
        let key = std::sync::Arc::new(LeaderKey::default());
        let watching = tokio::spawn({
            let (key, leases) = (key.clone(), leases.clone());
            async move { key.keep_watching(leases, "podha-leader").await }
        });
        for _ in 0..200 {
            if key.term().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(key.term(), Some(3));
        key.refresh_if_stale(&leases, std::time::Duration::from_secs(1))
            .await;
        watching.abort();
        assert!(
            !api.lines().iter().any(|l| l.ends_with("/podha-leader")),
            "{:?}",
            api.lines()
        );
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
