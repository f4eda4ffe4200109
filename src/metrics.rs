//! podha's Prometheus metrics. Each family belongs to the part of podha that updates it, and
//! that part's group registers it: [`Detection`] (node health as probed), [`Actions`] (what the
//! decision loop did to pods and nodes, or withheld), [`Protection`] (the pods podha would fail
//! over now, and why not the others), [`Writes`] (the writer's requests to the
//! API server), [`Failovers`] (phase timings, detach timeouts, failovers open now) and
//! [`Operating`] (leadership, caches, watches, build, process). All of them live in one registry
//! owned by [`Metrics`], not a global one, so tests and several operator instances in one
//! process never share counters.
//!
//! Label values are policy names, owner kinds, or the `as_str()` of an enum whose `ALL` lists
//! the series exported at 0 before they count. When a policy is deleted,
//! [`Metrics::forget_policy`] drops its series so cardinality follows the live policies.

mod actions;
mod detection;
mod failovers;
mod operating;
mod protection;
mod writes;

pub use actions::{ActionKind, Actions, TaintOperation};
pub use detection::{Detection, NodeState};
pub use failovers::{Failovers, OpenState};
pub use operating::Operating;
pub use protection::Protection;
pub use writes::{ApiOperation, Writes};

use std::collections::HashMap;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{Registry, TextEncoder};

/// Upper bounds of the failover phase histogram, in seconds. Detection takes seconds, a stock
/// attach/detach controller waits 6 minutes before force-detaching, so the range spans both.
pub const PHASE_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0,
    300.0, 420.0, 600.0,
];

/// Upper bounds of the action timing histograms, in seconds: one API request on a quiet API
/// server takes milliseconds, on a saturated one seconds.
pub const ACTION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

const POLICY: &str = "policy";

pub use crate::incident::Phase;

/// All of podha's metrics, by the part of podha that updates them, and the registry they are
/// exported from.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    pub detection: Detection,
    pub actions: Actions,
    pub writes: Writes,
    pub failovers: Failovers,
    pub operating: Operating,
    pub protection: Protection,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        Ok(Self {
            detection: Detection::register(&registry)?,
            actions: Actions::register(&registry)?,
            writes: Writes::register(&registry)?,
            failovers: Failovers::register(&registry)?,
            operating: Operating::register(&registry)?,
            protection: Protection::register(&registry)?,
            registry,
        })
    }

    /// The registry, for callers that want to add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Exports `policy`'s failure, hold and detach-timeout counters at 0 until they count.
    pub fn touch_policy(&self, policy: &str) {
        self.detection.touch_policy(policy);
        self.actions.touch_policy(policy);
        self.failovers.touch_policy(policy);
    }

    /// Drops every series labelled with `policy`, once the policy is deleted.
    pub fn forget_policy(&self, policy: &str) {
        self.detection.forget_policy(policy);
        self.actions.forget_policy(policy);
        self.failovers.forget_policy(policy);
        self.protection.forget_policy(policy);
    }

    /// All metrics in the Prometheus text exposition format ([`prometheus::TEXT_FORMAT`]).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

/// Registers `collector` in `registry` and hands it back, for the group that updates it.
pub(crate) fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

/// Removes the series of `vec` whose `policy` label equals `policy`, whatever its other labels:
/// the other values (reasons, owner kinds, phases) are only known from what was recorded.
fn remove_policy<T: MetricVecBuilder>(vec: &MetricVec<T>, policy: &str) {
    remove_series(vec, |labels| labels.get(POLICY) == Some(&policy));
}

