use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeSpec, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::*;
use crate::api::FailoverPhase;
use crate::test_builders::*;
use crate::view::ObjectKey;

const DRIVER: &str = "rwo.sim.podha.io";
const TIMEOUT: Duration = Duration::from_secs(390);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Nodes n1 (dead), n2 and n3; claims `data-db-0` → pv1, `logs-db-0` → pv2, `web-data` → pv3,
/// `other` → pv9, all bound CSI volumes.
fn base() -> Vec<Obj> {
    let mut objects: Vec<Obj> = vec![
        mk_node("n1").ready(false).into(),
        mk_node("n2").into(),
        mk_node("n3").into(),
    ];
    for (claim, pv) in [
        ("data-db-0", "pv1"),
        ("logs-db-0", "pv2"),
        ("web-data", "pv3"),
        ("other", "pv9"),
    ] {
        objects.push(mk_pvc("ns", claim).bound_to(pv).into());
        objects.push(mk_csi_pv(pv, DRIVER).into());
    }
    objects
}

fn world(extra: Vec<Obj>) -> View {
    view_with(base().into_iter().chain(extra))
}

fn va(pv: &str, node: &str) -> VolumeAttachment {
    mk_va(&format!("csi-{pv}-{node}"), DRIVER, pv, node)
}

fn attached(pv: &str, node: &str) -> Obj {
    va(pv, node).attached(true).into()
}

/// A VolumeAttachment of an inline (migrated) volume spec: it names no PersistentVolume.
fn inline_va(node: &str) -> Obj {
    let mut va = va("inline", node).attached(true);
    va.spec.source.persistent_volume_name = None;
    va.spec.source.inline_volume_spec = Some(PersistentVolumeSpec::default());
    va.into()
}

/// StatefulSet pod db-0 with two claims, on n1, as the dead node left it.
fn sts_old() -> Pod {
    mk_pod("ns", "db-0")
        .uid("old")
        .on("n1")
        .owned_by_sts("db")
        .claim("data-db-0")
        .claim("logs-db-0")
}

/// Its replacement on `node`: same name, new UID, Running and Ready.
fn sts_new(node: &str) -> Pod {
    mk_pod("ns", "db-0")
        .uid("new")
        .on(node)
        .owned_by_sts("db")
        .claim("data-db-0")
        .claim("logs-db-0")
        .ready(true)
}

fn web_old() -> Pod {
    mk_pod("ns", "web-1-aaaaa")
        .uid("web-old")
        .on("n1")
        .owned_by_rs("web-1")
        .claim("web-data")
}

fn web_new(rs: &str) -> Pod {
    mk_pod("ns", "web-1-bbbbb")
        .uid("web-new")
        .on("n2")
        .owned_by_rs(rs)
        .claim("web-data")
        .ready(true)
}

/// The old VolumeAttachments of the StatefulSet pod, still on n1.
fn sts_old_vas() -> Vec<Obj> {
    vec![attached("pv1", "n1"), attached("pv2", "n1")]
}

/// The replacement's VolumeAttachments on `node`.
fn sts_new_vas(node: &str) -> Vec<Obj> {
    vec![attached("pv1", node), attached("pv2", node)]
}

/// A failover of n1 detected at t0+40s (last seen at t0) that deleted `moved` at t0+45s, as
/// seen in `before`.
fn acted(t0: Instant, moved: &[Pod], before: &View) -> Incident {
    let mut f = Incident::new("n1", "db", Some(t0), t0 + secs(40));
    if moved.is_empty() {
        f.record_action(t0 + secs(45), None);
    }
    for pod in moved {
        f.record_action(t0 + secs(45), Some(MovedPod::from_pod(pod, before)));
    }
    f
}

fn detached(f: &Incident) -> bool {
    f.detached_at.is_some()
}

fn recovered(f: &Incident) -> bool {
    f.recovered_at.is_some()
}

