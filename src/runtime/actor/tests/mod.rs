use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::runtime::watcher::Event;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;
use tokio::time::Instant;

use super::judge::{podha_taint_proves_failure, resumed_tracker};
use super::*;
use crate::api::{NodeTaint, PodHAPolicy, PodHAPolicySpec, TAINT_MARKER_ANNOTATION};
use crate::planner::TAINT_EVICTION_WAIT;
use crate::runtime::actuator::Outcome;
use crate::runtime::prober::{PlanSenders, ProbePlan};
use crate::runtime::writer::ActResult;
use crate::test_builders::*;

const DRIVER: &str = "rwo.sim.podha.io";

/// A restart resumes a failover only on what the cluster proves. A
/// leftover marker (taint removed by an admin) or a node that is Ready again resumes
/// nothing; only marker + podha's taint + not Ready does.
#[test]
fn only_marker_taint_and_not_ready_resume_a_failover() {
    let marker = |n: Node| n.annotation(TAINT_MARKER_ANNOTATION, "p");
    let oos = |n: Node| {
        n.taint(
            crate::api::OUT_OF_SERVICE_TAINT_KEY,
            "nodeshutdown",
            "NoExecute",
        )
    };
    let cases = [
        ("marker only, node Ready", marker(mk_node("n")), false),
        (
            "marker only, node not Ready",
            marker(mk_node("n")).ready(false),
            false,
        ),
        ("taint, marker, Ready", oos(marker(mk_node("n"))), false),
        (
            "taint and marker of another policy",
            oos(mk_node("n").annotation(TAINT_MARKER_ANNOTATION, "q")).ready(false),
            false,
        ),
        (
            "taint without marker",
            oos(mk_node("n")).ready(false),
            false,
        ),
        (
            "taint, marker, not Ready",
            oos(marker(mk_node("n"))).ready(false),
            true,
        ),
    ];
    for (what, node, resumes) in cases {
        assert_eq!(podha_taint_proves_failure(&node, "p"), resumes, "{what}");
        let obs = crate::health::NodeObservations::new(Instant::now());
        let tracker = resumed_tracker(&node, "p", &obs, Instant::now());
        assert_eq!(tracker.state().is_failed(), resumes, "{what}");
        // Even a resumed failover is no judgement: nothing new is done before a probe fails.
        assert!(!tracker.judged_failed(), "{what}");
    }
}

struct Harness {
    actor: Actor,
    writes: crate::runtime::writer::LaneReceivers,
    metrics: Arc<Metrics>,
    leader: watch::Sender<Option<crate::leader::Claim>>,
    _plans: [watch::Receiver<ProbePlan>; 2],
}

/// A policy that judges a node by NodeReady alone, after one failed probe.
fn quick_spec() -> PodHAPolicySpec {
    let mut spec = mk_spec();
    spec.detection.signals = vec![crate::api::Signal::NodeReady];
    spec.detection.failure_threshold = 1;
    spec.detection.interval = crate::api::HumanDuration::from_secs(1);
    spec.safety.max_unhealthy = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10);
    spec
}

/// An actor that leads, fed a complete initial list of these objects and the policy `p` of
/// [`quick_spec`].
fn harness(objects: Vec<Obj>) -> Harness {
    harness_with(objects, Some(quick_spec()))
}

