//! What must hold after each trial, checked on what was recorded (pure):
//! - `replacement-running` (a trial expected to move the pod): a replacement runs on another
//!   node with its volumes attached there;
//! - `held` (a trial expected to hold): podha took no action on the node and the pod stayed,
//!   for the whole hold;
//! - `bystanders-kept`: every pod on the node that podha must not move kept its object;
//! - `taint-removed`: after the node was restored, it is Ready and podha's taint is gone;
//! - `no-split-brain` and `no-lost-writes`, with `--data-check`: the storage saw no write of an
//!   old writer after the new one's first, and holds every write a writer was told succeeded;
//! - `check-passes`, with `--check`: the workload's own check passed after the trial.

use std::time::Duration;

use serde::Serialize;

use super::data::DataCheck;
use super::own_check::CheckRun;
use super::preflight::Bystander;
use super::timeline::Timeline;

/// What podha should do about a fault: move the pod, or hold (not act) because the fault is
/// one it must not tell from a live node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    #[default]
    Moved,
    Held,
}

/// One trial as recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct TrialRecord {
    /// 1-based.
    pub trial: usize,
    pub expect: Expect,
    /// `namespace/name` of the pod the fault was aimed at.
    pub pod: String,
    /// The policy that would move it.
    pub policy: String,
    /// The fault command as run.
    pub fault_command: String,
    pub timeline: Timeline,
    /// Pods on the node podha must not move, before the fault.
    pub bystanders: Vec<Bystander>,
    /// Those of them whose object was gone (or replaced) when the failover ended.
    pub lost: Vec<Bystander>,
    /// `None` when no restore command was given.
    pub restore: Option<Restore>,
    /// `None` when no data check was asked for.
    pub data: Option<DataCheck>,
    /// The workload's own check (`--check`), before the fault and after the trial.
    pub checks: Vec<CheckRun>,
}

/// What was seen after the restore command ran, from when it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    pub command: String,
    /// When the node was first seen Ready.
    pub node_ready: Option<Duration>,
    /// When the node was first seen Ready without podha's taint.
    pub taint_gone: Option<Duration>,
    pub waited: Duration,
    /// podha's taint still on the node when the wait ended (key), if any.
    pub remaining_taint: Option<String>,
}

/// A violated invariant and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub invariant: &'static str,
    pub reason: String,
}

/// The invariants `record` violates (empty when all hold).
pub fn check(record: &TrialRecord) -> Vec<Violation> {
    let mut out = Vec::new();
    let t = &record.timeline;
    match record.expect {
        Expect::Moved => out.extend(moved_violation(record)),
        Expect::Held => out.extend(held_violation(record)),
    }
    for lost in &record.lost {
        out.push(Violation {
            invariant: "bystanders-kept",
            reason: format!(
                "pod {}/{} (uid {}) on {}, which podha must not move ({}), lost its object",
                lost.namespace, lost.name, lost.uid, t.node, lost.why
            ),
        });
    }
    if let Some(restore) = &record.restore
        && restore.taint_gone.is_none()
    {
        let waited = restore.waited.as_secs_f64();
        let reason = match (&restore.remaining_taint, restore.node_ready) {
            (Some(taint), _) => format!(
                "podha's taint {taint} was still on {} {waited:.0}s after the restore",
                t.node
            ),
            (None, None) => format!(
                "{} was not Ready within {waited:.0}s after the restore, so podha's taint \
                 removal could not be checked",
                t.node
            ),
            (None, Some(_)) => format!("{} never seen Ready without podha's taint", t.node),
        };
        out.push(Violation {
            invariant: "taint-removed",
            reason,
        });
    }
    if let Some(data) = &record.data {
        out.extend(data_violations(data));
    }
    for failed in record.checks.iter().filter(|c| !c.passed()) {
        out.push(Violation {
            invariant: "check-passes",
            reason: failed.summary(),
        });
    }
    out
}

fn moved_violation(record: &TrialRecord) -> Option<Violation> {
    let t = &record.timeline;
    match (&t.target, t.recovered) {
        (Some(target), Some(_)) if *target != t.node => None,
        _ => Some(Violation {
            invariant: "replacement-running",
            reason: format!(
                "no replacement of {} was Running on another node with its volumes attached \
                 within {:.0}s of the fault (last step seen: {})",
                record.pod,
                t.waited.as_secs_f64(),
                t.steps.last().map_or("none", |s| s.what.as_str()),
            ),
        }),
    }
}

