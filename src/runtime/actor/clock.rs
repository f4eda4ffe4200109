//! The loop's monotonic instants as wall-clock times, for status and events.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

/// Converts instants to wall-clock times from one fixed anchor, so a time never changes once
/// computed.
#[derive(Clone, Copy)]
pub(super) struct WallClock {
    instant: Instant,
    system: SystemTime,
}

impl WallClock {
    pub(super) fn now() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    pub(super) fn time(&self, at: Instant) -> Time {
        let system = if at >= self.instant {
            self.system + (at - self.instant)
        } else {
            self.system - (self.instant - at)
        };
        let ts = k8s_openapi::jiff::Timestamp::try_from(system)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        // Kubernetes stores times to the second; rounding here keeps status patches stable.
        Time(ts.round(k8s_openapi::jiff::Unit::Second).unwrap_or(ts))
    }
}
