//! `podha explain` and `plan` agree, over generated clusters: explain calls a pod protected if
//! and only if, once its node is judged Failed and its proof is in (`fencing.proof: None`
//! here), the planner's rounds force-delete it; and a pod it calls unprotected is refused for
//! the same reason the planner gives (its skip, or the hold that stops it). Under a proof
//! podha asks for (`BMC`, `AgentAcknowledged`), explain says the proof cannot come for a pod
//! it refuses on that alone, and the planner never asks for that node's fence; for a pod it
//! protects, the planner asks.
//!
//! The failover is played the way the operator runs it: every policy's trackers judge the node
//! dead, the incident opens with the node's pods, and each round's marks and taint land
//! before the next round (the taint long enough ago that Kubernetes' own eviction had its
//! turn).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use proptest::prelude::*;
use tokio::time::Instant;

use super::{Cluster, Operator, Unprotected, explain_pod};
use crate::api::{
    Action, BmcFencing, FAILOVER_ANNOTATION, FencingProof, PAUSE_ANNOTATION, PodHAPolicySpec,
};
use crate::eligibility::node_selected;
use crate::health::NodeHealth;
use crate::incident::Ledger;
use crate::planner::{
    HealthBook, Heartbeats, HoldReason, Intent, PlanInput, PolicyRef, Seen, Skip,
    TAINT_EVICTION_WAIT, node_owner, plan,
};
use crate::test_builders::*;
use crate::view::View;

const DRIVERS: [&str; 2] = ["a.csi.example.com", "b.csi.example.com"];
const BMC_SECRET_LABEL: &str = "bmc.example.com/secret";

#[derive(Clone, Debug)]
struct NodeGen {
    ready: bool,
    paused: bool,
    zone: u8,
    /// Labelled with the name of its BMC's Secret.
    bmc_secret: bool,
    /// Its system UUID, one of three: two nodes may report the same.
    uuid: u8,
    /// Advertises an agent.
    agent: bool,
    /// How the operator judges it: 0 Suspect, 1 Failed, else Healthy (when it asks).
    judged: u8,
    /// Judged dead a minute ago, within `safety.unhealthyWindow`.
    failed_recently: bool,
}

/// The proof every policy asks for.
#[derive(Clone, Copy, Debug)]
enum ProofGen {
    None,
    Bmc { match_uuid: bool },
    AgentAcknowledged,
}

#[derive(Clone, Debug)]
struct PolicyGen {
    zone: Option<u8>,
    tier: Option<u8>,
    dry_run: bool,
    paused: bool,
    delete_pods: bool,
    driver_a_only: bool,
    require_target: bool,
}

#[derive(Clone, Debug)]
struct PodGen {
    node: usize,
    tier: u8,
    /// 0: a StatefulSet, 1: none, 2: a Deployment's ReplicaSet.
    owner: u8,
    /// 0: no claim, 1 and 2: a claim on `DRIVERS[claim - 1]`.
    claim: u8,
    opted_out: bool,
    tolerates_fence: bool,
    ready: bool,
    /// Being deleted already (a deletion timestamp).
    terminating: bool,
}

#[derive(Clone, Debug)]
struct ClusterGen {
    proof: ProofGen,
    nodes: Vec<NodeGen>,
    policies: Vec<PolicyGen>,
    pods: Vec<PodGen>,
    /// A policy that cannot be read: none, first by name, or between `p0` and `p1`.
    unreadable: Option<&'static str>,
    /// The operator asks, with its own judgement of the nodes; else a reader of the API.
    operator_asks: bool,
}

