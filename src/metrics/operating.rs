//! Metrics for operating podha itself rather than for failovers: whether this replica leads,
//! whether its caches are synced, how often a watch broke and listed everything again (podha is
//! blind meanwhile), the build, and the process (CPU, memory, file descriptors).

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::register;
use crate::view::Watch;

#[derive(Clone, Debug)]
pub struct Operating {
    leader: IntGauge,
    cache_synced: IntGauge,
    watch_restarts: IntCounterVec,
    agents_unreachable: IntGauge,
    agents_peers_unreachable: IntGauge,
}

impl Operating {
    /// Registers the families, with `podha_build_info`, the restart counter of every
    /// [`Watch`] at 0 and, on Linux, the process collector, in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let leader = register(
            registry,
            IntGauge::new(
                "podha_leader",
                "1 if this replica holds the leader lease and performs writes, 0 otherwise.",
            )?,
        )?;
        let cache_synced = register(
            registry,
            IntGauge::new(
                "podha_cache_synced",
                "1 once every watch cache has completed its initial list, 0 before.",
            )?,
        )?;
        let watch_restarts = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "podha_watch_restarts_total",
                    "Watches that failed and were started again with a full list, by resource; \
                     while a node or lease watch re-lists, podha does not judge nodes.",
                ),
                &["resource"],
            )?,
        )?;
        let agents_unreachable = register(
            registry,
            IntGauge::new(
                "podha_agents_unreachable",
                "Ready nodes advertising a podha agent that the leader has not heard for 30s \
                 (its port blocked, or the agent not running): fencing.proof Agent cannot \
                 prove them fenced by silence. 0 on followers.",
            )?,
        )?;
        let agents_peers_unreachable = register(
            registry,
            IntGauge::new(
                "podha_agents_peers_unreachable",
                "Nodes whose agent says it cannot reach half of its peers (its Lease's \
                 podha.io/agent-peers-unreachable): podha holds them, and fencing.proof Agent \
                 proves no fence of them. 0 on followers.",
            )?,
        )?;
        for watch in Watch::ALL {
            watch_restarts.with_label_values(&[watch.as_str()]);
        }
        let build_info = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_build_info",
                    "Always 1; the labels say which podha build runs.",
                ),
                &["version", "commit", "build_date"],
            )?,
        )?;
        use crate::build_info::{BUILD_DATE, GIT_COMMIT, VERSION};
        build_info
            .with_label_values(&[VERSION, GIT_COMMIT, BUILD_DATE])
            .set(1);
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            leader,
            cache_synced,
            watch_restarts,
            agents_unreachable,
            agents_peers_unreachable,
        })
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn set_cache_synced(&self, synced: bool) {
        self.cache_synced.set(i64::from(synced));
    }

    pub fn set_agents_unreachable(&self, count: usize) {
        self.agents_unreachable
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn set_agents_peers_unreachable(&self, count: usize) {
        self.agents_peers_unreachable
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn inc_watch_restarts(&self, watch: Watch) {
        self.watch_restarts
            .with_label_values(&[watch.as_str()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_process_metrics_are_exported() {
        let registry = Registry::new();
        let m = Operating::register(&registry).expect("register");
        m.inc_watch_restarts(Watch::Lease);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        use crate::build_info::{BUILD_DATE, GIT_COMMIT, VERSION};
        let build_info = format!(
            "podha_build_info{{build_date=\"{BUILD_DATE}\",commit=\"{GIT_COMMIT}\",version=\"{VERSION}\"}} 1"
        );
        assert!(text.contains(&build_info), "{text}");
        assert!(text.contains(r#"podha_watch_restarts_total{resource="leases"} 1"#));
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }
}
