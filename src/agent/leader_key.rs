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
//! A Lease held by a leader that publishes no key is a podha from before signed heartbeats
//! (an upgrade under way): it cannot verify the agents' answers either, so it proves no
//! silence, and the agent counts itself as never heard meanwhile ([`LeaderKey::signs_nothing`]),
//! rather than fence a healthy node because its old leader does not sign.
//!
//! The key read last is kept beside the hearing file (`<file>.leader-key`), as a record naming
//! its boot (see [`super::boot`]): an agent restarted while the API server is down goes on
//! trusting the leader its predecessor trusted, and so stays heard.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::boot::{RecordBoot, write_record};
use super::peer_list::lock;
use crate::contract::{LEADER_KEY_ANNOTATION, PublicKey};

#[derive(Debug, Default)]
pub struct LeaderKey {
    key: Mutex<Option<PublicKey>>,
    /// The Lease, as last seen, is held by a leader that publishes no key.
    signs_nothing: AtomicBool,
    /// Where the key read last is kept for the next agent of this boot (`None`: nowhere).
    kept: Option<(PathBuf, Option<String>)>,
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

    /// Whether the Lease, as last seen, is held by a leader that publishes no key (see the
    /// module's rule).
    pub fn signs_nothing(&self) -> bool {
        self.signs_nothing.load(Ordering::Relaxed)
    }

    /// Takes the Lease as seen (`None`: there is none): its key replaces the one held; a Lease
    /// without one leaves it (a new leader that has not written it yet, or one that never
    /// will).
    fn saw(&self, lease: Option<&Lease>) {
        let published = lease.and_then(published_key);
        let held = lease.is_some_and(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty())
        });
        let unsigned = held && published.is_none();
        if self.signs_nothing.swap(unsigned, Ordering::Relaxed) != unsigned {
            if unsigned {
                warn!(
                    "podha's leader publishes no heartbeat key (a podha from before signed heartbeats?): this agent counts itself never heard until one does"
                );
            } else {
                info!("podha's leader publishes its heartbeat key again");
            }
        }
        self.took(published);
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
                Ok(watcher::Event::Init | watcher::Event::InitDone) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    warn!(lease = name, error = %e, "cannot watch podha's leader Lease; going on with the last key seen");
                }
                Err(_) => {}
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

    #[test]
    fn a_lease_held_by_a_leader_that_publishes_no_key_signs_nothing() {
        let key = Identity::generate().expect("key").public();
        let held = LeaderKey::default();
        let lease = |holder: Option<&str>, key: Option<PublicKey>| Lease {
            metadata: kube::api::ObjectMeta {
                annotations: key.map(|k| [(LEADER_KEY_ANNOTATION.to_string(), k.encode())].into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: holder.map(str::to_string),
                ..Default::default()
            }),
        };
        held.saw(Some(&lease(Some("podha-old"), None)));
        assert!(held.signs_nothing(), "an old podha leads");
        held.saw(Some(&lease(Some("podha-new"), Some(key))));
        assert!(!held.signs_nothing());
        assert_eq!(held.current(), Some(key));
        held.saw(Some(&lease(None, None)));
        assert!(!held.signs_nothing(), "nobody leads: nothing to tell");
        held.saw(None);
        assert!(!held.signs_nothing(), "no Lease");
        assert_eq!(held.current(), Some(key), "the last key is kept");
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