/// An actor that leads, fed a complete initial list of these objects and, if given, the
/// policy `p` with this spec.
fn harness_with(objects: Vec<Obj>, spec: Option<PodHAPolicySpec>) -> Harness {
    let (leader_tx, leader_rx) = crate::leader::channel();
    leader_tx.send_replace(Some(crate::leader::Claim::for_tests()));
    let (ready_tx, _) = watch::channel(false);
    let (writes_tx, writes) = crate::runtime::writer::lanes();
    let (kubelet_plan, kubelet_rx) = watch::channel(ProbePlan::default());
    let (agent_plan, agent_rx) = watch::channel(ProbePlan::default());
    let plans = PlanSenders {
        kubelet: kubelet_plan,
        agent: agent_plan,
    };
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let outputs = Outputs {
        ready: ready_tx,
        writes: writes_tx,
        probe_plans: plans,
    };
    let mut actor = Actor::new(leader_rx, outputs, metrics.clone());
    // The view was complete a while ago: a node judged dead has missed its Lease renewal (a
    // renew interval and the slack, with no Lease seen) by the first tick.
    let now = Instant::now() - VIEW_AGE;
    let view = view_with(objects);
    let state = &mut actor.state;
    state.apply(Change::Policy(Event::Init), now);
    if let Some(spec) = spec {
        state.apply(
            Change::Policy(Event::InitApply(PodHAPolicy::new("p", spec).into())),
            now,
        );
    }
    state.apply(Change::Policy(Event::InitDone), now);
    state.apply(Change::Node(Event::Init), now);
    for node in view.nodes.values() {
        state.apply(Change::Node(Event::InitApply((**node).clone())), now);
    }
    state.apply(Change::Node(Event::InitDone), now);
    state.apply(Change::Pod(Event::Init), now);
    for pod in view.pods_by_node.values().flatten() {
        state.apply(Change::Pod(Event::InitApply((**pod).clone())), now);
    }
    state.apply(Change::Pod(Event::InitDone), now);
    state.apply(Change::Pvc(Event::Init), now);
    for pvc in view.pvcs.values() {
        state.apply(Change::Pvc(Event::InitApply((**pvc).clone())), now);
    }
    state.apply(Change::Pvc(Event::InitDone), now);
    state.apply(Change::Pv(Event::Init), now);
    for pv in view.pvs.values() {
        state.apply(Change::Pv(Event::InitApply((**pv).clone())), now);
    }
    state.apply(Change::Pv(Event::InitDone), now);
    state.apply(Change::Lease(Event::<Lease>::Init), now);
    state.apply(Change::Lease(Event::InitDone), now);
    state.apply(Change::Va(Event::Init), now);
    for node in view.nodes.keys() {
        for va in view.attachments_on(node) {
            state.apply(Change::Va(Event::InitApply((**va).clone())), now);
        }
    }
    state.apply(Change::Va(Event::InitDone), now);
    state.apply(Change::ReplicaSet(Event::Init), now);
    state.apply(Change::ReplicaSet(Event::InitDone), now);
    state.apply(Change::Namespace(Event::Init), now);
    state.apply(Change::Namespace(Event::InitDone), now);
    // Every node that advertises an agent has its agent's Lease.
    state.apply(Change::AgentLease(Event::Init), now);
    for (name, node) in &view.nodes {
        if crate::contract::agent_addr(node).is_some() {
            let lease = mk_agent_lease(name, 100);
            state.apply(Change::AgentLease(Event::InitApply(lease)), now);
        }
    }
    state.apply(Change::AgentLease(Event::InitDone), now);
    // Leading since then too: the leadership's restart of every clock is behind.
    actor.follow_leadership(now);
    Harness {
        actor,
        writes,
        metrics,
        leader: leader_tx,
        _plans: [kubelet_rx, agent_rx],
    }
}

/// How long before the test's start the harness's view was complete.
const VIEW_AGE: Duration = Duration::from_secs(14);

fn dead_node_with_pods(node: &str) -> Vec<Obj> {
    let claim = format!("data-{node}");
    let pv = format!("pv-{node}");
    vec![
        mk_node(node).ready(false).into(),
        mk_pod("ns", &format!("db-{node}"))
            .on(node)
            .owned_by_sts("db")
            .claim(&claim)
            .into(),
        mk_pvc("ns", &claim).bound_to(&pv).into(),
        mk_csi_pv(&pv, DRIVER).into(),
        mk_pod("ns", &format!("bare-{node}"))
            .on(node)
            .claim(&claim)
            .into(),
    ]
}

impl Harness {
    /// The user applies the policy `p` with this spec (created or edited).
    fn apply_policy(&mut self, spec: PodHAPolicySpec) {
        let policy = PodHAPolicy::new("p", spec);
        self.actor
            .state
            .apply(Change::Policy(Event::Apply(policy.into())), Instant::now());
    }

    /// Ticks for `secs` seconds of the loop's time.
    async fn run_for(&mut self, secs: u64) {
        for _ in 0..(secs * 1000 / TICK.as_millis() as u64) {
            tokio::time::advance(TICK).await;
            self.actor.tick(Instant::now()).await;
            self.actor.finish_coverage_job();
        }
    }

    fn applied(&mut self, intent: Intent) {
        let result = ActResult {
            intent,
            result: Ok(Outcome::Applied),
        };
        self.actor.on_result(result, Instant::now());
    }
}

