//! `check_movable` end to end: every refusal, the order of the checks, and the opt-in paths;
//! `looks_alive`, the readiness the planner waits for before a delete.

use super::*;
use crate::api::AccessMode::ReadWriteMany;
use crate::api::FAILOVER_ANNOTATION;
use crate::api::OwnerKind;
use crate::eligibility::OwnerMatch;
use crate::test_builders::*;
use kube::ResourceExt;

const RWO: &str = "rwo.sim.podha.io";
const RWX: &str = "rwx.sim.podha.io";

/// `dead` is the failed node; `n2` is healthy; `n3` is cordoned.
fn usable(node: &Node) -> bool {
    node.name_any() != "dead"
}

/// The cluster around the pod under test: a dead node, a healthy one, a cordoned one, a
/// Deployment's ReplicaSet `web-1`, a bare ReplicaSet `bare`, and claims of every sort.
fn view() -> View {
    view_with([
        mk_node("dead").ready(false).into(),
        mk_node("n2").label("zone", "a").into(),
        mk_node("n3").label("zone", "b").unschedulable().into(),
        mk_rs("ns", "web-1").owned_by_deployment("web").into(),
        mk_rs("ns", "bare").into(),
        mk_pvc("ns", "data").bound_to("pv-data").into(),
        mk_csi_pv("pv-data", RWO).into(),
        mk_pvc("ns", "pending").into(),
        mk_pvc("ns", "host").bound_to("pv-host").into(),
        mk_host_path_pv("pv-host").into(),
        mk_pvc("ns", "shared").bound_to("pv-shared").into(),
        mk_csi_pv("pv-shared", RWO)
            .access_modes(&[ReadWriteMany])
            .into(),
        mk_pvc("ns", "other-driver").bound_to("pv-other").into(),
        mk_csi_pv("pv-other", RWX).into(),
        mk_pvc("ns", "zone-b").bound_to("pv-zone-b").into(),
        mk_csi_pv("pv-zone-b", RWO)
            .node_affinity(mk_term().expr("zone", "In", &["b"]))
            .into(),
        mk_pvc("ns", "job-0-scratch").bound_to("pv-scratch").into(),
        mk_csi_pv("pv-scratch", RWO).into(),
    ])
}

/// A stranded StatefulSet pod on the dead node with one good claim: eligible by default.
fn sts_pod() -> Pod {
    mk_pod("ns", "db-0")
        .on("dead")
        .owned_by_sts("db")
        .claim("data")
}

/// Eligible as a kind its policy lists.
fn listed(kind: &str) -> Eligible {
    Eligible {
        owner: OwnerMatch {
            kind: kind.parse().unwrap(),
            listed: true,
        },
    }
}

/// Eligible by the opt-in annotation, its kind (`Kind.group`) unlisted.
fn opted_in(kind: &str) -> Eligible {
    Eligible {
        owner: OwnerMatch {
            kind: kind.parse().unwrap(),
            listed: false,
        },
    }
}

