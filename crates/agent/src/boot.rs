//! The boot the agent runs in, and which boot a record the agent keeps for its successors
//! (the hearing file, the saved peer list) was written in.
//!
//! Those records live where a pod replacement keeps them (the chart: a directory under the
//! node's /run). Each names the boot it was written in (`boot=<ID>`, the kernel's boot ID), and
//! only a record of this boot counts: a reboot is a fence, and what an agent knew before it is
//! no longer true. A record that names no boot (written before records named one, or by an
//! agent that could not read its boot ID), or read by an agent that cannot read its own, cannot
//! be placed: each record says what that means for it, always the side that fences.
//!
//! The boot history is the one record of every boot: the boots this node had, each with when
//! its first agent started, kept where reboots keep it (the chart: under the node's
//! /var/lib). It is what lets the agent tell a fence request of an earlier boot of its own,
//! whose reboot was the fence, from a request naming a boot the node never had (see
//! `super::requests`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::warn;

/// How a record names its boot: its first line, `boot=<ID>` (empty when the writer had none).
pub const BOOT_LINE: &str = "boot=";

/// The boot ID the agent runs in, read from `file` (what the kubelet reports as
/// `nodeInfo.bootID`); `None` if it cannot be read.
pub fn boot_id(file: &Path) -> Option<String> {
    match std::fs::read_to_string(file) {
        Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
        Ok(_) => {
            warn!(file = %file.display(), "the boot ID file is empty: every fence request will be carried out, and what an earlier agent recorded counts as of an unknown boot");
            None
        }
        Err(e) => {
            warn!(file = %file.display(), error = %e, "no boot ID: every fence request will be carried out, and what an earlier agent recorded counts as of an unknown boot");
            None
        }
    }
}

/// The line that names the boot a record is written in.
pub fn boot_line(boot: Option<&str>) -> String {
    format!("{BOOT_LINE}{}", boot.unwrap_or_default())
}

/// Writes a record of boot `boot` (its boot line, then `body`) to `path`: whole to
/// `<path>.new`, then renamed over the old one, so a crash mid-write leaves the old record.
pub fn write_record(path: &Path, boot: Option<&str>, body: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    std::fs::write(&tmp, format!("{}\n{body}", boot_line(boot)))?;
    std::fs::rename(&tmp, path)
}

/// Which boot a record was written in, from its boot line, as the agent of boot `mine` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordBoot {
    /// This boot.
    This,
    /// Another boot: what it says is no longer true.
    Other,
    /// No boot line, an empty one, or the agent does not know its own boot.
    CannotTell,
}

impl RecordBoot {
    /// Where the record names its boot: `line`, its first line.
    pub fn of(line: Option<&str>, mine: Option<&str>) -> Self {
        let recorded = line
            .and_then(|l| l.trim().strip_prefix(BOOT_LINE))
            .filter(|id| !id.is_empty());
        match (recorded, mine) {
            (Some(recorded), Some(mine)) if recorded == mine => Self::This,
            (Some(_), Some(_)) => Self::Other,
            _ => Self::CannotTell,
        }
    }
}

/// How many boots the boot history keeps, the latest: far more than a node goes through
/// between a fence request and its answer, and a file that stays small.
pub const BOOT_HISTORY_LEN: usize = 64;

/// The boots this node had, oldest first, each with when the first agent of that boot started
/// (unix milliseconds on the node's clock): one line `<boot ID> <millis>` each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootHistory {
    boots: Vec<(String, u128)>,
}

impl BootHistory {
    /// The history kept at `path`, with boot `boot` (this one) added unless it is the latest
    /// already (an agent restarted in this boot keeps when the first one started), written
    /// back before it is used: a fence right after (a reset, no sync) must not lose it. A file
    /// that cannot be read is left as it is (this boot alone counts then); one that cannot be
    /// written leaves this boot out of the next agent's history.
    pub fn record(path: &Path, boot: Option<&str>) -> Self {
        let kept = match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(e) => {
                warn!(file = %path.display(), error = %e, "cannot read the boot history: no fence request of an earlier boot is acknowledged");
                return Self::default().with(boot, unix_millis());
            }
        };
        let history = kept.clone().with(boot, unix_millis());
        if history != kept
            && let Err(e) = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| write_durably(path, &history.to_string(), 0o644))
        {
            warn!(file = %path.display(), error = %e, "cannot keep the boot history: the next boot's agent will not know this one");
        }
        history
    }

    /// The history in `text`; lines that are not `<boot ID> <millis>` are left out.
    pub(super) fn parse(text: &str) -> Self {
        let boots = text
            .lines()
            .filter_map(
                |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                    [boot, millis] => Some((boot.to_string(), millis.parse().ok()?)),
                    _ => None,
                },
            )
            .collect();
        Self { boots }
    }

    /// With boot `boot`, first seen at `millis`, unless it is the latest already; the last
    /// [`BOOT_HISTORY_LEN`] boots.
    fn with(mut self, boot: Option<&str>, millis: u128) -> Self {
        let Some(boot) = boot.filter(|b| !b.is_empty()) else {
            return self;
        };
        if self.boots.last().is_none_or(|(latest, _)| latest != boot) {
            self.boots.push((boot.to_string(), millis));
        }
        let excess = self.boots.len().saturating_sub(BOOT_HISTORY_LEN);
        self.boots.drain(..excess);
        self
    }

    /// Whether a request made at `asked` (unix milliseconds, podha's clock) in boot `then`
    /// was made in an earlier boot of this node than `now`: `then` is one of its boots, and
    /// the request is older than the first agent of `now`. A request made later, while `now`
    /// ran, names a boot that had ended already: the Node's boot ID was not this boot's then.
    pub fn earlier(&self, then: &str, asked: Option<u128>, now: &str) -> bool {
        let had = self.boots.iter().any(|(boot, _)| boot == then);
        let began = self
            .boots
            .iter()
            .rev()
            .find(|(boot, _)| boot == now)
            .map(|(_, millis)| *millis);
        had && then != now && matches!((asked, began), (Some(asked), Some(began)) if asked < began)
    }
}

