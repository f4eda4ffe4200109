use super::*;
use crate::api::{Action, Fencing, PodHAPolicySpec};
use crate::test_builders::*;
use k8s_openapi::api::core::v1::Node;

/// `name` with an agent advertised on it, with a watchdog when `watchdog` (an agent without a
/// usable one advertises no fenced-within time).
fn with_agent(name: &str, watchdog: bool) -> Node {
    mk_node(name).agent(watchdog.then_some("30s"))
}

fn policy(proof: FencingProof, action: Action) -> PodHAPolicy {
    PodHAPolicy::new(
        "p",
        PodHAPolicySpec {
            fencing: Fencing {
                proof,
                ..Fencing::default()
            },
            action,
            ..mk_spec()
        },
    )
}

fn healthy(nodes: &[&str]) -> BTreeMap<String, NodeHealth> {
    nodes
        .iter()
        .map(|n| (n.to_string(), NodeHealth::Healthy))
        .collect()
}

#[test]
fn a_node_lacks_an_agent_a_watchdog_a_fresh_lease_or_reach_to_its_peers() {
    let t0 = Instant::now();
    let mut view = view_with([
        mk_node("bare").into(),
        with_agent("no-watchdog", false).into(),
        with_agent("no-lease", true).into(),
        with_agent("lapsed", true).into(),
        with_agent("covered", true).into(),
        with_agent("cut-off", true).into(),
    ]);
    view.agent_adverts.insert("lapsed".into(), agent_advert(t0));
    let later = t0 + crate::contract::AGENT_LEASE_DURATION + Duration::from_secs(1);
    view.agent_adverts
        .insert("covered".into(), agent_advert(later));
    let mut cut_off = agent_advert(later);
    cut_off.peers_unreachable = Some("1/8".into());
    view.agent_adverts.insert("cut-off".into(), cut_off);
    let gap = |name: &str| agent_gap(name, &view.nodes[name], &view, later);
    assert_eq!(gap("bare"), Some(AgentGap::Absent));
    assert_eq!(gap("no-watchdog"), Some(AgentGap::WithoutWatchdog));
    assert_eq!(gap("no-lease"), Some(AgentGap::LeaseStale));
    assert_eq!(gap("lapsed"), Some(AgentGap::LeaseStale));
    assert_eq!(gap("covered"), None);
    assert_eq!(gap("cut-off"), Some(AgentGap::PeersUnreachable));
    assert!(AgentGap::PeersUnreachable.heard() && !AgentGap::LeaseStale.heard());
}

#[test]
fn only_a_lasting_gap_on_a_healthy_node_of_an_agent_policy_is_reported() {
    let t0 = Instant::now();
    let mut view = view_with([
        mk_node("bare").into(),
        mk_node("failing").into(),
        with_agent("covered", true).into(),
    ]);
    view.agent_adverts
        .insert("covered".into(), agent_advert(t0 + MISSING_AFTER));
    let mut coverage = AgentCoverage::default();
    coverage.observe(&view, t0);
    let mut health = healthy(&["bare", "covered"]);
    health.insert("failing".into(), NodeHealth::Failed { since: t0 });
    let agent = policy(FencingProof::Agent, Action::OutOfServiceTaint);
    // Not yet lasting: an agent's pod replaced comes back within seconds; and this process
    // has not watched long enough to tell.
    let soon = t0 + MISSING_AFTER - Duration::from_secs(1);
    coverage.observe(&view, soon);
    assert_eq!(coverage.unprotected(&agent, &health, soon), None);
    let then = t0 + MISSING_AFTER;
    coverage.observe(&view, then);
    assert_eq!(
        coverage.unprotected(&agent, &health, then),
        Some(vec![("bare".to_string(), AgentGap::Absent)])
    );
    // `DeletePods` waits for the agent's proof too.
    assert_eq!(
        coverage.unprotected(
            &policy(FencingProof::Agent, Action::DeletePods),
            &health,
            then
        ),
        Some(vec![("bare".to_string(), AgentGap::Absent)])
    );
    // A policy that does not rely on agents reports nothing.
    for other in [
        policy(FencingProof::None, Action::OutOfServiceTaint),
        policy(FencingProof::External, Action::OutOfServiceTaint),
        policy(FencingProof::None, Action::DeletePods),
    ] {
        assert_eq!(
            coverage.unprotected(&other, &health, then),
            Some(Vec::new())
        );
    }
    // A gap that changes (or closes) starts over.
    view.nodes.insert(
        "bare".into(),
        std::sync::Arc::new(with_agent("bare", false)),
    );
    coverage.observe(&view, then);
    assert_eq!(
        coverage.unprotected(&agent, &health, then),
        Some(Vec::new())
    );
}

#[test]
fn the_message_counts_every_node_and_names_the_first_few() {
    let unprotected: Vec<(String, AgentGap)> = (1..=7)
        .map(|i| (format!("node-{i}"), AgentGap::WithoutWatchdog))
        .collect();
    let message = describe_unprotected(&unprotected, 10);
    assert!(message.starts_with("7 of 10 watched nodes"), "{message}");
    assert!(
        message.contains("node-5 (agent without a usable watchdog) and 2 more"),
        "{message}"
    );
    assert!(!message.contains("node-6"), "{message}");
}

/// A control-plane node runs no agent unless the chart is asked to: one that takes no ordinary
/// workload (tainted) needs none and is not reported; one that does (untainted: a k3s server,
/// a single-node cluster) is. One whose agent runs without a watchdog still is.
#[test]
fn a_control_plane_node_without_an_agent_is_reported_only_when_it_takes_workloads() {
    let t0 = Instant::now();
    let tainted = |node: Node| {
        node.label(CONTROL_PLANE_LABEL, "")
            .taint(CONTROL_PLANE_LABEL, "", "NoSchedule")
    };
    let view = view_with([
        tainted(mk_node("control")).into(),
        tainted(with_agent("control-unwatched", false)).into(),
        mk_node("server").label(CONTROL_PLANE_LABEL, "").into(),
        mk_node("worker").into(),
    ]);
    let mut coverage = AgentCoverage::default();
    coverage.observe(&view, t0);
    let then = t0 + MISSING_AFTER;
    coverage.observe(&view, then);
    let health = healthy(&["control", "control-unwatched", "server", "worker"]);
    let agent = policy(FencingProof::Agent, Action::OutOfServiceTaint);
    assert_eq!(
        coverage.unprotected(&agent, &health, then),
        Some(vec![
            ("control-unwatched".to_string(), AgentGap::WithoutWatchdog),
            ("server".to_string(), AgentGap::Absent),
            ("worker".to_string(), AgentGap::Absent),
        ])
    );
}