/// Removes every series of `vec` whose labels `stale` picks.
fn remove_series<T: MetricVecBuilder>(
    vec: &MetricVec<T>,
    stale: impl Fn(&HashMap<&str, &str>) -> bool,
) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|pair| (pair.name(), pair.value()))
                .collect();
            if stale(&labels) {
                // Not-found cannot happen for a series just collected, short of a concurrent
                // removal of the same series; either way it is already gone.
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::eligibility::SkipReason;
    use crate::planner::{HoldKind, Skip};
    use crate::runtime::Watch;

    fn observe_everything(m: &Metrics, policy: &str) {
        m.detection.set_nodes(3, 1, 2);
        m.detection.inc_node_failures(policy);
        m.detection.inc_agent_answers_unverified(2);
        m.detection.inc_agent_answers_mismatched(3);
        m.protection.set_pods(&std::collections::BTreeMap::from([(
            policy.to_string(),
            crate::protection::Coverage {
                protected: 1,
                unprotected: 2,
                reasons: vec![(
                    crate::protection::Unprotected::Ineligible(SkipReason::OptedOut),
                    2,
                )],
                ..Default::default()
            },
        )]));
        m.protection.observe_work(Duration::from_millis(20));
        m.actions.inc_pods_deleted(policy, "StatefulSet");
        m.actions
            .inc_pods_skipped(policy, Skip::Ineligible(SkipReason::NoControllerOwner));
        m.actions.inc_taints(policy, TaintOperation::Add);
        m.actions
            .inc_actions_held(policy, HoldKind::TooManyUnhealthy);
        m.failovers
            .observe_phase(policy, Phase::Detect, Duration::from_millis(1500));
        m.failovers.inc_detach_timeouts(policy);
        m.operating.set_leader(true);
        m.actions.inc_intents_dropped(ActionKind::DeletePod);
        m.writes
            .inc_api_errors(ApiOperation::Action(ActionKind::DeletePod));
        m.operating.set_cache_synced(true);
        m.writes
            .observe_action_requests(ActionKind::DeletePod, Duration::from_millis(20));
        m.actions
            .observe_action_latency(ActionKind::DeletePod, Duration::from_millis(30));
        m.failovers
            .set_failovers_open([policy], [(policy, crate::api::FailoverPhase::Detaching)]);
        m.operating.inc_watch_restarts(Watch::Lease);
        m.operating.set_agents_unreachable(1);
        m.operating.set_agents_peers_unreachable(2);
    }

    fn lines_of<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn every_family_is_exported_with_its_type_and_labels() {
        let m = Metrics::new().unwrap();
        observe_everything(&m, "db");
        let text = m.encode().unwrap();

        let cases = [
            ("podha_nodes", "gauge", r#"podha_nodes{state="suspect"} 1"#),
            (
                "podha_node_failures_total",
                "counter",
                r#"podha_node_failures_total{policy="db"} 1"#,
            ),
            (
                "podha_agent_answers_unverified_total",
                "counter",
                "podha_agent_answers_unverified_total 2",
            ),
            (
                "podha_agent_answers_mismatched_total",
                "counter",
                "podha_agent_answers_mismatched_total 3",
            ),
            (
                "podha_pods_deleted_total",
                "counter",
                r#"podha_pods_deleted_total{owner_kind="StatefulSet",policy="db"} 1"#,
            ),
            (
                "podha_pods_skipped_total",
                "counter",
                r#"podha_pods_skipped_total{policy="db",reason="NoControllerOwner"} 1"#,
            ),
            (
                "podha_taints_total",
                "counter",
                r#"podha_taints_total{operation="add",policy="db"} 1"#,
            ),
            (
                "podha_actions_held_total",
                "counter",
                r#"podha_actions_held_total{policy="db",reason="TooManyUnhealthyNodes"} 1"#,
            ),
            (
                "podha_failover_phase_duration_seconds",
                "histogram",
                r#"podha_failover_phase_duration_seconds_count{phase="detect",policy="db"} 1"#,
            ),
            (
                "podha_detach_timeouts_total",
                "counter",
                r#"podha_detach_timeouts_total{policy="db"} 1"#,
            ),
            ("podha_leader", "gauge", "podha_leader 1"),
            (
                "podha_intents_dropped_total",
                "counter",
                r#"podha_intents_dropped_total{kind="delete_pod"} 1"#,
            ),
            (
                "podha_api_errors_total",
                "counter",
                r#"podha_api_errors_total{operation="delete_pod"} 1"#,
            ),
            ("podha_cache_synced", "gauge", "podha_cache_synced 1"),
            (
                "podha_pods",
                "gauge",
                r#"podha_pods{policy="db",protected="false",reason="OptedOut"} 2"#,
            ),
            (
                "podha_coverage_duration_seconds",
                "histogram",
                r#"podha_coverage_duration_seconds_bucket{le="0.025"} 1"#,
            ),
            (
                "podha_action_request_duration_seconds",
                "histogram",
                r#"podha_action_request_duration_seconds_bucket{kind="delete_pod",le="0.025"} 1"#,
            ),
            (
                "podha_action_latency_seconds",
                "histogram",
                r#"podha_action_latency_seconds_bucket{kind="delete_pod",le="0.05"} 1"#,
            ),
            (
                "podha_failovers_open",
                "gauge",
                r#"podha_failovers_open{policy="db",state="Detaching"} 1"#,
            ),
            (
                "podha_watch_restarts_total",
                "counter",
                r#"podha_watch_restarts_total{resource="leases"} 1"#,
            ),
            (
                "podha_agents_unreachable",
                "gauge",
                "podha_agents_unreachable 1",
            ),
            (
                "podha_agents_peers_unreachable",
                "gauge",
                "podha_agents_peers_unreachable 2",
            ),
            (
                "podha_build_info",
                "gauge",
                concat!(
                    r#"podha_build_info{build_date=""#,
                    env!("PODHA_BUILD_DATE"),
                    r#"",commit=""#,
                    env!("PODHA_GIT_COMMIT"),
                    r#"",version=""#,
                    env!("CARGO_PKG_VERSION"),
                    r#""} 1"#
                ),
            ),
        ];
        for (name, kind, sample) in cases {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} should be a {kind}:\n{text}"
            );
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no help:\n{text}"
            );
            assert!(
                text.lines().any(|l| l == sample),
                "missing `{sample}`:\n{text}"
            );
        }
        // podha's own families; the process collector adds `process_*` ones.
        let families = lines_of(&text, "# TYPE podha_").len();
        assert_eq!(families, cases.len(), "unexpected families:\n{text}");
    }

    #[test]
    fn node_states_are_exported_before_the_first_round() {
        let text = Metrics::new().unwrap().encode().unwrap();
        for state in ["healthy", "suspect", "failed"] {
            let sample = format!(r#"podha_nodes{{state="{state}"}} 0"#);
            assert!(text.lines().any(|l| l == sample), "missing {sample}");
        }
        assert!(text.lines().any(|l| l == "podha_leader 0"));
        assert!(text.lines().any(|l| l == "podha_cache_synced 0"));
    }

    #[test]
    fn set_nodes_overwrites_the_previous_round() {
        let m = Metrics::new().unwrap();
        m.detection.set_nodes(5, 2, 1);
        m.detection.set_nodes(7, 0, 1);
        let text = m.encode().unwrap();
        for sample in [
            r#"podha_nodes{state="healthy"} 7"#,
            r#"podha_nodes{state="suspect"} 0"#,
            r#"podha_nodes{state="failed"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == sample), "missing {sample}");
        }
    }

    #[test]
    fn histogram_has_the_documented_buckets() {
        let m = Metrics::new().unwrap();
        m.failovers
            .observe_phase("db", Phase::Total, Duration::from_secs(42));
        let text = m.encode().unwrap();
        let bounds: Vec<&str> = lines_of(&text, "podha_failover_phase_duration_seconds_bucket{")
            .iter()
            .filter_map(|l| l.split("le=\"").nth(1))
            .filter_map(|rest| rest.split('"').next())
            .collect();
        let expected = [
            "0.5", "1", "2", "3", "5", "7.5", "10", "15", "20", "30", "45", "60", "90", "120",
            "180", "240", "300", "420", "600", "+Inf",
        ];
        assert_eq!(bounds, expected);
        assert!(text.lines().any(|l| l
            == r#"podha_failover_phase_duration_seconds_bucket{phase="total",policy="db",le="30"} 0"#));
        assert!(text.lines().any(|l| l
            == r#"podha_failover_phase_duration_seconds_bucket{phase="total",policy="db",le="45"} 1"#));
        assert!(
            text.lines().any(|l| l
                == r#"podha_failover_phase_duration_seconds_sum{phase="total",policy="db"} 42"#)
        );
    }

    #[test]
    fn phases_have_their_documented_names() {
        let names: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "detect",
                "act",
                "detach",
                "recover",
                "total",
                "fence",
                "power_off"
            ]
        );
        assert_eq!(TaintOperation::Add.as_str(), "add");
        assert_eq!(TaintOperation::Remove.as_str(), "remove");
    }

    #[test]
    fn forget_policy_removes_only_that_policys_series() {
        let m = Metrics::new().unwrap();
        observe_everything(&m, "db");
        observe_everything(&m, "web");
        m.actions
            .inc_pods_skipped("db", Skip::Ineligible(SkipReason::OptedOut));
        for phase in Phase::ALL {
            m.failovers
                .observe_phase("db", phase, Duration::from_secs(1));
        }

        m.forget_policy("db");
        // Forgetting twice, or a policy never seen, is harmless.
        m.forget_policy("db");
        m.forget_policy("never-seen");

        let text = m.encode().unwrap();
        assert!(
            !text.contains(r#"policy="db""#),
            "series of the deleted policy remain:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l == r#"podha_node_failures_total{policy="web"} 1"#)
        );
        assert!(
            text.lines().any(
                |l| l == r#"podha_pods_deleted_total{owner_kind="StatefulSet",policy="web"} 1"#
            )
        );
        assert!(text.lines().any(|l| l
            == r#"podha_failover_phase_duration_seconds_count{phase="detect",policy="web"} 1"#));
        // Families without a policy label are untouched.
        assert!(
            text.lines()
                .any(|l| l == r#"podha_api_errors_total{operation="delete_pod"} 2"#)
        );

        // A policy recreated with the same name starts from zero.
        m.detection.inc_node_failures("db");
        let text = m.encode().unwrap();
        assert!(
            text.lines()
                .any(|l| l == r#"podha_node_failures_total{policy="db"} 1"#)
        );
    }

    /// Every value of a label's enum is exported at 0 before it counts: those without a policy
    /// once registered, a policy's once it is touched (every tick, for each live policy).
    #[test]
    fn every_enum_value_is_exported_before_it_counts() {
        let m = Metrics::new().unwrap();
        let text = m.encode().unwrap();
        let mut expected: Vec<String> = Vec::new();
        for state in NodeState::ALL {
            expected.push(format!(r#"podha_nodes{{state="{}"}} 0"#, state.as_str()));
        }
        for kind in ActionKind::ALL {
            expected.push(format!(
                r#"podha_intents_dropped_total{{kind="{}"}} 0"#,
                kind.as_str()
            ));
        }
        for operation in ApiOperation::all() {
            expected.push(format!(
                r#"podha_api_errors_total{{operation="{}"}} 0"#,
                operation.as_str()
            ));
        }
        for watch in Watch::ALL {
            expected.push(format!(
                r#"podha_watch_restarts_total{{resource="{}"}} 0"#,
                watch.as_str()
            ));
        }
        for sample in &expected {
            assert!(
                text.lines().any(|l| l == sample),
                "missing {sample}:\n{text}"
            );
        }
        assert!(
            text.lines()
                .any(|l| l == r#"podha_intents_dropped_total{kind="request_fence"} 0"#)
        );

        m.touch_policy("db");
        m.failovers.set_failovers_open(["db"], []);
        let text = m.encode().unwrap();
        let mut expected = vec![
            r#"podha_node_failures_total{policy="db"} 0"#.to_string(),
            r#"podha_detach_timeouts_total{policy="db"} 0"#.to_string(),
        ];
        for reason in HoldKind::ALL {
            expected.push(format!(
                r#"podha_actions_held_total{{policy="db",reason="{}"}} 0"#,
                reason.as_str()
            ));
        }
        for state in OpenState::ALL {
            expected.push(format!(
                r#"podha_failovers_open{{policy="db",state="{}"}} 0"#,
                state.as_str()
            ));
        }
        for sample in &expected {
            assert!(
                text.lines().any(|l| l == sample),
                "missing {sample}:\n{text}"
            );
        }
    }
}
