use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use tokio::time::Instant;

use super::*;
use crate::api::PodHAPolicyStatus;
use crate::api::{Action, FencingProof, PodHAPolicySpec, condition};
use crate::eligibility::SkipReason;
use crate::planner::PolicyRef;
use crate::test_builders::*;
use crate::view::View;

const DRIVER: &str = "rwo.sim.podha.io";

/// Two Ready nodes; on n1, the StatefulSet pod `shop/db-0` with one RWO claim of `DRIVER`.
fn view() -> View {
    view_with([
        mk_node("n1").ready(true).into(),
        mk_node("n2").ready(true).into(),
    ])
    .with(stateful("db-0", "pv-db"))
    .with(mk_pvc("shop", "data-db-0").bound_to("pv-db"))
    .with(mk_csi_pv("pv-db", DRIVER))
}

fn stateful(name: &str, _pv: &str) -> Pod {
    mk_pod("shop", name)
        .on("n1")
        .owned_by_sts(name.trim_end_matches("-0"))
        .claim(&format!("data-{name}"))
}

/// `pod` with its own claim and volume of `driver`.
fn with_volume(view: View, pod: Pod, driver: &str) -> View {
    let name = pod.metadata.name.clone().unwrap_or_default();
    view.with(pod)
        .with(mk_pvc("shop", &format!("data-{name}")).bound_to(&format!("pv-{name}")))
        .with(mk_csi_pv(&format!("pv-{name}"), driver))
}

fn leading() -> LeaderLease {
    LeaderLease {
        namespace: "podha-system".into(),
        name: "podha-leader".into(),
        holder: Some("podha-0".into()),
        renewed_ago: Some(Duration::from_secs(2)),
        lasts: Duration::from_secs(15),
    }
}

struct Fixture {
    specs: Vec<(String, PodHAPolicySpec)>,
    statuses: BTreeMap<String, PodHAPolicyStatus>,
    unreadable: BTreeMap<String, String>,
    view: View,
    leader: Option<LeaderLease>,
    now: Instant,
}

impl Fixture {
    fn new(view: View) -> Self {
        Self {
            specs: vec![("p".into(), mk_spec())],
            statuses: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            view,
            leader: Some(leading()),
            now: Instant::now(),
        }
    }

    fn spec(mut self, spec: PodHAPolicySpec) -> Self {
        self.specs = vec![("p".into(), spec)];
        self
    }

    fn cluster(&self) -> Cluster<'_> {
        Cluster::new(
            self.specs
                .iter()
                .map(|(name, spec)| PolicyRef { name, spec })
                .collect(),
            &self.unreadable,
            &self.statuses,
            &self.view,
            Operator::Lease(self.leader.as_ref()),
            self.now,
        )
    }

    fn pod(&self, name: &str) -> PodExplanation {
        let pod = self
            .view
            .pods_by_node
            .values()
            .flatten()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .expect("pod in view");
        explain_pod(&self.cluster(), pod)
    }
}

fn outcome_of(e: &PodExplanation, rule: &str) -> Outcome {
    e.checks
        .iter()
        .find(|c| c.rule == rule)
        .unwrap_or_else(|| panic!("no rule {rule}: {:?}", e.checks))
        .outcome
}

fn failure(e: &PodExplanation) -> (&'static str, &str) {
    let c = e.first_failure().expect("a rule fails");
    (c.rule, c.detail.as_str())
}

#[test]
fn a_protected_pod_passes_every_rule_and_names_the_timing_it_cannot_predict() {
    let f = Fixture::new(view());
    let e = f.pod("db-0");
    assert!(e.protected, "{:?}", e.checks);
    assert_eq!(e.policy.as_deref(), Some("p"));
    assert_eq!(e.node.as_deref(), Some("n1"));
    let rules: Vec<&str> = e.checks.iter().map(|c| c.rule).collect();
    assert_eq!(
        rules,
        [
            "podha",
            "node",
            "policy",
            "node policy",
            "state",
            "owner",
            "volumes",
            "target",
            "tolerations",
            "taint",
            "proof",
            "timing"
        ]
    );
    let by_rule = |rule| &e.checks.iter().find(|c| c.rule == rule).unwrap().detail;
    assert!(by_rule("volumes").contains("data-db-0 → pv-db (rwo.sim.podha.io, ReadWriteOnce)"));
    assert!(by_rule("target").starts_with("n2 could run it"));
    assert!(by_rule("taint").starts_with("node.kubernetes.io/out-of-service:"));
    assert!(by_rule("proof").starts_with("fencing.proof None"));
    assert_eq!(outcome_of(&e, "timing"), Outcome::Note);
    assert!(by_rule("timing").contains("not predicted"));
}

