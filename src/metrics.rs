//! Prometheus metrics for podha, in a registry owned by [`Metrics`] (no global registry), so
//! tests and several operator instances in one process never share counters.
//!
//! Every family of `DESIGN.md` §3 is here, plus two that time podha's own actions; label values
//! are bounded by their callers (policy names, `as_str()` of enums, action kinds). When a policy
//! is deleted, [`Metrics::forget_policy`] drops its series so cardinality follows the live
//! policies.

mod operating;

pub use operating::Operating;

use std::collections::HashMap;
use std::time::Duration;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

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

/// The kinds of action (`runtime::writer::intent_kind`): `kind` of `podha_intents_dropped_total`
/// and of the action histograms.
pub const ACTION_KINDS: [&str; 4] = [
    "mark_pod_not_ready",
    "delete_pod",
    "taint_node",
    "untaint_node",
];

/// The `operation` values of `podha_api_errors_total` besides [`ACTION_KINDS`].
pub const OTHER_API_OPERATIONS: [&str; 2] = ["create_event", "patch_status"];

/// A step of one failover, timed from the previous step (`Total` spans the whole failover).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Last healthy observation of the node until podha judged it failed.
    Detect,
    /// Node judged failed until its pods were deleted (or the node tainted).
    Act,
    /// Action until the volume attachment on the failed node was gone.
    Detach,
    /// Detach until the replacement pod ran with its volume attached on the new node.
    Recover,
    /// Last healthy observation until the replacement ran.
    Total,
    /// With a `fencing.proof`: node judged failed until the proof was there and the
    /// out-of-service taint went on (part of `act`).
    Fence,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Detect,
        Phase::Act,
        Phase::Detach,
        Phase::Recover,
        Phase::Total,
        Phase::Fence,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Detect => "detect",
            Phase::Act => "act",
            Phase::Detach => "detach",
            Phase::Recover => "recover",
            Phase::Total => "total",
            Phase::Fence => "fence",
        }
    }
}

/// What podha did with the out-of-service taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaintOperation {
    Add,
    Remove,
}

impl TaintOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintOperation::Add => "add",
            TaintOperation::Remove => "remove",
        }
    }
}

