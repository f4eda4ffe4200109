//! Leader election on a `coordination.k8s.io/v1` Lease, built on `kube-lease-manager` 0.13.
//!
//! Every replica keeps its caches warm; only the one holding a current [`Claim`] may write.
//! [`run`] publishes the claim; the rest of the runtime reads it through a [`Leadership`] and
//! asks [`Leadership::may_write`] right before each request.
//!
//! # How the claim is decided
//!
//! Notation: `d` = [`LeaderConfig::lease_duration`], `g` = [`LeaderConfig::renew_grace`],
//! `m` = [`LeaderConfig::step_down_margin`] = `g / 2`, `R` = the Lease's `renewTime`.
//!
//! [`run`] publishes a claim only while both hold:
//! 1. the crate's last answer from `LeaseManager::changed()` is "we hold the lease", and
//! 2. our own watch of the Lease object last showed `holderIdentity` = our identity with a `renewTime`
//!    `R` such that `now < R + d - m`. `R` was written by this process (the crate stamps it with
//!    its own wall clock), so this compares our clock with itself; once read, the remaining time
//!    is turned into a monotonic [`Instant`], the claim's expiry.
//!
//! Condition 2 exists because the crate alone does not guarantee a timely "not leading": when a
//! renewal fails, `changed()` returns the error and leaves its state at "leader" (its `watch()`
//! function logs the error and retries while its channel keeps saying `true`). Either way the
//! claim's expiry passes and the claim refuses writes without any help from the API server: a
//! reader compares the expiry with its own `now`, so it is refused from the expiry on even if
//! [`run`] has not withdrawn the claim yet. [`run`] also withdraws it at the expiry, so that
//! what it publishes says what readers conclude, and readers that wait for a change wake.
//!
//! kube 5's default client has no read timeout, so a lease call could also hang for as long as
//! the connection lives. The crate is given a client whose every call, answer included, gives up
//! after the step-down margin ([`with_call_timeout`]): a hung renewal fails and is retried like
//! any other failed renewal. The watch of the Lease keeps the plain client (it streams).
//!
//! # Liveness
//!
//! [`run`] stamps [`Progress`] whenever a turn of the election ends (well or with an error) and
//! whenever the watch of the Lease yields. While a leader renews, the watch shows a renewal every
//! `d - g`; without one, a follower's turn ends at the old hold's expiry. So in a working loop
//! the stamp is never older than about one lease; `/healthz` fails once it is older than
//! [`Progress::STUCK_AFTER_LEASES`] leases, and the kubelet restarts the process.
//!
//! # Timing, and how much a stale leader can overlap
//!
//! What `kube-lease-manager` 0.13 does (read from its source):
//! - The holder renews at `R + d - g` by its wall clock: a strategic-merge patch of `renewTime`
//!   and `leaseDurationSeconds`, then a GET. A failed renewal is retried after our backoff.
//! - A follower does not watch the Lease: it reads it, sleeps until `R + d` by *its* wall clock,
//!   reads again and, if nothing was renewed, clears the holder (a patch without precondition),
//!   sleeps a random 100–1000 ms, then takes the lease with a server-side apply. Concurrent
//!   acquisitions conflict on the `holderIdentity` field manager (409) so only one succeeds.
//!
//! So another replica can hold the lease no earlier than `R + d + 100 ms` by its clock, while our
//! claim expires at `R + d - m` by ours. With clock skew between replicas below `m` (2.5 s with
//! the defaults) there is no overlap. What remains, and what writers must live with:
//! - skew beyond `m`: overlap of at most `skew - m - 100 ms`;
//! - a write already sent when the claim expires still lands: bound writes with a request
//!   timeout, and use preconditions (UID, resourceVersion) so a late write by a stale leader is
//!   harmless;
//! - a reader that asked [`Leadership::may_write`] and then awaited something must ask again
//!   before writing;
//! - a process frozen (SIGSTOP, paused VM) between a reader's question and its request sends a
//!   request its claim may no longer cover; no lease without fencing tokens can exclude that.
//!
//! The renewal at `R + d - g` has `g - m = g / 2` to be seen on our watch before the claim
//! expires; if it is slower, the claim lapses (the safe direction) until the renewal is seen.
//!
//! # Hand-over
//!
//! On shutdown the claim is withdrawn first, then the lease is released (holder cleared). The
//! followers' crate would only notice at the old expiry, so each follower also watches the Lease:
//! when it sees the lease freed before the holder's lease ran out (a release, not an expiry) it
//! starts a fresh `LeaseManager`, which takes the lease within a few round trips. After a crash
//! (no release) the follower takes over at `R + d + 0.1..1 s`; renewals come every `d - g`, so
//! that is at most about `d + 1 s` after the leader died.
//!
//! # Terms
//!
//! A [`Claim`] names its leadership term: the Lease's `leaseTransitions`, which the crate raises
//! by one with every acquisition (by another replica, or by this one after a release) and no
//! renewal touches. podha signs it into its heartbeats, so that an agent tells a new leader
//! that has not heard it yet from podha not hearing it (docs/agent.md), and the decision loop
//! takes any change of it as a new term. The crate takes an orphaned Lease in two patches
//! (holder, then `leaseTransitions`): for a moment, or for the whole hold if the second patch
//! fails, a new leader runs under the last term's number, which the agents take as no later
//! term, the side that fences.
//!
//! # Errors
//!
//! Transient API errors are retried after [`crate::backoff::lease_retry`] (no claim is published
//! meanwhile unless the last renewal seen still covers it). A deleted Lease is recreated. Errors
//! no retry can fix (401, 403, invalid requests, a broken lease state, a refused watch of the
//! Lease) end [`run`] with an error (`errors.rs` sorts them): the caller ends the process, so the
//! failure is visible (CrashLoopBackOff) rather than a replica that silently never leads.
//!
//! RBAC: `get`, `create`, `patch`, `list`, `watch` on `leases.coordination.k8s.io` in
//! [`LeaderConfig::namespace`].
//!
//! # Tests
//!
//! The unit tests here cover the rules one at a time: the claim refuses writes from its expiry
//! on (`claim`), the validity read from a renewal and the spotting of a release (`view`), which
//! errors are retried (`errors`), and a hung lease call given up and retried against a fake API
//! server. The writer's and the actuator's tests check that an expired or withdrawn claim sends
//! nothing. Two replicas on the sim cluster's real API server (`tests/failover.rs`, in this
//! process, 4 s leases) cover the election itself:
//! - `two_replicas_only_the_leader_writes`: exactly one leads; the other sent no action and
//!   counted dropped intents;
//! - `leader_change_mid_failover_repeats_no_action`: the leader is stopped (its lease released)
//!   mid-failover; the other leads within 20 s and repeats nothing;
//! - `api_server_blip_is_no_node_death_and_leaves_podha_watching`: cut off from the API server,
//!   no replica leads within 15 s, and one leads again once it is back.
//!
//! Not covered by a test: a leader that crashes without releasing (the follower takes over at
//! the old expiry), and a Lease deleted while one replica leads (recreated by a fresh manager).

