//! Every backoff podha waits by, built one way: `backon`'s exponential backoff (the one
//! kube-runtime's own watcher backoffs are made of), so each use differs only in its parameters,
//! named here once.
//!
//! | use | first | factor | longest | jitter | ends | starts over |
//! |---|---|---|---|---|---|---|
//! | [`lease_retry`] | 500 ms | 2 | the lease duration | no | never | on success |
//! | [`rewatch`] | 250 ms | 2 | 30 s | no | never | once a list completes |
//! | [`node_watch`] | 800 ms | 2 | 30 s | up to +100 % | never | on an event, or after 120 s without a wait |
//! | [`quick_restarts`] | given | 2 | given | no | after the given count | when a worker settled |
//! | [`action_retry`] | 500 ms | 2 | 30 s | no | never | on success |
//!
//! One wait is no backoff: an action answered whose effect has not shown yet (a BMC that does
//! not say `Off` yet) is sent again every [`POLL_INTERVAL`], [`POLLS_AT_INTERVAL`] times, then
//! every [`ACTION_RETRY_MAX`].
//!
//! Every backoff here is a [`Backoff`]: an iterator of delays that [`Backoff::reset`] starts
//! over, which is also what kube-runtime's `WatchStreamExt::backoff` takes.

use std::time::Duration;

use backon::ExponentialBuilder;
use kube::runtime::utils::ResetTimerBackoff;

pub use kube::runtime::utils::Backoff;

/// Delays doubling from a first one to a longest one; [`Backoff::reset`] goes back to the first.
pub type Exponential = kube::runtime::watcher::ExponentialBackoff;

fn doubling(first: Duration, longest: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(longest)
        .with_factor(2.0)
        .without_max_times()
}

/// Between failed turns of the leader election, and between restarts of its watch of the
/// Lease: 500 ms doubling up to `lease_duration`, reset by the caller on success. Capped at
/// the lease so a follower tries at least once per lease, and so the watch, without which no
/// replica may lead, comes back within a lease after an API server outage rather than after
/// kube-runtime's default 30 s.
pub fn lease_retry(lease_duration: Duration) -> Exponential {
    doubling(Duration::from_millis(500), lease_duration).into()
}

/// The longest wait of [`rewatch`].
pub const REWATCH_MAX: Duration = Duration::from_secs(30);

/// Before a failed watch of the decision loop is started again (`runtime::rewatch`): 250 ms
/// doubling up to [`REWATCH_MAX`] for as long as failures go on; a completed list starts over.
pub fn rewatch() -> Exponential {
    doubling(Duration::from_millis(250), REWATCH_MAX).into()
}

/// The agent's watch of its own Node: kube-runtime's default watcher backoff, which follows
/// client-go's reflector: 800 ms doubling up to 30 s, each delay plus a random 0–100 % of
/// itself, starting over on any event and when more than 120 s passed since the last wait.
pub fn node_watch() -> ResetTimerBackoff<Exponential> {
    let delays = doubling(Duration::from_millis(800), Duration::from_secs(30)).with_jitter();
    ResetTimerBackoff::new(delays.into(), Duration::from_secs(120))
}

/// Before the agent's supervisor starts a worker after one that died quickly: `first`
/// doubling up to `longest`, ending after `times` delays (where the supervisor gives up).
pub fn quick_restarts(first: Duration, longest: Duration, times: usize) -> Exponential {
    doubling(first, longest).with_max_times(times).into()
}

/// Between two sends of an action that was answered but whose effect has not shown yet: the
/// read of a BMC's power state after a `ForceOff` it accepted (it applies it seconds later).
/// One read a second per node being powered off; the moment the BMC says `Off` is seen within
/// it.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How many answers without the effect are asked again every [`POLL_INTERVAL`] (20 s: a BMC
/// applies a reset within seconds, and each read also reads its Secret); later ones every
/// [`ACTION_RETRY_MAX`].
pub const POLLS_AT_INTERVAL: u32 = 20;

/// The longest wait of [`action_retry`].
pub const ACTION_RETRY_MAX: Duration = Duration::from_secs(30);

/// Before the decision loop sends a failed action again: 500 ms doubling up to
/// [`ACTION_RETRY_MAX`] per action, starting over once it succeeds.
pub fn action_retry() -> Exponential {
    doubling(Duration::from_millis(500), ACTION_RETRY_MAX).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(backoff: impl Iterator<Item = Duration>, n: usize) -> Vec<u128> {
        backoff.take(n).map(|d| d.as_millis()).collect()
    }

    #[test]
    fn lease_retry_doubles_up_to_the_lease_duration_and_starts_over() {
        let mut retry = lease_retry(Duration::from_secs(4));
        let delays: Vec<u128> = (0..5)
            .filter_map(|_| retry.next())
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 4000]);
        retry.reset();
        assert_eq!(retry.next(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn rewatch_doubles_from_a_quarter_second_up_to_thirty_for_good() {
        assert_eq!(
            millis(rewatch(), 10),
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(rewatch().nth(10_000), Some(REWATCH_MAX));
    }

    #[test]
    fn node_watch_is_kube_runtimes_default() {
        let bases = [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000];
        let mut waits = node_watch();
        for base in bases {
            let wait = waits.next().expect("never ends").as_millis();
            assert!(base <= wait && wait <= 2 * base, "{wait} ms for {base} ms");
        }
        waits.reset();
        let first = waits.next().expect("never ends").as_millis();
        assert!((800..=1600).contains(&first), "{first} ms after a reset");
    }

    #[tokio::test(start_paused = true)]
    async fn node_watch_starts_over_after_two_minutes_without_a_wait() {
        let mut waits = node_watch();
        for _ in 0..5 {
            waits.next();
        }
        tokio::time::sleep(Duration::from_secs(121)).await;
        let first = waits.next().expect("never ends").as_millis();
        assert!((800..=1600).contains(&first), "{first} ms");
    }

    #[test]
    fn quick_restarts_double_up_to_the_longest_and_end() {
        let waits = quick_restarts(Duration::from_millis(100), Duration::from_secs(1), 10);
        assert_eq!(
            millis(waits, 20),
            [100, 200, 400, 800, 1000, 1000, 1000, 1000, 1000, 1000]
        );
    }

    #[test]
    fn action_retry_doubles_from_half_a_second_up_to_thirty() {
        let mut waits = action_retry();
        assert_eq!(
            millis(&mut waits, 9),
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        waits.reset();
        assert_eq!(waits.next(), Some(Duration::from_millis(500)));
    }
}
