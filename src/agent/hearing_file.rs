//! Where the agent keeps when podha last heard it (`--hearing-file`), so that a restarted agent
//! goes on from there instead of counting its start as heard.
//!
//! Without it, an agent that crashed and was restarted (by its supervisor within a second, or
//! with its container by the kubelet) on a node cut off from podha would start a new isolation
//! timeout, pet the watchdog its predecessor left armed, and fence the node later than podha's
//! silence proof assumes. With it, the new agent knows how long podha has not heard the node
//! and decides as its predecessor would have. The chart keeps the file in an emptyDir in
//! memory: a container restart keeps it, a reboot (itself a fence) empties it. So the file
//! also says whether podha heard this node at all since it booted: no file, never.
//!
//! It fails closed ([`LastHeard::Unknown`]): a file that cannot be read, does not hold a time,
//! or holds one after now (the clock went back) says podha heard this node in this boot at a
//! time the agent cannot know. The agent counts that as long ago (not heard for the whole
//! isolation timeout already), never as now.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

/// When podha last heard this node, as the hearing file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastHeard {
    /// No record: podha has not heard this node since it booted.
    Never,
    /// podha last heard this node at this time (not after the time the file was read).
    At(SystemTime),
    /// podha heard this node in this boot, at a time the agent cannot know.
    Unknown,
}

impl LastHeard {
    /// How long before `now` podha last heard this node, as the agent counts it: `None` for
    /// never; `unknown_as` (the isolation timeout) when unknown, or when the time is after
    /// `now` after all.
    pub fn ago(self, now: SystemTime, unknown_as: Duration) -> Option<Duration> {
        match self {
            Self::Never => None,
            Self::At(at) => Some(now.duration_since(at).unwrap_or(unknown_as)),
            Self::Unknown => Some(unknown_as),
        }
    }
}

pub struct HearingFile {
    path: PathBuf,
    /// The last time written (milliseconds since the Unix epoch).
    written: Option<u128>,
    /// A write failed: said once, not every second.
    warned: bool,
}

impl HearingFile {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            written: None,
            warned: false,
        }
    }

    /// When podha last heard this node, read at `now`: [`LastHeard::Never`] without a file;
    /// [`LastHeard::Unknown`] (said in the log) when the file cannot be read, does not hold a
    /// time, or holds one after `now`.
    pub fn last_heard(&self, now: SystemTime) -> LastHeard {
        const UNKNOWN: &str = "podha heard this node since it booted, at a time the agent cannot \
                               know: counted as not heard for the whole isolation timeout";
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return LastHeard::Never,
            Err(e) => {
                warn!(file = %self.path.display(), error = %e, "cannot read when podha last heard this node; {UNKNOWN}");
                return LastHeard::Unknown;
            }
        };
        let Ok(ms) = text.trim().parse::<u64>() else {
            warn!(file = %self.path.display(), text, "the hearing file holds no time in milliseconds; {UNKNOWN}");
            return LastHeard::Unknown;
        };
        let at = UNIX_EPOCH + Duration::from_millis(ms);
        if at > now {
            warn!(file = %self.path.display(), ms, "the hearing file holds a time after now (the clock went back); {UNKNOWN}");
            return LastHeard::Unknown;
        }
        LastHeard::At(at)
    }

    /// Records that podha heard this node at `at`, unless that is what the file already says.
    /// Written whole, then renamed over the old file: a crash mid-write leaves the old time.
    pub fn record(&mut self, at: SystemTime) {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        if self.written == Some(ms) {
            return;
        }
        let tmp = self.path.with_extension("new");
        let result =
            std::fs::write(&tmp, ms.to_string()).and_then(|()| std::fs::rename(&tmp, &self.path));
        match result {
            Ok(()) => {
                self.written = Some(ms);
                self.warned = false;
            }
            Err(e) if !self.warned => {
                warn!(file = %self.path.display(), error = %e, "cannot record when podha last heard this node: a restarted agent would count its start as heard");
                self.warned = true;
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(30);

    #[test]
    fn a_restarted_agent_reads_when_its_predecessor_was_last_heard() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path);
        assert_eq!(
            file.last_heard(t0),
            LastHeard::Never,
            "no file: never heard"
        );
        assert_eq!(LastHeard::Never.ago(t0, T), None);
        file.record(t0);
        file.record(t0 + Duration::from_secs(2));
        let restarted = HearingFile::new(&path);
        let later = t0 + Duration::from_secs(12);
        let last = restarted.last_heard(later);
        assert_eq!(
            last,
            LastHeard::At(t0 + Duration::from_secs(2)),
            "the last record"
        );
        assert_eq!(last.ago(later, T), Some(Duration::from_secs(10)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_cannot_be_trusted_counts_as_heard_long_ago_never_as_now() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path);
        file.record(t0);
        // The clock went back a minute: the record is in the future.
        let back = t0 - Duration::from_secs(60);
        assert_eq!(file.last_heard(back), LastHeard::Unknown);
        assert_eq!(
            file.last_heard(back).ago(back, T),
            Some(T),
            "not heard for the timeout"
        );
        std::fs::write(&path, "yesterday").expect("write");
        assert_eq!(file.last_heard(t0), LastHeard::Unknown, "garbled");
        std::fs::write(&path, "").expect("write");
        assert_eq!(file.last_heard(t0), LastHeard::Unknown, "empty");
        // A directory where the file should be: unreadable.
        std::fs::remove_file(&path).expect("remove");
        std::fs::create_dir(&path).expect("dir");
        assert_eq!(file.last_heard(t0), LastHeard::Unknown, "unreadable");
        // A time after `now` passed to `ago` is as unknown.
        assert_eq!(LastHeard::At(t0).ago(back, T), Some(T));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_cannot_be_written_is_no_error() {
        let mut file = HearingFile::new(Path::new("/nonexistent-dir/podha/heard"));
        file.record(SystemTime::now());
        file.record(SystemTime::now() + Duration::from_secs(1));
        assert!(file.warned);
        assert_eq!(file.last_heard(SystemTime::now()), LastHeard::Never);
    }
}
