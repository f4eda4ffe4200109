//! What the agent counts of the words it would not believe, served at `/metrics` on its port:
//! - `podha_agent_requests_refused_total{path}`: requests to `/heartbeat` or `/peer` that
//!   were not signed by a key this agent trusts (podha's leader's, or a peer's as its peer list
//!   says), answered `401` and nothing else;
//! - `podha_agent_heartbeats_stale_total`: heartbeats signed by podha's leader over a challenge
//!   the agent did not issue or already took (a replay, or the first probe of a leader): they
//!   tell the agent nothing of being heard;
//! - `podha_agent_peer_answers_unverified_total`: survey answers not signed by the peer's key,
//!   counted as no answer.
//!
//! One set per process (the agent is one process per node).

use std::sync::LazyLock;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::metrics::register;

struct Counters {
    registry: Registry,
    refused: IntCounterVec,
    stale: IntCounter,
    unverified: IntCounter,
}

static COUNTERS: LazyLock<Counters> =
    LazyLock::new(|| Counters::new().expect("the agent's metrics are valid and registered once"));

impl Counters {
    fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let refused = register(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "podha_agent_requests_refused_total",
                    "Requests to the agent not signed by a key it trusts, answered 401.",
                ),
                &["path"],
            )?,
        )?;
        let stale = register(
            &registry,
            IntCounter::new(
                "podha_agent_heartbeats_stale_total",
                "Heartbeats of podha's leader over a challenge the agent did not issue or already \
                 took.",
            )?,
        )?;
        let unverified = register(
            &registry,
            IntCounter::new(
                "podha_agent_peer_answers_unverified_total",
                "Peer answers not signed by the peer's key, counted as no answer.",
            )?,
        )?;
        Ok(Self {
            registry,
            refused,
            stale,
            unverified,
        })
    }
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

/// The counters in Prometheus' text format.
pub fn render() -> String {
    TextEncoder::new()
        .encode_to_string(&COUNTERS.registry.gather())
        .unwrap_or_default()
}
