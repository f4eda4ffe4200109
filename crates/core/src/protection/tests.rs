//! Coverage: each policy counts the pods with a volume it selects, by the first rule each
//! fails, with the rules' own labels. (Each rule in words: `crate::explain`'s tests.)

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tokio::time::Instant;

use super::*;
use crate::api::PodHAPolicySpec;
use crate::eligibility::SkipReason;
use crate::test_builders::*;

const DRIVER: &str = "rwo.sim.podha.io";

fn with_volume(view: View, pod: Pod, driver: &str) -> View {
    let name = pod.metadata.name.clone().unwrap_or_default();
    view.with(pod)
        .with(mk_pvc("shop", &format!("data-{name}")).bound_to(&format!("pv-{name}")))
        .with(mk_csi_pv(&format!("pv-{name}"), driver))
}

fn sts(name: &str, node: &str) -> Pod {
    mk_pod("shop", name)
        .on(node)
        .owned_by_sts(name)
        .claim(&format!("data-{name}"))
}

fn selecting(app: &str) -> PodHAPolicySpec {
    mk_spec().drivers(&[DRIVER]).pod_selector(LabelSelector {
        match_labels: Some([("app".to_string(), app.to_string())].into()),
        ..LabelSelector::default()
    })
}

/// podha, leading, over `view` with the policies `specs` (nothing unreadable, no statuses):
/// what `ask` finds.
fn leading<T>(
    specs: &[(&str, PodHAPolicySpec)],
    view: &View,
    ask: impl FnOnce(&Cluster<'_>) -> T,
) -> T {
    let (none, statuses) = (BTreeMap::new(), BTreeMap::new());
    let cluster = Cluster::new(
        specs
            .iter()
            .map(|(name, spec)| PolicyRef { name, spec })
            .collect(),
        &none,
        &statuses,
        view,
        Operator::Leading,
        Instant::now(),
    );
    ask(&cluster)
}

#[test]
fn each_policy_counts_its_pods_with_volumes_by_their_first_failing_rule() {
    let mut view = view_with([
        mk_node("n1").ready(true).into(),
        mk_node("n2").ready(true).into(),
    ]);
    for (name, app, driver, opted_out) in [
        ("db-a", "db", DRIVER, false),
        ("db-b", "db", DRIVER, false),
        ("db-c", "db", DRIVER, true),
        ("db-d", "db", "other.csi.example.com", false),
        ("db-e", "db", "other.csi.example.com", false),
        ("mq-a", "mq", DRIVER, false),
    ] {
        let mut pod = sts(name, "n1").label("app", app);
        if opted_out {
            pod = pod.annotation("podha.io/failover", "false");
        }
        view = with_volume(view, pod, driver);
    }
    // No claim: not counted anywhere. Unselected: counted nowhere.
    view = view
        .with(
            mk_pod("shop", "web")
                .on("n1")
                .owned_by_sts("web")
                .label("app", "db"),
        )
        .with(sts("other", "n1").label("app", "other"));
    let mut mq = selecting("mq");
    mq.dry_run = true;
    let specs = [("a-db", selecting("db")), ("b-mq", mq)];
    let by_policy = leading(&specs, &view, coverage);
    let db = &by_policy["a-db"];
    assert_eq!((db.protected, db.unprotected), (2, 3));
    assert_eq!(
        db.reasons,
        [
            (Unprotected::Ineligible(SkipReason::DriverNotSelected), 2),
            (Unprotected::Ineligible(SkipReason::OptedOut), 1),
        ],
        "most pods first"
    );
    assert_eq!(db.examples.len(), 3);
    let mq = &by_policy["b-mq"];
    assert_eq!((mq.protected, mq.unprotected), (0, 1));
    assert_eq!(mq.reasons, [(Unprotected::DryRun, 1)]);
    assert_eq!(Unprotected::DryRun.as_str(), "DryRun");
    assert_eq!(
        Unprotected::Ineligible(SkipReason::OptedOut).as_str(),
        "OptedOut",
        "an eligibility refusal keeps its skip reason's label"
    );
}

#[test]
fn a_failed_rule_carries_its_label_and_the_operator_itself_passes_the_podha_rule() {
    let view = with_volume(
        view_with([mk_node("n1").ready(true).into()]),
        sts("db-0", "n1"),
        DRIVER,
    );
    let pod = view.pods_on("n1")[0].clone();
    let e = leading(&[("p", mk_spec().drivers(&[DRIVER]))], &view, |cluster| {
        explain_pod(cluster, &pod)
    });
    assert_eq!(e.checks[0].outcome, Outcome::Pass, "{:?}", e.checks[0]);
    // The only node is its own: no target.
    let (reason, check) = e.why_not().expect("not protected");
    assert_eq!(reason, Unprotected::Ineligible(SkipReason::NoTargetNode));
    assert_eq!(check.rule, "target");
    assert!(
        e.checks.iter().all(|c| c.failed() == c.reason.is_some()),
        "{:?}",
        e.checks
    );
}

/// Why the first pod on `node` is not protected under the one policy `spec`, if it is not: the
/// reason, the rule and what the rule says.
fn why_not(
    view: &View,
    spec: &PodHAPolicySpec,
    node: &str,
) -> Option<(Unprotected, &'static str, String)> {
    let pod = view.pods_on(node)[0].clone();
    leading(&[("p", spec.clone())], view, |cluster| {
        explain_pod(cluster, &pod)
    })
    .why_not()
    .map(|(reason, check)| (reason, check.rule, check.detail.clone()))
}

#[test]
fn the_acknowledgement_proof_needs_an_agent_to_ask_not_one_whose_silence_counts() {
    use crate::api::FencingProof;
    let verdict = |with_agent: bool| {
        let mut n1 = mk_node("n1").ready(true);
        if with_agent {
            // An agent without a watchdog: its silence would prove nothing under `Agent`.
            n1 = n1.agent(None);
        }
        let view = with_volume(
            view_with([n1.into(), mk_node("n2").ready(true).into()]),
            sts("db-0", "n1"),
            DRIVER,
        );
        let mut spec = mk_spec().drivers(&[DRIVER]);
        spec.fencing.proof = FencingProof::AgentAcknowledged;
        why_not(&view, &spec, "n1").map(|(reason, rule, _)| (reason, rule))
    };
    assert_eq!(
        verdict(false),
        Some((Unprotected::NoProvingAgent, "proof")),
        "nobody to ask for the fence"
    );
    assert_eq!(
        verdict(true),
        None,
        "its agent is asked, and may acknowledge"
    );
}

#[test]
fn a_system_uuid_two_nodes_report_leaves_their_pods_unprotected_under_the_bmc_proof() {
    use crate::api::{BmcFencing, FencingProof};
    let node = |name: &str, uuid: &str| mk_node(name).ready(true).system_uuid(uuid);
    let verdict = |n2_uuid: &str| {
        let view = with_volume(
            view_with([
                node("n1", "4c4c4544-0035-5910-8052-b4c04f4b4e32").into(),
                node("n2", n2_uuid).into(),
            ]),
            sts("db-0", "n1"),
            DRIVER,
        );
        let mut spec = mk_spec().drivers(&[DRIVER]);
        spec.fencing.proof = FencingProof::Bmc;
        spec.fencing.bmc = Some(BmcFencing {
            secret_name: Some("bmc-{node}".into()),
            secret_name_label: None,
            power_cycle: false,
            match_system_uuid: true,
        });
        why_not(&view, &spec, "n1")
    };
    assert_eq!(verdict("4c4c4544-0035-5910-8052-b4c04f4b4e33"), None);
    let (reason, rule, detail) =
        verdict("4C4C4544-0035-5910-8052-B4C04F4B4E32").expect("unprotected");
    assert_eq!((reason, rule), (Unprotected::NoBmc, "proof"));
    assert!(detail.contains("reported by n2 too"), "{detail}");
}

#[test]
fn under_any_of_a_proof_that_cannot_come_leaves_the_others_and_all_of_needs_each() {
    use crate::api::{BmcFencing, FencingProof};
    // n1 runs no agent and has no cloud provider; its BMC is found by a Secret template.
    let view = with_volume(
        view_with([
            mk_node("n1")
                .ready(true)
                .system_uuid("4c4c4544-0035-5910-8052-b4c04f4b4e32")
                .into(),
            mk_node("n2").ready(true).into(),
        ]),
        sts("db-0", "n1"),
        DRIVER,
    );
    let verdict = |all: bool, proofs: &[FencingProof]| {
        let mut spec = mk_spec().drivers(&[DRIVER]);
        if all {
            spec.fencing.proof = FencingProof::AllOf;
            spec.fencing.all_of = Some(proofs.to_vec());
        } else {
            spec.fencing.proof = FencingProof::AnyOf;
            spec.fencing.any_of = Some(proofs.to_vec());
        }
        spec.fencing.bmc = Some(BmcFencing {
            secret_name: Some("bmc-{node}".into()),
            secret_name_label: None,
            power_cycle: false,
            match_system_uuid: true,
        });
        why_not(&view, &spec, "n1").map(|(reason, rule, _)| (reason, rule))
    };
    let (ack, bmc, cloud) = (
        FencingProof::AgentAcknowledged,
        FencingProof::Bmc,
        FencingProof::CloudShutdownTaint,
    );
    assert_eq!(verdict(false, &[ack, bmc]), None, "the BMC can prove it");
    assert_eq!(
        verdict(false, &[ack, cloud]),
        Some((Unprotected::NoProvingAgent, "proof")),
        "neither can come"
    );
    assert_eq!(
        verdict(true, &[ack, bmc]),
        Some((Unprotected::NoProvingAgent, "proof")),
        "the agent's acknowledgement is needed too"
    );
}

/// An agent that says it cannot reach half of its peers proves no fence of its node (podha
/// holds it): explain says so, with the figures and what brings the proof back; the other
/// agents still count among those podha hears.
#[test]
fn an_agent_that_cannot_reach_its_peers_proves_no_fence() {
    use crate::api::FencingProof;
    let verdict = |cut_off: bool| {
        let nodes = ["n1", "n2", "n3"].map(|n| mk_node(n).ready(true).agent(Some("8s")));
        let mut view = with_volume(view_with(nodes.map(Into::into)), sts("db-0", "n1"), DRIVER);
        for node in ["n1", "n2", "n3"] {
            let mut advert = agent_advert(Instant::now());
            if cut_off && node == "n1" {
                advert.peers_unreachable = Some("1/2".into());
            }
            view.agent_adverts.insert(node.into(), advert);
        }
        let mut spec = mk_spec().drivers(&[DRIVER]);
        spec.fencing.proof = FencingProof::Agent;
        why_not(&view, &spec, "n1")
    };
    assert_eq!(verdict(false), None, "its silence proves the fence");
    let (reason, rule, detail) = verdict(true).expect("unprotected");
    assert_eq!((reason, rule), (Unprotected::NoProvingAgent, "agent"));
    assert!(
        detail.contains("cannot reach half of its peers") && detail.contains("1/2"),
        "{detail}"
    );
}

/// A dry run hides no reason: a pod that would move but for the dry run counts under
/// `DryRun`; one a missing agent would keep all the same counts under that reason, the dry run
/// beside it.
#[test]
fn a_dry_run_shows_what_would_still_keep_a_pod() {
    let mut view = view_with([
        mk_node("n1").ready(true).into(),
        mk_node("n2").ready(true).agent(Some("8s")).into(),
        mk_node("n3").ready(true).agent(Some("8s")).into(),
        mk_node("n4").ready(true).agent(Some("8s")).into(),
    ]);
    for node in ["n2", "n3", "n4"] {
        view.agent_adverts
            .insert(node.into(), agent_advert(Instant::now()));
    }
    let view = with_volume(view, sts("db-a", "n1").label("app", "db"), DRIVER);
    let view = with_volume(view, sts("db-b", "n2").label("app", "db"), DRIVER);
    let view = with_volume(
        view,
        sts("db-c", "n2").label("app", "db"),
        "other.csi.example.com",
    );
    let mut db = selecting("db");
    db.dry_run = true;
    db.fencing.proof = crate::api::FencingProof::Agent;
    let db_a = view.pods_on("n1")[0].clone();
    let (by_policy, db_a) = leading(&[("db", db)], &view, |cluster| {
        (coverage(cluster), explain_pod(cluster, &db_a))
    });
    let coverage = &by_policy["db"];
    assert_eq!(
        coverage.reasons,
        [
            (Unprotected::Ineligible(SkipReason::DriverNotSelected), 1),
            (Unprotected::DryRun, 1),
            (Unprotected::NoProvingAgent, 1),
        ],
        "{coverage:?}"
    );
    assert_eq!(
        coverage.rehearsed, 2,
        "db-a and db-b; db-c's driver keeps it first"
    );
    let (_, why) = coverage
        .examples
        .iter()
        .find(|(p, _)| p == "shop/db-a")
        .unwrap();
    assert!(why.ends_with("(and dryRun is on)"), "{why}");
    assert!(db_a.rehearsed());
    assert_eq!(
        db_a.first_failure().and_then(|c| c.reason),
        Some(Unprotected::NoProvingAgent)
    );
}

/// A pod whose policy asks for the taint, on a node whose policy chose `DeletePods`, moves
/// only after the 6-minute wait: counted slow. One whose own policy chose `DeletePods` too is
/// not (the 6 minutes are its choice).
#[test]
fn a_node_policy_of_delete_pods_puts_a_taint_policys_pod_on_the_slow_path() {
    use crate::api::Action;
    let view = view_with([
        mk_node("n1").ready(true).into(),
        mk_node("n2").ready(true).into(),
    ]);
    let view = with_volume(view, sts("db-a", "n1").label("app", "db"), DRIVER);
    let view = with_volume(view, sts("mq-a", "n1").label("app", "mq"), DRIVER);
    let mut deleting = selecting("mq");
    deleting.action = Action::DeletePods;
    let tainting = selecting("db");
    let by_policy = leading(&[("a-mq", deleting), ("b-db", tainting)], &view, coverage);
    assert_eq!(
        (by_policy["b-db"].protected, by_policy["b-db"].slow),
        (1, 1),
        "{by_policy:?}"
    );
    assert_eq!(
        (by_policy["a-mq"].protected, by_policy["a-mq"].slow),
        (1, 0),
        "{by_policy:?}"
    );
}
