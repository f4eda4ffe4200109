//! What the election tells the rest of the runtime: a [`Claim`] with an expiry, and the one
//! question every writer asks of it, [`Leadership::may_write`].
//!
//! The expiry is the instant [`super::run`] already steps down at (`R + d - m`, see the module
//! docs of [`super`]). A reader compares it with the time it is about to write, so a claim that
//! ran out is refused even if [`super::run`] has not withdrawn it yet (its task not polled, its
//! timer late).

use tokio::sync::watch;
use tokio::time::Instant;

/// This replica's hold on the leader lease, as the election last confirmed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The instant from which this hold no longer lets the replica write.
    pub expires: Instant,
    /// The leadership term: the Lease's `leaseTransitions` as this hold shows it (see
    /// `crate::contract::lease_term`). Another value is another term, even for the same replica.
    pub term: u64,
}

impl Claim {
    /// A hold of term `term` that lets the replica write until `expires`.
    pub fn of_term(term: u64, expires: Instant) -> Self {
        Self { expires, term }
    }

    /// A hold of term 0 that lets the replica write until `expires` (tests).
    #[cfg(test)]
    pub fn until(expires: Instant) -> Self {
        Self::of_term(0, expires)
    }

    /// A hold that outlasts any test.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self::until(Instant::now() + std::time::Duration::from_secs(24 * 3600))
    }

    /// Whether the hold still lets the replica write at `now`.
    pub fn is_current_at(&self, now: Instant) -> bool {
        now < self.expires
    }
}

/// The reading end of the election: whether this replica may write at a given instant.
#[derive(Clone, Debug)]
pub struct Leadership(watch::Receiver<Option<Claim>>);

/// What [`super::run`] publishes into, and the [`Leadership`] that reads it. Nothing is claimed
/// until the election says so.
pub fn channel() -> (watch::Sender<Option<Claim>>, Leadership) {
    let (tx, rx) = watch::channel(None);
    (tx, Leadership(rx))
}

impl Leadership {
    /// Whether this replica may send a write at `now`: it holds a claim and the claim is current
    /// at `now`. Ask right before each request; an answer given before an await is stale after
    /// it.
    pub fn may_write(&self, now: Instant) -> bool {
        self.0
            .borrow()
            .is_some_and(|claim| claim.is_current_at(now))
    }

    /// The term of the claim current at `now`, if there is one: what a heartbeat sent at `now`
    /// signs (see `crate::contract::words`), and what tells one term from the next.
    pub fn term(&self, now: Instant) -> Option<u64> {
        self.0
            .borrow()
            .filter(|claim| claim.is_current_at(now))
            .map(|claim| claim.term)
    }

    /// The claim as last published, current or not.
    #[cfg(test)]
    pub fn claim(&self) -> Option<Claim> {
        *self.0.borrow()
    }
}

/// The election's end: publishes the claim, and withdraws it however [`super::run`] ends
/// (return, error, panic, drop).
pub(super) struct Publisher(pub(super) watch::Sender<Option<Claim>>);

impl Publisher {
    /// Publishes `claim`; returns `Some(leading)` when that changes whether there is a claim at
    /// all. Receivers are woken only when the value changes (a renewal moves the expiry).
    pub(super) fn set(&self, claim: Option<Claim>) -> Option<bool> {
        let mut flipped = None;
        self.0.send_if_modified(|current| {
            if current.is_some() != claim.is_some() {
                flipped = Some(claim.is_some());
            }
            let changed = *current != claim;
            *current = claim;
            changed
        });
        flipped
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.set(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn publisher_notifies_on_change_and_withdraws_on_drop() {
        let (tx, leadership) = channel();
        let mut rx = leadership.0.clone();
        let publisher = Publisher(tx);
        assert_eq!(publisher.set(None), None);
        assert!(!rx.has_changed().unwrap());
        let claim = Claim::until(Instant::now() + Duration::from_secs(10));
        assert_eq!(publisher.set(Some(claim)), Some(true));
        assert_eq!(*rx.borrow_and_update(), Some(claim));
        assert!(leadership.may_write(Instant::now()));
        // A renewal moves the expiry: receivers see it, leadership did not flip.
        let renewed = Claim::until(claim.expires + Duration::from_secs(10));
        assert_eq!(publisher.set(Some(renewed)), None);
        assert!(rx.has_changed().unwrap());
        drop(publisher);
        assert_eq!(*rx.borrow(), None);
        assert!(!leadership.may_write(Instant::now()));
    }

    /// The claim is refused from its expiry on, whether or not the election has withdrawn it:
    /// a reader that runs after the expiry and before the election task writes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_claim_past_its_expiry_refuses_writes() {
        let (tx, leadership) = channel();
        let expires = Instant::now() + Duration::from_secs(5);
        tx.send_replace(Some(Claim::until(expires)));
        assert!(leadership.may_write(Instant::now()));
        tokio::time::sleep(Duration::from_millis(4_999)).await;
        assert!(leadership.may_write(Instant::now()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            !leadership.may_write(Instant::now()),
            "refused at the expiry"
        );
        assert_eq!(
            leadership.claim(),
            Some(Claim::until(expires)),
            "not withdrawn"
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!leadership.may_write(Instant::now()));
        assert!(!Claim::until(expires).is_current_at(expires));
    }
}
