//! A watcher that starts afresh, with a full list, after every error.
//!
//! kube-runtime's watcher resumes a failed watch from its last resourceVersion and says nothing
//! once it has resumed: no event tells that the stream is whole again until the next change of
//! an object. podha begins a detection gap when a watch fails and must end it exactly when its
//! view is whole again; otherwise it would stay blind after an API server blip (the gap never
//! ends) or judge nodes on a view with a hole. So a watch that fails is dropped and, after a
//! backoff, started again: its list ends with `InitDone`, which ends the gap.
//!
//! A watch can also stall without failing: a connection black-holed on the way (a dead
//! load balancer, a partition) gives neither an error nor an event, and kube-runtime's watcher
//! (kube 5's client has no read timeout) just waits, for minutes or for good. For a
//! kind whose objects are known to change all the time, silence is itself a sign: every kubelet
//! renews its Lease every 10 s, so a Lease watch with no event for [`LEASE_STALL_BOUND`] is taken
//! as stalled, reported ([`Fault::Stalled`]) and started again like a failed one. The report opens
//! a gap, so the silence is never read as the death of every node.

use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::backoff::{self, Exponential};

/// How long the watch of `kube-node-lease` may go without any event before it counts as
/// stalled: one and a half kubelet renew intervals (10 s each), so one live kubelet is enough to
/// keep it from tripping. The gap it opens then starts before any Lease has been silent for
/// 25 s, short of the default `leaseGracePeriod` (40 s).
pub const LEASE_STALL_BOUND: Duration = Duration::from_secs(15);

/// Why a watch is started again.
#[derive(Debug)]
pub enum Fault {
    /// kube-runtime's watcher reported an error.
    Failed(watcher::Error),
    /// No event at all within the bound.
    Stalled(Duration),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(error) => error.fmt(f),
            Self::Stalled(bound) => write!(f, "no event for {bound:?}: the watch stalled"),
        }
    }
}

struct Session<K: 'static> {
    stream: Option<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
    /// The wait before the next start: none at first, then what the failure that ended the
    /// last watch set.
    wait: Duration,
    /// The waits of the failures in a row so far, if any.
    failing: Option<Exponential>,
}

/// Like [`watcher`], but every error ends the watch: the error is passed on, then a new watch
/// lists everything again after [`backoff::rewatch`]. With `stall_bound`, no event within it
/// counts as an error too. Never ends.
pub fn relisting_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    stall_bound: Option<Duration>,
) -> impl Stream<Item = Result<watcher::Event<K>, Fault>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let start = Session {
        stream: None,
        wait: Duration::ZERO,
        failing: None,
    };
    stream::unfold(start, move |mut session| {
        let (api, config) = (api.clone(), config.clone());
        async move {
            if session.stream.is_none() {
                tokio::time::sleep(session.wait).await;
            }
            let stream = session
                .stream
                .get_or_insert_with(|| watcher(api, config).boxed());
            // kube-runtime's watcher never ends on its own.
            let next = match stall_bound {
                Some(bound) => match tokio::time::timeout(bound, stream.next()).await {
                    Ok(next) => next?.map_err(Fault::Failed),
                    Err(_) => Err(Fault::Stalled(bound)),
                },
                None => stream.next().await?.map_err(Fault::Failed),
            };
            match &next {
                Ok(watcher::Event::InitDone) => session.failing = None,
                Ok(_) => {}
                Err(_) => {
                    session.stream = None;
                    let waits = session.failing.get_or_insert_with(backoff::rewatch);
                    session.wait = waits.next().unwrap_or(backoff::REWATCH_MAX);
                }
            }
            Some((next, session))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ClusterState, Watch, watches};
    use http::Method;
    use podha_fake_api::{FakeApi, Reply, Request};
    use tokio::time::Instant;

    /// A fake API server whose lists answer at once (one Lease, `n1`, and nothing else) and
    /// whose watches are accepted and then pass nothing, as through a black-holed connection.
    fn stalling_api() -> FakeApi {
        let list = |items: serde_json::Value| {
            serde_json::json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": "5"}, "items": items})
        };
        let lease = serde_json::json!([{
            "metadata": {"name": "n1", "namespace": "kube-node-lease", "resourceVersion": "5"},
            "spec": {"holderIdentity": "n1", "renewTime": "2026-01-01T00:00:00.000000Z"},
        }]);
        let answer = move |items: serde_json::Value| {
            move |req: &Request| {
                if req.watching() {
                    Reply::silent_watch()
                } else {
                    Reply::json(200, list(items.clone()))
                }
            }
        };
        FakeApi::new()
            .on(Method::GET, NODE_LEASES, answer(lease))
            .on(Method::GET, "/*", answer(serde_json::json!([])))
    }

    /// The kubelets' Leases.
    const NODE_LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

    /// How many times `api` was asked for a list (not a watch) of the kubelets' Leases.
    fn lease_lists(api: &FakeApi) -> usize {
        api.requests()
            .iter()
            .filter(|r| r.path == NODE_LEASES && !r.watching())
            .count()
    }

    /// Every kubelet renews its Lease every 10 s: a Lease watch that passes nothing for longer
    /// is podha's blindness, not the death of every node. It opens a gap, lists again, and the
    /// list ends the gap with the Lease clock restarted.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_lease_watch_is_a_gap_until_it_lists_again() {
        let api = stalling_api();
        let mut changes = watches(&api.client(), "podha");
        let mut state = ClusterState::default();
        while !state.synced() {
            let change = changes.next().await.expect("the watches never end");
            state.apply(change, Instant::now());
        }
        assert!(!state.detection_gap());
        let synced_at = Instant::now();

        // Nothing arrives on any watch from now on.
        let stall = async {
            loop {
                let change = changes.next().await.expect("the watches never end");
                let stalled = matches!(
                    change,
                    crate::runtime::Change::WatchError {
                        watch: Watch::Lease
                    }
                );
                state.apply(change, Instant::now());
                if stalled {
                    return Instant::now();
                }
            }
        };
        let stalled_at = tokio::time::timeout(Duration::from_secs(600), stall)
            .await
            .expect("a Lease watch silent for ten minutes was never reported as stalled");
        assert_eq!(stalled_at - synced_at, LEASE_STALL_BOUND);
        assert!(state.detection_gap());
        assert!(state.observations["n1"].in_gap(), "the silence is a gap");

        // The watch lists again; its list ends the gap and restarts the Lease clock.
        while state.detection_gap() {
            let change = changes.next().await.expect("the watches never end");
            state.apply(change, Instant::now());
        }
        assert_eq!(lease_lists(&api), 2);
        let obs = &state.observations["n1"];
        assert!(!obs.in_gap());
        assert!(
            obs.lease_baseline() > stalled_at,
            "the Lease clock restarted"
        );
    }
}
