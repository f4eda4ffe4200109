use super::*;
use crate::server::Hearing;

#[tokio::test]
async fn the_lease_names_its_node_lasts_its_duration_and_is_owned_by_the_agents_pod() {
    let client = offline_client();
    let owner = OwnerPod {
        name: "podha-agent-x7".into(),
        uid: "u-1".into(),
    };
    let lease = lease_of(client.clone(), Some(owner), never_heard());
    let now: Timestamp = "2026-11-26T03:00:00.5Z".parse().expect("time");
    let body = lease.renewal(now).0;
    let parsed: Lease = serde_json::from_value(body.clone()).expect("a Lease");
    let spec = parsed.spec.expect("spec");
    assert_eq!(parsed.metadata.name.as_deref(), Some("podha-agent-n1"));
    assert_eq!(
        parsed
            .metadata
            .labels
            .expect("labels")
            .get(AGENT_LEASE_LABEL),
        Some(&"true".to_string())
    );
    assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert_eq!(spec.renew_time, Some(MicroTime(now)));
    let owners = parsed.metadata.owner_references.expect("owner");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str()
        ),
        ("Pod", "podha-agent-x7", "u-1")
    );
    assert_eq!(owners[0].block_owner_deletion, None);
    // Outside a Pod (a test cluster's processes): no owner, the agent deletes it itself.
    let unowned = lease_of(client, None, never_heard()).renewal(now).0;
    assert!(
        unowned["metadata"].get("ownerReferences").is_none(),
        "{unowned}"
    );
    // podha never heard this agent in this boot: nothing said of it; the agent heeds
    // holds and terms.
    assert_eq!(
        body["metadata"]["annotations"],
        json!({
            AGENT_HEEDS_HOLD_ANNOTATION: "true",
            AGENT_HEEDS_TERM_ANNOTATION: "true",
            AGENT_HEEDS_RENEWALS_ANNOTATION: "true",
        }),
        "{body}"
    );
}

fn lease_of(client: kube::Client, owner: Option<OwnerPod>, hearing: Hearing) -> AdvertLease {
    let hearing = std::sync::Arc::new(std::sync::Mutex::new(hearing));
    AdvertLease::new(client, "podha", "n1", owner, Some("boot-1".into()), hearing)
}

/// The boot the Lease's next renewal says podha heard the agent in.
fn heard_in_boot(lease: &AdvertLease) -> Option<String> {
    let (body, _) = lease.renewal(Timestamp::now());
    body["metadata"]["annotations"][AGENT_HEARD_IN_BOOT_ANNOTATION]
        .as_str()
        .map(str::to_string)
}

fn never_heard() -> Hearing {
    Hearing::resumed(tokio::time::Instant::now(), None, false)
}

fn offline_client() -> kube::Client {
    kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:9".parse().expect("url"),
    ))
    .expect("client")
}

/// While a leader of a later term than any heartbeat the agent counted leads, the Lease is
/// renewed every third of the window (no more often than every second), so that the new
/// leader sees it renewed in its own term; otherwise every 10 s.
#[tokio::test(start_paused = true)]
async fn a_leader_that_never_heard_the_agent_has_its_lease_renewed_often() {
    let now = tokio::time::Instant::now();
    let mut heard = Hearing::resumed(now, Some(Duration::from_secs(9)), false);
    heard.heard_in_term(Some(4));
    heard.lease_renewed(now);
    let leader = std::sync::Arc::new(LeaderKey::listed());
    let lease =
        lease_of(offline_client(), None, heard).following(leader.clone(), Duration::from_secs(30));
    assert_eq!(lease.next_renewal(), AGENT_LEASE_RENEW, "no term seen");
    leader.seen_in_term(Some(4));
    assert_eq!(
        lease.next_renewal(),
        AGENT_LEASE_RENEW,
        "the term that heard it"
    );
    leader.seen_in_term(Some(5));
    assert_eq!(lease.next_renewal(), Duration::from_secs(10));
    let short = lease.following(leader.clone(), Duration::from_secs(4));
    assert_eq!(short.next_renewal(), Duration::from_secs(4) / 3);
    let shortest = short.following(leader.clone(), Duration::from_secs(2));
    assert_eq!(shortest.next_renewal(), Duration::from_secs(1));
    lock(&shortest.hearing).heard_in_term(Some(5));
    assert_eq!(shortest.next_renewal(), AGENT_LEASE_RENEW, "heard by it");
}