fn cluster_gen() -> impl Strategy<Value = ClusterGen> {
    let node = (
        (any::<bool>(), prop::bool::weighted(0.15), 0..2u8),
        prop::bool::weighted(0.7),
        0..3u8,
        prop::bool::weighted(0.7),
        0..10u8,
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |((ready, paused, zone), bmc_secret, uuid, agent, judged, failed_recently)| NodeGen {
                ready: ready || zone == 0,
                paused,
                zone,
                bmc_secret,
                uuid,
                agent,
                judged,
                failed_recently,
            },
        );
    let proof = prop_oneof![
        2 => Just(ProofGen::None),
        1 => any::<bool>().prop_map(|match_uuid| ProofGen::Bmc { match_uuid }),
        1 => Just(ProofGen::AgentAcknowledged),
    ];
    let policy = (
        prop::option::of(0..2u8),
        prop::option::of(0..2u8),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(zone, tier, dry_run, paused, delete_pods, driver_a_only, require_target)| PolicyGen {
                zone,
                tier,
                dry_run,
                paused,
                delete_pods,
                driver_a_only,
                require_target,
            },
        );
    let pod = (
        (0..4usize, 0..2u8),
        0..3u8,
        0..3u8,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.15),
        (any::<bool>(), prop::bool::weighted(0.1)),
    )
        .prop_map(
            |((node, tier), owner, claim, opted_out, tolerates_fence, (ready, terminating))| {
                PodGen {
                    node,
                    tier,
                    owner,
                    claim,
                    opted_out,
                    tolerates_fence,
                    ready,
                    terminating,
                }
            },
        );
    (
        (proof, any::<bool>()),
        prop::collection::vec(node, 2..=4),
        prop::collection::vec(policy, 1..=2),
        prop::collection::vec(pod, 1..=6),
        prop_oneof![
            8 => Just(None),
            1 => Just(Some("a-unreadable")),
            1 => Just(Some("p0-unreadable")),
        ],
    )
        .prop_map(
            |((proof, operator_asks), nodes, policies, pods, unreadable)| ClusterGen {
                proof,
                operator_asks,
                nodes,
                policies,
                pods,
                unreadable,
            },
        )
}

impl ClusterGen {
    fn view(&self) -> View {
        let mut view = View::default();
        for (i, n) in self.nodes.iter().enumerate() {
            let mut node = mk_node(&format!("n{i}"))
                .ready(n.ready)
                .label("zone", &format!("z{}", n.zone));
            if n.paused {
                node = node.annotation(PAUSE_ANNOTATION, "true");
            }
            if n.bmc_secret {
                node = node.label(BMC_SECRET_LABEL, &format!("bmc-n{i}"));
            }
            if n.agent {
                node = node.agent(None);
            }
            node = node.system_uuid(&format!("4c4c4544-0000-0000-0000-00000000000{}", n.uuid));
            view = view.with(node);
        }
        view = view.with(mk_rs("shop", "web").owned_by("apps/v1", "Deployment", "web"));
        for (i, p) in self.pods.iter().enumerate() {
            let name = format!("pod-{i}");
            let mut pod = mk_pod("shop", &name)
                .on(&format!("n{}", p.node % self.nodes.len()))
                .ready(p.ready)
                .label("tier", &format!("t{}", p.tier));
            pod = match p.owner {
                0 => pod.owned_by_sts(&name),
                2 => pod.owned_by_rs("web"),
                _ => pod,
            };
            if p.terminating {
                pod = pod.terminating();
            }
            if p.opted_out {
                pod = pod.annotation(FAILOVER_ANNOTATION, "false");
            }
            if p.tolerates_fence {
                pod = pod.toleration(mk_toleration(
                    "node.kubernetes.io/out-of-service",
                    "Exists",
                    "",
                    "NoExecute",
                ));
            }
            if p.claim > 0 {
                let claim = format!("data-{name}");
                pod = pod.claim(&claim);
                view = view
                    .with(mk_pvc("shop", &claim).bound_to(&format!("pv-{name}")))
                    .with(mk_csi_pv(
                        &format!("pv-{name}"),
                        DRIVERS[usize::from(p.claim - 1)],
                    ));
            }
            view = view.with(pod);
        }
        view
    }