#[test]
fn a_pod_of_another_driver_fails_on_its_volume() {
    let view = with_volume(view(), stateful("other-0", ""), "other.csi.example.com");
    let f = Fixture::new(view).spec(mk_spec().drivers(&[DRIVER]));
    let e = f.pod("other-0");
    assert!(!e.protected);
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "volumes");
    assert!(
        detail.starts_with("policy p: DriverNotSelected")
            && detail.contains("pv-other-0 (other.csi.example.com"),
        "{detail}"
    );
    // The rule before it passed; the planner judges no rule after the first refusal.
    assert_eq!(outcome_of(&e, "owner"), Outcome::Pass);
    assert!(
        e.checks.iter().all(|c| c.rule != "target"),
        "{:?}",
        e.checks
    );
}

#[test]
fn an_opted_out_pod_fails_on_its_owner_rule() {
    let pod = stateful("cache-0", "").annotation("podha.io/failover", "false");
    let f = Fixture::new(with_volume(view(), pod, DRIVER));
    let e = f.pod("cache-0");
    assert_eq!(failure(&e).0, "owner");
    assert!(
        failure(&e).1.starts_with("policy p: OptedOut"),
        "{:?}",
        failure(&e)
    );
}

/// A pod of a custom controller: explain names the kind, group included, that it counts as,
/// and the owners it was compared with.
#[test]
fn the_owner_rule_names_the_controller_kind_it_matched() {
    let pg = mk_pod("shop", "pg-1")
        .on("n1")
        .owned_by("postgresql.cnpg.io/v1", "Cluster", "pg")
        .claim("data-pg-1");
    let view = with_volume(view(), pg, DRIVER);
    let unlisted = Fixture::new(view.clone()).pod("pg-1");
    let (rule, detail) = failure(&unlisted);
    assert_eq!(rule, "owner");
    assert!(
        detail.starts_with("policy p: OwnerKindNotSelected")
            && detail.contains("Cluster.postgresql.cnpg.io pg, owners: [StatefulSet, Deployment]"),
        "{detail}"
    );
    let owners = [
        "StatefulSet".parse().unwrap(),
        "Cluster.postgresql.cnpg.io".parse().unwrap(),
    ];
    let listed = Fixture::new(view)
        .spec(mk_spec().owners(&owners))
        .pod("pg-1");
    assert!(listed.protected, "{:?}", listed.checks);
    let owner = listed.checks.iter().find(|c| c.rule == "owner").unwrap();
    assert_eq!(
        owner.detail,
        "Cluster.postgresql.cnpg.io pg (listed in owners)"
    );

    // A kind owners cannot name (the core group's) is not suggested: the pod is opted in.
    let rc = mk_pod("shop", "rc-1")
        .on("n1")
        .owned_by("v1", "ReplicationController", "rc")
        .claim("data-rc-1");
    let view = with_volume(self::view(), rc, DRIVER);
    let explained = Fixture::new(view).pod("rc-1");
    let (rule, detail) = failure(&explained);
    assert_eq!(rule, "owner");
    assert!(
        detail.contains("owners cannot name it") && !detail.contains("add "),
        "{detail}"
    );
}

#[test]
fn a_pod_tolerating_the_fence_fails_on_its_tolerations() {
    let pod = stateful("any-0", "").toleration(Toleration {
        operator: Some("Exists".into()),
        ..Toleration::default()
    });
    let f = Fixture::new(with_volume(view(), pod, DRIVER));
    let e = f.pod("any-0");
    assert_eq!(failure(&e).0, "tolerations");
    assert!(
        failure(&e).1.contains("ToleratesFence")
            && failure(&e)
                .1
                .ends_with("(it tolerates node.kubernetes.io/out-of-service)"),
        "{:?}",
        failure(&e)
    );
}

