//! One probe of one node: what each enabled signal says, and the verdict they add up to.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::{DetectionConfig, NodeObservations, ProbeKind, ReadyStatus, TcpResult};
use crate::api::Signal;

/// What one signal says about the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Evidence {
    Dead,
    Alive,
    /// Neither: no renewal seen yet within the grace after a (re-)baseline, or no TCP result
    /// yet. Enough to keep a probe from failing, not enough to revive a Failed node.
    Inconclusive,
}

/// One enabled signal's reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    Lease {
        /// Time on podha's clock since the Lease clock's baseline (last renewal seen, or the
        /// start of watching, or the end of a gap).
        silent_for: Duration,
        /// Time since a renewal was actually seen, if ever.
        since_renewal: Option<Duration>,
        grace: Duration,
    },
    NodeReady(ReadyStatus),
    /// `None`: no TCP result yet.
    KubeletTcp(Option<TcpResult>),
    /// `None`: no heartbeat result yet (or the node runs no agent).
    Agent(Option<TcpResult>),
}

impl Reading {
    pub const fn signal(&self) -> Signal {
        match self {
            Self::Lease { .. } => Signal::Lease,
            Self::NodeReady(_) => Signal::NodeReady,
            Self::KubeletTcp(_) => Signal::KubeletTCP,
            Self::Agent(_) => Signal::AgentHeartbeat,
        }
    }

    pub fn evidence(&self) -> Evidence {
        match *self {
            // Strictly longer than the grace, like the node lifecycle controller: a renewal seen
            // exactly `grace` ago still counts.
            Self::Lease {
                silent_for, grace, ..
            } if silent_for > grace => Evidence::Dead,
            Self::Lease {
                since_renewal: Some(r),
                grace,
                ..
            } if r <= grace => Evidence::Alive,
            Self::Lease { .. } => Evidence::Inconclusive,
            // Ready=False is written by a kubelet that runs; Unknown is the node lifecycle
            // controller's verdict on the same Lease the Lease signal reads (a second observer of
            // one heartbeat, not a second witness of the machine); no condition says nothing.
            Self::NodeReady(ReadyStatus::True | ReadyStatus::False) => Evidence::Alive,
            Self::NodeReady(ReadyStatus::Unknown) => Evidence::Dead,
            Self::NodeReady(ReadyStatus::Missing) => Evidence::Inconclusive,
            // A refusal is the host's kernel answering: the machine is up.
            Self::KubeletTcp(Some(TcpResult::Connected | TcpResult::Refused))
            | Self::Agent(Some(TcpResult::Connected | TcpResult::Refused)) => Evidence::Alive,
            Self::KubeletTcp(Some(TcpResult::NoAnswer))
            | Self::Agent(Some(TcpResult::NoAnswer)) => Evidence::Dead,
            Self::KubeletTcp(None) | Self::Agent(None) => Evidence::Inconclusive,
        }
    }

    pub fn is_dead(&self) -> bool {
        self.evidence() == Evidence::Dead
    }
}

/// Whole seconds: event messages do not need milliseconds and read better without them.
fn secs(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

impl fmt::Display for Reading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (*self, self.evidence()) {
            (Self::Lease { silent_for, .. }, Evidence::Dead) => {
                write!(f, "Lease not renewed for {}", secs(silent_for))
            }
            (
                Self::Lease {
                    since_renewal: Some(r),
                    ..
                },
                Evidence::Alive,
            ) => {
                write!(f, "Lease renewed {} ago", secs(r))
            }
            (Self::Lease { silent_for, .. }, _) => {
                write!(
                    f,
                    "Lease renewal not seen yet, {} into the grace period",
                    secs(silent_for)
                )
            }
            (Self::NodeReady(ReadyStatus::Missing), _) => f.write_str("no Ready condition"),
            (Self::NodeReady(status), _) => write!(f, "Ready={}", status.as_str()),
            (Self::KubeletTcp(Some(TcpResult::Connected)), _) => {
                f.write_str("kubelet TCP connect ok")
            }
            (Self::KubeletTcp(Some(TcpResult::Refused)), _) => {
                f.write_str("kubelet TCP connect refused (the host is up)")
            }
            (Self::KubeletTcp(Some(TcpResult::NoAnswer)), _) => {
                f.write_str("kubelet TCP connect not answered")
            }
            (Self::KubeletTcp(None), _) => f.write_str("kubelet TCP not probed yet"),
            (Self::Agent(Some(TcpResult::Connected)), _) => f.write_str("agent heartbeat ok"),
            (Self::Agent(Some(TcpResult::Refused)), _) => {
                f.write_str("agent heartbeat refused (the host is up)")
            }
            (Self::Agent(Some(TcpResult::NoAnswer)), _) => {
                f.write_str("agent heartbeat not answered")
            }
            (Self::Agent(None), _) => f.write_str("no agent heartbeat yet"),
        }
    }
}

