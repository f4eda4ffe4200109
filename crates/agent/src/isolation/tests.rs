//! The isolation rule, case by case.

use super::*;
use crate::contract::silence_counts_among;
use Silence::For;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn only_an_agent_with_a_watchdog_says_when_its_node_is_fenced() {
    assert_eq!(fenced_within(secs(30), Some(secs(10))), Some(secs(30)));
    assert_eq!(fenced_within(secs(30), Some(secs(15))), Some(secs(30)));
    assert_eq!(fenced_within(secs(30), None), None);
}

const T: Duration = Duration::from_secs(30);

fn s(secs: u64) -> Option<Duration> {
    Some(Duration::from_secs(secs))
}

fn survey(peers: usize, answers: &[Option<Duration>]) -> Survey {
    Survey {
        peers: PeerCount::Known(peers),
        answers: answers.to_vec(),
    }
}

/// What a node that never read its peer list finds: nobody to ask.
fn unknown_peers() -> Survey {
    Survey {
        peers: PeerCount::Unknown,
        answers: Vec::new(),
    }
}

fn fences(v: &Verdict) -> bool {
    matches!(v, Verdict::Fence(_))
}

#[test]
fn a_heard_node_asks_nobody_and_stays() {
    assert_eq!(
        decide(For(Duration::from_secs(29)), T, None, None),
        Verdict::Heard
    );
}

#[test]
fn a_node_podha_cannot_hear_while_it_hears_a_peer_fences() {
    let v = decide(For(T), T, Some(&survey(9, &[s(40), s(2)])), None);
    assert!(fences(&v), "{v:?}");
}

#[test]
fn when_podha_hears_nobody_the_unheard_peers_keep_every_node_up() {
    // The leader crashed 60 s ago: every agent is unheard, and says so to the others.
    let unheard = [s(61), s(60), None, s(62), s(60)];
    let v = decide(
        For(Duration::from_secs(60)),
        T,
        Some(&survey(9, &unheard)),
        None,
    );
    assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
}

#[test]
fn peers_whose_silence_began_with_this_nodes_are_not_heard() {
    // podha's leader stopped 30 s ago; the peers' last probes came up to a second after
    // this node's: they are as unheard as this node, and vouch.
    let v = decide(For(T), T, Some(&survey(4, &[s(29), s(29), s(30)])), None);
    assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
    // Heard 15 s ago, within half the timeout: with this node, 2 of 5 agents shown unheard.
    let v = decide(For(T), T, Some(&survey(4, &[s(15), s(29)])), None);
    assert!(fences(&v), "{v:?}");
}

#[test]
fn a_minority_cut_off_together_cannot_vouch_for_itself() {
    // Three of ten nodes partitioned with this one: they answer, unheard; the rest of the
    // cluster (heard by podha, a majority) is out of reach.
    let v = decide(For(T), T, Some(&survey(9, &[s(31), s(35), s(40)])), None);
    assert!(fences(&v), "{v:?}");
}

#[test]
fn more_than_half_of_the_cluster_cut_off_together_stays_up_as_podha_cannot_prove_it() {
    // Six of ten: podha hears four, no strict majority, and counts none of their silences.
    let six = survey(9, &[s(31), s(35), s(40), None, s(33)]);
    let v = decide(For(T), T, Some(&six), None);
    assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
    assert!(!silence_counts_among(4, 9));
    // Five of ten, an exact tie: podha hears five, no strict majority either, but the cut-off
    // half fences: a tie leaves no room for a peer list one node behind podha's.
    let five = survey(9, &[s(31), s(35), s(40), None]);
    assert!(fences(&decide(For(T), T, Some(&five), None)));
    assert!(!silence_counts_among(5, 9));
}

#[test]
fn a_node_no_peer_answers_fences() {
    let v = decide(For(T), T, Some(&survey(9, &[])), None);
    assert!(fences(&v), "{v:?}");
}

#[test]
fn a_node_that_knows_it_is_alone_stays() {
    let v = decide(
        For(Duration::from_secs(600)),
        T,
        Some(&survey(0, &[])),
        None,
    );
    assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
}

#[test]
fn a_node_that_never_read_its_peer_list_fences() {
    // Cut off from everything since the agent started: the list was never read. An empty
    // list taken for a cluster of one kept such a node up while podha moved its volumes.
    let v = decide(For(T), T, Some(&unknown_peers()), None);
    assert!(fences(&v), "{v:?}");
    assert!(!unknown_peers().podha_cannot_prove(T));
    assert!(unknown_peers().settled(T), "nobody to ask");
}

