//! Per-node health: a pure state machine fed with observations (lease renewals seen, Ready
//! condition, TCP probe results, gaps in podha's own view) and probe ticks.
//!
//! [`NodeHealth`] is what the rest of podha reads; the [`HealthTracker`] in `machine.rs` moves
//! a node between its states, the signals and their readings are in `observations.rs` and
//! `probe.rs`, and a policy's detection settings in `config.rs`. Nothing here does I/O or reads
//! a clock: time comes in with the observations and ticks, so every judgment can be replayed.

use tokio::time::Instant;

mod config;
mod machine;
mod observations;
mod probe;
#[cfg(test)]
mod proptests;

pub use config::{DetectionConfig, InvalidDetection, SignalSet};
pub use machine::{Cause, HealthTracker, Transition};
pub use observations::{Arming, NodeObservations, ProbeKind, Probed, ReadyStatus, TcpResult};
pub use probe::{Evidence, Probe, Reading, Verdict, evaluate};

/// Where a node stands, as judged by one policy's detection settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// The last probe passed (or no probe has run since a re-baseline).
    Healthy,
    /// `failures` consecutive probes failed, the first at `since`.
    Suspect { failures: u32, since: Instant },
    /// `failureThreshold` consecutive probes failed; judged dead at `since`.
    Failed { since: Instant },
}

impl NodeHealth {
    pub fn is_failed(&self) -> bool {
        matches!(self, Self::Failed { .. })
    }

    /// Label value for `podha_nodes{state}`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Suspect { .. } => "suspect",
            Self::Failed { .. } => "failed",
        }
    }
}
