//! Leader election on a `coordination.k8s.io/v1` Lease, built on `kube-lease-manager` 0.13.
//!
//! Every replica keeps its caches warm; only the one whose [`run`] publishes `true` may write.
//! The rest of the runtime reads a `watch::Receiver<bool>` and checks it right before each write.
//!
//! # How the gate is decided
//!
//! Notation: `d` = [`LeaderConfig::lease_duration`], `g` = [`LeaderConfig::renew_grace`],
//! `m` = [`LeaderConfig::step_down_margin`] = `g / 2`, `R` = the Lease's `renewTime`.
//!
//! The gate is `true` only while both hold:
//! 1. the crate's last answer from `LeaseManager::changed()` is "we hold the lease", and
//! 2. our own watch of the Lease object last showed `holderIdentity` = our identity with a `renewTime`
//!    `R` such that `now < R + d - m`. `R` was written by this process (the crate stamps it with
//!    its own wall clock), so this compares our clock with itself; once read, the remaining time
//!    is turned into a monotonic [`Instant`] deadline.
//!
//! Condition 2 exists because the crate alone does not guarantee a timely `false`: when a renewal
//! fails, `changed()` returns the error and leaves its state at "leader" (its `watch()` helper
//! logs the error and retries while its channel keeps saying `true`). Either way the deadline
//! in 2 passes and the gate closes without any help from the API server.
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
//! gate closes at `R + d - m` by ours. With clock skew between replicas below `m` (2.5 s with the
//! defaults) there is no overlap. What remains, and what writers must live with:
//! - skew beyond `m`: overlap of at most `skew - m - 100 ms`;
//! - a write already sent when the gate closes still lands: bound writes with a request timeout,
//!   and use preconditions (UID, resourceVersion) so a late write by a stale leader is harmless;
//! - a reader that checked the gate and then awaited something must check it again before writing;
//! - a process frozen (SIGSTOP, paused VM) for longer than `m` may let a reader run before this
//!   task closes the gate; no lease without fencing tokens can exclude that.
//!
//! The renewal at `R + d - g` has `g - m = g / 2` to be seen on our watch before the gate closes;
//! if it is slower, the gate blinks `false` (the safe direction) until the renewal is seen.
//!
//! # Hand-over
//!
//! On shutdown the gate goes `false` first, then the lease is released (holder cleared). The
//! followers' crate would only notice at the old expiry, so each follower also watches the Lease:
//! when it sees the lease freed before the holder's lease ran out (a release, not an expiry) it
//! starts a fresh `LeaseManager`, which takes the lease within a few round trips. After a crash
//! (no release) the follower takes over at `R + d + 0.1..1 s`; renewals come every `d - g`, so
//! that is at most about `d + 1 s` after the leader died.
//!
//! # Errors
//!
//! Transient API errors are retried with backoff (the gate protects against acting meanwhile).
//! A deleted Lease is recreated. Errors no retry can fix (401, 403, invalid requests, a broken
//! lease state, a refused watch of the Lease) end [`run`] with an error: the caller ends the process, so the failure is visible
//! (CrashLoopBackOff) rather than a replica that silently never leads.
//!
//! RBAC: `get`, `create`, `patch`, `list`, `watch` on `leases.coordination.k8s.io` in
//! [`LeaderConfig::namespace`].
//!
//! # Integration test recipe (sim cluster; the lead turns this into a test)
//!
//! Two `run` futures with identities `a` and `b`, same lease name and namespace (a fresh
//! namespace per test), one API server, `lease_duration = 4 s`, `renew_grace = 2 s`. Each gets its
//! own `watch::channel(false)` and a `oneshot` receiver as `shutdown`; spawn both, keep the
//! `JoinHandle`s.
//! 1. Sample both receivers every 50 ms for `3 * d`: never both `true`; from `d + g` on, exactly
//!    one `true`, and the Lease's `holderIdentity` names that one.
//! 2. Graceful stop: fire the leader's shutdown. Its receiver reads `false` before its `run`
//!    returns `Ok(())`; the Lease's holder is cleared or already the other identity; the other
//!    becomes `true` within `d + g` (expected: about a second). Keep sampling: never both `true`.
//! 3. Crash: restart the stopped replica (it stays follower while the other renews), then
//!    `abort()` the leader's task (no release). The other becomes `true` within `d + g`
//!    (expected about `d + 1 s`), never both `true`.
//! 4. Deleted Lease: delete it while one leads; within `d + g` the Lease exists again and exactly
//!    one replica is `true`.
//! 5. Every `run` still alive ends with `Ok(())` on shutdown; none ended with an error.