#[test]
fn under_the_agent_proof_the_nodes_agent_decides() {
    let spec = {
        let mut s = mk_spec();
        s.fencing.proof = FencingProof::Agent;
        s
    };
    // No agent on n1.
    let f = Fixture::new(view()).spec(spec.clone());
    let e = f.pod("db-0");
    assert_eq!(failure(&e), ("agent", "no agent"));
    assert_eq!(outcome_of(&e, "proof"), Outcome::Fail);

    // An agent without a watchdog says why on the Node.
    let mut view_without = view();
    let n1 = mk_node("n1").ready(true).agent(None).annotation(
        crate::contract::AGENT_WATCHDOG_ANNOTATION,
        "none: no /dev/watchdog",
    );
    view_without.nodes.insert("n1".into(), n1.into());
    let f = Fixture::new(view_without).spec(spec.clone());
    let e = f.pod("db-0");
    assert_eq!(
        failure(&e),
        (
            "agent",
            "agent without a usable watchdog (podha.io/agent-watchdog: none: no /dev/watchdog)"
        )
    );

    // An agent with a watchdog and a fresh Lease.
    let mut view_with = view();
    view_with.nodes.insert(
        "n1".into(),
        mk_node("n1").ready(true).agent(Some("8s")).into(),
    );
    let mut f = Fixture::new(view_with).spec(spec);
    f.view
        .agent_adverts
        .insert("n1".into(), agent_advert(f.now - Duration::from_secs(3)));
    // Alone, its silence proves nothing: podha must hear a strict majority of the agents.
    // With n2's agent, one silent of two is half of them: still nothing. With n3's too, the
    // proof.
    for (others, heard) in [(None, "0 of 0"), (Some("n2"), "1 of 1")] {
        if let Some(other) = others {
            add_agent(&mut f, other);
        }
        let e = f.pod("db-0");
        let (rule, detail) = failure(&e);
        assert_eq!(rule, "proof");
        assert!(detail.contains(&format!("{heard} other nodes")), "{detail}");
    }
    add_agent(&mut f, "n3");
    let e = f.pod("db-0");
    assert!(e.protected, "{:?}", e.checks);
    let proof = e.checks.iter().find(|c| c.rule == "proof").unwrap();
    assert_eq!(
        proof.detail,
        "Agent: a silence of 8.0s plus agentMargin 4s (counted from the last renewal of the \
         agent's Lease, if later) proves the fence"
    );

    // The same agent whose Lease ran out proves nothing.
    f.view
        .agent_adverts
        .insert("n1".into(), agent_advert(f.now - Duration::from_secs(120)));
    assert_eq!(
        failure(&f.pod("db-0")),
        ("agent", "agent Lease missing or not renewed")
    );
}

/// A Ready node `node` whose agent pets an 8 s watchdog and renewed its Lease a second ago.
fn add_agent(f: &mut Fixture, node: &str) {
    f.view.nodes.insert(
        node.into(),
        mk_node(node).ready(true).agent(Some("8s")).into(),
    );
    f.view
        .agent_adverts
        .insert(node.into(), agent_advert(f.now - Duration::from_secs(1)));
}

#[test]
fn an_unselected_pod_names_each_policys_refusing_selector() {
    let mut f = Fixture::new(view());
    f.specs = Vec::new();
    assert_eq!(
        failure(&f.pod("db-0")),
        ("policy", "no PodHAPolicy exists: podha moves nothing")
    );
    let elsewhere = mk_spec().namespace_selector(LabelSelector {
        match_labels: Some(BTreeMap::from([("team".to_string(), "x".to_string())])),
        ..LabelSelector::default()
    });
    let f = Fixture::new(view()).spec(elsewhere);
    assert_eq!(
        failure(&f.pod("db-0")),
        (
            "policy",
            "no PodHAPolicy selects namespace shop (policy p: namespaceSelector does not select it)"
        )
    );
}