use std::{
    future::Future,
    pin::pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};

use crate::backoff::{self, Backoff};
use tokio::{sync::watch, time::Instant};

mod claim;
mod errors;
mod progress;
mod view;

pub use claim::{Claim, Leadership, channel};

pub mod key;
pub use errors::LeaderError;
pub use progress::Progress;

use claim::Publisher;
use errors::{OnError, on_error, watch_refused};
use view::LeaseView;

/// Name of the Lease the replicas compete for.
pub use crate::contract::DEFAULT_LEADER_LEASE as DEFAULT_LEASE_NAME;
/// How long a hold is valid after its last renewal.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long before the end of its hold the leader renews it.
pub const DEFAULT_RENEW_GRACE: Duration = Duration::from_secs(5);

/// Upper bound for releasing the lease on shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

pub type Result<T, E = LeaderError> = std::result::Result<T, E>;

/// Where and how this replica competes for leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    /// Unique among live replicas; see [`default_identity`].
    pub identity: String,
    /// Whole seconds, greater than `renew_grace`.
    pub lease_duration: Duration,
    /// Whole seconds, at least 1 s.
    pub renew_grace: Duration,
}

impl LeaderConfig {
    /// The default lease name and timings.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_grace: DEFAULT_RENEW_GRACE,
        }
    }

    /// How long before its hold runs out the leader stops acting unless it has seen its renewal.
    /// Also the clock skew between replicas that the election tolerates.
    pub fn step_down_margin(&self) -> Duration {
        self.renew_grace / 2
    }

    /// The crate counts in whole seconds and does not validate what its builder is given.
    fn lease_seconds(&self) -> Result<(u64, u64)> {
        let invalid = |why: &str| Err(LeaderError::InvalidConfig(why.to_owned()));
        for (name, value) in [
            ("lease_name", &self.lease_name),
            ("namespace", &self.namespace),
            ("identity", &self.identity),
        ] {
            if value.trim().is_empty() {
                return invalid(&format!("{name} is empty"));
            }
        }
        if self.lease_duration.subsec_nanos() != 0 || self.renew_grace.subsec_nanos() != 0 {
            return invalid("lease_duration and renew_grace must be whole seconds");
        }
        let (duration, grace) = (self.lease_duration.as_secs(), self.renew_grace.as_secs());
        if grace == 0 {
            return invalid("renew_grace must be at least 1s");
        }
        if duration <= grace {
            return invalid("lease_duration must be longer than renew_grace");
        }
        if duration > i32::MAX as u64 {
            return invalid("lease_duration is too long");
        }
        Ok((duration, grace))
    }
}

