//! The agent's HTTP endpoints, and what it knows of being heard.
//!
//! - `GET /heartbeat?heardMs=N` — podha's leader probes every agent with this (the request and
//!   the answer are part of [`crate::contract`]). `heardMs` is how long ago the leader last got
//!   an answer from this agent (absent: never). The agent counts itself heard at
//!   `now - heardMs`, so lost answers do not pass for being heard. Its answer says whether,
//!   after this probe, it counts itself heard in this boot: podha counts only such answers as
//!   hearing it for its silence proof (the first answer of a boot is not, until the next
//!   probe tells the agent it was heard).
//! - `GET /peer` — another agent surveying its peers: how long ago podha last heard this one.
//!
//! Both answer JSON; neither writes to the API server: thousands of nodes probed every second
//! cost the leader one small request per node per interval and the API server nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::isolation::Silence;
use crate::contract::{HEARTBEAT_PATH, HeartbeatAnswer, HeartbeatQuery};

/// What the agent knows of podha hearing it, shared by the endpoints and the check loop.
#[derive(Debug, Default)]
pub struct Hearing {
    /// `None`: podha has not heard this node since it booted.
    last: Option<HeardAgo>,
}

/// podha heard this node `ago` before `at`. Kept so rather than as the instant itself, which
/// may lie before the monotonic clock's start (a long silence recorded before a restart).
#[derive(Clone, Copy, Debug)]
struct HeardAgo {
    at: Instant,
    ago: Duration,
}

impl HeardAgo {
    fn silence(self, now: Instant) -> Duration {
        self.ago
            .saturating_add(now.saturating_duration_since(self.at))
    }
}

impl Hearing {
    /// An agent that goes on where its predecessor in this boot stopped: podha last heard this
    /// node `heard_ago` before `now` (`None`: never since the node booted).
    pub fn resumed(now: Instant, heard_ago: Option<Duration>) -> Self {
        Self {
            last: heard_ago.map(|ago| HeardAgo { at: now, ago }),
        }
    }

    /// A probe arrived at `now`, from a leader that last heard this agent `heard_ago` ago.
    pub fn probed(&mut self, now: Instant, heard_ago: Option<Duration>) {
        let Some(ago) = heard_ago else {
            return;
        };
        let heard = HeardAgo { at: now, ago };
        if self.last.is_none_or(|last| ago < last.silence(now)) {
            self.last = Some(heard);
        }
    }

    /// How long podha has not heard this agent: since it was last heard, or
    /// [`Silence::NeverHeard`] (no probe ever said podha got an answer, in this agent or, as
    /// the hearing file says, in an earlier one since the node booted).
    pub fn silence(&self, now: Instant) -> Silence {
        self.last
            .map_or(Silence::NeverHeard, |last| Silence::For(last.silence(now)))
    }

    /// How long ago podha last heard this agent, if ever.
    pub fn heard_ago(&self, now: Instant) -> Option<Duration> {
        self.last.map(|last| last.silence(now))
    }
}

pub type SharedHearing = Arc<Mutex<Hearing>>;

#[derive(Clone)]
struct AppState {
    node: Arc<str>,
    hearing: SharedHearing,
}

/// The answer to a peer's survey.
#[derive(Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerAnswer {
    pub node: String,
    /// How long ago podha last heard this agent, in milliseconds; absent: never.
    pub heard_ago_ms: Option<u64>,
}

pub fn router(node: &str, hearing: SharedHearing) -> Router {
    Router::new()
        .route(HEARTBEAT_PATH, get(heartbeat))
        .route("/peer", get(peer))
        .with_state(AppState {
            node: node.into(),
            hearing,
        })
}

pub(super) fn lock(hearing: &SharedHearing) -> std::sync::MutexGuard<'_, Hearing> {
    // A panic while holding it cannot leave a Hearing half-updated: keep going.
    hearing.lock().unwrap_or_else(|e| e.into_inner())
}