/// What a probe adds up to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Every enabled signal says dead.
    Fail,
    /// At least one signal shows a sign of life.
    Pass,
    /// Not every signal says dead, but none shows life either (see [`Evidence::Inconclusive`]).
    Inconclusive,
}

/// The readings of one probe, in signal order (Lease, NodeReady, KubeletTCP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub readings: Vec<Reading>,
}

impl Probe {
    pub fn verdict(&self) -> Verdict {
        let mut all_dead = true;
        for reading in &self.readings {
            match reading.evidence() {
                Evidence::Alive => return Verdict::Pass,
                Evidence::Inconclusive => all_dead = false,
                Evidence::Dead => {}
            }
        }
        // No readings cannot happen with a validated config; it must not read as "all dead".
        if all_dead && !self.readings.is_empty() {
            Verdict::Fail
        } else {
            Verdict::Inconclusive
        }
    }

    pub fn failed(&self) -> bool {
        self.verdict() == Verdict::Fail
    }

    /// The signals that said dead.
    #[cfg(test)]
    pub(crate) fn dead_signals(&self) -> impl Iterator<Item = Signal> + '_ {
        self.readings
            .iter()
            .filter(|r| r.is_dead())
            .map(Reading::signal)
    }
}

/// `Lease not renewed for 41s; Ready=Unknown`.
impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, reading) in self.readings.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{reading}")?;
        }
        Ok(())
    }
}

