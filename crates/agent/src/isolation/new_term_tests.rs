//! A new leader that has not heard this node: the agent stays up while its Lease renewals keep
//! that leader from counting its silence, and not a moment longer than the proof allows.

use super::*;
use crate::server::Hearing;
use Silence::For;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const T: Duration = Duration::from_secs(30);
const WATCHDOG: Duration = Duration::from_secs(10);

/// Three peers answered, all heard: podha hears a majority and could prove this node's
/// silence, so without a new leader the agent fences.
fn peers_heard() -> Survey {
    Survey {
        peers: PeerCount::Known(3),
        answers: vec![Some(secs(1)); 3],
    }
}

fn new_term(renewed_ago: Duration) -> NewTerm {
    NewTerm {
        heard_in: 4,
        leads: 5,
        renewed_ago,
    }
}

#[test]
fn the_window_leaves_the_watchdog_time_to_fire_within_the_isolation_timeout() {
    assert_eq!(renewal_window(secs(40), Some(secs(10))), secs(30));
    assert_eq!(renewal_window(secs(8), Some(secs(4))), secs(4));
    assert_eq!(renewal_window(secs(30), None), secs(15));
    for (timeout, watchdog) in [
        (secs(8), secs(4)),
        (secs(40), secs(10)),
        (secs(30), secs(15)),
    ] {
        assert!(renewal_window(timeout, Some(watchdog)) + watchdog <= timeout);
    }
}

#[test]
fn a_node_a_new_leader_never_heard_stays_and_pets_where_it_would_fence() {
    let survey = peers_heard();
    assert!(matches!(
        decide(For(T), T, Some(&survey), None),
        Verdict::Fence(_)
    ));
    assert!(!pet_watchdog(For(T), T, WATCHDOG, Some(&survey), None));
    let t = new_term(secs(3));
    let Verdict::Stay(why) = decide(For(secs(600)), T, Some(&survey), Some(t)) else {
        panic!("a new leader that cannot count the silence: stay")
    };
    assert!(why.contains("term 4") && why.contains("term 5"), "{why}");
    assert!(pet_watchdog(For(secs(600)), T, WATCHDOG, None, Some(t)));
    // Heard, never heard, or held: as before, whatever the term.
    assert_eq!(decide(For(secs(1)), T, None, Some(t)), Verdict::Heard);
    assert!(matches!(
        decide(Silence::Held, T, None, Some(t)),
        Verdict::Stay(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn only_a_later_term_and_a_recent_renewal_make_a_new_leader_that_cannot_count() {
    let window = secs(20);
    let now = Instant::now();
    let heard = || {
        let mut h = Hearing::resumed(now, Some(secs(40)), false);
        h.heard_in_term(Some(4));
        h.lease_renewed(now - secs(5));
        h
    };
    let t = heard().new_term(Some(5), now, window);
    assert_eq!(t, Some(new_term(secs(5))));
    assert_eq!(
        heard().new_term(Some(4), now, window),
        None,
        "the same term"
    );
    assert_eq!(
        heard().new_term(Some(3), now, window),
        None,
        "a Lease recreated"
    );
    assert_eq!(
        heard().new_term(None, now, window),
        None,
        "no leader Lease seen"
    );
    assert_eq!(
        heard().new_term(Some(5), now, secs(4)),
        None,
        "renewed too long ago"
    );
    let mut older = heard();
    older.heard_in_term(Some(2));
    assert_eq!(
        older.new_term(Some(5), now, window).map(|t| t.heard_in),
        Some(4),
        "the latest term heard counts"
    );
    older.heard_in_term(Some(5));
    assert_eq!(older.new_term(Some(5), now, window), None, "heard by it");
    let mut no_term = Hearing::resumed(now, Some(secs(40)), false);
    no_term.lease_renewed(now);
    assert_eq!(
        no_term.new_term(Some(5), now, window),
        None,
        "no heartbeat named its term"
    );
    let mut unrenewed = Hearing::resumed(now, Some(secs(40)), false);
    unrenewed.heard_in_term(Some(4));
    assert_eq!(
        unrenewed.new_term(Some(5), now, window),
        None,
        "never renewed"
    );
    let mut never = Hearing::resumed(now, None, false);
    never.heard_in_term(Some(4));
    never.lease_renewed(now);
    assert_eq!(
        never.new_term(Some(5), now, window),
        None,
        "never heard in this boot (it stays anyway)"
    );
}

/// The bound the podha side relies on: a new term that began after the agent's last renewal
/// was sent proves the silence no earlier than the isolation timeout after that renewal (its
/// first unanswered probe comes later still). Renewals that stop at some point leave the
/// agent petting its watchdog no later than the window after the last one, so the watchdog
/// fires within the isolation timeout of it, for every timing the agent accepts.
#[tokio::test(start_paused = true)]
async fn renewals_that_stop_leave_the_watchdog_to_fire_before_a_new_leader_could_prove() {
    for (timeout, watchdog) in [
        (secs(8), secs(4)),
        (secs(40), secs(10)),
        (secs(30), secs(15)),
    ] {
        let window = renewal_window(timeout, Some(watchdog));
        let start = Instant::now();
        let mut hearing = Hearing::resumed(start, Some(timeout), false);
        hearing.heard_in_term(Some(1));
        let renew_every = (window / 3).max(secs(1));
        let stop_renewing = start + secs(50);
        let (mut last_sent, mut last_pet, mut next_renewal) = (None, None, start);
        let mut now = start;
        while now < start + secs(200) {
            if now >= next_renewal && now < stop_renewing {
                hearing.lease_renewed(now);
                last_sent = Some(now);
                next_renewal = now + renew_every;
            }
            let silence = hearing.silence(now);
            let t = hearing.new_term(Some(2), now, window);
            if pet_watchdog(silence, timeout, watchdog, Some(&peers_heard()), t) {
                last_pet = Some(now);
            }
            now += Duration::from_millis(100);
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        let (last_sent, last_pet) = (last_sent.expect("renewed"), last_pet.expect("petted"));
        assert!(
            last_pet > stop_renewing - secs(1),
            "kept up while renewing ({timeout:?}, {watchdog:?})"
        );
        assert!(
            last_pet + watchdog <= last_sent + timeout,
            "the watchdog fires {:?} after the last renewal, past the isolation timeout \
             {timeout:?}",
            last_pet + watchdog - last_sent
        );
    }
}