async fn heartbeat(
    State(state): State<AppState>,
    Query(q): Query<HeartbeatQuery>,
) -> axum::Json<HeartbeatAnswer> {
    let now = Instant::now();
    let heard = {
        let mut hearing = lock(&state.hearing);
        hearing.probed(now, q.heard_ago());
        hearing.heard_ago(now).is_some()
    };
    axum::Json(HeartbeatAnswer {
        node: state.node.to_string(),
        heard,
    })
}

async fn peer(State(state): State<AppState>) -> axum::Json<PeerAnswer> {
    let ago = lock(&state.hearing).heard_ago(Instant::now());
    axum::Json(PeerAnswer {
        node: state.node.to_string(),
        heard_ago_ms: ago.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lost_answers_do_not_count_as_heard() {
        let mut h = Hearing::default();
        tokio::time::advance(Duration::from_secs(5)).await;
        // The leader's first probe: it never heard this agent.
        h.probed(Instant::now(), None);
        assert_eq!(h.heard_ago(Instant::now()), None);
        // It got that answer: heard a second ago.
        tokio::time::advance(Duration::from_secs(1)).await;
        h.probed(Instant::now(), Some(Duration::from_secs(1)));
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(1))
        );
        // From now on the answers are lost: the probes keep coming, saying so.
        for ago in 2..=10 {
            tokio::time::advance(Duration::from_secs(1)).await;
            h.probed(Instant::now(), Some(Duration::from_secs(ago)));
        }
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(10))
        );
        // A late, older probe does not move the time back.
        h.probed(Instant::now(), Some(Duration::from_secs(30)));
        assert_eq!(h.heard_ago(Instant::now()), Some(Duration::from_secs(10)));
    }

    /// The answer says whether the agent counts itself heard in this boot, after the probe:
    /// not at a never-heard agent's first probe, yes once a probe said podha got an answer,
    /// and yes at a new leader's first probe (no `heardMs`) to an agent heard before.
    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_answer_says_whether_the_agent_counts_itself_heard() {
        let ask = |hearing: &SharedHearing, heard_ms: Option<u64>| {
            let state = AppState {
                node: "n1".into(),
                hearing: hearing.clone(),
            };
            heartbeat(State(state), Query(HeartbeatQuery { heard_ms }))
        };
        let hearing: SharedHearing = Arc::default();
        let first = ask(&hearing, None).await.0;
        assert_eq!(
            first,
            HeartbeatAnswer {
                node: "n1".into(),
                heard: false,
            }
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(ask(&hearing, Some(1000)).await.0.heard);
        assert!(
            ask(&hearing, None).await.0.heard,
            "a new leader's first probe"
        );
        let resumed = Arc::new(Mutex::new(Hearing::resumed(
            Instant::now(),
            Some(Duration::from_secs(5)),
        )));
        assert!(
            ask(&resumed, None).await.0.heard,
            "heard in this boot before"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_podha_never_heard_has_no_silence_to_count() {
        // podha cannot reach this agent since the node booted: the agent counts no silence,
        // however long it runs.
        let mut h = Hearing::default();
        tokio::time::advance(Duration::from_secs(600)).await;
        h.probed(Instant::now(), None);
        assert_eq!(h.silence(Instant::now()), Silence::NeverHeard);
        assert_eq!(h.heard_ago(Instant::now()), None);
        let fresh = Hearing::resumed(Instant::now(), None);
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(fresh.silence(Instant::now()), Silence::NeverHeard);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_agent_is_as_unheard_as_its_predecessor() {
        tokio::time::advance(Duration::from_secs(100)).await;
        let h = Hearing::resumed(Instant::now(), Some(Duration::from_secs(25)));
        assert_eq!(
            h.silence(Instant::now()),
            Silence::For(Duration::from_secs(25))
        );
        assert_eq!(h.heard_ago(Instant::now()), Some(Duration::from_secs(25)));
        // Longer ago than the monotonic clock reaches back: still that long, never "now".
        let long_ago = Duration::from_secs(10 * 365 * 86_400);
        let h = Hearing::resumed(Instant::now(), Some(long_ago));
        tokio::time::advance(Duration::from_secs(1)).await;
        let expected = long_ago + Duration::from_secs(1);
        assert_eq!(h.silence(Instant::now()), Silence::For(expected));
    }
}