#[test]
fn a_node_that_never_read_its_peer_list_stops_petting_after_its_free_window() {
    // Petted freely while a stopped watchdog would fire within the timeout...
    assert!(pet_watchdog(
        For(Duration::from_secs(20)),
        T,
        W,
        Some(&unknown_peers()),
        None
    ));
    // ...and not after: the unknown list shows nothing, and the watchdog resets the node.
    assert!(!pet_watchdog(
        For(Duration::from_secs(21)),
        T,
        W,
        Some(&unknown_peers()),
        None
    ));
    assert!(!pet_watchdog(
        For(Duration::from_secs(600)),
        T,
        W,
        Some(&unknown_peers()),
        None
    ));
}

#[test]
fn a_node_podha_never_heard_since_it_booted_stays_and_pets_without_asking() {
    // podha cannot reach it from boot, or the whole cluster powered up with the API server
    // down: nobody has heard it, and its peer list is unknown. No survey is needed.
    for survey in [None, Some(unknown_peers()), Some(survey(9, &[s(1)]))] {
        let v = decide(Silence::NeverHeard, T, survey.as_ref(), None);
        let Verdict::Stay(why) = &v else {
            panic!("{v:?}")
        };
        assert!(
            why.contains("never heard this node since it booted"),
            "{why}"
        );
        assert!(pet_watchdog(
            Silence::NeverHeard,
            T,
            W,
            survey.as_ref(),
            None
        ));
    }
}

#[test]
fn unasked_peers_decide_nothing_yet() {
    let v = decide(For(T), T, None, None);
    assert!(matches!(v, Verdict::Stay(_)), "{v:?}");
}

#[test]
fn a_survey_settles_once_half_are_unheard_or_the_rest_could_not_make_it() {
    // Nine peers: five unheard settle it (stay).
    assert!(!survey(9, &[s(40); 4]).settled(T));
    assert!(survey(9, &[s(40); 5]).settled(T));
    // Heard peers settle it once the unasked could no longer make half (fence): with five
    // heard, at most four of the nine are unheard.
    assert!(!survey(9, &[s(1); 4]).settled(T));
    assert!(survey(9, &[s(1); 5]).settled(T));
    // A single heard peer no longer settles it: the rest may still show half unheard.
    assert!(!survey(9, &[s(40), s(1)]).settled(T));
    // Ten peers: half is five.
    assert!(!survey(10, &[s(40); 4]).settled(T));
    assert!(survey(10, &[s(40); 5]).settled(T));
}

#[tokio::test(start_paused = true)]
async fn a_fence_verdict_must_hold_for_two_seconds() {
    let fence = Verdict::Fence("cut off".into());
    let mut c = Confirmation::default();
    assert!(!c.fence_now(&fence, Instant::now()));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!c.fence_now(&fence, Instant::now()));
    // Heard in between: the count starts over.
    assert!(!c.fence_now(&Verdict::Heard, Instant::now()));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!c.fence_now(&fence, Instant::now()));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!c.fence_now(&fence, Instant::now()));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(c.fence_now(&fence, Instant::now()));
}

const W: Duration = Duration::from_secs(10);

#[test]
fn the_watchdog_is_petted_freely_only_while_it_would_fire_within_the_timeout() {
    assert!(pet_watchdog(For(Duration::from_secs(20)), T, W, None, None));
    assert!(!pet_watchdog(
        For(Duration::from_secs(21)),
        T,
        W,
        None,
        None
    ));
    assert_eq!(survey_after(T, Some(W)), Duration::from_secs(20));
    assert_eq!(survey_after(T, None), T);
}

