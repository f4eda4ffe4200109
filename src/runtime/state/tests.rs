use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use tokio::time::Instant;

use super::*;
use crate::test_builders::*;

fn lease(node: &str, renew_second: i64) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renew_second).expect("valid"),
            )),
            ..LeaseSpec::default()
        }),
    }
}

/// Feeds a complete initial list for every watch, so the state is synced.
fn synced(nodes: &[&str], now: Instant) -> ClusterState {
    let mut state = ClusterState::default();
    state.apply(Change::Node(Event::Init), now);
    for n in nodes {
        state.apply(Change::Node(Event::InitApply(mk_node(n))), now);
    }
    state.apply(Change::Node(Event::InitDone), now);
    state.apply(Change::Lease(Event::Init), now);
    for n in nodes {
        state.apply(Change::Lease(Event::InitApply(lease(n, 100))), now);
    }
    state.apply(Change::Lease(Event::InitDone), now);
    state.apply(Change::Policy(Event::Init), now);
    state.apply(Change::Policy(Event::InitDone), now);
    state.apply(Change::Pod(Event::Init), now);
    state.apply(Change::Pod(Event::InitDone), now);
    state.apply(Change::Pvc(Event::Init), now);
    state.apply(Change::Pvc(Event::InitDone), now);
    state.apply(Change::Pv(Event::Init), now);
    state.apply(Change::Pv(Event::InitDone), now);
    state.apply(Change::Va(Event::Init), now);
    state.apply(Change::Va(Event::InitDone), now);
    state.apply(Change::ReplicaSet(Event::Init), now);
    state.apply(Change::ReplicaSet(Event::InitDone), now);
    state.apply(Change::Namespace(Event::Init), now);
    state.apply(Change::Namespace(Event::InitDone), now);
    state.apply(Change::AgentLease(Event::Init), now);
    state.apply(Change::AgentLease(Event::InitDone), now);
    state
}