#[test]
fn from_pod_snapshots_claims_volumes_and_owner() {
    let pod = sts_old().ephemeral("scratch");
    let view = world(vec![
        pod.clone().into(),
        mk_pvc("ns", "db-0-scratch").bound_to("pv7").into(),
        attached("pv1", "n1"),
    ]);
    let moved = MovedPod::from_pod(&pod, &view);
    assert_eq!(moved.key, ObjectKey::new("ns", "db-0"));
    assert_eq!(moved.uid, "old");
    assert_eq!(moved.node, "n1");
    assert_eq!(
        moved.controller,
        Some(OwnerRef {
            kind: "StatefulSet".into(),
            name: "db".into(),
            uid: "uid-StatefulSet-db".into()
        })
    );
    assert_eq!(
        moved.claims,
        ["data-db-0", "logs-db-0"],
        "ephemeral left out"
    );
    assert_eq!(
        moved.pvs,
        ["pv1", "pv2", "pv7"],
        "ephemeral volume included"
    );
    assert!(moved.needs_attach);
    assert!(moved.peers_at_move.is_empty());

    let no_va = MovedPod::from_pod(&pod, &world(vec![attached("pv1", "n2")]));
    assert!(
        !no_va.needs_attach,
        "only attachments on the pod's node count"
    );
}

