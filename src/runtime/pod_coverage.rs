//! How many of each policy's pods podha would fail over now, and why not the others
//! ([`crate::protection::coverage`], the rules `podha explain` answers with), kept by the
//! leader for the policies' statuses and `podha_pods`.
//!
//! Working it out reads every pod with a volume (and, for a pod with no target, every node), so
//! it runs off the decision loop, on a copy of the view, one at a time: again once something it
//! reads has changed, at most every [`EVERY`], and at least every [`AT_LEAST`] (an agent's
//! Lease lapses without any change to watch); never sooner than twice the time the last one
//! took, so at most half a core on a cluster where it is slow. It reads only the watch caches:
//! no API request beyond the status patch that carries it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::protection::Coverage;

/// The shortest time between the starts of two workings-out: a busy cluster changes every
/// moment.
pub const EVERY: Duration = Duration::from_secs(5);

/// The longest time between two workings-out: rules that depend on time (an agent's Lease
/// renewed too long ago) change without a watch event.
pub const AT_LEAST: Duration = Duration::from_secs(30);

/// The last coverage worked out, and whether it is due again.
#[derive(Default)]
pub struct PodCoverage {
    changed: bool,
    /// When the last working-out started (from the view of that moment).
    started: Option<Instant>,
    /// How long the last one took: the next starts no sooner than twice that after it, so
    /// that working it out never takes more than half a core, however large the cluster.
    took: Duration,
    by_policy: BTreeMap<String, Coverage>,
}

impl PodCoverage {
    /// Something coverage reads has changed.
    pub fn changed(&mut self) {
        self.changed = true;
    }

    /// Whether to start working it out again at `now`.
    pub fn due(&self, now: Instant) -> bool {
        match self.started {
            None => true,
            Some(at) => {
                let since = now.saturating_duration_since(at);
                let spaced = since >= self.took * 2;
                spaced && (since >= AT_LEAST || (self.changed && since >= EVERY))
            }
        }
    }

    /// A working-out starts at `now`, from what is known now: a change after this counts for
    /// the next one.
    pub fn start(&mut self, now: Instant) {
        self.started = Some(now);
        self.changed = false;
    }

    /// The coverage a working-out came to, and how long it took.
    pub fn set(&mut self, by_policy: BTreeMap<String, Coverage>, took: Duration) {
        self.by_policy = by_policy;
        self.took = took;
    }

    /// `policy`'s coverage, once worked out (`None` before: the status keeps what it said).
    pub fn of(&self, policy: &str) -> Option<&Coverage> {
        self.by_policy.get(policy)
    }

    /// Forgets it all: a replica that leads again works it out at once.
    pub fn forget(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn due_at_once_then_on_change_at_most_every_few_seconds_and_at_least_twice_a_minute() {
        let t0 = Instant::now();
        let mut coverage = PodCoverage::default();
        assert!(coverage.due(t0), "never worked out");
        coverage.start(t0);
        assert!(!coverage.due(t0 + Duration::from_secs(1)));
        coverage.changed();
        assert!(!coverage.due(t0 + EVERY - Duration::from_millis(1)));
        assert!(coverage.due(t0 + EVERY));
        coverage.start(t0 + EVERY);
        // A change while it runs counts for the next one.
        coverage.changed();
        coverage.set(BTreeMap::new(), Duration::from_millis(50));
        assert!(coverage.due(t0 + EVERY * 2));
        coverage.start(t0 + EVERY * 2);
        assert!(!coverage.due(t0 + EVERY * 2 + AT_LEAST - Duration::from_millis(1)));
        assert!(
            coverage.due(t0 + EVERY * 2 + AT_LEAST),
            "no change, but time passed"
        );
        coverage.forget();
        assert!(coverage.due(t0 + EVERY), "forgotten: due at once");
    }
}
