//! A watcher that starts afresh, with a full list, after every error.
//!
//! kube-runtime's watcher resumes a failed watch from its last resourceVersion and says nothing
//! once it has resumed: no event tells that the stream is whole again until the next change of
//! an object. podha begins a detection gap when a watch fails and must end it exactly when its
//! view is whole again; otherwise it would stay blind after an API server blip (the gap never
//! ends) or judge nodes on a view with a hole. So a watch that fails is dropped and, after a
//! backoff, started again: its list ends with `InitDone`, which ends the gap.

use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

/// The first wait before a failed watch is started again; doubled on each failure in a row up
/// to [`MAX_BACKOFF`], back to this once a list completes.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait before the next start, after `failures` failures in a row (0: none).
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let doublings = (failures - 1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
}

struct Session<K: 'static> {
    stream: Option<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
    failures: u32,
}

/// Like [`watcher`], but every error ends the watch: the error is passed on, then a new watch
/// lists everything again after [`backoff`]. Never ends.
pub fn relisting_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let start = Session {
        stream: None,
        failures: 0,
    };
    stream::unfold(start, move |mut session| {
        let (api, config) = (api.clone(), config.clone());
        async move {
            if session.stream.is_none() {
                tokio::time::sleep(backoff(session.failures)).await;
            }
            let stream = session
                .stream
                .get_or_insert_with(|| watcher(api, config).boxed());
            // kube-runtime's watcher never ends on its own.
            let next = stream.next().await?;
            match &next {
                Ok(watcher::Event::InitDone) => session.failures = 0,
                Ok(_) => {}
                Err(_) => {
                    session.stream = None;
                    session.failures = session.failures.saturating_add(1);
                }
            }
            Some((next, session))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_quarter_second_up_to_thirty() {
        let waits: Vec<u128> = (0..10).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(
            waits,
            [0, 250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
        );
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