#[test]
fn detach_follows_only_the_moved_volumes() {
    type Case = (&'static str, bool, Vec<Obj>, bool);
    let cases: Vec<Case> = vec![
        ("both old attachments remain", true, sts_old_vas(), false),
        (
            "one old attachment remains",
            true,
            vec![attached("pv2", "n1")],
            false,
        ),
        (
            "a detaching attachment still counts",
            true,
            vec![va("pv1", "n1").into()],
            false,
        ),
        ("old attachments gone", true, vec![], true),
        (
            "an unrelated volume on the dead node does not block",
            true,
            vec![attached("pv9", "n1")],
            true,
        ),
        (
            "the moved volume attached elsewhere does not block",
            true,
            sts_new_vas("n2"),
            true,
        ),
        (
            "an inline attachment is ignored",
            true,
            vec![inline_va("n1")],
            true,
        ),
        (
            "taint only: any attachment on the node blocks",
            false,
            vec![attached("pv9", "n1")],
            false,
        ),
        (
            "taint only: an inline attachment blocks too",
            false,
            vec![inline_va("n1")],
            false,
        ),
        (
            "taint only: attachments elsewhere do not block",
            false,
            vec![attached("pv9", "n2")],
            true,
        ),
    ];
    let t0 = Instant::now();
    let before = world([vec![sts_old().into(), attached("pv9", "n1")], sts_old_vas()].concat());
    for (name, moved, after, want) in cases {
        let pods = if moved { vec![sts_old()] } else { vec![] };
        let mut f = acted(t0, &pods, &before);
        let changes = f.follow(t0 + secs(60), &world(after), TIMEOUT);
        assert_eq!(detached(&f), want, "{name}");
        if want {
            assert_eq!(
                changes[0],
                PhaseChange::Detached { at: t0 + secs(60) },
                "{name}"
            );
            assert!(f.still_attached.is_empty(), "{name}");
        } else {
            assert!(changes.is_empty(), "{name}: {changes:?}");
            assert_eq!(f.phase(), FailoverPhase::Detaching, "{name}");
            assert!(!f.still_attached.is_empty(), "{name}");
        }
        if !moved {
            // Nothing to replace: the failover ends with the detach, without a recover phase.
            assert_eq!(recovered(&f), want, "{name}");
            let phases: Vec<Phase> = f.durations().into_iter().map(|(p, _)| p).collect();
            assert!(!phases.contains(&Phase::Recover), "{name}");
        }
    }
}

/// Sets the controller reference's UID, as for a controller recreated under the same name.
fn with_owner_uid(mut pod: Pod, uid: &str) -> Pod {
    if let Some(owner) = pod
        .metadata
        .owner_references
        .as_mut()
        .and_then(|o| o.first_mut())
    {
        owner.uid = uid.to_string();
    }
    pod
}

#[test]
fn recovery_needs_a_running_ready_replacement_with_attached_volumes() {
    // (name, pods moved, extra objects at move time, objects after the detach, recovered?)
    type Case = (&'static str, Vec<Pod>, Vec<Obj>, Vec<Obj>, bool);
    let sts_after = |pod: Pod| [vec![pod.into()], sts_new_vas("n2")].concat();
    let web_before = vec![attached("pv3", "n1")];
    let web_after = |pod: Pod| vec![pod.into(), attached("pv3", "n2")];
    let cases: Vec<Case> = vec![
        (
            "StatefulSet: same name, Running, Ready, attached",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(sts_new("n2")),
            true,
        ),
        (
            "no replacement yet",
            vec![sts_old()],
            sts_old_vas(),
            sts_new_vas("n2"),
            false,
        ),
        (
            "replacement not Ready",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(sts_new("n2").ready(false)),
            false,
        ),
        (
            "replacement Ready but not Running",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(sts_new("n2").phase("Pending")),
            false,
        ),
        (
            "replacement terminating",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(sts_new("n2").terminating()),
            false,
        ),
        (
            "attachment not attached yet",
            vec![sts_old()],
            sts_old_vas(),
            vec![
                sts_new("n2").into(),
                va("pv1", "n2").into(),
                attached("pv2", "n2"),
            ],
            false,
        ),
        (
            "one volume not attached at all",
            vec![sts_old()],
            sts_old_vas(),
            vec![sts_new("n2").into(), attached("pv1", "n2")],
            false,
        ),
        (
            "volumes attached to another node than the pod's",
            vec![sts_old()],
            sts_old_vas(),
            [vec![sts_new("n2").into()], sts_new_vas("n3")].concat(),
            false,
        ),
        (
            "the moved pod's own UID is not a replacement",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(sts_new("n2").uid("old")),
            false,
        ),
        (
            "another StatefulSet",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(
                mk_pod("ns", "db-0")
                    .uid("new")
                    .on("n2")
                    .owned_by_sts("other")
                    .claim("data-db-0")
                    .claim("logs-db-0")
                    .ready(true),
            ),
            false,
        ),
        (
            "another ordinal of the same StatefulSet",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(
                mk_pod("ns", "db-1")
                    .uid("new")
                    .on("n2")
                    .owned_by_sts("db")
                    .claim("data-db-0")
                    .claim("logs-db-0")
                    .ready(true),
            ),
            false,
        ),
        (
            "StatefulSet recreated under the same name",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(with_owner_uid(sts_new("n2"), "uid-recreated")),
            true,
        ),
        (
            "other claims",
            vec![sts_old()],
            sts_old_vas(),
            sts_after(
                mk_pod("ns", "db-0")
                    .uid("new")
                    .on("n2")
                    .owned_by_sts("db")
                    .claim("data-db-0")
                    .ready(true),
            ),
            false,
        ),
        (
            "another namespace",
            vec![sts_old()],
            sts_old_vas(),
            sts_after({
                let mut pod = sts_new("n2");
                pod.metadata.namespace = Some("elsewhere".into());
                pod
            }),
            false,
        ),
        (
            "Deployment: new name, same ReplicaSet",
            vec![web_old()],
            web_before.clone(),
            web_after(web_new("web-1")),
            true,
        ),
        (
            "Deployment: a pod of another ReplicaSet is not matched",
            vec![web_old()],
            web_before.clone(),
            web_after(web_new("web-2")),
            false,
        ),
        (
            "driver without attachments: Running and Ready is enough",
            vec![sts_old()],
            vec![],
            vec![sts_new("n2").into()],
            true,
        ),
        (
            "two moved pods need two replacements",
            vec![
                web_old(),
                mk_pod("ns", "web-1-ccccc")
                    .uid("web-old-2")
                    .on("n1")
                    .owned_by_rs("web-1")
                    .claim("web-data"),
            ],
            web_before.clone(),
            web_after(web_new("web-1")),
            false,
        ),
        (
            "two moved pods, two replacements",
            vec![
                web_old(),
                mk_pod("ns", "web-1-ccccc")
                    .uid("web-old-2")
                    .on("n1")
                    .owned_by_rs("web-1")
                    .claim("web-data"),
            ],
            web_before.clone(),
            [
                web_after(web_new("web-1")),
                vec![
                    mk_pod("ns", "web-1-ddddd")
                        .uid("web-new-2")
                        .on("n2")
                        .owned_by_rs("web-1")
                        .claim("web-data")
                        .ready(true)
                        .into(),
                ],
            ]
            .concat(),
            true,
        ),
    ];
    let t0 = Instant::now();
    for (name, moved, before_extra, after, want) in cases {
        let before = world(
            moved
                .iter()
                .cloned()
                .map(Obj::from)
                .chain(before_extra)
                .collect(),
        );
        let mut f = acted(t0, &moved, &before);
        let changes = f.follow(t0 + secs(60), &world(after), TIMEOUT);
        assert!(detached(&f), "{name}: the old attachments are gone");
        assert_eq!(recovered(&f), want, "{name}");
        let recovered_change = PhaseChange::Recovered { at: t0 + secs(60) };
        assert_eq!(changes.contains(&recovered_change), want, "{name}");
        let replaced = f.moved.iter().filter(|m| m.replaced_by.is_some()).count();
        assert_eq!(replaced, if want { moved.len() } else { 0 }, "{name}");
    }
}

#[test]
fn a_replacement_on_the_dead_node_does_not_count() {
    // No attachment at move time, so the node is the only thing that differs.
    let t0 = Instant::now();
    let before = world(vec![sts_old().into()]);
    for (node, want) in [("n1", false), ("n2", true)] {
        let mut f = acted(t0, &[sts_old()], &before);
        f.follow(t0 + secs(60), &world(vec![sts_new(node).into()]), TIMEOUT);
        assert!(detached(&f));
        assert_eq!(recovered(&f), want, "replacement on {node}");
        if want {
            let replacement = f.moved[0].replaced_by.as_ref();
            assert_eq!(replacement.map(|r| r.node.as_str()), Some("n2"));
            assert_eq!(replacement.map(|r| r.uid.as_str()), Some("new"));
        }
    }
}

#[test]
fn siblings_that_ran_before_the_move_do_not_replace_a_pod_without_persistent_claims() {
    let old = mk_pod("ns", "web-1-aaaaa")
        .uid("web-old")
        .on("n1")
        .owned_by_rs("web-1")
        .ephemeral("scratch");
    let sibling = mk_pod("ns", "web-1-sssss")
        .uid("sibling")
        .on("n2")
        .owned_by_rs("web-1")
        .ephemeral("scratch")
        .ready(true);
    let t0 = Instant::now();
    let before = world(vec![
        old.clone().into(),
        sibling.clone().into(),
        mk_pvc("ns", "web-1-aaaaa-scratch").bound_to("pv5").into(),
        mk_pvc("ns", "web-1-sssss-scratch").bound_to("pv6").into(),
        attached("pv5", "n1"),
        attached("pv6", "n2"),
    ]);
    let mut f = acted(t0, std::slice::from_ref(&old), &before);
    assert_eq!(
        f.moved[0].peers_at_move.iter().collect::<Vec<_>>(),
        ["sibling"]
    );

    let after = vec![
        sibling.into(),
        mk_pvc("ns", "web-1-sssss-scratch").bound_to("pv6").into(),
        attached("pv6", "n2"),
    ];
    assert_eq!(
        f.follow(t0 + secs(60), &world(after.clone()), TIMEOUT),
        [PhaseChange::Detached { at: t0 + secs(60) }]
    );
    assert!(!recovered(&f), "the sibling was running before");

    // The new pod has its own ephemeral claim and volume.
    let new = mk_pod("ns", "web-1-nnnnn")
        .uid("web-new")
        .on("n3")
        .owned_by_rs("web-1")
        .ephemeral("scratch")
        .ready(true);
    let with_new = [
        after,
        vec![
            new.into(),
            mk_pvc("ns", "web-1-nnnnn-scratch").bound_to("pv8").into(),
        ],
    ]
    .concat();
    assert!(
        f.follow(t0 + secs(70), &world(with_new.clone()), TIMEOUT)
            .is_empty(),
        "its ephemeral volume is not attached yet"
    );
    let attached_new = [with_new, vec![attached("pv8", "n3")]].concat();
    assert_eq!(
        f.follow(t0 + secs(80), &world(attached_new), TIMEOUT),
        [PhaseChange::Recovered { at: t0 + secs(80) }]
    );
    assert_eq!(
        f.moved[0].replaced_by.as_ref().map(|r| r.uid.as_str()),
        Some("web-new")
    );
}

#[test]
fn recovery_never_comes_before_the_detach() {
    let t0 = Instant::now();
    let before = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = acted(t0, &[sts_old()], &before);
    // The replacement runs with its volumes attached on n2, yet pv1 still holds n1.
    let stuck = world(
        [
            vec![sts_new("n2").into(), attached("pv1", "n1")],
            sts_new_vas("n2"),
        ]
        .concat(),
    );
    assert!(f.follow(t0 + secs(50), &stuck, TIMEOUT).is_empty());
    assert_eq!(f.phase(), FailoverPhase::Detaching);
    assert_eq!(f.still_attached, ["pv1"]);

    let done = world([vec![sts_new("n2").into()], sts_new_vas("n2")].concat());
    let at = t0 + secs(55);
    assert_eq!(
        f.follow(at, &done, TIMEOUT),
        [PhaseChange::Detached { at }, PhaseChange::Recovered { at }]
    );
    assert_eq!(f.phase(), FailoverPhase::Recovered);
    assert!(f.durations().contains(&(Phase::Recover, Duration::ZERO)));
}

#[test]
fn nothing_is_tracked_before_the_first_action() {
    let t0 = Instant::now();
    let mut f = Incident::new("n1", "db", None, t0);
    let empty = world(vec![]);
    assert!(f.follow(t0 + secs(1000), &empty, TIMEOUT).is_empty());
    assert_eq!(f.phase(), FailoverPhase::Acting);
    assert!(f.durations().is_empty());
}

#[test]
fn the_detach_timeout_is_reported_once_and_a_late_detach_still_counts() {
    let t0 = Instant::now();
    let timeout = secs(60);
    let stuck = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = acted(t0, &[sts_old()], &stuck); // acted at t0+45s
    assert!(
        f.follow(t0 + secs(105), &stuck, timeout).is_empty(),
        "exactly the timeout is not yet over it"
    );
    assert_eq!(
        f.follow(t0 + secs(106), &stuck, timeout),
        [PhaseChange::DetachTimedOut {
            waited: secs(61),
            volumes: vec!["pv1".into(), "pv2".into()],
        }]
    );
    assert_eq!(f.phase(), FailoverPhase::DetachTimedOut);
    for later in [107, 200, 10_000] {
        assert!(f.follow(t0 + secs(later), &stuck, timeout).is_empty());
    }
    assert_eq!(f.timed_out_at, Some(t0 + secs(106)));
    let record = f.to_record(|_| Time(Timestamp::UNIX_EPOCH));
    assert_eq!(record.phase, FailoverPhase::DetachTimedOut);
    assert_eq!(
        record.message.as_deref(),
        Some("still attached to node n1 more than 1m1s after podha acted: pv1, pv2")
    );

    let gone = world(vec![]);
    let at = t0 + secs(10_045);
    assert_eq!(f.follow(at, &gone, timeout), [PhaseChange::Detached { at }]);
    assert_eq!(f.phase(), FailoverPhase::Recovering);
    assert!(f.timed_out());
    assert!(f.durations().contains(&(Phase::Detach, secs(10_000))));
    assert!(f.follow(at + secs(1), &gone, timeout).is_empty());
    let message = f.to_record(|_| Time(Timestamp::UNIX_EPOCH)).message;
    assert_eq!(
        message.as_deref(),
        Some("the detach exceeded detachTimeout and took 2h46m40s")
    );
}

#[test]
fn a_detach_seen_after_the_deadline_is_not_a_timeout() {
    let t0 = Instant::now();
    let before = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = acted(t0, &[sts_old()], &before);
    let at = t0 + secs(1000);
    assert_eq!(
        f.follow(at, &world(vec![]), secs(60)),
        [PhaseChange::Detached { at }]
    );
    assert!(!f.timed_out());
    assert_eq!(f.to_record(|_| Time(Timestamp::UNIX_EPOCH)).message, None);
}

#[test]
fn durations_span_each_phase() {
    let t0 = Instant::now();
    let before = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = Incident::new("n1", "db", Some(t0), t0 + secs(40));
    let acted_change =
        f.record_action(t0 + secs(45), Some(MovedPod::from_pod(&sts_old(), &before)));
    assert_eq!(acted_change, Some(PhaseChange::Acted { at: t0 + secs(45) }));
    assert_eq!(
        f.record_action(t0 + secs(46), Some(MovedPod::from_pod(&sts_old(), &before))),
        None,
        "only the first action counts"
    );
    assert_eq!(f.moved.len(), 1, "the same pod is recorded once");
    assert_eq!(f.acted_at, Some(t0 + secs(45)));
    let acted_change = acted_change.unwrap_or(PhaseChange::Acted { at: t0 });
    assert_eq!(
        f.durations_for(&acted_change),
        [(Phase::Detect, secs(40)), (Phase::Act, secs(5))]
    );

    let detached_view = world(vec![]);
    let detach = f.follow(t0 + secs(75), &detached_view, TIMEOUT);
    assert_eq!(f.durations_for(&detach[0]), [(Phase::Detach, secs(30))]);

    let recovered_view = world([vec![sts_new("n2").into()], sts_new_vas("n2")].concat());
    let recover = f.follow(t0 + secs(90), &recovered_view, TIMEOUT);
    assert_eq!(
        f.durations_for(&recover[0]),
        [(Phase::Recover, secs(15)), (Phase::Total, secs(90))]
    );
    assert_eq!(
        f.durations(),
        [
            (Phase::Detect, secs(40)),
            (Phase::Act, secs(5)),
            (Phase::Detach, secs(30)),
            (Phase::Recover, secs(15)),
            (Phase::Total, secs(90)),
        ]
    );

    // Without a last-seen-alive time there is no detect phase and the total starts at detection.
    let mut unknown = Incident::new("n1", "db", None, t0 + secs(40));
    unknown.record_action(t0 + secs(45), Some(MovedPod::from_pod(&sts_old(), &before)));
    unknown.follow(t0 + secs(75), &detached_view, TIMEOUT);
    unknown.follow(t0 + secs(90), &recovered_view, TIMEOUT);
    assert_eq!(
        unknown.durations(),
        [
            (Phase::Act, secs(5)),
            (Phase::Detach, secs(30)),
            (Phase::Recover, secs(15)),
            (Phase::Total, secs(50)),
        ]
    );
}

#[test]
fn update_is_idempotent() {
    let t0 = Instant::now();
    let stuck = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = acted(t0, &[sts_old()], &stuck);
    let stages = [
        (stuck, 0),
        (world(vec![]), 1),
        (world(vec![sts_new("n2").into()]), 0),
        (
            world([vec![sts_new("n2").into()], sts_new_vas("n2")].concat()),
            1,
        ),
    ];
    let mut now = t0 + secs(50);
    for (i, (view, want)) in stages.iter().enumerate() {
        let first = f.follow(now, view, TIMEOUT);
        assert_eq!(first.len(), *want, "stage {i}: {first:?}");
        let settled = f.clone();
        for _ in 0..3 {
            now += secs(1);
            assert!(f.follow(now, view, TIMEOUT).is_empty(), "stage {i}");
            assert_eq!(f, settled, "stage {i}: the state does not move");
        }
        now += secs(10);
    }
    assert_eq!(f.phase(), FailoverPhase::Recovered);
}

#[test]
fn phases_follow_the_recorded_steps() {
    let t0 = Instant::now();
    let mut f = Incident::new("n1", "db", None, t0);
    assert_eq!(f.phase(), FailoverPhase::Acting);
    f.record_hold("TooManyUnhealthyNodes", "3 of 4 nodes failed");
    assert_eq!(f.phase(), FailoverPhase::Held);
    assert_eq!(
        f.held.as_ref().map(|h| h.reason),
        Some("TooManyUnhealthyNodes")
    );
    assert_eq!(
        f.to_record(|_| Time(Timestamp::UNIX_EPOCH))
            .message
            .as_deref(),
        Some("3 of 4 nodes failed")
    );
    f.record_action(t0 + secs(1), None);
    assert_eq!(
        f.phase(),
        FailoverPhase::Detaching,
        "an action lifts the hold"
    );
    f.record_hold("DryRun", "would taint node n1");
    assert_eq!(
        f.phase(),
        FailoverPhase::Detaching,
        "a hold after acting is ignored"
    );

    let mut returned = f.clone();
    returned.record_node_returned(t0 + secs(5));
    assert_eq!(returned.phase(), FailoverPhase::NodeReturned);
    returned.follow(t0 + secs(6), &world(vec![]), TIMEOUT);
    assert!(
        detached(&returned),
        "tracking goes on after the node returns"
    );

    f.follow(t0 + secs(6), &world(vec![]), TIMEOUT);
    assert_eq!(
        f.phase(),
        FailoverPhase::Recovered,
        "nothing moved, nothing to wait for"
    );
    f.record_node_returned(t0 + secs(7));
    assert_eq!(f.phase(), FailoverPhase::Recovered);
}

#[test]
fn the_record_shows_every_timestamp_in_wall_time() {
    let t0 = Instant::now();
    let wall = |i: Instant| {
        let offset = i.saturating_duration_since(t0).as_secs() as i64;
        match Timestamp::from_second(1_700_000_000 + offset) {
            Ok(ts) => Time(ts),
            Err(error) => panic!("timestamp out of range: {error}"),
        }
    };
    let at = |secs: i64| wall(t0 + Duration::from_secs(secs as u64));
    let before = world([vec![sts_old().into()], sts_old_vas()].concat());
    let mut f = acted(t0, &[sts_old()], &before);

    let record = f.to_record(wall);
    assert_eq!(record.node, "n1");
    assert_eq!(record.phase, FailoverPhase::Detaching);
    assert_eq!(record.last_seen_alive, Some(at(0)));
    assert_eq!(record.detected_at, at(40));
    assert_eq!(record.acted_at, Some(at(45)));
    assert_eq!(record.detached_at, None);
    assert_eq!(record.pods, ["ns/db-0"]);
    assert_eq!(record.message, None);

    f.follow(t0 + secs(75), &world(vec![]), TIMEOUT);
    let recovered_view = world([vec![sts_new("n2").into()], sts_new_vas("n2")].concat());
    f.follow(t0 + secs(90), &recovered_view, TIMEOUT);
    let record = f.to_record(wall);
    assert_eq!(record.phase, FailoverPhase::Recovered);
    assert_eq!(record.detached_at, Some(at(75)));
    assert_eq!(record.recovered_at, Some(at(90)));
}

#[test]
fn a_replacement_must_be_in_the_moved_pods_namespace() {
    // ReplicaSets `web-1` in namespaces a and b: same pod, claim and controller names (and,
    // with these builders, the same controller UID). No attachments (a driver that needs none),
    // so only the namespace tells the pods apart.
    let pod = |ns: &str, name: &str, node: &str| {
        mk_pod(ns, name)
            .uid(&format!("{ns}-{name}"))
            .on(node)
            .owned_by_rs("web-1")
            .claim("web-data")
    };
    let t0 = Instant::now();
    let old = [pod("a", "web-1-old", "n1"), pod("b", "web-1-old", "n1")];
    let before = world(old.iter().cloned().map(Obj::from).collect());
    let mut f = acted(t0, &old, &before);

    let two_in_b = vec![
        pod("b", "web-1-p", "n2").ready(true).into(),
        pod("b", "web-1-q", "n3").ready(true).into(),
    ];
    f.follow(t0 + secs(60), &world(two_in_b.clone()), TIMEOUT);
    assert!(detached(&f));
    assert!(!recovered(&f), "pods of b do not stand for a's pod");

    let one_in_each = [two_in_b, vec![pod("a", "web-1-r", "n2").ready(true).into()]].concat();
    f.follow(t0 + secs(70), &world(one_in_each), TIMEOUT);
    assert!(recovered(&f));
    let replaced: Vec<Option<String>> = f
        .moved
        .iter()
        .map(|m| m.replaced_by.as_ref().map(|r| r.key.to_string()))
        .collect();
    assert_eq!(
        replaced,
        [Some("a/web-1-r".to_string()), Some("b/web-1-p".to_string())]
    );
}
