//! The per-(policy, node) state machine: probe ticks move a node between Healthy, Suspect and
//! Failed.

use std::num::NonZeroU32;

use tokio::time::Instant;

use super::{DetectionConfig, NodeHealth, NodeObservations, Probe, Verdict, evaluate};

/// Why a tracker changed state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// This probe (its readings make the event message).
    Probe(Probe),
    /// A gap in podha's view reset a Suspect node; no probe ran.
    Gap,
}

/// A change of a tracker's state, returned by [`HealthTracker::tick`]. Emitted for every change,
/// including `Suspect{1}` to `Suspect{2}`; callers that only care about the kind compare
/// [`NodeHealth::as_str`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: NodeHealth,
    pub to: NodeHealth,
    pub at: Instant,
    pub cause: Cause,
}

/// One policy's judgement of one node. The node's observations are shared and passed to each
/// tick, so that several policies watching a node see the same facts through their own settings.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    state: NodeHealth,
    /// The observations' gap epoch as of the last tick; a difference means a gap began or ended
    /// since.
    gap_epoch: u64,
    /// When [`Self::poll`] probes next on the interval grid; `None`: at once.
    next_probe: Option<Instant>,
    /// The last probe's verdict (`None` after a gap), so that [`Self::poll`] probes at once when
    /// the evidence turns.
    last_verdict: Option<Verdict>,
    /// Failed was resumed from an earlier judgement and no probe of this tracker has failed
    /// since: nothing new may be done on the strength of it (see [`Self::resume_failed`]).
    resumed_unconfirmed: bool,
}

impl HealthTracker {
    /// A node this policy has just started watching: Healthy until probes say otherwise.
    pub fn new(obs: &NodeObservations) -> Self {
        Self {
            state: NodeHealth::Healthy,
            gap_epoch: obs.gap_epoch(),
            next_probe: None,
            last_verdict: None,
            resumed_unconfirmed: false,
        }
    }

    /// A tracker that resumes a Failed judgement made before (by a previous leader or process,
    /// e.g. recorded with podha's out-of-service taint), so that a restart does not by itself
    /// make a dead node look healthy (and its taint removable). It stays Failed until a probe
    /// shows a sign of life, but counts as judged only once one of its own probes has failed
    /// ([`Self::judged_failed`]): the earlier judgement keeps what was done, it is no licence
    /// to do more.
    pub fn resume_failed(obs: &NodeObservations, since: Instant) -> Self {
        Self {
            state: NodeHealth::Failed { since },
            gap_epoch: obs.gap_epoch(),
            next_probe: None,
            last_verdict: None,
            resumed_unconfirmed: true,
        }
    }

    /// Failed on a judgement of this tracker's own: a resumed Failed state counts only after a
    /// fresh failed probe.
    pub fn judged_failed(&self) -> bool {
        self.state.is_failed() && !self.resumed_unconfirmed
    }

    pub fn state(&self) -> NodeHealth {
        self.state
    }

    /// One probe at `now`, due or not ([`Self::poll`] knows when one is due). Returns the change
    /// it made, if any.
    ///
    /// Gaps in podha's view: a tracker that finds a gap began or ended since its last tick
    /// drops a Suspect count (failures seen before the gap may stem from the missing view), and
    /// while the gap is open no probe runs, so nothing counts towards Failed. Once the gap ends
    /// the Lease clock restarts (see [`NodeObservations::end_gap`]), so with Lease enabled a
    /// node needs a full grace period plus `failureThreshold` probes to be Failed again.
    ///
    /// A Failed node stays Failed through a gap, and after it until a probe shows a sign of
    /// life (a renewal actually seen, Ready=True, a TCP connect): the node was judged dead on
    /// evidence from before the gap and podha may have acted on it, while a gap is no evidence
    /// of life either. Dropping to Healthy would let podha remove its out-of-service taint from
    /// a dead node, and count the next failure as a second incident. This is also why a Lease
    /// clock merely restarted by a gap is [`Verdict::Inconclusive`], not a pass.
    pub fn tick(
        &mut self,
        now: Instant,
        obs: &NodeObservations,
        cfg: &DetectionConfig,
    ) -> Option<Transition> {
        let probe = (!obs.in_gap()).then(|| evaluate(now, obs, cfg));
        self.run_probe(now, obs, cfg, probe)
    }