/// The leader Lease shows a new term while podha counts this agent's silence: the Lease is
/// renewed at the new leader's cadence (a third of the window) from the last renewal, at
/// once if that is older, so that a new leader that cannot reach the agent sees it run
/// before the agent stops petting its watchdog; terms that change faster add no write, and
/// with the chart's 30 s window (a 10 s cadence) a new term adds none. A new term while
/// podha holds the node changes nothing.
#[tokio::test(start_paused = true)]
async fn a_new_term_has_the_lease_renewed_at_the_new_leaders_cadence() {
    let ms = Duration::from_millis;
    // The shortest timings: a 4 s window, renewals every 1.33 s while unheard.
    let (renewals, leader, hearing, keeping) = keeping_lease(Duration::from_secs(4));
    tokio::time::sleep(ms(3000)).await;
    assert_eq!(renewed(&renewals), [ms(0)], "the first renewal only");
    leader.seen_in_term(Some(5));
    tokio::time::sleep(ms(100)).await;
    assert_eq!(renewed(&renewals), [ms(0), ms(3000)], "renewed as it shows");
    // Terms flapping: no write before the cadence from the last one.
    for term in 6..16 {
        leader.seen_in_term(Some(term));
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(renewed(&renewals).len(), 2, "{:?}", renewed(&renewals));
    tokio::time::sleep(ms(1400)).await;
    // (tokio's timers round up to the millisecond)
    let cadence = renewed(&renewals)[2] - ms(3000);
    assert!(
        cadence >= ms(4000) / 3 && cadence <= ms(1334),
        "the cadence: {cadence:?}"
    );
    // Heard by the new leader, then held by it: the hold is written at once and taken,
    // and a new term then waits for the next 10 s renewal.
    lock(&hearing).heard_in_term(Some(15));
    lock(&hearing).hold(Some(true));
    tokio::time::sleep(ms(100)).await;
    let held = renewed(&renewals);
    assert!(lock(&hearing).held(), "the hold is taken: {held:?}");
    leader.seen_in_term(Some(16));
    tokio::time::sleep(ms(5000)).await;
    assert_eq!(renewed(&renewals), held, "held: no renewal for a term");
    keeping.abort();

    // The chart's timings: a 30 s window, a 10 s cadence, the usual one: a new term 3 s
    // after a renewal adds no write.
    let (renewals, leader, _hearing, keeping) = keeping_lease(Duration::from_secs(30));
    tokio::time::sleep(ms(3000)).await;
    leader.seen_in_term(Some(5));
    tokio::time::sleep(ms(6900)).await;
    assert_eq!(renewed(&renewals), [ms(0)]);
    tokio::time::sleep(ms(200)).await;
    assert_eq!(renewed(&renewals), [ms(0), ms(10_000)]);
    keeping.abort();
}

/// podha stops hearing an agent whose leader said it counts from the renewals: within a
/// second of [`AGENT_HEARD_WITHIN`] of silence the Lease is renewed (its last renewal is
/// older than the quicker cadence), then every third of the window; heard again, every
/// 10 s.
#[tokio::test(start_paused = true)]
async fn an_agent_podha_does_not_hear_has_its_lease_renewed_at_the_quicker_cadence() {
    let ms = Duration::from_millis;
    let (renewals, _leader, hearing, keeping) = keeping_lease(Duration::from_secs(6));
    lock(&hearing).heard_counting_renewals(Some(true), Some(4));
    tokio::time::sleep(ms(2900)).await;
    assert_eq!(renewed(&renewals), [ms(0)], "heard: the usual cadence");
    tokio::time::sleep(ms(1100)).await;
    assert_eq!(
        renewed(&renewals),
        [ms(0), ms(3000)],
        "unheard for 3 s: renewed at the next look"
    );
    tokio::time::sleep(ms(4000)).await;
    assert_eq!(renewed(&renewals), [ms(0), ms(3000), ms(5000), ms(7000)]);
    // Heard again (a probe every second): back to the usual cadence from the last
    // renewal.
    for _ in 0..12 {
        lock(&hearing).probed(tokio::time::Instant::now(), Some(Duration::ZERO));
        tokio::time::sleep(ms(1000)).await;
    }
    assert_eq!(
        renewed(&renewals),
        [ms(0), ms(3000), ms(5000), ms(7000), ms(17_000)]
    );
    keeping.abort();

    // A leader that does not count from the renewals: unheard, the usual cadence.
    let (renewals, _leader, _hearing, keeping) = keeping_lease(Duration::from_secs(6));
    tokio::time::sleep(ms(9900)).await;
    assert_eq!(renewed(&renewals), [ms(0)]);
    keeping.abort();

    // The same, the watch of the leader Lease failing: the term the agent reads before it
    // decides may be a new leader's, so a recent renewal must be there already: the quicker
    // cadence.
    let (renewals, leader, _hearing, keeping) = keeping_lease(Duration::from_secs(6));
    leader.watch_failed();
    tokio::time::sleep(ms(9900)).await;
    assert_eq!(
        renewed(&renewals),
        [ms(0), ms(3000), ms(5000), ms(7000), ms(9000)]
    );
    keeping.abort();
}

/// When the Lease was written, since the fake API server was made.
type Renewals = Arc<std::sync::Mutex<Vec<Duration>>>;

fn renewed(renewals: &Renewals) -> Vec<Duration> {
    lock(renewals).clone()
}

/// Agent `n1`'s Lease kept (renewal window `window`) on a fake API server, podha having
/// just heard the agent in term 4, which the leader Lease shows.
fn keeping_lease(
    window: Duration,
) -> (
    Renewals,
    Arc<LeaderKey>,
    SharedHearing,
    tokio::task::JoinHandle<()>,
) {
    let mut heard = Hearing::resumed(tokio::time::Instant::now(), Some(Duration::ZERO), false);
    heard.heard_in_term(Some(4));
    let hearing = Arc::new(std::sync::Mutex::new(heard));
    let leader = Arc::new(LeaderKey::listed());
    leader.seen_in_term(Some(4));
    let renewals = Renewals::default();
    let lease = AdvertLease::new(
        recording_api(renewals.clone()),
        "podha",
        "n1",
        None,
        Some("boot-1".into()),
        hearing.clone(),
    )
    .following(leader.clone(), window);
    let keeping = tokio::spawn(async move { lease.keep().await });
    (renewals, leader, hearing, keeping)
}

/// A fake API server that takes every write of agent `n1`'s Lease, noting when (since it
/// was made).
fn recording_api(renewals: Renewals) -> kube::Client {
    hanging_api(renewals, usize::MAX)
}

/// [`recording_api`], whose `hangs`th write (from 0) never gets an answer.
fn hanging_api(renewals: Renewals, hangs: usize) -> kube::Client {
    let made = tokio::time::Instant::now();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "podha-agent-n1", "namespace": "podha"}});
    let never = Arc::new(tokio::sync::Notify::new());
    let api = podha_fake_api::FakeApi::new().on(
        http::Method::PATCH,
        "/apis/coordination.k8s.io/v1/namespaces/podha/leases/podha-agent-n1",
        move |_| {
            let mut renewals = lock(&renewals);
            renewals.push(made.elapsed());
            let reply = podha_fake_api::Reply::json(200, lease.clone());
            if renewals.len() - 1 == hangs {
                reply.after(never.clone())
            } else {
                reply
            }
        },
    );
    api.client()
}

