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

/// Reads an acknowledgement file; a missing one is empty.
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
    text.lines()
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
    use crate::checker::check;
    use crate::store::{AccessMode, NewVolume, Store};

    #[tokio::test]
    async fn the_writer_records_acknowledged_writes_and_counts_refused_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("san")).unwrap();
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
