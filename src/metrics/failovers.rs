//! How failovers went: how long each phase took, which ones timed out waiting for a detach,
//! and which are open now (a gauge, so an alert keeps firing while a detach is stuck, where a
//! counter's window would let it fall silent), and each policy's last finished failover: which
//! node, how long per phase. Updated by the decision loop as it follows them.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use super::{PHASE_BUCKETS, POLICY, Phase, register, remove_policy};
use crate::api::FailoverPhase;

/// The state of a failover that is still open: the `state` of `podha_failovers_open`, named
/// as in a policy's status. Every one is exported (0 when empty) for each live policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenState {
    Acting,
    Held,
    Detaching,
    DetachTimedOut,
    Recovering,
}

impl OpenState {
    pub const ALL: [OpenState; 5] = [
        OpenState::Acting,
        OpenState::Held,
        OpenState::Detaching,
        OpenState::DetachTimedOut,
        OpenState::Recovering,
    ];

    /// The open state of a failover in `phase`; none once it is finished.
    pub const fn of(phase: FailoverPhase) -> Option<OpenState> {
        match phase {
            FailoverPhase::Acting => Some(OpenState::Acting),
            FailoverPhase::Held => Some(OpenState::Held),
            FailoverPhase::Detaching => Some(OpenState::Detaching),
            FailoverPhase::DetachTimedOut => Some(OpenState::DetachTimedOut),
            FailoverPhase::Recovering => Some(OpenState::Recovering),
            // A recovered failover (or one whose node returned) stays on the leader's books
            // until the node is healthy again, but it is finished.
            FailoverPhase::Recovered | FailoverPhase::NodeReturned => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            OpenState::Acting => "Acting",
            OpenState::Held => "Held",
            OpenState::Detaching => "Detaching",
            OpenState::DetachTimedOut => "DetachTimedOut",
            OpenState::Recovering => "Recovering",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Failovers {
    phase_duration: HistogramVec,
    detach_timeouts: IntCounterVec,
    failovers_open: IntGaugeVec,
    last_failover: GaugeVec,
}

impl Failovers {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let phase_duration = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "podha_failover_phase_duration_seconds",
                    "Duration of each failover phase: detect (node silent until judged failed), \
                     act (until pods deleted or node tainted), detach (until the old volume \
                     attachment was gone), recover (until the replacement ran with its volume \
                     attached) and total; with a fencing proof also fence (judged failed until \
                     the proof was there), and with the BMC's power_off (the BMC accepting \
                     podha's ForceOff until it said Off the second time).",
                )
                .buckets(PHASE_BUCKETS.to_vec()),
                &[POLICY, "phase"],
            )?,
        )?;
        let detach_timeouts = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "podha_detach_timeouts_total",
                    "Failovers whose volumes were still attached to the failed node after the \
                     policy's detachTimeout.",
                ),
                &[POLICY],
            )?,
        )?;
        let failovers_open = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_failovers_open",
                    "Failovers in progress on the leader, by policy and state (Acting, Held, \
                     Detaching, DetachTimedOut, Recovering); a finished failover leaves the \
                     gauge.",
                ),
                &[POLICY, "state"],
            )?,
        )?;
        let last_failover = register(
            registry,
            GaugeVec::new(
                Opts::new(
                    "podha_last_failover_seconds",
                    "Each policy's last failover this leader saw through to the replacement \
                     running: its node and how long each phase took (as in \
                     podha_failover_phase_duration_seconds). Replaced by the policy's next \
                     one; not exported by followers.",
                ),
                &[POLICY, "node", "phase"],
            )?,
        )?;
        Ok(Self {
            phase_duration,
            detach_timeouts,
            failovers_open,
            last_failover,
        })
    }

    pub fn observe_phase(&self, policy: &str, phase: Phase, duration: Duration) {
        self.phase_duration
            .with_label_values(&[policy, phase.as_str()])
            .observe(duration.as_secs_f64());
    }

    /// `policy`'s last finished failover: `node`'s, with its phases' durations; the policy's
    /// earlier one goes.
    pub fn set_last_failover(&self, policy: &str, node: &str, phases: &[(Phase, Duration)]) {
        remove_policy(&self.last_failover, policy);
        for (phase, duration) in phases {
            self.last_failover
                .with_label_values(&[policy, node, phase.as_str()])
                .set(duration.as_secs_f64());
        }
    }

    /// A follower exports no last failover: the leader's is the one to show.
    pub fn clear_last_failovers(&self) {
        self.last_failover.reset();
    }

    pub fn inc_detach_timeouts(&self, policy: &str) {
        self.detach_timeouts.with_label_values(&[policy]).inc();
    }

    /// Replaces the open-failover gauge with `open` (policy, phase) pairs; every policy in
    /// `policies` gets all [`OpenState`]s, 0 when none is open, and no other policy is kept.
    pub fn set_failovers_open<'a>(
        &self,
        policies: impl IntoIterator<Item = &'a str>,
        open: impl IntoIterator<Item = (&'a str, FailoverPhase)>,
    ) {
        let mut counts: BTreeMap<(&str, &'static str), i64> = BTreeMap::new();
        for policy in policies {
            for state in OpenState::ALL {
                counts.insert((policy, state.as_str()), 0);
            }
        }
        for (policy, state) in open
            .into_iter()
            .filter_map(|(policy, phase)| Some((policy, OpenState::of(phase)?)))
        {
            *counts.entry((policy, state.as_str())).or_default() += 1;
        }
        self.failovers_open.reset();
        for ((policy, state), n) in counts {
            self.failovers_open
                .with_label_values(&[policy, state])
                .set(n);
        }
    }

    /// Exports `policy`'s detach-timeout counter at 0 until it counts.
    pub(super) fn touch_policy(&self, policy: &str) {
        self.detach_timeouts.with_label_values(&[policy]);
    }

    pub(super) fn forget_policy(&self, policy: &str) {
        remove_policy(&self.phase_duration, policy);
        remove_policy(&self.detach_timeouts, policy);
        remove_policy(&self.last_failover, policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples of the family `name` in `registry`'s exposition.
    fn lines_of(registry: &Registry, name: &str) -> Vec<String> {
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .map(str::to_string)
            .collect()
    }

    fn open_lines(registry: &Registry) -> Vec<String> {
        lines_of(registry, "podha_failovers_open")
    }

    #[test]
    fn open_failovers_are_counted_by_state_and_finished_ones_leave() {
        let registry = Registry::new();
        let m = Failovers::register(&registry).expect("register");
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
            &r#"podha_failovers_open{policy="db",state="DetachTimedOut"} 2"#.to_string()
        ));
        assert!(
            lines
                .contains(&r#"podha_failovers_open{policy="db",state="Recovering"} 1"#.to_string())
        );
        assert!(
            lines.contains(&r#"podha_failovers_open{policy="web",state="Acting"} 0"#.to_string())
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
    fn a_policys_last_failover_replaces_its_earlier_one_and_followers_show_none() {
        let registry = Registry::new();
        let m = Failovers::register(&registry).expect("register");
        let lines = || lines_of(&registry, "podha_last_failover_seconds");
        let secs = Duration::from_secs_f64;
        m.set_last_failover(
            "db",
            "node-1",
            &[(Phase::Detect, secs(8.5)), (Phase::Total, secs(12.0))],
        );
        m.set_last_failover("web", "node-4", &[(Phase::Total, secs(30.0))]);
        m.set_last_failover(
            "db",
            "node-2",
            &[(Phase::Detect, secs(9.0)), (Phase::Total, secs(11.5))],
        );
        assert_eq!(
            lines(),
            [
                r#"podha_last_failover_seconds{node="node-2",phase="detect",policy="db"} 9"#,
                r#"podha_last_failover_seconds{node="node-2",phase="total",policy="db"} 11.5"#,
                r#"podha_last_failover_seconds{node="node-4",phase="total",policy="web"} 30"#,
            ]
        );
        m.forget_policy("web");
        assert_eq!(lines().len(), 2, "{:?}", lines());
        m.clear_last_failovers();
        assert!(lines().is_empty(), "{:?}", lines());
    }

    /// The label values are the phases' names in a policy's status, so a dashboard can link
    /// one to the other.
    #[test]
    fn open_states_are_named_as_in_the_status() {
        let phases = [
            FailoverPhase::Acting,
            FailoverPhase::Held,
            FailoverPhase::Detaching,
            FailoverPhase::Recovering,
            FailoverPhase::Recovered,
            FailoverPhase::DetachTimedOut,
            FailoverPhase::NodeReturned,
        ];
        let mut open = Vec::new();
        for phase in phases {
            if let Some(state) = OpenState::of(phase) {
                let in_status = serde_json::to_value(phase).expect("serialize");
                assert_eq!(in_status, serde_json::json!(state.as_str()));
                open.push(state);
            }
        }
        assert_eq!(open.len(), OpenState::ALL.len());
        assert!(OpenState::ALL.iter().all(|s| open.contains(s)));
    }
}