fn acts(rx: &mut crate::runtime::writer::LaneReceivers) -> Vec<String> {
    rx.queued_intents().iter().map(Intent::key).collect()
}

fn skipped(metrics: &Metrics) -> f64 {
    let text = metrics.encode().expect("encode");
    text.lines()
        .filter(|l| l.starts_with("podha_pods_skipped_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(start_paused = true)]
async fn each_action_is_sent_once_and_each_skip_counted_once() {
    let mut objects = dead_node_with_pods("node-1");
    objects.extend(dead_node_with_pods("node-10"));
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness(objects);
    h.actor.tick(Instant::now()).await;
    assert_eq!(
        acts(&mut h.writes),
        ["taint/node-1", "taint/node-10"],
        "pods wait for their node's taint"
    );
    assert_eq!(skipped(&h.metrics), 2.0, "one skip per bare pod");
    for node in ["node-1", "node-10"] {
        let intent = Intent::TaintNode {
            node: node.into(),
            policy: "p".into(),
            taint: NodeTaint::OutOfService,
            agent_lease_seen: None,
        };
        let result = Ok(Outcome::Applied);
        h.actor
            .on_result(ActResult { intent, result }, Instant::now());
    }
    // The taint eviction controller's delete goes first (none comes here).
    tokio::time::advance(TAINT_EVICTION_WAIT).await;
    h.actor.tick(Instant::now()).await;
    assert_eq!(
        acts(&mut h.writes),
        ["delete/uid-ns-db-node-1", "delete/uid-ns-db-node-10"]
    );
    for _ in 0..10 {
        tokio::time::advance(TICK).await;
        h.actor.tick(Instant::now()).await;
    }
    assert!(
        acts(&mut h.writes).is_empty(),
        "in flight: nothing is sent twice"
    );
    assert_eq!(
        skipped(&h.metrics),
        2.0,
        "skips are counted once per incident"
    );
}

fn mark_of(pod: &str) -> Intent {
    Intent::MarkPodNotReady {
        pod: crate::view::ObjectKey::new("ns", pod),
        uid: format!("uid-ns-{pod}"),
        node: "node-1".into(),
        policy: "p".into(),
    }
}

fn delete_of(pod: &str, version: &str) -> Intent {
    Intent::ForceDeletePod {
        pod: crate::view::ObjectKey::new("ns", pod),
        uid: format!("uid-ns-{pod}"),
        node: "node-1".into(),
        policy: "p".into(),
        owner_kind: "StatefulSet".to_string(),
        resource_version: Some(version.into()),
    }
}

#[tokio::test(start_paused = true)]
async fn ready_pods_are_marked_before_the_taint_then_deleted_in_the_marked_version() {
    let objects: Vec<Obj> = vec![
        mk_node("node-1").ready(false).into(),
        mk_node("node-2").into(),
        mk_node("node-3").into(),
        mk_pod("ns", "db-0")
            .on("node-1")
            .owned_by_sts("db")
            .claim("data-0")
            .ready(true)
            .into(),
        mk_pod("ns", "db-1")
            .on("node-1")
            .owned_by_sts("db")
            .claim("data-1")
            .ready(true)
            .into(),
        mk_pvc("ns", "data-0").bound_to("pv-0").into(),
        mk_pvc("ns", "data-1").bound_to("pv-1").into(),
        mk_csi_pv("pv-0", DRIVER).into(),
        mk_csi_pv("pv-1", DRIVER).into(),
    ];
    let mut h = harness(objects);
    h.actor.tick(Instant::now()).await;
    assert_eq!(
        acts(&mut h.writes),
        ["mark/uid-ns-db-0", "mark/uid-ns-db-1"],
        "the marks go out before the taint"
    );
    let now = Instant::now();
    for (pod, version) in [("db-0", "10"), ("db-1", "11")] {
        let result = Ok(Outcome::Marked {
            resource_version: Some(version.into()),
        });
        h.actor.on_result(
            ActResult {
                intent: mark_of(pod),
                result,
            },
            now,
        );
    }
    h.actor.tick(now).await;
    assert_eq!(
        acts(&mut h.writes),
        ["taint/node-1"],
        "the marks landed: the taint, and no delete before it is on"
    );
    let taint = Intent::TaintNode {
        node: "node-1".into(),
        policy: "p".into(),
        taint: NodeTaint::OutOfService,
        agent_lease_seen: None,
    };
    h.actor.on_result(
        ActResult {
            intent: taint,
            result: Ok(Outcome::Applied),
        },
        now,
    );
    // No taint eviction controller here: podha deletes once its wait is over.
    let now = now + TAINT_EVICTION_WAIT;
    h.actor.tick(now).await;
    assert_eq!(
        h.writes.queued_intents(),
        [delete_of("db-0", "10"), delete_of("db-1", "11")],
        "each delete in the version its mark produced"
    );

    // db-0 deleted. db-1 changed after its mark: not deleted.
    for (pod, version, outcome) in [
        ("db-0", "10", Outcome::Applied),
        ("db-1", "11", Outcome::Changed),
    ] {
        let result = ActResult {
            intent: delete_of(pod, version),
            result: Ok(outcome),
        };
        h.actor.on_result(result, now);
    }
    let incident = h.actor.ledger.get("node-1").expect("incident");
    assert!(incident.deleted.contains("uid-ns-db-0"));
    assert!(!incident.deleted.contains("uid-ns-db-1"));
    assert_eq!(incident.marked_not_ready.get("uid-ns-db-1"), Some(&None));
    let text = h.metrics.encode().expect("encode");
    let deleted: f64 = text
        .lines()
        .filter(|l| l.starts_with("podha_pods_deleted_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum();
    assert_eq!(deleted, 1.0, "only db-0 was deleted");
    // The watch still shows db-1 Ready: nothing more until it shows what changed.
    for _ in 0..5 {
        tokio::time::advance(TICK).await;
        h.actor.tick(Instant::now()).await;
    }
    assert!(acts(&mut h.writes).is_empty());
}

#[tokio::test(start_paused = true)]
async fn closing_one_incident_does_not_forget_another_nodes_reports() {
    let mut objects = dead_node_with_pods("node-1");
    objects.extend(dead_node_with_pods("node-10"));
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness(objects);
    h.actor.tick(Instant::now()).await;
    assert_eq!(skipped(&h.metrics), 2.0);
    // node-1 comes back: its incident closes; node-10 stays dead.
    let now = Instant::now();
    h.actor
        .state
        .apply(Change::Node(Event::Apply(mk_node("node-1"))), now);
    // The next probe (1 s) sees node-1 alive; keep ticking well past the close.
    for _ in 0..15 {
        tokio::time::advance(TICK).await;
        h.actor.tick(Instant::now()).await;
    }
    assert!(
        h.actor.ledger.get("node-1").is_none(),
        "node-1's incident closed"
    );
    assert!(h.actor.ledger.get("node-10").is_some());
    assert_eq!(
        skipped(&h.metrics),
        2.0,
        "node-10's skip is not counted again"
    );
}

fn taint_of(node: &str) -> Intent {
    Intent::TaintNode {
        node: node.into(),
        policy: "p".into(),
        taint: NodeTaint::OutOfService,
        agent_lease_seen: None,
    }
}

/// A policy created after its node died acts on that node (the node is
/// judged by the new policy's own probes; its pods then are the pods at failure).
#[tokio::test(start_paused = true)]
async fn a_policy_created_after_the_node_died_acts_on_it() {
    let mut objects = dead_node_with_pods("node-1");
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut h = harness_with(objects, None);
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "no policy, nothing done");
    h.apply_policy(quick_spec());
    h.run_for(2).await;
    assert_eq!(acts(&mut h.writes), ["taint/node-1"]);
    h.applied(taint_of("node-1"));
    tokio::time::advance(TAINT_EVICTION_WAIT).await;
    h.run_for(1).await;
    assert_eq!(acts(&mut h.writes), ["delete/uid-ns-db-node-1"]);
}

/// A rehearsal turned real acts on the incident it rehearsed, at once.
#[tokio::test(start_paused = true)]
async fn dry_run_turned_off_mid_incident_acts_on_it() {
    let mut objects = dead_node_with_pods("node-1");
    objects.push(mk_node("node-2").into());
    objects.push(mk_node("node-3").into());
    let mut rehearsal = quick_spec();
    rehearsal.dry_run = true;
    let mut h = harness_with(objects, Some(rehearsal));
    h.run_for(3).await;
    assert!(acts(&mut h.writes).is_empty(), "a dry run writes nothing");
    assert!(
        h.actor.ledger.get("node-1").is_some(),
        "the incident is open"
    );
    h.apply_policy(quick_spec());
    h.actor.tick(Instant::now()).await;
    assert_eq!(acts(&mut h.writes), ["taint/node-1"], "on the next tick");
    h.applied(taint_of("node-1"));
    tokio::time::advance(TAINT_EVICTION_WAIT).await;
    h.actor.tick(Instant::now()).await;
    assert_eq!(acts(&mut h.writes), ["delete/uid-ns-db-node-1"]);
}

/// A pod selector widened mid-incident moves the pod it now selects, if it
/// was on the node when it died, and lifts the refusal of the out-of-service taint that the
/// unselected pod caused: the volume of the pod podha moved earlier, waiting out the
/// attach/detach controller behind podha's fence, is let go at once.
#[tokio::test(start_paused = true)]
async fn a_selector_widened_mid_incident_moves_the_pods_it_now_selects() {
    let pod = |name: &str, tier: &str, claim: &str| {
        mk_pod("ns", name)
            .on("node-1")
            .owned_by_sts(tier)
            .claim(claim)
            .label("tier", tier)
    };
    let objects: Vec<Obj> = vec![
        mk_node("node-1").ready(false).into(),
        mk_node("node-2").into(),
        mk_node("node-3").into(),
        pod("db-0", "db", "data-0").into(),
        pod("cache-0", "cache", "data-1").into(),
        mk_pvc("ns", "data-0").bound_to("pv-0").into(),
        mk_pvc("ns", "data-1").bound_to("pv-1").into(),
        mk_csi_pv("pv-0", DRIVER).claimed_by("ns", "data-0").into(),
        mk_csi_pv("pv-1", DRIVER).claimed_by("ns", "data-1").into(),
        mk_va("va-0", DRIVER, "pv-0", "node-1").into(),
        mk_va("va-1", DRIVER, "pv-1", "node-1").into(),
    ];
    let only = |tiers: &[&str]| {
        let mut spec = quick_spec();
        spec.pod_selector = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(tiers.iter().map(|t| t.to_string()).collect()),
            }]),
            ..LabelSelector::default()
        };
        spec
    };
    let mut h = harness_with(objects, Some(only(&["db"])));
    h.actor.tick(Instant::now()).await;
    // cache-0's volume is on storage no policy vouches for: podha's fence, not the
    // out-of-service taint, and only db-0 moves.
    let fence = Intent::TaintNode {
        node: "node-1".into(),
        policy: "p".into(),
        taint: NodeTaint::Fence,
        agent_lease_seen: None,
    };
    assert_eq!(h.writes.queued_intents(), std::slice::from_ref(&fence));
    h.applied(fence);
    let fenced = mk_node("node-1")
        .ready(false)
        .taint(crate::api::FENCE_TAINT_KEY, "nodeDead", "NoSchedule")
        .annotation(TAINT_MARKER_ANNOTATION, "p");
    let now = Instant::now();
    h.actor.state.apply(Change::Node(Event::Apply(fenced)), now);
    h.actor.tick(now).await;
    assert_eq!(acts(&mut h.writes), ["delete/uid-ns-db-0"]);
    h.applied(Intent::ForceDeletePod {
        pod: crate::view::ObjectKey::new("ns", "db-0"),
        uid: "uid-ns-db-0".into(),
        node: "node-1".into(),
        policy: "p".into(),
        owner_kind: "StatefulSet".to_string(),
        resource_version: None,
    });
    let db0 = pod("db-0", "db", "data-0");
    h.actor
        .state
        .apply(Change::Pod(Event::Delete(db0)), Instant::now());
    h.run_for(2).await;
    assert!(
        acts(&mut h.writes).is_empty(),
        "cache-0 is not selected: pv-0 waits behind the fence"
    );

    h.apply_policy(only(&["db", "cache"]));
    h.actor.tick(Instant::now()).await;
    let mut sent = acts(&mut h.writes);
    sent.sort();
    assert_eq!(sent, ["delete/uid-ns-cache-0", "taint/node-1"]);
}

mod coverage;
mod power;
mod resumed;
mod silence;
