//! What the agent counts of the words it would not believe, and whether it pets a watchdog,
//! served at `/metrics` on its port:
//! - `podha_agent_requests_refused_total{path}`: requests to `/heartbeat` or `/peer` that
//!   were not signed by a key this agent trusts (podha's leader's, or a peer's as its peer list
//!   says), answered `401` and nothing else;
//! - `podha_agent_heartbeats_stale_total`: heartbeats signed by podha's leader over a challenge
//!   the agent did not issue or already took (a replay, or the first probe of a leader): they
//!   tell the agent nothing of being heard;
//! - `podha_agent_peer_answers_unverified_total`: survey answers not signed by the peer's key,
//!   counted as no answer;
//! - `podha_agent_connections_refused_total{limit}`: connections closed as they were accepted,
//!   over the port's limit in all (`connections`) or from one address (`per_source`; see
//!   `super::port`);
//! - `podha_agent_watchdog_armed`: 1 while the agent's watchdog is armed, 0 while it is
//!   disarmed (`super::arming`) or the agent runs without one (none configured, or none
//!   usable: its node is then not agent-protected, see `super::watchdog::run_without`);
//! - `podha_agent_peers_asked` and `podha_agent_peers_answered`: the peers the last reach
//!   check asked, and how many answered (see `super::peers::reach`);
//! - `podha_agent_last_fence_timestamp_seconds{cause}`: when the agent last fenced its node
//!   (`isolation` or `request`), as recorded before the fence and read back at start (see
//!   `super::fence_record`); absent if it never did;
//! - `podha_agent_peers_reachable`: 0 once two checks in a row reached fewer than half of the
//!   peers they asked (on isolation the agent could not show podha hears no majority, so podha
//!   holds its node), 1 otherwise.
//!
//! One set per process (the agent is one process per node).

use std::sync::LazyLock;

use prometheus::{
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
    register_int_counter_vec_with_registry, register_int_counter_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry,
};

struct Counters {
    registry: Registry,
    refused: IntCounterVec,
    stale: IntCounter,
    unverified: IntCounter,
    connections_refused: IntCounterVec,
    watchdog_armed: IntGauge,
    peers_asked: IntGauge,
    peers_answered: IntGauge,
    peers_reachable: IntGauge,
    last_fence: IntGaugeVec,
}

static COUNTERS: LazyLock<Counters> = LazyLock::new(|| {
    Counters::new()
        .expect("the agent's metrics are valid and registered once")
        .labelled_at_zero()
});

impl Counters {
    /// Every label of the refusal counters at 0 from the start: an alert's `increase()` then
    /// sees the first refusal.
    fn labelled_at_zero(self) -> Self {
        for path in [crate::contract::HEARTBEAT_PATH, crate::contract::PEER_PATH] {
            self.refused.with_label_values(&[path]);
        }
        for limit in super::port::REFUSAL_LABELS {
            self.connections_refused.with_label_values(&[limit]);
        }
        self
    }

    fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let refused = register_int_counter_vec_with_registry!(
            "podha_agent_requests_refused_total",
            "Requests to the agent not signed by a key it trusts, answered 401.",
            &["path"],
            registry,
        )?;
        let stale = register_int_counter_with_registry!(
            "podha_agent_heartbeats_stale_total",
            "Heartbeats of podha's leader over a challenge the agent did not issue or already \
             took.",
            registry,
        )?;
        let unverified = register_int_counter_with_registry!(
            "podha_agent_peer_answers_unverified_total",
            "Peer answers not signed by the peer's key, counted as no answer.",
            registry,
        )?;
        let connections_refused = register_int_counter_vec_with_registry!(
            "podha_agent_connections_refused_total",
            "Connections the agent closed as it accepted them, over its port's limit in all or \
             from one address.",
            &["limit"],
            registry,
        )?;
        let watchdog_armed = register_int_gauge_with_registry!(
            "podha_agent_watchdog_armed",
            "1 while the agent's watchdog is armed (podha may count its node's silence); 0 while \
             it is disarmed (podha holds the node, or has not heard it since it booted) or the \
             agent has none (its silence proves no fence of its node).",
            registry,
        )?;
        let peers_asked = register_int_gauge_with_registry!(
            "podha_agent_peers_asked",
            "Peers the last reach check asked.",
            registry,
        )?;
        let peers_answered = register_int_gauge_with_registry!(
            "podha_agent_peers_answered",
            "Peers whose port answered the agent's last reach check.",
            registry,
        )?;
        let peers_reachable = register_int_gauge_with_registry!(
            "podha_agent_peers_reachable",
            "0 once two reach checks in a row reached fewer than half of the peers asked \
             (podha then holds the node); 1 otherwise.",
            registry,
        )?;
        peers_reachable.set(1);
        let last_fence = register_int_gauge_vec_with_registry!(
            "podha_agent_last_fence_timestamp_seconds",
            "Unix time at which the agent last fenced its node, by cause (isolation: podha could \
             not hear it; request: podha asked), as recorded before the fence and read back \
             when the agent starts.",
            &["cause"],
            registry,
        )?;
        Ok(Self {
            registry,
            refused,
            stale,
            unverified,
            connections_refused,
            watchdog_armed,
            peers_asked,
            peers_answered,
            peers_reachable,
            last_fence,
        })
    }
}

