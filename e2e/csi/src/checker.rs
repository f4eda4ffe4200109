//! Reads a volume's write log (and the writers' acknowledgements) and reports what a failover
//! did to the data:
//!
//! - a **split-brain write** is an accepted write by a writer after a newer writer's first
//!   accepted write: two nodes wrote the volume in turn, interleaved. A writer is a (node, pod)
//!   pair; writers are ordered by their first accepted write.
//! - a **lost acknowledged write** is a write a writer was told succeeded that the volume's log
//!   does not hold as accepted.
//!
//! A volume may be checked while its writer still writes: [`check_volume`] reads the
//! acknowledgements before the log, so every acknowledgement it read names a write the log
//! already holds (a writer logs a write before it is acknowledged).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::{self, LogEntry, Volume};
use crate::writer;

/// A write the writer was told succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ack {
    pub node: String,
    pub pod_uid: String,
    pub seq: u64,
}

impl From<&LogEntry> for Ack {
    fn from(entry: &LogEntry) -> Self {
        Ack {
            node: entry.node.clone(),
            pod_uid: entry.pod_uid.clone(),
            seq: entry.seq,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub accepted_writes: usize,
    /// Writes the store refused (fenced).
    pub refused_writes: usize,
    /// Writers (node, pod) in the order of their first accepted write.
    pub writers: Vec<(String, String)>,
    pub split_brain_writes: Vec<LogEntry>,
    pub lost_acknowledged_writes: Vec<Ack>,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.split_brain_writes.is_empty() && self.lost_acknowledged_writes.is_empty()
    }
}

/// Where the acknowledgements of a volume's writers are.
#[derive(Debug, Clone, Copy)]
pub enum AcksFrom<'a> {
    /// These files.
    Files(&'a [PathBuf]),
    /// `<dir>/<pod uid>.acks` for every pod the volume's log names.
    Dir(&'a Path),
}

/// Checks `volume` against its writers' acknowledgements, writers still running or not. The
/// log is read after the acknowledgements: read the other way round, a write acknowledged
/// between the two reads would be reported lost.
pub fn check_volume(volume: &Volume, acks: AcksFrom<'_>) -> store::Result<Report> {
    let files = match acks {
        AcksFrom::Files(files) => files.to_vec(),
        AcksFrom::Dir(dir) => writer::acks_files_of(&volume.log()?, dir),
    };
    let mut all = Vec::new();
    for path in &files {
        all.extend(writer::read_acks(path)?);
    }
    Ok(check(&volume.log()?, &all))
}

/// Checks one volume's log against the acknowledgements its writers received.
pub fn check(log: &[LogEntry], acks: &[Ack]) -> Report {
    let mut report = Report::default();
    // Position of each writer's first accepted write.
    let mut first_write: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    // The newest writer so far: the one whose first write came last.
    let mut newest_first: Option<usize> = None;
    for (position, entry) in log.iter().enumerate() {
        if !entry.accepted {
            report.refused_writes += 1;
            continue;
        }
        report.accepted_writes += 1;
        let writer = (entry.node.as_str(), entry.pod_uid.as_str());
        let first = *first_write.entry(writer).or_insert_with(|| {
            report
                .writers
                .push((entry.node.clone(), entry.pod_uid.clone()));
            position
        });
        if first == position {
            newest_first = Some(position);
        } else if newest_first.is_some_and(|newest| newest > first) {
            report.split_brain_writes.push(entry.clone());
        }
    }
    let logged: HashSet<Ack> = log.iter().filter(|e| e.accepted).map(Ack::from).collect();
    report.lost_acknowledged_writes = acks
        .iter()
        .filter(|ack| !logged.contains(ack))
        .cloned()
        .collect();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(node: &str, pod: &str, seq: u64, accepted: bool) -> LogEntry {
        LogEntry {
            node: node.into(),
            pod_uid: pod.into(),
            seq,
            time_us: seq,
            accepted,
        }
    }

    fn ack(node: &str, pod: &str, seq: u64) -> Ack {
        Ack {
            node: node.into(),
            pod_uid: pod.into(),
            seq,
        }
    }

    #[test]
    fn a_clean_handover_reports_nothing() {
        let log = [
            write("a", "p1", 1, true),
            write("a", "p1", 2, true),
            write("b", "p2", 1, true),
            write("b", "p2", 2, true),
        ];
        let acks = [ack("a", "p1", 1), ack("a", "p1", 2), ack("b", "p2", 1)];
        let report = check(&log, &acks);
        assert!(report.clean(), "{report:?}");
        assert_eq!(report.accepted_writes, 4);
        assert_eq!(
            report.writers,
            vec![("a".into(), "p1".into()), ("b".into(), "p2".into())]
        );
    }

    #[test]
    fn old_writes_after_the_new_writers_first_are_split_brain() {
        let log = [
            write("a", "p1", 1, true),
            write("b", "p2", 1, true),
            write("a", "p1", 2, true),
            write("b", "p2", 2, true),
            write("a", "p1", 3, true),
        ];
        let report = check(&log, &[]);
        let seqs: Vec<(String, u64)> = report
            .split_brain_writes
            .iter()
            .map(|e| (e.node.clone(), e.seq))
            .collect();
        assert_eq!(seqs, vec![("a".to_string(), 2), ("a".to_string(), 3)]);
    }

    #[test]
    fn refused_writes_are_counted_not_split_brain() {
        let log = [
            write("a", "p1", 1, true),
            write("b", "p2", 1, true),
            write("a", "p1", 2, false),
            write("a", "p1", 3, false),
        ];
        let report = check(&log, &[ack("a", "p1", 1)]);
        assert!(report.clean(), "{report:?}");
        assert_eq!(report.refused_writes, 2);
    }

    #[test]
    fn acknowledged_writes_missing_from_the_log_are_lost() {
        let log = [write("a", "p1", 1, true), write("a", "p1", 2, false)];
        let report = check(
            &log,
            &[ack("a", "p1", 1), ack("a", "p1", 2), ack("a", "p1", 3)],
        );
        assert_eq!(
            report.lost_acknowledged_writes,
            vec![ack("a", "p1", 2), ack("a", "p1", 3)]
        );
    }

    #[test]
    fn a_new_pod_on_the_old_node_is_a_new_writer() {
        // a → b → a again (a new pod): the first pod's late write is split-brain, the new pod's
        // writes after b stopped are not.
        let log = [
            write("a", "p1", 1, true),
            write("b", "p2", 1, true),
            write("a", "p3", 1, true),
            write("a", "p3", 2, true),
        ];
        let report = check(&log, &[]);
        assert!(report.split_brain_writes.is_empty(), "{report:?}");
        let late = [
            write("a", "p1", 1, true),
            write("b", "p2", 1, true),
            write("a", "p3", 1, true),
            write("b", "p2", 2, true),
        ];
        let report = check(&late, &[]);
        assert_eq!(report.split_brain_writes, vec![write("b", "p2", 2, true)]);
    }
}
