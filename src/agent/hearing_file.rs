//! Where the agent keeps when podha last heard it (`--hearing-file`), so that a restarted agent
//! goes on from there instead of counting its start as heard.
//!
//! Without it, an agent that crashed and was restarted (by its supervisor within a second, or
//! with its container by the kubelet) on a node cut off from podha would start a new isolation
//! timeout, pet the watchdog its predecessor left armed, and fence the node later than podha's
//! silence proof assumes. With it, the new agent knows how long podha has not heard the node
//! and decides as its predecessor would have. The chart keeps
//! the file in an emptyDir in memory: a container restart keeps it, a reboot (itself a fence)
//! empties it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

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

    /// How long before `now` podha last heard this node, as the file says; `None` when there is
    /// no file (a first start) or it cannot be read (said in the log). A time after `now` (the
    /// clock went back) counts as heard now.
    pub fn heard_ago(&self, now: SystemTime) -> Option<Duration> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn!(file = %self.path.display(), error = %e, "cannot read when podha last heard this node");
                return None;
            }
        };
        let Ok(ms) = text.trim().parse::<u64>() else {
            warn!(file = %self.path.display(), text, "not a time in milliseconds; ignored");
            return None;
        };
        let at = UNIX_EPOCH + Duration::from_millis(ms);
        Some(now.duration_since(at).unwrap_or_default())
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

    #[test]
    fn a_restarted_agent_reads_when_its_predecessor_was_last_heard() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path);
        assert_eq!(file.heard_ago(t0), None, "no file: a first start");
        file.record(t0);
        file.record(t0 + Duration::from_secs(2));
        let restarted = HearingFile::new(&path);
        assert_eq!(
            restarted.heard_ago(t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(10)),
            "the last record"
        );
        assert_eq!(
            restarted.heard_ago(t0 - Duration::from_secs(60)),
            Some(Duration::ZERO),
            "a clock gone back: heard now"
        );
        std::fs::write(&path, "yesterday").expect("write");
        assert_eq!(restarted.heard_ago(t0), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_cannot_be_written_is_no_error() {
        let mut file = HearingFile::new(Path::new("/nonexistent-dir/podha/heard"));
        file.record(SystemTime::now());
        file.record(SystemTime::now() + Duration::from_secs(1));
        assert!(file.warned);
        assert_eq!(file.heard_ago(SystemTime::now()), None);
    }
}