    fn specs(&self) -> Vec<(String, PodHAPolicySpec)> {
        self.policies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut spec = mk_spec().require_target(p.require_target);
                if let Some(zone) = p.zone {
                    spec = spec.node_selector(matching("zone", &format!("z{zone}")));
                }
                if let Some(tier) = p.tier {
                    spec = spec.pod_selector(matching("tier", &format!("t{tier}")));
                }
                if p.driver_a_only {
                    spec = spec.drivers(&DRIVERS[..1]);
                }
                match self.proof {
                    ProofGen::None => {}
                    ProofGen::Bmc { match_uuid } => {
                        spec.fencing.proof = FencingProof::Bmc;
                        spec.fencing.bmc = Some(BmcFencing {
                            secret_name: None,
                            secret_name_label: Some(BMC_SECRET_LABEL.to_string()),
                            power_cycle: false,
                            match_system_uuid: match_uuid,
                        });
                    }
                    ProofGen::AgentAcknowledged => {
                        spec.fencing.proof = FencingProof::AgentAcknowledged;
                    }
                }
                spec.dry_run = p.dry_run;
                spec.paused = p.paused;
                if p.delete_pods {
                    spec.action = Action::DeletePods;
                }
                (format!("p{i}"), spec)
            })
            .collect()
    }

    /// How the operator judges each policy's nodes, and the failures it remembers; `None` when
    /// a reader of the API asks.
    fn seen(
        &self,
        policies: &[PolicyRef<'_>],
        view: &View,
        now: Instant,
    ) -> Option<(HealthBook, Vec<(String, Instant)>)> {
        let judged = |i: usize| match self.nodes[i].judged {
            0 => NodeHealth::Suspect {
                failures: 1,
                since: now,
            },
            1 => NodeHealth::Failed { since: now },
            _ => NodeHealth::Healthy,
        };
        let health = policies
            .iter()
            .map(|p| {
                let watched = (0..self.nodes.len())
                    .filter(|i| node_selected(p.spec, &view.nodes[&format!("n{i}")]))
                    .map(|i| (format!("n{i}"), judged(i)))
                    .collect();
                (p.name.to_string(), watched)
            })
            .collect();
        let failures = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].failed_recently)
            .map(|i| (format!("n{i}"), now - std::time::Duration::from_secs(60)))
            .collect();
        self.operator_asks.then_some((health, failures))
    }

    fn unreadable(&self) -> BTreeMap<String, String> {
        self.unreadable
            .map(|name| (name.to_string(), "no such field".to_string()))
            .into_iter()
            .collect()
    }
}

fn matching(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..LabelSelector::default()
    }
}

/// What the planner's rounds did about each pod of `dead` once every policy that watches it
/// judged it Failed.
#[derive(Default, Debug)]
struct Played {
    deleted: BTreeSet<String>,
    rehearsed: BTreeSet<String>,
    skipped: BTreeMap<String, Skip>,
    /// Whether a round asked for the node's fence (its BMC's `ForceOff`, its agent's fence).
    fence_asked: bool,
    /// The policy that governs the node.
    node_policy: Option<String>,
    /// Each hold with its policy: the node's own first, then the policies' (they hold every
    /// node).
    holds: Vec<(String, HoldReason)>,
}

fn play_failover(
    policies: &[PolicyRef<'_>],
    unreadable: &[String],
    view: &View,
    seen: Option<&(HealthBook, Vec<(String, Instant)>)>,
    dead: &str,
    now: Instant,
) -> Played {
    let mut played = Played::default();
    // Every policy that watches `dead` judges it Failed; the others as the operator does.
    let health: HealthBook = policies
        .iter()
        .map(|p| {
            let judged = seen.and_then(|(book, _)| book.get(p.name));
            let watched = view
                .nodes
                .iter()
                .filter(|(_, n)| node_selected(p.spec, n))
                .map(|(name, _)| {
                    let state = match judged.and_then(|nodes| nodes.get(name)) {
                        _ if name == dead => NodeHealth::Failed { since: now },
                        Some(state) => *state,
                        None => NodeHealth::Healthy,
                    };
                    (name.clone(), state)
                })
                .collect();
            (p.name.to_string(), watched)
        })
        .collect();
    let mut sorted = policies.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(b.name));
    let Some(node_policy) = node_owner(&sorted, &view.nodes[dead]) else {
        return played;
    };
    played.node_policy = Some(node_policy.name.to_string());
    let mut ledger = Ledger::default();
    for (node, at) in seen.map_or(&[][..], |(_, failures)| failures) {
        ledger.remember_failure(node, *at);
    }
    ledger.open(dead, node_policy.name, None, now, view);
    let heartbeats = Heartbeats::new();
    for _ in 0..4 {
        let round = plan(&PlanInput {
            policies,
            health: &health,
            view,
            ledger: &ledger,
            heartbeats: &heartbeats,
            unreadable,
            agent_quorum_since: None,
            now,
        });
        for skip in round.skips() {
            played.skipped.insert(skip.uid, skip.reason);
        }
        for intent in round.intents {
            match intent {
                Intent::MarkPodNotReady { uid, .. } => {
                    ledger.record_marked_not_ready(dead, &uid, Some("marked".into()));
                }
                Intent::TaintNode { taint, .. } => {
                    ledger.record_tainted(dead, taint, now - TAINT_EVICTION_WAIT);
                }
                Intent::ForceDeletePod { uid, .. } => {
                    ledger.record_deleted(dead, &uid);
                    played.deleted.insert(uid);
                }
                Intent::PowerOff { .. } | Intent::RequestFence { .. } => played.fence_asked = true,
                Intent::Hold {
                    reason: HoldReason::DryRun { would },
                    ..
                } => {
                    if let Intent::MarkPodNotReady { uid, .. }
                    | Intent::ForceDeletePod { uid, .. } = *would
                    {
                        played.rehearsed.insert(uid);
                    }
                }
                Intent::Hold {
                    policy,
                    reason,
                    node: Some(_),
                } => played.holds.insert(0, (policy, reason)),
                Intent::Hold { policy, reason, .. } => played.holds.push((policy, reason)),
                _ => {}
            }
        }
    }
    played
}

