//! The writer workload: writes a numbered record to a volume at a steady pace, through the node
//! it runs on, and keeps its own list of acknowledged writes (outside the volume) for the
//! checker. The `podha-csi write` command runs it in a pod; the sim runs the same loop for pods
//! on kwok nodes, which have no containers.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::checker::Ack;
use crate::store::{self, Error, Volume};

#[derive(Debug, Clone)]
pub struct Writer {
    pub volume: Volume,
    pub node: String,
    pub pod_uid: String,
    /// Where acknowledged writes are appended, one JSON line each.
    pub acks: PathBuf,
    pub interval: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub acknowledged: u64,
    pub refused: u64,
}

impl Writer {
    /// One write with sequence number `seq`: `Ok(true)` acknowledged, `Ok(false)` refused.
    pub fn write_once(&self, seq: u64) -> store::Result<bool> {
        match self.volume.write(&self.node, &self.pod_uid, seq) {
            Ok(entry) => {
                append_ack(&self.acks, &Ack::from(&entry))?;
                Ok(true)
            }
            Err(Error::Fenced { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes until `stop` completes, or `count` writes were attempted. A refused write is
    /// retried with the next number, as an application keeps issuing I/O.
    pub async fn run(
        &self,
        count: Option<u64>,
        stop: impl std::future::Future<Output = ()>,
    ) -> store::Result<WriterStats> {
        let mut stats = WriterStats::default();
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        let mut seq = 0;
        while count.is_none_or(|count| seq < count) {
            tokio::select! {
                _ = &mut stop => break,
                _ = ticker.tick() => {}
            }
            seq += 1;
            let writer = self.clone();
            let acknowledged = tokio::task::spawn_blocking(move || writer.write_once(seq))
                .await
                .map_err(|e| Error::Io {
                    path: self.volume.dir().to_path_buf(),
                    source: std::io::Error::other(e),
                })??;
            if acknowledged {
                stats.acknowledged += 1;
            } else {
                stats.refused += 1;
            }
        }
        Ok(stats)
    }
}

pub fn append_ack(path: &Path, ack: &Ack) -> store::Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut line = serde_json::to_vec(ack).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    line.push(b'\n');
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    file.write_all(&line).map_err(io)
}

/// The acknowledgement files `<dir>/<pod uid>.acks` of every pod that wrote to a volume, by its
/// log, in order of first appearance.
pub fn acks_files_of(log: &[store::LogEntry], dir: &Path) -> Vec<PathBuf> {
    let mut pods: Vec<&str> = Vec::new();
    for entry in log {
        if !pods.contains(&entry.pod_uid.as_str()) {
            pods.push(&entry.pod_uid);
        }
    }
    pods.iter()
        .map(|pod| dir.join(format!("{pod}.acks")))
        .collect()
}

/// Reads an acknowledgement file; a missing one is empty. A last line without its newline is
/// an acknowledgement still being appended, and is left for the next read.
pub fn read_acks(path: &Path) -> store::Result<Vec<Ack>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).map_err(|source| Error::Json {
                path: path.to_path_buf(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{AcksFrom, check, check_volume};
    use crate::store::{AccessMode, NewVolume, Store};

    fn published_volume(san: &Path) -> Volume {
        let store = Store::new(san).unwrap();
        let new = NewVolume {
            id: "pvc-1",
            driver: "rwo.sim.podha.io",
            capacity_bytes: 1,
            access_mode: AccessMode::SingleNodeWriter,
            fencing: true,
        };
        store.create_volume(&new).unwrap();
        let volume = store.volume("pvc-1").unwrap();
        volume.publish("a").unwrap();
        volume
    }

    #[test]
    fn a_volume_checked_while_its_writer_writes_has_lost_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer {
            volume: published_volume(&dir.path().join("san")),
            node: "a".into(),
            pod_uid: "p1".into(),
            acks: dir.path().join("acks").join("p1.acks"),
            interval: Duration::ZERO,
        };
        std::fs::create_dir(dir.path().join("acks")).unwrap();
        let writes = 3000;
        let writing = {
            let writer = writer.clone();
            std::thread::spawn(move || {
                for seq in 1..=writes {
                    assert!(writer.write_once(seq).unwrap());
                }
            })
        };
        let acks_dir = dir.path().join("acks");
        // Checkers on several threads, so some read between a write and its acknowledgement.
        let checks: u64 = std::thread::scope(|scope| {
            let checkers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let mut checks = 0;
                        while !writing.is_finished() {
                            let report =
                                check_volume(&writer.volume, AcksFrom::Dir(&acks_dir)).unwrap();
                            assert!(report.clean(), "check {checks}: {report:?}");
                            checks += 1;
                        }
                        checks
                    })
                })
                .collect();
            checkers.into_iter().map(|c| c.join().unwrap()).sum()
        });
        writing.join().unwrap();
        let report = check_volume(&writer.volume, AcksFrom::Dir(&acks_dir)).unwrap();
        assert!(report.clean(), "{report:?}");
        assert_eq!(report.accepted_writes, writes as usize);
        assert!(checks > 0, "the writer finished before the first check");
    }

    #[test]
    fn an_acknowledgement_still_being_appended_is_left_for_the_next_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1.acks");
        let ack = |seq| Ack {
            node: "a".into(),
            pod_uid: "p1".into(),
            seq,
        };
        append_ack(&path, &ack(1)).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"node":"a","pod_"#).unwrap();
        assert_eq!(read_acks(&path).unwrap(), vec![ack(1)]);
        file.write_all(b"uid\":\"p1\",\"seq\":2}\n").unwrap();
        assert_eq!(read_acks(&path).unwrap(), vec![ack(1), ack(2)]);
    }

    #[tokio::test]
    async fn the_writer_records_acknowledged_writes_and_counts_refused_ones() {
        let dir = tempfile::tempdir().unwrap();
        let volume = published_volume(&dir.path().join("san"));
        let writer = Writer {
            volume: volume.clone(),
            node: "a".into(),
            pod_uid: "p1".into(),
            acks: dir.path().join("acks"),
            interval: Duration::from_millis(1),
        };
        let stats = writer.run(Some(3), std::future::pending()).await.unwrap();
        assert_eq!(
            stats,
            WriterStats {
                acknowledged: 3,
                refused: 0
            }
        );
        volume.unpublish("a").unwrap();
        let stats = writer.run(Some(2), std::future::pending()).await.unwrap();
        assert_eq!(
            stats,
            WriterStats {
                acknowledged: 0,
                refused: 2
            }
        );
        let acks = read_acks(&writer.acks).unwrap();
        assert_eq!(
            acks.iter().map(|a| a.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        let report = check(&volume.log().unwrap(), &acks);
        assert!(report.clean(), "{report:?}");
        assert_eq!((report.accepted_writes, report.refused_writes), (3, 2));
    }
}