fn pod_names(state: &ClusterState, node: &str) -> Vec<String> {
    state
        .view
        .pods_on(node)
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

#[test]
fn not_synced_until_every_watch_listed_once() {
    let now = Instant::now();
    let mut state = ClusterState::default();
    assert!(!state.synced());
    state.apply(Change::Node(Event::Init), now);
    state.apply(Change::Node(Event::InitDone), now);
    assert!(!state.synced());
    assert!(synced(&["n1"], now).synced());
    // The agents' Leases never listed (no right to): synced all the same, every agent's
    // silence held for want of its Lease.
    let mut fresh = ClusterState::default();
    for change in [
        Change::Node(Event::Init),
        Change::Node(Event::InitDone),
        Change::Lease(Event::Init),
        Change::Lease(Event::InitDone),
        Change::Policy(Event::Init),
        Change::Policy(Event::InitDone),
        Change::Pod(Event::Init),
        Change::Pod(Event::InitDone),
        Change::Pvc(Event::Init),
        Change::Pvc(Event::InitDone),
        Change::Pv(Event::Init),
        Change::Pv(Event::InitDone),
        Change::Va(Event::Init),
        Change::Va(Event::InitDone),
        Change::ReplicaSet(Event::Init),
        Change::ReplicaSet(Event::InitDone),
        Change::Namespace(Event::Init),
        Change::Namespace(Event::InitDone),
    ] {
        fresh.apply(change, now);
    }
    assert!(fresh.synced());
    assert!(fresh.view.agent_adverts.is_empty());
}

#[test]
fn pods_follow_their_node_and_leave_on_delete() {
    let now = Instant::now();
    let mut state = synced(&["n1", "n2"], now);
    state.apply(Change::Pod(Event::Apply(mk_pod("ns", "a").on("n1"))), now);
    state.apply(Change::Pod(Event::Apply(mk_pod("ns", "b").on("n1"))), now);
    assert_eq!(pod_names(&state, "n1"), ["a", "b"]);
    // An update replaces the pod instead of adding a second copy.
    state.apply(
        Change::Pod(Event::Apply(mk_pod("ns", "a").on("n1").ready(true))),
        now,
    );
    assert_eq!(pod_names(&state, "n1"), ["b", "a"]);
    state.apply(Change::Pod(Event::Delete(mk_pod("ns", "b").on("n1"))), now);
    assert_eq!(pod_names(&state, "n1"), ["a"]);
    // A same-named pod in another namespace is another pod.
    state.apply(
        Change::Pod(Event::Apply(mk_pod("other", "a").on("n2"))),
        now,
    );
    state.apply(Change::Pod(Event::Delete(mk_pod("ns", "a").on("n1"))), now);
    assert!(state.view.pods_on("n1").is_empty());
    assert_eq!(pod_names(&state, "n2"), ["a"]);
    assert!(
        !state.view.pods_by_node.contains_key("n1"),
        "empty node entries are dropped"
    );
}

#[test]
fn a_relist_replaces_what_was_known() {
    let now = Instant::now();
    let mut state = synced(&["n1"], now);
    state.apply(
        Change::Pod(Event::Apply(mk_pod("ns", "gone").on("n1"))),
        now,
    );
    state.apply(Change::Pod(Event::Init), now);
    state.apply(
        Change::Pod(Event::InitApply(mk_pod("ns", "kept").on("n1"))),
        now,
    );
    assert_eq!(
        pod_names(&state, "n1"),
        ["gone"],
        "the old view holds until the list is complete"
    );
    state.apply(Change::Pod(Event::InitDone), now);
    assert_eq!(pod_names(&state, "n1"), ["kept"]);

    state.apply(
        Change::Va(Event::Apply(mk_va("va1", "d", "pv1", "n1"))),
        now,
    );
    state.apply(Change::Va(Event::Init), now);
    state.apply(Change::Va(Event::InitDone), now);
    assert!(state.view.attachments_on("n1").is_empty());
}

#[test]
fn attachments_move_with_their_node() {
    let now = Instant::now();
    let mut state = synced(&["n1", "n2"], now);
    state.apply(
        Change::Va(Event::Apply(mk_va("va1", "d", "pv1", "n1"))),
        now,
    );
    assert_eq!(state.view.attachments_on("n1").len(), 1);
    state.apply(
        Change::Va(Event::Apply(mk_va("va1", "d", "pv1", "n1").attached(true))),
        now,
    );
    assert_eq!(
        state.view.attachments_on("n1").len(),
        1,
        "an update is not a second attachment"
    );
    state.apply(
        Change::Va(Event::Delete(mk_va("va1", "d", "pv1", "n1"))),
        now,
    );
    assert!(state.view.attachments_on("n1").is_empty());
}

#[test]
fn replica_sets_record_their_deployment() {
    let now = Instant::now();
    let mut state = synced(&["n1"], now);
    let rs = |r: k8s_openapi::api::apps::v1::ReplicaSet| PartialObjectMeta::<ReplicaSet> {
        metadata: r.metadata,
        ..PartialObjectMeta::default()
    };
    state.apply(
        Change::ReplicaSet(Event::Apply(rs(
            mk_rs("ns", "web-1").owned_by_deployment("web")
        ))),
        now,
    );
    state.apply(
        Change::ReplicaSet(Event::Apply(rs(mk_rs("ns", "bare")))),
        now,
    );
    assert_eq!(
        state
            .view
            .replica_set_owners
            .get(&ObjectKey::new("ns", "web-1")),
        Some(&Some(OwnerKind::DEPLOYMENT))
    );
    assert_eq!(
        state
            .view
            .replica_set_owners
            .get(&ObjectKey::new("ns", "bare")),
        Some(&None)
    );
}

#[test]
fn lease_renewals_are_timed_on_our_clock() {
    let t0 = Instant::now();
    let mut state = synced(&["n1"], t0);
    let t1 = t0 + Duration::from_secs(10);
    state.apply(Change::Lease(Event::Apply(lease("n1", 110))), t1);
    assert_eq!(state.observations["n1"].last_renewal(), Some(t1));
    // The same renewTime again (a resync) is no renewal.
    let t2 = t1 + Duration::from_secs(10);
    state.apply(Change::Lease(Event::Apply(lease("n1", 110))), t2);
    assert_eq!(state.observations["n1"].last_renewal(), Some(t1));
}

#[test]
fn a_lease_seen_before_its_node_still_counts_the_next_renewal() {
    let t0 = Instant::now();
    let mut state = ClusterState::default();
    // The Lease list arrives first, then the Node list (independent watches).
    state.apply(Change::Lease(Event::Init), t0);
    state.apply(Change::Lease(Event::InitApply(lease("n1", 100))), t0);
    state.apply(Change::Lease(Event::InitDone), t0);
    state.apply(Change::Node(Event::Init), t0);
    state.apply(Change::Node(Event::InitApply(mk_node("n1"))), t0);
    state.apply(Change::Node(Event::InitDone), t0);
    let t1 = t0 + Duration::from_secs(10);
    state.apply(Change::Lease(Event::Apply(lease("n1", 110))), t1);
    assert_eq!(state.observations["n1"].last_renewal(), Some(t1));

    // A Lease left behind by a deleted node is forgotten with it.
    state.apply(Change::Node(Event::Delete(mk_node("n1"))), t1);
    state.apply(Change::Lease(Event::Apply(lease("n1", 120))), t1);
    state.apply(Change::Lease(Event::Delete(lease("n1", 120))), t1);
    assert!(!state.observations.contains_key("n1"));
}

#[test]
fn a_failing_detection_watch_is_a_gap_until_it_relists() {
    let t0 = Instant::now();
    let mut state = synced(&["n1"], t0);
    assert!(!state.detection_gap());
    assert!(!state.observations["n1"].in_gap());

    state.apply(
        Change::WatchError {
            watch: Watch::Lease,
        },
        t0,
    );
    assert!(state.detection_gap());
    assert!(state.observations["n1"].in_gap());

    // Other watches failing is no gap in detection.
    let mut other = synced(&["n1"], t0);
    other.apply(Change::WatchError { watch: Watch::Pod }, t0);
    assert!(!other.observations["n1"].in_gap());

    let t1 = t0 + Duration::from_secs(30);
    state.apply(Change::Lease(Event::Init), t1);
    assert!(state.observations["n1"].in_gap(), "still re-listing");
    state.apply(Change::Lease(Event::InitApply(lease("n1", 100))), t1);
    state.apply(Change::Lease(Event::InitDone), t1);
    assert!(!state.observations["n1"].in_gap());
    assert_eq!(
        state.observations["n1"].lease_baseline(),
        t1,
        "the lease clock restarts"
    );
}

#[test]
fn nodes_seen_during_a_gap_start_in_it() {
    let t0 = Instant::now();
    let mut state = synced(&["n1"], t0);
    state.apply(Change::WatchError { watch: Watch::Node }, t0);
    state.apply(Change::Node(Event::Apply(mk_node("n2"))), t0);
    assert!(state.observations["n2"].in_gap());
    state.apply(Change::Node(Event::Delete(mk_node("n1"))), t0);
    assert!(!state.observations.contains_key("n1"));
    assert!(!state.view.nodes.contains_key("n1"));
}

fn listed(name: &str, spec: serde_json::Value) -> ListedPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "podha.io/v1alpha1",
        "kind": "PodHAPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("listed")
}

