//! Random event sequences against a small reference model written independently of the
//! machine (integer milliseconds, a plain run counter), checking the detection invariants.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::api::Signal;

#[derive(Clone, Debug)]
enum Event {
    LeaseRenewed,
    Ready(ReadyStatus),
    Tcp(TcpResult),
    BeginGap,
    EndGap,
    PointGap,
    Tick,
    Advance(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        2 => Just(Event::LeaseRenewed),
        2 => prop_oneof![
            Just(ReadyStatus::True),
            Just(ReadyStatus::False),
            Just(ReadyStatus::Unknown),
            Just(ReadyStatus::Missing),
        ]
        .prop_map(Event::Ready),
        1 => prop_oneof![
            Just(TcpResult::Connected),
            Just(TcpResult::Refused),
            Just(TcpResult::NoAnswer),
        ]
        .prop_map(Event::Tcp),
        1 => Just(Event::BeginGap),
        1 => Just(Event::EndGap),
        1 => Just(Event::PointGap),
        8 => Just(Event::Tick),
        6 => (0u64..20_000).prop_map(Event::Advance),
    ]
}

fn config() -> impl Strategy<Value = DetectionConfig> {
    (1u32..=4, 1u8..8, 1_000u64..30_000).prop_map(|(threshold, mask, grace_ms)| DetectionConfig {
        interval: Duration::from_secs(5),
        failure_threshold: std::num::NonZeroU32::new(threshold).unwrap(),
        signals: SignalSet {
            lease: mask & 1 != 0,
            node_ready: mask & 2 != 0,
            kubelet_tcp: mask & 4 != 0,
            agent: false,
        },
        lease_grace: Duration::from_millis(grace_ms),
        tcp_timeout: Duration::from_secs(1),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelHealth {
    Healthy,
    Suspect { failures: u32, since: u64 },
    Failed { since: u64 },
}

/// The reference: what the design says, in milliseconds since the node was first seen.
struct Model {
    now: u64,
    lease_clock: u64,
    last_renewal: Option<u64>,
    ready: ReadyStatus,
    tcp: Option<TcpResult>,
    in_gap: bool,
    last_seen_alive: Option<u64>,
    /// Consecutive failing probes since the last non-failing probe or gap.
    run: u32,
    health: ModelHealth,
}

impl Model {
    fn lease_renewed_within_grace(&self, grace: u64) -> bool {
        self.last_renewal.is_some_and(|r| self.now - r <= grace)
    }

    /// (fails, passes) for a probe now.
    fn probe(&self, cfg: &DetectionConfig) -> (bool, bool) {
        let grace = cfg.lease_grace.as_millis() as u64;
        let mut readings = Vec::new();
        if cfg.signals.lease {
            let dead = self.now - self.lease_clock > grace;
            readings.push((dead, !dead && self.lease_renewed_within_grace(grace)));
        }
        if cfg.signals.node_ready {
            // Only the node lifecycle controller's Unknown is dead; False comes from a live
            // kubelet, a missing condition says nothing.
            let dead = self.ready == ReadyStatus::Unknown;
            let alive = matches!(self.ready, ReadyStatus::True | ReadyStatus::False);
            readings.push((dead, alive));
        }
        if cfg.signals.kubelet_tcp {
            // A refusal is the host answering.
            let dead = self.tcp == Some(TcpResult::NoAnswer);
            let alive = matches!(self.tcp, Some(TcpResult::Connected | TcpResult::Refused));
            readings.push((dead, alive));
        }
        (readings.iter().all(|r| r.0), readings.iter().any(|r| r.1))
    }

    fn gap_seen(&mut self) {
        self.run = 0;
        if matches!(self.health, ModelHealth::Suspect { .. }) {
            self.health = ModelHealth::Healthy;
        }
    }
}

fn as_model(h: NodeHealth, t0: Instant) -> ModelHealth {
    let ms = |t: Instant| (t - t0).as_millis() as u64;
    match h {
        NodeHealth::Healthy => ModelHealth::Healthy,
        NodeHealth::Suspect { failures, since } => ModelHealth::Suspect {
            failures,
            since: ms(since),
        },
        NodeHealth::Failed { since } => ModelHealth::Failed { since: ms(since) },
    }
}

fn run(cfg: DetectionConfig, events: Vec<Event>) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let threshold = cfg.failure_threshold.get();
    let grace = cfg.lease_grace.as_millis() as u64;

    let mut obs = NodeObservations::new(t0);
    let mut tracker = HealthTracker::new(&obs);
    let mut m = Model {
        now: 0,
        lease_clock: 0,
        last_renewal: None,
        ready: ReadyStatus::Missing,
        tcp: None,
        in_gap: false,
        last_seen_alive: None,
        run: 0,
        health: ModelHealth::Healthy,
    };

    for event in events {
        match event {
            Event::Advance(ms) => m.now += ms,
            Event::LeaseRenewed => {
                obs.lease_renewed(at(m.now));
                m.lease_clock = m.now;
                m.last_renewal = Some(m.now);
                m.last_seen_alive = Some(m.now);
            }
            Event::Ready(status) => {
                obs.observe_ready(status, at(m.now));
                if status == ReadyStatus::True && m.ready != ReadyStatus::True {
                    m.last_seen_alive = Some(m.now);
                }
                m.ready = status;
            }
            Event::Tcp(result) => {
                obs.observe_probe(ProbeKind::KubeletTcp, result, at(m.now), at(m.now));
                m.tcp = Some(result);
            }
            Event::BeginGap => {
                obs.begin_gap(at(m.now));
                if !m.in_gap {
                    m.in_gap = true;
                    m.gap_seen();
                }
            }
            Event::EndGap => {
                obs.end_gap(at(m.now));
                m.in_gap = false;
                m.lease_clock = m.now;
                m.gap_seen();
            }
            // A point gap inside an open gap leaves it open.
            Event::PointGap => {
                obs.gap(at(m.now));
                if !m.in_gap {
                    m.lease_clock = m.now;
                    m.gap_seen();
                }
            }
            Event::Tick => {
                let before = tracker.state();
                let transition = tracker.tick(at(m.now), &obs, &cfg);
                let after = tracker.state();

                if m.in_gap {
                    // (4) Nothing counts during a gap: the only possible change is the reset
                    // of a Suspect count, and it is attributed to the gap.
                    prop_assert!(after == before || after == NodeHealth::Healthy);
                    if let Some(t) = &transition {
                        prop_assert_eq!(&t.cause, &Cause::Gap);
                        prop_assert!(matches!(t.from, NodeHealth::Suspect { .. }), "{:?}", t.from);
                    }
                } else {
                    let (fails, passes) = m.probe(&cfg);
                    let was_failed = matches!(m.health, ModelHealth::Failed { .. });
                    m.run = if fails { m.run + 1 } else { 0 };
                    m.health = match m.health {
                        _ if passes => ModelHealth::Healthy,
                        ModelHealth::Failed { .. } => m.health,
                        _ if !fails => ModelHealth::Healthy,
                        _ if m.run >= threshold => ModelHealth::Failed { since: m.now },
                        ModelHealth::Suspect { since, .. } => ModelHealth::Suspect {
                            failures: m.run,
                            since,
                        },
                        ModelHealth::Healthy => ModelHealth::Suspect {
                            failures: m.run,
                            since: m.now,
                        },
                    };

                    // (1) A renewal seen within the grace keeps the node from Failed.
                    if cfg.signals.lease && m.lease_renewed_within_grace(grace) {
                        prop_assert!(!after.is_failed(), "renewed within grace but {after:?}");
                        if let Some(Transition {
                            cause: Cause::Probe(p),
                            ..
                        }) = &transition
                        {
                            prop_assert!(!p.failed());
                        }
                    }
                    // (2) Failed is reached exactly at the threshold-th consecutive failure.
                    if after.is_failed() && !was_failed {
                        prop_assert_eq!(m.run, threshold);
                    }
                    if !was_failed && m.run == threshold {
                        prop_assert!(after.is_failed(), "{} failures but {after:?}", m.run);
                    }
                    if let NodeHealth::Suspect { failures, .. } = after {
                        prop_assert_eq!(failures, m.run);
                        prop_assert!(failures < threshold);
                    }
                    // (3) A passing probe always yields Healthy.
                    if passes {
                        prop_assert_eq!(after, NodeHealth::Healthy);
                    }
                    if let Some(t) = &transition {
                        prop_assert!(matches!(t.cause, Cause::Probe(_)), "{:?}", t.cause);
                        prop_assert_eq!(t.at, at(m.now));
                    }
                }
                prop_assert_eq!(as_model(after, t0), m.health, "at {} ms", m.now);
                prop_assert_eq!(transition.is_some(), before != after);
                if let Some(t) = transition {
                    prop_assert_eq!((t.from, t.to), (before, after));
                }
            }
        }
        prop_assert_eq!(obs.in_gap(), m.in_gap);
        prop_assert_eq!(obs.last_seen_alive(), m.last_seen_alive.map(at));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn machine_matches_the_reference(
        cfg in config(),
        events in prop::collection::vec(event(), 0..200),
    ) {
        run(cfg, events)?;
    }

    /// Long stretches of a dead node: most runs must reach Failed, so invariant (2) is
    /// exercised on the path that matters, not only vacuously.
    #[test]
    fn dead_node_fails_after_the_threshold(
        cfg in config(),
        ticks in 1usize..12,
        gap_after in prop::option::of(0usize..12),
    ) {
        let mut events = vec![
            Event::Ready(ReadyStatus::Unknown),
            Event::Tcp(TcpResult::NoAnswer),
        ];
        events.push(Event::Advance(cfg.lease_grace.as_millis() as u64 + 1));
        for i in 0..ticks {
            if gap_after == Some(i) {
                events.push(Event::PointGap);
                events.push(Event::Advance(cfg.lease_grace.as_millis() as u64 + 1));
            }
            events.push(Event::Tick);
            events.push(Event::Advance(5_000));
        }
        run(cfg, events)?;
    }
}

/// The reference itself must be able to tell a dead node: otherwise the invariants above
/// could hold vacuously.
#[test]
fn reference_model_sees_death() {
    let cfg = DetectionConfig {
        interval: Duration::from_secs(5),
        failure_threshold: std::num::NonZeroU32::new(2).unwrap(),
        signals: [Signal::Lease, Signal::NodeReady].into_iter().collect(),
        lease_grace: Duration::from_secs(40),
        tcp_timeout: Duration::from_secs(1),
    };
    let t0 = Instant::now();
    let mut obs = NodeObservations::new(t0);
    let mut tracker = HealthTracker::new(&obs);
    obs.observe_ready(ReadyStatus::Unknown, t0);
    tracker.tick(t0 + Duration::from_secs(41), &obs, &cfg);
    tracker.tick(t0 + Duration::from_secs(46), &obs, &cfg);
    assert!(tracker.state().is_failed());
    run(
        cfg,
        vec![
            Event::Ready(ReadyStatus::Unknown),
            Event::Advance(41_000),
            Event::Tick,
            Event::Advance(5_000),
            Event::Tick,
        ],
    )
    .unwrap();
}
