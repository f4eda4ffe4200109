//! The agent stays up while its Lease renewals keep podha from counting its silence (a new
//! leader that has not heard this node, or a leader that counts from the renewals), and not a
//! moment longer than the proof allows.

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

fn new_term(renewed_ago: Duration) -> Renewing {
    Renewing {
        why: RenewalsCount::NewTerm {
            heard_in: 4,
            leads: 5,
        },
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

#[test]
fn a_node_whose_renewals_a_leader_counts_from_stays_and_pets_where_it_would_fence() {
    let survey = peers_heard();
    let renewing = Renewing {
        why: RenewalsCount::FromRenewals,
        renewed_ago: secs(2),
    };
    let Verdict::Stay(why) = decide(For(secs(600)), T, Some(&survey), Some(renewing)) else {
        panic!("podha counts from the renewals: stay")
    };
    assert!(why.contains("renewed 2s ago"), "{why}");
    assert!(pet_watchdog(
        For(secs(600)),
        T,
        WATCHDOG,
        Some(&survey),
        Some(renewing)
    ));
}

#[tokio::test(start_paused = true)]
async fn only_a_later_term_and_a_recent_renewal_make_a_new_leader_that_cannot_count() {
    // (A leader that counts from the renewals is below.)
    let window = secs(20);
    let now = Instant::now();
    let heard = || {
        let mut h = Hearing::resumed(now, Some(secs(40)), false);
        h.heard_in_term(Some(4));
        h.lease_renewed(now - secs(5));
        h
    };
    let t = heard().renewing(Some(5), now, window);
    assert_eq!(t, Some(new_term(secs(5))));
    assert_eq!(
        heard().renewing(Some(4), now, window),
        None,
        "the same term"
    );
    assert_eq!(
        heard().renewing(Some(3), now, window),
        None,
        "a Lease recreated"
    );
    assert_eq!(
        heard().renewing(None, now, window),
        None,
        "no leader Lease seen"
    );
    assert_eq!(
        heard().renewing(Some(5), now, secs(4)),
        None,
        "renewed too long ago"
    );
    let mut older = heard();
    older.heard_in_term(Some(2));
    assert_eq!(
        older.renewing(Some(5), now, window).map(|t| t.why),
        Some(RenewalsCount::NewTerm {
            heard_in: 4,
            leads: 5
        }),
        "the latest term heard counts"
    );
    older.heard_in_term(Some(5));
    assert_eq!(older.renewing(Some(5), now, window), None, "heard by it");
    let mut no_term = Hearing::resumed(now, Some(secs(40)), false);
    no_term.lease_renewed(now);
    assert_eq!(
        no_term.renewing(Some(5), now, window),
        None,
        "no heartbeat named its term"
    );
    let mut unrenewed = Hearing::resumed(now, Some(secs(40)), false);
    unrenewed.heard_in_term(Some(4));
    assert_eq!(
        unrenewed.renewing(Some(5), now, window),
        None,
        "never renewed"
    );
    let mut never = Hearing::resumed(now, None, false);
    never.heard_in_term(Some(4));
    never.lease_renewed(now);
    assert_eq!(
        never.renewing(Some(5), now, window),
        None,
        "never heard in this boot (it stays anyway)"
    );
}

#[tokio::test(start_paused = true)]
async fn only_a_leader_that_said_it_counts_from_renewals_and_a_recent_renewal_keep_the_agent_up() {
    let window = secs(20);
    let now = Instant::now();
    let heard = |renewals: Option<bool>| {
        let mut h = Hearing::resumed(now, Some(secs(40)), false);
        h.heard_in_term(Some(4));
        h.heard_counting_renewals(renewals, Some(4));
        h.lease_renewed(now - secs(5));
        h
    };
    assert_eq!(
        heard(Some(true)).renewing(Some(4), now, window),
        Some(Renewing {
            why: RenewalsCount::FromRenewals,
            renewed_ago: secs(5)
        })
    );
    // Only while the leader Lease shows the term that said so: one the agent cannot read, or
    // another term (a Lease recreated, an older leader back), shows nothing.
    for leads in [None, Some(3)] {
        assert_eq!(
            heard(Some(true)).renewing(leads, now, window),
            None,
            "leader Lease term {leads:?}"
        );
    }
    let mut untermed = heard(None);
    untermed.heard_counting_renewals(Some(true), None);
    assert_eq!(
        untermed.renewing(Some(4), now, window),
        None,
        "a heartbeat that names no term"
    );
    let resumed = Hearing::resumed(now, Some(secs(40)), false).resumed_counting_renewals(Some(4));
    let mut resumed = resumed;
    resumed.lease_renewed(now - secs(1));
    assert_eq!(
        resumed.renewing(Some(4), now, window).map(|r| r.why),
        Some(RenewalsCount::FromRenewals),
        "a restarted agent, from its hearing file, once it renewed"
    );
    for (renewals, what) in [
        (
            None,
            "an older leader, which counts from its first unanswered probe",
        ),
        (
            Some(false),
            "a leader that does not count from the renewals",
        ),
    ] {
        assert_eq!(
            heard(renewals).renewing(Some(4), now, window),
            None,
            "{what}"
        );
    }
    assert_eq!(
        heard(Some(true)).renewing(Some(4), now, secs(4)),
        None,
        "renewed too long ago"
    );
    // The last heartbeat counted decides: a later one that does not say it takes it back.
    let mut h = heard(Some(true));
    h.heard_counting_renewals(None, Some(4));
    assert_eq!(h.renewing(Some(4), now, window), None, "taken back");
    // Held, or never heard in this boot: nothing to stay on.
    let mut held = heard(Some(true));
    held.hold(Some(true));
    held.hold_written(true);
    assert_eq!(held.renewing(Some(4), now, window), None, "held");
    let mut never = Hearing::resumed(now, None, false);
    never.heard_counting_renewals(Some(true), Some(4));
    never.lease_renewed(now);
    assert_eq!(never.renewing(Some(4), now, window), None, "never heard");
}

/// The bound the podha side relies on: podha proves the silence no earlier than the isolation
/// timeout after the last renewal it saw (a new term that began after the agent's last renewal
/// was sent counts from its first unanswered probe, later still). Renewals that stop at some
/// point leave the agent petting its watchdog no later than the window after the last one, so
/// the watchdog fires within the isolation timeout of it, for every timing the agent accepts
/// and for either reason to stay.
#[tokio::test(start_paused = true)]
async fn renewals_that_stop_leave_the_watchdog_to_fire_before_podha_could_prove() {
    for (timeout, watchdog, counted) in [
        (secs(8), secs(4), false),
        (secs(40), secs(10), false),
        (secs(30), secs(15), false),
        (secs(8), secs(4), true),
        (secs(16), secs(8), true),
        (secs(40), secs(10), true),
    ] {
        let window = renewal_window(timeout, Some(watchdog));
        let start = Instant::now();
        let mut hearing = Hearing::resumed(start, Some(timeout), false);
        hearing.heard_in_term(Some(1));
        hearing.heard_counting_renewals(Some(counted), Some(1));
        let leads = if counted { 1 } else { 2 };
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
            let t = hearing.renewing(Some(leads), now, window);
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