#[test]
fn an_unreadable_policy_is_kept_aside_and_the_others_sync() {
    let now = Instant::now();
    let mut state = synced(&["node-1"], now);
    state.apply(Change::Policy(Event::Init), now);
    let huge = serde_json::json!({"fencing": {"agentMargin": "99999999999999999999h"}});
    state.apply(Change::Policy(Event::InitApply(listed("huge", huge))), now);
    let good = serde_json::json!({});
    state.apply(Change::Policy(Event::InitApply(listed("good", good))), now);
    state.apply(Change::Policy(Event::InitDone), now);
    assert!(state.synced());
    assert_eq!(state.policies.keys().collect::<Vec<_>>(), ["good"]);
    assert_eq!(
        state.unreadable_policies.keys().collect::<Vec<_>>(),
        ["huge"]
    );
    // Mended: acted on again; broken again: no longer acted on as it was.
    let mended = serde_json::json!({"fencing": {"agentMargin": "5s"}});
    state.apply(Change::Policy(Event::Apply(listed("huge", mended))), now);
    assert!(state.unreadable_policies.is_empty());
    assert_eq!(state.policies.len(), 2);
    let broken = serde_json::json!({"detection": {"interval": "forever"}});
    state.apply(Change::Policy(Event::Apply(listed("good", broken))), now);
    assert_eq!(state.policies.keys().collect::<Vec<_>>(), ["huge"]);
    assert_eq!(
        state.unreadable_policies.keys().collect::<Vec<_>>(),
        ["good"]
    );
    state.apply(
        Change::Policy(Event::Delete(listed("good", serde_json::json!({})))),
        now,
    );
    assert!(state.unreadable_policies.is_empty());
}