/// The reason the planner's rounds left `pod` where it is, in explain's words.
fn planner_reason(played: &Played, pod: &Pod, owner: Option<&str>) -> Option<Unprotected> {
    let uid = pod.metadata.uid.as_deref()?;
    if played.deleted.contains(uid) {
        return None;
    }
    let Some(owner) = owner else {
        return Some(Unprotected::NotSelected);
    };
    if played.rehearsed.contains(uid) {
        return Some(Unprotected::DryRun);
    }
    let hold_reason = |reason: &HoldReason| match reason {
        HoldReason::Paused { .. } => Some(Unprotected::Paused),
        HoldReason::TooManyUnhealthy { .. } => Some(Unprotected::TooManyUnhealthy),
        HoldReason::PolicyUnreadable { .. } => Some(Unprotected::PolicyUnreadable),
        _ => None,
    };
    match played.skipped.get(uid) {
        Some(Skip::Ineligible(reason)) => Some(Unprotected::Ineligible(*reason)),
        Some(Skip::Paused) => Some(Unprotected::Paused),
        // The node's policy's hold first, then the pod's own policy's.
        Some(Skip::Held) => [played.node_policy.as_deref(), Some(owner)]
            .into_iter()
            .flatten()
            .find_map(|held| {
                played
                    .holds
                    .iter()
                    .filter(|(policy, _)| policy == held)
                    .find_map(|(_, reason)| hold_reason(reason))
            }),
        Some(Skip::Replacement) => Some(Unprotected::NotOnNode),
        None => played
            .holds
            .iter()
            .find_map(|(_, reason)| hold_reason(reason)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn explain_calls_a_pod_protected_exactly_when_the_planner_moves_it(drawn in cluster_gen()) {
        let view = drawn.view();
        let specs = drawn.specs();
        let policies: Vec<PolicyRef<'_>> =
            specs.iter().map(|(name, spec)| PolicyRef { name, spec }).collect();
        let unreadable = drawn.unreadable();
        let unreadable_names: Vec<String> = unreadable.keys().cloned().collect();
        let statuses = BTreeMap::new();
        let now = Instant::now();
        let seen = drawn.seen(&policies, &view, now);
        let mut cluster = Cluster::new(
            policies.clone(),
            &unreadable,
            &statuses,
            &view,
            Operator::Leading,
            now,
        );
        if let Some((health, failures)) = &seen {
            cluster = cluster.seen(Seen { health, failures });
        }
        for dead in view.nodes.keys() {
            let played =
                play_failover(&policies, &unreadable_names, &view, seen.as_ref(), dead, now);
            for pod in view.pods_on(dead) {
                let explained = explain_pod(&cluster, pod);
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let said = explained.why_not().map(|(reason, _)| reason);
                let owner = explained.policy.as_deref();
                let shown = format!(
                    "{} on {dead}: explain {:?}, planner {played:?}",
                    explained.pod, explained.checks
                );
                if matches!(drawn.proof, ProofGen::None) {
                    prop_assert_eq!(explained.protected, played.deleted.contains(&uid), "{}", shown);
                    prop_assert_eq!(said, planner_reason(&played, pod, owner), "{}", shown);
                    continue;
                }
                // The proof is not in: nothing moves, and what explain says of it is what
                // the planner asks for.
                prop_assert!(!played.deleted.contains(&uid), "{}", shown);
                match said {
                    None => prop_assert!(played.fence_asked, "protected, not asked: {}", shown),
                    // A dry run is rehearsed once the proof is in: until then the planner
                    // holds on the proof, and moves nothing (above).
                    Some(Unprotected::DryRun) => {}
                    Some(Unprotected::NoBmc | Unprotected::NoProvingAgent) => {
                        prop_assert!(!played.fence_asked, "a proof that cannot come, asked: {}", shown);
                    }
                    said => prop_assert_eq!(said, planner_reason(&played, pod, owner), "{}", shown),
                }
            }
        }
    }
}