#[test]
fn the_policys_state_dry_run_or_too_many_unhealthy_nodes_fails_it() {
    let mut dry = mk_spec();
    dry.dry_run = true;
    let f = Fixture::new(view()).spec(dry);
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(
        detail.starts_with("p: dryRun is on (it governs n1)"),
        "{detail}"
    );

    let mut f = Fixture::new(view());
    f.statuses.insert(
        "p".into(),
        PodHAPolicyStatus {
            conditions: vec![Condition {
                type_: condition::DEGRADED.into(),
                status: "True".into(),
                reason: condition::REASON_TOO_MANY_UNHEALTHY.into(),
                message: "3 of 5 nodes unhealthy".into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..PodHAPolicyStatus::default()
        },
    );
    assert_eq!(
        failure(&f.pod("db-0")),
        (
            "state",
            "p holds every action: TooManyUnhealthyNodes (3 of 5 nodes unhealthy)"
        )
    );
}

#[test]
fn without_a_leading_podha_nothing_is_protected() {
    let mut f = Fixture::new(view());
    f.leader = None;
    assert_eq!(failure(&f.pod("db-0")).0, "podha");
    f.leader = Some(LeaderLease {
        renewed_ago: Some(Duration::from_secs(300)),
        ..leading()
    });
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "podha");
    assert!(
        detail.contains("last renewed by podha-0 5m ago"),
        "{detail}"
    );
}

#[test]
fn a_pod_that_must_stay_turns_the_taint_into_podhas_fence_without_failing_the_others() {
    let bare = mk_pod("shop", "bare").on("n1").claim("data-bare");
    let view = view()
        .with(bare)
        .with(mk_pvc("shop", "data-bare").bound_to("pv-bare"))
        .with(mk_csi_pv("pv-bare", DRIVER));
    let f = Fixture::new(view);
    let e = f.pod("db-0");
    assert!(e.protected, "{:?}", e.checks);
    let taint = e.checks.iter().find(|c| c.rule == "taint").unwrap();
    assert_eq!(taint.outcome, Outcome::Slow);
    assert!(e.slow(), "protected, on the 6-minute path");
    assert!(
        taint
            .detail
            .starts_with("node.kubernetes.io/out-of-service would be refused while shop/bare must stay on n1 (NoControllerOwner)"),
        "{}",
        taint.detail
    );
    assert_eq!(failure(&f.pod("bare")).0, "owner");
}

#[test]
fn an_unscheduled_or_finished_pod_has_nothing_to_move() {
    let mut pending = mk_pod("shop", "later-0").owned_by_sts("later");
    pending.spec.get_or_insert_default().node_name = None;
    let f = Fixture::new(view());
    let e = explain_pod(&f.cluster(), &pending);
    assert_eq!(failure(&e).0, "node");
    let done = stateful("job-0", "").phase("Succeeded");
    let f = Fixture::new(with_volume(view(), done, DRIVER));
    assert!(failure(&f.pod("job-0")).1.contains("has finished"));
}

#[test]
fn a_node_lists_its_pods_with_volumes_and_their_verdicts() {
    let view = with_volume(
        view(),
        stateful("cache-0", "").annotation("podha.io/failover", "false"),
        DRIVER,
    )
    .with(mk_pod("shop", "web-1").on("n1").owned_by_rs("web-abc"));
    let f = Fixture::new(view);
    let e = explain_node(&f.cluster(), "n1").expect("node exists");
    assert!(e.protected, "{:?}", e.checks);
    assert_eq!(e.policy.as_deref(), Some("p"));
    let pods: Vec<(&str, bool, Option<&str>)> = e
        .pods
        .iter()
        .map(|p| {
            (
                p.pod.as_str(),
                p.protected,
                p.because.as_ref().map(|c| c.rule),
            )
        })
        .collect();
    assert_eq!(
        pods,
        [
            ("shop/cache-0", false, Some("owner")),
            ("shop/db-0", true, None)
        ]
    );
    assert!(explain_node(&f.cluster(), "n9").is_none());

    let mut elsewhere = mk_spec();
    elsewhere.node_selector = LabelSelector {
        match_labels: Some(BTreeMap::from([("zone".to_string(), "x".to_string())])),
        ..LabelSelector::default()
    };
    let f = Fixture::new(self::view()).spec(elsewhere);
    let e = explain_node(&f.cluster(), "n1").unwrap();
    assert!(!e.protected);
    assert!(
        e.checks
            .iter()
            .any(|c| c.rule == "node policy" && c.failed())
    );
}

#[test]
fn a_policy_counts_the_pods_it_protects_and_shows_its_failovers() {
    let view = with_volume(
        with_volume(
            view(),
            stateful("cache-0", "").annotation("podha.io/failover", "false"),
            DRIVER,
        ),
        stateful("other-0", ""),
        "other.csi.example.com",
    )
    .with(mk_pod("shop", "web-1").on("n1").owned_by_rs("web-abc"));
    let mut f = Fixture::new(view).spec(mk_spec().drivers(&[DRIVER]));
    let detected = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let later = |s: i64| Time(detected + k8s_openapi::jiff::SignedDuration::from_secs(s));
    f.statuses.insert(
        "p".into(),
        PodHAPolicyStatus {
            watched_nodes: 2,
            recent_failovers: vec![crate::api::FailoverRecord {
                node: "n3".into(),
                phase: crate::api::FailoverPhase::Recovered,
                last_seen_alive: Some(later(-8)),
                detected_at: Time(detected),
                acted_at: Some(later(1)),
                detached_at: Some(later(4)),
                recovered_at: Some(later(12)),
                pods: vec!["shop/db-0".into()],
                message: None,
            }],
            ..PodHAPolicyStatus::default()
        },
    );
    let e = explain_policy(&f.cluster(), "p", Ok(Vec::new())).expect("policy exists");
    assert_eq!((e.coverage.protected, e.coverage.unprotected), (1, 2));
    assert_eq!(
        e.coverage.reasons,
        [
            (
                crate::protection::Unprotected::Ineligible(SkipReason::DriverNotSelected),
                1
            ),
            (
                crate::protection::Unprotected::Ineligible(SkipReason::OptedOut),
                1
            ),
        ]
    );
    let failover = &e.failovers[0];
    assert_eq!(
        (
            failover.last_seen_alive_before.as_deref(),
            failover.acted_after.as_deref(),
            failover.detached_after.as_deref(),
            failover.recovered_after.as_deref()
        ),
        (Some("8.0s"), Some("1.0s"), Some("4.0s"), Some("12s"))
    );
    let text = render::policy(&e);
    assert!(text.contains("1 protected, 2 not"), "{text}");
    assert!(text.contains("the API server keeps them 1h"), "{text}");
    assert!(explain_policy(&f.cluster(), "nope", Ok(Vec::new())).is_none());
    let forbidden = explain_policy(&f.cluster(), "p", Err("events is forbidden".into())).unwrap();
    assert!(render::policy(&forbidden).contains("  cannot be read: events is forbidden"));
}

#[test]
fn the_pod_table_leads_with_the_verdict() {
    let f = Fixture::new(view());
    let text = render::pod(&f.pod("db-0"));
    assert!(
        text.starts_with("pod shop/db-0: protected: podha would fail it over if n1 died now"),
        "{text}"
    );
    let mut f = Fixture::new(view());
    f.leader = None;
    let text = render::pod(&f.pod("db-0"));
    assert!(
        text.starts_with("pod shop/db-0: NOT protected: podha"),
        "{text}"
    );
    assert!(
        text.contains("\npodha        NO    no podha leader Lease found"),
        "{text}"
    );
    // JSON for scripts: the same checks.
    let json: serde_json::Value = serde_json::from_str(&to_json(&f.pod("db-0"))).unwrap();
    assert_eq!(json["protected"], false);
    assert_eq!(json["checks"][0]["rule"], "podha");
    assert_eq!(json["checks"][0]["outcome"], "fail");
}

/// `DeletePods` fences for the scheduler only, and waits for the proof as the taint does: a
/// node without an agent has no proof under `Agent`, and the pod is not protected.
#[test]
fn delete_pods_fences_for_the_scheduler_only_and_needs_the_proof() {
    let mut spec = mk_spec();
    spec.action = Action::DeletePods;
    spec.fencing.proof = FencingProof::Agent;
    let f = Fixture::new(view()).spec(spec);
    let e = f.pod("db-0");
    let detail = |rule| {
        e.checks
            .iter()
            .find(|c| c.rule == rule)
            .unwrap()
            .detail
            .clone()
    };
    assert!(detail("taint").starts_with("podha.io/fenced (action DeletePods of p)"));
    assert!(!e.protected, "{:?}", e.checks);
    // The node runs no agent: the agent's proof cannot come, as under the taint.
    assert_eq!(failure(&e).0, "agent");
}

#[test]
fn a_paused_policy_or_node_protects_nothing_until_the_pause_ends() {
    let mut spec = mk_spec();
    spec.paused = true;
    let f = Fixture::new(view()).spec(spec);
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(
        detail.starts_with("p is paused (spec.paused, it governs n1)"),
        "{detail}"
    );

    let mut annotated = view();
    let n1 = mk_node("n1")
        .ready(true)
        .annotation(crate::api::PAUSE_ANNOTATION, "true");
    annotated.nodes.insert("n1".into(), n1.into());
    let f = Fixture::new(annotated);
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(
        detail.starts_with("n1 is paused for maintenance (podha.io/paused)"),
        "{detail}"
    );
}

#[test]
fn an_unreadable_policy_first_by_name_holds_the_rest_and_a_bare_metal_node_gets_no_cloud_proof() {
    let mut f = Fixture::new(view());
    f.unreadable
        .insert("a-broken".into(), "spec.detection.interval: invalid".into());
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(
        detail.starts_with("policy a-broken cannot be read"),
        "{detail}"
    );
    // After the readable ones by name, it holds nothing.
    let mut f = Fixture::new(view());
    f.unreadable.insert("z-broken".into(), "x".into());
    assert!(f.pod("db-0").protected);

    let mut spec = mk_spec();
    spec.fencing.proof = FencingProof::CloudShutdownTaint;
    let f = Fixture::new(view()).spec(spec);
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "proof");
    assert!(detail.contains("has no spec.providerID"), "{detail}");
}