impl std::fmt::Display for BootHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.boots
            .iter()
            .try_for_each(|(boot, millis)| writeln!(f, "{boot} {millis}"))
    }
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Writes `text` to `path` whole, on disk before it returns: to `<path>.new`, made anew with
/// permissions `mode` from its creation (one a crash left there is replaced), then renamed over
/// the old file, and the rename itself synced in its directory. A reset right after (a fence)
/// finds the old file or the new one, never a part of either.
pub fn write_durably(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_history_adds_each_boot_once_keeps_the_latest_and_survives_bad_lines() {
        let dir = std::env::temp_dir().join(format!("podha-boots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join("n1").join("boots");
        let first = BootHistory::record(&file, Some("b1"));
        assert!(first.boots.iter().map(|(b, _)| b).eq(["b1"]));
        // Restarted in the same boot: when the first agent of b1 started stands.
        std::fs::write(&file, "b1 5\n").expect("write");
        let again = BootHistory::record(&file, Some("b1"));
        assert_eq!(again.boots, [("b1".to_string(), 5)]);
        std::fs::write(&file, "b1 5\nnot a line\n\nb2 x\n").expect("write");
        let next = BootHistory::record(&file, Some("b2"));
        assert!(next.boots.iter().map(|(b, _)| b).eq(["b1", "b2"]));
        assert_eq!(std::fs::read_to_string(&file).ok(), Some(next.to_string()));
        // No boot ID: nothing to add.
        assert_eq!(BootHistory::record(&file, None), next);
        // Unreadable (a directory): left alone, this boot alone counts.
        let unreadable = BootHistory::record(&dir, Some("b3"));
        assert!(unreadable.boots.iter().map(|(b, _)| b).eq(["b3"]));
        let _ = std::fs::remove_dir_all(&dir);

        let mut many = BootHistory::default();
        for i in 0..100 {
            many = many.with(Some(&format!("b{i}")), i);
        }
        assert_eq!(many.boots.len(), BOOT_HISTORY_LEN);
        assert_eq!(many.boots[0].0, format!("b{}", 100 - BOOT_HISTORY_LEN));
    }

    #[test]
    fn a_boot_is_earlier_if_the_node_had_it_and_the_request_is_older_than_this_boot() {
        let history = BootHistory::parse("b1 100\nb2 200\nb3 300\n");
        assert!(history.earlier("b2", Some(250), "b3"), "asked in b2");
        assert!(history.earlier("b1", Some(150), "b3"), "two reboots since");
        assert!(
            !history.earlier("b2", Some(350), "b3"),
            "asked after b3 began"
        );
        assert!(
            !history.earlier("b1", Some(350), "b3"),
            "an old boot named anew"
        );
        assert!(!history.earlier("zz", Some(250), "b3"), "never this node's");
        assert!(!history.earlier("b2", None, "b3"), "no time");
        assert!(!history.earlier("b3", Some(250), "b3"), "this boot");
        assert!(
            !history.earlier("b2", Some(250), "b4"),
            "this boot not kept"
        );
    }

    #[test]
    fn the_boot_id_is_the_files_trimmed_and_none_when_unreadable_or_empty() {
        let dir = std::env::temp_dir().join(format!("podha-boot-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("boot_id");
        std::fs::write(&file, "0d1e-42\n").expect("write");
        assert_eq!(boot_id(&file).as_deref(), Some("0d1e-42"));
        std::fs::write(&file, " \n").expect("write");
        assert_eq!(boot_id(&file), None);
        assert_eq!(boot_id(&dir.join("missing")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_is_of_this_boot_only_if_it_names_the_boot_the_agent_runs_in() {
        let of = RecordBoot::of;
        assert_eq!(
            of(Some(&boot_line(Some("b1"))), Some("b1")),
            RecordBoot::This
        );
        assert_eq!(of(Some("boot=b0\n"), Some("b1")), RecordBoot::Other);
        assert_eq!(
            of(Some(&boot_line(None)), Some("b1")),
            RecordBoot::CannotTell
        );
        assert_eq!(
            of(Some("1800000000000"), Some("b1")),
            RecordBoot::CannotTell
        );
        assert_eq!(of(None, Some("b1")), RecordBoot::CannotTell);
        assert_eq!(of(Some("boot=b1"), None), RecordBoot::CannotTell);
    }
}