    /// Called as often as the caller likes (the runtime: every 200 ms), probes when a probe is
    /// due: every `cfg.interval`, and also at once when the evidence has turned since the last
    /// probe (a probe now would reach another verdict). So the first failed probe is taken when
    /// the last signal goes dead (a Lease grace running out between two probes, Ready turning
    /// Unknown), not up to an interval later, and a sign of life between two probes clears a
    /// Suspect count at once. Failed still takes `failureThreshold` failed probes in a row, each
    /// `interval` after the one before: a probe is early only when the verdict changed, and a
    /// change away from Fail ends the run of failures.
    pub fn poll(
        &mut self,
        now: Instant,
        obs: &NodeObservations,
        cfg: &DetectionConfig,
    ) -> Option<Transition> {
        let probe = (!obs.in_gap()).then(|| evaluate(now, obs, cfg));
        let turned = probe.as_ref().map(Probe::verdict) != self.last_verdict;
        let on_grid = self.next_probe.is_none_or(|at| now >= at);
        if !(on_grid || turned) {
            return None;
        }
        self.run_probe(now, obs, cfg, probe)
    }

    /// The probe `probe` (`None`: podha's view has a gap, nothing is probed) at `now`.
    fn run_probe(
        &mut self,
        now: Instant,
        obs: &NodeObservations,
        cfg: &DetectionConfig,
        probe: Option<Probe>,
    ) -> Option<Transition> {
        self.next_probe = Some(crate::deadline::after(now, cfg.interval));
        self.last_verdict = probe.as_ref().map(Probe::verdict);
        let from = self.state;
        if self.gap_epoch != obs.gap_epoch() {
            self.gap_epoch = obs.gap_epoch();
            if matches!(self.state, NodeHealth::Suspect { .. }) {
                self.state = NodeHealth::Healthy;
            }
        }
        let cause = match probe {
            None => Cause::Gap,
            Some(probe) => {
                if probe.verdict() == Verdict::Fail {
                    self.resumed_unconfirmed = false;
                }
                self.state = next_state(self.state, probe.verdict(), now, cfg.failure_threshold);
                Cause::Probe(probe)
            }
        };
        (from != self.state).then_some(Transition {
            from,
            to: self.state,
            at: now,
            cause,
        })
    }
}

/// The transition function. A Healthy or Suspect node stays clear of Failed unless the probe
/// fails; only a Failed node needs a positive sign of life to leave.
fn next_state(
    state: NodeHealth,
    verdict: Verdict,
    now: Instant,
    threshold: NonZeroU32,
) -> NodeHealth {
    match (state, verdict) {
        (_, Verdict::Pass) => NodeHealth::Healthy,
        (NodeHealth::Failed { .. }, _) => state,
        (_, Verdict::Inconclusive) => NodeHealth::Healthy,
        (NodeHealth::Healthy, Verdict::Fail) => suspect_or_failed(1, now, now, threshold),
        (NodeHealth::Suspect { failures, since }, Verdict::Fail) => {
            suspect_or_failed(failures.saturating_add(1), since, now, threshold)
        }
    }
}