/// `POD_NAME` (set through the downward API), else `<hostname>-<pid>`.
///
/// A pod name is unique among live pods, and a restarted container (same name) only starts
/// after the previous one exited, so it may take over its own lease at once. Outside a pod the
/// pid separates processes on one host.
pub fn default_identity() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok());
    identity_from(std::env::var("POD_NAME").ok(), hostname, std::process::id())
}

fn identity_from(pod_name: Option<String>, hostname: Option<String>, pid: u32) -> String {
    let non_empty = |s: Option<String>| s.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    match non_empty(pod_name) {
        Some(pod) => pod,
        None => {
            let host = non_empty(hostname).unwrap_or_else(|| "podha".to_owned());
            format!("{host}-{pid}")
        }
    }
}

/// Runs the election until `shutdown` resolves or an error no retry can fix.
///
/// `claim` holds a [`Claim`] while this replica holds the lease (see the module docs for the
/// exact rule), and `None` at the start, on shutdown before the lease is released, and on every
/// return or drop of this future. On an error the caller ends the process: a replica that
/// cannot tell whether it leads must not act.
pub async fn run(
    client: Client,
    cfg: LeaderConfig,
    claim: watch::Sender<Option<Claim>>,
    progress: Progress,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let publisher = Publisher(claim);
    publisher.set(None);
    let seconds = cfg.lease_seconds()?;
    let lease_client = with_call_timeout(&client, cfg.step_down_margin());
    let manager = elect(
        &client,
        &lease_client,
        &cfg,
        seconds,
        &publisher,
        &progress,
        shutdown,
    )
    .await?;

    // `elect` has returned, so no renewal is in flight and the manager's state lock is free.
    publisher.set(None);
    tracing::info!(identity = %cfg.identity, "releasing the leader lease");
    let release = async {
        let manager = match manager {
            Some(manager) => manager,
            // The last turn may have acquired the lease just before it was dropped.
            None => Arc::new(build(&lease_client, &cfg, seconds).await?),
        };
        manager.release().await
    };
    match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(LeaderError::Release(error)),
        Err(_) => Err(LeaderError::ReleaseTimeout(RELEASE_TIMEOUT)),
    }
}

/// A client whose every request, reading the answer included, fails after `timeout`. For calls
/// that return at once, never for watches.
fn with_call_timeout(client: &Client, timeout: Duration) -> Client {
    let inner = client.clone();
    let service = tower::service_fn(move |request| {
        let inner = inner.clone();
        async move {
            let call = async {
                let (parts, body) = inner.send(request).await?.into_parts();
                let body = kube::client::Body::from(body.collect_bytes().await?);
                Ok::<_, kube::Error>(axum::http::Response::from_parts(parts, body))
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer.map_err(tower::BoxError::from),
                Err(_) => Err(format!("no answer from the API server within {timeout:?}").into()),
            }
        }
    });
    Client::new(service, client.default_namespace())
}