/// podha's first visible action (its taint or fence, its request for a fence, its NotReady
/// mark, the deletion) or a replacement, on a trial that should have held.
fn held_violation(record: &TrialRecord) -> Option<Violation> {
    let t = &record.timeline;
    let acted = t.hold_broken()?;
    Some(Violation {
        invariant: "held",
        reason: format!(
            "podha acted on {} {:.1}s after the fault ({}), where it should have held {}",
            t.node,
            acted.at.as_secs_f64(),
            acted.what,
            record.pod
        ),
    })
}

/// The write invariants, from the storage's report; without a report both are violated.
fn data_violations(data: &DataCheck) -> Vec<Violation> {
    let mut out = Vec::new();
    match &data.result {
        Ok(report) => {
            if !report.split_brain_writes.is_empty() {
                out.push(Violation {
                    invariant: "no-split-brain",
                    reason: format!(
                        "the storage accepted {} write(s) from an old writer after the new \
                         one's first (`{}`)",
                        report.split_brain_writes.len(),
                        data.command
                    ),
                });
            }
            if !report.lost_acknowledged_writes.is_empty() {
                out.push(Violation {
                    invariant: "no-lost-writes",
                    reason: format!(
                        "{} acknowledged write(s) are not in the storage (`{}`)",
                        report.lost_acknowledged_writes.len(),
                        data.command
                    ),
                });
            }
        }
        Err(why) => {
            for invariant in ["no-split-brain", "no-lost-writes"] {
                out.push(Violation {
                    invariant,
                    reason: format!("the data check `{}` gave no report: {why}", data.command),
                });
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::chaos::timeline::Step;

    pub(crate) fn recorded(trial: usize, recovered: Option<u64>) -> TrialRecord {
        let secs = Duration::from_secs;
        let steps = [("taint", 14), ("deleted", 15), ("detached", 17)]
            .into_iter()
            .chain(recovered.map(|r| ("running", r)))
            .map(|(key, at)| Step {
                key,
                what: format!("{key} seen"),
                at: secs(at),
            })
            .collect();
        TrialRecord {
            trial,
            expect: Expect::Moved,
            pod: "shop/db-0".into(),
            policy: "p".into(),
            fault_command: "docker kill n1".into(),
            timeline: Timeline {
                fault: "docker kill n1".into(),
                node: "n1".into(),
                target: recovered.map(|_| "n2".into()),
                steps,
                recovered: recovered.map(secs),
                waited: secs(recovered.unwrap_or(60)),
            },
            bystanders: Vec::new(),
            lost: Vec::new(),
            restore: Some(Restore {
                command: "docker start n1".into(),
                node_ready: Some(secs(5)),
                taint_gone: Some(secs(7)),
                waited: secs(7),
                remaining_taint: None,
            }),
            data: None,
            checks: Vec::new(),
        }
    }

    fn invariants(record: &TrialRecord) -> Vec<&'static str> {
        check(record).iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_trial_violates_nothing() {
        assert_eq!(check(&recorded(1, Some(25))), []);
        let mut no_restore = recorded(1, Some(25));
        no_restore.restore = None;
        assert_eq!(check(&no_restore), [], "no restore: nothing to check");
    }

    /// A trial that should hold, followed for 60 s, in which only `steps` were seen.
    pub(crate) fn held(trial: usize, steps: &[(&'static str, u64)]) -> TrialRecord {
        let mut r = recorded(trial, None);
        r.expect = Expect::Held;
        r.timeline.steps = steps
            .iter()
            .map(|&(key, at)| Step {
                key,
                what: format!("{key} seen"),
                at: Duration::from_secs(at),
            })
            .collect();
        r
    }

    #[test]
    fn a_trial_that_should_hold_passes_when_podha_takes_no_action() {
        // The control plane's own NotReady marks are not podha's.
        assert_eq!(
            invariants(&held(1, &[("notready", 40), ("kcm-marked", 41)])),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn any_action_of_podha_or_a_replacement_breaks_a_hold() {
        for (steps, first) in [
            (
                &[("notready", 40), ("taint", 45), ("deleted", 46)][..],
                "taint seen",
            ),
            (&[("marked", 30)][..], "marked seen"),
            (&[("fenced", 50)][..], "fenced seen"),
            (
                &[("fence-requested", 35), ("fenced", 50)][..],
                "fence-requested seen",
            ),
            (&[("scheduled", 20), ("deleted", 25)][..], "scheduled seen"),
        ] {
            let record = held(1, steps);
            let violations = check(&record);
            assert_eq!(invariants(&record), ["held"], "{steps:?}");
            assert!(
                violations[0].reason.contains(first),
                "{}",
                violations[0].reason
            );
            assert!(
                violations[0].reason.contains("on n1"),
                "{}",
                violations[0].reason
            );
        }
        // A move where a hold was expected is not also a missing replacement.
        let mut moved = held(1, &[("taint", 14), ("deleted", 15), ("running", 25)]);
        moved.timeline.recovered = Some(Duration::from_secs(25));
        moved.timeline.target = Some("n2".into());
        assert_eq!(invariants(&moved), ["held"]);
    }

    fn data(json: Result<&str, &str>) -> Option<DataCheck> {
        Some(DataCheck {
            command: "podha-csi check".into(),
            result: match json {
                Ok(text) => crate::chaos::data::parse(text),
                Err(why) => Err(crate::chaos::data::Error::NotRun(why.to_string())),
            },
        })
    }

    #[test]
    fn the_data_checks_arrays_are_the_write_invariants() {
        let mut r = recorded(1, Some(25));
        r.data = data(Ok(
            r#"{"split_brain_writes":[],"lost_acknowledged_writes":[]}"#,
        ));
        assert_eq!(invariants(&r), Vec::<&str>::new());
        r.data = data(Ok(
            r#"{"split_brain_writes":[{}],"lost_acknowledged_writes":[]}"#,
        ));
        assert_eq!(invariants(&r), ["no-split-brain"]);
        r.data = data(Ok(
            r#"{"split_brain_writes":[],"lost_acknowledged_writes":[{},{}]}"#,
        ));
        let v = check(&r);
        assert_eq!(v[0].invariant, "no-lost-writes");
        assert!(v[0].reason.starts_with("2 acknowledged"), "{}", v[0].reason);
        r.data = data(Err("it failed (exit code 2): no such volume"));
        assert_eq!(invariants(&r), ["no-split-brain", "no-lost-writes"]);
        assert!(check(&r)[0].reason.contains("no such volume"));
    }

    #[test]
    fn a_failed_check_after_the_trial_is_a_violation_that_quotes_it() {
        use crate::chaos::own_check::When;
        let run = |result: Result<&str, &str>| CheckRun {
            when: When::After,
            command: "check.sh --namespace shop".into(),
            result: result.map(str::to_string).map_err(str::to_string),
            took: Duration::from_secs(2),
        };
        let mut r = recorded(1, Some(25));
        r.checks = vec![run(Ok("verdict lost=0"))];
        assert_eq!(invariants(&r), Vec::<&str>::new());
        r.checks.push(run(Err(
            "command failed (exit code 1): 2 transactions lost",
        )));
        let v = check(&r);
        assert_eq!(invariants(&r), ["check-passes"]);
        assert!(
            v[0].reason.contains("after the trial FAILED")
                && v[0].reason.contains("2 transactions lost"),
            "{v:?}"
        );
    }

    #[test]
    fn no_replacement_or_one_on_the_same_node_is_a_violation() {
        let not = recorded(1, None);
        let v = check(&not);
        assert_eq!(invariants(&not), ["replacement-running"]);
        assert!(
            v[0].reason.contains("within 60s") && v[0].reason.contains("detached seen"),
            "{v:?}"
        );
        let mut same = recorded(1, Some(25));
        same.timeline.target = Some("n1".into());
        assert_eq!(invariants(&same), ["replacement-running"]);
    }

    #[test]
    fn a_lost_bystander_is_named() {
        let mut r = recorded(1, Some(25));
        let decoy = Bystander {
            namespace: "shop".into(),
            name: "decoy".into(),
            uid: "u1".into(),
            why: "no PodHAPolicy selects it; NoControllerOwner".into(),
        };
        r.bystanders = vec![decoy.clone()];
        assert_eq!(check(&r), []);
        r.lost = vec![decoy];
        let v = check(&r);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].invariant, "bystanders-kept");
        assert!(v[0].reason.contains("shop/decoy"), "{v:?}");
        assert!(v[0].reason.contains("NoControllerOwner"), "{v:?}");
    }

    #[test]
    fn a_taint_left_behind_or_a_node_that_never_came_back_is_a_violation() {
        let mut r = recorded(1, Some(25));
        r.restore = Some(Restore {
            command: "docker start n1".into(),
            node_ready: Some(Duration::from_secs(5)),
            taint_gone: None,
            waited: Duration::from_secs(180),
            remaining_taint: Some("node.kubernetes.io/out-of-service".into()),
        });
        let v = check(&r);
        assert_eq!(invariants(&r), ["taint-removed"]);
        assert!(
            v[0].reason
                .contains("node.kubernetes.io/out-of-service was still on n1 180s"),
            "{v:?}"
        );
        r.restore = Some(Restore {
            node_ready: None,
            remaining_taint: None,
            ..r.restore.clone().unwrap()
        });
        assert!(check(&r)[0].reason.contains("not Ready within 180s"));
    }
}
