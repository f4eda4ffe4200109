//! The backing store: one shared directory (the "SAN" every node reaches), one subdirectory per
//! volume. What a volume's directory holds:
//!
//! | file | what |
//! |---|---|
//! | `volume.json` | the volume's record: driver, size, access mode, fencing, publications |
//! | `writes.log` | one JSON line per write attempt through the store (see [`LogEntry`]) |
//! | `lock` | taken (flock) for every read-modify-write, from any process |
//!
//! A volume accepts a write only through a node it is published to (ControllerPublishVolume).
//! With fencing (the default) ControllerUnpublishVolume revokes the node's access at once, as
//! cloud block storage does; without it a node keeps the access it once had, as a shared
//! filesystem or iSCSI without reservations does. Refused writes are logged too, so they can be
//! counted.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

const RECORD: &str = "volume.json";
const LOG: &str = "writes.log";
const LOCK: &str = "lock";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume {0} not found")]
    NotFound(String),
    #[error("volume {id} exists with a different size or access mode")]
    Mismatch { id: String },
    #[error("volume {id} is published to {nodes:?}; its access mode allows one node")]
    PublishedElsewhere { id: String, nodes: Vec<String> },
    #[error("volume {id} is published at {targets:?}; its access mode allows one pod")]
    InUseByPod { id: String, targets: Vec<String> },
    #[error("volume {id} is still published to {nodes:?}")]
    StillPublished { id: String, nodes: Vec<String> },
    #[error("write to volume {id} through node {node} refused: not published there")]
    Fenced { id: String, node: String },
    #[error("invalid volume id {0:?}")]
    InvalidId(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The CSI access modes podha-csi supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessMode {
    /// ReadWriteOnce: one node.
    SingleNodeWriter,
    /// ReadWriteOncePod: one node, one pod.
    SingleNodeSingleWriter,
    /// ReadWriteMany: any number of nodes.
    MultiNodeMultiWriter,
}

impl AccessMode {
    fn single_node(self) -> bool {
        self != AccessMode::MultiNodeMultiWriter
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub driver: String,
    pub capacity_bytes: i64,
    pub access_mode: AccessMode,
    /// Whether ControllerUnpublishVolume revokes the node's access.
    pub fencing: bool,
    /// Nodes the volume is published to now.
    pub published: BTreeSet<String>,
    /// Every node the volume was ever published to (their access survives without fencing).
    pub ever_published: BTreeSet<String>,
    /// NodePublishVolume target paths per node.
    pub targets: BTreeMap<String, BTreeSet<String>>,
}

impl VolumeRecord {
    /// Whether a write through `node` reaches the volume.
    pub fn writable_through(&self, node: &str) -> bool {
        if self.fencing {
            self.published.contains(node)
        } else {
            self.ever_published.contains(node)
        }
    }
}

/// One write attempt, in the order the store serialised them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub node: String,
    pub pod_uid: String,
    pub seq: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    pub accepted: bool,
}

/// What [`Store::create_volume`] is asked for.
#[derive(Debug, Clone)]
pub struct NewVolume<'a> {
    pub id: &'a str,
    pub driver: &'a str,
    pub capacity_bytes: i64,
    pub access_mode: AccessMode,
    pub fencing: bool,
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io(&root))?;
        Ok(Store { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir_of(&self, id: &str) -> Result<PathBuf> {
        let valid = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !id.starts_with('.');
        if !valid {
            return Err(Error::InvalidId(id.to_string()));
        }
        Ok(self.root.join(id))
    }

    /// Creates a volume, or returns the existing one when it matches (CreateVolume is idempotent).
    pub fn create_volume(&self, new: &NewVolume<'_>) -> Result<VolumeRecord> {
        let dir = self.dir_of(new.id)?;
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let volume = Volume {
            id: new.id.to_string(),
            dir,
        };
        volume.update(|record| match record {
            Some(existing) => {
                let same = existing.driver == new.driver
                    && existing.capacity_bytes == new.capacity_bytes
                    && existing.access_mode == new.access_mode;
                if same {
                    Ok(existing.clone())
                } else {
                    Err(Error::Mismatch {
                        id: new.id.to_string(),
                    })
                }
            }
            None => Ok(VolumeRecord {
                id: new.id.to_string(),
                driver: new.driver.to_string(),
                capacity_bytes: new.capacity_bytes,
                access_mode: new.access_mode,
                fencing: new.fencing,
                published: BTreeSet::new(),
                ever_published: BTreeSet::new(),
                targets: BTreeMap::new(),
            }),
        })
    }

    /// The volume `id`, if it exists.
    pub fn volume(&self, id: &str) -> Result<Volume> {
        let dir = self.dir_of(id)?;
        if !dir.join(RECORD).is_file() {
            return Err(Error::NotFound(id.to_string()));
        }
        Ok(Volume {
            id: id.to_string(),
            dir,
        })
    }

    /// Deletes a volume; a missing one is already deleted. A published volume is refused.
    pub fn delete_volume(&self, id: &str) -> Result<()> {
        let volume = match self.volume(id) {
            Ok(volume) => volume,
            Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let record = volume.record()?;
        if !record.published.is_empty() {
            return Err(Error::StillPublished {
                id: id.to_string(),
                nodes: record.published.into_iter().collect(),
            });
        }
        fs::remove_dir_all(&volume.dir).map_err(io(&volume.dir))
    }

    /// The ids of every volume in the store.
    pub fn volume_ids(&self) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(io(&self.root))? {
            let entry = entry.map_err(io(&self.root))?;
            if entry.path().join(RECORD).is_file() {
                ids.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        ids.sort();
        Ok(ids)
    }
}

/// One volume's directory. Every method takes the volume's lock, so processes on every node see
/// one order of publications and writes.
#[derive(Debug, Clone)]
pub struct Volume {
    id: String,
    dir: PathBuf,
}

impl Volume {
    /// A volume seen through its directory, e.g. where a pod has it mounted.
    pub fn at(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        let record_path = dir.join(RECORD);
        let record =
            read_record(&record_path)?.ok_or_else(|| Error::NotFound(dir.display().to_string()))?;
        Ok(Volume { id: record.id, dir })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> Result<File> {
        let path = self.dir.join(LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        file.lock().map_err(io(&path))?;
        Ok(file)
    }

    /// Reads the record, lets `change` decide the new one, and writes it back, under the lock.
    fn update(
        &self,
        change: impl FnOnce(Option<&VolumeRecord>) -> Result<VolumeRecord>,
    ) -> Result<VolumeRecord> {
        let _lock = self.lock()?;
        let path = self.dir.join(RECORD);
        let current = read_record(&path)?;
        let next = change(current.as_ref())?;
        if current.as_ref() != Some(&next) {
            write_record(&path, &next)?;
        }
        Ok(next)
    }

    fn update_existing(
        &self,
        change: impl FnOnce(&mut VolumeRecord) -> Result<()>,
    ) -> Result<VolumeRecord> {
        self.update(|current| {
            let mut record = current
                .cloned()
                .ok_or_else(|| Error::NotFound(self.id.clone()))?;
            change(&mut record)?;
            Ok(record)
        })
    }

    pub fn record(&self) -> Result<VolumeRecord> {
        let _lock = self.lock()?;
        read_record(&self.dir.join(RECORD))?.ok_or_else(|| Error::NotFound(self.id.clone()))
    }

    /// ControllerPublishVolume: `node` gets access. Idempotent; a single-node volume published
    /// elsewhere is refused.
    pub fn publish(&self, node: &str) -> Result<VolumeRecord> {
        self.update_existing(|record| {
            let elsewhere: Vec<String> = record
                .published
                .iter()
                .filter(|n| *n != node)
                .cloned()
                .collect();
            if record.access_mode.single_node() && !elsewhere.is_empty() {
                return Err(Error::PublishedElsewhere {
                    id: record.id.clone(),
                    nodes: elsewhere,
                });
            }
            record.published.insert(node.to_string());
            record.ever_published.insert(node.to_string());
            Ok(())
        })
    }

    /// ControllerUnpublishVolume: `node` loses access (keeps it without fencing). Idempotent.
    pub fn unpublish(&self, node: &str) -> Result<VolumeRecord> {
        self.update_existing(|record| {
            record.published.remove(node);
            record.targets.remove(node);
            Ok(())
        })
    }

    /// NodePublishVolume at `target` on `node`. A ReadWriteOncePod volume takes one target.
    pub fn add_target(&self, node: &str, target: &str) -> Result<VolumeRecord> {
        self.update_existing(|record| {
            let others: Vec<String> = record
                .targets
                .iter()
                .flat_map(|(n, ts)| {
                    ts.iter()
                        .filter(move |t| !(n == node && *t == target))
                        .cloned()
                })
                .collect();
            if record.access_mode == AccessMode::SingleNodeSingleWriter && !others.is_empty() {
                return Err(Error::InUseByPod {
                    id: record.id.clone(),
                    targets: others,
                });
            }
            record
                .targets
                .entry(node.to_string())
                .or_default()
                .insert(target.to_string());
            Ok(())
        })
    }

    /// NodeUnpublishVolume at `target` on `node`. Idempotent.
    pub fn remove_target(&self, node: &str, target: &str) -> Result<VolumeRecord> {
        self.update_existing(|record| {
            if let Some(targets) = record.targets.get_mut(node) {
                targets.remove(target);
                if targets.is_empty() {
                    record.targets.remove(node);
                }
            }
            Ok(())
        })
    }

    /// A write of `seq` by pod `pod_uid` through `node`. Logged either way; refused (and an
    /// error) when the volume is not writable through that node.
    pub fn write(&self, node: &str, pod_uid: &str, seq: u64) -> Result<LogEntry> {
        let _lock = self.lock()?;
        let record =
            read_record(&self.dir.join(RECORD))?.ok_or_else(|| Error::NotFound(self.id.clone()))?;
        let entry = LogEntry {
            node: node.to_string(),
            pod_uid: pod_uid.to_string(),
            seq,
            time_us: now_us(),
            accepted: record.writable_through(node),
        };
        let path = self.dir.join(LOG);
        let mut line = serde_json::to_vec(&entry).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        log.write_all(&line).map_err(io(&path))?;
        log.sync_data().map_err(io(&path))?;
        if entry.accepted {
            Ok(entry)
        } else {
            Err(Error::Fenced {
                id: self.id.clone(),
                node: node.to_string(),
            })
        }
    }

    /// Every write attempt so far, in order.
    pub fn log(&self) -> Result<Vec<LogEntry>> {
        let _lock = self.lock()?;
        read_log(&self.dir.join(LOG))
    }
}

/// Reads a write log; a missing log is empty.
pub fn read_log(path: &Path) -> Result<Vec<LogEntry>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(path)(e)),
    };
    let mut entries = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        entries.push(serde_json::from_str(&line).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?);
    }
    Ok(entries)
}

fn read_record(path: &Path) -> Result<Option<VolumeRecord>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| Error::Json {
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

fn write_record(path: &Path, record: &VolumeRecord) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(record).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    fs::write(&tmp, bytes).map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("san")).unwrap();
        (dir, store)
    }

    fn new(id: &str, access_mode: AccessMode, fencing: bool) -> NewVolume<'_> {
        NewVolume {
            id,
            driver: "rwo.sim.podha.io",
            capacity_bytes: 1 << 20,
            access_mode,
            fencing,
        }
    }

    #[test]
    fn create_is_idempotent_and_refuses_a_different_volume_of_the_same_name() {
        let (_dir, store) = store();
        let first = store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, true))
            .unwrap();
        assert_eq!(
            store
                .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, true))
                .unwrap(),
            first
        );
        let other = store.create_volume(&new("pvc-1", AccessMode::MultiNodeMultiWriter, true));
        assert!(matches!(other, Err(Error::Mismatch { .. })), "{other:?}");
        assert_eq!(store.volume_ids().unwrap(), vec!["pvc-1".to_string()]);
    }

    #[test]
    fn ids_that_could_leave_the_store_are_refused() {
        let (_dir, store) = store();
        for id in ["", "../x", ".hidden", "a/b"] {
            assert!(
                matches!(store.volume(id), Err(Error::InvalidId(_))),
                "{id:?}"
            );
        }
        assert!(matches!(
            store.volume("pvc-missing"),
            Err(Error::NotFound(_))
        ));
    }

    #[test]
    fn a_single_node_volume_is_published_to_one_node_at_a_time() {
        let (_dir, store) = store();
        for mode in [
            AccessMode::SingleNodeWriter,
            AccessMode::SingleNodeSingleWriter,
        ] {
            let id = format!("pvc-{mode:?}");
            store.create_volume(&new(&id, mode, true)).unwrap();
            let volume = store.volume(&id).unwrap();
            volume.publish("a").unwrap();
            volume.publish("a").unwrap();
            let second = volume.publish("b");
            assert!(
                matches!(second, Err(Error::PublishedElsewhere { .. })),
                "{second:?}"
            );
            volume.unpublish("a").unwrap();
            volume.publish("b").unwrap();
        }
        store
            .create_volume(&new("pvc-rwx", AccessMode::MultiNodeMultiWriter, true))
            .unwrap();
        let rwx = store.volume("pvc-rwx").unwrap();
        rwx.publish("a").unwrap();
        let record = rwx.publish("b").unwrap();
        assert_eq!(record.published.len(), 2);
    }

    #[test]
    fn a_read_write_once_pod_volume_takes_one_target() {
        let (_dir, store) = store();
        store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeSingleWriter, true))
            .unwrap();
        let volume = store.volume("pvc-1").unwrap();
        volume.add_target("a", "/pods/1").unwrap();
        volume.add_target("a", "/pods/1").unwrap();
        assert!(matches!(
            volume.add_target("a", "/pods/2"),
            Err(Error::InUseByPod { .. })
        ));
        volume.remove_target("a", "/pods/1").unwrap();
        volume.add_target("a", "/pods/2").unwrap();
    }

    #[test]
    fn with_fencing_unpublish_cuts_the_old_node_off_and_refusals_are_logged() {
        let (_dir, store) = store();
        store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, true))
            .unwrap();
        let volume = store.volume("pvc-1").unwrap();
        assert!(
            matches!(volume.write("a", "p1", 1), Err(Error::Fenced { .. })),
            "never published"
        );
        volume.publish("a").unwrap();
        volume.write("a", "p1", 2).unwrap();
        volume.unpublish("a").unwrap();
        volume.publish("b").unwrap();
        volume.write("b", "p2", 1).unwrap();
        assert!(matches!(
            volume.write("a", "p1", 3),
            Err(Error::Fenced { .. })
        ));
        let accepted: Vec<(String, u64, bool)> = volume
            .log()
            .unwrap()
            .into_iter()
            .map(|e| (e.node, e.seq, e.accepted))
            .collect();
        assert_eq!(
            accepted,
            vec![
                ("a".into(), 1, false),
                ("a".into(), 2, true),
                ("b".into(), 1, true),
                ("a".into(), 3, false)
            ]
        );
    }

    #[test]
    fn without_fencing_the_old_node_keeps_writing() {
        let (_dir, store) = store();
        store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, false))
            .unwrap();
        let volume = store.volume("pvc-1").unwrap();
        volume.publish("a").unwrap();
        volume.unpublish("a").unwrap();
        volume.publish("b").unwrap();
        volume.write("b", "p2", 1).unwrap();
        volume.write("a", "p1", 7).unwrap();
        assert!(
            matches!(volume.write("c", "p3", 1), Err(Error::Fenced { .. })),
            "a node that never had access"
        );
    }

    #[test]
    fn a_published_volume_is_not_deleted() {
        let (_dir, store) = store();
        store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, true))
            .unwrap();
        let volume = store.volume("pvc-1").unwrap();
        volume.publish("a").unwrap();
        assert!(matches!(
            store.delete_volume("pvc-1"),
            Err(Error::StillPublished { .. })
        ));
        volume.unpublish("a").unwrap();
        store.delete_volume("pvc-1").unwrap();
        store.delete_volume("pvc-1").unwrap();
        assert!(store.volume_ids().unwrap().is_empty());
    }

    #[test]
    fn a_volume_is_found_through_its_directory() {
        let (_dir, store) = store();
        store
            .create_volume(&new("pvc-1", AccessMode::SingleNodeWriter, true))
            .unwrap();
        let dir = store.volume("pvc-1").unwrap().dir().to_path_buf();
        assert_eq!(Volume::at(&dir).unwrap().id(), "pvc-1");
        assert!(matches!(Volume::at(store.root()), Err(Error::NotFound(_))));
    }
}