/// Reads every signal `cfg` enables from `obs` at `now`. Pure; the gap state is the tracker's
/// business, not the probe's.
pub fn evaluate(now: Instant, obs: &NodeObservations, cfg: &DetectionConfig) -> Probe {
    let readings = cfg
        .signals
        .iter()
        .map(|signal| match signal {
            Signal::Lease => Reading::Lease {
                silent_for: now.saturating_duration_since(obs.lease_baseline()),
                since_renewal: obs.last_renewal().map(|r| now.saturating_duration_since(r)),
                grace: cfg.lease_grace,
            },
            Signal::NodeReady => Reading::NodeReady(obs.ready()),
            Signal::KubeletTCP => Reading::KubeletTcp(obs.tcp()),
            Signal::AgentHeartbeat => Reading::Agent(obs.probed(ProbeKind::Agent).result),
        })
        .collect();
    Probe { readings }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::health::SignalSet;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn cfg(lease: bool, node_ready: bool, kubelet_tcp: bool) -> DetectionConfig {
        DetectionConfig {
            interval: s(5),
            failure_threshold: NonZeroU32::MIN,
            signals: SignalSet {
                lease,
                node_ready,
                kubelet_tcp,
                agent: false,
            },
            lease_grace: s(40),
            tcp_timeout: s(1),
        }
    }

    fn lease(silent: u64, renewal: Option<u64>) -> Reading {
        Reading::Lease {
            silent_for: s(silent),
            since_renewal: renewal.map(s),
            grace: s(40),
        }
    }

    #[test]
    fn evidence_per_reading() {
        use Evidence::*;
        let cases = [
            (lease(0, None), Inconclusive),
            (lease(40, None), Inconclusive),
            (lease(41, None), Dead),
            (lease(0, Some(0)), Alive),
            (lease(40, Some(40)), Alive),
            (lease(41, Some(41)), Dead),
            // Re-baselined by a gap 10s ago, last real renewal 100s ago.
            (lease(10, Some(100)), Inconclusive),
            (Reading::NodeReady(ReadyStatus::True), Alive),
            // Written by a running kubelet.
            (Reading::NodeReady(ReadyStatus::False), Alive),
            (Reading::NodeReady(ReadyStatus::Unknown), Dead),
            (Reading::NodeReady(ReadyStatus::Missing), Inconclusive),
            (Reading::KubeletTcp(Some(TcpResult::Connected)), Alive),
            // The host's kernel answered: the machine runs.
            (Reading::KubeletTcp(Some(TcpResult::Refused)), Alive),
            (Reading::KubeletTcp(Some(TcpResult::NoAnswer)), Dead),
            (Reading::KubeletTcp(None), Inconclusive),
        ];
        for (reading, want) in cases {
            assert_eq!(reading.evidence(), want, "{reading:?}");
        }
    }

    #[test]
    fn verdict_needs_every_signal_dead_to_fail_and_one_alive_to_pass() {
        use Verdict::*;
        let dead = lease(50, None);
        let alive = Reading::NodeReady(ReadyStatus::True);
        let unsure = Reading::KubeletTcp(None);
        let cases: [(Vec<Reading>, Verdict); 8] = [
            (vec![dead], Fail),
            (vec![dead, Reading::NodeReady(ReadyStatus::Unknown)], Fail),
            (vec![dead, alive], Pass),
            (vec![alive, dead], Pass),
            (vec![dead, unsure], Inconclusive),
            (vec![unsure, alive], Pass),
            (vec![unsure], Inconclusive),
            (vec![], Inconclusive),
        ];
        for (readings, want) in cases {
            let probe = Probe { readings };
            assert_eq!(probe.verdict(), want, "{probe:?}");
            assert_eq!(probe.failed(), want == Fail);
        }
    }

    #[test]
    fn evaluate_reads_only_enabled_signals_in_order() {
        let t0 = Instant::now();
        let mut obs = NodeObservations::new(t0);
        obs.lease_renewed(t0 + s(2));
        obs.observe_ready(ReadyStatus::Unknown, t0 + s(3));
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        let now = t0 + s(50);

        let all = evaluate(now, &obs, &cfg(true, true, true));
        assert_eq!(
            all.readings,
            [
                Reading::Lease {
                    silent_for: s(48),
                    since_renewal: Some(s(48)),
                    grace: s(40)
                },
                Reading::NodeReady(ReadyStatus::Unknown),
                Reading::KubeletTcp(Some(TcpResult::NoAnswer)),
            ]
        );
        assert!(all.failed());
        assert_eq!(
            all.dead_signals().collect::<Vec<_>>(),
            [Signal::Lease, Signal::NodeReady, Signal::KubeletTCP]
        );

        let ready_only = evaluate(now, &obs, &cfg(false, true, false));
        assert_eq!(
            ready_only.readings,
            [Reading::NodeReady(ReadyStatus::Unknown)]
        );

        let tcp_lease = evaluate(now, &obs, &cfg(true, false, true));
        assert_eq!(
            tcp_lease
                .readings
                .iter()
                .map(Reading::signal)
                .collect::<Vec<_>>(),
            [Signal::Lease, Signal::KubeletTCP]
        );
    }

    /// The default signals: the Lease's silence alone judges nothing while the agent has not
    /// answered (a node without one, or not probed yet); its answer passes the probe whatever
    /// the Lease says; both silent fail it.
    #[test]
    fn the_default_signals_need_the_lease_and_the_agent_both_silent() {
        let t0 = Instant::now();
        let mut obs = NodeObservations::new(t0);
        obs.lease_renewed(t0 + s(2));
        let defaults = DetectionConfig::try_from(&crate::api::Detection::default()).unwrap();
        let now = t0 + s(50);
        let probe = evaluate(now, &obs, &defaults);
        assert_eq!(
            probe
                .readings
                .iter()
                .map(Reading::signal)
                .collect::<Vec<_>>(),
            [Signal::Lease, Signal::AgentHeartbeat]
        );
        assert_eq!(probe.verdict(), Verdict::Inconclusive, "{probe}");
        let arming = crate::health::Arming::Unsaid;
        obs.observe_agent(TcpResult::Connected, true, arming, now, now);
        assert_eq!(evaluate(now, &obs, &defaults).verdict(), Verdict::Pass);
        obs.observe_agent(TcpResult::NoAnswer, false, arming, now + s(1), now + s(2));
        assert_eq!(
            evaluate(now + s(2), &obs, &defaults).verdict(),
            Verdict::Fail
        );
        // The agent silent, the kubelet renewing: alive.
        obs.lease_renewed(now + s(3));
        assert_eq!(
            evaluate(now + s(4), &obs, &defaults).verdict(),
            Verdict::Pass
        );
    }

    #[test]
    fn instants_before_the_baseline_read_as_zero() {
        let t0 = Instant::now();
        let mut obs = NodeObservations::new(t0 + s(10));
        obs.lease_renewed(t0 + s(10));
        let probe = evaluate(t0, &obs, &cfg(true, false, false));
        assert_eq!(probe.readings, [lease(0, Some(0))]);
    }

    #[test]
    fn messages_read_like_events() {
        let t0 = Instant::now();
        let mut obs = NodeObservations::new(t0);
        obs.lease_renewed(t0);
        obs.observe_ready(ReadyStatus::Unknown, t0);
        let c = cfg(true, true, true);
        assert_eq!(
            evaluate(t0 + Duration::from_millis(41_700), &obs, &c).to_string(),
            "Lease not renewed for 41s; Ready=Unknown; kubelet TCP not probed yet"
        );
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Connected, t0, t0);
        obs.observe_ready(ReadyStatus::Missing, t0);
        assert_eq!(
            evaluate(t0 + s(3), &obs, &c).to_string(),
            "Lease renewed 3s ago; no Ready condition; kubelet TCP connect ok"
        );
        obs.gap(t0 + s(60));
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::Refused, t0, t0);
        obs.observe_ready(ReadyStatus::False, t0);
        assert_eq!(
            evaluate(t0 + s(65), &obs, &c).to_string(),
            "Lease renewal not seen yet, 5s into the grace period; Ready=False; \
             kubelet TCP connect refused (the host is up)"
        );
        obs.observe_probe(ProbeKind::KubeletTcp, TcpResult::NoAnswer, t0, t0);
        assert_eq!(
            evaluate(t0 + s(65), &obs, &c).to_string(),
            "Lease renewal not seen yet, 5s into the grace period; Ready=False; \
             kubelet TCP connect not answered"
        );
    }
}
