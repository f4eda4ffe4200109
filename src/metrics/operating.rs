//! Metrics for operating podha itself rather than for failovers: which failovers are open now
//! (a gauge, so an alert keeps firing while a detach is stuck, where a counter's window would
//! let it fall silent), how often a watch broke and listed everything again (podha is blind
//! meanwhile), the build, and the process (CPU, memory, file descriptors).

use std::collections::BTreeMap;

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::api::FailoverPhase;

/// Failover phases that are still open, i.e. reported by `podha_failovers_open`; every one is
/// exported (0 when empty) for each live policy.
pub const OPEN_PHASES: [FailoverPhase; 5] = [
    FailoverPhase::Acting,
    FailoverPhase::Held,
    FailoverPhase::Detaching,
    FailoverPhase::DetachTimedOut,
    FailoverPhase::Recovering,
];

#[derive(Clone, Debug)]
pub struct Operating {
    failovers_open: IntGaugeVec,
    watch_restarts: IntCounterVec,
}

impl Operating {
    /// Creates the families and registers them, with `podha_build_info` and, on Linux, the
    /// process collector, in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let failovers_open = IntGaugeVec::new(
            Opts::new(
                "podha_failovers_open",
                "Failovers in progress on the leader, by policy and phase (Acting, Held, \
                 Detaching, DetachTimedOut, Recovering); a finished failover leaves the gauge.",
            ),
            &["policy", "phase"],
        )?;
        let watch_restarts = IntCounterVec::new(
            Opts::new(
                "podha_watch_restarts_total",
                "Watches that failed and were started again with a full list, by resource; \
                 while a node or lease watch re-lists, podha does not judge nodes.",
            ),
            &["resource"],
        )?;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "podha_build_info",
                "Always 1; the labels say which podha build runs.",
            ),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        registry.register(Box::new(failovers_open.clone()))?;
        registry.register(Box::new(watch_restarts.clone()))?;
        registry.register(Box::new(build_info))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            failovers_open,
            watch_restarts,
        })
    }

    /// Replaces the open-failover gauge with `open` (policy, phase) pairs; every policy in
    /// `policies` gets all [`OPEN_PHASES`], 0 when none is open, and no other policy is kept.
    pub fn set_failovers_open<'a>(
        &self,
        policies: impl IntoIterator<Item = &'a str>,
        open: impl IntoIterator<Item = (&'a str, FailoverPhase)>,
    ) {
        let mut counts: BTreeMap<(&str, &'static str), i64> = BTreeMap::new();
        for policy in policies {
            for phase in OPEN_PHASES {
                counts.insert((policy, phase_label(phase)), 0);
            }
        }
        // A recovered failover (or one whose node returned) stays on the leader's books until
        // the node is healthy again, but it is finished: not counted.
        for (policy, phase) in open.into_iter().filter(|(_, p)| OPEN_PHASES.contains(p)) {
            *counts.entry((policy, phase_label(phase))).or_default() += 1;
        }
        self.failovers_open.reset();
        for ((policy, phase), n) in counts {
            self.failovers_open
                .with_label_values(&[policy, phase])
                .set(n);
        }
    }

    /// Exports the restart counter of each of `resources` at 0 until it counts.
    pub fn touch_watches<'a>(&self, resources: impl IntoIterator<Item = &'a str>) {
        for resource in resources {
            self.watch_restarts.with_label_values(&[resource]);
        }
    }

    pub fn inc_watch_restarts(&self, resource: &str) {
        self.watch_restarts.with_label_values(&[resource]).inc();
    }
}

/// The label value of a phase: its name as it appears in a policy's status.
pub fn phase_label(phase: FailoverPhase) -> &'static str {
    match phase {
        FailoverPhase::Acting => "Acting",
        FailoverPhase::Held => "Held",
        FailoverPhase::Detaching => "Detaching",
        FailoverPhase::Recovering => "Recovering",
        FailoverPhase::Recovered => "Recovered",
        FailoverPhase::DetachTimedOut => "DetachTimedOut",
        FailoverPhase::NodeReturned => "NodeReturned",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_lines(registry: &Registry) -> Vec<String> {
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        text.lines()
            .filter(|l| l.starts_with("podha_failovers_open{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn open_failovers_are_counted_by_phase_and_finished_ones_leave() {
        let registry = Registry::new();
        let m = Operating::register(&registry).expect("register");
        m.set_failovers_open(
            ["db", "web"],
            [
                ("db", FailoverPhase::DetachTimedOut),
                ("db", FailoverPhase::DetachTimedOut),
                ("db", FailoverPhase::Recovering),
                ("db", FailoverPhase::Recovered),
                ("web", FailoverPhase::NodeReturned),
            ],
        );
        let lines = open_lines(&registry);
        assert_eq!(
            lines.len(),
            10,
            "finished failovers are not counted: {lines:?}"
        );
        assert!(lines.contains(
            &r#"podha_failovers_open{phase="DetachTimedOut",policy="db"} 2"#.to_string()
        ));
        assert!(
            lines
                .contains(&r#"podha_failovers_open{phase="Recovering",policy="db"} 1"#.to_string())
        );
        assert!(
            lines.contains(&r#"podha_failovers_open{phase="Acting",policy="web"} 0"#.to_string())
        );

        // The failovers finished and policy web was deleted.
        m.set_failovers_open(["db"], []);
        let lines = open_lines(&registry);
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(
            lines
                .iter()
                .all(|l| l.ends_with(" 0") && l.contains(r#"policy="db""#))
        );
    }

    #[test]
    fn build_info_and_process_metrics_are_exported() {
        let registry = Registry::new();
        let m = Operating::register(&registry).expect("register");
        m.inc_watch_restarts("leases");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!("podha_build_info{{version=\"{version}\"}} 1")));
        assert!(text.contains(r#"podha_watch_restarts_total{resource="leases"} 1"#));
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }
}