fn suspect_or_failed(
    failures: u32,
    since: Instant,
    now: Instant,
    threshold: NonZeroU32,
) -> NodeHealth {
    // `>=`, not `==`: a policy edit may lower the threshold below a running count.
    if failures >= threshold.get() {
        NodeHealth::Failed { since: now }
    } else {
        NodeHealth::Suspect { failures, since }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::Signal;
    use crate::health::{ProbeKind, ReadyStatus, TcpResult};

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn threshold(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn cfg(threshold_: u32, signals: &[Signal]) -> DetectionConfig {
        DetectionConfig {
            interval: s(5),
            failure_threshold: threshold(threshold_),
            signals: signals.iter().copied().collect(),
            lease_grace: s(40),
            tcp_timeout: s(1),
        }
    }

    fn default_cfg() -> DetectionConfig {
        cfg(3, &[Signal::Lease, Signal::NodeReady])
    }

    /// A node whose lease was last renewed at `t0` and whose Ready went Unknown: every probe
    /// after `t0 + 40s` fails with the default signals.
    fn dead_node(t0: Instant) -> NodeObservations {
        let mut obs = NodeObservations::new(t0);
        obs.observe_ready(ReadyStatus::True, t0);
        obs.lease_renewed(t0);
        obs.observe_ready(ReadyStatus::Unknown, t0 + s(1));
        obs
    }

    fn kind(h: NodeHealth) -> (&'static str, u32) {
        match h {
            NodeHealth::Suspect { failures, .. } => ("suspect", failures),
            other => (other.as_str(), 0),
        }
    }

    #[test]
    fn next_state_table() {
        use NodeHealth::*;
        use Verdict::*;
        let t0 = Instant::now();
        let now = t0 + s(100);
        let cases = [
            // (state, verdict, threshold, want)
            (
                Healthy,
                Fail,
                3,
                Suspect {
                    failures: 1,
                    since: now,
                },
            ),
            (Healthy, Fail, 1, Failed { since: now }),
            (Healthy, Pass, 3, Healthy),
            (Healthy, Inconclusive, 3, Healthy),
            (
                Suspect {
                    failures: 1,
                    since: t0,
                },
                Fail,
                3,
                Suspect {
                    failures: 2,
                    since: t0,
                },
            ),
            (
                Suspect {
                    failures: 2,
                    since: t0,
                },
                Fail,
                3,
                Failed { since: now },
            ),
            (
                Suspect {
                    failures: 2,
                    since: t0,
                },
                Pass,
                3,
                Healthy,
            ),
            (
                Suspect {
                    failures: 2,
                    since: t0,
                },
                Inconclusive,
                3,
                Healthy,
            ),
            // Threshold lowered by a policy edit below the running count.
            (
                Suspect {
                    failures: 4,
                    since: t0,
                },
                Fail,
                2,
                Failed { since: now },
            ),
            (Failed { since: t0 }, Fail, 3, Failed { since: t0 }),
            (Failed { since: t0 }, Inconclusive, 3, Failed { since: t0 }),
            (Failed { since: t0 }, Pass, 3, Healthy),
        ];
        for (state, verdict, n, want) in cases {
            assert_eq!(
                next_state(state, verdict, now, threshold(n)),
                want,
                "{state:?} {verdict:?}"
            );
        }
    }

    #[test]
    fn fails_at_exactly_the_threshold() {
        for n in 1..=5u32 {
            let t0 = Instant::now();
            let obs = dead_node(t0);
            let c = cfg(n, &[Signal::Lease, Signal::NodeReady]);
            let mut tracker = HealthTracker::new(&obs);
            let first = t0 + s(45);
            for i in 0..n {
                let now = first + s(5) * i;
                let transition = tracker.tick(now, &obs, &c).unwrap();
                if i + 1 < n {
                    assert_eq!(
                        tracker.state(),
                        NodeHealth::Suspect {
                            failures: i + 1,
                            since: first
                        }
                    );
                } else {
                    assert_eq!(
                        tracker.state(),
                        NodeHealth::Failed { since: now },
                        "threshold {n}"
                    );
                    assert_eq!(transition.at, now);
                    let Cause::Probe(probe) = transition.cause else {
                        panic!("not a probe")
                    };
                    assert_eq!(
                        probe.dead_signals().collect::<Vec<_>>(),
                        [Signal::Lease, Signal::NodeReady]
                    );
                }
            }
            // Further failing probes keep the original `since` and report nothing.
            assert_eq!(tracker.tick(first + s(5) * n, &obs, &c), None);
            assert_eq!(
                tracker.state(),
                NodeHealth::Failed {
                    since: first + s(5) * (n - 1)
                }
            );
        }
    }

    #[test]
    fn one_pass_resets_from_suspect_and_from_failed() {
        let t0 = Instant::now();
        let c = default_cfg();
        for failing_ticks in [1u64, 2, 3, 5] {
            let mut obs = dead_node(t0);
            let mut tracker = HealthTracker::new(&obs);
            for i in 0..failing_ticks {
                tracker.tick(t0 + s(45 + 5 * i), &obs, &c);
            }
            assert_ne!(tracker.state(), NodeHealth::Healthy);
            let now = t0 + s(45 + 5 * failing_ticks);
            obs.lease_renewed(now);
            let transition = tracker.tick(now, &obs, &c).unwrap();
            assert_eq!(
                transition.to,
                NodeHealth::Healthy,
                "after {failing_ticks} failures"
            );
            // And counting starts again from zero.
            obs.observe_ready(ReadyStatus::True, now);
            obs.observe_ready(ReadyStatus::Unknown, now);
            tracker.tick(now + s(41), &obs, &c);
            assert_eq!(kind(tracker.state()), ("suspect", 1));
        }
    }

    /// All enabled signals must agree; evaluated for every combination of enabled signals and
    /// every combination of dead/alive readings.
    #[test]
    fn all_enabled_signals_must_agree() {
        let t0 = Instant::now();
        let now = t0 + s(100);
        let all = [Signal::Lease, Signal::NodeReady, Signal::KubeletTCP];
        for enabled_mask in 1u8..8 {
            let enabled: Vec<Signal> = (0..3)
                .filter(|i| enabled_mask & (1 << i) != 0)
                .map(|i| all[i])
                .collect();
            for dead_mask in 0u8..8 {
                let dead = |i: usize| dead_mask & (1 << i) != 0;
                let mut obs = NodeObservations::new(t0);
                obs.lease_renewed(if dead(0) { t0 } else { now - s(10) });
                let ready = if dead(1) {
                    ReadyStatus::Unknown
                } else {
                    ReadyStatus::True
                };
                obs.observe_ready(ready, t0);
                let tcp = if dead(2) {
                    TcpResult::NoAnswer
                } else {
                    TcpResult::Connected
                };
                obs.observe_probe(ProbeKind::KubeletTcp, tcp, t0, t0);

                let c = cfg(1, &enabled);
                let mut tracker = HealthTracker::new(&obs);
                tracker.tick(now, &obs, &c);
                let want_failed = (0..3).all(|i| enabled_mask & (1 << i) == 0 || dead(i));
                assert_eq!(
                    tracker.state().is_failed(),
                    want_failed,
                    "enabled {enabled:?}, dead mask {dead_mask:03b}"
                );
            }
        }
    }

    #[test]
    fn lease_renewed_within_grace_is_never_dead() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::Lease]);
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::new(&obs);
        // Renewed every 40s (exactly the grace), probed every second for ten minutes.
        for sec in 0..600u64 {
            let now = t0 + s(sec);
            if sec % 40 == 0 {
                obs.lease_renewed(now);
            }
            tracker.tick(now, &obs, &c);
            assert_eq!(tracker.state(), NodeHealth::Healthy, "at {sec}s");
        }
        // One millisecond past the grace the Lease says dead.
        let late = t0 + s(560 + 40) + Duration::from_millis(1);
        assert!(tracker.tick(late, &obs, &c).is_some());
        assert!(tracker.state().is_failed());
    }

    #[test]
    fn lease_clock_starts_when_watching_starts() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::Lease]);
        let obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::new(&obs);
        assert_eq!(tracker.tick(t0 + s(40), &obs, &c), None);
        assert!(tracker.tick(t0 + s(41), &obs, &c).is_some());
        assert!(tracker.state().is_failed());
    }

    /// A resumed Failed state keeps the node out of Healthy but is no judgement until a probe
    /// of this tracker fails; a first probe that is merely inconclusive (no renewal seen yet
    /// after a restart, no TCP result) confirms nothing.
    #[test]
    fn resumed_failed_needs_a_fresh_failed_probe() {
        let t0 = Instant::now();
        let c = cfg(3, &[Signal::Lease, Signal::KubeletTCP]);
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::resume_failed(&obs, t0);
        assert!(tracker.state().is_failed());
        assert!(!tracker.judged_failed());
        tracker.tick(t0 + s(1), &obs, &c);
        assert!(tracker.state().is_failed());
        assert!(
            !tracker.judged_failed(),
            "an inconclusive probe confirms nothing"
        );
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        tracker.tick(t0 + s(50), &obs, &c);
        assert!(tracker.judged_failed());
        // A resumed node that shows life is simply healthy.
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::resume_failed(&obs, t0);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Connected, t0, t0);
        tracker.tick(t0 + s(1), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        assert!(!tracker.judged_failed());
    }

    /// Only Unknown (the node lifecycle controller's verdict) is dead: False is written by a
    /// running kubelet, and a missing condition says nothing either way.
    #[test]
    fn only_ready_unknown_counts_as_dead() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::NodeReady]);
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::new(&obs);
        tracker.tick(t0, &obs, &c);
        assert_eq!(obs.ready(), ReadyStatus::Missing);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        obs.observe_ready(ReadyStatus::False, t0);
        tracker.tick(t0 + s(1), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        obs.observe_ready(ReadyStatus::Unknown, t0 + s(2));
        tracker.tick(t0 + s(2), &obs, &c);
        assert!(tracker.state().is_failed());
    }

    /// A refused connect is the host's kernel answering: the machine runs, whatever became of
    /// the kubelet, so it is no evidence of death. Only silence is.
    #[test]
    fn refused_tcp_is_a_live_host_not_a_dead_one() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::Lease, Signal::KubeletTCP]);
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::new(&obs);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Refused, t0, t0);
        tracker.tick(t0 + s(100), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        tracker.tick(t0 + s(101), &obs, &c);
        assert!(tracker.state().is_failed());
        // And a Failed node whose host answers again is no longer Failed.
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Refused, t0, t0);
        tracker.tick(t0 + s(102), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
    }

    #[test]
    fn untested_tcp_never_fails_a_probe() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::Lease, Signal::KubeletTCP]);
        let mut obs = NodeObservations::new(t0);
        let mut tracker = HealthTracker::new(&obs);
        tracker.tick(t0 + s(100), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        tracker.tick(t0 + s(105), &obs, &c);
        assert!(tracker.state().is_failed());
    }

    #[test]
    fn gap_resets_suspect_and_restarts_the_lease_clock() {
        let t0 = Instant::now();
        let c = default_cfg();
        let mut obs = dead_node(t0);
        let mut tracker = HealthTracker::new(&obs);
        tracker.tick(t0 + s(45), &obs, &c);
        tracker.tick(t0 + s(50), &obs, &c);
        assert_eq!(kind(tracker.state()), ("suspect", 2));

        obs.begin_gap(t0 + s(52));
        // Ticks during the gap count nothing; the first one drops the Suspect count.
        let reset = tracker.tick(t0 + s(55), &obs, &c).unwrap();
        assert_eq!(reset.to, NodeHealth::Healthy);
        assert_eq!(reset.cause, Cause::Gap);
        for sec in (60..=200).step_by(5) {
            assert_eq!(tracker.tick(t0 + s(sec), &obs, &c), None);
            assert_eq!(tracker.state(), NodeHealth::Healthy);
        }
        let gap_end = t0 + s(201);
        obs.end_gap(gap_end);

        // A full grace after the gap's end...
        for sec in (205..=241).step_by(4) {
            assert_eq!(tracker.tick(t0 + s(sec), &obs, &c), None, "at {sec}s");
        }
        // ...then failureThreshold failing probes.
        let first = gap_end + s(41);
        tracker.tick(first, &obs, &c);
        tracker.tick(first + s(5), &obs, &c);
        assert_eq!(
            tracker.state(),
            NodeHealth::Suspect {
                failures: 2,
                since: first
            }
        );
        tracker.tick(first + s(10), &obs, &c);
        assert_eq!(
            tracker.state(),
            NodeHealth::Failed {
                since: first + s(10)
            }
        );
    }

    #[test]
    fn gap_the_tracker_did_not_tick_through_still_resets_suspect() {
        let t0 = Instant::now();
        let c = cfg(3, &[Signal::NodeReady]);
        let mut obs = dead_node(t0);
        let mut tracker = HealthTracker::new(&obs);
        tracker.tick(t0 + s(5), &obs, &c);
        tracker.tick(t0 + s(10), &obs, &c);
        assert_eq!(kind(tracker.state()), ("suspect", 2));
        obs.gap(t0 + s(12));
        // Without the reset this would be the third failure. The tick after the gap counts.
        let t = tracker.tick(t0 + s(15), &obs, &c).unwrap();
        assert_eq!(
            t.to,
            NodeHealth::Suspect {
                failures: 1,
                since: t0 + s(15)
            }
        );
        assert!(matches!(t.cause, Cause::Probe(_)));
    }

    #[test]
    fn failed_survives_a_gap_until_a_sign_of_life() {
        let t0 = Instant::now();
        let c = default_cfg();
        let mut obs = dead_node(t0);
        let mut tracker = HealthTracker::new(&obs);
        for sec in [45, 50, 55] {
            tracker.tick(t0 + s(sec), &obs, &c);
        }
        let failed = NodeHealth::Failed { since: t0 + s(55) };
        assert_eq!(tracker.state(), failed);

        obs.begin_gap(t0 + s(57));
        assert_eq!(tracker.tick(t0 + s(60), &obs, &c), None);
        obs.end_gap(t0 + s(62));
        // The restarted Lease clock is no sign of life, nor is time passing.
        for sec in (65..=300).step_by(5) {
            assert_eq!(tracker.tick(t0 + s(sec), &obs, &c), None, "at {sec}s");
            assert_eq!(tracker.state(), failed);
        }
        obs.lease_renewed(t0 + s(301));
        let t = tracker.tick(t0 + s(305), &obs, &c).unwrap();
        assert_eq!((t.from, t.to), (failed, NodeHealth::Healthy));
    }

    #[test]
    fn failed_recovers_on_ready_true_or_tcp_ok() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::Lease, Signal::NodeReady, Signal::KubeletTCP]);
        for revive in [
            |o: &mut NodeObservations, t| o.observe_ready(ReadyStatus::True, t),
            |o: &mut NodeObservations, t| {
                o.observe_probe(ProbeKind::KubeletTcp, TcpResult::Connected, t, t)
            },
        ] {
            let mut obs = dead_node(t0);
            obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
            let mut tracker = HealthTracker::new(&obs);
            tracker.tick(t0 + s(45), &obs, &c);
            assert!(tracker.state().is_failed());
            revive(&mut obs, t0 + s(46));
            tracker.tick(t0 + s(50), &obs, &c);
            assert_eq!(tracker.state(), NodeHealth::Healthy);
        }
    }

    #[test]
    fn resumed_failed_needs_a_sign_of_life() {
        let t0 = Instant::now();
        let c = default_cfg();
        let mut obs = NodeObservations::new(t0);
        obs.observe_ready(ReadyStatus::Unknown, t0);
        let mut tracker = HealthTracker::resume_failed(&obs, t0);
        assert_eq!(tracker.tick(t0 + s(5), &obs, &c), None);
        assert!(tracker.state().is_failed());
        obs.lease_renewed(t0 + s(7));
        tracker.tick(t0 + s(10), &obs, &c);
        assert_eq!(tracker.state(), NodeHealth::Healthy);
    }

    #[test]
    fn policies_with_different_settings_share_observations() {
        let t0 = Instant::now();
        let obs = dead_node(t0);
        let quick = cfg(1, &[Signal::NodeReady]);
        let slow = cfg(2, &[Signal::Lease, Signal::NodeReady]);
        let mut a = HealthTracker::new(&obs);
        let mut b = HealthTracker::new(&obs);
        a.tick(t0 + s(5), &obs, &quick);
        b.tick(t0 + s(5), &obs, &slow);
        assert!(a.state().is_failed());
        assert_eq!(b.state(), NodeHealth::Healthy);
        b.tick(t0 + s(45), &obs, &slow);
        b.tick(t0 + s(50), &obs, &slow);
        assert_eq!(b.state(), NodeHealth::Failed { since: t0 + s(50) });
    }

    /// Polls every 200 ms (the runtime's tick) from `from` to `to`, returning the transitions.
    fn poll_for(
        tracker: &mut HealthTracker,
        obs: &NodeObservations,
        c: &DetectionConfig,
        from: Instant,
        to: Instant,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        let mut now = from;
        while now <= to {
            out.extend(tracker.poll(now, obs, c));
            now += Duration::from_millis(200);
        }
        out
    }

    /// A node whose Ready condition is Unknown from `t0` on, and a fresh tracker for it.
    fn ready_unknown_since(t0: Instant) -> (NodeObservations, HealthTracker) {
        let mut obs = NodeObservations::new(t0);
        obs.observe_ready(ReadyStatus::Unknown, t0);
        let tracker = HealthTracker::new(&obs);
        (obs, tracker)
    }

    #[test]
    fn poll_probes_every_interval_while_the_evidence_holds() {
        let t0 = Instant::now();
        let c = cfg(3, &[Signal::NodeReady]);
        let (obs, mut tracker) = ready_unknown_since(t0);
        let probes: Vec<Instant> = poll_for(&mut tracker, &obs, &c, t0, t0 + s(12))
            .into_iter()
            .map(|t| t.at)
            .collect();
        // Ready is dead from the start: the first poll probes, then one probe per 5 s.
        assert_eq!(probes, vec![t0, t0 + s(5), t0 + s(10)]);
        assert_eq!(tracker.state(), NodeHealth::Failed { since: t0 + s(10) });
    }

    #[test]
    fn poll_probes_when_the_lease_runs_out_between_two_probes() {
        let t0 = Instant::now();
        let c = DetectionConfig {
            interval: s(1),
            ..cfg(3, &[Signal::Lease, Signal::KubeletTCP])
        };
        let mut obs = NodeObservations::new(t0);
        obs.lease_renewed(t0);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Connected, t0, t0);
        let mut tracker = HealthTracker::new(&obs);
        // On the grid from t0, probes fall at whole seconds; the lease dies at 40.5 s.
        let ms = Duration::from_millis;
        let renewed = t0 + ms(500);
        assert!(poll_for(&mut tracker, &obs, &c, t0, renewed - ms(100)).is_empty());
        obs.lease_renewed(renewed);
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        let transitions = poll_for(
            &mut tracker,
            &obs,
            &c,
            renewed - ms(100) + ms(200),
            t0 + s(60),
        );
        let first = transitions.first().expect("a transition");
        // 40.6 s is the first 200 ms tick past the grace, not the 41 s grid point.
        assert_eq!(first.at, renewed + s(40) + ms(100));
        assert_eq!(kind(first.to), ("suspect", 1));
        // Then every interval: Failed on the third failed probe, 2 s later.
        let failed = transitions
            .iter()
            .find(|t| t.to.is_failed())
            .expect("failed");
        assert_eq!(failed.at, first.at + s(2));
    }

    #[test]
    fn poll_clears_a_suspect_node_at_the_first_sign_of_life() {
        let t0 = Instant::now();
        let c = cfg(3, &[Signal::NodeReady]);
        let (mut obs, mut tracker) = ready_unknown_since(t0);
        assert!(tracker.poll(t0, &obs, &c).is_some());
        assert_eq!(kind(tracker.state()), ("suspect", 1));
        // Ready again 1 s later: the next grid probe would be at 5 s; poll probes now.
        obs.observe_ready(ReadyStatus::True, t0 + s(1));
        let t = tracker.poll(t0 + s(1), &obs, &c).expect("probed at once");
        assert_eq!(t.to, NodeHealth::Healthy);
        // Unknown again: a new run of failures starts, probes 5 s apart from here.
        obs.observe_ready(ReadyStatus::Unknown, t0 + s(2));
        assert!(tracker.poll(t0 + s(2), &obs, &c).is_some());
        assert_eq!(tracker.poll(t0 + s(6), &obs, &c), None);
        assert_eq!(kind(tracker.state()), ("suspect", 1));
        assert!(tracker.poll(t0 + s(7), &obs, &c).is_some());
        assert!(tracker.poll(t0 + s(12), &obs, &c).is_some());
        assert_eq!(tracker.state(), NodeHealth::Failed { since: t0 + s(12) });
    }

    #[test]
    fn poll_counts_nothing_in_a_gap() {
        let t0 = Instant::now();
        let c = cfg(1, &[Signal::NodeReady]);
        let mut obs = NodeObservations::new(t0);
        obs.observe_ready(ReadyStatus::Unknown, t0);
        obs.begin_gap(t0);
        let mut tracker = HealthTracker::new(&obs);
        for t in poll_for(&mut tracker, &obs, &c, t0, t0 + s(30)) {
            assert_eq!(t.cause, Cause::Gap);
        }
        assert_eq!(tracker.state(), NodeHealth::Healthy);
        // The gap ends: the probe runs at once, not at the next grid point.
        obs.end_gap(t0 + s(30) + Duration::from_millis(100));
        let t = tracker.poll(t0 + s(30) + Duration::from_millis(200), &obs, &c);
        assert!(t.is_some_and(|t| t.to.is_failed()));
    }

    #[test]
    fn an_absurd_interval_is_no_panic_and_no_probe_on_the_grid() {
        let t0 = Instant::now();
        let obs = dead_node(t0);
        let mut c = default_cfg();
        c.interval = Duration::MAX;
        let mut tracker = HealthTracker::new(&obs);
        let first = tracker.poll(t0 + s(50), &obs, &c);
        assert!(
            first.is_some_and(|t| matches!(t.to, NodeHealth::Suspect { failures: 1, .. })),
            "the evidence turned: probed at once"
        );
        // The next probe on the grid is a lifetime away.
        assert_eq!(tracker.poll(t0 + s(5000), &obs, &c), None);
    }

    #[tokio::test(start_paused = true)]
    async fn default_settings_on_the_paused_clock() {
        let c = default_cfg();
        let mut obs = NodeObservations::new(Instant::now());
        obs.observe_ready(ReadyStatus::True, Instant::now());
        let mut tracker = HealthTracker::new(&obs);
        let mut ticker = tokio::time::interval(c.interval);

        // Alive for a minute: the kubelet renews every 10s.
        for i in 0..12 {
            ticker.tick().await;
            if i % 2 == 0 {
                obs.lease_renewed(Instant::now());
            }
            assert_eq!(tracker.tick(Instant::now(), &obs, &c), None);
        }
        let last_renewal = obs.last_renewal().unwrap();
        // Dies: no more renewals; the node lifecycle controller sets Ready=Unknown at 40s.
        let died = Instant::now();
        let failed_at = loop {
            ticker.tick().await;
            let now = Instant::now();
            if now - died >= s(40) && obs.ready() == ReadyStatus::True {
                obs.observe_ready(ReadyStatus::Unknown, now);
            }
            if tracker
                .tick(now, &obs, &c)
                .is_some_and(|t| t.to.is_failed())
            {
                break now;
            }
            assert!(now - died < s(120), "never failed");
        };
        // Last renewal, 40s grace, then three failing probes 5s apart.
        let detect = failed_at - obs.last_seen_alive().unwrap();
        assert_eq!(obs.last_seen_alive(), Some(last_renewal));
        assert!(detect > s(50) && detect <= s(60), "detect took {detect:?}");
    }
}