/// All of podha's metrics and the registry they are exported from.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    nodes: IntGaugeVec,
    node_failures: IntCounterVec,
    pods_deleted: IntCounterVec,
    pods_skipped: IntCounterVec,
    taints: IntCounterVec,
    actions_held: IntCounterVec,
    phase_duration: HistogramVec,
    detach_timeouts: IntCounterVec,
    leader: IntGauge,
    intents_dropped: IntCounterVec,
    api_errors: IntCounterVec,
    cache_synced: IntGauge,
    action_requests: HistogramVec,
    action_latency: HistogramVec,
    /// Failovers open now, watch restarts, build and process.
    pub operating: Operating,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();

        let nodes = IntGaugeVec::new(
            Opts::new(
                "podha_nodes",
                "Nodes watched by at least one policy, by health state as of the last probe round \
                 (healthy, suspect = failing probes below the threshold, failed).",
            ),
            &["state"],
        )?;
        let node_failures = IntCounterVec::new(
            Opts::new(
                "podha_node_failures_total",
                "Nodes that a policy judged failed (failureThreshold consecutive failed probes).",
            ),
            &[POLICY],
        )?;
        let pods_deleted = IntCounterVec::new(
            Opts::new(
                "podha_pods_deleted_total",
                "Pods force-deleted from a failed node so that their controller recreates them \
                 elsewhere, by the kind of their owning controller.",
            ),
            &[POLICY, "owner_kind"],
        )?;
        let pods_skipped = IntCounterVec::new(
            Opts::new(
                "podha_pods_skipped_total",
                "Pods on a failed node that podha deliberately left alone, by reason.",
            ),
            &[POLICY, "reason"],
        )?;
        let taints = IntCounterVec::new(
            Opts::new(
                "podha_taints_total",
                "Out-of-service taints podha added to failed nodes or removed from recovered ones.",
            ),
            &[POLICY, "operation"],
        )?;
        let actions_held = IntCounterVec::new(
            Opts::new(
                "podha_actions_held_total",
                "Failover actions withheld by a safety check (for example more failed nodes than \
                 safety.maxUnhealthy allows), by reason.",
            ),
            &[POLICY, "reason"],
        )?;
        let phase_duration = HistogramVec::new(
            HistogramOpts::new(
                "podha_failover_phase_duration_seconds",
                "Duration of each failover phase: detect (node silent until judged failed), act \
                 (until pods deleted or node tainted), detach (until the old volume attachment was \
                 gone), recover (until the replacement ran with its volume attached) and total; \
                 with a fencing proof also fence (judged failed until the proof was there).",
            )
            .buckets(PHASE_BUCKETS.to_vec()),
            &[POLICY, "phase"],
        )?;
        let detach_timeouts = IntCounterVec::new(
            Opts::new(
                "podha_detach_timeouts_total",
                "Failovers whose volumes were still attached to the failed node after the \
                 policy's detachTimeout.",
            ),
            &[POLICY],
        )?;
        let leader = IntGauge::new(
            "podha_leader",
            "1 if this replica holds the leader lease and performs writes, 0 otherwise.",
        )?;
        let intents_dropped = IntCounterVec::new(
            Opts::new(
                "podha_intents_dropped_total",
                "Actions computed while this replica was not the leader, and therefore not \
                 performed, by kind of action.",
            ),
            &["kind"],
        )?;
        let api_errors = IntCounterVec::new(
            Opts::new(
                "podha_api_errors_total",
                "Failed writes to the Kubernetes API, by operation; they are retried with backoff.",
            ),
            &["operation"],
        )?;
        let cache_synced = IntGauge::new(
            "podha_cache_synced",
            "1 once every watch cache has completed its initial list, 0 before.",
        )?;
        let action_requests = HistogramVec::new(
            HistogramOpts::new(
                "podha_action_request_duration_seconds",
                "Time an action spent in its API requests (first request to last response), by \
                 kind of action.",
            )
            .buckets(ACTION_BUCKETS.to_vec()),
            &["kind"],
        )?;
        let action_latency = HistogramVec::new(
            HistogramOpts::new(
                "podha_action_latency_seconds",
                "Time from the decision loop sending an action to it handling the result: the \
                 requests plus the waits in the writer's queue and the loop's, by kind of action.",
            )
            .buckets(ACTION_BUCKETS.to_vec()),
            &["kind"],
        )?;

        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(node_failures.clone()))?;
        registry.register(Box::new(pods_deleted.clone()))?;
        registry.register(Box::new(pods_skipped.clone()))?;
        registry.register(Box::new(taints.clone()))?;
        registry.register(Box::new(actions_held.clone()))?;
        registry.register(Box::new(phase_duration.clone()))?;
        registry.register(Box::new(detach_timeouts.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(intents_dropped.clone()))?;
        registry.register(Box::new(api_errors.clone()))?;
        registry.register(Box::new(cache_synced.clone()))?;
        registry.register(Box::new(action_requests.clone()))?;
        registry.register(Box::new(action_latency.clone()))?;
        let operating = Operating::register(&registry)?;

        let metrics = Self {
            registry,
            nodes,
            node_failures,
            pods_deleted,
            pods_skipped,
            taints,
            actions_held,
            phase_duration,
            detach_timeouts,
            leader,
            intents_dropped,
            api_errors,
            cache_synced,
            action_requests,
            action_latency,
            operating,
        };
        // Export all node states from the start, so dashboards see 0 rather than no data.
        metrics.set_nodes(0, 0, 0);
        // Counters start at 0 rather than appearing at their first increment, which `increase()`
        // would miss, and so that an alert on them has a series to evaluate.
        for operation in ACTION_KINDS.into_iter().chain(OTHER_API_OPERATIONS) {
            metrics.api_errors.with_label_values(&[operation]);
        }
        for kind in ACTION_KINDS {
            metrics.intents_dropped.with_label_values(&[kind]);
        }
        Ok(metrics)
    }

    /// The registry, for callers that want to add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn set_nodes(&self, healthy: usize, suspect: usize, failed: usize) {
        for (state, count) in [
            ("healthy", healthy),
            ("suspect", suspect),
            ("failed", failed),
        ] {
            self.nodes
                .with_label_values(&[state])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    pub fn inc_node_failures(&self, policy: &str) {
        self.node_failures.with_label_values(&[policy]).inc();
    }

    pub fn inc_pods_deleted(&self, policy: &str, owner_kind: &str) {
        self.pods_deleted
            .with_label_values(&[policy, owner_kind])
            .inc();
    }

    pub fn inc_pods_skipped(&self, policy: &str, reason: &str) {
        self.pods_skipped.with_label_values(&[policy, reason]).inc();
    }

    pub fn inc_taints(&self, policy: &str, operation: TaintOperation) {
        self.taints
            .with_label_values(&[policy, operation.as_str()])
            .inc();
    }

    pub fn inc_actions_held(&self, policy: &str, reason: &str) {
        self.actions_held.with_label_values(&[policy, reason]).inc();
    }

    pub fn observe_phase(&self, policy: &str, phase: Phase, duration: Duration) {
        self.phase_duration
            .with_label_values(&[policy, phase.as_str()])
            .observe(duration.as_secs_f64());
    }

    pub fn inc_detach_timeouts(&self, policy: &str) {
        self.detach_timeouts.with_label_values(&[policy]).inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn inc_intents_dropped(&self, kind: &str) {
        self.intents_dropped.with_label_values(&[kind]).inc();
    }

    pub fn inc_api_errors(&self, operation: &str) {
        self.api_errors.with_label_values(&[operation]).inc();
    }

    pub fn observe_action_requests(&self, kind: &str, duration: Duration) {
        self.action_requests
            .with_label_values(&[kind])
            .observe(duration.as_secs_f64());
    }

    pub fn observe_action_latency(&self, kind: &str, duration: Duration) {
        self.action_latency
            .with_label_values(&[kind])
            .observe(duration.as_secs_f64());
    }

    pub fn set_cache_synced(&self, synced: bool) {
        self.cache_synced.set(i64::from(synced));
    }

    /// Exports `policy`'s failure, hold and detach-timeout counters at 0 until they count.
    pub fn touch_policy(&self, policy: &str) {
        self.node_failures.with_label_values(&[policy]);
        self.detach_timeouts.with_label_values(&[policy]);
        for reason in crate::planner::HoldKind::ALL {
            self.actions_held
                .with_label_values(&[policy, reason.as_str()]);
        }
    }

    /// Drops every series labelled with `policy`, once the policy is deleted.
    pub fn forget_policy(&self, policy: &str) {
        remove_policy(&self.node_failures, policy);
        remove_policy(&self.pods_deleted, policy);
        remove_policy(&self.pods_skipped, policy);
        remove_policy(&self.taints, policy);
        remove_policy(&self.actions_held, policy);
        remove_policy(&self.phase_duration, policy);
        remove_policy(&self.detach_timeouts, policy);
    }

    /// All metrics in the Prometheus text exposition format ([`prometheus::TEXT_FORMAT`]).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

/// Removes the series of `vec` whose `policy` label equals `policy`, whatever its other labels:
/// the other values (reasons, owner kinds, phases) are only known from what was recorded.
fn remove_policy<T: MetricVecBuilder>(vec: &MetricVec<T>, policy: &str) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|pair| (pair.name(), pair.value()))
                .collect();
            if labels.get(POLICY) == Some(&policy) {
                // Not-found cannot happen for a series just collected, short of a concurrent
                // forget of the same policy; either way it is already gone.
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe_everything(m: &Metrics, policy: &str) {
        m.set_nodes(3, 1, 2);
        m.inc_node_failures(policy);
        m.inc_pods_deleted(policy, "StatefulSet");
        m.inc_pods_skipped(policy, "NoController");
        m.inc_taints(policy, TaintOperation::Add);
        m.inc_actions_held(policy, "MaxUnhealthyExceeded");
        m.observe_phase(policy, Phase::Detect, Duration::from_millis(1500));
        m.inc_detach_timeouts(policy);
        m.set_leader(true);
        m.inc_intents_dropped("ForceDeletePod");
        m.inc_api_errors("delete_pod");
        m.set_cache_synced(true);
        m.observe_action_requests("delete_pod", Duration::from_millis(20));
        m.observe_action_latency("delete_pod", Duration::from_millis(30));
        m.operating
            .set_failovers_open([policy], [(policy, crate::api::FailoverPhase::Detaching)]);
        m.operating.inc_watch_restarts("leases");
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
                "podha_pods_deleted_total",
                "counter",
                r#"podha_pods_deleted_total{owner_kind="StatefulSet",policy="db"} 1"#,
            ),
            (
                "podha_pods_skipped_total",
                "counter",
                r#"podha_pods_skipped_total{policy="db",reason="NoController"} 1"#,
            ),
            (
                "podha_taints_total",
                "counter",
                r#"podha_taints_total{operation="add",policy="db"} 1"#,
            ),
            (
                "podha_actions_held_total",
                "counter",
                r#"podha_actions_held_total{policy="db",reason="MaxUnhealthyExceeded"} 1"#,
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
                r#"podha_intents_dropped_total{kind="ForceDeletePod"} 1"#,
            ),
            (
                "podha_api_errors_total",
                "counter",
                r#"podha_api_errors_total{operation="delete_pod"} 1"#,
            ),
            ("podha_cache_synced", "gauge", "podha_cache_synced 1"),
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
                r#"podha_failovers_open{phase="Detaching",policy="db"} 1"#,
            ),
            (
                "podha_watch_restarts_total",
                "counter",
                r#"podha_watch_restarts_total{resource="leases"} 1"#,
            ),
            (
                "podha_build_info",
                "gauge",
                concat!(
                    r#"podha_build_info{version=""#,
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
        m.set_nodes(5, 2, 1);
        m.set_nodes(7, 0, 1);
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
        m.observe_phase("db", Phase::Total, Duration::from_secs(42));
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
            ["detect", "act", "detach", "recover", "total", "fence"]
        );
        assert_eq!(TaintOperation::Add.as_str(), "add");
        assert_eq!(TaintOperation::Remove.as_str(), "remove");
    }

    #[test]
    fn forget_policy_removes_only_that_policys_series() {
        let m = Metrics::new().unwrap();
        observe_everything(&m, "db");
        observe_everything(&m, "web");
        m.inc_pods_skipped("db", "OptedOut");
        for phase in Phase::ALL {
            m.observe_phase("db", phase, Duration::from_secs(1));
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
        m.inc_node_failures("db");
        let text = m.encode().unwrap();
        assert!(
            text.lines()
                .any(|l| l == r#"podha_node_failures_total{policy="db"} 1"#)
        );
    }
}
