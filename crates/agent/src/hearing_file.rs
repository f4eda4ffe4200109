//! Where the agent keeps when podha last heard it (`--hearing-file`), so that a restarted agent
//! goes on from there instead of counting its start as heard.
//!
//! Without it, an agent that crashed and was restarted (by its supervisor within a second, with
//! its container by the kubelet, or in a new pod: a DaemonSet rollout, a deleted or evicted
//! pod) on a node cut off from podha would start a new isolation timeout, pet the watchdog its
//! predecessor left armed, and fence the node later than podha's silence proof assumes; a new
//! pod would even count the node as never heard, and never fence it. With it, the new agent
//! knows how long podha has not heard the node and decides as its predecessor would have. The
//! chart keeps the file on the node, in a directory of the node's own under /run: a pod
//! replacement keeps it, a reboot (itself a fence) empties it.
//!
//! The record names the boot it was written in (see [`super::boot`]):
//!
//! ```text
//! boot=<boot ID>
//! heard=<milliseconds since the Unix epoch>
//! words=signed
//! held
//! renewals-in=<leadership term>
//! ```
//!
//! The last line is there while podha holds the node and the agent's watchdog is disarmed (see
//! `super::arming`): a restarted agent goes on held, and does not fence a paused node cut off
//! from everything. It is taken away before the watchdog is armed again, so a record that says
//! held was never written by an agent podha could be counting the silence of. A record that
//! says held but cannot be trusted otherwise (see below) is not held.
//!
//! `renewals-in` is there while the last heartbeat the agent counted said its leader counts the
//! silence from the agent's Lease renewals, naming that heartbeat's term: a restarted agent
//! goes on staying up on its renewals while that leader leads (see
//! `crate::isolation::Renewing`), instead of fencing a node that only podha cannot reach. A
//! record without it (an older agent's, or one podha did not tell) counts on no renewals, the
//! side that fences. An older agent reading this record stops at `held`.
//!
//! The `words` line says the record was written by an agent that counts only signed heartbeats
//! (see `crate::contract::words`). A record without it is of an agent from before them: what
//! podha heard then, a podha of that time heard, which proves nothing of this agent (it cannot
//! verify that podha's heartbeats, nor that podha its answers), so it counts as never heard. An
//! upgrade therefore starts every new agent never heard, and none fences while the old podha
//! still leads (the new agents refuse its unsigned heartbeats: it holds, and so do they).
//!
//! A record of another boot is no record: podha has not heard this node since it booted, as
//! after a reboot that emptied the file (where /run is not emptied by a reboot, or several
//! nodes share a host, the boot tells). So no file, or another boot's, means never heard.
//!
//! It fails closed ([`LastHeard::Unknown`]): a file that cannot be read, does not hold a time,
//! holds one after now (the clock went back), or does not say which boot it is of (written
//! before records named their boot, or the boot ID cannot be read) says podha heard this node
//! in this boot at a time the agent cannot know. The agent counts that as long ago (not heard
//! for the whole isolation timeout already), never as now; it never counts it as never heard,
//! which would keep a node podha has lost from ever fencing.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use super::boot::{RecordBoot, write_record};

/// The line of a record written by an agent that counts only signed heartbeats.
const SIGNED_LINE: &str = "words=signed";

/// The line of a record written while podha held the node, its watchdog disarmed.
const HELD_LINE: &str = "held";

/// The start of the line naming the term of a leader that counts from the agent's renewals.
const RENEWALS_PREFIX: &str = "renewals-in=";

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

/// What the hearing file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// When podha last heard this node.
    pub last: LastHeard,
    /// podha held the node, and the agent's watchdog was disarmed: only with a time known.
    pub held: bool,
    /// The term of the leader that counts from the agent's renewals, as the last heartbeat
    /// counted said: only with a time known.
    pub renewals_in: Option<u64>,
}

pub struct HearingFile {
    path: PathBuf,
    /// The boot the agent runs in (`None`: unknown), named in every record.
    boot: Option<String>,
    /// The last record written: the time (milliseconds since the Unix epoch), whether it said
    /// held, and the term of the leader counting from renewals.
    written: Option<(u128, bool, Option<u64>)>,
    /// A write failed: said once, not every second.
    warned: bool,
}