/// Staying up on its renewals, the agent gives up a renewal that gets no answer after half
/// its window and tries again a second later.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_hangs_is_given_up_and_tried_again() {
    let ms = Duration::from_millis;
    let mut heard = Hearing::resumed(tokio::time::Instant::now(), Some(Duration::ZERO), false);
    heard.heard_in_term(Some(4));
    heard.heard_counting_renewals(Some(true), Some(4));
    let hearing = Arc::new(std::sync::Mutex::new(heard));
    let leader = Arc::new(LeaderKey::listed());
    leader.seen_in_term(Some(4));
    let renewals = Renewals::default();
    let lease = AdvertLease::new(
        hanging_api(renewals.clone(), 1),
        "podha",
        "n1",
        None,
        Some("boot-1".into()),
        hearing.clone(),
    )
    .following(leader, Duration::from_secs(6));
    let keeping = tokio::spawn(async move { lease.keep().await });
    // Unheard for 3 s: the quicker renewal goes out, and hangs; given up 3 s later (half
    // the window), tried again a second after that.
    tokio::time::sleep(ms(6900)).await;
    assert_eq!(renewed(&renewals), [ms(0), ms(3000)]);
    tokio::time::sleep(ms(200)).await;
    assert_eq!(renewed(&renewals), [ms(0), ms(3000), ms(7000)]);
    keeping.abort();
}