/// The last reach check: `asked` peers, `answered` of them.
pub fn peer_check(asked: usize, answered: usize) {
    COUNTERS
        .peers_asked
        .set(asked.try_into().unwrap_or(i64::MAX));
    COUNTERS
        .peers_answered
        .set(answered.try_into().unwrap_or(i64::MAX));
}

/// The last fence the agent recorded, if any (see `super::fence_record`).
pub fn last_fence(last: Option<super::fence_record::LastFence>) {
    if let Some(last) = last {
        COUNTERS
            .last_fence
            .with_label_values(&[last.cause])
            .set(last.at_unix.try_into().unwrap_or(i64::MAX));
    }
}

/// Whether the agent reaches enough of its peers (see `super::peers::reach`).
pub fn peers_reachable(reachable: bool) {
    COUNTERS.peers_reachable.set(i64::from(reachable));
}

pub fn refused(path: &str) {
    COUNTERS.refused.with_label_values(&[path]).inc();
}

#[cfg(test)]
pub fn refused_count(path: &str) -> u64 {
    COUNTERS.refused.with_label_values(&[path]).get()
}

pub fn stale_heartbeat() {
    COUNTERS.stale.inc();
}

pub fn unverified_peer_answer() {
    COUNTERS.unverified.inc();
}

/// A connection closed as it was accepted, over the port's `limit`.
pub fn connection_refused(limit: &str) {
    COUNTERS
        .connections_refused
        .with_label_values(&[limit])
        .inc();
}

#[cfg(test)]
pub fn connections_refused(limit: &str) -> u64 {
    COUNTERS
        .connections_refused
        .with_label_values(&[limit])
        .get()
}

/// Whether the agent's watchdog is armed (set as it arms or disarms it, or knows it has none).
pub fn watchdog_armed(armed: bool) {
    COUNTERS.watchdog_armed.set(i64::from(armed));
}

/// The counters in Prometheus' text format.
pub fn render() -> String {
    TextEncoder::new()
        .encode_to_string(&COUNTERS.registry.gather())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_gauge_says_whether_the_agent_pets_one() {
        watchdog_armed(false);
        assert!(render().contains("\npodha_agent_watchdog_armed 0\n"));
        watchdog_armed(true);
        assert!(render().contains("\npodha_agent_watchdog_armed 1\n"));
    }

    #[test]
    fn the_reach_gauges_say_the_last_check_and_whether_the_peers_are_reachable() {
        assert!(
            render().contains("\npodha_agent_peers_reachable 1\n"),
            "1 at first"
        );
        peer_check(8, 3);
        peers_reachable(false);
        let text = render();
        assert!(text.contains("\npodha_agent_peers_asked 8\n"), "{text}");
        assert!(text.contains("\npodha_agent_peers_answered 3\n"), "{text}");
        assert!(text.contains("\npodha_agent_peers_reachable 0\n"), "{text}");
        peers_reachable(true);
        assert!(render().contains("\npodha_agent_peers_reachable 1\n"));
    }

    #[test]
    fn the_last_fence_is_exported_by_its_cause() {
        last_fence(None);
        assert!(!render().contains("podha_agent_last_fence_timestamp_seconds{"));
        last_fence(Some(crate::fence_record::LastFence {
            at_unix: 1_764_000_000,
            cause: "isolation",
        }));
        let text = render();
        assert!(
            text.contains(
                "\npodha_agent_last_fence_timestamp_seconds{cause=\"isolation\"} 1764000000\n"
            ),
            "{text}"
        );
    }
}