use std::{
    future::Future,
    pin::pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, utils::Backoff, watcher},
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::{sync::watch, time::Instant};

/// Name of the Lease the replicas compete for.
pub const DEFAULT_LEASE_NAME: &str = "podha-leader";
/// How long a hold is valid after its last renewal.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long before the end of its hold the leader renews it.
pub const DEFAULT_RENEW_GRACE: Duration = Duration::from_secs(5);

/// Where [`run`] records that the election loop moves on; see the module docs ("Liveness").
#[derive(Clone, Debug)]
pub struct Progress {
    last: Arc<std::sync::Mutex<Instant>>,
    stuck_after: Duration,
}

impl Progress {
    /// How many lease durations without progress make the loop stuck.
    pub const STUCK_AFTER_LEASES: u32 = 3;

    /// Progress as of now, for an election with `cfg`'s timings.
    pub fn new(cfg: &LeaderConfig) -> Self {
        Self {
            last: Arc::new(std::sync::Mutex::new(Instant::now())),
            stuck_after: cfg.lease_duration * Self::STUCK_AFTER_LEASES,
        }
    }

    fn stamp(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// How long the loop has not moved on, if that is longer than a working loop ever takes.
    pub fn stuck_for(&self) -> Option<Duration> {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        Some(last.elapsed()).filter(|quiet| *quiet > self.stuck_after)
    }
}

/// Upper bound for releasing the lease on shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// First retry delay after an API error; doubles up to the lease duration.
const FIRST_RETRY: Duration = Duration::from_millis(500);

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

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader election config: {0}")]
    InvalidConfig(String),
    /// An error no retry can fix (credentials, RBAC, invalid request, broken lease state).
    #[error("leader election cannot go on: {0}")]
    Fatal(#[source] LeaseManagerError),
    /// The API server refuses to let us watch the lease (credentials, RBAC).
    #[error("watch of the leader lease refused: {0}")]
    WatchRefused(#[source] watcher::Error),
    #[error("watch of the leader lease ended")]
    WatchEnded,
    #[error("releasing the leader lease failed: {0}")]
    Release(#[source] LeaseManagerError),
    #[error("releasing the leader lease took longer than {0:?}")]
    ReleaseTimeout(Duration),
}

impl LeaderError {
    /// Bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LeaderError::InvalidConfig(_) => "invalid_config",
            LeaderError::Fatal(_) => "fatal",
            LeaderError::WatchRefused(_) => "watch_refused",
            LeaderError::WatchEnded => "watch_ended",
            LeaderError::Release(_) => "release",
            LeaderError::ReleaseTimeout(_) => "release_timeout",
        }
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
/// `is_leader` reads `true` while this replica holds the lease (see the module docs for the
/// exact rule). It reads `false` at the start, on shutdown before the lease is released, and on
/// every return or drop of this future. On an error the caller ends the process: a replica that
/// cannot tell whether it leads must not act.
pub async fn run(
    client: Client,
    cfg: LeaderConfig,
    is_leader: watch::Sender<bool>,
    progress: Progress,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let gate = Gate(is_leader);
    gate.set(false);
    let seconds = cfg.lease_seconds()?;
    let lease_client = with_call_timeout(&client, cfg.step_down_margin());
    let manager = elect(
        &client,
        &lease_client,
        &cfg,
        seconds,
        &gate,
        &progress,
        shutdown,
    )
    .await?;

    // `elect` has returned, so no renewal is in flight and the manager's state lock is free.
    gate.set(false);
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
    gate: &Gate,
    progress: &Progress,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<Arc<LeaseManager>>> {
    let leases = watcher(
        Api::<Lease>::namespaced(watch_client.clone(), &cfg.namespace),
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.lease_name)),
    )
    .backoff(Retry::new(cfg.lease_duration));
    let mut leases = pin!(leases);
    let mut shutdown = pin!(shutdown);

    let mut manager: Option<Arc<LeaseManager>> = None;
    let mut turn = pin!(next_turn(client, cfg, seconds, None, Duration::ZERO));
    let mut retry = Retry::new(cfg.lease_duration);
    let mut held = false;
    let mut view = LeaseView::default();

    loop {
        let leading = held && view.own_valid_until.is_some_and(|t| Instant::now() < t);
        if gate.set(leading) {
            tracing::info!(identity = %cfg.identity, lease = %cfg.lease_name, leading, "leadership changed");
        }
        let step_down = async {
            match view.own_valid_until {
                Some(deadline) if leading => tokio::time::sleep_until(deadline).await,
                _ => std::future::pending().await,
            }
        };

        tokio::select! {
            biased;
            () = &mut shutdown => break,
            outcome = &mut turn => {
                progress.stamp();
                let (next, delay) = match outcome {
                    Turn::Built(Ok(built)) => {
                        retry.reset();
                        (Some(Arc::from(built)), Duration::ZERO)
                    }
                    Turn::Changed(Ok(state)) => {
                        retry.reset();
                        held = state;
                        (manager.take(), Duration::ZERO)
                    }
                    Turn::Built(Err(error)) | Turn::Changed(Err(error)) => {
                        match on_error(&error) {
                            OnError::Fatal => return Err(LeaderError::Fatal(error)),
                            OnError::Retry => {
                                let delay = retry.delay();
                                tracing::warn!(%error, ?delay, "leader lease: retrying");
                                (manager.take(), delay)
                            }
                            OnError::Rebuild => {
                                let delay = retry.delay();
                                tracing::warn!(%error, ?delay, "leader lease: starting over");
                                held = false;
                                (None, delay)
                            }
                        }
                    }
                };
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
                // Without the watch the gate stays shut, so a refusal must not go unnoticed.
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

/// The shared flag, forced to `false` however [`run`] ends (return, error, panic, drop).
struct Gate(watch::Sender<bool>);

impl Gate {
    /// Returns whether the value changed; receivers are only woken on a change.
    fn set(&self, leading: bool) -> bool {
        self.0.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.set(false);
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

#[derive(Debug, PartialEq, Eq)]
enum OnError {
    Retry,
    /// The lease is gone: a fresh manager recreates it.
    Rebuild,
    Fatal,
}

fn on_error(error: &LeaseManagerError) -> OnError {
    match error {
        LeaseManagerError::NonexistentLease(_) => OnError::Rebuild,
        LeaseManagerError::KubeError(kube::Error::Api(status)) => match status.code {
            404 => OnError::Rebuild,
            400 | 401 | 403 | 422 => OnError::Fatal,
            _ => OnError::Retry,
        },
        LeaseManagerError::KubeError(_) => OnError::Retry,
        LeaseManagerError::InconsistentState(_)
        | LeaseManagerError::LeaseAlreadyExists(_)
        | LeaseManagerError::ControlChannelError(_) => OnError::Fatal,
    }
}

fn watch_refused(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    matches!(status.code, 401 | 403)
}

/// Doubling delay between retries, capped so a follower retries at least once per lease.
struct Retry {
    next: Duration,
    cap: Duration,
}

impl Retry {
    fn new(cap: Duration) -> Self {
        Self {
            next: FIRST_RETRY,
            cap,
        }
    }

    fn delay(&mut self) -> Duration {
        let delay = self.next.min(self.cap);
        self.next = delay.saturating_mul(2);
        delay
    }
}

/// Also the backoff of the watch of the Lease: without that watch no replica may lead, so after
/// an API server outage it must come back within a lease, not after kube-runtime's default 30 s.
impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.delay())
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.next = FIRST_RETRY;
    }
}

/// What our own watch of the Lease object last showed.
#[derive(Debug, Default)]
struct LeaseView {
    /// Until when our last observed renewal lets us act.
    own_valid_until: Option<Instant>,
    /// When another replica's hold, as last observed, runs out by our clock.
    other_expiry: Option<SystemTime>,
}

impl LeaseView {
    /// Returns `true` when the lease was freed before its holder's hold ran out: a release, as
    /// opposed to a follower clearing an expired hold.
    fn observe(
        &mut self,
        event: &watcher::Event<Lease>,
        cfg: &LeaderConfig,
        now_wall: SystemTime,
        now: Instant,
    ) -> bool {
        let spec = match event {
            watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => lease.spec.as_ref(),
            watcher::Event::Delete(_) => None,
            // A re-list follows; a stale view cannot outlive the renewal it was computed from.
            watcher::Event::Init | watcher::Event::InitDone => return false,
        };
        let released = holder(spec).is_none() && self.other_expiry.is_some_and(|e| e > now_wall);
        self.own_valid_until = own_validity(spec, cfg, now_wall).map(|left| now + left);
        self.other_expiry = match holder(spec) {
            Some(h) if h != cfg.identity => expiry(spec, cfg.lease_duration),
            _ => None,
        };
        released
    }
}

fn holder(spec: Option<&LeaseSpec>) -> Option<&str> {
    spec.and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// `renewTime + leaseDurationSeconds`, never longer than our own lease duration.
fn expiry(spec: Option<&LeaseSpec>, max: Duration) -> Option<SystemTime> {
    let spec = spec?;
    let renewed = SystemTime::from(spec.renew_time.as_ref()?.0);
    let duration = spec.lease_duration_seconds.map_or(max, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0)).min(max)
    });
    renewed.checked_add(duration)
}

/// How much longer this replica may act on the hold `spec` shows, if it shows ours.
fn own_validity(
    spec: Option<&LeaseSpec>,
    cfg: &LeaderConfig,
    now_wall: SystemTime,
) -> Option<Duration> {
    if holder(spec) != Some(cfg.identity.as_str()) {
        return None;
    }
    let stop = expiry(spec, cfg.lease_duration)?.checked_sub(cfg.step_down_margin())?;
    let left = stop.duration_since(now_wall).ok()?;
    // A renewTime in our future (wall clock stepped back) buys no more than one lease.
    Some(left.min(cfg.lease_duration)).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};
    use kube::core::{ObjectMeta, Status};

    fn cfg() -> LeaderConfig {
        LeaderConfig::new("podha-system", "me")
    }

    fn at(t: SystemTime) -> MicroTime {
        MicroTime(Timestamp::try_from(t).unwrap())
    }

    fn spec(holder: Option<&str>, renewed: Option<SystemTime>, seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(at),
            lease_duration_seconds: seconds,
            ..LeaseSpec::default()
        }
    }

    fn apply(spec: LeaseSpec) -> watcher::Event<Lease> {
        watcher::Event::Apply(Lease {
            metadata: ObjectMeta::default(),
            spec: Some(spec),
        })
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

    #[test]
    fn own_validity_counts_from_our_renewal() {
        let cfg = cfg(); // 15 s lease, step down 2.5 s early
        let now = SystemTime::now();
        let ago = |s: u64| Some(now - secs(s));
        let cases = [
            (
                spec(Some("me"), ago(0), Some(15)),
                Some(Duration::from_millis(12_500)),
            ),
            (
                spec(Some("me"), ago(10), Some(15)),
                Some(Duration::from_millis(2_500)),
            ),
            (spec(Some("me"), ago(13), Some(15)), None),
            (
                spec(Some("me"), ago(0), Some(5)),
                Some(Duration::from_millis(2_500)),
            ),
            (
                spec(Some("me"), ago(0), Some(60)),
                Some(Duration::from_millis(12_500)),
            ),
            (
                spec(Some("me"), ago(0), None),
                Some(Duration::from_millis(12_500)),
            ),
            (
                spec(Some("me"), Some(now + secs(60)), Some(15)),
                Some(secs(15)),
            ),
            (spec(Some("me"), None, Some(15)), None),
            (spec(Some("other"), ago(0), Some(15)), None),
            (spec(None, ago(0), Some(15)), None),
        ];
        for (i, (spec, want)) in cases.into_iter().enumerate() {
            assert_eq!(own_validity(Some(&spec), &cfg, now), want, "case {i}");
        }
        assert_eq!(own_validity(None, &cfg, now), None);
    }

    #[test]
    fn view_tracks_our_hold_and_spots_releases() {
        let cfg = cfg();
        let (wall, now) = (SystemTime::now(), Instant::now());
        let mut view = LeaseView::default();

        assert!(!view.observe(
            &apply(spec(Some("me"), Some(wall), Some(15))),
            &cfg,
            wall,
            now
        ));
        assert_eq!(
            view.own_valid_until,
            Some(now + Duration::from_millis(12_500))
        );

        // Another replica holds it; our validity is gone at once.
        assert!(!view.observe(
            &apply(spec(Some("b"), Some(wall), Some(15))),
            &cfg,
            wall,
            now
        ));
        assert_eq!(view.own_valid_until, None);

        // Freed while b's hold was still valid: a release, worth competing for now.
        let later = wall + secs(3);
        assert!(view.observe(&apply(spec(None, None, None)), &cfg, later, now));

        // Freed after b's hold expired: a follower cleared it, the crate handles that itself.
        view.observe(
            &apply(spec(Some("b"), Some(wall), Some(15))),
            &cfg,
            wall,
            now,
        );
        assert!(!view.observe(&apply(spec(None, None, None)), &cfg, wall + secs(16), now));

        // A deleted lease is no hold of ours; restarts of the watch change nothing.
        view.observe(
            &apply(spec(Some("me"), Some(wall), Some(15))),
            &cfg,
            wall,
            now,
        );
        view.observe(&watcher::Event::Init, &cfg, wall, now);
        assert!(view.own_valid_until.is_some());
        let deleted = watcher::Event::Delete(Lease::default());
        assert!(!view.observe(&deleted, &cfg, wall, now));
        assert_eq!(view.own_valid_until, None);
    }

    #[test]
    fn errors_are_retried_unless_no_retry_can_help() {
        let api = |code| {
            LeaseManagerError::KubeError(kube::Error::Api(
                Status::failure("x", "y").with_code(code).boxed(),
            ))
        };
        assert_eq!(on_error(&api(500)), OnError::Retry);
        assert_eq!(on_error(&api(429)), OnError::Retry);
        assert_eq!(on_error(&api(409)), OnError::Retry);
        assert_eq!(on_error(&api(404)), OnError::Rebuild);
        assert_eq!(on_error(&api(403)), OnError::Fatal);
        assert_eq!(on_error(&api(401)), OnError::Fatal);
        assert_eq!(
            on_error(&LeaseManagerError::NonexistentLease("l".into())),
            OnError::Rebuild
        );
        assert_eq!(
            on_error(&LeaseManagerError::InconsistentState("x".into())),
            OnError::Fatal
        );
    }

    #[test]
    fn only_auth_failures_end_the_lease_watch() {
        let api = |code| kube::Error::Api(Status::failure("x", "y").with_code(code).boxed());
        assert!(watch_refused(&watcher::Error::InitialListFailed(api(403))));
        assert!(watch_refused(&watcher::Error::WatchStartFailed(api(401))));
        let gone = Status::failure("x", "Expired").with_code(410).boxed();
        assert!(!watch_refused(&watcher::Error::WatchError(gone)));
        assert!(!watch_refused(&watcher::Error::WatchFailed(api(500))));
        assert!(!watch_refused(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn retry_doubles_up_to_the_lease_duration() {
        let mut retry = Retry::new(secs(4));
        let delays: Vec<_> = (0..5).map(|_| retry.delay()).collect();
        let ms = Duration::from_millis;
        assert_eq!(delays, [ms(500), ms(1000), ms(2000), ms(4000), ms(4000)]);
        retry.reset();
        assert_eq!(retry.delay(), ms(500));
    }

    /// A fake API server that never answers a call for the Lease itself (a hung connection)
    /// and whose list of Leases is empty and watch silent. Counts the calls for the Lease.
    fn hanging_lease_api(calls: Arc<std::sync::atomic::AtomicUsize>) -> Client {
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let for_the_lease = req.uri().path().ends_with("/leases/podha-leader");
            let watching = req.uri().query().is_some_and(|q| q.contains("watch=true"));
            if for_the_lease {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            async move {
                if for_the_lease {
                    std::future::pending::<()>().await;
                }
                let body = if watching {
                    axum::body::Body::from_stream(futures::stream::pending::<
                        Result<axum::body::Bytes, std::io::Error>,
                    >())
                } else {
                    axum::body::Body::from(
                        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"LeaseList","metadata":{"resourceVersion":"1"},"items":[]}"#,
                    )
                };
                axum::http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(body)
            }
        });
        Client::new(service, "default")
    }

    /// kube's client has no read timeout: without one of podha's own a hung call for the Lease
    /// would leave the election waiting as long as the connection lives.
    #[tokio::test(start_paused = true)]
    async fn a_hung_lease_call_times_out_and_is_retried() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let cfg = LeaderConfig::new("podha-system", "me");
        let (tx, is_leader) = watch::channel(false);
        let progress = Progress::new(&cfg);
        let election = tokio::spawn(run(
            hanging_lease_api(calls.clone()),
            cfg.clone(),
            tx,
            progress.clone(),
            std::future::pending(),
        ));
        tokio::time::sleep(cfg.lease_duration * 2).await;
        let made = calls.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            made >= 3,
            "the hung call was never given up: {made} call(s)"
        );
        assert!(!*is_leader.borrow());
        assert_eq!(progress.stuck_for(), None, "failed calls are progress");
        assert!(!election.is_finished(), "a hung call is retried, not fatal");
        election.abort();
    }

    #[test]
    fn gate_notifies_on_change_and_closes_on_drop() {
        let (tx, mut rx) = watch::channel(false);
        let gate = Gate(tx);
        assert!(!gate.set(false));
        assert!(!rx.has_changed().unwrap());
        assert!(gate.set(true));
        assert!(*rx.borrow_and_update());
        drop(gate);
        assert!(!*rx.borrow());
    }
}