impl HearingFile {
    pub fn new(path: &Path, boot: Option<&str>) -> Self {
        Self {
            path: path.to_path_buf(),
            boot: boot.map(str::to_string),
            written: None,
            warned: false,
        }
    }

    /// What the file says, read at `now`. When podha last heard this node:
    /// [`LastHeard::Never`] without a file or with another boot's; [`LastHeard::Unknown`]
    /// (said in the log) when the file cannot be read, does not hold a time, holds one after
    /// `now`, or cannot be placed in a boot. Whether podha held it: never when that time is
    /// not known.
    pub fn read(&self, now: SystemTime) -> Record {
        const UNKNOWN: &str = "podha heard this node since it booted, at a time the agent cannot \
                               know: counted as not heard for the whole isolation timeout";
        let unknown = Record {
            last: LastHeard::Unknown,
            held: false,
            renewals_in: None,
        };
        let never = Record {
            last: LastHeard::Never,
            ..unknown
        };
        let file = self.path.display();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return never,
            Err(e) => {
                warn!(%file, error = %e, "cannot read when podha last heard this node; {UNKNOWN}");
                return unknown;
            }
        };
        let mut lines = text.lines();
        let boot = lines.next();
        let heard = lines.next().and_then(|l| l.trim().strip_prefix("heard="));
        let Some(ms) = heard.and_then(|ms| ms.parse::<u64>().ok()) else {
            warn!(%file, text, "the hearing file holds no boot and time in milliseconds; {UNKNOWN}");
            return unknown;
        };
        let signed = lines.next().map(str::trim) == Some(SIGNED_LINE);
        // Held, in a signed record: whatever else cannot be trusted, podha was counting no
        // silence when it was written, and goes on counting none until the agent says armed.
        let rest: Vec<&str> = lines.map(str::trim).collect();
        let held = signed && rest.contains(&HELD_LINE);
        let renewals_in = rest
            .iter()
            .find_map(|l| l.strip_prefix(RENEWALS_PREFIX))
            .and_then(|term| term.parse().ok())
            .filter(|_| signed);
        let unknown = Record { held, ..unknown };
        match RecordBoot::of(boot, self.boot.as_deref()) {
            RecordBoot::This if !signed => {
                info!(%file, "the hearing file is of an agent from before signed heartbeats: podha's hearing then counts as never heard");
                return never;
            }
            RecordBoot::This => {}
            RecordBoot::Other => {
                info!(%file, "the hearing file is of another boot: the reboot was a fence, and podha has not heard this node since");
                return never;
            }
            RecordBoot::CannotTell => {
                warn!(%file, text, "cannot tell whether the hearing file is of this boot; {UNKNOWN}");
                return unknown;
            }
        }
        let at = UNIX_EPOCH + Duration::from_millis(ms);
        if at > now {
            warn!(%file, ms, "the hearing file holds a time after now (the clock went back); {UNKNOWN}");
            return unknown;
        }
        Record {
            last: LastHeard::At(at),
            held,
            renewals_in,
        }
    }

    /// Records that podha heard this node at `at` in this boot, whether it holds it with the
    /// watchdog disarmed (`held`), and the term of the leader that counts from the agent's
    /// renewals (`renewals_in`), unless that is what the file already says. Written whole,
    /// then renamed over the old file: a crash mid-write leaves the old record. Whether the
    /// file says so now (a write that failed is said once).
    pub fn record(&mut self, at: SystemTime, held: bool, renewals_in: Option<u64>) -> bool {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        if self.written == Some((ms, held, renewals_in)) {
            return true;
        }
        let held_line = if held {
            format!("{HELD_LINE}\n")
        } else {
            String::new()
        };
        let renewals_line = renewals_in
            .map(|term| format!("{RENEWALS_PREFIX}{term}\n"))
            .unwrap_or_default();
        let body = format!("heard={ms}\n{SIGNED_LINE}\n{held_line}{renewals_line}");
        match write_record(&self.path, self.boot.as_deref(), &body) {
            Ok(()) => {
                self.written = Some((ms, held, renewals_in));
                self.warned = false;
                true
            }
            Err(e) => {
                if !self.warned {
                    warn!(file = %self.path.display(), error = %e, "cannot record when podha last heard this node: a restarted agent would go on from an older record, or none (never heard), so the watchdog is not armed until the record is written");
                    self.warned = true;
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(30);
    const BOOT: &str = "3f0c-boot-1";

    #[test]
    fn a_restarted_agent_reads_when_its_predecessor_was_last_heard() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path, Some(BOOT));
        assert_eq!(file.read(t0).last, LastHeard::Never, "no file: never heard");
        assert_eq!(LastHeard::Never.ago(t0, T), None);
        file.record(t0, false, None);
        file.record(t0 + Duration::from_secs(2), false, None);
        let restarted = HearingFile::new(&path, Some(BOOT));
        let later = t0 + Duration::from_secs(12);
        let last = restarted.read(later).last;
        assert_eq!(
            last,
            LastHeard::At(t0 + Duration::from_secs(2)),
            "the last record"
        );
        assert_eq!(last.ago(later, T), Some(Duration::from_secs(10)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The term of a leader that counts from the agent's renewals goes to the file with the
    /// hearing, and comes back to a restarted agent; a record without it (an older agent's),
    /// or one not signed, says none.
    #[test]
    fn a_restarted_agent_reads_which_leader_counts_from_its_renewals() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-ren-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path, Some(BOOT));
        assert!(file.record(t0, false, Some(7)));
        let read = file.read(t0);
        assert_eq!((read.last, read.renewals_in), (LastHeard::At(t0), Some(7)));
        assert!(file.record(t0, true, Some(7)));
        let read = file.read(t0);
        assert_eq!((read.held, read.renewals_in), (true, Some(7)), "held too");
        assert!(file.record(t0, false, None));
        assert_eq!(file.read(t0).renewals_in, None, "taken back");
        let ms = t0.duration_since(UNIX_EPOCH).expect("ms").as_millis();
        std::fs::write(&path, format!("boot={BOOT}\nheard={ms}\nrenewals-in=7\n")).expect("write");
        assert_eq!(
            file.read(t0).renewals_in,
            None,
            "a record from before signed heartbeats"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_cannot_be_trusted_counts_as_heard_long_ago_never_as_now() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut file = HearingFile::new(&path, Some(BOOT));
        file.record(t0, false, None);
        // The clock went back a minute: the record is in the future.
        let back = t0 - Duration::from_secs(60);
        assert_eq!(file.read(back).last, LastHeard::Unknown);
        assert_eq!(
            file.read(back).last.ago(back, T),
            Some(T),
            "not heard for the timeout"
        );
        std::fs::write(&path, "yesterday").expect("write");
        assert_eq!(file.read(t0).last, LastHeard::Unknown, "garbled");
        std::fs::write(&path, "").expect("write");
        assert_eq!(file.read(t0).last, LastHeard::Unknown, "empty");
        // A directory where the file should be: unreadable.
        std::fs::remove_file(&path).expect("remove");
        std::fs::create_dir(&path).expect("dir");
        assert_eq!(file.read(t0).last, LastHeard::Unknown, "unreadable");
        // A time after `now` passed to `ago` is as unknown.
        assert_eq!(LastHeard::At(t0).ago(back, T), Some(T));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_counts_only_in_the_boot_it_was_written_in() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let later = t0 + Duration::from_secs(5);
        HearingFile::new(&path, Some(BOOT)).record(t0, false, None);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(
            text,
            format!("boot={BOOT}\nheard=1800000000000\nwords=signed\n")
        );
        let read_in = |boot: Option<&str>| HearingFile::new(&path, boot).read(later).last;
        // A new pod of the same boot goes on from the record.
        assert_eq!(read_in(Some(BOOT)), LastHeard::At(t0), "this boot");
        // After a reboot that left the file (a /run the reboot kept, a host several nodes
        // share): the reboot was the fence, and podha has not heard this boot's agent.
        assert_eq!(
            read_in(Some("3f0c-boot-2")),
            LastHeard::Never,
            "another boot"
        );
        // The agent cannot read its boot ID: heard at a time it cannot know, never "never".
        assert_eq!(read_in(None), LastHeard::Unknown, "own boot unknown");
        // A record that names no boot: written before records named one, or by an agent
        // without a boot ID.
        std::fs::write(&path, "1800000000000").expect("write");
        assert_eq!(read_in(Some(BOOT)), LastHeard::Unknown, "time only");
        HearingFile::new(&path, None).record(t0, false, None);
        assert_eq!(read_in(Some(BOOT)), LastHeard::Unknown, "an empty boot");
        std::fs::write(&path, format!("boot={BOOT}\nheard=soon\n")).expect("write");
        assert_eq!(read_in(Some(BOOT)), LastHeard::Unknown, "garbled time");
        // Written by an agent from before signed heartbeats (an upgrade): what its podha heard
        // proves nothing of this agent.
        std::fs::write(&path, format!("boot={BOOT}\nheard=1800000000000\n")).expect("write");
        assert_eq!(read_in(Some(BOOT)), LastHeard::Never, "unsigned era");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hold_is_kept_only_with_a_record_of_this_boot_that_is_trusted() {
        let dir = std::env::temp_dir().join(format!("podha-hearing-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("heard");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let later = t0 + Duration::from_secs(5);
        let mut file = HearingFile::new(&path, Some(BOOT));
        file.record(t0, true, None);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            format!("boot={BOOT}\nheard=1800000000000\nwords=signed\nheld\n")
        );
        let read_in = |boot: Option<&str>, now| HearingFile::new(&path, boot).read(now);
        let held = Record {
            last: LastHeard::At(t0),
            held: true,
            renewals_in: None,
        };
        assert_eq!(
            read_in(Some(BOOT), later),
            held,
            "a restarted agent goes on held"
        );
        // Let go of (the watchdog about to be armed again): the same time, not held.
        file.record(t0, false, None);
        assert!(!read_in(Some(BOOT), later).held, "let go of");
        file.record(t0, true, None);
        // Held in a signed record is held however little else can be trusted (podha counted
        // no silence when it was written, and counts none until the agent says armed): a boot
        // the agent cannot tell, a clock gone back (heard at a time unknown). Another boot is
        // never heard since, and not held.
        assert!(!read_in(Some("3f0c-boot-2"), later).held, "another boot");
        assert_eq!(read_in(Some("3f0c-boot-2"), later).last, LastHeard::Never);
        assert_eq!(
            read_in(None, later),
            Record {
                last: LastHeard::Unknown,
                held: true,
                renewals_in: None,
            },
            "own boot unknown"
        );
        assert!(read_in(Some(BOOT), later).held);
        let back = t0 - Duration::from_secs(60);
        assert_eq!(
            read_in(Some(BOOT), back),
            Record {
                last: LastHeard::Unknown,
                held: true,
                renewals_in: None,
            },
            "the clock went back: heard at a time unknown, and still held"
        );
        // An agent from before signed heartbeats wrote no hold, and one that did is still not
        // signed without its line.
        std::fs::write(&path, format!("boot={BOOT}\nheard=1800000000000\nheld\n")).expect("write");
        assert_eq!(read_in(Some(BOOT), later).last, LastHeard::Never);
        assert!(!read_in(Some(BOOT), later).held);
        assert!(file.record(t0, false, None));
        assert!(!read_in(Some(BOOT), later).held);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_cannot_be_written_is_no_error() {
        let mut file = HearingFile::new(Path::new("/nonexistent-dir/podha/heard"), Some(BOOT));
        file.record(SystemTime::now(), false, None);
        file.record(SystemTime::now() + Duration::from_secs(1), true, None);
        assert!(file.warned);
        assert_eq!(file.read(SystemTime::now()).last, LastHeard::Never);
    }
}