/// Once podha has heard the agent in this boot, its Lease says so, naming the boot; an
/// agent that cannot read its boot says nothing.
#[tokio::test]
async fn the_lease_says_in_which_boot_podha_heard_the_agent() {
    let now: Timestamp = "2026-11-26T03:00:00.5Z".parse().expect("time");
    let heard = Hearing::resumed(
        tokio::time::Instant::now(),
        Some(Duration::from_secs(90)),
        false,
    );
    let lease = lease_of(offline_client(), None, heard);
    assert_eq!(heard_in_boot(&lease).as_deref(), Some("boot-1"));
    let body = lease.renewal(now).0;
    assert_eq!(
        body["metadata"]["annotations"],
        json!({
            AGENT_HEARD_IN_BOOT_ANNOTATION: "boot-1",
            AGENT_HEEDS_HOLD_ANNOTATION: "true",
            AGENT_HEEDS_TERM_ANNOTATION: "true",
            AGENT_HEEDS_RENEWALS_ANNOTATION: "true",
        })
    );
    // While podha holds the node the agent counts no silence, and a new leader must not
    // either: the Lease says nothing of the hearing, and is renewed at once.
    let changed = lock(&lease.hearing).held_changed();
    lock(&lease.hearing).hold(Some(true));
    assert_eq!(heard_in_boot(&lease), None);
    tokio::time::timeout(Duration::from_secs(1), changed.notified())
        .await
        .expect("told of the hold");
    // The hold is taken only once a Lease without the word was written.
    assert!(!lock(&lease.hearing).held());
    lock(&lease.hearing).hold_written(false);
    assert!(
        !lock(&lease.hearing).held(),
        "a Lease built before the hold"
    );
    lock(&lease.hearing).hold_written(true);
    assert!(lock(&lease.hearing).held());
    lock(&lease.hearing).hold(None);
    assert_eq!(
        heard_in_boot(&lease),
        None,
        "a word saying nothing changes nothing"
    );
    lock(&lease.hearing).hold(Some(false));
    assert_eq!(heard_in_boot(&lease).as_deref(), Some("boot-1"));
    assert!(!lock(&lease.hearing).held(), "let go of at once");
    // A hold asked for and let go of before the Lease was written is never taken.
    lock(&lease.hearing).hold(Some(true));
    lock(&lease.hearing).hold(Some(false));
    lock(&lease.hearing).hold_written(true);
    assert!(!lock(&lease.hearing).held());
    let lease = lease_of(offline_client(), None, never_heard());
    assert_eq!(heard_in_boot(&lease), None);
    // The hearing changes while the agent runs: the next renewal says so.
    lock(&lease.hearing).probed(tokio::time::Instant::now(), Some(Duration::ZERO));
    assert_eq!(heard_in_boot(&lease).as_deref(), Some("boot-1"));
    let mut bootless = lease_of(offline_client(), None, never_heard());
    bootless.boot = None;
    lock(&bootless.hearing).probed(tokio::time::Instant::now(), Some(Duration::ZERO));
    assert_eq!(heard_in_boot(&bootless), None);
}

/// Once two reach checks in a row reached fewer than half of the peers asked, each renewal
/// says so, with the last check's figures, until two checks in a row reached half.
#[tokio::test]
async fn the_lease_says_when_the_agent_cannot_reach_its_peers() {
    use crate::peers::{Round, SharedReach};
    let reach = SharedReach::default();
    let lease = lease_of(offline_client(), None, never_heard()).reporting(reach.clone());
    let said = |lease: &AdvertLease| {
        lease.renewal(Timestamp::now()).0["metadata"]["annotations"]
            [AGENT_PEERS_UNREACHABLE_ANNOTATION]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(said(&lease), None);
    lock(&reach).take(Round {
        asked: 8,
        answered: 2,
    });
    assert_eq!(said(&lease), None, "one check is not enough");
    lock(&reach).take(Round {
        asked: 8,
        answered: 1,
    });
    assert_eq!(said(&lease).as_deref(), Some("1/8"));
    let good = Round {
        asked: 8,
        answered: 5,
    };
    lock(&reach).take(good);
    assert_eq!(
        said(&lease).as_deref(),
        Some("1/8"),
        "one good check is not enough: the last short one is said"
    );
    lock(&reach).take(good);
    assert_eq!(said(&lease), None);
}