#[test]
fn after_that_the_watchdog_is_petted_only_while_podha_cannot_prove_the_silence() {
    let at = Duration::from_secs(21);
    // podha's leader crashed 21 s ago: every peer as unheard as this node.
    let crashed = survey(4, &[s(21), s(20), s(22)]);
    assert!(pet_watchdog(For(at), T, W, Some(&crashed), None));
    // No peers: nowhere to fail over to.
    assert!(pet_watchdog(For(at), T, W, Some(&survey(0, &[])), None));
    // Two peers heard a second ago: one of the four peers unheard, and podha may prove this
    // node's silence; the watchdog may fire.
    let isolated = survey(4, &[s(21), s(1), s(1)]);
    assert!(!pet_watchdog(For(at), T, W, Some(&isolated), None));
    // One peer heard: two of the four unheard, half; podha hears no majority.
    let partial = survey(4, &[s(21), s(1), s(22)]);
    assert!(pet_watchdog(For(at), T, W, Some(&partial), None));
    // Too few answers to vouch.
    assert!(!pet_watchdog(
        For(at),
        T,
        W,
        Some(&survey(4, &[s(21)])),
        None
    ));
    // Long past the timeout, the same rule as the fence's (heard within half of it).
    let late = Duration::from_secs(90);
    assert!(pet_watchdog(
        For(late),
        T,
        W,
        Some(&survey(4, &[s(89), s(16), s(16)])),
        None
    ));
    assert!(!pet_watchdog(
        For(late),
        T,
        W,
        Some(&survey(4, &[s(89), s(15), s(15)])),
        None
    ));
}

#[test]
fn before_the_timeout_heard_means_within_half_of_this_nodes_silence() {
    // Surveyed 20 s into a leader crash: the peers' silences began with this node's.
    let at = Duration::from_secs(20);
    assert!(survey(4, &[s(19), s(20), s(21)]).podha_cannot_prove(at));
    assert!(survey(4, &[s(10), s(20), s(21)]).podha_cannot_prove(at));
    assert!(!survey(4, &[s(10), s(10), s(21)]).podha_cannot_prove(at));
}

#[test]
fn the_verdict_holds_at_half_of_the_peers() {
    let fences_among = |peers, unheard| {
        let answers = vec![s(40); unheard];
        fences(&decide(For(T), T, Some(&survey(peers, &answers)), None))
    };
    // Ten peers: four unheard fence, five stay.
    assert!(fences_among(10, 4));
    assert!(!fences_among(10, 5));
    // Nine: four fence (with this node, half of the ten: the tie), five stay.
    assert!(fences_among(9, 4));
    assert!(!fences_among(9, 5));
}

#[test]
fn at_the_shortest_timings_peers_silenced_with_this_node_count_unheard_by_the_petting_survey() {
    // An 8 s timeout and a 4 s watchdog: the agent pets freely up to 4 s of silence, then only
    // while its survey shows half its peers unheard. podha's leader died 4.2 s ago; this
    // node's last answer was lost, so the peers were heard up to a second later than it.
    let short = Duration::from_secs(8);
    let watchdog = Duration::from_secs(4);
    let at = Duration::from_millis(4200);
    let leader_died = survey(4, &[s(3), s(3), Some(Duration::from_millis(3200)), s(4)]);
    assert!(pet_watchdog(
        For(at),
        short,
        watchdog,
        Some(&leader_died),
        None
    ));
    // The peers heard a second ago: podha hears them; no pet.
    let isolated = survey(4, &[s(1), s(1), s(1), s(4)]);
    assert!(!pet_watchdog(
        For(at),
        short,
        watchdog,
        Some(&isolated),
        None
    ));
}

/// A node podha holds (paused, or no policy with the `Agent` proof selects it) stays up and
/// pets its watchdog however long it goes unheard, whatever its peers would say.
#[test]
fn a_held_node_stays_up_and_pets_its_watchdog_whatever_its_peers_say() {
    let timeout = Duration::from_secs(8);
    let everyone_heard = Survey {
        peers: PeerCount::Known(4),
        answers: vec![Some(Duration::ZERO); 4],
    };
    let Verdict::Stay(why) = decide(Silence::Held, timeout, Some(&everyone_heard), None) else {
        panic!("a held node fences nothing")
    };
    assert!(why.contains("podha holds this node"), "{why}");
    let unknown = Survey {
        peers: PeerCount::Unknown,
        answers: vec![],
    };
    assert!(matches!(
        decide(Silence::Held, timeout, Some(&unknown), None),
        Verdict::Stay(_)
    ));
    assert!(matches!(
        decide(Silence::Held, timeout, None, None),
        Verdict::Stay(_)
    ));
    assert!(pet_watchdog(
        Silence::Held,
        timeout,
        Duration::from_secs(4),
        Some(&everyone_heard),
        None
    ));
    assert!(pet_watchdog(
        Silence::Held,
        timeout,
        Duration::from_secs(4),
        None,
        None
    ));
}
