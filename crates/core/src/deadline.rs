//! Instants a user-given duration away. The CRD bounds every duration from below only, and its
//! validation can be bypassed; `Instant + Duration` panics when the sum does not fit, so a
//! duration of a thousand years must mean "not in this process's lifetime", not a crash.

use std::time::Duration;

use tokio::time::Instant;

/// The longest wait podha schedules: far beyond any process's life, yet small enough to add to
/// any `Instant` of a running system.
pub const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `wait` after `now`; a wait longer than [`LONGEST`] counts as [`LONGEST`].
pub fn after(now: Instant, wait: Duration) -> Instant {
    now + wait.min(LONGEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absurd_wait_is_the_longest_wait_not_a_panic() {
        let now = Instant::now();
        let five = Duration::from_secs(5);
        assert_eq!(after(now, five), now + five);
        assert_eq!(after(now, Duration::MAX), now + LONGEST);
    }
}
