//! Whether the election loop still moves on; see the module docs of [`super`] ("Liveness").

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::LeaderConfig;

/// Where [`super::run`] records that the election loop moves on.
#[derive(Clone, Debug)]
pub struct Progress {
    last: Arc<std::sync::Mutex<Instant>>,
    stuck_after: Duration,
}

impl Progress {
    /// How many lease durations without progress make the loop stuck.
    pub const STUCK_AFTER_LEASES: u32 = 3;

    /// Progress as of now, for an election with `cfg`'s timings.
    pub fn new(cfg: &LeaderConfig) -> Self {
        Self {
            last: Arc::new(std::sync::Mutex::new(Instant::now())),
            stuck_after: cfg.lease_duration * Self::STUCK_AFTER_LEASES,
        }
    }

    pub(super) fn stamp(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// How long the loop has not moved on, if that is longer than a working loop ever takes.
    pub fn stuck_for(&self) -> Option<Duration> {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        Some(last.elapsed()).filter(|quiet| *quiet > self.stuck_after)
    }
}
