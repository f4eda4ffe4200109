//! How many of each policy's pods podha would fail over now (`podha_pods`), from the coverage
//! the decision loop works out (`crate::protection::coverage`). Set by the leader only.

use std::collections::{BTreeMap, BTreeSet};

use prometheus::{Histogram, HistogramOpts, IntGaugeVec, Opts, Registry};

use super::{POLICY, register, remove_policy, remove_series};
use crate::protection::Coverage;

const PROTECTED: &str = "protected";
const REASON: &str = "reason";
/// The reason of protected pods podha moves only on the 6-minute path.
const SLOW: &str = "OutOfServiceTaintRefused";

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
                     would fail them over if their node died now (protected=\"true\": \
                     reason=\"\" on the fast path, reason=\"OutOfServiceTaintRefused\" only \
                     after the attach/detach controller's 6-minute wait, the taint being \
                     refused on their node) or not (protected=\"false\", reason: the first \
                     rule they fail, as podha explain names it). Set by the leader only.",
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

    /// Every policy's counts now; the series of a policy gone (or unreadable) and of a reason
    /// that keeps no pod any more are dropped.
    pub fn set_pods(&self, by_policy: &BTreeMap<String, Coverage>) {
        let mut current: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
        for (policy, coverage) in by_policy {
            current.insert((policy, "true", ""));
            if coverage.slow > 0 {
                current.insert((policy, "true", SLOW));
            }
            for (reason, _) in &coverage.reasons {
                current.insert((policy, "false", reason.as_str()));
            }
        }
        remove_series(&self.pods, |labels| {
            let label = |name| labels.get(name).copied().unwrap_or_default();
            !current.contains(&(label(POLICY), label(PROTECTED), label(REASON)))
        });
        let set = |policy: &str, protected: &str, reason: &str, pods: usize| {
            self.pods
                .with_label_values(&[policy, protected, reason])
                .set(i64::try_from(pods).unwrap_or(i64::MAX));
        };
        for (policy, coverage) in by_policy {
            set(policy, "true", "", coverage.protected - coverage.slow);
            if coverage.slow > 0 {
                set(policy, "true", SLOW, coverage.slow);
            }
            for (reason, pods) in &coverage.reasons {
                set(policy, "false", reason.as_str(), *pods);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eligibility::SkipReason;
    use crate::protection::Unprotected;

    fn series(p: &Protection) -> Vec<String> {
        let registry = Registry::new();
        registry
            .register(Box::new(p.pods.clone()))
            .expect("register");
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode")
            .lines()
            .filter(|l| l.starts_with("podha_pods{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_policy_gone_and_a_reason_that_keeps_no_pod_lose_their_series() {
        let p = Protection::register(&Registry::new()).expect("register");
        let opted_out = Unprotected::Ineligible(SkipReason::OptedOut);
        let coverage = |protected, reasons: Vec<(Unprotected, usize)>| Coverage {
            protected,
            unprotected: reasons.iter().map(|(_, n)| n).sum(),
            reasons,
            ..Coverage::default()
        };
        p.set_pods(&BTreeMap::from([
            ("a".to_string(), coverage(3, vec![(opted_out, 2)])),
            ("b".to_string(), coverage(0, vec![(Unprotected::DryRun, 4)])),
        ]));
        assert_eq!(series(&p).len(), 4, "{:?}", series(&p));
        p.set_pods(&BTreeMap::from([("a".to_string(), coverage(5, vec![]))]));
        assert_eq!(
            series(&p),
            ["podha_pods{policy=\"a\",protected=\"true\",reason=\"\"} 5"]
        );
    }

    /// Protected pods on the 6-minute path have a series of their own beside the fast ones,
    /// gone once none is left.
    #[test]
    fn protected_pods_on_the_six_minute_path_are_counted_apart() {
        let p = Protection::register(&Registry::new()).expect("register");
        let coverage = |protected, slow| Coverage {
            protected,
            slow,
            ..Coverage::default()
        };
        p.set_pods(&BTreeMap::from([("a".to_string(), coverage(5, 2))]));
        assert_eq!(
            series(&p),
            [
                "podha_pods{policy=\"a\",protected=\"true\",reason=\"\"} 3",
                "podha_pods{policy=\"a\",protected=\"true\",reason=\"OutOfServiceTaintRefused\"} 2",
            ]
        );
        p.set_pods(&BTreeMap::from([("a".to_string(), coverage(5, 0))]));
        assert_eq!(
            series(&p),
            ["podha_pods{policy=\"a\",protected=\"true\",reason=\"\"} 5"]
        );
    }
}