#[test]
fn a_node_whose_policy_only_rehearses_is_not_protected() {
    let mut dry = mk_spec();
    dry.dry_run = true;
    let f = Fixture::new(view()).spec(dry);
    let e = explain_node(&f.cluster(), "n1").expect("node exists");
    assert!(!e.protected, "{:?}", e.checks);
    let failed = e.checks.iter().find(|c| c.failed()).expect("a rule fails");
    assert_eq!(
        (failed.rule, failed.reason),
        ("state", Some(crate::protection::Unprotected::DryRun))
    );
}

#[test]
fn a_pod_the_planner_did_not_judge_is_not_protected() {
    // The pod as read again: another object of the same name (a new UID) than the view holds.
    let f = Fixture::new(view());
    let again = stateful("db-0", "").uid("uid-recreated");
    let e = explain_pod(&f.cluster(), &again);
    assert!(!e.protected, "{:?}", e.checks);
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "eligibility");
    assert!(detail.contains("did not judge"), "{detail}");
}

#[test]
fn a_death_that_would_pass_max_unhealthy_is_not_protected() {
    let mut spec = mk_spec();
    spec.safety.max_unhealthy = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1);
    let mut f = Fixture::new(view()).spec(spec);
    let status = |failed| PodHAPolicyStatus {
        watched_nodes: 3,
        failed_nodes: failed,
        ..PodHAPolicyStatus::default()
    };
    f.statuses.insert("p".into(), status(0));
    assert!(f.pod("db-0").protected, "one death is within the limit");
    f.statuses.insert("p".into(), status(1));
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(
        detail.contains("would hold every action") && detail.contains("2 of its 3"),
        "{detail}"
    );
    // A node that is not Ready is the one the status counts already: not counted twice.
    let mut view = f.view.clone();
    view.nodes
        .insert("n1".into(), std::sync::Arc::new(mk_node("n1").ready(false)));
    f.view = view;
    assert!(f.pod("db-0").protected, "{:?}", f.pod("db-0").checks);
}