/// An agent Lease counts while it is there and named after its holder; a renewal is a change of
/// its renewTime or its version, timed on podha's clock; a withdrawn one is gone.
#[test]
fn agent_leases_are_adverts_renewed_on_our_clock_until_withdrawn() {
    let t0 = Instant::now();
    let later = |s| t0 + Duration::from_secs(s);
    let mut state = ClusterState::default();
    state.apply(Change::AgentLease(Event::Init), t0);
    state.apply(
        Change::AgentLease(Event::InitApply(mk_agent_lease("n1", 100))),
        t0,
    );
    let mut foreign = mk_agent_lease("n2", 100);
    foreign.spec.as_mut().expect("spec").holder_identity = Some("n3".into());
    state.apply(Change::AgentLease(Event::InitApply(foreign)), t0);
    state.apply(Change::AgentLease(Event::InitDone), t0);
    assert_eq!(
        state.view.agent_adverts.keys().collect::<Vec<_>>(),
        ["n1"],
        "a Lease named after another node than its holder is no advert"
    );
    assert_eq!(state.view.agent_adverts["n1"].renewed_seen, t0);
    assert_eq!(
        state.view.agent_adverts["n1"].lasts,
        Duration::from_secs(40)
    );

    // The same renewTime again (a relist, another field changed): no renewal.
    state.apply(
        Change::AgentLease(Event::Apply(mk_agent_lease("n1", 100))),
        later(5),
    );
    assert_eq!(state.view.agent_adverts["n1"].renewed_seen, t0);
    state.apply(
        Change::AgentLease(Event::Apply(mk_agent_lease("n1", 110))),
        later(10),
    );
    assert_eq!(state.view.agent_adverts["n1"].renewed_seen, later(10));
    state.apply(Change::AgentLease(Event::Init), later(12));
    state.apply(
        Change::AgentLease(Event::InitApply(mk_agent_lease("n1", 110))),
        later(12),
    );
    state.apply(Change::AgentLease(Event::InitDone), later(12));
    assert_eq!(
        state.view.agent_adverts["n1"].renewed_seen,
        later(10),
        "a relist is no renewal"
    );
    // Another version with the same renewTime (a write that did not move it): the agent ran,
    // and the read before a taint compares versions, so it counts as a renewal.
    let mut rewritten = mk_agent_lease("n1", 110);
    rewritten.metadata.resource_version = Some("77".into());
    state.apply(
        Change::AgentLease(Event::Apply(rewritten.clone())),
        later(15),
    );
    assert_eq!(state.view.agent_adverts["n1"].renewed_seen, later(15));
    state.apply(Change::AgentLease(Event::Apply(rewritten)), later(16));
    assert_eq!(
        state.view.agent_adverts["n1"].renewed_seen,
        later(15),
        "the same version again"
    );

    state.apply(
        Change::AgentLease(Event::Delete(mk_agent_lease("n1", 110))),
        later(20),
    );
    assert!(state.view.agent_adverts.is_empty(), "withdrawn");

    // A Lease whose holder is changed to another node is no longer anybody's advert.
    state.apply(
        Change::AgentLease(Event::Apply(mk_agent_lease("n1", 120))),
        later(30),
    );
    let mut taken = mk_agent_lease("n1", 130);
    taken.spec.as_mut().expect("spec").holder_identity = Some("n9".into());
    state.apply(Change::AgentLease(Event::Apply(taken)), later(40));
    assert!(
        state.view.agent_adverts.is_empty(),
        "{:?}",
        state.view.agent_adverts
    );
}

/// An agent Lease that says its agent cannot reach its peers: the count as said, or `?/?` for
/// anything else (the word still holds the node); gone when the agent stops saying it.
#[test]
fn an_agent_lease_says_whether_its_agent_reaches_its_peers() {
    use crate::contract::AGENT_PEERS_UNREACHABLE_ANNOTATION;
    let t0 = Instant::now();
    let mut state = ClusterState::default();
    let saying = |value: Option<&str>, second| {
        let mut lease = mk_agent_lease("n1", second);
        if let Some(value) = value {
            lease
                .annotations_mut()
                .insert(AGENT_PEERS_UNREACHABLE_ANNOTATION.into(), value.into());
        }
        Change::AgentLease(Event::Apply(lease))
    };
    for (value, read) in [
        (Some("1/8"), Some("1/8")),
        (Some("<b>many</b>"), Some("?/?")),
        (Some("1/"), Some("?/?")),
        (None, None),
    ] {
        state.apply(saying(value, 100), t0);
        assert_eq!(
            state.view.agent_adverts["n1"].peers_unreachable.as_deref(),
            read,
            "{value:?}"
        );
    }
}
