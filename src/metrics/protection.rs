//! How many of each policy's pods podha would fail over now (`podha_pods`), from the coverage
//! the decision loop works out (`crate::protection::coverage`). Set by the leader only.

use std::collections::{BTreeSet, HashMap};

use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntGaugeVec, Opts, Registry};

use super::{POLICY, register, remove_policy};
use crate::protection::Coverage;

const PROTECTED: &str = "protected";
const REASON: &str = "reason";

/// Upper bounds of the working-out time histogram, in seconds: a few pods take microseconds,
/// ten thousand with volumes tens of milliseconds.
const WORK_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Clone, Debug)]
pub struct Protection {
    pods: IntGaugeVec,
    work: Histogram,
}

impl Protection {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let pods = register(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "podha_pods",
                    "Pods a policy selects that mount a PersistentVolumeClaim, by whether podha \
                     would fail them over if their node died now (protected=\"true\", \
                     reason=\"\") or not (protected=\"false\", reason: the first rule they fail, \
                     as podha explain names it). Set by the leader only.",
                ),
                &[POLICY, PROTECTED, REASON],
            )?,
        )?;
        let work = register(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "podha_coverage_duration_seconds",
                    "Time the decision loop took to work out, for every policy, which pods podha \
                     would fail over now (podha_pods): on changes, at most every 5s.",
                )
                .buckets(WORK_BUCKETS.to_vec()),
            )?,
        )?;
        Ok(Self { pods, work })
    }

    pub fn observe_work(&self, took: std::time::Duration) {
        self.work.observe(took.as_secs_f64());
    }

    /// `policy`'s counts now; a reason that keeps no pod any more is dropped.
    pub fn set_pods(&self, policy: &str, coverage: &Coverage) {
        let set = |protected: &str, reason: &str, pods: usize| {
            self.pods
                .with_label_values(&[policy, protected, reason])
                .set(i64::try_from(pods).unwrap_or(i64::MAX));
        };
        set("true", "", coverage.protected);
        let reasons: BTreeSet<&str> = coverage.reasons.iter().map(|(r, _)| r.as_str()).collect();
        for (reason, pods) in &coverage.reasons {
            set("false", reason.as_str(), *pods);
        }
        for family in self.pods.collect() {
            for metric in family.get_metric() {
                let labels: HashMap<&str, &str> = metric
                    .get_label()
                    .iter()
                    .map(|pair| (pair.name(), pair.value()))
                    .collect();
                let stale = labels.get(POLICY) == Some(&policy)
                    && labels.get(PROTECTED) == Some(&"false")
                    && labels.get(REASON).is_none_or(|r| !reasons.contains(r));
                if stale {
                    // Just collected: only a concurrent removal could have taken it first.
                    let _ = self.pods.remove(&labels);
                }
            }
        }
    }

    /// A follower counts nothing: only the leader's counts are current.
    pub fn clear(&self) {
        self.pods.reset();
    }

    pub(super) fn forget_policy(&self, policy: &str) {
        remove_policy(&self.pods, policy);
    }
}
