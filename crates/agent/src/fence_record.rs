//! The record of the agent's last fence, kept where reboots keep it (beside the boot history,
//! see [`super::boot`]), so that the agent of the next boot can say its node was fenced: an
//! agent that reboots its node cannot report it before, and nothing after the reboot would
//! otherwise tell the fence from any other reboot. The agent exports it as
//! `podha_agent_last_fence_timestamp_seconds{cause}` and logs it at start; the chart alerts on
//! it (`PodhaAgentFencedNode`).
//!
//! A boot-named record as the agent's others are (`boot=<ID>`, then the fence), written whole
//! and synced before the fence is carried out (`sysrq-reboot` resets the kernel at
//! once, without writing back what it caches), and when the agent lets its watchdog run out
//! on isolation, which on a precise watchdog resets the node before the agent's own fence
//! would; taken back if the agent pets it again in time, or if its own fence failed. Only a
//! record of an earlier boot says the node was fenced: in the same boot it was not (yet).
//! Written off the agent's tasks, given up after [`WRITE_WITHIN`]: a slow disk never holds up
//! the fence, the watchdog or the answers.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use super::boot::{RecordBoot, boot_line, write_durably};
use super::fence::FenceCause;

/// A fence as the record holds it, after its boot line (see [`super::boot`]): one line
/// `<unix seconds> <cause>`, the cause `isolation` or `request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastFence {
    pub at_unix: u64,
    pub cause: &'static str,
}

impl LastFence {
    fn line(&self) -> String {
        format!("{} {}\n", self.at_unix, self.cause)
    }

    fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let at_unix = words.next()?.parse().ok()?;
        let cause = match words.next()? {
            "isolation" => "isolation",
            "request" => "request",
            _ => return None,
        };
        Some(Self { at_unix, cause })
    }
}

/// The cause as the record and the metric name it.
pub const fn cause_name(cause: &FenceCause) -> &'static str {
    match cause {
        FenceCause::Isolation => "isolation",
        FenceCause::Request(_) => "request",
    }
}

/// How long writing or removing the record may take before the agent goes on without it.
pub const WRITE_WITHIN: Duration = Duration::from_secs(1);

/// Where the record is, and the boot the agent runs in.
#[derive(Clone, Debug)]
pub struct FenceRecord {
    path: PathBuf,
    boot: Option<String>,
}

impl FenceRecord {
    pub fn new(path: &Path, boot: Option<&str>) -> Self {
        Self {
            path: path.to_path_buf(),
            boot: boot.map(str::to_string),
        }
    }

    /// Records a fence for `cause` now, synced to the disk, off the agent's tasks, within
    /// [`WRITE_WITHIN`] (the fence goes on either way).
    pub async fn write_soon(&self, cause: &FenceCause) {
        let (record, cause) = (self.clone(), cause.clone());
        self.soon(move || record.write(&cause)).await;
    }

    /// Takes the record back (the fence did not happen), off the agent's tasks, within
    /// [`WRITE_WITHIN`].
    pub async fn remove_soon(&self) {
        let path = self.path.clone();
        self.soon(move || {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(record = %path.display(), error = %e, "cannot take the fence record back");
            }
        })
        .await;
    }

    async fn soon(&self, work: impl FnOnce() + Send + 'static) {
        let done = tokio::time::timeout(WRITE_WITHIN, tokio::task::spawn_blocking(work)).await;
        if done.is_err() {
            warn!(record = %self.path.display(), within = ?WRITE_WITHIN, "the fence record was not written in time: going on without it");
        }
    }

    /// Records a fence for `cause` now, synced to the disk before it returns. A record that
    /// cannot be written is said in the log and does not stop the fence.
    pub fn write(&self, cause: &FenceCause) {
        let at_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = LastFence {
            at_unix,
            cause: cause_name(cause),
        };
        let text = format!("{}\n{}", boot_line(self.boot.as_deref()), last.line());
        if let Err(e) = write_durably(&self.path, &text, 0o644) {
            warn!(record = %self.path.display(), error = %e, "cannot record the fence: after the reboot nothing will say this agent fenced the node");
        }
    }

    /// The last fence recorded, if it was recorded in an earlier boot (the node was fenced:
    /// it booted again since), said in the log. A record of this boot is a fence under way or
    /// one that did not take (an agent restarted meanwhile), and one whose boot cannot be
    /// placed proves no reboot: neither is reported.
    pub fn last(&self) -> Option<LastFence> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let mut lines = text.lines();
        let boot = RecordBoot::of(lines.next(), self.boot.as_deref());
        let Some(last) = lines.next().and_then(LastFence::parse) else {
            warn!(record = %self.path.display(), "the fence record cannot be read: ignored");
            return None;
        };
        if boot != RecordBoot::Other {
            info!(
                at_unix = last.at_unix,
                cause = last.cause,
                "a fence recorded in this boot, or in one the agent cannot place: not reported as a fence"
            );
            return None;
        }
        info!(
            at_unix = last.at_unix,
            cause = last.cause,
            "this agent fenced its node in an earlier boot (the last fence recorded)"
        );
        Some(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("podha-fences-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn the_last_fence_is_read_back_by_the_agent_of_the_next_boot() {
        let dir = dir("read-back");
        let path = dir.join("boots.fences");
        let before = FenceRecord::new(&path, Some("boot-1"));
        assert_eq!(before.last(), None, "never fenced");
        before.write(&FenceCause::Request("r1".into()));
        before.write(&FenceCause::Isolation);
        assert_eq!(before.last(), None, "this boot: no fence took yet");
        let after = FenceRecord::new(&path, Some("boot-2"));
        let last = after.last().expect("recorded");
        let text = std::fs::read_to_string(&path).expect("record");
        assert!(text.starts_with("boot=boot-1\n"), "{text}");
        assert_eq!(last.cause, "isolation", "the last one");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        assert!(now.abs_diff(last.at_unix) < 60, "{last:?}");
        // Without a boot ID on either side: no reboot shown. Garbled: none.
        FenceRecord::new(&path, None).write(&FenceCause::Request("r2".into()));
        assert_eq!(after.last(), None);
        before.write(&FenceCause::Isolation);
        assert_eq!(FenceRecord::new(&path, None).last(), None);
        std::fs::write(&path, "boot=boot-1\nsoon isolation\n").expect("write");
        assert_eq!(after.last(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_written_does_not_stop_the_fence() {
        let record = FenceRecord::new(Path::new("/nonexistent-dir/podha/fences"), Some("b1"));
        record.write_soon(&FenceCause::Isolation).await;
        record.remove_soon().await;
        assert_eq!(record.last(), None);
    }

    #[tokio::test]
    async fn a_record_taken_back_is_gone() {
        let dir = dir("taken-back");
        let path = dir.join("boots.fences");
        let record = FenceRecord::new(&path, Some("boot-1"));
        record.write_soon(&FenceCause::Isolation).await;
        assert!(path.exists());
        record.remove_soon().await;
        assert!(!path.exists());
        record.remove_soon().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
