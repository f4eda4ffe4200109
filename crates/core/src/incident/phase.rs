//! The phases of a failover: the steps it takes ([`PhaseChange`]), the spans they close
//! ([`Phase`], the `phase` label of `podha_failover_phase_duration_seconds`), and where an
//! incident stands ([`FailoverPhase`], as its policy's status shows it).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::Incident;
use crate::api::{FailoverPhase, FailoverRecord, HumanDuration};

/// A span of one failover, timed from the previous step (`Total` spans the whole failover).
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
    /// With the BMC's proof: the BMC accepting podha's `ForceOff` until it said `Off` (the
    /// BMC's own delay in applying the reset, part of `fence`).
    PowerOff,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Detect,
        Phase::Act,
        Phase::Detach,
        Phase::Recover,
        Phase::Total,
        Phase::Fence,
        Phase::PowerOff,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Detect => "detect",
            Phase::Act => "act",
            Phase::Detach => "detach",
            Phase::Recover => "recover",
            Phase::Total => "total",
            Phase::Fence => "fence",
            Phase::PowerOff => "power_off",
        }
    }
}

/// A step a failover took, as returned by [`Incident::record_action`] and [`Incident::follow`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhaseChange {
    /// The first action (taint or pod deletion).
    Acted { at: Instant },
    /// The moved pods' volumes left the dead node.
    Detached { at: Instant },
    /// Every moved pod has a replacement running with its volumes attached.
    Recovered { at: Instant },
    /// `detachTimeout` passed without a detach; `volumes` are still attached to the dead node.
    DetachTimedOut {
        waited: Duration,
        volumes: Vec<String>,
    },
}

impl PhaseChange {
    /// The metric phases this step completes.
    pub const fn completes(&self) -> &'static [Phase] {
        match self {
            Self::Acted { .. } => &[Phase::Detect, Phase::Act],
            Self::Detached { .. } => &[Phase::Detach],
            Self::Recovered { .. } => &[Phase::Recover, Phase::Total],
            Self::DetachTimedOut { .. } => &[],
        }
    }
}

impl Incident {
    /// Where the failover stands. Recovered wins over everything; a node that came back before
    /// recovery ends the failover as NodeReturned.
    pub fn phase(&self) -> FailoverPhase {
        if self.recovered_at.is_some() {
            FailoverPhase::Recovered
        } else if self.node_returned_at.is_some() {
            FailoverPhase::NodeReturned
        } else if self.acted_at.is_none() {
            if self.held.is_some() {
                FailoverPhase::Held
            } else {
                FailoverPhase::Acting
            }
        } else if self.detached_at.is_some() {
            FailoverPhase::Recovering
        } else if self.timed_out_at.is_some() {
            FailoverPhase::DetachTimedOut
        } else {
            FailoverPhase::Detaching
        }
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out_at.is_some()
    }

    /// The duration of every finished phase: detect (last seen alive → judged failed), act
    /// (→ first action), detach (→ detached), recover (detached → recovered; only when pods
    /// were replaced) and total (last seen alive, or judged failed when unknown → recovered).
    pub fn durations(&self) -> Vec<(Phase, Duration)> {
        let span = |from: Option<Instant>, to: Option<Instant>| {
            from.zip(to).map(|(f, t)| t.saturating_duration_since(f))
        };
        let replaced = self.moved.iter().any(|m| m.replaced_by.is_some());
        let start = self.last_seen_alive.unwrap_or(self.detected_at);
        [
            (
                Phase::Detect,
                span(self.last_seen_alive, Some(self.detected_at)),
            ),
            (Phase::Act, span(Some(self.detected_at), self.acted_at)),
            (Phase::Detach, span(self.acted_at, self.detached_at)),
            (
                Phase::Recover,
                span(self.detached_at, self.recovered_at).filter(|_| replaced),
            ),
            (Phase::Total, span(Some(start), self.recovered_at)),
        ]
        .into_iter()
        .filter_map(|(phase, d)| d.map(|d| (phase, d)))
        .collect()
    }

    /// The durations a step completes, for observing each histogram exactly once.
    pub fn durations_for(&self, change: &PhaseChange) -> Vec<(Phase, Duration)> {
        let phases = change.completes();
        self.durations()
            .into_iter()
            .filter(|(phase, _)| phases.contains(phase))
            .collect()
    }

    /// The failover as the policy status shows it; `wall` maps the operator's clock to wall
    /// time.
    pub fn to_record(&self, wall: impl Fn(Instant) -> Time) -> FailoverRecord {
        FailoverRecord {
            node: self.node.clone(),
            phase: self.phase(),
            last_seen_alive: self.last_seen_alive.map(&wall),
            detected_at: wall(self.detected_at),
            acted_at: self.acted_at.map(&wall),
            detached_at: self.detached_at.map(&wall),
            recovered_at: self.recovered_at.map(&wall),
            pods: self.moved.iter().map(|m| m.key.to_string()).collect(),
            message: self.message(),
        }
    }

    fn message(&self) -> Option<String> {
        let secs = |d: Duration| HumanDuration(Duration::from_secs(d.as_secs()));
        match self.phase() {
            FailoverPhase::Held => self.held.as_ref().map(|h| h.note.clone()),
            FailoverPhase::NodeReturned => {
                Some("the node became healthy again before the failover finished".to_string())
            }
            FailoverPhase::DetachTimedOut => {
                let waited = self
                    .acted_at
                    .zip(self.timed_out_at)
                    .map(|(a, t)| t.saturating_duration_since(a))
                    .unwrap_or_default();
                Some(format!(
                    "still attached to node {} more than {} after podha acted: {}",
                    self.node,
                    secs(waited),
                    self.still_attached.join(", ")
                ))
            }
            _ => {
                let detach = self
                    .timed_out_at
                    .and(self.acted_at.zip(self.detached_at))
                    .map(|(a, d)| d.saturating_duration_since(a))?;
                Some(format!(
                    "the detach exceeded detachTimeout and took {}",
                    secs(detach)
                ))
            }
        }
    }
}