#[test]
fn a_policy_that_can_never_hear_some_of_its_nodes_would_wait_for_good() {
    use crate::api::{BmcFencing, Signal};
    // Judged on the agents' heartbeats alone, behind the BMC's confirmed proof: n2 runs no
    // agent, so after n1's death nothing shows n2 is not cut off with it.
    let mut spec = mk_spec();
    spec.detection.signals = vec![Signal::AgentHeartbeat];
    spec.fencing.proof = FencingProof::Bmc;
    spec.fencing.bmc = Some(BmcFencing {
        secret_name: Some("bmc-{node}".into()),
        secret_name_label: None,
        power_cycle: false,
        match_system_uuid: true,
    });
    let mut f = Fixture::new(view()).spec(spec);
    f.view.nodes.insert(
        "n1".into(),
        std::sync::Arc::new(mk_node("n1").ready(true).agent(Some("8s"))),
    );
    let e = f.pod("db-0");
    let (rule, detail) = failure(&e);
    assert_eq!(rule, "state");
    assert!(detail.contains("would wait for good"), "{detail}");
    // With an agent on n2 too, n2 shows life after the death: the round goes on.
    f.view.nodes.insert(
        "n2".into(),
        std::sync::Arc::new(mk_node("n2").ready(true).agent(Some("8s"))),
    );
    assert!(f.pod("db-0").protected, "{:?}", f.pod("db-0").checks);
}