/// The election loop; on shutdown returns the current manager (if any) for the release.
/// `watch_client` watches the Lease; `client` (calls with a timeout) drives the manager.
async fn elect(
    watch_client: &Client,
    client: &Client,
    cfg: &LeaderConfig,
    seconds: (u64, u64),
    publisher: &Publisher,
    progress: &Progress,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<Arc<LeaseManager>>> {
    let leases = watcher(
        Api::<Lease>::namespaced(watch_client.clone(), &cfg.namespace),
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.lease_name)),
    )
    .backoff(backoff::lease_retry(cfg.lease_duration));
    let mut leases = pin!(leases);
    let mut shutdown = pin!(shutdown);

    let mut manager: Option<Arc<LeaseManager>> = None;
    let mut turn = pin!(next_turn(client, cfg, seconds, None, Duration::ZERO));
    let mut retry = backoff::lease_retry(cfg.lease_duration);
    let mut held = false;
    let mut view = LeaseView::default();

    loop {
        let claim = view
            .own_valid_until
            .map(|(expires, term)| Claim::of_term(term, expires))
            .filter(|claim| held && claim.is_current_at(Instant::now()));
        if let Some(leading) = publisher.set(claim) {
            tracing::info!(identity = %cfg.identity, lease = %cfg.lease_name, leading, "leadership changed");
        }
        // Readers refuse the claim from its expiry on by themselves; withdrawing it then keeps
        // the published value true for readers that wait for a change.
        let step_down = async {
            match claim {
                Some(claim) => tokio::time::sleep_until(claim.expires).await,
                None => std::future::pending().await,
            }
        };

        tokio::select! {
            biased;
            () = &mut shutdown => break,
            outcome = &mut turn => {
                progress.stamp();
                let (next, delay) = after_turn(outcome, &mut manager, &mut held, &mut retry, cfg)?;
                manager = next.clone();
                turn.set(next_turn(client, cfg, seconds, next, delay));
            }
            event = leases.next() => match event.inspect(|_| progress.stamp()) {
                Some(Ok(event)) => {
                    let released = view.observe(&event, cfg, SystemTime::now(), Instant::now());
                    if released && !held {
                        // Our manager sleeps until the old expiry; a fresh one reads the lease now.
                        tracing::debug!("leader lease released by its holder: competing now");
                        manager = None;
                        turn.set(next_turn(client, cfg, seconds, None, Duration::ZERO));
                    }
                }
                // Without the watch no claim is ever published, so a refusal must not go unnoticed.
                Some(Err(error)) if watch_refused(&error) => {
                    return Err(LeaderError::WatchRefused(error));
                }
                Some(Err(error)) => tracing::warn!(%error, "watch of the leader lease failed"),
                None => return Err(LeaderError::WatchEnded),
            },
            () = step_down => {}
        }
    }

    Ok(manager)
}

/// What a finished turn leaves for the next: the manager to go on with (none: build a new
/// one) and how long to wait first. A success starts the retry delays over; an error no retry
/// can fix ends the election.
fn after_turn(
    outcome: Turn,
    manager: &mut Option<Arc<LeaseManager>>,
    held: &mut bool,
    retry: &mut backoff::Exponential,
    cfg: &LeaderConfig,
) -> Result<(Option<Arc<LeaseManager>>, Duration)> {
    match outcome {
        Turn::Built(Ok(built)) => {
            retry.reset();
            Ok((Some(Arc::from(built)), Duration::ZERO))
        }
        Turn::Changed(Ok(state)) => {
            retry.reset();
            *held = state;
            Ok((manager.take(), Duration::ZERO))
        }
        Turn::Built(Err(error)) | Turn::Changed(Err(error)) => match on_error(&error) {
            OnError::Fatal => Err(LeaderError::Fatal(error)),
            OnError::Retry => {
                let delay = retry.next().unwrap_or(cfg.lease_duration);
                tracing::warn!(%error, ?delay, "leader lease: retrying");
                Ok((manager.take(), delay))
            }
            OnError::Rebuild => {
                let delay = retry.next().unwrap_or(cfg.lease_duration);
                tracing::warn!(%error, ?delay, "leader lease: starting over");
                *held = false;
                Ok((None, delay))
            }
        },
    }
}

/// One step of the election. It owns no state of its own, so dropping it at any await point
/// (shutdown, or starting over after a release) loses nothing.
enum Turn {
    Built(Result<Box<LeaseManager>, LeaseManagerError>),
    Changed(Result<bool, LeaseManagerError>),
}

async fn next_turn(
    client: &Client,
    cfg: &LeaderConfig,
    seconds: (u64, u64),
    manager: Option<Arc<LeaseManager>>,
    delay: Duration,
) -> Turn {
    tokio::time::sleep(delay).await;
    match manager {
        None => Turn::Built(build(client, cfg, seconds).await.map(Box::new)),
        // Returns only when our hold changes; renews it meanwhile.
        Some(manager) => Turn::Changed(manager.changed().await),
    }
}

