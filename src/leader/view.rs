//! What this replica reads from its own watch of the Lease: how long its hold lets it write,
//! and whether another replica's hold was released early.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::runtime::watcher;
use tokio::time::Instant;

use super::LeaderConfig;
use crate::contract::lease_term;

/// What our own watch of the Lease object last showed.
#[derive(Debug, Default)]
pub(super) struct LeaseView {
    /// Until when our last observed renewal lets us act, and in which term
    /// ([`term`]).
    pub(super) own_valid_until: Option<(Instant, u64)>,
    /// When another replica's hold, as last observed, runs out by our clock.
    other_expiry: Option<SystemTime>,
}

impl LeaseView {
    /// Returns `true` when the lease was freed before its holder's hold ran out: a release, as
    /// opposed to a follower clearing an expired hold.
    pub(super) fn observe(
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
        self.own_valid_until =
            own_validity(spec, cfg, now_wall).map(|left| (now + left, lease_term(spec)));
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
    use kube::core::ObjectMeta;

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
            Some((now + Duration::from_millis(12_500), 0))
        );
        // Taken again (a transition): another term, however close the renewal.
        let mut taken_again = spec(Some("me"), Some(wall), Some(15));
        taken_again.lease_transitions = Some(4);
        view.observe(&apply(taken_again), &cfg, wall, now);
        assert_eq!(
            view.own_valid_until,
            Some((now + Duration::from_millis(12_500), 4))
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
}
