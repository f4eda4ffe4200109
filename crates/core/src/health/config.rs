//! One policy's detection settings, checked and in the shape the state machine uses.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::api::{Detection, Signal};

/// The signals a policy listens to. A set, so a signal listed twice counts once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SignalSet {
    pub lease: bool,
    pub node_ready: bool,
    pub kubelet_tcp: bool,
    pub agent: bool,
}

impl SignalSet {
    pub const fn contains(self, signal: Signal) -> bool {
        match signal {
            Signal::Lease => self.lease,
            Signal::NodeReady => self.node_ready,
            Signal::KubeletTCP => self.kubelet_tcp,
            Signal::AgentHeartbeat => self.agent,
        }
    }

    pub const fn is_empty(self) -> bool {
        !(self.lease || self.node_ready || self.kubelet_tcp || self.agent)
    }

    /// The enabled signals, always in the order Lease, NodeReady, KubeletTCP, AgentHeartbeat,
    /// so that event messages read the same way for every policy.
    pub fn iter(self) -> impl Iterator<Item = Signal> {
        [
            Signal::Lease,
            Signal::NodeReady,
            Signal::KubeletTCP,
            Signal::AgentHeartbeat,
        ]
        .into_iter()
        .filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Signal> for SignalSet {
    fn from_iter<I: IntoIterator<Item = Signal>>(iter: I) -> Self {
        iter.into_iter().fold(Self::default(), |mut set, signal| {
            match signal {
                Signal::Lease => set.lease = true,
                Signal::NodeReady => set.node_ready = true,
                Signal::KubeletTCP => set.kubelet_tcp = true,
                Signal::AgentHeartbeat => set.agent = true,
            }
            set
        })
    }
}

/// A policy's `spec.detection`, validated. Several policies with different settings may watch
/// the same node; each keeps its own [`DetectionConfig`] and [`super::HealthTracker`] while they
/// share the node's [`super::NodeObservations`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectionConfig {
    /// Time between two probes; the runtime schedules the ticks.
    pub interval: Duration,
    /// Consecutive failed probes after which a node is Failed.
    pub failure_threshold: NonZeroU32,
    pub signals: SignalSet,
    /// How long the Lease may go without a renewal seen by podha before it says dead.
    pub lease_grace: Duration,
    /// Time allowed for the KubeletTCP connect; used by the runtime's prober.
    pub tcp_timeout: Duration,
}

/// A `spec.detection` the state machine cannot work with. The CRD's validation rules reject all
/// of these at `kubectl apply`; this is the second line for objects written before a rule
/// existed or with validation bypassed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDetection {
    /// With no signal every probe would vacuously fail (all zero signals say dead).
    #[error("detection.signals must name at least one signal")]
    NoSignals,
    #[error("detection.failureThreshold must be at least 1, got {0}")]
    FailureThreshold(i32),
    /// A zero period cannot be scheduled (`tokio::time::interval` panics on it).
    #[error("detection.interval must be longer than zero")]
    ZeroInterval,
}

impl InvalidDetection {
    /// Bounded label value for metrics and condition reasons.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::NoSignals => "NoSignals",
            Self::FailureThreshold(_) => "InvalidFailureThreshold",
            Self::ZeroInterval => "ZeroInterval",
        }
    }
}

impl TryFrom<&Detection> for DetectionConfig {
    type Error = InvalidDetection;

    fn try_from(d: &Detection) -> Result<Self, Self::Error> {
        let signals: SignalSet = d.signals.iter().copied().collect();
        if signals.is_empty() {
            return Err(InvalidDetection::NoSignals);
        }
        let failure_threshold = u32::try_from(d.failure_threshold)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or(InvalidDetection::FailureThreshold(d.failure_threshold))?;
        let interval = d.interval.get();
        if interval.is_zero() {
            return Err(InvalidDetection::ZeroInterval);
        }
        Ok(Self {
            interval,
            failure_threshold,
            signals,
            lease_grace: d.lease_grace_period.get(),
            tcp_timeout: d.tcp_timeout.get(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HumanDuration;

    #[test]
    fn defaults_convert() {
        let cfg = DetectionConfig::try_from(&Detection::default()).unwrap();
        assert_eq!(cfg.interval, Duration::from_secs(2));
        assert_eq!(cfg.failure_threshold.get(), 3);
        assert_eq!(
            cfg.signals,
            SignalSet {
                lease: true,
                node_ready: false,
                kubelet_tcp: false,
                agent: true,
            }
        );
        assert_eq!(cfg.lease_grace, Duration::from_secs(15));
        assert_eq!(cfg.tcp_timeout, Duration::from_secs(1));
    }

    #[test]
    fn duplicate_signals_collapse() {
        let d = Detection {
            signals: vec![Signal::KubeletTCP, Signal::Lease, Signal::KubeletTCP],
            ..Detection::default()
        };
        let cfg = DetectionConfig::try_from(&d).unwrap();
        assert_eq!(
            cfg.signals.iter().collect::<Vec<_>>(),
            [Signal::Lease, Signal::KubeletTCP]
        );
    }

    #[test]
    fn rejects_what_the_machine_cannot_use() {
        let cases = [
            (
                Detection {
                    signals: vec![],
                    ..Detection::default()
                },
                InvalidDetection::NoSignals,
            ),
            (
                Detection {
                    failure_threshold: 0,
                    ..Detection::default()
                },
                InvalidDetection::FailureThreshold(0),
            ),
            (
                Detection {
                    failure_threshold: -2,
                    ..Detection::default()
                },
                InvalidDetection::FailureThreshold(-2),
            ),
            (
                Detection {
                    interval: HumanDuration::from_secs(0),
                    ..Detection::default()
                },
                InvalidDetection::ZeroInterval,
            ),
        ];
        for (detection, want) in cases {
            assert_eq!(
                DetectionConfig::try_from(&detection),
                Err(want),
                "{detection:?}"
            );
        }
    }
}