/// Reads the lease, creating it if missing. A fresh manager starts as "not holding".
async fn build(
    client: &Client,
    cfg: &LeaderConfig,
    (duration, grace): (u64, u64),
) -> Result<LeaseManager, LeaseManagerError> {
    LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
        .with_namespace(&cfg.namespace)
        .with_identity(&cfg.identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use podha_fake_api::{FakeApi, Reply};

    fn cfg() -> LeaderConfig {
        LeaderConfig::new("podha-system", "me")
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn config_defaults() {
        let cfg = cfg();
        assert_eq!(cfg.lease_name, "podha-leader");
        assert_eq!(cfg.lease_duration, secs(15));
        assert_eq!(cfg.renew_grace, secs(5));
        assert_eq!(cfg.step_down_margin(), Duration::from_millis(2500));
        assert_eq!(cfg.lease_seconds().unwrap(), (15, 5));
    }

    #[test]
    fn config_validation() {
        let with = |f: fn(&mut LeaderConfig)| {
            let mut cfg = cfg();
            f(&mut cfg);
            cfg.lease_seconds()
        };
        let rejected: [fn(&mut LeaderConfig); 7] = [
            |c| c.identity = " ".into(),
            |c| c.namespace.clear(),
            |c| c.lease_name.clear(),
            |c| c.renew_grace = Duration::ZERO,
            |c| c.renew_grace = c.lease_duration,
            |c| c.lease_duration = Duration::from_millis(15_500),
            |c| c.renew_grace = Duration::from_millis(1500),
        ];
        for (i, f) in rejected.into_iter().enumerate() {
            let err = with(f).expect_err(&format!("case {i} accepted"));
            assert_eq!(err.label(), "invalid_config");
        }
        assert_eq!(
            with(|c| (c.lease_duration, c.renew_grace) = (secs(2), secs(1))).unwrap(),
            (2, 1)
        );
    }

    #[test]
    fn identity_prefers_pod_name() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(identity_from(s("podha-0"), s("host"), 7), "podha-0");
        assert_eq!(identity_from(s(" "), s("host\n"), 7), "host-7");
        assert_eq!(identity_from(None, s("host"), 7), "host-7");
        assert_eq!(identity_from(None, None, 7), "podha-7");
        assert!(!default_identity().is_empty());
    }

    /// A fake API server that never answers a call for the Lease itself (a hung connection)
    /// and whose list of Leases is empty and watch silent.
    fn hanging_lease_api() -> FakeApi {
        let never = Arc::new(tokio::sync::Notify::new());
        let leases = "/apis/coordination.k8s.io/v1/namespaces/podha-system/leases";
        FakeApi::new()
            .on(Method::GET, &format!("{leases}/podha-leader"), move |_| {
                Reply::status(500, "InternalError").after(never.clone())
            })
            .on(Method::GET, leases, |req| {
                if req.watching() {
                    Reply::silent_watch()
                } else {
                    Reply::json(
                        200,
                        serde_json::json!({"apiVersion": "coordination.k8s.io/v1",
                            "kind": "LeaseList", "metadata": {"resourceVersion": "1"},
                            "items": []}),
                    )
                }
            })
    }

    /// The calls for the Lease itself `api` got.
    fn lease_calls(api: &FakeApi) -> usize {
        api.requests()
            .iter()
            .filter(|r| r.path.ends_with("/leases/podha-leader"))
            .count()
    }

    /// kube's client has no read timeout: without one of podha's own a hung call for the Lease
    /// would leave the election waiting as long as the connection lives.
    #[tokio::test(start_paused = true)]
    async fn a_hung_lease_call_times_out_and_is_retried() {
        let api = hanging_lease_api();
        let cfg = LeaderConfig::new("podha-system", "me");
        let (tx, leadership) = channel();
        let progress = Progress::new(&cfg);
        let election = tokio::spawn(run(
            api.client(),
            cfg.clone(),
            tx,
            progress.clone(),
            std::future::pending(),
        ));
        tokio::time::sleep(cfg.lease_duration * 2).await;
        let made = lease_calls(&api);
        assert!(
            made >= 3,
            "the hung call was never given up: {made} call(s)"
        );
        assert!(!leadership.may_write(Instant::now()));
        assert_eq!(progress.stuck_for(), None, "failed calls are progress");
        assert!(!election.is_finished(), "a hung call is retried, not fatal");
        election.abort();
    }
}