#[test]
fn every_reason_and_the_order_of_checks() {
    let spec = mk_spec().drivers(&[RWO]);
    let ok = |kind: &str| Ok(listed(kind));
    type Case = (&'static str, Pod, Result<Eligible, SkipReason>);
    let cases: Vec<Case> = vec![
        ("stranded statefulset pod", sts_pod(), ok("StatefulSet")),
        (
            "deployment pod through its replicaset",
            mk_pod("ns", "web-1-x")
                .on("dead")
                .owned_by_rs("web-1")
                .claim("data"),
            ok("Deployment"),
        ),
        // Owners.
        (
            "no controller owner",
            mk_pod("ns", "bare-pod").on("dead").claim("data"),
            Err(SkipReason::NoControllerOwner),
        ),
        (
            "no controller owner, even opted in",
            mk_pod("ns", "bare-pod")
                .on("dead")
                .claim("data")
                .annotation(FAILOVER_ANNOTATION, "true"),
            Err(SkipReason::NoControllerOwner),
        ),
        (
            "opted out",
            sts_pod().annotation(FAILOVER_ANNOTATION, "false"),
            Err(SkipReason::OptedOut),
        ),
        (
            "opted out wins over a missing claim",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by_sts("db")
                .annotation(FAILOVER_ANNOTATION, "false"),
            Err(SkipReason::OptedOut),
        ),
        (
            "opted out wins over a kind that is not selected",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by("apps/v1", "DaemonSet", "agent")
                .annotation(FAILOVER_ANNOTATION, "false"),
            Err(SkipReason::OptedOut),
        ),
        (
            "bare replicaset is not selected by default",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by_rs("bare")
                .claim("data"),
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "replicaset unknown to the view",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by_rs("web-2")
                .claim("data"),
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "daemonset pod",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by("apps/v1", "DaemonSet", "agent")
                .claim("data"),
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "opted-in job pod with an ephemeral volume",
            mk_pod("ns", "job-0")
                .on("dead")
                .owned_by("batch/v1", "Job", "backup")
                .ephemeral("scratch")
                .annotation(FAILOVER_ANNOTATION, "true"),
            Ok(opted_in("Job.batch")),
        ),
        (
            "opted-in daemonset pod",
            mk_pod("ns", "agent-x")
                .on("dead")
                .owned_by("apps/v1", "DaemonSet", "agent")
                .claim("data")
                .annotation(FAILOVER_ANNOTATION, "true"),
            Ok(opted_in("DaemonSet.apps")),
        ),
        // Volumes.
        (
            "no claim",
            mk_pod("ns", "p")
                .on("dead")
                .owned_by_sts("db")
                .empty_dir("tmp"),
            Err(SkipReason::NoPersistentVolumeClaim),
        ),
        (
            "claim pending",
            sts_pod().claim("pending"),
            Err(SkipReason::ClaimNotBound),
        ),
        (
            "claim missing",
            sts_pod().claim("nowhere"),
            Err(SkipReason::ClaimNotBound),
        ),
        (
            "hostPath volume",
            sts_pod().claim("host"),
            Err(SkipReason::VolumeNotCsi),
        ),
        (
            "another driver",
            sts_pod().claim("other-driver"),
            Err(SkipReason::DriverNotSelected),
        ),
        (
            "RWX volume",
            sts_pod().claim("shared"),
            Err(SkipReason::AccessModeNotSelected),
        ),
        (
            "ephemeral volume not created yet",
            sts_pod().ephemeral("cache"),
            Err(SkipReason::ClaimNotBound),
        ),
        (
            "claims are checked in volume order",
            sts_pod().claim("shared").claim("host"),
            Err(SkipReason::AccessModeNotSelected),
        ),
        // Target.
        (
            "volume only usable in the cordoned zone",
            sts_pod().claim("zone-b"),
            Err(SkipReason::NoTargetNode),
        ),
        (
            "nodeSelector matching only the dead node",
            sts_pod().node_selector("kubernetes.io/hostname", "dead"),
            Err(SkipReason::NoTargetNode),
        ),
        (
            "a volume problem is reported before the target",
            sts_pod().claim("zone-b").claim("host"),
            Err(SkipReason::VolumeNotCsi),
        ),
    ];
    let view = view();
    for (name, pod, want) in cases {
        assert_eq!(check_movable(&spec, &pod, &view, &usable), want, "{name}");
    }
}

#[test]
fn owners_come_from_the_policy() {
    let view = view();
    let deployment_pod = mk_pod("ns", "web-1-x")
        .on("dead")
        .owned_by_rs("web-1")
        .claim("data");
    let bare_rs_pod = mk_pod("ns", "bare-x")
        .on("dead")
        .owned_by_rs("bare")
        .claim("data");
    let cases = [
        (
            "sts, only Deployment listed",
            sts_pod(),
            &[OwnerKind::DEPLOYMENT][..],
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "deployment, only StatefulSet listed",
            deployment_pod.clone(),
            &[OwnerKind::STATEFUL_SET][..],
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "deployment, only ReplicaSet listed",
            deployment_pod,
            &[OwnerKind::REPLICA_SET][..],
            Err(SkipReason::OwnerKindNotSelected),
        ),
        (
            "bare replicaset listed",
            bare_rs_pod,
            &[OwnerKind::REPLICA_SET][..],
            Ok(listed("ReplicaSet")),
        ),
    ];
    for (name, pod, owners, want) in cases {
        let spec = mk_spec().owners(owners);
        assert_eq!(check_movable(&spec, &pod, &view, &usable), want, "{name}");
    }
}

#[test]
fn target_is_only_required_when_the_policy_says_so() {
    let view = view();
    let stuck = sts_pod().claim("zone-b");
    assert_eq!(
        check_movable(&mk_spec(), &stuck, &view, &usable),
        Err(SkipReason::NoTargetNode)
    );
    let relaxed = mk_spec().require_target(false);
    assert_eq!(
        check_movable(&relaxed, &stuck, &view, &usable),
        Ok(listed("StatefulSet"))
    );
}

#[test]
fn target_uses_podha_health_not_only_node_conditions() {
    let view = view();
    // n2 is Ready in the API but podha suspects it: the only candidate is gone.
    let suspicious = |node: &Node| !matches!(node.name_any().as_str(), "dead" | "n2");
    assert_eq!(
        check_movable(&mk_spec(), &sts_pod(), &view, &suspicious),
        Err(SkipReason::NoTargetNode)
    );
    assert_eq!(
        find_target(&sts_pod(), &view, &usable).map(ResourceExt::name_any),
        Some("n2".into())
    );
}

/// A Ready pod that is not terminating looks alive, whatever its node says: the planner marks
/// it NotReady before it deletes it. A terminating one, or a NotReady one, does not.
#[test]
fn a_ready_pod_looks_alive_until_it_is_terminating_or_not_ready() {
    assert!(looks_alive(&sts_pod().ready(true)));
    assert!(!looks_alive(&sts_pod().ready(true).terminating()));
    assert!(!looks_alive(&sts_pod().terminating()));
    assert!(!looks_alive(&sts_pod()));
    assert!(!looks_alive(&sts_pod().ready(false)));
}

#[test]
fn every_reason_has_a_distinct_label() {
    use std::collections::BTreeSet;
    let all = [
        SkipReason::NoControllerOwner,
        SkipReason::OwnerKindNotSelected,
        SkipReason::OptedOut,
        SkipReason::NoPersistentVolumeClaim,
        SkipReason::ClaimNotBound,
        SkipReason::VolumeNotCsi,
        SkipReason::DriverNotSelected,
        SkipReason::AccessModeNotSelected,
        SkipReason::ToleratesFence,
        SkipReason::NoTargetNode,
    ];
    let labels: BTreeSet<&str> = all.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), all.len());
    for reason in all {
        assert_eq!(reason.as_str(), format!("{reason:?}"));
    }
}
